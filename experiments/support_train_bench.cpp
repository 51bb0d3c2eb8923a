// support_train_bench.cpp: see support_train_bench.h.
#include "experiments/support_train_bench.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "io/synthetic.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/trainer.h"
#include "src/base/deadline.h"

namespace sparta {

namespace {

// This rank's slice of one global batch: samples [first, first + n) of the sample stream.
Batch make_batch(const SyntheticConfig& c, int64_t first, int64_t n, Backend backend) {
  SampleBlock block;
  Teacher teacher(c);
  generate_samples(c, teacher, first, n, block);
  Batch b;
  b.size = n;
  b.num_dense = c.num_dense;
  b.num_slots = c.num_slots();
  b.num_keys = int64_t(block.keys.size());
  b.labels = PinnedBuffer<float>(backend, block.labels.size());
  b.dense = PinnedBuffer<float>(backend, block.dense.size());
  b.offsets = PinnedBuffer<int64_t>(backend, block.offsets.size());
  b.keys = PinnedBuffer<int64_t>(backend, std::max<size_t>(1, block.keys.size()));
  std::memcpy(b.labels.data(), block.labels.data(), block.labels.size() * sizeof(float));
  std::memcpy(b.dense.data(), block.dense.data(), block.dense.size() * sizeof(float));
  std::memcpy(b.offsets.data(), block.offsets.data(), block.offsets.size() * sizeof(int64_t));
  std::memcpy(b.keys.data(), block.keys.data(), block.keys.size() * sizeof(int64_t));
  b.segments = {{first, n}};
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

BenchmarkResult run_benchmark(MPI_Comm world, const Topology& topo, const Device& dev, TrainConfig cfg,
                              const BenchmarkOptions& o) {
  int rank = 0, W = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &W));
  SyntheticConfig data;
  agree_on_error(world, guarded([&] {
    SPARTA_REQUIRE(o.batch >= 1 && o.warmup >= 0 && o.steps >= 1 && o.batches >= 1,
                   "benchmark: batch >= 1, warmup >= 0, steps >= 1 and batches >= 1 expected, found %lld, %lld, %lld, "
                   "%lld",
                   (long long)o.batch, (long long)o.warmup, (long long)o.steps, (long long)o.batches);
    SyntheticOptions so;
    so.preset = o.preset;
    so.samples = o.batch * W * o.batches;
    so.max_rows = o.max_rows;
    so.hotness = o.hotness;
    so.alpha = strprintf("%.17g", o.alpha);
    data = make_synthetic_config(so);
  }));
  const int64_t G = o.batch * W;
  cfg.global_batch = G;
  if (cfg.train_path.empty()) cfg.train_path = "(in memory)";
  std::vector<Batch> batches;
  for (int64_t j = 0; j < o.batches; ++j) batches.push_back(make_batch(data, (j * W + rank) * o.batch, o.batch, dev.backend));
  std::vector<const Batch*> order;
  for (const Batch& b : batches) order.push_back(&b);
  auto nth = [&](int64_t i) -> const Batch& { return batches[size_t(i % o.batches)]; };
  Trainer trainer(world, topo, dev, cfg, synthetic_schema(data), batches.front(), G);
  for (int64_t i = 0; i < o.warmup; ++i) trainer.timed_step(nth(i), G);
  // the timed steps go on through the batches where the warm-up left them
  std::rotate(order.begin(), order.begin() + o.warmup % o.batches, order.end());
  double plain = trainer.plain_steps(order, G, o.steps);
  timed_allreduce(MPI_IN_PLACE, &plain, 1, MPI_DOUBLE, MPI_MAX, world, "benchmark timings");
  std::vector<double> total, data_ms, emb, dense, comm;
  for (int64_t i = 0; i < o.steps; ++i) {
    const Trainer::StepTimes t = trainer.timed_step(nth(o.warmup + o.steps + i), G);
    double v[5] = {t.total_ms(), t.data_ms, t.embedding_ms, t.dense_ms, t.comm_ms};
    timed_allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_MAX, world, "benchmark timings");
    total.push_back(v[0]), data_ms.push_back(v[1]), emb.push_back(v[2]), dense.push_back(v[3]), comm.push_back(v[4]);
  }
  BenchmarkResult r;
  if (o.trace_steps > 0) {  // not timed: the timeline of steps taken as training takes them
    trainer.trace(true);
    trainer.plain_steps(order, G, o.trace_steps);
    r.trace = trainer.read_trace();
    trainer.trace(false);
  }
  for (float p : trainer.dense_params()) r.wrong += !std::isfinite(p);
  timed_allreduce(MPI_IN_PLACE, &r.wrong, 1, MPI_INT64_T, MPI_SUM, world, "benchmark check");
  r.graph_replays = trainer.graph_replays();
  r.ranks = W;
  r.global_batch = G;
  r.model_shape = trainer.config().model.describe();
  r.placement = placement_name(trainer.plan().tables.front().placement);
  for (const TablePlan& t : trainer.plan().tables)
    if (r.placement != placement_name(t.placement)) r.placement = "mixed";
  r.ms_step = plain;
  r.samples_per_s = double(G) / (r.ms_step / 1e3);
  r.ms_phases = median(total);
  r.ms_data = median(data_ms), r.ms_embedding = median(emb), r.ms_dense = median(dense), r.ms_comm = median(comm);
  return r;
}

std::string BenchmarkResult::table(const TrainConfig& cfg, const BenchmarkOptions& o) const {
  return strprintf("# %-6s %-5s %-11s %8s %5s | %12s %9s | %9s %9s %9s %9s %9s %6s\n"
                   "  %-6s %-5s %-11s %8lld %5d | %12.0f %9.2f | %9.2f %9.2f %9.2f %9.2f %9.2f %6lld\n",
                   "model", "prec", "placement", "batch", "ranks", "samples/s", "ms_step", "ms_phases", "ms_data",
                   "ms_emb", "ms_dense", "ms_comm", "#wrong", interaction_name(cfg.model.interaction),
                   precision_name(cfg.model.precision), placement.c_str(), (long long)o.batch,
                   ranks, samples_per_s, ms_step, ms_phases, ms_data, ms_embedding, ms_dense, ms_comm,
                   (long long)wrong);
}

std::string BenchmarkResult::json_fields(const TrainConfig& cfg, const BenchmarkOptions& o) const {
  return strprintf(
      "\"bench\":\"train\",\"model\":\"%s\",\"precision\":\"%s\",\"placement\":\"%s\",\"placement_option\":\"%s\","
      "\"exchange\":\"%s\",\"comm_mode\":\"%s\",\"preset\":\"%s\",\"max_rows\":%lld,\"hotness\":\"%s\","
      "\"embedding_dim\":%d,\"model_shape\":\"%s\",\"batch_per_rank\":%lld,\"global_batch\":%lld,"
      "\"samples_per_s\":%.1f,\"ms_step\":%.4f,\"ms_phases\":%.4f,\"ms_data\":%.4f,\"ms_embedding\":%.4f,"
      "\"ms_dense\":%.4f,\"ms_comm\":%.4f,\"batch_copy\":\"staged\",\"cuda_graphs\":%s,\"graph_replays\":%lld,"
      "\"wrong\":%lld,\"alpha\":%g,\"batches\":%lld",
      interaction_name(cfg.model.interaction), precision_name(cfg.model.precision),
      placement.c_str(), cfg.placement.c_str(), cfg.exchange.c_str(), cfg.comm_mode.c_str(), o.preset.c_str(),
      (long long)o.max_rows, o.hotness.c_str(), cfg.model.embedding_dim, model_shape.c_str(),
      (long long)o.batch, (long long)global_batch, samples_per_s, ms_step,
      ms_phases, ms_data, ms_embedding, ms_dense, ms_comm,
      cfg.cuda_graphs ? "true" : "false",
      (long long)graph_replays, (long long)wrong, o.alpha, (long long)o.batches);
}

}  // namespace sparta
