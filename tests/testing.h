// testing.h: what every suite shares: GPU preconditions (skipped, not passed, without a GPU), fresh random
// inputs, poisoning, comparison against a CPU reference with atol + rtol*|ref|, and a rank-wide verdict.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device.h"

namespace testing {

// Precondition for GPU cases: Boost.Test reports a case whose precondition fails as skipped.
struct HasGpu {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const;
};
boost::unit_test::precondition needs_gpu();

// The devices a case runs on: always cpu, plus cuda:0 (on a GPU) when one is visible.
std::vector<sparta::Backend> available_backends();

// A generator seeded from the clock (fresh inputs every run), with the seed printed so a failure can be
// replayed with SPARTA_TEST_SEED=<seed>.
std::mt19937_64& rng();
uint64_t seed();

std::vector<float> random_floats(size_t n, float lo = -1.f, float hi = 1.f);
std::vector<int64_t> random_ints(size_t n, int64_t lo, int64_t hi);  // inclusive range

// Counts elements with |got - want| > atol + rtol*|want| (NaN counts as a mismatch) and reports the first few.
size_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                        const std::string& what);

// MPI suites: true on every rank only when ok is true on every rank (collective over MPI_COMM_WORLD).
bool all_ranks(bool ok);

}  // namespace testing
