// The error path: a failing check prints "[host:rank] file:line what" and ends the whole job, even while
// the other ranks wait in a collective. Runs tests/tool_fail_check under mpiexec (SPARTA_MPIEXEC, set by
// tests/run_all.sh) with a time limit, so a hang fails the test instead of the suite.
#include <boost/test/unit_test.hpp>
#include <string>

#include "src/base/check.h"
#include "src/base/log.h"
#include "tests/testing.h"

namespace {

void expect_job_ends(const std::string& args, const std::string& needle) {
  testing::CommandResult o = testing::run_command(testing::tool_command("tool_fail_check", 2, args));
  BOOST_TEST_MESSAGE(o.output);
  BOOST_CHECK_NE(o.status, 0);
  BOOST_CHECK_MESSAGE(o.status != 124 && o.status != 137, "the job hung and was killed by the time limit");
  BOOST_CHECK_MESSAGE(o.output.find(":1] ") != std::string::npos, "no [host:1] prefix in:\n" << o.output);
  BOOST_CHECK_MESSAGE(o.output.find("tool_fail_check.cpp:") != std::string::npos, "no file:line in:\n" << o.output);
  BOOST_CHECK_MESSAGE(o.output.find(needle) != std::string::npos, "'" << needle << "' missing in:\n" << o.output);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fatal_ends_the_job_with_its_message) { expect_job_ends("fatal 1", "planted failure on rank 1"); }

BOOST_AUTO_TEST_CASE(failed_mpi_call_ends_the_job) { expect_job_ends("mpi 1", "MPI error"); }

BOOST_AUTO_TEST_CASE(failed_cuda_call_ends_the_job, *testing::needs_gpu()) {
  expect_job_ends("cuda 1", "CUDA error cudaErrorInvalidDevice");
}

// A sparta::Error that reaches a program's top on some ranks only: the others may wait in a collective, so
// the job ends with MPI_Abort (not a hang) after the message. On one rank nobody waits: the message and
// exit status 1, MPI finalized, no abort banner.
BOOST_AUTO_TEST_CASE(error_on_some_ranks_aborts_the_job_on_one_rank_exits_1) {
  testing::CommandResult o = testing::run_command(testing::tool_command("tool_fail_check", 2, "error 1"));
  BOOST_TEST_MESSAGE(o.output);
  BOOST_CHECK_NE(o.status, 0);
  BOOST_CHECK_MESSAGE(o.status != 124 && o.status != 137, "the job hung and was killed by the time limit");
  BOOST_CHECK_MESSAGE(o.output.find(":1] tool_fail_check: planted error on rank 1") != std::string::npos,
                      "message missing in:\n" << o.output);
  o = testing::run_command(testing::tool_command("tool_fail_check", 1, "error 0"));
  BOOST_TEST_MESSAGE(o.output);
  BOOST_CHECK_EQUAL(o.status, 1);
  BOOST_CHECK_MESSAGE(o.output.find("tool_fail_check: planted error on rank 0") != std::string::npos,
                      "message missing in:\n" << o.output);
  BOOST_CHECK_MESSAGE(o.output.find("Abort(") == std::string::npos && o.output.find("MPI_Abort") == std::string::npos,
                      "aborted:\n" << o.output);
}

BOOST_AUTO_TEST_CASE(require_throws_error_naming_the_input) {
  try {
    SPARTA_REQUIRE(1 + 1 == 3, "field '%s': expected %d, found %d", "num_slots", 26, 3);
    BOOST_ERROR("SPARTA_REQUIRE did not throw");
  } catch (const sparta::Error& e) {
    BOOST_CHECK_EQUAL(std::string(e.what()), "field 'num_slots': expected 26, found 3");
  }
}

BOOST_AUTO_TEST_CASE(log_levels_parse) {
  BOOST_CHECK(sparta::parse_log_level("warn") == sparta::LogLevel::warn);
  BOOST_CHECK_THROW(sparta::parse_log_level("loud"), sparta::Error);
  BOOST_CHECK_EQUAL(sparta::strprintf("%d-%s", 7, "x"), "7-x");
}
