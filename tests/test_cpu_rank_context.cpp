// A cpu-backend rank never creates a CUDA context, even where GPUs are visible: tests/tool_cpu_rank_context runs
// a cpu rank's workload in a process of its own and asks the driver whether GPU 0's primary context is active.
// The control run (the tool opening cuda:0 first) must see it active, so the question can tell.
#include <boost/test/unit_test.hpp>

#include <string>

#include "tests/testing.h"

namespace {

// The tool's verdict: 1 active, 0 inactive; -1 when the tool could not tell (its output is reported).
int primary_context_active(const std::string& mode) {
  testing::CommandResult r = testing::run_command(testing::tool_command("tool_cpu_rank_context", 0, mode));
  BOOST_TEST_MESSAGE("tool_cpu_rank_context " << mode << ":\n" << r.output);
  BOOST_CHECK_MESSAGE(r.status == 0, "tool_cpu_rank_context " << mode << " exited with " << r.status << ":\n"
                                                              << r.output);
  const std::string key = "primary context active: ";
  size_t at = r.output.find(key);
  if (at == std::string::npos) return -1;
  return r.output[at + key.size()] - '0';
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_rank_creates_no_cuda_context, *testing::needs_gpu()) {
  BOOST_CHECK_EQUAL(primary_context_active("gpu"), 1);  // the control: the question sees a context
  BOOST_CHECK_EQUAL(primary_context_active("cpu"), 0);
}
