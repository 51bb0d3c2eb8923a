// checkpoint_files.h: the file-system side of checkpoints (internal to io/checkpoint_*.cpp): names under a
// checkpoint root, fsync, rename, the atomic `latest` file. What makes a save durable and a crash harmless.
#pragma once

#include <cstdint>
#include <string>

#include "io/checkpoint.h"

namespace sparta {
namespace ckpt {

constexpr const char* kManifestName = "manifest.h5";
constexpr const char* kDenseName = "dense.h5";
constexpr const char* kLatestName = "latest";
// The manifest's own checksum (checkpoint_format.h): one line "xxh64 <16 hex digits> <bytes> manifest.h5\n".
constexpr const char* kManifestSumName = "manifest.xxh64";

std::string join(const std::string& dir, const std::string& name);
std::string shard_name(int rank, int world);  // "shard-<r>-of-<w>.h5"
std::string step_name(int64_t step);          // "step-<n>"
// "step-<digits>" → step, else -1.
int64_t parse_step_name(const std::string& name);
// A table, tensor or file name usable as one path component.
bool valid_name(const std::string& name);

// Each throws sparta::Error naming the path and the system's reason.
void fsync_path(const std::string& path, bool directory);
void rename_path(const std::string& from, const std::string& to);
// fsyncs a finished file and records its size and checksum for the manifest.
CheckpointFile seal_file(const std::string& dir, const std::string& name);

// Writes text to dir/name atomically: name.tmp (charged to the test write budget, h5.h), fsync, rename, fsync
// the directory. *renamed is set once dir/name holds the new text (a failure after it, the directory's fsync,
// still throws). A failure before the rename removes name.tmp and leaves dir/name as it was.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& text, bool* renamed);

// The step directory name in root/<pointer> ("latest", or "best" of train.keep_best), checked; "" when there is
// no such pointer.
std::string read_pointer(const std::string& root, const std::string& pointer);
inline std::string read_latest(const std::string& root) { return read_pointer(root, kLatestName); }

}  // namespace ckpt
}  // namespace sparta
