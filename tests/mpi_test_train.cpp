// src/trainer under MPI, on sub-worlds of 1, 2, 3 and 4 ranks inside one job (the ranks of the job that exist):
//   - the loss trajectory of every rank count and every placement against the one-rank dispatch run, within
//     kTrajectoryTol (relative, per step) for its first kTrajectoryTight steps and within kTrajectoryLoose for
//     all: they differ only in the order of floating-point sums (the dense all-reduce, a row's gradients summed
//     per rank and then over ranks), which a later step may amplify;
//   - the same rank count and plan: the same bits, run twice;
//   - resume: a run stopped at a checkpoint and resumed continues the uninterrupted run's trajectory, bitwise
//     at the same rank count for every placement (losses and final dense parameters), within kTrajectoryTol at
//     another rank count for its first kResumedTight steps and within kTrajectoryLoose for all;
//   - the planted task (synthetic data from a teacher) is learned: the eval AUC comes within kAucGap of the
//     teacher's, for dot and dcnv2;
//   - misconfigurations (a dataset that does not match, impossible sizes, a missing file, a plan that does not
//     fit) throw sparta::Error on every rank, naming what is wrong, before any work;
//   - cuda: a few steps of the whole model on GPUs against the cpu backend, and a resumed run bit for bit (skipped
//     without a GPU per rank).
#include <mpi.h>
#include <sys/stat.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/synthetic.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/trainer.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

constexpr double kTrajectoryTol = 1e-5;    // relative, per step (observed: about 1e-7, float rounding)
constexpr double kTrajectoryLoose = 1e-3;  // every step's bound, once rounding may have been amplified
constexpr size_t kTrajectoryTight = 6;     // a trajectory's steps held to kTrajectoryTol (of 12)
constexpr size_t kResumedTight = 10;       // a resharded resume's steps held to kTrajectoryTol (of 20)
constexpr double kAucGap = 0.04;         // planted task: eval AUC >= teacher - this (observed gaps 0.008-0.025 over 51 seeds)

// The first `ranks` ranks of the job as a world of their own, with topology and device.
struct SubWorld {
  MPI_Comm comm = MPI_COMM_NULL;
  Topology topo;
  Device dev;
  bool in() const { return comm != MPI_COMM_NULL; }
  SubWorld(int ranks, Backend backend = Backend::cpu) {
    MPI_Comm_split(MPI_COMM_WORLD, testing::world_rank() < ranks ? 0 : MPI_UNDEFINED, testing::world_rank(), &comm);
    if (!in()) return;
    topo = make_topology(comm, 0);
    if (backend == Backend::cuda) dev = open_device(Backend::cuda, topo.host_rank);
  }
  ~SubWorld() {
    if (!in()) return;
    if (dev.is_cuda()) close_device(dev);
    free_topology(topo);
    MPI_Comm_free(&comm);
  }
};

// A planted task: train and eval splits of one teacher, written by all ranks (collective; removed with it).
struct Data {
  std::unique_ptr<testing::SharedTempPath> dir;
  std::string train, eval, other;  // other: the same task with 5 slots
  double teacher_auc = 0;
  explicit Data(int64_t train_samples = 24576, int64_t max_rows = 40, int64_t num_dense = 13, int slots = 4) {
    set_log_level(LogLevel::warn);  // the trainer's progress lines would drown the test log
    dir = std::make_unique<testing::SharedTempPath>("mpi_test_train", "data");
    if (testing::world_rank() == 0) ::mkdir(dir->path.c_str(), 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    train = dir->path + "/train.h5", eval = dir->path + "/eval.h5", other = dir->path + "/other.h5";
    auto make = [&](const std::string& path, int64_t samples, uint64_t seed, int slots) {
      SyntheticOptions o;
      o.preset = "small";
      o.samples = samples;
      o.slots = slots;
      o.num_dense = num_dense;
      o.max_rows = max_rows;
      o.hotness = "1-2";
      o.seed = seed;
      o.teacher_seed = 11;
      WriteOptions w;
      w.chunk_rows = 512;  // shuffling permutes blocks of a chunk
      return generate_dataset(path, make_synthetic_config(o), w, MPI_COMM_WORLD).teacher_auc;
    };
    make(train, train_samples, 1, slots);
    teacher_auc = make(eval, 8192, 2, slots);
    make(other, 2048, 3, slots + 1);
  }
};
TrainConfig base_config(const Data& data) {
  TrainConfig c;
  c.train_path = data.train;
  c.eval_path = data.eval;
  c.global_batch = 512;
  c.eval_batch = 4096;
  c.model.num_dense = -1;
  c.model.num_slots = -1;
  c.model.embedding_dim = 8;
  c.model.bottom_mlp = {16, 8};
  c.model.top_mlp = {16, 1};
  c.sparse.kind = OptimizerKind::adagrad;
  c.sparse.lr = 0.1f;
  c.dense.kind = OptimizerKind::adam;
  c.dense.lr = 0.004f;
  c.schedule.lr = 0.004f;
  c.schedule.warmup_steps = 3;
  c.steps = 12;
  c.log_every = 5;  // intervals that do not divide the run: the last one is cut
  c.prefetch = 1;
  c.seed = testing::seed();  // fresh initial values every run
  return c;
}

struct Run {
  TrainResult result;
  std::vector<float> params;
};

// Trains on the first `ranks` ranks; ranks outside get an empty Run.
Run train_on(int ranks, const TrainConfig& cfg, Backend backend = Backend::cpu, const std::string& load_from = "") {
  SubWorld w(ranks, backend);
  Run r;
  if (!w.in()) return r;
  Trainer t(w.comm, w.topo, w.dev, cfg, TrainerMode::train, load_from);
  r.result = t.run();
  r.params = t.dense_params();
  return r;
}

std::vector<int> rank_counts() {
  std::vector<int> out;
  for (int n = 1; n <= std::min(testing::world_size(), 4); ++n) out.push_back(n);
  return out;
}

bool close_trajectory(const std::vector<double>& got, const std::vector<double>& want, double tol,
                      const std::string& what) {
  if (got.size() != want.size()) {
    BOOST_TEST_MESSAGE(what << ": " << got.size() << " steps, expected " << want.size());
    return false;
  }
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
    if (!(std::fabs(got[i] - want[i]) <= tol * std::fabs(want[i]))) {
      BOOST_TEST_MESSAGE(what << ": step " << i + 1 << " loss " << got[i] << ", expected " << want[i]);
      return false;
    }
  }
  BOOST_TEST_MESSAGE(what << ": largest relative difference " << worst);
  return true;
}

// The first `tight` steps within kTrajectoryTol, all within kTrajectoryLoose. A rank count's other order of sums
// rarely turns a rounding difference into a larger one later on: one step's rounding flips a discrete choice (seed
// 31722460052866 at 2 and 4 ranks, every placement alike: 8.7e-8 up to step 6, then 1.5e-5 at step 7 and 2e-6 to
// 4.4e-5 after it; seed 8101864851929 in a resharded resume: 2.9e-6, 9.8e-6, 6.9e-5 from its 13th step). A wrong
// route, gradient or load shows from the first steps, which stay held to rounding.
bool close_trajectory_tiers(const std::vector<double>& got, const std::vector<double>& want, size_t tight,
                            const std::string& what) {
  const size_t n = std::min({tight, got.size(), want.size()});
  return close_trajectory({got.begin(), got.begin() + n}, {want.begin(), want.begin() + n}, kTrajectoryTol,
                          what + ", first steps") &&
         close_trajectory(got, want, kTrajectoryLoose, what);
}

}  // namespace

BOOST_AUTO_TEST_CASE(trajectory_is_the_same_for_every_rank_count_and_placement) {
  const Data data;
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  // Dense sgd: Adam divides each parameter's gradient by its own running magnitude, so a parameter whose gradient
  // sums to nearly zero (terms that cancel) takes an lr-sized step whose sign is the rounding's; the rank counts
  // sum in other orders, and one such flip moved a step's loss by 2.6e-5 (seed 70776700052354, 2 ranks, every
  // placement alike). sgd's step is proportional to the gradient: rounding stays rounding.
  cfg.dense.kind = OptimizerKind::sgd;
  cfg.schedule.lr = 0.05f;
  cfg.placement = "dispatch";
  const Run ref = train_on(1, cfg);
  bool ok = true;
  if (testing::world_rank() == 0) {
    // A sane start (BCE of a fresh model on fresh random data: seen from 0.6 to 1.9) and a real trajectory; the
    // checks that matter are the comparisons below.
    ok = ref.result.losses.size() == 12 && std::isfinite(ref.result.losses.front()) &&
         ref.result.losses.front() > 0.1 && ref.result.losses.front() < 10;
    BOOST_TEST_MESSAGE("reference losses " << ref.result.losses.front() << " .. " << ref.result.losses.back());
  }
  for (int ranks : rank_counts())
    for (const char* placement : {"dispatch", "localized", "replicated", "distributed", "hybrid", "auto",
                                  "localized:0,replicated,distributed,hybrid"}) {
      cfg.placement = placement;
      if (ranks == 1 && cfg.placement == "dispatch") continue;
      const Run r = train_on(ranks, cfg);
      if (testing::world_rank() == 0)
        ok = close_trajectory_tiers(r.result.losses, ref.result.losses, kTrajectoryTight,
                                    std::to_string(ranks) + " ranks, " + placement) && ok;
    }
  BOOST_TEST(testing::all_ranks(ok));
}

BOOST_AUTO_TEST_CASE(same_rank_count_and_plan_give_the_same_bits) {
  const Data data;
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  const int ranks = testing::world_size();
  const Run a = train_on(ranks, cfg), b = train_on(ranks, cfg);
  BOOST_TEST(testing::all_ranks(a.result.losses == b.result.losses && a.params == b.params));
  // and another seed gives another run (the comparison can fail)
  cfg.seed += 1;
  const Run c = train_on(ranks, cfg);
  BOOST_TEST(testing::all_ranks(c.result.losses != a.result.losses));
}

// embedding.index = direct trains as hashed does, bit for bit, at every rank count and placement: a train lookup
// finds a key's initial values either way, and the backward's sums do not depend on row ids. (Their eval differs
// where a key was never trained: zeros hashed, its initial values direct.) Every communicator call is checked
// against the other ranks' (comm.check_calls): a rank whose calls differ would end the run naming both.
BOOST_AUTO_TEST_CASE(direct_index_trains_like_hashed) {
  const Data data;
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  cfg.comm_check_calls = true;
  bool ok = true;
  const int ranks = testing::world_size();  // the suite runs at 1-4 ranks: each rank count once
  for (const char* placement : {"dispatch", "localized", "replicated", "distributed", "hybrid",
                                "localized:0,replicated,distributed,hybrid"}) {
    cfg.placement = placement;
    cfg.index = "hashed";
    const Run h = train_on(ranks, cfg);
    cfg.index = "direct";
    const Run d = train_on(ranks, cfg);
    if (!(d.result.losses == h.result.losses && d.params == h.params)) {
      ok = false;
      BOOST_TEST_MESSAGE(ranks << " ranks, " << placement << ": direct and hashed differ");
    }
  }
  BOOST_TEST(testing::all_ranks(ok));
}

// embedding.tier = host (src/host_tier.h: rows in host memory under a GPU cache smaller than a rank's shard) trains
// as HBM tables do, bit for bit, at every placement, and saves the same rows.
BOOST_AUTO_TEST_CASE(host_tier_trains_like_hbm) {
  const Data data(8192, 3000);
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  cfg.global_batch = 256;  // at most 512 distinct keys of a table per step, all of them for a replicated table
  bool ok = true;
  const int ranks = testing::world_size();
  for (const char* placement : {"dispatch", "localized", "replicated", "distributed", "hybrid"}) {
    cfg.placement = placement;
    cfg.tier = "hbm";
    cfg.cache_rows = 0;
    const Run h = train_on(ranks, cfg);
    cfg.tier = "host";
    cfg.cache_rows = 600;
    cfg.eviction = placement[0] == 'd' ? "lfu" : "lru";
    const Run t = train_on(ranks, cfg);
    if (!(t.result.losses == h.result.losses && t.params == h.params)) {
      ok = false;
      BOOST_TEST_MESSAGE(ranks << " ranks, " << placement << ": host tier and hbm differ");
    }
  }
  BOOST_TEST(testing::all_ranks(ok));
}

// embedding.atomic_update (sgd, each key's step added to its row by itself) follows the sorted update's
// trajectory within float rounding at every placement: a row several keys touch takes w - a - b instead of
// w - (a + b); the replicated copies' sums keep the fixed order either way.
BOOST_AUTO_TEST_CASE(atomic_update_trains_like_sorted) {
  const Data data;
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  cfg.sparse.kind = OptimizerKind::sgd;
  cfg.sparse.lr = 0.5f;
  bool ok = true;
  const int ranks = testing::world_size();
  for (const char* placement : {"dispatch", "localized", "distributed", "hybrid", "localized:0,replicated,distributed,hybrid"}) {
    cfg.placement = placement;
    cfg.sparse.atomic_update = false;
    const Run sorted = train_on(ranks, cfg);
    cfg.sparse.atomic_update = true;
    const Run atomic = train_on(ranks, cfg);
    if (testing::world_rank() == 0)
      ok = close_trajectory(atomic.result.losses, sorted.result.losses, kTrajectoryTol,
                            std::to_string(ranks) + " ranks, " + placement + ", atomic against sorted") && ok;
  }
  BOOST_TEST(testing::all_ranks(ok));
}

// cfg run to step `stop` (its checkpoints in cfg.checkpoint_dir), then resumed from there to cfg.steps.
std::pair<Run, Run> stop_and_resume(int ranks, const TrainConfig& cfg, int64_t stop, Backend backend = Backend::cpu) {
  TrainConfig first = cfg;
  first.steps = stop;
  Run a = train_on(ranks, first, backend);
  TrainConfig second = cfg;
  second.resume = true;
  Run b = train_on(ranks, second, backend);
  return {std::move(a), std::move(b)};
}

// Bitwise for every placement at the same rank count: a loaded table inserts its keys in key order, so its rows
// have other ids than in the uninterrupted run, but the backward sums a row's gradients in an order that depends
// only on the row's own contributions in key order (kernels/embedding_backward.h, the fixed order), not on row
// ids. With another rank count or plan the sums over ranks are grouped otherwise: within kTrajectoryTol.
BOOST_AUTO_TEST_CASE(resume_continues_the_trajectory) {
  const Data data;
  testing::SharedTempPath dir("mpi_test_train", "resume");
  const int W = testing::world_size();
  for (const char* placement : {"dispatch", "hybrid", "localized", "replicated", "distributed"}) {
    const bool routed = std::string(placement) == "dispatch" || std::string(placement) == "hybrid";
    TrainConfig cfg = base_config(data);
    cfg.eval_path.clear();
    cfg.placement = placement;
    cfg.steps = 60;  // beyond one epoch (48 batches): the resumed reader continues into the reshuffled epoch 2
    const Run whole = train_on(W, cfg);

    // Stopped at step 40 (checkpoints at 20 and 40), then resumed to 60 with the same ranks.
    TrainConfig first = cfg;
    first.checkpoint_dir = dir.path + "/" + placement;
    first.checkpoint_every = 20;
    const auto [a, b] = stop_and_resume(W, first, 40);
    bool ok = true;
    if (testing::world_rank() == 0) {
      std::vector<double> joined = a.result.losses;
      joined.insert(joined.end(), b.result.losses.begin(), b.result.losses.end());
      ok = b.result.first_step == 40 && b.result.last_step == 60 && joined == whole.result.losses &&
           b.params == whole.params;
      if (!ok) {
        size_t i = 0;
        while (i < joined.size() && i < whole.result.losses.size() && joined[i] == whole.result.losses[i]) ++i;
        BOOST_TEST_MESSAGE(placement << ": resumed run differs: first step " << b.result.first_step << ", "
                           << joined.size() << " losses, the first different one at step " << i + 1 << ", params "
                           << (b.params == whole.params ? "equal" : "differ"));
      }
    }
    BOOST_TEST(testing::all_ranks(ok), placement);

    // Resumed with another rank count (1 rank, or 2 when the job has more) and another plan: within tolerance.
    if (W > 1 && routed) {
      TrainConfig other = first;
      other.placement = "replicated";
      other.checkpoint_dir = dir.path + "/other_" + placement;
      const Run c = train_on(W == 2 ? 1 : 2, other, Backend::cpu, first.checkpoint_dir + "/step-40");
      // What the load got wrong shows from the first resumed steps (the loss of the loaded rows, then of their
      // optimizer state): close_trajectory_tiers.
      bool close = true;
      if (testing::world_rank() == 0) {
        const std::vector<double> tail(whole.result.losses.begin() + 40, whole.result.losses.end());
        close = c.result.first_step == 40 && c.result.losses.size() == tail.size() &&
                close_trajectory_tiers(c.result.losses, tail, kResumedTight,
                                       std::string("resharded resume of ") + placement);
      }
      BOOST_TEST(testing::all_ranks(close));
    }
  }
}

// fp16: a resumed run goes on with the checkpoint's loss scale. From 2^40 the first steps overflow until the scale
// fits; a run resumed at step 30 from a checkpoint then skips what the uninterrupted run skipped after step 30
// (nothing, or a step near the limit) and ends at its scale; starting over from 2^40 it would skip its first
// steps again and end at another scale. The resumed run is the uninterrupted one bit for bit
// (resume_continues_the_trajectory), so a step that overflows near the limit does so in both.
BOOST_AUTO_TEST_CASE(fp16_resume_keeps_the_loss_scale) {
  const Data data;
  testing::SharedTempPath dir("mpi_test_train", "fp16_resume");
  const int W = testing::world_size();
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  cfg.placement = "dispatch";
  cfg.model.precision = GemmType::f16;
  cfg.loss_scale_init = std::ldexp(1.0, 40);
  cfg.steps = 40;
  const Run whole = train_on(W, cfg);
  TrainConfig first = cfg;
  first.checkpoint_dir = dir.path;
  first.checkpoint_every = 30;
  const auto [a, b] = stop_and_resume(W, first, 30);
  bool ok = true;
  if (testing::world_rank() == 0) {
    std::vector<int64_t> late;
    for (int64_t s : whole.result.skipped_steps)
      if (s > 30) late.push_back(s);
    ok = !a.result.skipped_steps.empty() && b.result.first_step == 30 && b.result.skipped_steps == late &&
         b.result.loss_scale == whole.result.loss_scale;
    BOOST_TEST_MESSAGE("fp16 resume: " << a.result.skipped_steps.size() << " skipped before the checkpoint, "
                       << b.result.skipped_steps.size() << " after it (uninterrupted: " << late.size()
                       << "); final scale " << b.result.loss_scale << " (uninterrupted " << whole.result.loss_scale
                       << ")");
  }
  BOOST_TEST(testing::all_ranks(ok));
}

// The planted task's training: 6 epochs of 1024-sample batches, the schedule's decay in the last third.
TrainConfig planted_config(const Data& data, const char* interaction) {
  TrainConfig cfg = base_config(data);
  cfg.model.interaction = parse_interaction(interaction);
  cfg.model.cross_layers = 2;
  // rank 16: at rank 8 one initialization in a few dozen stayed 0.046 under the teacher (seed 30014915160491, on
  // 1 and 2 ranks alike); at 16 the 24 seeds tried end 0.010-0.015 under it
  cfg.model.cross_rank = 16;
  // top 32-1: with top 16-1, dot ended 0.049 under the teacher for 2 initializations of 31 (seeds 17223202496047
  // and 1007, on 1 rank); with 32 the 51 seeds tried end 0.009-0.025 under it, dcnv2 0.008-0.016
  cfg.model.top_mlp = {32, 1};
  cfg.global_batch = 1024;
  cfg.steps = 0;
  cfg.epochs = 6;
  cfg.log_every = 64;
  cfg.dense.lr = cfg.schedule.lr = 0.02f;
  cfg.schedule.decay_start = 256;
  cfg.schedule.decay_steps = 128;
  return cfg;
}

// The fp32 run of the planted task, with the next seed (at most twice) when a run falls short of the teacher: the
// small model's initialization gets stuck now and then (seed 26771388545414: dot at 0.769 against 0.876, at 1 and
// 2 ranks, and at dense lr 0.03 too; 0 of 25 other seeds, all 0.856-0.868; seeds 41112220080378 and the next both
// left dcnv2 at 0.831 at 1-4 ranks, the one after at 0.864), which says nothing of the trainer, while a trainer
// that does not learn falls short every time. The AUC is global: every rank decides alike.
Run planted_run(TrainConfig& cfg, const Data& data) {
  for (int attempt = 0;; ++attempt) {
    Run r = train_on(testing::world_size(), cfg);
    const double auc = r.result.evals.empty() ? 0 : r.result.evals.back().second.auc;
    if (auc >= data.teacher_auc - kAucGap || attempt == 2) return r;
    BOOST_TEST_MESSAGE(interaction_name(cfg.model.interaction) << ": seed " << cfg.seed << " ended at AUC " << auc
                                                                << "; once more with seed " << cfg.seed + 1);
    cfg.seed += 1;
  }
}

BOOST_AUTO_TEST_CASE(planted_task_is_learned) {
  // 4 dense features, 3 slots of 20 rows (every key is seen often), 64 steps an epoch: a task the small model
  // learns in seconds.
  const Data data(65536, 20, 4, 3);
  for (const char* interaction : {"dot", "dcnv2"}) {
    TrainConfig cfg = planted_config(data, interaction);
    cfg.eval_every = 192;
    const Run r = planted_run(cfg, data);
    const double auc = r.result.evals.empty() ? 0 : r.result.evals.back().second.auc;
    BOOST_TEST_MESSAGE(interaction << ": eval AUC " << auc << ", teacher " << data.teacher_auc);
    BOOST_TEST(r.result.evals.size() == 2u);
    BOOST_TEST(std::fabs(r.result.teacher_auc - data.teacher_auc) < 1e-12);
    BOOST_TEST(auc >= data.teacher_auc - kAucGap);
    BOOST_TEST(r.result.evals.back().second.samples == 8192);
  }
}

BOOST_AUTO_TEST_CASE(target_auc_stops_early) {
  const Data data;
  TrainConfig cfg = base_config(data);
  cfg.steps = 96;
  cfg.eval_every = 16;
  cfg.target_auc = 0.5;  // the first evaluation reaches it
  const Run r = train_on(testing::world_size(), cfg);
  BOOST_TEST(r.result.reached_target);
  BOOST_TEST(r.result.last_step == 16);
  BOOST_TEST(r.result.losses.size() == 16u);
}

namespace {

// Every rank throws, before training, an Error whose message names every word.
void expect_error(const TrainConfig& cfg, std::vector<std::string> words) {
  bool threw = false, named = true, every = false;
  Topology topo = make_topology(MPI_COMM_WORLD, 0);
  try {
    Trainer t(MPI_COMM_WORLD, topo, Device(), cfg);
  } catch (const Error& e) {
    threw = true;
    every = e.every_rank();
    const std::string m = e.what();
    for (const std::string& w : words)
      if (m.find(w) == std::string::npos) {
        named = false;
        BOOST_TEST_MESSAGE("error '" << m << "' does not name '" << w << "'");
      }
  }
  free_topology(topo);
  BOOST_TEST(testing::all_ranks(threw && named && every));
}

}  // namespace

BOOST_AUTO_TEST_CASE(misconfigurations_are_errors_on_every_rank) {
  const Data data;
  TrainConfig c = base_config(data);
  c.index = "direct";  // a direct index takes no embedding.rows
  c.rows = 50;
  expect_error(c, {"embedding.index", "embedding.rows", "50"});
  c = base_config(data);
  c.sparse.atomic_update = true;  // sgd only; the base config's tables take adagrad
  expect_error(c, {"embedding.atomic_update", "adagrad"});
  c = base_config(data);
  c.tier = "host";  // a cache needs a size
  expect_error(c, {"embedding.tier host", "embedding.cache_rows", "embedding.cache_mb"});
  c.tier = "hbm";
  c.cache_rows = 10;
  expect_error(c, {"embedding.cache_rows", "tier 'hbm'"});
  c.tier = "auto";  // the planner sizes the cache, or takes one of the two sizes
  c.cache_mb = 1;
  expect_error(c, {"embedding.tier auto", "embedding.cache_rows", "embedding.cache_mb", "or neither"});
  c.cache_mb = 0;
  c.tier = "disk";
  expect_error(c, {"embedding.tier", "'disk'", "hbm, host or auto"});
  c.tier = "host";
  c.eviction = "fifo";
  expect_error(c, {"embedding.eviction", "'fifo'"});
  c = base_config(data);
  c.model.num_slots = 5;
  expect_error(c, {"model.num_slots", "4", "5", data.train});
  c = base_config(data);
  c.model.num_dense = 3;
  expect_error(c, {"model.num_dense", "13", "3"});
  c = base_config(data);
  c.eval_path = data.other;
  expect_error(c, {data.other});
  c = base_config(data);
  c.train_path = data.train + ".missing";
  expect_error(c, {".missing"});
  c = base_config(data);
  c.global_batch = 100000;
  expect_error(c, {"data.global_batch", "100000", "24576"});
  if (testing::world_size() > 1) {
    c = base_config(data);
    c.global_batch = 1;
    expect_error(c, {"data.global_batch", "rank count"});
  }
  c = base_config(data);
  c.model.bottom_mlp = {16, 7};
  expect_error(c, {"model.bottom_mlp", "model.embedding_dim", "7"});
  c = base_config(data);
  c.placement = "dispatch,dispatch";
  expect_error(c, {"embedding.placement", "4"});
  c = base_config(data);
  c.placement = "scattered";
  expect_error(c, {"embedding.placement", "scattered"});
  c = base_config(data);
  c.memory_mb = 0.001;
  expect_error(c, {"table"});
  c = base_config(data);
  c.dense.kind = OptimizerKind::lazy_adam;
  expect_error(c, {"optimizer.kind", "lazy_adam"});
  testing::SharedTempPath empty("mpi_test_train", "empty");
  c = base_config(data);
  c.checkpoint_dir = empty.path;
  c.resume = true;
  expect_error(c, {empty.path});
}

namespace {

// The whole model on GPUs against the cpu backend: a few steps, within a tolerance that covers the GEMMs'
// different summation orders (cuBLASLt vs OpenBLAS) compounding over the steps.
void gpu_matches_cpu() {
  const Data data;
  TrainConfig cfg = base_config(data);
  cfg.eval_path.clear();
  cfg.steps = 6;
  const int W = testing::world_size();
  const Run cpu = train_on(W, cfg, Backend::cpu), gpu = train_on(W, cfg, Backend::cuda);
  bool ok = true;
  if (testing::world_rank() == 0) ok = close_trajectory(gpu.result.losses, cpu.result.losses, 1e-4, "cuda vs cpu");
  BOOST_TEST(testing::all_ranks(ok));
}

}  // namespace

BOOST_AUTO_TEST_CASE(whole_model_on_gpu_matches_cpu, *testing::needs_gpu_per_rank()) { gpu_matches_cpu(); }

// On GPUs, where concurrent inserts give rows other ids in every run and a loaded table inserts in key order, a
// resumed run still continues the uninterrupted one bit for bit for every placement: a row's gradient is summed
// in items counted from its own first contribution (kernels/embedding_backward.h), not from row ids.
BOOST_AUTO_TEST_CASE(cuda_resume_continues_the_trajectory, *testing::needs_gpu_per_rank()) {
  const Data data;
  testing::SharedTempPath dir("mpi_test_train", "cuda_resume");
  const int W = testing::world_size();
  for (const char* placement : {"dispatch", "hybrid", "localized", "replicated", "distributed"}) {
    TrainConfig cfg = base_config(data);
    cfg.eval_path.clear();
    cfg.placement = placement;
    cfg.steps = 30;
    const Run whole = train_on(W, cfg, Backend::cuda);
    TrainConfig first = cfg;
    first.checkpoint_dir = dir.path + "/" + placement;
    first.checkpoint_every = 10;
    const auto [a, b] = stop_and_resume(W, first, 20, Backend::cuda);
    bool ok = true;
    if (testing::world_rank() == 0) {
      std::vector<double> joined = a.result.losses;
      joined.insert(joined.end(), b.result.losses.begin(), b.result.losses.end());
      ok = b.result.first_step == 20 && joined == whole.result.losses && b.params == whole.params;
      if (!ok) BOOST_TEST_MESSAGE(placement << ": the resumed cuda run differs from the uninterrupted one");
    }
    BOOST_TEST(testing::all_ranks(ok), placement);
  }
}

// fp16 with dynamic loss scaling learns the planted task about as well as fp32 (within kFp16AucGap of the fp32
// run's AUC, and within kAucGap of the teacher's), and every rank skips the same steps.
BOOST_AUTO_TEST_CASE(fp16_planted_task_is_learned_like_fp32) {
  // A short run (6 epochs of a small planted task): its AUC moves by about 0.01 with the summation order of the
  // machine's BLAS, in fp32 and in fp16 alike.
  constexpr double kFp16AucGap = 0.025;
  const Data data(65536, 20, 4, 3);
  for (const char* interaction : {"dot", "dcnv2"}) {
    TrainConfig cfg = planted_config(data, interaction);
    cfg.eval_every = 0;
    const Run f32 = planted_run(cfg, data);  // f16 below: with f32's seed
    cfg.model.precision = GemmType::f16;
    const Run f16 = train_on(testing::world_size(), cfg);
    auto auc = [](const Run& r) { return r.result.evals.empty() ? 0.0 : r.result.evals.back().second.auc; };
    BOOST_TEST_MESSAGE(interaction << ": fp16 eval AUC " << auc(f16) << ", fp32 " << auc(f32) << ", teacher "
                                   << data.teacher_auc << "; fp16 skipped " << f16.result.skipped_steps.size()
                                   << " step(s), final loss scale " << f16.result.loss_scale);
    BOOST_TEST(auc(f16) >= auc(f32) - kFp16AucGap);
    BOOST_TEST(auc(f16) >= data.teacher_auc - kAucGap);
    BOOST_TEST(f32.result.skipped_steps.empty());
    BOOST_TEST(f32.result.loss_scale == 1.0);
    BOOST_TEST(f16.result.skipped_steps.size() < 8u);  // a handful at most, at the start
    // the same skipped steps and scale on every rank: rank 0's, broadcast, against each rank's own
    std::vector<int64_t> mine = f16.result.skipped_steps;
    mine.push_back(int64_t(f16.result.loss_scale));
    int64_t n = int64_t(mine.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    std::vector<int64_t> root = mine;
    root.resize(size_t(n));
    MPI_Bcast(root.data(), int(n), MPI_INT64_T, 0, MPI_COMM_WORLD);
    BOOST_TEST(testing::all_ranks(root == mine));
  }
}

// 16-bit table storage (embedding.storage bf16 / fp16, stochastic rounding) learns the planted task as well as
// fp32 storage: the eval AUC at most kStorageAucGap under the fp32 run's, same seed, with rowwise_adagrad (the
// optimizer 16-bit storage takes besides sgd).
// A 16-bit run follows its own trajectory (other rounding), and the small model lands now and then in a worse
// end, as an fp32 run does on another seed (planted_run): seed 121513089012 left dot at 0.857 with fp16 rows on
// the CPU and with bf16 and fp16 rows on an H200, against 0.863 in fp32, while 24 other seeds kept every 16-bit
// run within 0.004 of fp32 (mostly 0.001). So a storage that falls short is tried on the next seed, at most twice:
// one that loses accuracy loses on every seed.
BOOST_AUTO_TEST_CASE(sixteen_bit_storage_learns_the_planted_task_like_fp32) {
  constexpr double kStorageAucGap = 0.005;
  const Data data(65536, 20, 4, 3);
  auto auc = [](const Run& r) { return r.result.evals.empty() ? 0.0 : r.result.evals.back().second.auc; };
  for (const char* interaction : {"dot", "dcnv2"}) {
    // the fp32 run of a seed, once for both storages: the seed planted_run ended on, and its AUC
    std::map<uint64_t, std::pair<uint64_t, double>> fp32_of;
    for (const char* storage : {"bf16", "fp16"}) {
      TrainConfig cfg = planted_config(data, interaction);
      cfg.sparse.kind = OptimizerKind::rowwise_adagrad;
      cfg.eval_every = 0;
      double a16 = 0, a32 = 0;
      for (int attempt = 0; attempt < 3; ++attempt) {
        auto known = fp32_of.find(cfg.seed);
        if (known == fp32_of.end()) {
          const uint64_t asked = cfg.seed;
          cfg.storage = "fp32";
          a32 = auc(planted_run(cfg, data));  // 16-bit below: with fp32's seed
          fp32_of[asked] = {cfg.seed, a32};
        } else {
          cfg.seed = known->second.first;
          a32 = known->second.second;
        }
        cfg.storage = storage;
        a16 = auc(train_on(testing::world_size(), cfg));
        BOOST_TEST_MESSAGE(interaction << ": seed " << cfg.seed << ", storage " << storage << " eval AUC " << a16
                                       << ", fp32 " << a32 << ", teacher " << data.teacher_auc);
        if (a16 >= a32 - kStorageAucGap) break;
        cfg.seed += 1;
      }
      BOOST_TEST(a16 >= a32 - kStorageAucGap, interaction << " " << storage << ": AUC " << a16 << ", fp32 " << a32);
    }
  }
}

namespace {

// key → the row's values followed by its optimizer state, for every table (collective over the trainer's world)
std::vector<std::map<int64_t, std::vector<float>>> rows_by_key(Trainer& t) {
  std::vector<std::map<int64_t, std::vector<float>>> out;
  for (int table = 0; table < t.config().model.num_slots; ++table)
    out.push_back(testing::rows_by_key(t.held_rows(table)));
  return out;
}

// Rows of a and b under the same key: how many, and how many of them differ.
std::pair<size_t, size_t> compare_rows(const std::vector<std::map<int64_t, std::vector<float>>>& a,
                                       const std::vector<std::map<int64_t, std::vector<float>>>& b) {
  size_t common = 0, differ = 0;
  for (size_t t = 0; t < a.size() && t < b.size(); ++t)
    for (const auto& kv : a[t]) {
      auto it = b[t].find(kv.first);
      if (it == b[t].end()) continue;
      ++common;
      differ += it->second != kv.second;
    }
  return {common, differ};
}

// Routing ahead (the next step's batch checked, cut and routed while the step before trains) and looking up
// ahead (its lookups queued after this step's backward) change no bit. A run of 9 steps routes every step but the
// first ahead (and looks step 4's batch up ahead in step 3); the same run stopped at step 3 and resumed (a resume
// is bit for bit: resume_continues_the_trajectory) routes step 4's batch at its own forward. Losses, evaluations
// (run between steps, between a batch's route and its forward), dense parameters and every rank's rows by key
// are equal, for every placement, hashed and direct, with a checkpoint written mid-run, fp32 and bf16 models.
void route_ahead_trains_alike(Backend backend) {
  const Data data;
  testing::SharedTempPath dir("mpi_test_train", "route_ahead");
  const int ranks = testing::world_size();
  bool ok = true;
  int run = 0;
  for (const char* placement : {"dispatch", "auto", "localized:0,replicated,dispatch,hybrid"})
    for (const char* index : {"hashed", "direct"}) {
      TrainConfig cfg = base_config(data);
      cfg.placement = placement;
      cfg.index = index;
      cfg.steps = 9;
      cfg.eval_every = 4;
      cfg.checkpoint_every = 5;
      if (std::string(index) == "direct") cfg.model.precision = GemmType::bf16;
      // whole: 9 steps in one run; then 3 steps, resumed to 9 (into another checkpoint folder)
      std::vector<Run> runs;
      std::vector<std::vector<std::map<int64_t, std::vector<float>>>> rows;
      for (int part : {0, 1, 2}) {
        TrainConfig c = cfg;
        c.checkpoint_dir = dir.path + "/" + std::to_string(run) + (part == 0 ? "whole" : "parts");
        if (part == 1) c.steps = 3;
        c.resume = part == 2;
        SubWorld w(ranks, backend);
        Trainer t(w.comm, w.topo, w.dev, c, TrainerMode::train);
        Run r;
        r.result = t.run();
        r.params = t.dense_params();
        runs.push_back(r);
        rows.push_back(rows_by_key(t));
      }
      ++run;
      const TrainResult& a = runs[0].result;
      const TrainResult& b = runs[2].result;
      std::vector<double> joined = runs[1].result.losses;
      joined.insert(joined.end(), b.losses.begin(), b.losses.end());
      bool same = a.losses == joined && runs[0].params == runs[2].params && rows[0] == rows[2] &&
                  a.evals.size() == 3 && a.evals.size() == b.evals.size() && a.losses.size() == 9;
      for (size_t i = 0; same && i < a.evals.size(); ++i)
        same = a.evals[i].first == b.evals[i].first && a.evals[i].second.auc == b.evals[i].second.auc &&
               a.evals[i].second.logloss == b.evals[i].second.logloss;
      if (!same)
        BOOST_TEST_MESSAGE(ranks << " ranks, " << placement << ", " << index
                                 << ": routing ahead changes the run (against routing at the forward)");
      ok = ok && same;
    }
  BOOST_TEST(testing::all_ranks(ok));
}
SPARTA_MPI_BACKEND_CASES(route_ahead_trains_bit_for_bit, route_ahead_trains_alike)

// fp16 from an absurd loss scale (2^40): the first steps overflow, and every rank skips them, halving the scale
// each time, until the scale fits; then the run trains (its parameters move) with no further skips. A run whose
// steps all overflow changes nothing: its dense parameters are the initial ones, and its embedding rows (written
// with their initial values at their first lookup, changed only by the sparse optimizer) and their optimizer
// state equal those of a run whose only step overflowed, and differ from the trained run's.
void fp16_overflow_skips_steps(Backend backend) {
  const Data data;
  for (int ranks : rank_counts()) {
    if (ranks > 2) break;
    TrainConfig cfg = base_config(data);
    cfg.eval_path.clear();
    cfg.model.precision = GemmType::f16;
    cfg.loss_scale_init = std::ldexp(1.0, 40);
    cfg.loss_scale_window = 2000;
    cfg.steps = 40;
    cfg.log_every = 40;
    testing::SharedTempPath metrics("mpi_test_train", "fp16_metrics.jsonl");
    cfg.metrics_path = metrics.path;
    SubWorld w(ranks, backend);
    bool ok = true;
    if (w.in()) {
      Trainer t(w.comm, w.topo, w.dev, cfg);
      const std::vector<float> p0 = t.dense_params();
      const TrainResult r = t.run();
      cfg.metrics_path.clear();
      const std::vector<int64_t>& s = r.skipped_steps;
      const int64_t k = int64_t(s.size());
      // the first steps, up to the first that fits (a later step may overflow again at a scale just below the
      // limit, and is skipped too); the scale halved at each, never grown (the window is longer than the run)
      int64_t lead = 0;
      while (lead < k && s[size_t(lead)] == lead + 1) ++lead;
      ok = ok && lead >= 1 && k < cfg.steps && r.loss_scale == std::ldexp(1.0, 40 - int(k));
      ok = ok && t.dense_params() != p0 && r.losses.size() == size_t(cfg.steps);
      BOOST_TEST_MESSAGE(ranks << " rank(s): skipped " << k << " step(s), final scale " << r.loss_scale);
      // every rank of the sub-world skipped the same steps
      int64_t sig = 0;
      for (int64_t i = 0; i < k; ++i) sig = sig * 1000003 + s[size_t(i)];
      int64_t lo = sig, hi = sig;
      MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, w.comm);
      MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, w.comm);
      ok = ok && lo == hi;
      if (testing::world_rank() == 0) {  // the train metrics line reports the scale and the skipped steps
        std::ifstream in(metrics.path);
        std::string line, train;
        while (std::getline(in, line))
          if (line.find("\"train\"") != std::string::npos) train = line;
        const std::string want = "\"skipped_steps\":" + std::to_string(k);
        const bool reported = train.find(want) != std::string::npos && train.find("\"loss_scale\":") != std::string::npos;
        if (!reported) BOOST_TEST_MESSAGE("train metrics '" << train << "' do not hold " << want);
        ok = ok && reported;
      }
      const auto trained = rows_by_key(t);

      // as many steps, each overflowing for sure (2^60 down to 2^(61 - k)): whether the last of the run's k
      // overflowing steps overflows again at its scale can depend on the summation order of another machine
      cfg.steps = k;
      cfg.loss_scale_init = std::ldexp(1.0, 60);
      Trainer a(w.comm, w.topo, w.dev, cfg);
      const std::vector<float> a0 = a.dense_params();
      const TrainResult ra = a.run();
      ok = ok && a.dense_params() == a0 && int64_t(ra.skipped_steps.size()) == k;
      const auto skipped_rows = rows_by_key(a);

      cfg.steps = 1;  // its one step overflows too
      Trainer b(w.comm, w.topo, w.dev, cfg);
      const TrainResult rb = b.run();
      ok = ok && rb.skipped_steps.size() == 1u;
      const auto untouched = rows_by_key(b);
      const auto same = compare_rows(skipped_rows, untouched), moved = compare_rows(trained, untouched);
      BOOST_TEST_MESSAGE(ranks << " rank(s): " << same.first << " rows in common with an untouched run, " << same.second
                               << " differ; the trained run: " << moved.second << " of " << moved.first << " differ");
      ok = ok && same.first > 0 && same.second == 0 && moved.first > 0 && moved.second > 0;
    }
    BOOST_TEST(testing::all_ranks(ok));
  }
}

}  // namespace

SPARTA_MPI_BACKEND_CASES(fp16_overflow_skips_the_steps_on_every_rank, fp16_overflow_skips_steps)
