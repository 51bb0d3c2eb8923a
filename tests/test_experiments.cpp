// test_experiments: the experiment side end to end, on the cpu backend: the bench driver's JSON lines and
// provenance, the resumable sweep (tiny sweeps of bench_alltoall at 1-2 ranks, bench_hashtable and
// bench_embedding, a failing point, a second run that skips finished points, sbatch scripts run through a fake
// srun), every plot script on the sweeps' output, the provenance keys of every bench binary's JSON lines, BENCHMARKS.md's
// CPU figures block run as written (its sweeps and its plots), bench_train's record, and the python suites of the
// plots and the checkpoint analysis (on tool_ckpt_writer checkpoints); where PyTorch has a GPU, the collection's PyTorch
// baseline (experiments/peers/torch_collection.py). Runs from the repository root (make test).
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing.h"

namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  BOOST_REQUIRE_MESSAGE(f.good(), "cannot write " << path);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

std::string python() { return testing::python(); }

std::string tools_dir() {
  const char* t = std::getenv("SPARTA_TOOLS");
  return t ? t : "build/tests";
}
std::string build_dir() { return tools_dir() + "/.."; }
std::string mpiexec() {
  const char* m = std::getenv("SPARTA_MPIEXEC");
  return m ? m : "mpiexec";
}

testing::CommandResult run(const std::string& cmd, int timeout_s = 300) {
  return testing::run_command("timeout -k 5 " + std::to_string(timeout_s) + " " + cmd);
}

// The sweep script with the test's build and launcher.
testing::CommandResult sweep(const std::string& config, const std::string& results, const std::string& extra = "") {
  return run(python() + " experiments/sweeps/sweep.py " + config + " --results " + results + " --build " +
             build_dir() + " --mpiexec '" + mpiexec() + "' " + extra);
}

void require_repo_root() {
  BOOST_REQUIRE_MESSAGE(fs::exists("experiments/sweeps/sweep.py") && fs::exists("plots/results_io.py"),
                        "run from the repository root (experiments/sweeps/sweep.py, plots/results_io.py)");
}

void require_png(const std::string& path) {
  BOOST_REQUIRE_MESSAGE(fs::exists(path), path << " was not written");
  BOOST_CHECK_GT(fs::file_size(path), 1000u);
  std::string head = read_file(path).substr(0, 8);
  BOOST_CHECK_MESSAGE(head == std::string("\x89PNG\r\n\x1a\n", 8), path << " is not a PNG");
}

void plot(const std::string& script, const std::string& args, const std::string& png) {
  testing::CommandResult r = run(python() + " plots/" + script + " " + args + " --out " + png, 120);
  BOOST_REQUIRE_MESSAGE(r.status == 0, script << " failed (" << r.status << "):\n" << r.output);
  require_png(png);
}

// A sweep config of bench_alltoall on the cpu: ranks 1 and 2, mode hier and a mode that does not exist (the
// failing point; excluded at 2 ranks), one size.
std::string alltoall_config(const std::string& dir) {
  std::string path = dir + "/tiny_alltoall.json";
  write_file(path, R"({
  "name": "tiny_alltoall",
  "command": ["{bin}/bench_alltoall", "--device", "cpu", "--ops", "alltoall,allreduce", "--modes", "{mode}",
              "--min-bytes", "{bytes}", "--max-bytes", "{bytes}", "--iters", "2", "--repeats", "2", "--warmup", "1",
              "--out", "{out}", "--tag", "{tag}"],
  "axes": {"ranks": [1, 2], "mode": ["hier", "bogus"], "bytes": ["8K"]},
  "exclude": [{"mode": "bogus", "ranks": 2}],
  "gpus_per_node": 2
})");
  return path;
}

std::string point_dir(const std::string& results, const std::string& name) { return results + "/points/" + name; }

}  // namespace

BOOST_AUTO_TEST_CASE(bench_json_lines_carry_parameters_and_provenance) {
  testing::ScopedPath dir("experiments", "bench");
  fs::create_directories(dir.path);
  const std::string out = dir.path + "/h.jsonl";
  const int warmup = 1 + int(testing::rng()() % 3), dim = 4 << (testing::rng()() % 3);
  const std::string tag = "t" + std::to_string(testing::rng()() % 100000);
  testing::CommandResult r =
      run(mpiexec() + " -n 1 " + build_dir() + "/bin/bench_hashtable --device cpu --rows 60000 --keys 1024 --dims " +
          std::to_string(dim) + " --hit-fractions 0.5 --repeats 2 --warmup " + std::to_string(warmup) + " --tag " +
          tag + " --out " + out);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK(contains(r.output, "# checked: 0 wrong value(s)"));
  std::vector<std::string> lines = lines_of(read_file(out));
  BOOST_REQUIRE_EQUAL(lines.size(), 3u);  // get_insert at hit 0.5, find, get_insert_hit
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_first(mpi, size_t(len));
  mpi_first = mpi_first.substr(0, mpi_first.find('\n'));
  for (char& c : mpi_first)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  while (!mpi_first.empty() && (mpi_first.back() == ' ' || mpi_first.back() == '\0')) mpi_first.pop_back();
  for (const std::string& l : lines) {
    for (const std::string& want :
         {std::string("\"program\":\"bench_hashtable\""), "\"tag\":\"" + tag + "\"", std::string("\"backend\":\"cpu\""),
          "\"warmup\":" + std::to_string(warmup), std::string("\"repeats\":2"), "\"dim\":" + std::to_string(dim),
          std::string("\"keys\":1024"), std::string("\"rows\":60000"), std::string("\"ranks\":1"),
          std::string("\"nodes\":1"), std::string("\"ranks_per_node\":1"), "\"host\":\"" + std::string(host) + "\"",
          "\"hdf5\":\"" + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel) + "\"", "\"mpi\":\"" + mpi_first + "\"", std::string("\"cuda_runtime\":\""),
          std::string("\"cuda_driver\":\""), std::string("\"nccl\":\""), std::string("\"git\":\""),
          std::string("\"command\":\""), std::string("\"gpus\":[]"), std::string("\"wrong\":0")})
      BOOST_CHECK_MESSAGE(contains(l, want), "missing " << want << " in " << l);
  }
  // A bad common option is an error naming it, with exit status 1.
  r = run(mpiexec() + " -n 1 " + build_dir() + "/bin/bench_hashtable --device cpu --repeats 0");
  BOOST_CHECK_EQUAL(r.status, 1);
  BOOST_CHECK_MESSAGE(contains(r.output, "--repeats: expected >= 1, found 0"), r.output);
}

BOOST_AUTO_TEST_CASE(sweep_runs_records_failures_resumes_and_plots, *boost::unit_test::timeout(600)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "sweep");
  fs::create_directories(dir.path);
  const std::string config = alltoall_config(dir.path), results = dir.path + "/results";
  const std::vector<std::string> ok = {"ranks-1_mode-hier_bytes-8K", "ranks-2_mode-hier_bytes-8K"};
  const std::string bad = "ranks-1_mode-bogus_bytes-8K";

  // --dry-run: the three commands, nothing written.
  testing::CommandResult r = sweep(config, results, "--dry-run");
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK_EQUAL(lines_of(r.output).size(), 3u);
  BOOST_CHECK(contains(r.output, mpiexec() + " -n 2 " + build_dir() + "/bin/bench_alltoall"));
  BOOST_CHECK(!fs::exists(results));

  // First run: two points finish, the bogus mode fails with exit status 1 and its log; the sweep goes on.
  r = sweep(config, results);
  BOOST_CHECK_MESSAGE(r.status == 1, r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "3 point(s): 2 ran ok, 1 failed"), r.output);
  for (const std::string& p : ok) {
    std::string st = read_file(point_dir(results, p) + "/status.json");
    BOOST_CHECK_MESSAGE(contains(st, "\"status\": \"ok\"") && contains(st, "\"exit_status\": 0"), p << ": " << st);
    std::vector<std::string> lines = lines_of(read_file(point_dir(results, p) + "/results.jsonl"));
    BOOST_CHECK_EQUAL(lines.size(), 2u);  // alltoall and allreduce at one size
    for (const std::string& l : lines) {
      BOOST_CHECK_MESSAGE(contains(l, "\"tag\":\"" + p + "\""), l);
      BOOST_CHECK_MESSAGE(contains(l, "\"ranks\":" + p.substr(6, 1) + ","), l);
      BOOST_CHECK_MESSAGE(contains(l, "\"mode\":\"hier\"") && contains(l, "\"wrong\":0"), l);
    }
  }
  std::string st = read_file(point_dir(results, bad) + "/status.json");
  BOOST_CHECK_MESSAGE(contains(st, "\"status\": \"failed\"") && contains(st, "\"exit_status\": 1"), st);
  BOOST_CHECK(contains(read_file(point_dir(results, bad) + "/log.txt"), "bogus"));
  BOOST_CHECK_EQUAL(lines_of(read_file(results + "/results.jsonl")).size(), 4u);

  // Second run, the finished points only: nothing runs, their files stay as they were.
  std::vector<fs::file_time_type> times;
  std::vector<std::string> contents;
  for (const std::string& p : ok) {
    times.push_back(fs::last_write_time(point_dir(results, p) + "/results.jsonl"));
    contents.push_back(read_file(point_dir(results, p) + "/results.jsonl"));
  }
  r = sweep(config, results, "--set mode=hier");
  BOOST_CHECK_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "2 point(s): 2 skipped (finished)"), r.output);
  for (size_t i = 0; i < ok.size(); ++i) {
    BOOST_CHECK(fs::last_write_time(point_dir(results, ok[i]) + "/results.jsonl") == times[i]);
    BOOST_CHECK(read_file(point_dir(results, ok[i]) + "/results.jsonl") == contents[i]);
  }
  // Third run, the whole grid: only the failed point runs again (and fails again).
  r = sweep(config, results);
  BOOST_CHECK_MESSAGE(r.status == 1 && contains(r.output, "1 failed, 2 skipped (finished)"), r.output);

  // Every plot that applies to collectives, on the sweep's output.
  const std::string jsonl = results + "/results.jsonl";
  plot("plot_alltoall.py", jsonl, dir.path + "/alltoall.png");
  plot("plot_alltoall.py", jsonl + " --y time_us --where op=alltoall", dir.path + "/alltoall_time.png");
  plot("plot_scaling.py", jsonl + " --series mode,op --y algbw_GBps --batch bytes_per_rank --batch-per-gpu",
       dir.path + "/scaling.png");
  plot("plot_results.py", jsonl + " --x ranks --y time_us --group op", dir.path + "/results.png");
  plot("plot_placements.py", jsonl + " --by mode --y busbw_GBps", dir.path + "/modes.png");
}

BOOST_AUTO_TEST_CASE(sweeps_of_hashtable_and_embedding_feed_their_plots, *boost::unit_test::timeout(600)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "single");
  fs::create_directories(dir.path);
  const std::string ht = dir.path + "/ht.json", emb = dir.path + "/emb.json";
  write_file(ht, R"({"name": "tiny_hashtable",
  "command": ["{bin}/bench_hashtable", "--device", "cpu", "--rows", "40000", "--keys", "512", "--hit-fractions", "0.5",
              "--load-factors", "{load_factor}", "--dims", "{dim}", "--repeats", "2", "--warmup", "1",
              "--out", "{out}", "--tag", "{tag}"],
  "axes": {"load_factor": [0.5, 0.9], "dim": [4]}})");
  write_file(emb, R"({"name": "tiny_embedding",
  "command": ["{bin}/bench_embedding", "--device", "cpu", "--rows", "5000", "--dims", "8", "--slots", "3",
              "--batch", "{batch}", "--hot", "{hot}", "--alphas", "1.1", "--modes", "eval,step", "--repeats", "2",
              "--warmup", "1", "--out", "{out}", "--tag", "{tag}"],
  "axes": {"batch": [16, 64], "hot": [2]}})");
  testing::CommandResult r = sweep(ht, dir.path + "/ht");
  BOOST_REQUIRE_MESSAGE(r.status == 0 && contains(r.output, "2 ran ok"), r.output);
  r = sweep(emb, dir.path + "/emb");
  BOOST_REQUIRE_MESSAGE(r.status == 0 && contains(r.output, "2 ran ok"), r.output);
  // hash table: 3 records per point (get_insert, find, get_insert_hit); embedding: eval + step per point
  BOOST_CHECK_EQUAL(lines_of(read_file(dir.path + "/ht/results.jsonl")).size(), 6u);
  BOOST_CHECK_EQUAL(lines_of(read_file(dir.path + "/emb/results.jsonl")).size(), 4u);
  plot("plot_hashtable.py", dir.path + "/ht/results.jsonl", dir.path + "/hashtable.png");
  plot("plot_hashtable.py", dir.path + "/ht/results.jsonl --x max_load_factor", dir.path + "/hashtable_lf.png");
  plot("plot_throughput.py", dir.path + "/emb/results.jsonl --where bench=embedding_step --group hot",
       dir.path + "/throughput.png");
  plot("plot_breakdown.py", dir.path + "/emb/results.jsonl --where bench=embedding_step --parts backward_update_ms "
       "--total step_ms --label batch", dir.path + "/breakdown.png");
}

BOOST_AUTO_TEST_CASE(sbatch_scripts_record_their_status, *boost::unit_test::timeout(300)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "sbatch");
  fs::create_directories(dir.path + "/bin");
  const std::string config = alltoall_config(dir.path), results = dir.path + "/results";
  testing::CommandResult r = sweep(config, results, "--launcher sbatch --gpus-per-node 1 --time 00:05:00 --set mode=hier");
  BOOST_REQUIRE_MESSAGE(r.status == 0 && contains(r.output, "2 written"), r.output);
  const std::string script = point_dir(results, "ranks-2_mode-hier_bytes-8K") + "/job.sbatch";
  std::string text = read_file(script);
  for (const char* want : {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=1",
                           "#SBATCH --time=00:05:00", "srun --nodes 2 --ntasks 2 --ntasks-per-node 1"})
    BOOST_CHECK_MESSAGE(contains(text, want), "missing " << want << " in\n" << text);
  // Run the job here through an srun that starts the program with mpiexec on the ranks asked for.
  write_file(dir.path + "/bin/srun", "#!/bin/bash\nn=1\nwhile [ $# -gt 0 ]; do case $1 in --ntasks) n=$2; shift 2;; "
                                     "--*) shift 2;; *) break;; esac; done\nexec " + mpiexec() + " -n \"$n\" \"$@\"\n");
  fs::permissions(dir.path + "/bin/srun", fs::perms::owner_all);
  r = run("env PATH=\"" + dir.path + "/bin:$PATH\" bash " + script);
  BOOST_CHECK_MESSAGE(r.status == 0, r.output);
  std::string st = read_file(point_dir(results, "ranks-2_mode-hier_bytes-8K") + "/status.json");
  BOOST_CHECK_MESSAGE(contains(st, "\"status\": \"ok\"") && contains(st, "\"launcher\": \"sbatch\""), st);
  BOOST_CHECK_EQUAL(lines_of(read_file(point_dir(results, "ranks-2_mode-hier_bytes-8K") + "/results.jsonl")).size(), 2u);
  // The finished job counts as finished for the sweep; the other point's script was only written.
  r = sweep(config, results, "--set mode=hier --set ranks=2");
  BOOST_CHECK_MESSAGE(r.status == 0 && contains(r.output, "1 skipped (finished)"), r.output);
}

BOOST_AUTO_TEST_CASE(sweep_config_errors_name_the_file_and_field) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "badcfg");
  fs::create_directories(dir.path);
  write_file(dir.path + "/a.json", R"({"name": "x", "command": ["{bin}/bench_x"], "axes": {"n": [1]}, "axis": {}})");
  testing::CommandResult r = sweep(dir.path + "/a.json", dir.path + "/r");
  BOOST_CHECK_EQUAL(r.status, 2);
  BOOST_CHECK_MESSAGE(contains(r.output, dir.path + "/a.json: unknown field(s) axis"), r.output);
  write_file(dir.path + "/b.json", R"({"name": "x", "command": ["{bin}/bench_x", "--dim", "{dims}"], "axes": {"dim": [1]}})");
  r = sweep(dir.path + "/b.json", dir.path + "/r");
  BOOST_CHECK_EQUAL(r.status, 2);
  BOOST_CHECK_MESSAGE(contains(r.output, "command token '{dims}' names 'dims'"), r.output);
  write_file(dir.path + "/c.json", R"({"name": "x", "command": ["a"], "axes": {"ranks": [0]}})");
  r = sweep(dir.path + "/c.json", dir.path + "/r");
  BOOST_CHECK_EQUAL(r.status, 2);
  BOOST_CHECK_MESSAGE(contains(r.output, "axes.ranks: expected positive integers, found 0"), r.output);
  BOOST_CHECK(!fs::exists(dir.path + "/r"));
}

// Every bench binary, on tiny cpu shapes at 2 ranks (1 for the single-process benches): each JSON line has the
// driver's keys and every provenance key, no key twice (tests/py_check_jsonl.py), and names the bench.
BOOST_AUTO_TEST_CASE(every_bench_json_line_carries_the_provenance, *boost::unit_test::timeout(600)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "prov");
  fs::create_directories(dir.path);
  struct Bench {
    std::string name;
    int ranks;
    std::string args, repeats_key;  // repeats_key: the bench's own name for its timed repeats ("" if none)
  };
  const std::vector<Bench> benches = {
      {"bench_alltoall", 2, "--device cpu --modes hier --min-bytes 4K --max-bytes 4K --iters 1 --repeats 1 --warmup 0", ""},
      {"bench_hashtable", 1, "--device cpu --rows 20000 --keys 256 --dims 4 --hit-fractions 0.5 --repeats 1 --warmup 0", ""},
      {"bench_embedding", 1, "--device cpu --rows 2000 --dims 4 --slots 2 --batch 16 --hot 2 --alphas 0 --modes eval "
                             "--repeats 1 --warmup 0", ""},
      // the direct index, every mode (a wrong bag or row fails the run)
      {"bench_embedding", 1, "--device cpu --index direct --rows 2000 --dims 4 --slots 2 --batch 16 --hot 2 --alphas 0 "
                             "--modes eval,train,step --repeats 1 --warmup 0", ""},
      // the traffic floors before the step, hashed (a wrong bag sum or a changed row fails the run)
      {"bench_embedding", 1, "--device cpu --rows 2000 --dims 4,5 --slots 2 --batch 16 --hot 3 --alphas 0,1.1 "
                             "--modes floor,step --repeats 1 --warmup 0", ""},
      // the step with the atomic update (a wrong updated row fails the run)
      {"bench_embedding", 1, "--device cpu --update atomic --rows 2000 --dims 4 --slots 2 --batch 16 --hot 3 "
                             "--alphas 1.1 --modes step --repeats 1 --warmup 0", ""},
      {"bench_reader", 1, "--samples 1000 --batch 128 --max-rows 1000 --repeats 1", ""},
      {"bench_collection", 2, "--device cpu --tables custom --rows-list 100,300 --dim 4 --placements dispatch,plan "
                              "--batch 32 --check-samples 4 --warmup 1 --iters 2", "iters"},
      // direct-index tables, every placement (hybrid left out), checked
      {"bench_collection", 2, "--device cpu --index direct --tables custom --rows-list 100,300 --dim 4 --placements "
                              "dispatch,localized,replicated,distributed,hybrid,plan --batch 32 --check-samples 4 "
                              "--warmup 1 --iters 2", "iters"},
      // a hashed table in host memory under a stream of new keys, every key found again afterwards
      {"bench_hashtable", 1, "--device cpu --evict lfu --rows 2000 --keys 256 --dims 4 --stream 3 --repeats 2 "
                             "--warmup 1", ""},
      // tables in host memory under caches that evict, timed until the write-back is done too, and back to back
      {"bench_collection", 2, "--device cpu --index direct --tables custom --rows-list 2000,300 --dim 4 --placements "
                              "plan,dispatch --batch 32 --check-samples 4 --warmup 3 --iters 2 --tier host "
                              "--cache-rows 100 --prefill 0 --alpha 1.1", "iters"},
      {"bench_train", 2, "--device cpu --preset small --max-rows 500 --embedding-dim 4 --bottom-mlp 8,4 --top-mlp 8,1 "
                         "--batch 32 --warmup 1 --steps 2", "steps"},
      // the direct index with sgd's atomic update
      {"bench_train", 2, "--device cpu --preset small --max-rows 500 --embedding-dim 4 --bottom-mlp 8,4 --top-mlp 8,1 "
                         "--batch 32 --warmup 1 --steps 2 --index direct --sparse-optimizer sgd --atomic-update 1",
       "steps"},
  };
  const std::string keys =
      "program,tag,backend,warmup,repeats,git,command,host,hosts,devices,gpus,ranks,nodes,ranks_per_node,"
      "cuda_runtime,cuda_driver,nccl,mpi,hdf5,date";
  for (const Bench& b : benches) {
    BOOST_TEST_CONTEXT(b.name) {
      const std::string out = dir.path + "/" + b.name + std::to_string(&b - benches.data()) + ".jsonl", tag = "p" + std::to_string(testing::rng()() % 100000);
      testing::CommandResult r = run(mpiexec() + " -n " + std::to_string(b.ranks) + " " + build_dir() + "/bin/" +
                                     b.name + " " + b.args + " --tag " + tag + " --out " + out, 300);
      BOOST_REQUIRE_MESSAGE(r.status == 0, b.name << ":\n" << r.output);
      std::string want = keys + (b.repeats_key.empty() ? "" : "," + b.repeats_key);
      r = run(python() + " tests/py_check_jsonl.py " + out + " --keys " + want + " --equal program=" + b.name +
              " --equal tag=" + tag + " --equal ranks=" + std::to_string(b.ranks) + " --equal nodes=1" +
              " --equal ranks_per_node=" + std::to_string(b.ranks) + " --equal backend=cpu", 60);
      BOOST_CHECK_MESSAGE(r.status == 0, r.output);
      if (!b.repeats_key.empty())  // the bench's own name for its repeats carries the same value
        BOOST_CHECK_MESSAGE(contains(read_file(out), "\"repeats\":2,\"" + b.repeats_key + "\":2,"), read_file(out));
    }
  }
  // The checker itself fails on a missing key and on a key written twice.
  write_file(dir.path + "/bad.jsonl", "{\"program\":\"x\",\"ranks\":1,\"ranks\":1}\n");
  BOOST_CHECK_NE(run(python() + " tests/py_check_jsonl.py " + dir.path + "/bad.jsonl --keys program", 60).status, 0);
  BOOST_CHECK_NE(run(python() + " tests/py_check_jsonl.py " + dir.path + "/bad.jsonl --keys program,git", 60).status, 0);
}

// bench_train's record: the step timed on in-memory batches (no data files), with every phase, the plan's
// placement, the model's shape and the keys' law (uniform unless told, as the peers draw them); distinct batches in
// turn (--batches) with power-law keys; a bad --batch or --batches is refused naming it.
BOOST_AUTO_TEST_CASE(bench_train_records_every_phase, *boost::unit_test::timeout(300)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "bench_train");
  fs::create_directories(dir.path);
  const std::string bin = mpiexec() + " -n 2 " + build_dir() + "/bin/bench_train --device cpu --preset small ";
  testing::CommandResult r = run(bin + "--batch 256 --warmup 1 --steps 2 --embedding-dim 8 --bottom-mlp 16,8 "
                                 "--top-mlp 16,1 --out " + dir.path + "/b.jsonl", 240);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_TEST(contains(r.output, "samples/s"), r.output);
  const std::string line = read_file(dir.path + "/b.jsonl");
  for (const char* w : {"\"bench\":\"train\"", "\"global_batch\":512", "\"ranks\":2", "\"ms_embedding\":",
                        "\"ms_dense\":", "\"ms_comm\":", "\"ms_data\":", "\"wrong\":0", "\"placement\":\"",
                        "bottom MLP 13-16-8, 8 x 8 embeddings", "\"alpha\":0,", "\"batches\":1"})
    BOOST_TEST(contains(line, w), w << " in " << line);
  BOOST_TEST(contains(r.output, "keys uniform; 1 distinct batches"), r.output);
  const size_t at = line.find("\"samples_per_s\":") + 16;
  BOOST_TEST(std::stod(line.substr(at)) > 0);
  r = run(bin + "--batch 64 --warmup 2 --steps 3 --embedding-dim 8 --bottom-mlp 16,8 --top-mlp 16,1 --alpha 1.1 "
                "--batches 3 --out " + dir.path + "/c.jsonl", 240);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_TEST(contains(r.output, "keys power law 1.1; 3 distinct batches"), r.output);
  const std::string line3 = read_file(dir.path + "/c.jsonl");
  for (const char* w : {"\"alpha\":1.1,", "\"batches\":3", "\"wrong\":0"})
    BOOST_TEST(contains(line3, w), w << " in " << line3);
  r = run(bin + "--batch 0", 120);
  BOOST_TEST(r.status != 0);
  BOOST_TEST(contains(r.output, "--batch: expected >= 1, found 0"), r.output);
  r = run(bin + "--batches 0", 120);
  BOOST_TEST(r.status != 0);
  BOOST_TEST(contains(r.output, "batches >= 1 expected"), r.output);
}

// bench_train --model dcnv2 on the mlperf preset runs MLPerf DCNv2's keys per slot unless told, and says so in its
// output's head and its record; dot keeps one key per slot; --hotness overrides.
BOOST_AUTO_TEST_CASE(bench_train_dcnv2_defaults_to_the_mlperf_keys_per_slot, *boost::unit_test::timeout(600)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "hot");
  fs::create_directories(dir.path);
  const std::string mlperf = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1";
  struct Case {
    std::string args, hotness;
  };
  for (const Case& c : {Case{"--model dcnv2", mlperf}, Case{"--model dot", "1"}, Case{"--model dcnv2 --hotness 2", "2"}}) {
    BOOST_TEST_CONTEXT(c.args) {
      const std::string out = dir.path + "/r.jsonl";
      testing::CommandResult r = run(mpiexec() + " -n 1 " + build_dir() + "/bin/bench_train --device cpu --max-rows 300 "
                                     "--embedding-dim 4 --bottom-mlp 8,4 --top-mlp 8,1 --batch 8 --warmup 1 --steps 1 " +
                                     c.args + " --out " + out, 300);
      BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
      BOOST_CHECK_MESSAGE(contains(r.output, "# keys per slot: " + c.hotness + ";"), r.output);
      BOOST_CHECK_MESSAGE(contains(read_file(out), "\"hotness\":\"" + c.hotness + "\""), read_file(out));
      fs::remove(out);
    }
  }
}

// experiments/BENCHMARKS.md's CPU figures block, command by command as a user runs it (with this build and launcher, under a
// scratch folder instead of results/): every sweep finishes, every plot writes its PNG, every plot script of
// plots/ but plot_training.py (the trainer's metrics, not a sweep's) is among them, and every sweep config of
// the GPU table has its _cpu twin in the block.
BOOST_AUTO_TEST_CASE(benchmarks_md_cpu_figures_reproduce, *boost::unit_test::timeout(900)) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "figures");
  fs::create_directories(dir.path);
  const std::string readme = read_file("experiments/BENCHMARKS.md");
  const size_t a = readme.find("<!-- figures-cpu:begin -->"), b = readme.find("<!-- figures-cpu:end -->");
  BOOST_REQUIRE(a != std::string::npos && b != std::string::npos && a < b);
  std::vector<std::string> commands;
  for (const std::string& l : lines_of(readme.substr(a, b - a)))
    if (l.rfind("experiments/", 0) == 0 || l.rfind("plots/", 0) == 0) commands.push_back(l);
  BOOST_REQUIRE_GE(commands.size(), 10u);
  auto scratch = [&](std::string c) {
    for (size_t p; (p = c.find(" results/")) != std::string::npos;) c.replace(p, 9, " " + dir.path + "/");
    return c;
  };
  for (const std::string& c : commands) {
    BOOST_TEST_CONTEXT(c) {
      if (c.rfind("experiments/sweeps/sweep.py", 0) == 0) {
        testing::CommandResult r = run(python() + " " + scratch(c) + " --build " + build_dir() + " --mpiexec '" +
                                       mpiexec() + "'", 600);
        BOOST_CHECK_MESSAGE(r.status == 0 && contains(r.output, "ran ok") && !contains(r.output, "failed"), r.output);
        const std::string res = scratch(c).substr(scratch(c).find("--results ") + 10) + "/results.jsonl";
        BOOST_CHECK_MESSAGE(fs::exists(res) && !read_file(res).empty(), res << " is missing or empty");
      } else {
        testing::CommandResult r = run(python() + " " + scratch(c), 120);
        BOOST_CHECK_MESSAGE(r.status == 0, r.output);
        require_png(scratch(c).substr(scratch(c).find("--out ") + 6));
      }
    }
  }
  for (const auto& e : fs::directory_iterator("plots")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("plot_", 0) == 0 && name != "plot_training.py" && e.path().extension() == ".py")
      BOOST_CHECK_MESSAGE(contains(readme.substr(a, b - a), "plots/" + name), name << " is not in BENCHMARKS.md's CPU figures");
  }
  const std::string gpu_table = readme.substr(readme.find("## Figures of your own"), a - readme.find("## Figures of your own"));
  for (const auto& e : fs::directory_iterator("experiments/sweeps")) {
    const std::string name = e.path().stem().string();
    if (e.path().extension() != ".json" || (name.size() > 4 && name.substr(name.size() - 4) == "_cpu")) continue;
    BOOST_CHECK_MESSAGE(contains(gpu_table, "experiments/sweeps/" + name + ".json"), name << ".json has no figure");
    BOOST_CHECK_MESSAGE(contains(readme.substr(a, b - a), "experiments/sweeps/" + name + "_cpu.json"),
                        name << ".json has no _cpu twin in BENCHMARKS.md's CPU figures");
  }
}

// The python suites: their own cases with hand-computed expectations (see each file's docstring).
static void python_suite(const std::string& file) {
  require_repo_root();
  testing::CommandResult r = run(python() + " " + file, 300);
  BOOST_CHECK_MESSAGE(r.status == 0, file << " failed (" << r.status << "):\n" << r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "\nOK"), r.output);
}
BOOST_AUTO_TEST_CASE(python_plots) { python_suite("tests/py_test_plots.py"); }
BOOST_AUTO_TEST_CASE(python_ckpt_analysis) { python_suite("tests/py_test_ckpt_analysis.py"); }
BOOST_AUTO_TEST_CASE(python_ncu_summary) { python_suite("tests/py_test_ncu_summary.py"); }

// experiments/peers/torch_collection.py, the collection's PyTorch baseline, needs PyTorch with a GPU (the GPU machine):
// skipped elsewhere.
struct TorchGpu {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    return run(python() + " -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'", 120).status == 0;
  }
};

// On a small shape taken from a bench_collection record: its own checks (both layouts' forwards agree, one SGD
// update equals the host's) pass and it writes a line per layout; adagrad runs without the SGD check; a record of
// mixed dims and a missing record are errors naming what was wrong.
BOOST_AUTO_TEST_CASE(torch_collection_baseline, *boost::unit_test::precondition(TorchGpu())) {
  require_repo_root();
  testing::ScopedPath dir("experiments", "torch_collection");
  fs::create_directories(dir.path);
  auto record = [](const std::string& dims, const std::string& optimizer) {
    return "{\"program\":\"bench_collection\",\"tables\":\"custom\",\"alpha\":0,\"rows\":[1000,50,7],"
           "\"dims\":" + dims + ",\"hotness\":[1,3,2],\"batch\":64,\"optimizer\":\"" + optimizer +
           "\",\"lr\":0.1}\n";
  };
  const std::string like = dir.path + "/like.jsonl", out = dir.path + "/out.jsonl";
  const std::string cmd = python() + " experiments/peers/torch_collection.py --iters 2 --warmup 1 --like " + like;
  write_file(like, "not json\n" + record("[16,16,16]", "sgd"));
  testing::CommandResult r = run(cmd + " --tables custom --alpha 0 --out " + out, 300);
  BOOST_CHECK_MESSAGE(r.status == 0, r.output);
  std::vector<std::string> got = lines_of(read_file(out));
  BOOST_CHECK_EQUAL(got.size(), 2u);
  for (const std::string& l : got)
    BOOST_CHECK_MESSAGE(contains(l, "\"forward_layouts_agree\": true, \"update_matches_host\": true") &&
                            contains(l, "\"batch\": 64"),
                        l);
  write_file(like, record("[16,16,16]", "adagrad"));
  r = run(cmd + " --tables custom --alpha 0", 300);
  BOOST_CHECK_MESSAGE(r.status == 0 && contains(r.output, "\"update_matches_host\": null"), r.output);
  write_file(like, record("[16,8,16]", "sgd"));
  r = run(cmd + " --tables custom --alpha 0", 300);
  BOOST_CHECK_MESSAGE(r.status != 0 && contains(r.output, "one dim only, found [8, 16]"), r.output);
  r = run(cmd + " --tables custom --alpha 1.1", 300);
  BOOST_CHECK_MESSAGE(r.status != 0 && contains(r.output, "no bench_collection record of --tables custom --alpha 1.1"),
                      r.output);
}
