// tool_fail_check: a job in which one rank fails a check, or throws a sparta::Error to the program's top
// (error), while the others wait in a collective. Used by test_check to prove that a failing check ends the
// whole job with its message instead of hanging it, and that an Error only some ranks raised does too
// (MPI_Abort), while on one rank it ends with the message and exit status 1.
//   mpiexec -n 2 tool_fail_check mpi|fatal|cuda|error [failing-rank]
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "src/base/check.h"
#include "src/context.h"
#include "src/options.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  std::string mode = argc > 1 ? argv[1] : "fatal";
  int failing = argc > 2 ? std::atoi(argv[2]) : 1;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (mode == "error") {
    return sparta::run_program("tool_fail_check", [&] {
      if (rank == failing % size) throw sparta::Error(sparta::strprintf("planted error on rank %d", rank));
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // the other ranks wait here; the failing rank never arrives
      return 0;
    });
  }
  if (rank == failing % size) {
    if (mode == "mpi") {
      int bad = 0;
      MPI_CHECK(MPI_Send(&bad, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD));  // no such rank
    } else if (mode == "cuda") {
#if SPARTA_CUDA
      CUDA_CHECK(cudaSetDevice(1 << 20));  // no such device
#endif
      SPARTA_FATAL("cuda mode in a CUDA=0 build");
    } else {
      SPARTA_FATAL("planted failure on rank %d", rank);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the other ranks wait here; the failing rank never arrives
  return 0;
}
