// sparta-train: trains a DLRM or DCNv2 model under mpiexec, one rank per device (src/trainer.h), configured by an
// INI file and command-line overrides (src/train_config.h; `sparta-train --help` lists every option):
//   mpiexec -n 2 sparta-train --config experiments/configs/demo.ini --data.train train.h5 --data.eval eval.h5
// Rank 0 prints the plan, the memory of every rank, a progress line per log interval and the evaluations, and
// writes the metrics as JSON lines; a bad option, file or size ends every rank with its message, status 1.
#include <unistd.h>

#include <string>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/deadline.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/options.h"
#include "src/train_config.h"
#include "src/metrics.h"
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
    sparta::Trainer trainer(ctx, cfg);
    sparta::TrainResult r = trainer.run();
    if (!r.evals.empty()) {
      // the final model's evaluation: the last one, or with train.keep_best the best one
      auto e = r.evals.end() - 1;
      if (cfg.keep_best)
        for (auto it = r.evals.begin(); it != r.evals.end(); ++it)
          if (it->first == r.best_step) e = it;
      const sparta::EvalMetrics& m = e->second;
      if (r.teacher_auc >= 0)
        LOG_INFO("final AUC %.4f, teacher AUC %.4f (gap %.4f); log-loss %.4f, accuracy %.4f, step %lld", m.auc,
                 r.teacher_auc, r.teacher_auc - m.auc, m.logloss, m.accuracy, (long long)e->first);
      else
        LOG_INFO("final AUC %.4f; log-loss %.4f, accuracy %.4f, step %lld", m.auc, m.logloss, m.accuracy,
                 (long long)e->first);
    }
    return 0;
  });
}
