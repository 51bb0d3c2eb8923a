// main_mpi.cpp: the Boost.Test main of MPI suites. Every rank runs every test case; the verdict is reduced
// over ranks, so one failing rank fails the run. Rank 0 prints the report; the other ranks print their
// failures only. Tests must not skip a collective on failure (use BOOST_CHECK, and agree on a verdict with
// testing::all_ranks before any BOOST_REQUIRE), or the other ranks would wait forever.
//
// SPARTA_TEST_STACKS_AFTER=<seconds>: a test case that runs longer than that has every rank print, once, the case's
// name and its main thread's stack (function names from exported symbols; the rest as binary+offset for addr2line),
// to find where a case that does not finish waits.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <mpi.h>

#include <execinfo.h>
#include <pthread.h>
#include <unistd.h>

#include <boost/test/included/unit_test.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "src/context.h"

namespace {

// ---- the stack watchdog (SPARTA_TEST_STACKS_AFTER)

pthread_t g_main;

void print_stack(int) {  // the signal handler, on the main thread: backtrace is async-signal-safe once loaded
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

void start_watchdog(int rank) {
  const char* v = std::getenv("SPARTA_TEST_STACKS_AFTER");
  const long long after = v ? std::atoll(v) : 0;
  if (after <= 0) return;
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the signal handler
  g_main = pthread_self();
  std::signal(SIGUSR2, print_stack);
  // Polls the running case's id once a second (the test tree does not change while it runs).
  std::thread([after, rank] {
    namespace utf = boost::unit_test;
    utf::test_unit_id last = utf::INV_TEST_UNIT_ID;
    long long waited = 0;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (!utf::framework::test_in_progress()) continue;
      const utf::test_unit_id id = utf::framework::current_test_case_id();
      if (id != last) {
        last = id, waited = 0;
        continue;
      }
      if (++waited != after) continue;
      std::fprintf(stderr, "rank %d: test case %s has run for %lld s; its main thread's stack:\n", rank,
                   utf::framework::get(id, utf::TUT_CASE).full_name().c_str(), after);
      pthread_kill(g_main, SIGUSR2);
    }
  }).detach();
}

}  // namespace

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
  start_watchdog(rank);
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
