// sparta-train and sparta-predict as programs under mpiexec: a misconfiguration ends every rank with its message
// and exit status 1 before any work; a run writes its checkpoint and metrics; sparta-predict on another rank count
// gives the predictions of the trained model in file order, with the labels of the file and the run's AUC.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "io/h5.h"
#include "src/base/device.h"
#include "tests/testing.h"

namespace {

const std::string kTrain = "../bin/sparta-train", kPredict = "../bin/sparta-predict", kDatagen = "../bin/sparta-datagen";

// A planted task of 4 slots (train 8192 samples, eval 2048) in dir.
void make_data(const std::string& dir) {
  testing::run_command("mkdir -p " + dir);
  for (auto [name, samples, seed] : {std::tuple<const char*, int, int>{"train", 8192, 1}, {"eval", 2048, 2}}) {
    const testing::CommandResult r = testing::run_command(testing::tool_command(
        kDatagen, 1,
        "--preset small --slots 4 --max-rows 50 --samples " + std::to_string(samples) + " --seed " +
            std::to_string(seed) + " --teacher-seed 3 --chunk 1024 --log-level warn --out " + dir + "/" + name + ".h5"));
    BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  }
}

std::string small_model(const std::string& dir, const std::string& batch = "512", const std::string& bottom = "16,8") {
  return "--data.train " + dir + "/train.h5 --data.eval " + dir + "/eval.h5 --data.global_batch " + batch +
         " --model.embedding_dim 8 --model.bottom_mlp " + bottom + " --model.top_mlp 16,1 --device cpu ";
}

size_t count(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

// Runs sparta-train with 2 ranks; expects status 1 and the message (every word) once, from rank 0, naming the
// ranks that failed.
void expect_failure(const std::string& args, std::vector<std::string> words) {
  const testing::CommandResult r = testing::run_command(testing::tool_command(kTrain, 2, args));
  BOOST_TEST(r.status == 1, args << "\n" << r.output);
  BOOST_TEST(count(r.output, "sparta-train: ") == 1u, r.output);
  BOOST_TEST(r.output.find("sparta-train: rank") != std::string::npos, r.output);
  for (const std::string& w : words) BOOST_TEST(r.output.find(w) != std::string::npos, "'" << w << "' in " << r.output);
  BOOST_TEST(r.output.find("step 1/") == std::string::npos);  // no work was done
}

}  // namespace

BOOST_AUTO_TEST_CASE(misconfigurations_end_every_rank_with_status_1) {
  testing::ScopedPath dir("test_model_programs", "bad");
  make_data(dir.path);
  const std::string ok = small_model(dir.path);
  expect_failure(ok + "--train.colour blue", {"train.colour"});
  expect_failure(small_model(dir.path, "100000"), {"data.global_batch", "100000", "8192"});
  expect_failure(ok + "--model.num_slots 6", {"model.num_slots", "6", "4 sparse slots"});
  expect_failure(ok + "--model.num_dense 3", {"model.num_dense", "13"});
  expect_failure(small_model(dir.path, "512", "16,4"), {"model.bottom_mlp", "model.embedding_dim"});
  expect_failure("--data.train " + dir.path + "/none.h5", {dir.path + "/none.h5"});
  {
    std::ofstream f(dir.path + "/bad.ini");
    f << "[model]\ninteraction = dot\nbottom_mlp\n";
  }
  expect_failure(ok + "--config " + dir.path + "/bad.ini", {dir.path + "/bad.ini"});
  expect_failure(ok + "--config " + dir.path + "/absent.ini", {dir.path + "/absent.ini"});
  expect_failure(ok + "--train.resume --train.checkpoint_dir " + dir.path + "/nothing", {dir.path + "/nothing"});
}

BOOST_AUTO_TEST_CASE(help_lists_every_section) {
  const testing::CommandResult r = testing::run_command(testing::tool_command(kTrain, 2, "--help"));
  BOOST_TEST(r.status == 0);
  for (const char* w : {"[data]", "[model]", "[embedding]", "[optimizer]", "[train]", "[comm]", "--config",
                        "--model.interaction", "--train.resume"})
    BOOST_TEST(r.output.find(w) != std::string::npos, w);
  BOOST_TEST(count(r.output, "usage:") == 1u);  // rank 0 only
}

BOOST_AUTO_TEST_CASE(train_then_predict_on_another_rank_count) {
  testing::ScopedPath dir("test_model_programs", "run");
  make_data(dir.path);
  const std::string args = small_model(dir.path) + "--train.epochs 2 --train.log_every 8 --train.metrics " + dir.path +
                           "/m.jsonl --train.checkpoint_dir " + dir.path + "/ckpt --log-level info";
  testing::CommandResult r = testing::run_command(testing::tool_command(kTrain, 2, args, 120));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  for (const char* w : {"embedding plan", "device memory per rank", "rank 1:", "step 8/32", "samples/s", "ETA",
                        "final AUC", "teacher AUC", "checkpoint: step 32"})
    BOOST_TEST(r.output.find(w) != std::string::npos, w << " in " << r.output);
  // The metrics: a run record, a train record per interval (4) and the final eval.
  std::ifstream m(dir.path + "/m.jsonl");
  std::string line, last_eval;
  size_t train = 0, runs = 0;
  while (std::getline(m, line)) {
    train += line.find("\"record\":\"train\"") != std::string::npos;
    runs += line.find("\"record\":\"run\"") != std::string::npos;
    if (line.find("\"record\":\"eval\"") != std::string::npos) last_eval = line;
  }
  BOOST_TEST(train == 4u);
  BOOST_TEST(runs == 1u);
  BOOST_REQUIRE(!last_eval.empty());
  const size_t at = last_eval.find("\"auc\":") + 6;
  const double auc = std::stod(last_eval.substr(at));
  BOOST_TEST(auc > 0.6);

  r = testing::run_command(testing::tool_command(kPredict, 3,
                                                 "--device cpu --checkpoint " + dir.path + "/ckpt --data " + dir.path +
                                                     "/eval.h5 --out " + dir.path + "/p.h5",
                                                 120));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  sparta::h5::File p = sparta::h5::open_file(dir.path + "/p.h5");
  sparta::h5::File e = sparta::h5::open_file(dir.path + "/eval.h5");
  const std::vector<float> prob = sparta::h5::read_all<float>(p, "/prediction");
  const std::vector<float> label = sparta::h5::read_all<float>(p, "/label");
  BOOST_TEST(prob.size() == 2048u);
  BOOST_TEST(label == sparta::h5::read_all<float>(e, "/label"));  // file order
  bool in_range = true;
  for (float v : prob) in_range = in_range && v >= 0.f && v <= 1.f;
  BOOST_TEST(in_range);
  BOOST_TEST(sparta::h5::read_attr_int(p, "/", "step") == 32);
  // The model of 2 ranks evaluated by 3: the same AUC up to the order of a bag's float sums.
  BOOST_TEST(std::fabs(sparta::h5::read_attr_double(p, "/", "auc") - auc) < 1e-6);
}

// Slurm's per-task GPU binding emulated: each of 2 ranks sees one GPU of its own (CUDA_VISIBLE_DEVICES set per
// rank from its local rank), so both see it as GPU 0. --device auto and --device cuda train on the GPUs (the
// local rank 1 included), and rank 0 says what auto chose and why. Needs 2 GPUs.
BOOST_AUTO_TEST_CASE(one_visible_gpu_per_rank_trains_on_the_gpus,
                     *testing::needs_gpus(2)) {
  testing::ScopedPath dir("test_model_programs", "binding");
  make_data(dir.path);
  const char* mpiexec = std::getenv("SPARTA_MPIEXEC");
  for (const char* device : {"auto", "cuda"}) {
    std::string args = small_model(dir.path) + "--train.steps 8 --train.log_every 4 --log-level info";
    args.replace(args.find("--device cpu"), 12, std::string("--device ") + device);
    const std::string program = testing::tool_command(kTrain, 0, args, 0);
    const std::string cmd = "timeout -k 5 120 " + std::string(mpiexec ? mpiexec : "mpiexec") +
                            " -n 2 sh -c 'CUDA_VISIBLE_DEVICES=${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-0}} "
                            "exec " + program + "'";
    const testing::CommandResult r = testing::run_command(cmd);
    BOOST_REQUIRE_MESSAGE(r.status == 0, cmd << "\n" << r.output);
    BOOST_TEST(r.output.find("2 rank(s) on cuda") != std::string::npos, r.output);
    if (std::string(device) == "auto")
      BOOST_TEST(r.output.find("each rank uses the one GPU it sees") != std::string::npos, r.output);
    BOOST_TEST(r.output.find("the cpu backend runs") == std::string::npos, r.output);
  }
}

// A file written by h5py from numpy arrays of their default types (float64 labels and dense features, int32
// category codes as pandas makes them) trains and predicts: the writer README.md shows, run as it is there.
BOOST_AUTO_TEST_CASE(h5py_written_file_trains_and_predicts) {
  testing::ScopedPath dir("test_model_programs", "h5py");
  testing::run_command("mkdir -p " + dir.path);
  const std::string script = R"PY(
import sys
import h5py, numpy as np

def write_sparta(path, label, dense, cats, cardinality):  # [N], [N, D], [N, S] codes in [0, cardinality)
    n, s = cats.shape
    with h5py.File(path, "w") as f:
        f.attrs.update(format="sparta-dataset", version=1, num_samples=n, num_dense=dense.shape[1], num_slots=s,
                       cardinality=cardinality, hotness=np.ones(s, dtype=np.int64),
                       preprocessing="pandas DataFrame")
        f["label"] = label                          # float64 or int64 are read as float32
        f["dense"] = dense                          # float64 is rounded to float32
        f["sparse/offsets"] = np.arange(n * s + 1)  # one key per (sample, slot)
        f["sparse/keys"] = cats.reshape(-1)         # any integer type

rng = np.random.default_rng(int(sys.argv[2]))
n = 3000
cats = rng.integers(0, 20, size=(n, 3)).astype(np.int32)
dense = rng.normal(size=(n, 2)) * 10 + 3
logit = 0.3 * dense[:, 0] - 0.2 * dense[:, 1] + (cats[:, 0] % 4) - 1.5
label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
write_sparta(sys.argv[1], label, dense, cats, np.full(3, 20))
)PY";
  {
    std::ofstream f(dir.path + "/write.py");
    f << script;
  }
  for (auto [name, seed] : {std::pair<const char*, int>{"train", 1}, {"eval", 2}}) {
    const testing::CommandResult w = testing::run_command(testing::python() + " " + dir.path + "/write.py " +
                                                          dir.path + "/" + name + ".h5 " + std::to_string(seed));
    BOOST_REQUIRE_MESSAGE(w.status == 0, w.output);
  }
  const std::string args = small_model(dir.path, "256") + "--train.epochs 3 --data.normalize standardize "
                           "--train.eval_every epoch --train.keep_best --train.checkpoint_dir " + dir.path +
                           "/ckpt --train.metrics " + dir.path + "/m.jsonl --log-level info";
  testing::CommandResult r = testing::run_command(testing::tool_command(kTrain, 2, args, 120));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_TEST(r.output.find("final AUC") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("teacher") == std::string::npos, r.output);  // real data: no teacher to compare with
  std::ifstream m(dir.path + "/m.jsonl");
  const std::string metrics((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
  BOOST_TEST(count(metrics, "\"record\":\"eval\"") == 3u, metrics);
  BOOST_TEST(metrics.find("teacher_auc") == std::string::npos, metrics);
  r = testing::run_command(testing::tool_command(
      kPredict, 1, "--device cpu --checkpoint " + dir.path + "/ckpt --data " + dir.path + "/eval.h5 --out " +
                       dir.path + "/p.h5", 120));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  sparta::h5::File p = sparta::h5::open_file(dir.path + "/p.h5");
  BOOST_TEST(sparta::h5::read_attr_double(p, "/", "auc") > 0.7);
  BOOST_TEST(!sparta::h5::has_attr(p, "/", "teacher_auc"));
}

// sparta-predict's errors name its own options (--data, --batch) and the checkpoint's model, not the training
// configuration's options (data.eval, data.eval_batch, model.num_dense) that the user never typed.
BOOST_AUTO_TEST_CASE(predict_errors_name_its_own_options) {
  testing::ScopedPath dir("test_model_programs", "predict_errors");
  make_data(dir.path);
  testing::CommandResult r = testing::run_command(testing::tool_command(
      kTrain, 1, small_model(dir.path) + "--train.steps 2 --log-level warn --train.checkpoint_dir " + dir.path + "/ckpt",
      120));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  r = testing::run_command(testing::tool_command(
      kDatagen, 1, "--preset small --slots 4 --max-rows 50 --samples 100 --num-dense 5 --log-level warn --out " +
                       dir.path + "/five.h5"));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  const std::string predict = "--device cpu --checkpoint " + dir.path + "/ckpt --out " + dir.path + "/p.h5 --data ";
  r = testing::run_command(testing::tool_command(kPredict, 2, predict + dir.path + "/five.h5"));
  BOOST_TEST(r.status == 1, r.output);
  BOOST_TEST(r.output.find("--data '" + dir.path + "/five.h5': the file has 5 dense features per sample, the "
                           "checkpoint's model expects 13") != std::string::npos, r.output);
  const std::string first = r.output;
  r = testing::run_command(testing::tool_command(kPredict, 3, predict + dir.path + "/eval.h5 --batch 2"));
  BOOST_TEST(r.status == 1, r.output);
  BOOST_TEST(r.output.find("--batch: expected at least 3 (the rank count), found 2") != std::string::npos, r.output);
  for (const char* theirs : {"data.eval", "model.num_dense", "data.eval_batch"})
    BOOST_TEST((first + r.output).find(theirs) == std::string::npos, theirs << " in " << first << r.output);
}
