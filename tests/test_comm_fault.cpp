// The communicator's fault path: a rank that never arrives or dies in the middle of a collective ends the
// whole job with a message naming the operation, the ranks and the bytes, instead of hanging it. Runs
// tests/tool_comm_fault under mpiexec (SPARTA_MPIEXEC, SPARTA_TOOLS, set by tests/run_all.sh) with a 5 s
// communicator timeout, inside a 90 s limit that fails the test if the job hangs. Every case requires the
// message of the rank that did not fail (rank 0), not only the failing rank's own words.
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <string>

#include "tests/testing.h"

namespace {

using Outcome = testing::CommandResult;

// By default a launcher ends the whole job as soon as one rank dies, before the survivors can say anything.
// The flag that lets them run on (to their own abort), found from the launcher's --version; "" when unknown.
std::string keep_survivors_flag() {
  const char* env = std::getenv("SPARTA_MPIEXEC");
  const std::string launcher = env ? env : "mpiexec";
  const std::string v = testing::run_command(launcher + " --version").output;
  if (v.find("HYDRA") != std::string::npos) return "-disable-auto-cleanup";
  if (v.find("Open MPI") != std::string::npos || v.find("OpenRTE") != std::string::npos)
    return "--mca orte_abort_on_non_zero_status 0";
  BOOST_ERROR("cannot tell how to keep the survivors of a dying rank running under '" << launcher << "':\n" << v);
  return "";
}

Outcome run_tool(const std::string& args, bool keep_survivors = false) {
  std::string cmd = testing::tool_command("tool_comm_fault", 2, args, 90);
  if (keep_survivors) {
    const size_t at = cmd.find(" -n 2 ");  // right after the launcher and its own flags
    BOOST_REQUIRE_MESSAGE(at != std::string::npos, "no ' -n 2 ' in " << cmd);
    cmd.insert(at, " " + keep_survivors_flag());
  }
  Outcome o = testing::run_command(cmd);
  BOOST_TEST_MESSAGE(o.output);
  BOOST_CHECK_NE(o.status, 0);
  BOOST_CHECK_MESSAGE(o.status != 124 && o.status != 137, "the job hung and was killed by the time limit");
  BOOST_CHECK_MESSAGE(o.output.find("must not") == std::string::npos, "the faulty operation finished:\n" << o.output);
  return o;
}

void expect(const Outcome& o, const std::string& needle) {
  BOOST_CHECK_MESSAGE(o.output.find(needle) != std::string::npos, "'" << needle << "' missing in:\n" << o.output);
}

// A rank that never arrives: the other one times out and names what it waited for.
void expect_timeout(const std::string& mode, const std::string& device, int ranks_per_node) {
  Outcome o = run_tool("absent " + mode + " " + device + " " + std::to_string(ranks_per_node) + " 5");
  expect(o, "never arrives");
  expect(o, "communication failed in ");
  expect(o, "all_reduce");
  expect(o, "mode " + mode);
  expect(o, "on rank 0 of 2");
  expect(o, "no progress for");
  expect(o, "this rank sends 262144 bytes and receives 262144 bytes");
}

}  // namespace

BOOST_AUTO_TEST_CASE(absent_rank_times_out_mpi_cpu) { expect_timeout("mpi", "cpu", 0); }

BOOST_AUTO_TEST_CASE(absent_rank_times_out_hier_between_nodes_cpu) {
  expect_timeout("hier", "cpu", 1);  // one rank per node: the MPI path between nodes
}

BOOST_AUTO_TEST_CASE(absent_rank_times_out_hier_inside_node_cpu) { expect_timeout("hier", "cpu", 0); }

// A rank that exits in the middle of the all-to-all: the launcher is told to let the other one run, which must
// then end the job itself, naming the operation, the rank it waited for (`peer`) and its bytes.
void expect_survivor(const std::string& mode, const std::string& device, int ranks_per_node,
                     const std::string& peer) {
  Outcome o = run_tool("die " + mode + " " + device + " " + std::to_string(ranks_per_node) + " 5", true);
  expect(o, "rank 1 exits in the middle of the all-to-all");
  expect(o, "communication failed in ");
  expect(o, "all_to_all");
  expect(o, "mode " + mode);
  expect(o, "on rank 0 of 2");
  expect(o, peer);
  expect(o, "this rank sends 262144 bytes and receives 262144 bytes");
}

BOOST_AUTO_TEST_CASE(dying_rank_is_named_by_the_survivor_mpi_cpu) { expect_survivor("mpi", "cpu", 0, "from rank 1"); }

BOOST_AUTO_TEST_CASE(dying_rank_is_named_by_the_survivor_hier_between_nodes_cpu) {
  expect_survivor("hier", "cpu", 1, "from rank 1");
}

BOOST_AUTO_TEST_CASE(dying_rank_is_named_by_the_survivor_hier_inside_node_cpu) {
  expect_survivor("hier", "cpu", 0, "from rank 1");
}

// Call checks (CommOptions::check_calls): ranks that call different operations, or disagree on an all-to-all's
// counts, end the job with both sides named instead of hanging.
void expect_mismatch(const std::string& mode, const std::string& device) {
  Outcome o = run_tool("mismatch " + mode + " " + device + " 0 5");
  expect(o, "communication failed in ");
  expect(o, "differs between ranks");
  expect(o, "calls all_reduce of 65536 float32");
  expect(o, "calls all_gather_v of float32 (counts hash");
  BOOST_CHECK_MESSAGE(o.output.find("no progress for") == std::string::npos, "timed out instead:\n" << o.output);
  Outcome c = run_tool("counts " + mode + " " + device + " 0 5");
  expect(c, "communication failed in all_to_all_v");
  expect(c, "rank 1 sends 2 elements to rank 0, which expects 1");
}
BOOST_AUTO_TEST_CASE(mismatched_calls_are_named_mpi_cpu) { expect_mismatch("mpi", "cpu"); }
BOOST_AUTO_TEST_CASE(mismatched_calls_are_named_hier_cpu) { expect_mismatch("hier", "cpu"); }

BOOST_AUTO_TEST_CASE(absent_rank_aborts_nccl, *testing::needs_gpus(2)) {
  // NCCL waits on the device: synchronize polls, times out, aborts the NCCL communicator, then MPI_Abort.
  expect_timeout("nccl", "cuda", 0);
}

BOOST_AUTO_TEST_CASE(absent_rank_aborts_hier_nccl_inside_node, *testing::needs_gpus(2)) { expect_timeout("hier", "cuda", 0); }

BOOST_AUTO_TEST_CASE(absent_rank_times_out_mpi_gpu, *testing::needs_gpus(2)) { expect_timeout("mpi", "cuda", 0); }

// NCCL cannot name the one peer it waits for: the message names the group (both ranks).
BOOST_AUTO_TEST_CASE(dying_rank_is_named_by_the_survivor_nccl_gpu, *testing::needs_gpus(2)) {
  expect_survivor("nccl", "cuda", 0, "world ranks 0,1");
}

BOOST_AUTO_TEST_CASE(dying_rank_is_named_by_the_survivor_hier_nccl_inside_node_gpu, *testing::needs_gpus(2)) {
  expect_survivor("hier", "cuda", 0, "world ranks 0,1");
}

BOOST_AUTO_TEST_CASE(mismatched_calls_are_named_nccl_gpu, *testing::needs_gpus(2)) { expect_mismatch("nccl", "cuda"); }

BOOST_AUTO_TEST_CASE(dying_rank_is_named_by_the_survivor_mpi_gpu, *testing::needs_gpus(2)) {
  expect_survivor("mpi", "cuda", 0, "from rank 1");
}
