// sparta-predict: a trained model (a sparta-train checkpoint) on a dataset: every sample's predicted click
// probability, written in file order to an HDF5 file with the labels and the metrics, under mpiexec with any rank
// count (the checkpoint reshards into it):
//   mpiexec -n 2 sparta-predict --checkpoint ckpt --data eval.h5 --out predictions.h5
// Output (format "sparta-predictions", version 1): /prediction float32 [N], /label float32 [N]; attributes
// checkpoint, step, dataset, samples, auc, logloss, accuracy, and teacher_auc where the dataset records one.
// The model's configuration comes from the checkpoint; the dataset must have its dense features and slots.
#include <unistd.h>

#include <string>

#include "io/checkpoint.h"
#include "io/h5.h"
#include "io/outputs.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/metrics.h"
#include "src/options.h"
#include "src/train_config.h"
#include "src/trainer.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    sparta::set_identity(rank, host);
  }
  sparta::ContextOptions copt;
  std::string level, checkpoint, data, out;
  int64_t batch = 0, samples = 0;
  sparta::po::options_description desc("sparta-predict options");
  sparta::add_common_options(desc, copt, level);
  desc.add_options()("checkpoint", sparta::po::value<std::string>(&checkpoint)->required(),
                     "a checkpoint root (its `latest` is used) or one step-<n> directory")(
      "data", sparta::po::value<std::string>(&data)->required(), "dataset to predict (HDF5, io/dataset.h)")(
      "out", sparta::po::value<std::string>(&out)->required(), "output HDF5 file (/prediction, /label, metrics)")(
      "batch", sparta::po::value<int64_t>(&batch)->default_value(0),
      "samples per batch over all ranks (0: the checkpoint's data.eval_batch or data.global_batch)")(
      "samples", sparta::po::value<int64_t>(&samples)->default_value(0), "predict the first N samples only (0: all)");
  return sparta::run_program("sparta-predict", [&] {
    sparta::po::variables_map vm;
    bool help = false;
    sparta::TrainConfig cfg;
    std::string step_dir;
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      help = !sparta::parse_options(argc, argv, desc, vm,
                                    "usage: mpiexec -n N sparta-predict --checkpoint DIR --data FILE --out FILE.h5");
      if (help) return;
      SPARTA_REQUIRE(copt.device == "cpu" || copt.device == "cuda" || copt.device == "auto",
                     "--device: expected cpu, cuda or auto, found '%s'", copt.device.c_str());
      SPARTA_REQUIRE(batch >= 0 && samples >= 0, "--batch, --samples: expected >= 0, found %lld and %lld",
                     (long long)batch, (long long)samples);
      // Before anything is read: the output must not be an input (io/outputs.h).
      sparta::require_output_not_input({"--out", out}, {{"--data", data}, {"--checkpoint", checkpoint}});
      step_dir = sparta::resolve_checkpoint_dir(checkpoint);
      const sparta::Manifest m = sparta::read_manifest(step_dir);
      cfg = sparta::parse_train_config_text(m.meta.config, "checkpoint " + m.path + " (its config)");
    }));
    if (help) return 0;
    cfg.eval_path = data;
    if (batch > 0) cfg.eval_batch = batch;
    cfg.eval_samples = samples;
    cfg.resume = false;
    cfg.metrics_path.clear();
    cfg.context = copt;
    sparta::Context ctx(cfg.context);
    sparta::Trainer trainer(ctx, cfg, sparta::TrainerMode::predict, step_dir);
    const sparta::Predictions p = trainer.predict();
    sparta::EvalMetrics m;
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      if (ctx.rank() != 0) return;
      SPARTA_REQUIRE(p.size() > 0, "--data '%s': no sample to predict (the dataset is empty or --samples selects none); "
                     "nothing written", data.c_str());
      m = sparta::evaluate(p.prob, p.label);
      // Under a temporary name, renamed once whole: a full disk leaves no partial file under --out.
      sparta::StagedOutput staged(out);
      sparta::h5::File f = sparta::h5::create_file(staged.path());
      const hsize_t n = p.size();
      sparta::h5::write_dataset<float>(f, "/prediction", p.prob.data(), {n});
      sparta::h5::write_dataset<float>(f, "/label", p.label.data(), {n});
      sparta::h5::write_attr(f, "/", "format", std::string("sparta-predictions"));
      sparta::h5::write_attr(f, "/", "version", int64_t(1));
      sparta::h5::write_attr(f, "/", "checkpoint", step_dir);
      sparta::h5::write_attr(f, "/", "step", trainer.step());
      sparta::h5::write_attr(f, "/", "dataset", data);
      sparta::h5::write_attr(f, "/", "samples", int64_t(n));
      sparta::h5::write_attr(f, "/", "auc", m.auc);
      sparta::h5::write_attr(f, "/", "logloss", m.logloss);
      sparta::h5::write_attr(f, "/", "accuracy", m.accuracy);
      if (trainer.teacher_auc() >= 0) sparta::h5::write_attr(f, "/", "teacher_auc", trainer.teacher_auc());
      sparta::h5::close(f);
      staged.commit();
    }), "predict (output)");
    LOG_INFO("sparta-predict: %lld samples of %s with step %lld of %s -> %s: AUC %.4f, log-loss %.4f, accuracy %.4f",
             (long long)m.samples, data.c_str(), (long long)trainer.step(), step_dir.c_str(), out.c_str(), m.auc,
             m.logloss, m.accuracy);
    return 0;
  });
}
