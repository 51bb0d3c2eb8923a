// tool_comm_fault: a job in which one rank fails in the middle of a collective, used by test_comm_fault to
// prove that the communicator ends the job with a message naming the operation instead of hanging.
//   mpiexec -n 2 tool_comm_fault HOW MODE DEVICE [RANKS_PER_NODE] [TIMEOUT_S] [FAILING_RANK]
//     HOW     absent: the failing rank never arrives at the all-reduce (the others time out);
//             die: the failing rank exits while the others are in the all-to-all;
//             mismatch: with call checks on, the failing rank calls an all-gather where the others all-reduce;
//             counts: with call checks on, an all-to-all-v in which the failing rank sends one element more to
//             rank 0 than rank 0 expects
//     MODE    nccl | mpi | hier        DEVICE  cpu | cuda | auto
// After one good all-reduce, every rank but the failing one calls the faulty operation.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/context.h"

using namespace sparta;

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  std::string how = argc > 1 ? argv[1] : "absent";
  std::string mode = argc > 2 ? argv[2] : "mpi";
  ContextOptions co;
  co.device = argc > 3 ? argv[3] : "cpu";
  co.ranks_per_node = argc > 4 ? std::atoi(argv[4]) : 0;
  double timeout = argc > 5 ? std::atof(argv[5]) : 5;
  int failing = argc > 6 ? std::atoi(argv[6]) : 1;
  Context ctx(co);
  CommOptions opt;
  try {
    opt.mode = parse_comm_mode(mode);
  } catch (const Error& e) {
    SPARTA_FATAL("%s", e.what());
  }
  opt.timeout_s = timeout;
  opt.check_calls = how == "mismatch" || how == "counts";
  Communicator comm(ctx.topo(), ctx.device(), opt);
  const int rank = ctx.rank(), size = ctx.world();
  const size_t n = 1 << 16;
  Buffer<float> a(ctx.device(), std::vector<float>(n, 1.0f)), b(ctx.device(), n * size);

  const Stream stream = ctx.device().stream;
  comm.all_reduce(a.data(), a.data(), n, DataType::f32, stream);  // one good round: the failure is mid-job
  comm.synchronize(stream);

  if (how == "mismatch" || how == "counts") {
    const bool odd = rank == failing % size;
    if (how == "mismatch" && odd) comm.all_gather(a.data(), b.data(), n / size, DataType::f32, stream);
    if (how == "mismatch" && !odd) comm.all_reduce(a.data(), a.data(), n, DataType::f32, stream);
    if (how == "counts") {
      // every rank sends 1 element to each rank and expects 1 from each; the failing rank sends 2 to rank 0
      std::vector<size_t> sc(size, 1), rc(size, 1);
      if (odd) sc[0] = 2;
      comm.all_to_all_v(a.data(), sc, b.data(), rc, DataType::f32, stream);
    }
    comm.synchronize(stream);
    comm.barrier();
    std::printf("tool_comm_fault: rank %d finished the faulty operation, which it must not\n", rank);
    return 0;
  }
  if (rank == failing % size) {
    if (how == "die") {
      std::fprintf(stderr, "tool_comm_fault: rank %d exits in the middle of the all-to-all\n", rank);
      std::fflush(stderr);
      _exit(3);
    }
    std::fprintf(stderr, "tool_comm_fault: rank %d never arrives at the all-reduce\n", rank);
    std::fflush(stderr);
    sleep(600);
    return 0;
  }
  if (how == "die") comm.all_to_all(a.data(), b.data(), n / size, DataType::f32, stream);
  else comm.all_reduce(a.data(), a.data(), n, DataType::f32, stream);
  comm.synchronize(stream);
  comm.barrier();
  std::printf("tool_comm_fault: rank %d finished the faulty operation, which it must not\n", rank);
  return 0;
}
