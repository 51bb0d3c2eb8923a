// No rank left waiting: sparta-train under mpiexec on 2 cpu ranks with a 3 s job timeout (comm.timeout), one rank
// stopped (SIGSTOP), dead (it exits) or killed (SIGKILL) at each kind of wait of a training step: inside the
// communicator, in an agreement (the batch check), in the reader's agreement, in a checkpoint save's gather, and in
// the retention after a save. The rank does it to itself through the SPARTA_FAULT hook (src/base/deadline.h) just
// before it would start the operation, so the other rank waits there. With mpiexec's clean-up off
// (-disable-auto-cleanup, as on many clusters) the survivor must end the job within the timeout + 10 s, naming the
// operation and, for host waits, the rank that did not arrive. MPICH's launcher still ends the whole job at once
// when a rank dies of a signal (SIGKILL), clean-up off or not: those cases check that the job ends, promptly.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>

#include "tests/testing.h"

namespace {

const std::string kTrain = "../bin/sparta-train", kDatagen = "../bin/sparta-datagen";
constexpr int kTimeout = 3;  // comm.timeout of the runs, seconds

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

struct Data {
  testing::ScopedPath dir{"test_robust_fault", "data"};
  Data() {
    testing::run_command("mkdir -p " + dir.path);
    const testing::CommandResult r = testing::run_command(testing::tool_command(
        kDatagen, 1, "--preset small --slots 4 --max-rows 50 --samples 4096 --chunk 512 --log-level warn --out " +
                         dir.path + "/train.h5"));
    BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  }
};

// Launcher flag that keeps the survivors of a dead rank running (as tests/test_comm_fault.cpp finds it).
std::string keep_survivors_flag() {
  const char* env = std::getenv("SPARTA_MPIEXEC");
  const std::string v = testing::run_command(std::string(env ? env : "mpiexec") + " --version").output;
  if (contains(v, "HYDRA")) return "-disable-auto-cleanup";
  if (contains(v, "Open MPI") || contains(v, "OpenRTE")) return "--mca orte_abort_on_non_zero_status 0";
  return "";
}

// Runs sparta-train on 2 ranks with rank 1 stopped or killed at the nth operation containing `op`.
// device_and_mode: "--device cpu --comm.mode mpi" unless given.
testing::CommandResult run_fault(const Data& d, const std::string& how, const std::string& op, int nth,
                                 bool cleanup_off, const std::string& extra = "",
                                 const std::string& device_and_mode = "--device cpu --comm.mode mpi") {
  const std::string args = "--data.train " + d.dir.path + "/train.h5 --data.global_batch 256 --model.embedding_dim 8 "
                           "--model.bottom_mlp 16,8 --model.top_mlp 16,1 --train.steps 12 --log-level warn "
                           "--comm.timeout " + std::to_string(kTimeout) + " " + device_and_mode + " " + extra;
  // Limit: the timeout + 10 s, plus the start-up of two processes and a few steps.
  const int limit = kTimeout + 10 + 15;
  std::string cmd = testing::tool_command(kTrain, 2, args, limit);
  if (cleanup_off) {
    const size_t at = cmd.find(" -n 2 ");
    BOOST_REQUIRE(at != std::string::npos);
    cmd.insert(at, " " + keep_survivors_flag());
  }
  cmd = "SPARTA_FAULT='1|" + how + "|" + op + "|" + std::to_string(nth) + "' " + cmd;
  const auto t0 = std::chrono::steady_clock::now();
  testing::CommandResult r = testing::run_command(cmd);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE(how << " at '" << op << "' (" << (cleanup_off ? "clean-up off" : "clean-up on") << "): "
                         << took << " s, status " << r.status << "\n" << r.output);
  // timeout(1) ends a job past the limit with status 124 (or 137 when it has to kill it); Open MPI's mpiexec also
  // exits 137 when a rank was killed (128 + SIGKILL), so 137 before the limit is the job ending, not hanging.
  const bool hung = r.status == 124 || (r.status == 137 && took >= limit);
  BOOST_CHECK_MESSAGE(!hung, "the job hung (killed by the limit after " << took << " s):\n" << r.output);
  BOOST_CHECK_MESSAGE(r.status != 0, "the job succeeded:\n" << r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "[fault] rank 1: " + how), "the fault did not happen:\n" << r.output);
  return r;
}

void expect_host_wait(const testing::CommandResult& r, const std::string& op, bool stopped) {
  BOOST_CHECK_MESSAGE(contains(r.output, "host wait failed in " + op) && contains(r.output, "on rank 0 of 2"),
                      "no message naming '" << op << "' from rank 0:\n" << r.output);
  // A stopped rank never answers the roll call; a dead one may make MPI report the loss first.
  if (stopped) BOOST_CHECK_MESSAGE(contains(r.output, "ranks that did not arrive: 1"), r.output);
  else BOOST_CHECK_MESSAGE(contains(r.output, "ranks that did not arrive: 1") || contains(r.output, "MPI error"),
                           r.output);
}

// SIGKILL: the job must end (the launcher's doing, or the survivor's), well before the limit.
void expect_killed_job_ends(const Data& d, const std::string& op, int nth, const std::string& extra = "") {
  const auto t0 = std::chrono::steady_clock::now();
  run_fault(d, "kill", op, nth, true, extra);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_CHECK_MESSAGE(took < kTimeout + 10 + 10, "the job took " << took << " s");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host_waits)

// Each point of a step, stopped and killed, with clean-up off: the survivor must end the job itself.
BOOST_AUTO_TEST_CASE(batch_check_agreement) {
  Data d;
  for (const char* how : {"stop", "exit"}) {
    testing::CommandResult r = run_fault(d, how, "agree_on_error (checking a batch)", 3, true);
    expect_host_wait(r, "agree_on_error (checking a batch)", std::string(how) == "stop");
  }
  expect_killed_job_ends(d, "agree_on_error (checking a batch)", 3);
}

BOOST_AUTO_TEST_CASE(reader_agreement) {
  Data d;
  for (const char* how : {"stop", "exit"}) {
    testing::CommandResult r = run_fault(d, how, "agree_on_error (reading a batch)", 4, true);
    expect_host_wait(r, "agree_on_error (reading a batch)", std::string(how) == "stop");
  }
  expect_killed_job_ends(d, "agree_on_error (reading a batch)", 4);
}

BOOST_AUTO_TEST_CASE(checkpoint_save) {
  Data d;
  for (const char* how : {"stop", "exit"}) {
    testing::ScopedPath ck("test_robust_fault", std::string("ckpt_") + how);
    testing::CommandResult r = run_fault(d, how, "checkpoint save (rows per rank)", 1, true,
                                         "--train.checkpoint_every 4 --train.checkpoint_dir " + ck.path);
    expect_host_wait(r, "checkpoint save (rows per rank)", std::string(how) == "stop");
  }
  testing::ScopedPath ck("test_robust_fault", "ckpt_kill");
  expect_killed_job_ends(d, "checkpoint save (rows per rank)", 1,
                         "--train.checkpoint_every 4 --train.checkpoint_dir " + ck.path);
}

BOOST_AUTO_TEST_CASE(checkpoint_retention) {
  Data d;
  testing::ScopedPath ck("test_robust_fault", "retention");
  testing::CommandResult r = run_fault(d, "stop", "agree_on_error (checkpoint retention)", 2, true,
                                       "--train.checkpoint_every 4 --train.keep_last 1 --train.checkpoint_dir " + ck.path);
  expect_host_wait(r, "agree_on_error (checkpoint retention)", true);
}

// The communicator's own wait (its polled deadline, comm/wait_abort.cpp) under the same single timeout.
BOOST_AUTO_TEST_CASE(communicator) {
  Data d;
  for (const char* how : {"stop", "exit"}) {
    testing::CommandResult r = run_fault(d, how, "all_reduce", 5, true);
    BOOST_CHECK_MESSAGE(contains(r.output, "communication failed in all_reduce") && contains(r.output, "no progress for"),
                        r.output);
  }
  expect_killed_job_ends(d, "all_reduce", 5);
}

// A rank that works on (outside any wait) for longer than the timeout is not stalled: it answers the roll call,
// the waiting rank says so and waits on, and the run ends well.
BOOST_AUTO_TEST_CASE(busy_rank_is_waited_for) {
  Data d;
  const std::string args = "--data.train " + d.dir.path + "/train.h5 --data.global_batch 256 --model.embedding_dim 8 "
                           "--model.bottom_mlp 16,8 --model.top_mlp 16,1 --train.steps 12 --log-level warn "
                           "--device cpu --comm.mode mpi --comm.timeout 2";
  const testing::CommandResult r = testing::run_command(
      "SPARTA_FAULT='1|busy|agree_on_error (checking a batch)|3' " + testing::tool_command(kTrain, 2, args, 60));
  BOOST_CHECK_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "[fault] rank 1: busy"), r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "agree_on_error (checking a batch): waited") &&
                          contains(r.output, "rank 1 is working (for") && contains(r.output, "waiting on"),
                      r.output);
}

// mpiexec's clean-up as it is: a stopped rank is not noticed by the launcher, so the survivor must end the job.
BOOST_AUTO_TEST_CASE(stopped_rank_with_cleanup_on) {
  Data d;
  testing::CommandResult r = run_fault(d, "stop", "agree_on_error (checking a batch)", 3, false);
  expect_host_wait(r, "agree_on_error (checking a batch)", true);
}

// A dead rank with clean-up on: the launcher ends the job; it must not hang either.
BOOST_AUTO_TEST_CASE(dead_rank_with_cleanup_on) {
  Data d;
  run_fault(d, "exit", "agree_on_error (reading a batch)", 4, false);
}

// On 2 GPUs with NCCL: a rank stopped before an all-reduce (the NCCL wait's deadline) and one stopped before the
// batch check (a host wait beside NCCL communicators).
BOOST_AUTO_TEST_CASE(stopped_rank_nccl_gpu, *testing::needs_gpus(2)) {
  Data d;
  testing::CommandResult r = run_fault(d, "stop", "all_reduce", 5, true, "", "--device cuda --comm.mode nccl");
  // The all-reduce is queued on the GPU and the host goes on: the survivor waits either in the communicator or in
  // the next host agreement; either way it names its wait and the rank that did not arrive.
  BOOST_CHECK_MESSAGE(contains(r.output, "communication failed in all_reduce") ||
                          (contains(r.output, "host wait failed in") && contains(r.output, "ranks that did not arrive: 1")),
                      r.output);
  r = run_fault(d, "stop", "agree_on_error (checking a batch)", 3, true, "", "--device cuda --comm.mode nccl");
  expect_host_wait(r, "agree_on_error (checking a batch)", true);
}

BOOST_AUTO_TEST_SUITE_END()
