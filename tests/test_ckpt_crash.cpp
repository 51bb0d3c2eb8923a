// Checkpoints survive a crash: tool_ckpt_writer (2 ranks under SPARTA_MPIEXEC) writes a full checkpoint, then
// is SIGKILLed (its whole process group: mpiexec and every rank) in the middle of the next save, at each stage
// of it, and at a random moment of an endless run of saves. Afterwards `latest` must name a whole checkpoint
// that verifies and loads, on another number of ranks, with exactly the content that was written; and a
// resumed writer must save over the debris.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "src/base/check.h"
#include "io/checkpoint.h"
#include "tests/testing.h"

using namespace sparta;
namespace fs = std::filesystem;

namespace {

const char* kRows = "20000";  // per rank and table: ~8 MB per shard, so a save takes a while

// tool_ckpt_writer on `ranks` ranks, with no time limit (Job kills it) or a limit of timeout_s.
std::string writer(int ranks, const std::string& args, int timeout_s = 0) {
  return testing::tool_command("tool_ckpt_writer", ranks, args, timeout_s);
}

std::string temp_dir(const std::string& name) {
  std::string d = testing::temp_path("ckpt_crash", name);
  fs::create_directories(d);
  return d;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A command in its own process group, so that one kill reaches mpiexec and every rank it started.
class Job {
 public:
  Job(const std::string& command, const std::string& log) {
    pid_ = fork();
    BOOST_REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      setpgid(0, 0);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid_, pid_);  // also here, so the group exists before any kill
  }
  ~Job() { kill_all(); }

  bool running() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

  // Waits until ready() holds, for at most seconds; false when the job ended first or time ran out.
  bool wait_until(const std::function<bool()>& ready, double seconds) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (ready()) return true;
      if (!running()) return ready();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void kill_all() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// What must hold after any crash: latest names a whole checkpoint, at least min_step, that verifies and loads
// onto 3 ranks (another world size and placement) with exactly the written content. Returns its step.
int64_t expect_latest_whole(const std::string& root, int64_t min_step) {
  CheckpointList list = list_checkpoints(root);
  BOOST_CHECK_GE(list.latest, min_step);
  VerifyReport v = verify_checkpoint(root);
  BOOST_CHECK_MESSAGE(v.ok(), "verify: " << (v.problems.empty() ? "" : v.problems[0]));
  BOOST_CHECK_EQUAL(v.manifest.meta.step, list.latest);
  auto check = testing::run_command(writer(3, "check " + root + " --rows " + kRows, 120));
  BOOST_CHECK_MESSAGE(check.status == 0 && check.output.find("check: ok") != std::string::npos, check.output);
  return list.latest;
}

}  // namespace

BOOST_AUTO_TEST_CASE(kill_at_each_stage_of_a_save_keeps_latest_whole) {
  for (const char* stage : {"tmp_created", "files_written", "manifest_written", "renamed"}) {
    BOOST_TEST_CONTEXT("killed at " << stage) {
      std::string dir = temp_dir(stage), root = dir + "/ckpt", signal = dir + "/signal";
      {
        Job job(writer(2, "write " + root + " --steps 3 --rows " + kRows + " --pause-step 2 --pause-at " + stage +
                              " --signal " + signal),
                dir + "/log");
        bool paused = job.wait_until([&] { return fs::exists(signal); }, 90);
        BOOST_CHECK_MESSAGE(paused, "the writer did not reach " << stage << ":\n" << read_text(dir + "/log"));
        job.kill_all();
      }
      CheckpointList list = list_checkpoints(root);
      BOOST_CHECK_EQUAL(list.latest, 1);
      if (std::string(stage) == "renamed") {
        // Published but not yet latest: whole, and not what latest names.
        BOOST_CHECK(list.steps == (std::vector<int64_t>{1, 2}));
        BOOST_CHECK(verify_checkpoint(root + "/step-2").ok());
      } else {
        BOOST_CHECK(list.steps == std::vector<int64_t>{1});
        BOOST_CHECK(list.incomplete == std::vector<std::string>{"step-2.tmp"});
      }
      expect_latest_whole(root, 1);
      // A writer resumed from step 1 saves step 2 over the debris.
      auto resumed =
          testing::run_command(writer(2, "write " + root + " --first-step 2 --steps 1 --rows " + kRows, 120));
      BOOST_CHECK_MESSAGE(resumed.status == 0, resumed.output);
      list = list_checkpoints(root);
      BOOST_CHECK(list.incomplete.empty());
      BOOST_CHECK_EQUAL(expect_latest_whole(root, 2), 2);
      testing::remove_tree(dir);
    }
  }
}

BOOST_AUTO_TEST_CASE(kill_at_a_random_moment_keeps_latest_whole) {
  std::string dir = temp_dir("random"), root = dir + "/ckpt", progress = dir + "/progress";
  int64_t saved = 0;
  {
    Job job(writer(2, "write " + root + " --loop --rows " + kRows + " --progress " + progress), dir + "/log");
    bool two = job.wait_until([&] { return read_text(progress).find("saved 2\n") != std::string::npos; }, 90);
    BOOST_CHECK_MESSAGE(two, "the writer did not save two checkpoints:\n" << read_text(dir + "/log"));
    // Somewhere inside one of the next saves (a save takes a few hundred ms here).
    std::this_thread::sleep_for(std::chrono::milliseconds(testing::rng()() % 700));
    job.kill_all();
    std::string p = read_text(progress);
    for (size_t at = p.find("saved "); at != std::string::npos; at = p.find("saved ", at + 1))
      saved = std::max<int64_t>(saved, std::stoll(p.substr(at + 6)));
  }
  // Every save that returned is at or before latest (a kill just after `latest` moved can be ahead of progress).
  int64_t latest = expect_latest_whole(root, std::max<int64_t>(saved, 2));
  BOOST_TEST_MESSAGE("killed after " << saved << " reported saves; latest is step " << latest);
  testing::remove_tree(dir);
}
