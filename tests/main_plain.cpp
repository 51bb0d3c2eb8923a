// main_plain.cpp: the Boost.Test main of plain (non-MPI) suites. Boost.Test is used header-only: its
// implementation is compiled here, once, and linked into every plain test binary.
#define BOOST_TEST_MODULE sparta
#include <boost/test/included/unit_test.hpp>
