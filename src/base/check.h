// check.h: one way to check every return code (CUDA, NCCL, MPI, HDF5) and to fail.
//
// A failed check prints "[host:rank] file:line what" to stderr and ends the whole job with MPI_Abort, so
// no rank is left waiting in a collective for a peer that died. Bad *input* (a user's file, option or
// configuration) is different: it throws sparta::Error with a message naming what was wrong, so callers
// and tests can catch it; programs catch it at the top (src/options.h's run_program) and end with that
// message through end_with_error: exit status 1 when no other rank can be left waiting, else MPI_Abort.
//
// This is part of the base layer (check.h, log.h, device.h, buffer.h): every module may include it, and
// it includes no other project header.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

namespace sparta {

// An error in the input: a file, a field, an option. The message says what was expected and what was found.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, bool every_rank = false)
      : std::runtime_error(what), every_rank_(every_rank) {}
  // True when every rank of MPI_COMM_WORLD raised this error together (agree_on_error over the world): then
  // no rank waits for another, and a program may end with status 1 instead of aborting the job.
  bool every_rank() const { return every_rank_; }

 private:
  bool every_rank_ = false;
};

// printf into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Identity used in every message: set once the rank is known (context start-up does it).
void set_identity(int rank, const std::string& host);
int identity_rank();                 // -1 before set_identity
const std::string& identity_host();

// Prints "[host:rank] file:line what" and ends the job (MPI_Abort when MPI is up, else exit(1)).
[[noreturn]] void fatal_at(const char* file, int line, const std::string& what);

// Like fatal_at, formatted.
[[noreturn]] void fatalf_at(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// How a program ends on an Error that reached its top. When no other rank can be left waiting (MPI is not up,
// the world has one rank, or every rank raised the error together: Error::every_rank, whose message names the
// failing ranks), rank 0 alone prints "program: message" to stderr and it returns 1, for main to return
// (MPI_Finalize runs as usual). Otherwise (some ranks only caught it, others may sit in a collective) it prints
// "[host:rank] program: message" and ends the whole job with MPI_Abort.
int end_with_error(const std::string& program, const Error& e);

void check_mpi_at(int code, const char* expr, const char* file, int line);
void check_hdf5_at(long long status, const char* expr, const char* file, int line);

}  // namespace sparta

#define SPARTA_FATAL(...) ::sparta::fatalf_at(__FILE__, __LINE__, __VA_ARGS__)
// An internal invariant: failing it is a bug, not bad input, so it ends the job.
#define SPARTA_ASSERT(cond, ...)                                                    \
  do {                                                                              \
    if (!(cond)) ::sparta::fatal_at(__FILE__, __LINE__,                             \
                                    std::string("assertion " #cond " failed: ") +   \
                                        ::sparta::strprintf(__VA_ARGS__));          \
  } while (0)
// Bad input: throws sparta::Error with the formatted message.
#define SPARTA_REQUIRE(cond, ...)                                                   \
  do {                                                                              \
    if (!(cond)) throw ::sparta::Error(::sparta::strprintf(__VA_ARGS__));           \
  } while (0)

#define MPI_CHECK(x) ::sparta::check_mpi_at((x), #x, __FILE__, __LINE__)
// HDF5 calls return a negative herr_t or hid_t on failure.
#define HDF5_CHECK(x) ::sparta::check_hdf5_at(static_cast<long long>(x), #x, __FILE__, __LINE__)

#if SPARTA_CUDA
#include <cuda_runtime_api.h>
namespace sparta {
inline void check_cuda_at(cudaError_t code, const char* expr, const char* file, int line) {
  if (code != cudaSuccess)
    fatalf_at(file, line, "CUDA error %s (%s) in %s", cudaGetErrorName(code), cudaGetErrorString(code), expr);
}
// Every launcher calls this after its launch; DEBUG=1 builds also synchronize so that an asynchronous
// fault is reported at the kernel that caused it.
inline void check_launch_at(const char* kernel, const char* file, int line) {
  check_cuda_at(cudaGetLastError(), kernel, file, line);
#if SPARTA_DEBUG
  check_cuda_at(cudaDeviceSynchronize(), kernel, file, line);
#endif
}
}  // namespace sparta
#define CUDA_CHECK(x) ::sparta::check_cuda_at((x), #x, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH(name) ::sparta::check_launch_at(name, __FILE__, __LINE__)
#endif

#if SPARTA_CUDA && defined(NCCL_H_)
namespace sparta {
inline void check_nccl_at(ncclResult_t code, const char* expr, const char* file, int line) {
  if (code != ncclSuccess && code != ncclInProgress)
    fatalf_at(file, line, "NCCL error %d (%s) in %s", static_cast<int>(code), ncclGetErrorString(code), expr);
}
}  // namespace sparta
#define NCCL_CHECK(x) ::sparta::check_nccl_at((x), #x, __FILE__, __LINE__)
#endif
