// bench_train: the training step of sparta-train (src/trainer.h) on synthetic batches held in memory, in the MLPerf
// shapes by default (26 tables capped at --max-rows, 13 dense features, DLRM's MLPs, --batch samples per rank):
// --warmup untimed steps (they insert the batch's keys), then --steps timed ones, each with the host waiting after
// every phase so that the step splits into ms_data (host → device), ms_embedding (the collection's forward and
// backward), ms_dense (the model and its optimizer) and ms_comm (the dense all-reduce). The timed step does not
// overlap its phases, so samples_per_s is a lower bound of sparta-train's. Medians over the timed steps; JSON
// lines with every parameter and the provenance; the run fails (#wrong > 0) when a dense parameter is not finite.
// Records carry what experiments/scaling_model.py --check reads: placement (the plan's, when every table has the
// same), ms_step, global_batch, comm_mode, nodes, and the provenance's ranks.
//   mpiexec -n 8 bench_train [--batch 65536] [--max-rows 4000000] [--model dot|dcnv2] [--placement auto]
//                            [--precision fp32|bf16] [--warmup 3] [--steps 10] [--out results/bench_train.jsonl]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "experiments/support_bench.h"
#include "io/synthetic.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/options.h"
#include "src/trainer.h"

namespace {

// This rank's slice of one global batch, generated (the sample stream's samples [first, first + n)).
sparta::Batch make_batch(const sparta::SyntheticConfig& c, int64_t first, int64_t n, sparta::Backend backend) {
  sparta::SampleBlock block;
  sparta::Teacher teacher(c);
  sparta::generate_samples(c, teacher, first, n, block);
  sparta::Batch b;
  b.size = n;
  b.num_dense = c.num_dense;
  b.num_slots = c.num_slots();
  b.num_keys = int64_t(block.keys.size());
  b.labels = sparta::PinnedBuffer<float>(backend, block.labels.size());
  b.dense = sparta::PinnedBuffer<float>(backend, block.dense.size());
  b.offsets = sparta::PinnedBuffer<int64_t>(backend, block.offsets.size());
  b.keys = sparta::PinnedBuffer<int64_t>(backend, std::max<size_t>(1, block.keys.size()));
  std::memcpy(b.labels.data(), block.labels.data(), block.labels.size() * sizeof(float));
  std::memcpy(b.dense.data(), block.dense.data(), block.dense.size() * sizeof(float));
  std::memcpy(b.offsets.data(), block.offsets.data(), block.offsets.size() * sizeof(int64_t));
  std::memcpy(b.keys.data(), block.keys.data(), block.keys.size() * sizeof(int64_t));
  b.segments = {{first, n}};
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  sparta::ContextOptions copt;
  std::string level, preset, hotness, interaction, placement, precision, comm_mode, out;
  int64_t batch = 0, max_rows = 0, warmup = 0, steps = 0;
  int dim = 0;
  sparta::po::options_description desc("bench_train options");
  sparta::add_common_options(desc, copt, level);
  desc.add_options()("batch", sparta::po::value<int64_t>(&batch)->default_value(65536), "samples per rank per step")(
      "preset", sparta::po::value<std::string>(&preset)->default_value("mlperf"), "mlperf | small (io/synthetic.h)")(
      "max-rows", sparta::po::value<int64_t>(&max_rows)->default_value(4000000), "cap on every table's rows")(
      "hotness", sparta::po::value<std::string>(&hotness)->default_value("1"), "keys per slot: k or a-b")(
      "model", sparta::po::value<std::string>(&interaction)->default_value("dot"),
      "dot (DLRM: MLPerf v1 MLPs) | dcnv2 (the cross network; MLPerf DCNv2 MLPs)")(
      "embedding-dim", sparta::po::value<int>(&dim)->default_value(128), "embedding width (dot: also the bottom MLP's output)")(
      "placement", sparta::po::value<std::string>(&placement)->default_value("auto"), "embedding.placement")(
      "comm-mode", sparta::po::value<std::string>(&comm_mode)->default_value("hier"), "comm.mode: hier | mpi | nccl")(
      "precision", sparta::po::value<std::string>(&precision)->default_value("fp32"), "fp32 | bf16")(
      "warmup", sparta::po::value<int64_t>(&warmup)->default_value(3), "untimed steps")(
      "steps", sparta::po::value<int64_t>(&steps)->default_value(10), "timed steps")(
      "out", sparta::po::value<std::string>(&out)->default_value(""), "JSON lines file (appended)");
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  return sparta::run_program("bench_train", [&] {
    sparta::po::variables_map vm;
    bool help = false;
    sparta::TrainConfig cfg;
    sparta::SyntheticConfig data;
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      help = !sparta::parse_options(argc, argv, desc, vm, "usage: mpiexec -n N bench_train [options]");
      if (help) return;
      SPARTA_REQUIRE(batch >= 1 && warmup >= 0 && steps >= 1, "--batch, --warmup, --steps: expected >= 1, >= 0, >= 1, "
                     "found %lld, %lld, %lld", (long long)batch, (long long)warmup, (long long)steps);
      SPARTA_REQUIRE(precision == "fp32" || precision == "bf16", "--precision: expected fp32 or bf16, found '%s'",
                     precision.c_str());
      cfg.train_path = "(in memory)";
      cfg.model.interaction = sparta::parse_interaction(interaction);
      cfg.model.embedding_dim = dim;
      if (cfg.model.interaction == sparta::Interaction::dot) cfg.model.bottom_mlp.back() = dim;
      cfg.model.precision = precision == "bf16" ? sparta::GemmType::bf16 : sparta::GemmType::f32;
      cfg.placement = placement;
      cfg.comm_mode = comm_mode;
      cfg.sparse.kind = sparta::OptimizerKind::adagrad;
      cfg.log_every = 1;
      sparta::check_train_config(cfg);
    }));
    if (help) return 0;
    sparta::Context ctx(copt);
    const int W = ctx.world();
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      sparta::SyntheticOptions o;
      o.preset = preset;
      o.samples = batch * W;
      o.max_rows = max_rows;
      o.hotness = hotness;
      data = sparta::make_synthetic_config(o);
    }));
    cfg.global_batch = batch * W;
    const sparta::Batch b = make_batch(data, ctx.rank() * batch, batch, ctx.device().backend);
    sparta::Trainer trainer(MPI_COMM_WORLD, ctx.topo(), ctx.device(), cfg, sparta::synthetic_schema(data), b,
                            batch * W);
    for (int64_t i = 0; i < warmup; ++i) trainer.timed_step(b, batch * W);
    std::vector<double> total, data_ms, emb, dense, comm;
    for (int64_t i = 0; i < steps; ++i) {
      const sparta::Trainer::StepTimes t = trainer.timed_step(b, batch * W);
      // The slowest rank sets the step: the maximum over ranks of each phase.
      double v[5] = {t.total_ms(), t.data_ms, t.embedding_ms, t.dense_ms, t.comm_ms};
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
      total.push_back(v[0]), data_ms.push_back(v[1]), emb.push_back(v[2]), dense.push_back(v[3]), comm.push_back(v[4]);
    }
    int64_t wrong = 0;
    for (float p : trainer.dense_params()) wrong += !std::isfinite(p);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));

    // The placement the plan chose ("auto" resolved), when every table has the same one.
    std::string planned = sparta::placement_name(trainer.plan().tables.front().placement);
    for (const sparta::TablePlan& t : trainer.plan().tables)
      if (planned != sparta::placement_name(t.placement)) planned = "mixed";
    using sparta::bench::median;
    const double ms = median(total), rate = double(batch * W) / (ms / 1e3);
    std::vector<std::string> devices(W);
    {
      const std::string mine = sparta::bench::device_description(ctx.device());
      std::vector<char> buf(size_t(256) * W, 0);
      char own[256] = {0};
      std::snprintf(own, sizeof(own), "%s", mine.c_str());
      MPI_CHECK(MPI_Allgather(own, 256, MPI_CHAR, buf.data(), 256, MPI_CHAR, MPI_COMM_WORLD));
      for (int r = 0; r < W; ++r) devices[r] = std::string(&buf[size_t(256) * r]);
    }
    if (ctx.rank() == 0) {
      std::printf("# %-6s %-5s %-10s %8s %5s | %12s %9s %9s %9s %9s %9s %6s\n", "model", "prec", "placement", "batch",
                  "ranks", "samples/s", "ms_step", "ms_data", "ms_emb", "ms_dense", "ms_comm", "#wrong");
      std::printf("  %-6s %-5s %-10s %8lld %5d | %12.0f %9.2f %9.2f %9.2f %9.2f %9.2f %6lld\n", interaction.c_str(),
                  precision.c_str(), planned.c_str(), (long long)batch, W, rate, ms, median(data_ms), median(emb),
                  median(dense), median(comm), (long long)wrong);
      sparta::bench::JsonLines jl(out, sparta::bench::provenance(argc, argv, devices, W));
      jl.write(sparta::strprintf(
          "\"bench\":\"train\",\"interaction\":\"%s\",\"precision\":\"%s\",\"placement\":\"%s\","
          "\"placement_option\":\"%s\",\"comm_mode\":\"%s\",\"nodes\":%d,\"preset\":\"%s\","
          "\"max_rows\":%lld,\"hotness\":\"%s\",\"embedding_dim\":%d,\"batch_per_rank\":%lld,\"global_batch\":%lld,"
          "\"warmup\":%lld,\"steps\":%lld,\"samples_per_s\":%.1f,\"ms_step\":%.4f,\"ms_data\":%.4f,"
          "\"ms_embedding\":%.4f,\"ms_dense\":%.4f,\"ms_comm\":%.4f,\"wrong\":%lld",
          interaction.c_str(), precision.c_str(), planned.c_str(), placement.c_str(), comm_mode.c_str(),
          ctx.topo().num_nodes, preset.c_str(), (long long)max_rows,
          hotness.c_str(), dim, (long long)batch, (long long)(batch * W), (long long)warmup, (long long)steps, rate, ms,
          median(data_ms), median(emb), median(dense), median(comm), (long long)wrong));
    }
    return wrong == 0 ? 0 : 1;
  });
}
