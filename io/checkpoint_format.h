// checkpoint_format.h: the files of a checkpoint, field by field (version 1), and their writers and readers
// (internal to io/checkpoint_*.cpp).
//
// manifest.h5
//   / attributes   format="sparta-checkpoint", version=1, step, world_size (ranks that wrote it), plan (text),
//                  config (text), rng_state int64[], reader_position int64[], checksum="xxh64", created_unix,
//                  num_tables, num_dense, num_files; optional: loss_scale int64[2] (fp16 training: log2 of the
//                  scale, good steps since it last changed; absent otherwise)
//                  (every possibly empty int64[] attribute X comes with X_size; X itself only when X_size > 0)
//   /tables/<i>    group per table i in the writers' order: name, dim, optimizer, state_width, rows (total),
//                  shard_rows int64[world_size]
//   /dense/<i>     group per dense tensor: name, shape int64[]
//   /files/<i>     group per file: name, bytes, checksum (16 hex digits, XXH64 of the file's bytes)
// dense.h5
//   / attributes   format="sparta-checkpoint-dense", version, step, num_dense
//   /dense/<name>  float32 dataset of the tensor's shape ([1] for a scalar), attribute shape int64[] (exact)
// shard-<r>-of-<w>.h5
//   / attributes   format="sparta-checkpoint-shard", version, step, rank, world_size, num_tables
//   /tables/<name> group, attributes name, dim, optimizer, state_width, rows; datasets keys int64[n],
//                  values float32[n, dim], state float32[n, state_width]
// manifest.xxh64   text, exactly one line "xxh64 <16 lower-case hex digits> <bytes> manifest.h5\n": the XXH64 and size
//                  of manifest.h5's bytes (a sidecar: the manifest cannot hold its own checksum). Read strictly: any
//                  other byte in it, a size or checksum that manifest.h5 does not have, or a missing sidecar refuses
//                  the step. With the manifest's list of the other files, every byte of every file of a step is
//                  covered: read_manifest verifies the sidecar before it parses manifest.h5.
// latest           text: "step-<n>\n"
//
// Every writer closes its file through h5::close, so a disk that fills while HDF5 writes the last metadata
// is an error, not a file that looks whole.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/h5.h"

namespace sparta {
namespace ckpt {

constexpr const char* kShardFormat = "sparta-checkpoint-shard";
constexpr const char* kDenseFormat = "sparta-checkpoint-dense";
constexpr const char* kExportFormat = "sparta-table-export";
// Rows move in pieces of at most this many bytes (loads route them, exports copy them), so memory stays bounded
// and MPI's int counts never overflow.
constexpr int64_t kRoundBytes = 32 << 20;

int64_t product(const std::vector<int64_t>& shape);
std::string shape_text(const std::vector<int64_t>& shape);  // "[4, 3]"
TableRows empty_rows(const TableSpec& spec);
// "name(dim 8, adam, state 16)": how messages name a table's layout, and how ranks compare theirs.
std::string table_text(const std::string& name, int dim, const std::string& optimizer, int state_width);

// int64 vectors that may be empty (a scalar's shape, no RNG state): "<name>_size" is always written and
// "<name>" only when it has values.
void write_ints(const h5::File& f, const std::string& obj, const std::string& name, const std::vector<int64_t>& v);
std::vector<int64_t> read_ints(const h5::File& f, const std::string& obj, const std::string& name);

// Writers: each creates, fills and closes one file (throws sparta::Error naming it on any failure).
void write_shard(const std::string& path, const CheckpointMeta& meta, int rank, int world,
                 const std::vector<TableRows>& tables);
void write_dense(const std::string& path, const CheckpointMeta& meta, const std::vector<DenseTensor>& dense);
// rows_by_rank: [world][tables] rows each rank wrote.
void write_manifest(const std::string& path, const CheckpointMeta& meta, int world,
                    const std::vector<TableRows>& tables, const std::vector<int64_t>& rows_by_rank,
                    const std::vector<DenseTensor>& dense, const std::vector<CheckpointFile>& files);

// manifest.xxh64 for the manifest.h5 now in step_dir (fsynced); verify_manifest_sum throws sparta::Error naming
// the file (the sidecar or manifest.h5) and what differs.
void write_manifest_sum(const std::string& step_dir);
void verify_manifest_sum(const std::string& step_dir);

// Throws unless the manifest lists file `name` and its size and checksum match.
void require_file_ok(const Manifest& m, const std::string& name);

// One old shard, opened and checked against the manifest.
class ShardReader {
 public:
  ShardReader(const Manifest& m, int shard);
  // Checks the table's group against the manifest; returns its row count.
  int64_t check_table(const ManifestTable& t) const;
  // Appends rows [row0, row0 + rows) of the table to out, values as fp32 whatever the file stores them as.
  void read(const ManifestTable& t, int64_t row0, int64_t rows, TableRows& out) const;
  // The table's value storage in this shard: "fp32" (float32 values; also files without the attribute), "bf16"
  // or "fp16" (uint16 bits, the group's attribute 'storage'; TableRows::storage).
  std::string storage(const ManifestTable& t) const;

 private:
  int shard_;
  h5::File f_;
  mutable std::vector<int64_t> keys_;
  mutable std::vector<float> floats_;
  mutable std::vector<uint16_t> bits_;
};

// dense.h5, checked against the manifest (the caller verified its checksum).
std::vector<DenseTensor> read_dense_file(const Manifest& m);

}  // namespace ckpt
}  // namespace sparta
