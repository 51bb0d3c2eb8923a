// check.cpp: the failure path shared by every check macro.
#include "src/base/check.h"

#include <mpi.h>
#include <thread>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <vector>

namespace sparta {
namespace {
int g_rank = -1;
std::string g_host = "?";
}  // namespace

std::string strprintf(const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::vector<char> buf(n > 0 ? n + 1 : 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
  va_end(ap2);
  return std::string(buf.data(), n > 0 ? n : 0);
}

void set_identity(int rank, const std::string& host) {
  g_rank = rank;
  g_host = host;
}
int identity_rank() { return g_rank; }
const std::string& identity_host() { return g_host; }

namespace {

bool mpi_is_up() {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  return up && !down;
}

[[noreturn]] void end_job() {
  std::fflush(stderr);
  std::fflush(stdout);
  if (mpi_is_up()) {
    // The launcher forwards output asynchronously and stops forwarding once the abort kills the job:
    // give it a moment, so the message that explains the failure is not lost.
    usleep(300 * 1000);
    // MPI_Abort can wait on a peer that died (Open MPI with its abort on a non-zero exit turned off): this rank
    // ends itself a few seconds on regardless, so it never outlives the failure it reported.
    std::thread([] {
      usleep(5 * 1000 * 1000);
      _exit(1);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::exit(1);
}

}  // namespace

void fatal_at(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "[%s:%d] %s:%d %s\n", g_host.c_str(), g_rank, file, line, what.c_str());
  end_job();
}

int end_with_error(const std::string& program, const Error& e) {
  int world = 1;
  if (mpi_is_up()) MPI_Comm_size(MPI_COMM_WORLD, &world);
  // An error every rank raised together names the failing ranks itself: rank 0 alone prints it.
  const bool together = world == 1 || e.every_rank();
  if (!together) std::fprintf(stderr, "[%s:%d] %s: %s\n", g_host.c_str(), g_rank, program.c_str(), e.what());
  else if (g_rank <= 0) std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
  std::fflush(stderr);
  std::fflush(stdout);
  if (together) return 1;
  end_job();
}

void fatalf_at(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::vector<char> buf(n > 0 ? n + 1 : 1);
  va_start(ap, fmt);
  std::vsnprintf(buf.data(), buf.size(), fmt, ap);
  va_end(ap);
  fatal_at(file, line, std::string(buf.data()));
}

void check_mpi_at(int code, const char* expr, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  fatalf_at(file, line, "MPI error %d (%.*s) in %s", code, len, msg, expr);
}

void check_hdf5_at(long long status, const char* expr, const char* file, int line) {
  if (status < 0) fatalf_at(file, line, "HDF5 error (status %lld) in %s", status, expr);
}

}  // namespace sparta
