// support_testing.cpp: see testing.h. Linked into every test binary.
#include "tests/testing.h"

#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace testing {

namespace {
std::string temp_name(const std::string& suite, int pid, const std::string& name) {
  return "/tmp/sparta_test_" + suite + "_" + std::to_string(pid) + "_" + name;
}
}  // namespace

boost::test_tools::assertion_result HasGpus::operator()(boost::unit_test::test_unit_id) const {
  const int seen = sparta::visible_gpu_count();
  if (seen >= n) return true;
  boost::test_tools::assertion_result r(false);
  if (!sparta::built_with_cuda()) r.message() << "built with CUDA=0";
  else if (seen == 0) r.message() << "no GPU visible";
  else r.message() << "needs " << n << " GPUs, sees " << seen;
  return r;
}

boost::test_tools::assertion_result GpuPerRank::operator()(boost::unit_test::test_unit_id) const {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  const int gpus = sparta::visible_gpu_count();
  int ok = gpus >= (shared_gpus() ? 1 : local) ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) return true;
  boost::test_tools::assertion_result r(false);
  r.message() << (sparta::built_with_cuda() ? "fewer GPUs than ranks on a node" : "built with CUDA=0");
  return r;
}

// GCC 12 warns inside Boost.Test's precondition wrapper (a known false positive), as for needs_gpu below.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
boost::unit_test::precondition needs_gpu_per_rank() { return boost::unit_test::precondition(GpuPerRank()); }
#pragma GCC diagnostic pop

namespace {
bool& shared_gpus_accepted() {
  static bool accepted = false;
  return accepted;
}
}  // namespace

bool accept_shared_gpus() { return shared_gpus_accepted() = true; }

bool shared_gpus() {
  const char* v = std::getenv("SPARTA_TEST_SHARED_GPU");
  return shared_gpus_accepted() && v && std::string(v) == "1";
}

int gpu_of_local_rank(int r) {
  const int gpus = sparta::visible_gpu_count();
  return shared_gpus() && gpus > 0 ? r % gpus : r;
}

std::string python() {
  if (const char* p = std::getenv("SPARTA_PYTHON"); p && *p) return p;
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

boost::test_tools::assertion_result Hdf5Tools::operator()(boost::unit_test::test_unit_id) const {
  const char* no = std::getenv("SPARTA_NO_HDF5_TOOLS");
  if (!no || std::string(no) != "1") return true;
  boost::test_tools::assertion_result r(false);
  r.message() << "SPARTA_NO_HDF5_TOOLS=1: this machine has no HDF5 command-line tools";
  return r;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
boost::unit_test::precondition needs_hdf5_tools() { return boost::unit_test::precondition(Hdf5Tools()); }
#pragma GCC diagnostic pop

uint64_t seed() {
  static const uint64_t s = [] {
    const char* env = std::getenv("SPARTA_TEST_SEED");
    uint64_t v = env ? std::strtoull(env, nullptr, 10)
                     : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    int up = 0;
    MPI_Initialized(&up);
    if (up) MPI_Bcast(&v, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);  // the same inputs on every rank
    std::printf("test seed %llu (replay with SPARTA_TEST_SEED=%llu)\n", (unsigned long long)v, (unsigned long long)v);
    return v;
  }();
  return s;
}

std::mt19937_64& rng() {
  static std::mt19937_64 g(seed());
  return g;
}

std::vector<float> random_floats(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

std::vector<int64_t> random_ints(size_t n, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::map<int64_t, std::vector<float>> rows_by_key(const sparta::TableRows& r) {
  std::map<int64_t, std::vector<float>> m;
  for (size_t i = 0; i < r.rows(); ++i) {
    std::vector<float> v(r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim);
    v.insert(v.end(), r.state.begin() + i * r.state_width, r.state.begin() + (i + 1) * r.state_width);
    m[r.keys[i]] = v;
  }
  return m;
}

size_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                        const std::string& what) {
  if (got.size() != want.size()) {
    BOOST_ERROR(what << ": size " << got.size() << ", expected " << want.size());
    return std::max(got.size(), want.size());
  }
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      if (bad < 5) BOOST_TEST_MESSAGE(what << "[" << i << "] = " << g << ", expected " << w);
      ++bad;
    }
  }
  return bad;
}

bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

CommandResult run_command(const std::string& cmd, bool merge_stderr) {
  CommandResult r{-1, ""};
  FILE* p = popen((merge_stderr ? cmd + " 2>&1" : cmd).c_str(), "r");
  BOOST_REQUIRE_MESSAGE(p, "cannot start: " << cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::string tool_command(const std::string& tool, int ranks, const std::string& args, int timeout_s) {
  const char* tools = std::getenv("SPARTA_TOOLS");
  const char* mpiexec = std::getenv("SPARTA_MPIEXEC");
  std::string cmd = timeout_s > 0 ? "timeout -k 5 " + std::to_string(timeout_s) + " " : "";
  if (ranks > 0) cmd += std::string(mpiexec ? mpiexec : "mpiexec") + " -n " + std::to_string(ranks) + " ";
  return cmd + (tools ? tools : "build/tests") + "/" + tool + " " + args;
}

std::string temp_path(const std::string& suite, const std::string& name) {
  std::string path = temp_name(suite, static_cast<int>(getpid()), name);
  remove_tree(path);
  return path;
}

void remove_tree(const std::string& path) {
  std::error_code ec;  // a test's leftovers must not fail the test
  std::filesystem::remove_all(path, ec);
}

SharedTempPath::SharedTempPath(const std::string& suite, const std::string& name) {
  int pid = static_cast<int>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path = temp_name(suite, pid, name);
  if (world_rank() == 0) remove_tree(path);
  MPI_Barrier(MPI_COMM_WORLD);
}

SharedTempPath::~SharedTempPath() {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) remove_tree(path);
}

}  // namespace testing

namespace testing {
// GCC 12 warns inside boost::function's copy (a known false positive); the copy is Boost's own.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
boost::unit_test::precondition needs_gpu() { return needs_gpus(1); }
boost::unit_test::precondition needs_gpus(int n) { return boost::unit_test::precondition(HasGpus{n}); }
#pragma GCC diagnostic pop
}  // namespace testing
