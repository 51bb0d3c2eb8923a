// The communicator's fault path: a rank that never arrives or dies in the middle of a collective ends the
// whole job with a message naming the operation, the ranks and the bytes, instead of hanging it. Runs
// tests/tool_comm_fault under mpiexec (SPARTA_MPIEXEC, SPARTA_TOOLS, set by tests/run_all.sh) with a 5 s
// communicator timeout, inside a 90 s limit that fails the test if the job hangs.
#include <boost/test/unit_test.hpp>
#include <string>

#include "src/base/device.h"
#include "tests/testing.h"

namespace {

using Outcome = testing::CommandResult;

Outcome run_tool(const std::string& args) {
  Outcome o = testing::run_command(testing::tool_command("tool_comm_fault", 2, args, 90));
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

struct TwoGpus {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    if (sparta::visible_gpu_count() >= 2) return true;
    boost::test_tools::assertion_result r(false);
    r.message() << "needs 2 GPUs, sees " << sparta::visible_gpu_count();
    return r;
  }
};
// GCC 12 warns inside boost::function's copy (a false positive in Boost's own code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
boost::unit_test::precondition two_gpus() { return boost::unit_test::precondition(TwoGpus()); }
#pragma GCC diagnostic pop

}  // namespace

BOOST_AUTO_TEST_CASE(absent_rank_times_out_mpi_cpu) { expect_timeout("mpi", "cpu", 0); }

BOOST_AUTO_TEST_CASE(absent_rank_times_out_hier_between_nodes_cpu) {
  expect_timeout("hier", "cpu", 1);  // one rank per node: the MPI path between nodes
}

BOOST_AUTO_TEST_CASE(absent_rank_times_out_hier_inside_node_cpu) { expect_timeout("hier", "cpu", 0); }

BOOST_AUTO_TEST_CASE(dying_rank_ends_the_job) {
  Outcome o = run_tool("die mpi cpu 0 5");
  expect(o, "exits in the middle of the all-to-all");
}

BOOST_AUTO_TEST_CASE(absent_rank_aborts_nccl, *two_gpus()) {
  // NCCL waits on the device: synchronize polls, times out, aborts the NCCL communicator, then MPI_Abort.
  expect_timeout("nccl", "cuda", 0);
}

BOOST_AUTO_TEST_CASE(absent_rank_aborts_hier_nccl_inside_node, *two_gpus()) { expect_timeout("hier", "cuda", 0); }

BOOST_AUTO_TEST_CASE(absent_rank_times_out_mpi_gpu, *two_gpus()) { expect_timeout("mpi", "cuda", 0); }
