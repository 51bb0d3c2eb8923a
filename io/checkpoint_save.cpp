// checkpoint_save.cpp: save_checkpoint. The order of a save, and what a failure at each point leaves:
//   1. inputs checked on every rank (nothing written yet);
//   2. rank 0 sets an existing step-<n> aside as step-<n>.replaced and creates step-<n>.tmp;
//   3. every rank writes and seals its shard, rank 0 the dense file, then the manifest and its checksum;
//   4. rank 0 renames step-<n>.tmp to step-<n>, then moves `latest` to it;
//   5. step-<n>.replaced is removed.
// A failure on any rank before `latest` moved is agreed on by every rank and rolled back by rank 0: the new
// step (.tmp or renamed) is removed and a set-aside step-<n> is put back, so `latest`, the step it names and
// every other step are as they were. Once `latest` names the new step the save has happened; a failure after
// that (the root's fsync, the last hook) still throws on every rank, and nothing is rolled back.
#include <filesystem>
#include <numeric>
#include <set>
#include <sstream>

#include "io/checkpoint.h"
#include "io/checkpoint_files.h"
#include "io/checkpoint_format.h"
#include "io/checksum.h"
#include "io/h5.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/deadline.h"

namespace sparta {
namespace fs = std::filesystem;
using namespace ckpt;

namespace {

std::string table_signature(const std::vector<TableRows>& tables) {
  std::string s;
  for (const TableRows& t : tables)
    s += (s.empty() ? "" : " ") + table_text(t.name, t.dim, t.optimizer, t.state_width);
  return s.empty() ? "(no tables)" : s;
}

void validate_tables(const std::vector<TableRows>& tables) {
  std::set<std::string> seen;
  for (const TableRows& t : tables) {
    SPARTA_REQUIRE(valid_name(t.name), "save_checkpoint: table name '%s' is not usable as a file name",
                   t.name.c_str());
    SPARTA_REQUIRE(seen.insert(t.name).second, "save_checkpoint: table '%s' appears twice", t.name.c_str());
    SPARTA_REQUIRE(t.dim >= 1, "save_checkpoint: table '%s' field 'dim': expected >= 1, found %d", t.name.c_str(),
                   t.dim);
    SPARTA_REQUIRE(t.state_width >= 0, "save_checkpoint: table '%s' field 'state_width': expected >= 0, found %d",
                   t.name.c_str(), t.state_width);
    SPARTA_REQUIRE(!t.optimizer.empty(), "save_checkpoint: table '%s' field 'optimizer': empty", t.name.c_str());
    SPARTA_REQUIRE(t.values.size() == t.rows() * t.dim,
                   "save_checkpoint: table '%s' field 'values': expected %zu floats (%zu rows x dim %d), "
                   "found %zu", t.name.c_str(), t.rows() * t.dim, t.rows(), t.dim, t.values.size());
    SPARTA_REQUIRE(t.state.size() == t.rows() * t.state_width,
                   "save_checkpoint: table '%s' field 'state': expected %zu floats (%zu rows x state_width "
                   "%d), found %zu", t.name.c_str(), t.rows() * t.state_width, t.rows(), t.state_width,
                   t.state.size());
  }
}

void validate_dense(const std::vector<DenseTensor>& dense) {
  std::set<std::string> seen;
  for (const DenseTensor& d : dense) {
    SPARTA_REQUIRE(valid_name(d.name), "save_checkpoint: dense tensor name '%s' is not usable as a dataset name",
                   d.name.c_str());
    SPARTA_REQUIRE(seen.insert(d.name).second, "save_checkpoint: dense tensor '%s' appears twice", d.name.c_str());
    for (int64_t x : d.shape)
      SPARTA_REQUIRE(x >= 0, "save_checkpoint: dense tensor '%s' field 'shape': negative extent in %s",
                     d.name.c_str(), shape_text(d.shape).c_str());
    SPARTA_REQUIRE(static_cast<int64_t>(d.data.size()) == product(d.shape),
                   "save_checkpoint: dense tensor '%s' field 'data': expected %lld floats (shape %s), found %zu",
                   d.name.c_str(), static_cast<long long>(product(d.shape)), shape_text(d.shape).c_str(),
                   d.data.size());
  }
}

// Where a save got to on rank 0, which alone changes the root.
struct Progress {
  bool set_aside = false;     // step-<n> was renamed to step-<n>.replaced
  bool tmp_created = false;
  bool renamed = false;       // step-<n>.tmp became step-<n>
  bool latest_moved = false;  // `latest` names the new step
};

// Rank 0, after a failure before `latest` moved: the root as it was before the save. Best effort: what cannot
// be undone is logged (the error that failed the save is what the caller gets).
void roll_back(const std::string& root, const std::string& tmp, const std::string& final_dir,
               const std::string& replaced, const Progress& p) {
  std::error_code ec;
  if (p.renamed) fs::remove_all(final_dir, ec);
  else if (p.tmp_created) fs::remove_all(tmp, ec);
  if (ec) LOG_WARN("save_checkpoint: rolling back: cannot remove %s: %s", (p.renamed ? final_dir : tmp).c_str(),
                   ec.message().c_str());
  if (p.set_aside) {
    std::string err = guarded([&] {
      rename_path(replaced, final_dir);
      fsync_path(root, true);
    });
    if (!err.empty()) LOG_WARN("save_checkpoint: rolling back: cannot put %s back: %s", final_dir.c_str(), err.c_str());
  }
}

}  // namespace

std::string save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointMeta& meta,
                            const std::vector<DenseTensor>& dense, const std::vector<TableRows>& tables,
                            const SaveOptions& options) {
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  h5::ScopedWriteBudget budget(options.write_budget);
  // The hook runs like every other step: a failure in it on one rank is an error on every rank.
  auto stage = [&](const char* name) {
    if (!options.on_stage) return;
    agree_on_error(comm, guarded([&] {
            try {
              options.on_stage(name);
            } catch (const std::exception&) {
              throw;
            } catch (...) {
              throw Error(strprintf("save_checkpoint: the on_stage hook threw a non-standard exception at '%s'", name));
            }
          }), "checkpoint save");
  };
  const std::string name = step_name(meta.step);
  const std::string tmp = join(root_dir, name + ".tmp"), final_dir = join(root_dir, name);
  const std::string replaced = final_dir + ".replaced";

  // Inputs: checked on every rank; the step, the root and the table list must be the same everywhere.
  agree_on_error(comm, guarded([&] {
          SPARTA_REQUIRE(meta.step >= 0, "save_checkpoint: field 'step': expected >= 0, found %lld",
                         static_cast<long long>(meta.step));
          validate_tables(tables);
          if (rank == 0) validate_dense(dense);
        }), "checkpoint save");
  const std::string where = name + " under '" + root_dir + "'";
  const std::string root_where = bcast_string(comm, 0, where);
  std::string mine = table_signature(tables);
  std::string root_sig = bcast_string(comm, 0, mine);
  agree_on_error(comm, guarded([&] {
          SPARTA_REQUIRE(where == root_where, "save_checkpoint: ranks save different checkpoints: rank 0 saves %s, "
                         "rank %d saves %s", root_where.c_str(), rank, where.c_str());
          SPARTA_REQUIRE(mine == root_sig, "save_checkpoint: tables differ between ranks: rank 0 passes %s, rank %d "
                         "passes %s", root_sig.c_str(), rank, mine.c_str());
        }), "checkpoint save");

  Progress progress;  // rank 0's
  try {
    // The step directory, as step-<n>.tmp.
    agree_on_error(comm, guarded([&] {
            if (rank != 0) return;
            std::error_code ec;
            fs::create_directories(root_dir, ec);
            SPARTA_REQUIRE(fs::is_directory(root_dir), "%s: cannot create the checkpoint root: %s",
                           root_dir.c_str(), ec ? ec.message().c_str() : "not a directory");
            // A step-<n> set aside by a save that crashed before publishing: it is step-<n> again until this save
            // publishes.
            if (!fs::exists(final_dir, ec) && fs::exists(replaced, ec)) rename_path(replaced, final_dir);
            if (fs::exists(final_dir, ec)) {
              // A complete step-<n> that `latest` does not name: a run resumed from an earlier step, or a save
              // that crashed between its rename and `latest`. Set aside until the new one is published.
              SPARTA_REQUIRE(read_latest(root_dir) != name, "%s: is the latest checkpoint; it is never overwritten",
                             final_dir.c_str());
              fs::remove_all(replaced, ec);
              SPARTA_REQUIRE(!ec, "%s: cannot remove: %s", replaced.c_str(), ec.message().c_str());
              rename_path(final_dir, replaced);
              progress.set_aside = true;
            }
            fs::remove_all(tmp, ec);  // a save of this step that crashed
            SPARTA_REQUIRE(!ec, "%s: cannot remove the stale directory: %s", tmp.c_str(), ec.message().c_str());
            SPARTA_REQUIRE(fs::create_directory(tmp, ec), "%s: cannot create: %s", tmp.c_str(),
                           ec ? ec.message().c_str() : "exists");
            progress.tmp_created = true;
          }), "checkpoint save");
    stage("tmp_created");

    // Every rank writes its shard, rank 0 also the dense file; each is closed, fsynced and checksummed.
    std::vector<CheckpointFile> written;
    agree_on_error(comm, guarded([&] {
            std::string shard = shard_name(rank, world);
            write_shard(join(tmp, shard), meta, rank, world, tables);
            written.push_back(seal_file(tmp, shard));
            if (rank == 0) {
              write_dense(join(tmp, kDenseName), meta, dense);
              written.push_back(seal_file(tmp, kDenseName));
            }
          }), "checkpoint save");
    stage("files_written");

    // Rank 0 gathers the checksums and the row counts and writes the manifest.
    std::string records;
    for (const CheckpointFile& f : written)
      records += f.name + " " + std::to_string(f.bytes) + " " + checksum_hex(f.checksum) + "\n";
    int len = static_cast<int>(records.size());
    std::vector<int> lens(world), offsets(world);
    timed_gather(&len, 1, MPI_INT, lens.data(), 1, 0, comm, "checkpoint save (file records: lengths)");
    std::partial_sum(lens.begin(), lens.end() - 1, offsets.begin() + 1);
    std::string all_records(rank == 0 ? size_t(offsets.back() + lens.back()) : 0, '\0');
    timed_gatherv(records.data(), len, MPI_CHAR, &all_records[0], lens.data(), offsets.data(), 0, comm,
                  "checkpoint save (file records)");
    std::vector<int64_t> rows(tables.size()), rows_by_rank(rank == 0 ? tables.size() * world : 0);
    for (size_t i = 0; i < tables.size(); ++i) rows[i] = static_cast<int64_t>(tables[i].rows());
    timed_gather(rows.data(), static_cast<int>(rows.size()), MPI_INT64_T, rows_by_rank.data(),
                 static_cast<int>(rows.size()), 0, comm, "checkpoint save (rows per rank)");
    agree_on_error(comm, guarded([&] {
            if (rank != 0) return;
            std::vector<CheckpointFile> files;
            std::istringstream in(all_records);
            CheckpointFile cf;
            std::string hex;
            while (in >> cf.name >> cf.bytes >> hex) {
              cf.checksum = parse_checksum_hex(hex);
              files.push_back(cf);
            }
            write_manifest(join(tmp, kManifestName), meta, world, tables, rows_by_rank, dense, files);
            fsync_path(join(tmp, kManifestName), false);
            write_manifest_sum(tmp);
            fsync_path(tmp, true);
          }), "checkpoint save");
    stage("manifest_written");

    // Publish: the rename makes the step whole at once; then `latest` moves to it.
    agree_on_error(comm, guarded([&] {
            if (rank != 0) return;
            rename_path(tmp, final_dir);
            progress.renamed = true;
            fsync_path(root_dir, true);
          }), "checkpoint save");
    stage("renamed");
    agree_on_error(comm, guarded([&] {
            if (rank == 0) write_file_atomic(root_dir, kLatestName, name + "\n", &progress.latest_moved);
          }), "checkpoint save");
    stage("latest_written");
  } catch (const Error&) {
    if (rank == 0 && !progress.latest_moved) roll_back(root_dir, tmp, final_dir, replaced, progress);
    if (rank == 0 && progress.latest_moved && progress.set_aside) {
      std::error_code ec;
      fs::remove_all(replaced, ec);
    }
    throw;
  }
  if (rank == 0 && progress.set_aside) {
    std::error_code ec;
    fs::remove_all(replaced, ec);  // best effort: a leftover .replaced is removed by the next save of step n
  }
  return final_dir;
}

}  // namespace sparta
