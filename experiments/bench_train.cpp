// bench_train: the training step of sparta-train (src/trainer.h) on synthetic batches held in memory, in the MLPerf
// shapes by default (26 tables capped at --max-rows, 13 dense features, DLRM's MLPs, --batch samples per rank):
// --warmup untimed steps (they insert the batch's keys), then --steps timed ones, each with the host waiting after
// every phase so that the step splits into ms_data (host → device), ms_embedding (the collection's forward and
// backward), ms_dense (the model and its optimizer) and ms_comm (the dense all-reduce). The timed step does not
// overlap its phases, so samples_per_s is a lower bound of sparta-train's. Medians over the timed steps; JSON
// lines with every parameter and the provenance; the run fails (#wrong > 0) when a dense parameter is not finite.
// The step's driver is experiments/support_train_bench.h; options, MPI and device set-up, the check's verdict and the JSON lines (every parameter and the provenance) are bench::Driver's
// (experiments/support_bench.h), as in every bench: --warmup is the untimed steps, --steps the timed ones.
// Keys per slot (--hotness): dcnv2 on the mlperf preset runs MLPerf DLRM-DCNv2's multi-hot keys per slot unless
// told (io/synthetic.h mlperf_dcnv2_hotness, 214 a sample), dot one key per slot (MLPerf DLRM v1); the output's head and every record
// ("hotness") state them.
// Keys (--alpha): uniform by default, as the PyTorch peers (experiments/peers/peer_dlrm.py) draw them; --alpha A
// draws them by a power law. --batches K takes K distinct batches in turn (default 1: the same batch every step, as
// the peers do).
//   mpiexec -n 8 bench_train [--batch 65536] [--max-rows 4000000] [--model dot|dcnv2] [--placement auto]
//                            [--alpha 0] [--batches 1]
//                            [--exchange fp32|bf16] [--precision fp32|bf16|fp16] [--cuda-graphs 1|0] [--trace N] [--warmup 3] [--steps 10] [--out results/bench_train.jsonl]
//                            [--index hashed|direct] [--sparse-optimizer rowwise_adagrad|adagrad|sgd] [--atomic-update 0|1]
//                            [--tier hbm|host|auto --cache-gb X | --cache-rows N --eviction lru|lfu]
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "experiments/support_bench.h"
#include "experiments/support_train_bench.h"
#include "io/synthetic.h"
#include "kernels/dense_linear.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/options.h"

int main(int argc, char** argv) {
  using namespace sparta;
  std::string preset = "mlperf", hotness, interaction = "dot", placement = "auto", precision = "fp32",
              exchange = "fp32", comm_mode = "hier", bottom_mlp, top_mlp, index = "hashed", sparse = "rowwise_adagrad",
              storage = "fp32";
  bool atomic_update = false;
  std::string tier = "hbm", eviction = "lru";
  double cache_gb = 0;
  int64_t cache_rows = 0;
  int64_t batch = 65536, max_rows = 4000000, trace = 0, batches = 1;
  double alpha = 0;
  int dim = 128;
  bool graphs = true, gemm_search = true;
  bench::DriverDefaults dd;
  dd.warmup = 3;  // untimed steps (they insert the batch's keys)
  dd.repeats = 10;
  dd.repeats_option = "steps";
  dd.repeats_help = "timed steps (medians reported)";
  bench::Driver d("bench_train", argc, argv, dd);
  d.options().add_options()("batch", po::value(&batch)->default_value(batch), "samples per rank per step")(
      "preset", po::value(&preset)->default_value(preset), "mlperf | small (io/synthetic.h)")(
      "max-rows", po::value(&max_rows)->default_value(max_rows), "cap on every table's rows")(
      "alpha", po::value(&alpha)->default_value(alpha),
      "keys' power law P(key k) ~ (k + 1)^-alpha (io/synthetic.h); 0: uniform, as the PyTorch peers draw them")(
      "batches", po::value(&batches)->default_value(batches),
      "distinct global batches taken in turn, one a step (1: the same keys every step)")(
      "hotness", po::value(&hotness),
      "keys per slot: k, a-b or a comma list, one per slot (default: dcnv2 with the mlperf preset MLPerf "
      "DCNv2's, otherwise 1)")(
      "model", po::value(&interaction)->default_value(interaction),
      "dot (DLRM: MLPerf v1 MLPs) | dcnv2 (the cross network; MLPerf DCNv2 MLPs)")(
      "embedding-dim", po::value(&dim)->default_value(dim), "embedding width (dot: also the bottom MLP's output)")(
      "placement", po::value(&placement)->default_value(placement), "embedding.placement")(
      "exchange", po::value(&exchange)->default_value(exchange), "embedding.exchange: fp32 | bf16")(
      "comm-mode", po::value(&comm_mode)->default_value(comm_mode), "comm.mode: hier | mpi | nccl")(
      "cuda-graphs", po::value(&graphs)->default_value(graphs), "train.cuda_graphs: 1 | 0")(
      "gemm-search", po::value(&gemm_search)->default_value(gemm_search),
      "1: each GEMM shape's cuBLASLt algorithm timed among the heuristic's candidates (kernels/dense_linear.h); "
      "0: the heuristic's first")(
      "trace", po::value(&trace)->default_value(trace),
      "N > 0: after the timed steps, N more as training takes them with their timeline marked (the embeddings' "
      "and the dense stream's points, Trainer::trace), printed for every rank by rank 0 (# trace rank R)")(
      "precision", po::value(&precision)->default_value(precision),
      "fp32 | bf16 | fp16 (fp16: dynamic loss scaling from 2^16)")(
      "bottom-mlp", po::value(&bottom_mlp), "widths after the dense features (comma list; default the model's)")(
      "top-mlp", po::value(&top_mlp), "widths of the top MLP, ending in 1 (comma list; default the model's)")(
      "index", po::value(&index)->default_value(index), "embedding.index: hashed | direct")(
      "sparse-optimizer", po::value(&sparse)->default_value(sparse), "embedding.optimizer (the tables' optimizer)")(
      "atomic-update", po::value(&atomic_update)->default_value(atomic_update), "embedding.atomic_update (sgd): 1 | 0")(
      "storage", po::value(&storage)->default_value(storage), "embedding.storage: fp32 | bf16 | fp16")(
      "tier", po::value(&tier)->default_value(tier),
      "embedding.tier: hbm | host (every row in host memory under a GPU cache per table and rank) | auto (host "
      "where the planner finds no room in HBM), or a list")(
      "cache-gb", po::value(&cache_gb)->default_value(cache_gb),
      "tier host: each table's GPU cache per rank in GB of rows (values and state; embedding.cache_mb)")(
      "cache-rows", po::value(&cache_rows)->default_value(cache_rows), "tier host: the cache in rows instead")(
      "eviction", po::value(&eviction)->default_value(eviction), "embedding.eviction: lru | lfu");
  return d.run("usage: mpiexec -n N bench_train [options]", [&] {
    TrainConfig cfg;
    BenchmarkOptions bo;
    // Every rank checks the same options: a bad one ends every rank with the same message.
    agree_on_error(MPI_COMM_WORLD, guarded([&] {
      SPARTA_REQUIRE(batch >= 1, "--batch: expected >= 1, found %lld", (long long)batch);
      SPARTA_REQUIRE(precision == "fp32" || precision == "bf16" || precision == "fp16",
                     "--precision: expected fp32, bf16 or fp16, found '%s'", precision.c_str());
      cfg.train_path = "(in memory)";
      cfg.model.interaction = parse_interaction(interaction);
      if (hotness.empty()) {  // the list is the mlperf preset's 26 slots
        hotness = "1";
        if (cfg.model.interaction == Interaction::dcnv2 && preset == "mlperf") {
          hotness.clear();
          for (int h : mlperf_dcnv2_hotness()) hotness += (hotness.empty() ? "" : ",") + std::to_string(h);
        }
      }
      cfg.model.embedding_dim = dim;
      cfg.model.num_dense = -1;  // the preset's
      cfg.model.num_slots = -1;
      auto widths = [](const std::string& list, const char* option) {
        std::vector<int> w;
        for (double x : bench::parse_list(list, option)) {
          SPARTA_REQUIRE(x >= 1 && x == double(int(x)), "--%s: expected positive integers, found %g", option, x);
          w.push_back(int(x));
        }
        return w;
      };
      if (!bottom_mlp.empty()) cfg.model.bottom_mlp = widths(bottom_mlp, "bottom-mlp");
      if (!top_mlp.empty()) cfg.model.top_mlp = widths(top_mlp, "top-mlp");
      if (cfg.model.interaction == Interaction::dot) cfg.model.bottom_mlp.back() = dim;
      cfg.model.precision = precision == "bf16" ? GemmType::bf16 : precision == "fp16" ? GemmType::f16 : GemmType::f32;
      cfg.placement = placement;
      cfg.exchange = exchange;
      cfg.comm_mode = comm_mode;
      cfg.cuda_graphs = graphs;
      cfg.index = index;
      cfg.sparse.kind = parse_optimizer(sparse);
      cfg.sparse.atomic_update = atomic_update;
      cfg.storage = storage;
      cfg.tier = tier;
      cfg.cache_rows = cache_rows;
      cfg.cache_mb = cache_gb * 1e9 / 1048576.0;
      cfg.eviction = eviction;
      cfg.log_every = 1;
      check_train_config(cfg);
    }));
    bo.preset = preset;
    bo.max_rows = max_rows;
    bo.hotness = hotness;
    bo.alpha = alpha;
    bo.batches = batches;
    bo.batch = batch;
    bo.warmup = d.warmup();
    bo.steps = d.repeats();
    bo.trace_steps = trace;
    set_gemm_algo_search(gemm_search);
    const BenchmarkResult r = run_benchmark(MPI_COMM_WORLD, d.ctx().topo(), d.device(), cfg, bo);
    if (d.is_root()) {
      std::printf("# keys per slot: %s; keys %s; %lld distinct batches\n", hotness.c_str(),
                  alpha == 0 ? "uniform" : strprintf("power law %g", alpha).c_str(), (long long)batches);
      std::fputs(r.table(cfg, bo).c_str(), stdout);
      std::fflush(stdout);
    }
    if (trace > 0) bench::print_traces(r.trace, MPI_COMM_WORLD);
    // The driver's head has warmup and steps, the provenance ranks and nodes.
    d.record(r.json_fields(cfg, bo) + ",\"sparse_optimizer\":\"" + sparse + "\",\"atomic_update\":" +
             (atomic_update ? "true" : "false") + ",\"index\":\"" + index + "\",\"storage\":\"" + storage + "\",\"gemm_search\":" +
             (gemm_search ? "true" : "false") + ",\"tier\":\"" + tier + "\",\"cache_gb\":" + std::to_string(cache_gb) +
             ",\"cache_rows\":" + std::to_string(cache_rows) + ",\"eviction\":\"" + eviction + "\"");
    d.add_wrong(d.is_root() ? r.wrong : 0);  // r.wrong is already the sum over the ranks
  });
}
