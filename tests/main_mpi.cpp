// main_mpi.cpp: the Boost.Test main of MPI suites. Every rank runs every test case; the verdict is reduced
// over ranks, so one failing rank fails the run. Rank 0 prints the report; the other ranks print their
// failures only. Tests must not skip a collective on failure (use BOOST_CHECK, and agree on a verdict with
// testing::all_ranks before any BOOST_REQUIRE), or the other ranks would wait forever.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <mpi.h>

#include <boost/test/included/unit_test.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "src/context.h"

static bool init_suite() {
  boost::unit_test::framework::master_test_suite().p_name.value = "sparta_mpi";
  return true;
}

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Rank 0 reports; the others print their failures only (their own report level is dropped).
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (rank != 0 && (a.rfind("--report_", 0) == 0 || a.rfind("-r", 0) == 0)) continue;
    args.push_back(argv[i]);
  }
  std::string quiet = "--report_level=no";
  if (rank != 0) args.push_back(&quiet[0]);
  int result = boost::unit_test::unit_test_main(&init_suite, static_cast<int>(args.size()), args.data());
  int failed = result != 0 ? 1 : 0;
  std::vector<int> all(size);
  MPI_Gather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    std::string who;
    for (int r = 0; r < size; ++r)
      if (all[r]) who += " " + std::to_string(r);
    std::printf("mpi verdict over %d rank(s): %s%s%s\n", size, any ? "FAILED on rank(s)" : "passed", who.c_str(), "");
    std::fflush(stdout);
  }
  return any;
}
