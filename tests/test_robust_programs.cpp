// The programs as a hostile user runs them: an output that is one of the inputs (directly, through a symbolic
// link or a hard link) is refused before anything is written and the input is left byte for byte; a dataset that
// cannot fit on its disk is refused up front; empty results and unusable --config / train.metrics paths are
// errors with status 1; an agreed error is printed once; train.keep_last keeps the newest steps; a resume falls
// back past a step that does not verify. Needs SPARTA_TOOLS and SPARTA_MPIEXEC (tests/run_all.sh sets them).
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/checkpoint.h"
#include "io/checksum.h"
#include "io/outputs.h"
#include "tests/testing.h"

namespace fs = std::filesystem;

namespace {

const std::string kTrain = "../bin/sparta-train", kPredict = "../bin/sparta-predict",
                  kDatagen = "../bin/sparta-datagen", kConvert = "../bin/sparta-convert", kCkpt = "../bin/sparta-ckpt";

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }
size_t count(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

testing::CommandResult program(const std::string& name, int ranks, const std::string& args) {
  return testing::run_command(testing::tool_command(name, ranks, args, 120));
}

// Status 1 and every word in the output.
void expect_refused(const testing::CommandResult& r, const std::vector<std::string>& words, const std::string& what) {
  BOOST_CHECK_MESSAGE(r.status == 1, what << ": status " << r.status << "\n" << r.output);
  for (const std::string& w : words) BOOST_CHECK_MESSAGE(contains(r.output, w), what << ": '" << w << "' missing in\n" << r.output);
}

uint64_t sum_of(const std::string& path) { return sparta::checksum_file(path); }

struct Workspace {
  testing::ScopedPath dir{"test_robust_programs", "w"};
  std::string train, eval, ckpt;
  Workspace() {
    testing::run_command("mkdir -p " + dir.path);
    train = dir.path + "/train.h5", eval = dir.path + "/eval.h5", ckpt = dir.path + "/ckpt";
    for (auto [path, seed] : {std::pair<std::string, int>{train, 1}, {eval, 2}}) {
      const testing::CommandResult r = program(kDatagen, 1, "--preset small --slots 4 --max-rows 50 --samples 2048 "
                                                            "--chunk 512 --teacher-seed 3 --log-level warn --seed " +
                                                                std::to_string(seed) + " --out " + path);
      BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
    }
  }
  std::string model() const {
    return "--data.train " + train + " --data.eval " + eval + " --data.global_batch 256 --model.embedding_dim 8 "
           "--model.bottom_mlp 16,8 --model.top_mlp 16,1 --device cpu --log-level warn ";
  }
  void train_steps(int steps, const std::string& extra = "") const {
    const testing::CommandResult r = program(kTrain, 2, model() + "--train.steps " + std::to_string(steps) +
                                                            " --train.checkpoint_dir " + ckpt + " " + extra);
    BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(an_output_that_is_an_input_is_refused_and_the_input_kept) {
  Workspace w;
  w.train_steps(4);
  const std::string tsv = w.dir.path + "/day.tsv";
  {
    std::ofstream f(tsv);
    for (int i = 0; i < 20; ++i) {
      f << (i % 2);
      for (int k = 0; k < 13; ++k) f << "\t" << i + k;
      for (int k = 0; k < 26; ++k) f << "\t" << std::hex << 0x1000 + i * 7 + k << std::dec;
      f << "\n";
    }
  }
  const std::string link = w.dir.path + "/link.h5", hard = w.dir.path + "/hard.h5";
  fs::create_symlink(w.eval, link);
  fs::create_hard_link(w.train, hard);
  const std::string step = sparta::resolve_checkpoint_dir(w.ckpt);
  const std::string shard = step + "/shard-1-of-2.h5";
  std::map<std::string, uint64_t> before;
  for (const std::string& p : {tsv, w.train, w.eval, shard, step + "/manifest.h5"}) before[p] = sum_of(p);

  expect_refused(program(kConvert, 1, "--out " + tsv + " " + tsv), {"--out '" + tsv + "'", "same file as input"},
                 "convert --out X X");
  expect_refused(program(kConvert, 2, "--out " + tsv + " " + tsv), {"same file as input"}, "convert on 2 ranks");
  const std::string predict = "--device cpu --checkpoint " + w.ckpt + " --data " + w.eval + " --out ";
  expect_refused(program(kPredict, 2, predict + w.eval), {"--out '" + w.eval + "'", "--data"}, "predict --out = --data");
  expect_refused(program(kPredict, 1, predict + link), {"same file as --data"}, "predict --out = a link to --data");
  expect_refused(program(kPredict, 1, predict + shard), {"shard-1-of-2.h5", "--checkpoint"},
                 "predict --out = a checkpoint file");
  expect_refused(program(kCkpt, 0, "export " + w.ckpt + " --table table0 --out " + shard), {"shard-1-of-2.h5"},
                 "ckpt export --out = a shard");
  expect_refused(program(kTrain, 2, w.model() + "--train.steps 2 --train.metrics " + hard),
                 {"train.metrics '" + hard + "'", "data.train"}, "train.metrics = a hard link to data.train");
  expect_refused(program(kDatagen, 2, "--samples 100 --out " + w.dir.path), {"--out", "is a directory"},
                 "datagen --out = a directory");
  for (const auto& [p, s] : before) BOOST_CHECK_MESSAGE(sum_of(p) == s, p << " changed");
  // Nothing left beside them: no temporary file of a refused run.
  for (const fs::directory_entry& e : fs::directory_iterator(w.dir.path))
    BOOST_CHECK_MESSAGE(!contains(e.path().filename().string(), ".tmp-"), "left behind: " << e.path());
}

BOOST_AUTO_TEST_CASE(outputs_are_written_whole_or_not_at_all) {
  Workspace w;
  w.train_steps(2);
  // A successful run leaves exactly the output (no temporary name), and replaces an older output whole.
  const std::string out = w.dir.path + "/p.h5";
  { std::ofstream(out) << "an older file"; }
  testing::CommandResult r = program(kPredict, 2, "--device cpu --checkpoint " + w.ckpt + " --data " + w.eval + " --out " + out);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK(fs::file_size(out) > 1000);
  for (const fs::directory_entry& e : fs::directory_iterator(w.dir.path))
    BOOST_CHECK_MESSAGE(!contains(e.path().filename().string(), ".tmp-"), "left behind: " << e.path());
  // An empty result is an error, and nothing is written.
  const std::string bad = w.dir.path + "/bad.tsv", empty_out = w.dir.path + "/empty.h5";
  { std::ofstream(bad) << "not\ta\tcriteo\tline\nnor this one\n"; }
  expect_refused(program(kConvert, 1, "--skip-bad --out " + empty_out + " " + bad), {"no sample to write", "--skip-bad"},
                 "convert of only bad lines");
  BOOST_CHECK(!fs::exists(empty_out));
  expect_refused(program(kDatagen, 2, "--samples 0 --out " + empty_out), {"--samples", "expected >= 1"}, "datagen --samples 0");
  BOOST_CHECK(!fs::exists(empty_out));
}

BOOST_AUTO_TEST_CASE(a_dataset_larger_than_the_free_space_is_refused_before_writing) {
  testing::ScopedPath dir("test_robust_programs", "space");
  testing::run_command("mkdir -p " + dir.path);
  const std::string out = dir.path + "/huge.h5";
  // 10^15 samples of at least 100 bytes: more than any disk this runs on.
  testing::CommandResult r = program(kDatagen, 2, "--samples 1000000000000000 --out " + out);
  expect_refused(r, {"--out '" + out + "'", "not enough free space", "GB free"}, "datagen --samples 1e15");
  BOOST_CHECK(!fs::exists(out));
  BOOST_CHECK_EQUAL(count(r.output, "not enough free space"), 1u);  // printed once, by rank 0
  // convert: a (sparse) input of 8 TB of text.
  const std::string tsv = dir.path + "/huge.tsv";
  { std::ofstream f(tsv); }
  fs::resize_file(tsv, uint64_t(1) << 43);
  BOOST_REQUIRE(sparta::free_bytes(out) < (uint64_t(1) << 43));
  r = program(kConvert, 1, "--out " + out + " " + tsv);
  expect_refused(r, {"--out '" + out + "'", "not enough free space"}, "convert of 8 TB");
  BOOST_CHECK(!fs::exists(out));
}

BOOST_AUTO_TEST_CASE(unusable_paths_and_options_are_errors_before_training) {
  Workspace w;
  testing::CommandResult r = program(kTrain, 2, w.model() + "--train.steps 2 --config " + w.dir.path);
  expect_refused(r, {"--config '" + w.dir.path + "'", "is a directory"}, "--config DIR");
  BOOST_CHECK_EQUAL(count(r.output, "is a directory"), 1u);  // once, not once per rank
  BOOST_CHECK(contains(r.output, "ranks 0,1: "));             // and naming the ranks that failed
  r = program(kTrain, 2, w.model() + "--train.steps 2 --train.metrics " + w.dir.path + "/no/such/m.jsonl");
  expect_refused(r, {"train.metrics '" + w.dir.path + "/no/such/m.jsonl'", "cannot open for writing"}, "metrics in a missing folder");
  BOOST_CHECK(!contains(r.output, "step 1/"));
  std::string model = w.model();
  model.replace(model.find("--model.embedding_dim 8"), 23, "--model.embedding_dim 300");
  r = program(kTrain, 2, model + "--train.steps 2");
  expect_refused(r, {"model.embedding_dim", "300"}, "model.embedding_dim 300");
  r = program(kDatagen, 2, "--samples 100 --chunk 0 --out " + w.dir.path + "/c.h5");
  expect_refused(r, {"--chunk", "found 0"}, "datagen --chunk 0");  // status 1 (agreed), not an MPI_Abort
  BOOST_CHECK_EQUAL(count(r.output, "--chunk"), 1u);
}

BOOST_AUTO_TEST_CASE(keep_last_keeps_the_newest_steps) {
  Workspace w;
  w.train_steps(10, "--train.checkpoint_every 2 --train.keep_last 2");
  sparta::CheckpointList list = sparta::list_checkpoints(w.ckpt);
  BOOST_CHECK((list.steps == std::vector<int64_t>{8, 10}));
  BOOST_CHECK_EQUAL(list.latest, 10);
  // The newest step does not verify: the resume falls back to step 8, whose run saves step 10 again, then 12:
  // the steps that verify are counted, and the two newest kept.
  const std::string bad = w.ckpt + "/step-10/dense.h5";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    const char c = static_cast<char>(f.get());
    f.seekp(100);
    f.put(static_cast<char>(c ^ 1));
  }
  testing::CommandResult r = program(kTrain, 2, w.model() + "--train.steps 12 --train.resume --train.checkpoint_every 2 "
                                                            "--train.keep_last 2 --train.checkpoint_dir " + w.ckpt);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "falling back to " + w.ckpt + "/step-8") && contains(r.output, "dense.h5"),
                      r.output);
  list = sparta::list_checkpoints(w.ckpt);
  BOOST_CHECK((list.steps == std::vector<int64_t>{10, 12}));
  BOOST_CHECK_EQUAL(list.latest, 12);
  BOOST_CHECK(sparta::verify_checkpoint(w.ckpt + "/step-10").ok());  // written again by the resumed run
  // keep_last 1 on the next save removes all but the newest.
  w.train_steps(14, "--train.resume --train.checkpoint_every 2 --train.keep_last 1");
  list = sparta::list_checkpoints(w.ckpt);
  BOOST_CHECK((list.steps == std::vector<int64_t>{14}));
}

// train.keep_best's `best` names a step older than the newest: retention keeps it, as it keeps `latest`'s.
BOOST_AUTO_TEST_CASE(keep_last_spares_the_best_step) {
  Workspace w;
  w.train_steps(6, "--train.checkpoint_every 2");
  sparta::point_checkpoint(w.ckpt, "best", 2);
  const std::vector<int64_t> removed = sparta::prune_checkpoints(w.ckpt, 1, nullptr);
  BOOST_CHECK((removed == std::vector<int64_t>{4}));
  BOOST_CHECK((sparta::list_checkpoints(w.ckpt).steps == std::vector<int64_t>{2, 6}));
}

BOOST_AUTO_TEST_CASE(resume_falls_back_past_a_step_that_does_not_verify) {
  Workspace w;
  w.train_steps(6, "--train.checkpoint_every 2");
  // One byte of the newest step's manifest flipped: verify, predict and export refuse it naming the file; a resume
  // takes step 4 and says so.
  const std::string manifest = w.ckpt + "/step-6/manifest.h5";
  {
    std::fstream f(manifest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(300);
    const char c = static_cast<char>(f.get());
    f.seekp(300);
    f.put(static_cast<char>(c ^ 0x10));
  }
  expect_refused(program(kCkpt, 0, "verify " + w.ckpt), {"manifest.h5", "checksum mismatch"}, "verify");
  expect_refused(program(kPredict, 2, "--device cpu --checkpoint " + w.ckpt + " --data " + w.eval + " --out " +
                                          w.dir.path + "/p.h5"),
                 {"manifest.h5", "checksum mismatch"}, "predict");
  expect_refused(program(kCkpt, 0, "export " + w.ckpt + " --table table0 --out " + w.dir.path + "/t.h5"),
                 {"manifest.h5", "checksum mismatch"}, "export");
  testing::CommandResult r = program(kTrain, 2, w.model() + "--train.steps 8 --train.resume --train.checkpoint_dir " +
                                                            w.ckpt);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "falling back to " + w.ckpt + "/step-4") && contains(r.output, "manifest.h5"),
                      r.output);
  BOOST_CHECK_EQUAL(sparta::list_checkpoints(w.ckpt).latest, 8);
}
