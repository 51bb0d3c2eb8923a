// sparta-datagen: writes a synthetic dataset (io/synthetic.h) of any size, deterministic by its seeds; under
// mpiexec the ranks generate their sample ranges in parallel and rank 0 writes (the file is the same for
// any rank count). Splits of one task share --teacher-seed and differ in --seed:
//   mpiexec -n 4 sparta-datagen --out train.h5 --samples 10000000 --preset mlperf --max-rows 1000000 --teacher-seed 7 --seed 1
//   mpiexec -n 4 sparta-datagen --out eval.h5  --samples 1000000  --preset mlperf --max-rows 1000000 --teacher-seed 7 --seed 2
#include <algorithm>
#include <string>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/context.h"
#include "io/dataset.h"
#include "src/base/log.h"
#include "src/options.h"
#include "io/outputs.h"
#include "io/synthetic.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  sparta::ContextOptions copt;
  copt.device = "cpu";  // generation needs no GPU
  sparta::Context ctx(copt);
  sparta::SyntheticOptions so;
  sparta::WriteOptions wo;
  std::string out, level;
  bool progress = false;
  unsigned long long seed = 1, teacher_seed = 1;
  sparta::po::options_description desc("sparta-datagen options");
  desc.add_options()("help,h", "print this help")(
      "out", sparta::po::value<std::string>(&out)->required(), "output HDF5 file")(
      "samples", sparta::po::value<int64_t>(&so.samples)->required(), "number of samples")(
      "preset", sparta::po::value<std::string>(&so.preset)->default_value("small"),
      "small (8 tables, demos and tests) | mlperf (MLPerf DLRM v1 Criteo 1TB: 13 dense, 26 tables)")(
      "num-dense", sparta::po::value<int64_t>(&so.num_dense)->default_value(-1), "dense features (-1: the preset's, 13)")(
      "slots", sparta::po::value<int64_t>(&so.slots)->default_value(-1),
      "sparse slots (-1: the preset's; fewer takes the first tables, more repeats them)")(
      "hotness", sparta::po::value<std::string>(&so.hotness)->default_value("1"),
      "keys per slot: k (fixed), a-b (uniform per sample), or a comma list with one per slot")(
      "alpha", sparta::po::value<std::string>(&so.alpha)->default_value("1.1"),
      "power-law exponent of key frequencies (0: uniform; HugeCTR presets 0.9 1.1 1.3), or one per slot")(
      "max-rows", sparta::po::value<int64_t>(&so.max_rows)->default_value(0), "cap on every table's cardinality (0: none)")(
      "seed", sparta::po::value<unsigned long long>(&seed)->default_value(1),
      "seed of the samples (give each split of a task its own)")(
      "teacher-seed", sparta::po::value<unsigned long long>(&teacher_seed)->default_value(1),
      "seed of the task: the planted teacher and the dense distributions (the same for train and eval)")(
      "chunk", sparta::po::value<int64_t>(&wo.chunk_rows)->default_value(65536), "samples per HDF5 chunk (and per rank per round)")(
      "gzip", sparta::po::value<int>(&wo.gzip)->default_value(0), "gzip level 1..9 (0: none)")(
      "fletcher32", sparta::po::bool_switch(&wo.fletcher32), "a Fletcher32 checksum per chunk")(
      "progress", sparta::po::bool_switch(&progress), "progress bar on stderr (default: when stderr is a TTY)")(
      "log-level", sparta::po::value<std::string>(&level)->default_value("info"), "debug | info | warn | error");
  return sparta::run_program("sparta-datagen", [&] {
    sparta::po::variables_map vm;
    sparta::SyntheticConfig cfg;
    bool help = false;
    // Every rank parses the same options: agreeing on the verdict lets a bad one end the job with status 1.
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      help = !sparta::parse_options(argc, argv, desc, vm, "usage: mpiexec -n N sparta-datagen --out FILE --samples N [options]");
      if (help) return;
      so.seed = seed;
      so.teacher_seed = teacher_seed;
      cfg = sparta::make_synthetic_config(so);
      SPARTA_REQUIRE(cfg.num_samples >= 1, "--samples: expected >= 1 (a dataset needs a sample), found %lld",
                     (long long)cfg.num_samples);
      SPARTA_REQUIRE(wo.chunk_rows >= 1, "--chunk: expected >= 1 samples per chunk, found %lld", (long long)wo.chunk_rows);
      SPARTA_REQUIRE(wo.gzip >= 0 && wo.gzip <= 9, "--gzip: expected 0 (none) to 9, found %d", wo.gzip);
      if (ctx.rank() != 0) return;  // rank 0 writes the file
      sparta::require_output_not_input({"--out", out}, {});
      // At least this many bytes (compression may save most of them, hence the 8 with --gzip).
      double keys = 0;  // the fewest keys a sample can have
      for (int64_t h : cfg.hotness_min) keys += double(h);
      const double per_sample = 4.0 * (1 + cfg.num_dense) + 8.0 * (double(cfg.num_slots()) + keys);
      const double need = double(cfg.num_samples) * per_sample / (wo.gzip > 0 ? 8 : 1);
      sparta::require_free_space({"--out", out}, need > 1.8e19 ? UINT64_MAX : uint64_t(need),
                                 sparta::strprintf("%lld samples", (long long)cfg.num_samples));
    }));
    if (help) return 0;
    sparta::StagedOutput staged(out);
    LOG_INFO("sparta-datagen: %lld samples, %lld dense, %lld slots, seed %llu, teacher seed %llu, %d rank(s) -> %s",
             (long long)cfg.num_samples, (long long)cfg.num_dense, (long long)cfg.num_slots(), seed, teacher_seed,
             ctx.world(), out.c_str());
    // Written under a temporary name, renamed once complete (io/outputs.h).
    sparta::GenerateResult r = sparta::generate_dataset(staged.path(), cfg, wo, MPI_COMM_WORLD,
                                                        progress || sparta::ProgressBar::stderr_is_tty());
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      if (ctx.rank() == 0) staged.commit();
    }), "datagen (rename)");
    LOG_INFO("sparta-datagen: wrote %s: %lld samples, %lld keys, click rate %.4f, teacher AUC %.4f, %.1f s (%.2f M samples/s)",
             out.c_str(), (long long)cfg.num_samples, (long long)r.num_keys, r.positive_rate, r.teacher_auc, r.seconds,
             cfg.num_samples / std::max(r.seconds, 1e-9) / 1e6);
    return 0;
  });
}
