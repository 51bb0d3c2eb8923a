// sparta-info: prints the build and, for every rank, its host, node, local rank and device.
//   mpiexec -n 2 sparta-info [--device auto] [--ranks-per-node 1]
#include <cstdio>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/context.h"
#include "src/base/log.h"
#include "src/options.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  sparta::ContextOptions copt;
  std::string level;
  sparta::po::options_description desc("sparta-info options");
  sparta::add_common_options(desc, copt, level);
  return sparta::run_program("sparta-info", [&] {
    sparta::po::variables_map vm;
    bool run = true;
    // Every rank parses the same command line; agreeing makes a bad option one error on every rank (status 1).
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
                             run = sparta::parse_options(argc, argv, desc, vm, "usage: mpiexec -n N sparta-info [options]");
                           }));
    if (!run) return 0;
    sparta::Context ctx(copt);
    std::string lines = ctx.describe();
    LOG_INFO("sparta: built %s CUDA; %d GPU(s) visible to rank 0; MPI thread level %d",
             sparta::built_with_cuda() ? "with" : "without", sparta::visible_gpu_count(), mpi.thread_level());
    if (ctx.is_root()) std::fputs(lines.c_str(), stdout);
    return 0;
  });
}
