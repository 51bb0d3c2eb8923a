// checkpoint_retention.cpp: which steps a run keeps (train.keep_last) and which one a resume takes (the newest
// that verifies). See checkpoint.h.
#include <algorithm>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/checkpoint_files.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"

namespace sparta {
namespace fs = std::filesystem;
using namespace ckpt;

std::vector<std::string> resume_candidates(const std::string& root_dir) {
  std::error_code ec;
  // A step directory named by the user: that one only.
  if (fs::is_regular_file(join(root_dir, kManifestName), ec) || parse_step_name(fs::path(root_dir).filename()) >= 0)
    return {root_dir};
  const CheckpointList list = list_checkpoints(root_dir);
  std::string latest_problem;
  int64_t latest = -1;
  latest_problem = guarded([&] {
    const std::string name = read_latest(root_dir);
    latest = name.empty() ? -1 : parse_step_name(name);
  });
  std::vector<std::string> out;
  if (latest >= 0) out.push_back(join(root_dir, step_name(latest)));
  for (auto s = list.steps.rbegin(); s != list.steps.rend(); ++s)
    if (latest < 0 || *s < latest) out.push_back(join(root_dir, step_name(*s)));
  if (!latest_problem.empty() && !out.empty())
    LOG_WARN("resume: %s; trying the complete steps from the newest", latest_problem.c_str());
  SPARTA_REQUIRE(!out.empty(), "%s: not a checkpoint: no 'latest' and no complete step-<n> directory%s%s",
                 root_dir.c_str(), latest_problem.empty() ? "" : "; ", latest_problem.c_str());
  return out;
}

LoadedCheckpoint load_newest_checkpoint(MPI_Comm comm, const std::string& path, const ModelSpec& expected,
                                        const OwnerFn& owner) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // Rank 0 lists the candidates once: every rank tries the same steps in the same order.
  std::string list;
  agree_on_error(comm, guarded([&] {
                   if (rank != 0) return;
                   for (const std::string& c : resume_candidates(path)) list += c + "\n";
                 }),
                 "checkpoint load (candidates)");
  list = bcast_string(comm, 0, list);
  std::vector<std::string> candidates;
  for (size_t at = 0, end; (end = list.find('\n', at)) != std::string::npos; at = end + 1)
    candidates.push_back(list.substr(at, end - at));
  std::string first_error;
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      LoadedCheckpoint c = load_checkpoint(comm, candidates[i], expected, owner);
      if (i > 0) {
        LOG_WARN("resume: falling back to %s, the newest step that verifies (newer: %s)", candidates[i].c_str(),
                 first_error.c_str());
        // `latest` names the step the run goes on from, so that the run's saves may replace the newer steps.
        agree_on_error(comm, guarded([&] {
                         if (rank == 0)
                           write_file_atomic(path, kLatestName, fs::path(candidates[i]).filename().string() + "\n",
                                             nullptr);
                       }),
                       "checkpoint load (latest)");
      }
      return c;
    } catch (const Error& e) {
      if (candidates.size() == 1) throw;
      LOG_WARN("resume: %s does not load: %s", candidates[i].c_str(), e.what());
      if (first_error.empty()) first_error = e.what();
    }
  }
  throw Error(strprintf("resume: no step under %s loads (%zu tried); the newest: %s", path.c_str(), candidates.size(),
                        first_error.c_str()),
              true);
}

std::vector<int64_t> prune_checkpoints(const std::string& root_dir, int keep_last, std::set<int64_t>* verified) {
  std::vector<int64_t> removed;
  if (keep_last <= 0) return removed;
  const CheckpointList list = list_checkpoints(root_dir);
  int kept = 0;
  size_t i = list.steps.size();
  for (; i > 0 && kept < keep_last; --i) {
    const int64_t s = list.steps[i - 1];
    bool ok = verified && verified->count(s);
    if (!ok) {
      std::string problem = guarded([&] {
        const VerifyReport r = verify_checkpoint(join(root_dir, step_name(s)));
        if (!r.ok()) throw Error(r.problems.front());
      });
      ok = problem.empty();
      if (ok && verified) verified->insert(s);
      if (!ok) LOG_WARN("checkpoint retention: %s does not verify (%s): not counted among the %d kept",
                        step_name(s).c_str(), problem.c_str(), keep_last);
    }
    kept += ok;
  }
  // Everything older than the oldest step kept goes, except what `latest` and `best` (train.keep_best) name.
  const std::string best_name = read_pointer(root_dir, "best");
  const int64_t best = best_name.empty() ? -1 : parse_step_name(best_name);
  for (; i > 0; --i) {
    const int64_t s = list.steps[i - 1];
    if (s == list.latest || s == best) continue;
    std::error_code ec;
    fs::remove_all(join(root_dir, step_name(s)), ec);
    SPARTA_REQUIRE(!ec, "%s: cannot remove (checkpoint retention, train.keep_last %d): %s",
                   join(root_dir, step_name(s)).c_str(), keep_last, ec.message().c_str());
    if (verified) verified->erase(s);
    removed.push_back(s);
  }
  return removed;
}

}  // namespace sparta
