// testing.h: what every suite shares: GPU preconditions (skipped, not passed, without a GPU), fresh random
// inputs, poisoning, comparison against a CPU reference with atol + rtol*|ref|, and a rank-wide verdict.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/table_rows.h"
#include "src/base/device.h"

namespace testing {

// Precondition for GPU cases: Boost.Test reports a case whose precondition fails as skipped. HasGpus: at least n
// GPUs visible to this process (needs_gpu: one; needs_gpus(n): plain suites that launch ranks of their own on them).
struct HasGpus {
  int n;
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const;
};
boost::unit_test::precondition needs_gpu();
boost::unit_test::precondition needs_gpus(int n);

// MPI suites: every rank of the node gets a GPU of its own (collective over MPI_COMM_WORLD; the same verdict on
// every rank). A case with this precondition is reported as skipped where there are fewer GPUs than ranks.
struct GpuPerRank {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const;
};
boost::unit_test::precondition needs_gpu_per_rank();
// SPARTA_TEST_SHARED_GPU=1: the ranks of a node share its GPUs (local rank r drives GPU r % gpus), so that an MPI
// suite's cuda cases run with more ranks than a machine has GPUs (needs_gpu_per_rank then asks for one GPU per
// node). It applies to a suite that opens its devices with gpu_of_local_rank and communicates through MPI when
// shared_gpus() (NCCL takes one rank per GPU), and says so by calling accept_shared_gpus() at static
// initialization; in other suites the variable changes nothing.
bool accept_shared_gpus();
bool shared_gpus();
// The GPU local rank r drives: r, or r % visible GPUs when they are shared.
int gpu_of_local_rank(int r);


// A generator seeded from the clock (fresh inputs every run), with the seed printed so a failure can be
// replayed with SPARTA_TEST_SEED=<seed>.
std::mt19937_64& rng();
uint64_t seed();

std::vector<float> random_floats(size_t n, float lo = -1.f, float hi = 1.f);
std::vector<int64_t> random_ints(size_t n, int64_t lo, int64_t hi);  // inclusive range

// Counts elements with |got - want| > atol + rtol*|want| (NaN counts as a mismatch) and reports the first few.
size_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                        const std::string& what);

// The same floats, bit for bit (and the same count).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b);
// A table's rows by key: key → its values, then its optimizer state (compares tables whatever their row order).
std::map<int64_t, std::vector<float>> rows_by_key(const sparta::TableRows& r);

// MPI suites: true on every rank only when ok is true on every rank (collective over MPI_COMM_WORLD).
bool all_ranks(bool ok);

// This process's rank and the number of ranks in MPI_COMM_WORLD.
int world_rank();
int world_size();

// ---- commands and temporary files

// The python3 with h5py and matplotlib: $SPARTA_PYTHON, else Debian's /usr/bin/python3 (where make deps installs
// them), else python3 on the PATH.
std::string python();

// Cases that run HDF5's command-line tools (h5dump): they run, and fail when a tool is missing (make test installs
// hdf5-tools), except where SPARTA_NO_HDF5_TOOLS=1 says this machine cannot have them (the GPU machine, where
// nothing can be installed): there they are reported as skipped.
struct Hdf5Tools {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const;
};
boost::unit_test::precondition needs_hdf5_tools();

// status: the exit code, or 128 + the signal that ended the command (124/137: `timeout` stopped it).
struct CommandResult {
  int status;
  std::string output;
};

// Runs cmd with /bin/sh and returns its status and stdout, with stderr merged in unless merge_stderr is false
// (then stderr goes to this process's stderr).
CommandResult run_command(const std::string& cmd, bool merge_stderr = true);

// The command that runs $SPARTA_TOOLS/<tool> (default build/tests; programs are "../bin/sparta-<name>") with
// args: under $SPARTA_MPIEXEC (default mpiexec) with `ranks` ranks, or directly when ranks is 0; inside
// `timeout -k 5 <timeout_s>` unless timeout_s is 0.
std::string tool_command(const std::string& tool, int ranks, const std::string& args, int timeout_s = 60);

// "/tmp/sparta_test_<suite>_<pid>_<name>", with anything an earlier process of that pid left there removed.
std::string temp_path(const std::string& suite, const std::string& name);

// Removes a file or a directory with everything below it; nothing when path does not exist.
void remove_tree(const std::string& path);

// A temp_path removed (with everything below it) when this goes out of scope.
struct ScopedPath {
  std::string path;
  ScopedPath(const std::string& suite, const std::string& name) : path(temp_path(suite, name)) {}
  ~ScopedPath() { remove_tree(path); }
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;
};

// MPI suites: a temp_path that every rank names alike (rank 0's pid), removed by rank 0 once every rank has
// left the scope. Construction and destruction are collective over MPI_COMM_WORLD.
struct SharedTempPath {
  std::string path;
  SharedTempPath(const std::string& suite, const std::string& name);
  ~SharedTempPath();
  SharedTempPath(const SharedTempPath&) = delete;
  SharedTempPath& operator=(const SharedTempPath&) = delete;
};

}  // namespace testing

// One check, two test cases: NAME_cpu runs fn(Backend::cpu); NAME_cuda runs fn(Backend::cuda) and is reported
// as skipped (never passed) where no GPU is visible. fn is a function `void fn(sparta::Backend)`.
#define SPARTA_BACKEND_CASES(NAME, fn)                                           \
  BOOST_AUTO_TEST_CASE(NAME##_cpu) { fn(::sparta::Backend::cpu); }               \
  BOOST_AUTO_TEST_CASE(NAME##_cuda, *::testing::needs_gpu()) { fn(::sparta::Backend::cuda); }
// The same for MPI suites: the cuda case needs a GPU for every rank of the node.
#define SPARTA_MPI_BACKEND_CASES(NAME, fn)                                       \
  BOOST_AUTO_TEST_CASE(NAME##_cpu) { fn(::sparta::Backend::cpu); }               \
  BOOST_AUTO_TEST_CASE(NAME##_cuda, *::testing::needs_gpu_per_rank()) { fn(::sparta::Backend::cuda); }
