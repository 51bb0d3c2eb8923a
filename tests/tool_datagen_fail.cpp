// tool_datagen_fail: generate_dataset over every rank with one rank planted to fail while generating
// (SyntheticConfig::fail_rank). test_synthetic runs it under a time limit: every rank must end promptly with
// the failing rank's message, none may hang.
//   mpiexec -n 3 tool_datagen_fail FAILING_RANK ROUND OUT.h5 exit|catch
// exit: the Error ends the program through the programs' shared path (src/options.h's run_program).
// catch: every rank catches the Error as a library caller would, prints it, and meets the others in a
// barrier before exiting with status 1: a rank still waiting inside generate_dataset would hang the job.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/synthetic.h"
#include "src/base/check.h"
#include "src/context.h"
#include "src/options.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  const std::string mode = argc > 4 ? argv[4] : "exit";
  auto generate = [&] {
    SPARTA_REQUIRE(argc == 5, "usage: tool_datagen_fail FAILING_RANK ROUND OUT.h5 exit|catch");
    sparta::SyntheticOptions o;
    o.samples = 20000;
    sparta::SyntheticConfig c = sparta::make_synthetic_config(o);
    c.fail_rank = std::atoi(argv[1]);
    c.fail_round = std::atoll(argv[2]);
    sparta::WriteOptions w;
    w.chunk_rows = 1000;  // several rounds whatever the rank count
    sparta::generate_dataset(argv[3], c, w, MPI_COMM_WORLD);
  };
  if (mode == "catch") {
    std::string error;
    try {
      generate();
    } catch (const sparta::Error& e) {
      error = e.what();
    }
    std::fprintf(stderr, "[%s:%d] caught: %s\n", sparta::identity_host().c_str(), sparta::identity_rank(),
                 error.empty() ? "no error" : error.c_str());
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    return error.empty() ? 0 : 1;
  }
  return sparta::run_program("tool_datagen_fail", [&] {
    generate();
    return 0;
  });
}
