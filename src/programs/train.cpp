// sparta-train: trains a DLRM or DCNv2 model under mpiexec, one rank per device (src/trainer.h), configured by an
// INI file and command-line overrides (src/train_config.h; `sparta-train --help` lists every option):
//   mpiexec -n 2 sparta-train --config experiments/configs/demo.ini --data.train train.h5 --data.eval eval.h5
// Rank 0 prints the plan, the memory of every rank, a progress line per log interval and the evaluations, and
// writes the metrics as JSON lines; a bad option, file or size ends every rank with its message, status 1.
// --benchmark times the step on synthetic batches in memory instead (src/train_benchmark.h).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/deadline.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/options.h"
#include "src/train_config.h"
#include "src/metrics.h"
#include "src/train_benchmark.h"
#include "src/trainer.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  {  // messages before the context is up (a bad option) name the rank too
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    sparta::set_identity(rank, host);
  }
  return sparta::run_program("sparta-train", [&] {
    sparta::TrainConfig cfg;
    bool help = false;
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      help = !sparta::parse_train_config(argc, argv, cfg);
      if (!help) sparta::set_job_timeout(cfg.comm_timeout_s);
    }));
    if (help) return 0;
    sparta::Context ctx(cfg.context);
    if (cfg.benchmark) {
      // A metrics file that cannot be written is an error on every rank before the benchmark runs.
      sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
        if (ctx.rank() != 0 || cfg.metrics_path.empty()) return;
        std::ofstream probe(cfg.metrics_path, std::ios::app);
        SPARTA_REQUIRE(probe.good(), "train.metrics '%s': cannot open for writing: %s", cfg.metrics_path.c_str(),
                       std::strerror(errno));
      }), "opening train.metrics");
      const sparta::BenchmarkResult r =
          sparta::run_benchmark(MPI_COMM_WORLD, ctx.topo(), ctx.device(), cfg, cfg.bench);
      sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
        if (ctx.rank() != 0) return;
        std::fputs(r.table(cfg, cfg.bench).c_str(), stdout);
        if (cfg.metrics_path.empty()) return;
        std::string command;
        for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
        char date[32];
        const std::time_t now = std::time(nullptr);
        std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
        std::ofstream out(cfg.metrics_path, std::ios::app);
        out << "{\"record\":\"benchmark\"," << r.json_fields(cfg, cfg.bench) << ",\"ranks\":" << ctx.world()
            << ",\"device\":" << sparta::json_string(ctx.device().name())
            << ",\"host\":" << sparta::json_string(sparta::identity_host()) << ",\"command\":"
            << sparta::json_string(command) << ",\"date\":\"" << date << "\"}\n";
        SPARTA_REQUIRE(out.good(), "train.metrics: cannot write '%s'", cfg.metrics_path.c_str());
      }), "writing train.metrics");
      return r.wrong == 0 ? 0 : 1;
    }
    sparta::Trainer trainer(ctx, cfg);
    sparta::TrainResult r = trainer.run();
    if (!r.evals.empty()) {
      const sparta::EvalMetrics& m = r.evals.back().second;
      if (r.teacher_auc >= 0)
        LOG_INFO("final AUC %.4f, teacher AUC %.4f (gap %.4f); log-loss %.4f, accuracy %.4f, step %lld", m.auc,
                 r.teacher_auc, r.teacher_auc - m.auc, m.logloss, m.accuracy, (long long)r.last_step);
      else
        LOG_INFO("final AUC %.4f; log-loss %.4f, accuracy %.4f, step %lld", m.auc, m.logloss, m.accuracy,
                 (long long)r.last_step);
    }
    return 0;
  });
}
