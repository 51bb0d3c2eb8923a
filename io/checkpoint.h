// checkpoint.h: checkpoints that survive failure, and that load into a different world size and placement.
//
// On disk (a shared file system every rank sees), under a checkpoint root:
//   <root>/step-<n>/manifest.h5             format, version, step, world size and plan when written, config,
//                                           RNG state, reader position, table and dense lists, and the size and
//                                           XXH64 checksum (checksum.h) of every other file
//   <root>/step-<n>/dense.h5                dense weights and optimizer state, float32, named (rank 0 writes it)
//   <root>/step-<n>/shard-<r>-of-<w>.h5     rank r's rows: /tables/<name>/{keys int64[n], values float32[n, dim],
//                                           state float32[n, state_width]} with attributes name, dim, optimizer,
//                                           state_width, rows
//   <root>/step-<n>/manifest.xxh64          the size and XXH64 of manifest.h5 (checked before it is read)
//   <root>/latest                           one line "step-<n>": the newest complete checkpoint
// A save writes everything into step-<n>.tmp/, fsyncs every file and the directory, renames it to step-<n>/,
// fsyncs the root, then replaces `latest` atomically (latest.tmp, fsync, rename, fsync the root). A crash at any
// point leaves `latest` naming the previous complete checkpoint; a stale step-<n>.tmp/ is removed by the next
// save of step n. Every field of every file is listed in checkpoint_format.h.
//
// Sources: checkpoint_files.cpp (names, fsync, rename, `latest`), checkpoint_format.cpp (shard and dense files),
// checkpoint_manifest.cpp, checkpoint_save.cpp, checkpoint_load.cpp, checkpoint_inspect.cpp (the tools).
//
// Errors: bad input or a failing file system (a full disk included) throws sparta::Error naming the file, the
// field (or table), what was expected and what was found. The collective calls agree on errors: when any rank
// fails, every rank throws (the message of the lowest failing rank, prefixed with its rank), so no rank waits in
// a collective.
//
// io/ includes no src/ module beyond the base headers, so the interface is plain structs: the embedding tables
// and the trainer convert to and from them.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "io/table_rows.h"

namespace sparta {

constexpr const char* kCheckpointFormat = "sparta-checkpoint";
constexpr int64_t kCheckpointVersion = 1;
// An owner function returns this for a row that every rank holds (a replicated table or a hot row).
constexpr int kEveryRank = -1;

// A named dense tensor (weights or optimizer state); shape may be empty for a scalar.
struct DenseTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // [product of shape]
};

// What a model expects a checkpoint to hold; load_checkpoint rejects a checkpoint that differs.
struct TableSpec {
  std::string name;
  int dim = 0;
  std::string optimizer;
  int state_width = 0;
};
struct DenseSpec {
  std::string name;
  std::vector<int64_t> shape;
};
struct ModelSpec {
  std::vector<TableSpec> tables;
  std::vector<DenseSpec> dense;
};

// Everything beside the weights that a resumed run needs.
struct CheckpointMeta {
  int64_t step = 0;
  int world_size = 0;                    // set by save_checkpoint (the communicator's size)
  std::string plan;                      // placement plan text as the planner printed it
  std::string config;                    // model configuration text
  std::vector<int64_t> rng_state;
  std::vector<int64_t> reader_position;
  // fp16 training's loss scale: {log2 of the scale, good steps since the scale last changed}; empty otherwise
  // (and in checkpoints written before it was kept: the attribute is optional).
  std::vector<int64_t> loss_scale;
};

// One file of a checkpoint as the manifest records it.
struct CheckpointFile {
  std::string name;  // relative to the step directory
  uint64_t bytes = 0;
  uint64_t checksum = 0;  // XXH64 of the file's bytes
};

struct ManifestTable {
  TableSpec spec;
  int64_t rows = 0;                  // over all shards
  std::vector<int64_t> shard_rows;   // [world_size]
};

// The parsed manifest.h5 of one step directory.
struct Manifest {
  std::string dir;   // the step directory
  std::string path;  // dir/manifest.h5
  int64_t version = 0;
  CheckpointMeta meta;
  std::vector<ManifestTable> tables;
  std::vector<DenseSpec> dense;
  std::vector<CheckpointFile> files;
  const ManifestTable* find_table(const std::string& name) const;  // nullptr when absent
  const CheckpointFile* find_file(const std::string& name) const;
  ModelSpec model_spec() const;
};

// Test hooks. on_stage is called on every rank at each stage of a save ("tmp_created", "files_written",
// "manifest_written", "renamed", "latest_written"), so a crash test can stop a writer at a chosen point; an
// exception it throws on any rank fails the save on every rank. write_budget >= 0 makes this rank's file writes
// fail, as on a full disk, after that many bytes of this save (h5::set_write_budget).
struct SaveOptions {
  std::function<void(const std::string& stage)> on_stage;
  int64_t write_budget = -1;
};

// Collective over comm. Writes checkpoint meta.step under root_dir (created if missing) and makes it `latest`.
// dense is used on rank 0 only (others pass {}); tables are this rank's rows, the same list of tables (names,
// dims, optimizers, state widths, in the same order) on every rank, each row written by exactly one rank (a
// replicated table: rank 0 passes its rows, the others pass the table with no rows). Saving the step `latest`
// names is an error (it is never overwritten); another existing step-<n> (a run resumed from an earlier step) is
// replaced once the new one is complete; a stale step-<n>.tmp is removed. On any error on any rank before
// `latest` moved, every rank throws and the root is as it was: `latest`, the step it names and a step-<n> that
// was to be replaced (checkpoint_save.cpp has the order of a save). Returns the step directory.
std::string save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointMeta& meta,
                            const std::vector<DenseTensor>& dense, const std::vector<TableRows>& tables,
                            const SaveOptions& options = SaveOptions());

// Owner of a row after loading: a rank of the loading communicator, or kEveryRank. table indexes
// ModelSpec::tables.
using OwnerFn = std::function<int(int table, int64_t key)>;

struct LoadedCheckpoint {
  Manifest manifest;                // meta (step, world size and plan when written, config, RNG, reader)
  std::vector<DenseTensor> dense;   // every rank, in ModelSpec::dense order
  std::vector<TableRows> tables;    // in ModelSpec::tables order: the rows this rank owns now, sorted by key
};

// Collective over comm. path: a step directory or a checkpoint root (then `latest` is loaded). Every rank reads
// the manifest and checks its format, version and model (against expected: a table or dense tensor missing,
// extra or of another dim/optimizer/state width/shape is an error naming it and the field). The old shards are
// split over the current ranks (rank r reads shards r, r+W, ...), their checksums verified, and their rows
// routed to their owners now (owner(table, key)) with MPI_Alltoallv in rounds of bounded size. A key found twice
// is an error. Any error on any rank throws on every rank.
LoadedCheckpoint load_checkpoint(MPI_Comm comm, const std::string& path, const ModelSpec& expected,
                                 const OwnerFn& owner);

// Collective over comm: a resume. path: a step directory (loaded as load_checkpoint does, no fallback) or a
// checkpoint root: the step `latest` names, else (it does not load: a file that does not verify, a missing
// file, ...) the next older complete step, and so on, each failure a warning on rank 0 and the step that loads
// announced as a fallback; `latest` then names it (the newer steps stay, for the run's saves to replace). When
// none loads, every rank throws the newest step's error. Sources:
// checkpoint_retention.cpp.
LoadedCheckpoint load_newest_checkpoint(MPI_Comm comm, const std::string& path, const ModelSpec& expected,
                                        const OwnerFn& owner);

// ---- Single-process tools (no MPI calls): sparta-ckpt and tests use them.

// The steps a resume of path tries, newest first: `latest`'s, then the complete steps below it (all complete
// steps, newest first, when `latest` is missing or unreadable); a step directory: itself.
std::vector<std::string> resume_candidates(const std::string& path);

// Checkpoint retention (train.keep_last): keeps the newest keep_last steps that verify (verify_checkpoint;
// steps in *verified count as verified without reading them again, and those verified here are added) and
// removes every complete step older than the oldest kept, except the ones `latest` and `best` name. keep_last <= 0 keeps
// everything. Returns the steps removed; throws sparta::Error naming a directory it cannot remove.
std::vector<int64_t> prune_checkpoints(const std::string& root_dir, int keep_last, std::set<int64_t>* verified);

// The step directory that path names: itself when it holds manifest.h5, else the one its `latest` names.
std::string resolve_checkpoint_dir(const std::string& path);

// Rank 0 alone (no collective): writes root/<pointer> ("latest" or "best") atomically as one line naming the
// complete step directory step-<step>, which must exist. Model selection (train.keep_best) records its best
// checkpoint in `best` and at the end moves `latest` to it. Throws Error naming the path.
void point_checkpoint(const std::string& root, const std::string& pointer, int64_t step);

struct CheckpointList {
  std::vector<int64_t> steps;            // complete step-<n> directories, ascending
  std::vector<std::string> incomplete;   // step-<n>.tmp directories (a save that did not finish)
  int64_t latest = -1;                   // the step `latest` names; -1 when there is no `latest`
};
CheckpointList list_checkpoints(const std::string& root_dir);

// Reads and checks manifest.h5 of a step directory: its bytes against manifest.xxh64 first, then format,
// version, fields, file list.
Manifest read_manifest(const std::string& step_dir);
// Rewrites manifest.xxh64 for the manifest.h5 now in step_dir: for a tool (or test) that edits a manifest on
// purpose; anything else that changes manifest.h5 makes the step refused.
void reseal_manifest(const std::string& step_dir);

// Throws sparta::Error naming the table and field where spec differs from what the manifest holds.
void check_model_spec(const Manifest& manifest, const ModelSpec& expected);

struct FileStatus {
  CheckpointFile expected;
  bool exists = false;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  bool ok = false;
  std::string problem;  // empty when ok: "missing", "checksum mismatch: ...", "size ..."
};
// Recomputes the checksum of file (one of manifest.files).
FileStatus check_file(const Manifest& manifest, const CheckpointFile& file);

// Everything `sparta-ckpt verify` checks: every file's checksum, then the structure of each intact shard and
// of dense.h5 against the manifest. ok() when no problem was found.
struct VerifyReport {
  Manifest manifest;
  std::vector<FileStatus> files;
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
};
VerifyReport verify_checkpoint(const std::string& path);

// One table merged over all shards (rows in shard order), checksums verified first.
TableRows read_table(const Manifest& manifest, const std::string& table);
// The dense tensors of dense.h5 (checksum verified), in manifest order.
std::vector<DenseTensor> read_dense(const Manifest& manifest);

// Writes one table of a checkpoint, merged over shards, to a plain HDF5 file: attributes format=
// "sparta-table-export", version, table, dim, optimizer, state_width, step, rows, source; datasets /keys int64[n],
// /values float32[n, dim], /state float32[n, state_width]. Streams shard by shard. Returns the row count.
int64_t export_table(const std::string& path, const std::string& table, const std::string& out_file);

}  // namespace sparta
