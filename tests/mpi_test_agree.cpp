// src/base/agree.h and src/base/deadline.h on every rank count: an agreed error names exactly the ranks that
// failed (the same message: "ranks a,b: ..."; another message: named apart), on every rank alike and with
// every_rank() set; the timed collectives give the results of their blocking MPI counterparts on fresh random
// inputs, with the outputs poisoned first.
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <climits>
#include <string>
#include <vector>

#include "src/base/agree.h"
#include "src/base/deadline.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// The error every rank got (or "" when none was thrown).
std::string agreed(const std::string& mine, bool* every = nullptr) {
  try {
    agree_on_error(MPI_COMM_WORLD, mine, "a test");
  } catch (const Error& e) {
    if (every) *every = e.every_rank();
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(agreed_errors_name_the_failing_ranks) {
  const int r = testing::world_rank(), w = testing::world_size();
  BOOST_CHECK_EQUAL(agreed(""), "");
  // Random failing ranks, all with one message.
  std::vector<int64_t> fail = testing::random_ints(size_t(w), 0, 1);
  fail[testing::rng()() % w] = 1;
  timed_bcast(fail.data(), w, MPI_INT64_T, 0, MPI_COMM_WORLD, "test: who fails");
  std::string want_list;
  int n = 0;
  for (int q = 0; q < w; ++q)
    if (fail[q]) want_list += (n++ ? "," : "") + std::to_string(q);
  bool every = false;
  const std::string got = agreed(fail[r] ? "disk full" : "", &every);
  BOOST_CHECK_EQUAL(got, std::string(n == 1 ? "rank " : "ranks ") + want_list + ": disk full");
  BOOST_CHECK(every);
  // The same text on every rank.
  const std::string root = bcast_string(MPI_COMM_WORLD, 0, got);
  BOOST_CHECK(testing::all_ranks(root == got));
  // Another message on the last rank (when it is not the first failing one) is named apart.
  if (w > 1) {
    const std::string e = agreed(r == 0 ? "bad key" : r == w - 1 ? "bad offsets" : "");
    BOOST_CHECK_EQUAL(e, "rank 0: bad key (rank " + std::to_string(w - 1) +
                             " failed otherwise; each printed its own message)");
  }
}

BOOST_AUTO_TEST_CASE(timed_collectives_match_their_results) {
  const int r = testing::world_rank(), w = testing::world_size();
  const int n = 1 + int(testing::rng()() % 50);
  // every rank draws the same inputs (one seed from rank 0), so each can compute what every other holds
  uint64_t seed = testing::rng()();
  timed_bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, "test: seed");
  std::mt19937_64 g(seed);
  std::vector<std::vector<int64_t>> all(w, std::vector<int64_t>(n));
  for (auto& v : all)
    for (auto& x : v) x = int64_t(g() % 1000) - 500;
  std::vector<int64_t> sum(n, INT64_MIN);
  timed_allreduce(all[r].data(), sum.data(), n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, "test: allreduce");
  std::vector<int64_t> gathered(size_t(n) * w, INT64_MIN);
  timed_allgather(all[r].data(), n, MPI_INT64_T, gathered.data(), n, MPI_COMM_WORLD, "test: allgather");
  std::vector<int64_t> rooted(r == 0 ? size_t(n) * w : 0, INT64_MIN);
  timed_gather(all[r].data(), n, MPI_INT64_T, rooted.data(), n, 0, MPI_COMM_WORLD, "test: gather");
  std::vector<int64_t> swapped(static_cast<size_t>(w), INT64_MIN), mine(static_cast<size_t>(w), 0);
  for (int q = 0; q < w; ++q) mine[q] = all[r][0] * 1000 + q;
  timed_alltoall(mine.data(), 1, MPI_INT64_T, swapped.data(), 1, MPI_COMM_WORLD, "test: alltoall");
  timed_barrier(MPI_COMM_WORLD, "test: barrier");
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    int64_t want = 0;
    for (int q = 0; q < w; ++q) want += all[q][i];
    ok = ok && sum[i] == want;
    for (int q = 0; q < w; ++q) {
      ok = ok && gathered[size_t(q) * n + i] == all[q][i];
      if (r == 0) ok = ok && rooted[size_t(q) * n + i] == all[q][i];
    }
  }
  for (int q = 0; q < w; ++q) ok = ok && swapped[q] == all[q][0] * 1000 + r;
  BOOST_CHECK(testing::all_ranks(ok));
  // One timeout for the job: a bad value is refused naming the option.
  BOOST_CHECK_THROW(set_job_timeout(0), Error);
  const double before = job_timeout();
  set_job_timeout(7.5);
  BOOST_CHECK_EQUAL(job_timeout(), 7.5);
  set_job_timeout(before);
}
