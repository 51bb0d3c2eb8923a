// sparta-train and sparta-predict as programs under mpiexec: a misconfiguration ends every rank with its message
// and exit status 1 before any work; a run writes its checkpoint and metrics; sparta-predict on another rank count
// gives the predictions of the trained model in file order, with the labels of the file and the run's AUC.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <sstream>

#include "io/h5.h"
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
