// bench_train: the training step of sparta-train (src/trainer.h) on synthetic batches held in memory, in the MLPerf
// shapes by default (26 tables capped at --max-rows, 13 dense features, DLRM's MLPs, --batch samples per rank):
// --warmup untimed steps (they insert the batch's keys), then --steps timed ones, each with the host waiting after
// every phase so that the step splits into ms_data (host → device), ms_embedding (the collection's forward and
// backward), ms_dense (the model and its optimizer) and ms_comm (the dense all-reduce). The timed step does not
// overlap its phases, so samples_per_s is a lower bound of sparta-train's. Medians over the timed steps; JSON
// lines with every parameter and the provenance; the run fails (#wrong > 0) when a dense parameter is not finite.
// The driver is src/train_benchmark.h (sparta-train --benchmark runs the same).
// Records carry what experiments/scaling_model.py --check reads: placement (the plan's, when every table has the
// same), ms_step, global_batch, comm_mode, nodes, and the provenance's ranks.
//   mpiexec -n 8 bench_train [--batch 65536] [--max-rows 4000000] [--model dot|dcnv2] [--placement auto]
//                            [--precision fp32|bf16] [--warmup 3] [--steps 10] [--out results/bench_train.jsonl]
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "experiments/support_bench.h"
#include "io/synthetic.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/options.h"
#include "src/train_benchmark.h"

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
  return sparta::run_program("bench_train", [&] {
    sparta::po::variables_map vm;
    bool help = false;
    sparta::TrainConfig cfg;
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
      cfg.benchmark = true;
      sparta::check_train_config(cfg);
    }));
    if (help) return 0;
    sparta::Context ctx(copt);
    const int W = ctx.world();
    sparta::BenchmarkOptions bo;
    bo.preset = preset;
    bo.max_rows = max_rows;
    bo.hotness = hotness;
    bo.batch = batch;
    bo.warmup = warmup;
    bo.steps = steps;
    const sparta::BenchmarkResult r = sparta::run_benchmark(MPI_COMM_WORLD, ctx.topo(), ctx.device(), cfg, bo);
    std::vector<std::string> devices(W);
    {
      const std::string mine = sparta::bench::device_description(ctx.device());
      std::vector<char> buf(size_t(256) * W, 0);
      char own[256] = {0};
      std::snprintf(own, sizeof(own), "%s", mine.c_str());
      MPI_CHECK(MPI_Allgather(own, 256, MPI_CHAR, buf.data(), 256, MPI_CHAR, MPI_COMM_WORLD));
      for (int q = 0; q < W; ++q) devices[q] = std::string(&buf[size_t(256) * q]);
    }
    if (ctx.rank() == 0) {
      std::fputs(r.table(cfg, bo).c_str(), stdout);
      sparta::bench::JsonLines jl(out, sparta::bench::provenance(argc, argv, devices, W));
      jl.write(r.json_fields(cfg, bo));
    }
    return r.wrong == 0 ? 0 : 1;
  });
}
