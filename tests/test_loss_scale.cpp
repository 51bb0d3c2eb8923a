// src/loss_scale (the dynamic loss scale's state machine: growth after a window of good steps, backoff on an
// overflow, the floor at 1, bad settings) and kernels/grad_scale (scaling, and the fused unscale and overflow
// check) on every backend against values computed here.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/grad_scale.h"
#include "src/base/buffer.h"
#include "src/base/check.h"
#include "src/loss_scale.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

BOOST_AUTO_TEST_CASE(scale_grows_after_a_window_of_good_steps) {
  LossScaler s(8, 3);
  BOOST_TEST(s.scale() == 8.f);
  BOOST_TEST(s.update(true));
  BOOST_TEST(s.update(true));
  BOOST_TEST(s.scale() == 8.f);  // two good steps: not yet
  BOOST_TEST(s.update(true));
  BOOST_TEST(s.scale() == 16.f);  // the third: doubled, the count restarts
  BOOST_TEST(s.good_run() == 0);
  for (int i = 0; i < 3; ++i) s.update(true);
  BOOST_TEST(s.scale() == 32.f);
  BOOST_TEST(s.skipped() == 0);
}

BOOST_AUTO_TEST_CASE(an_overflow_halves_the_scale_and_restarts_the_window) {
  LossScaler s(1024, 3);
  s.update(true);
  s.update(true);
  BOOST_TEST(!s.update(false));  // skipped
  BOOST_TEST(s.scale() == 512.f);
  BOOST_TEST(s.skipped() == 1);
  BOOST_TEST(s.good_run() == 0);
  s.update(true);
  s.update(true);
  BOOST_TEST(s.scale() == 512.f);  // the two good steps before the overflow do not count
  s.update(true);
  BOOST_TEST(s.scale() == 1024.f);
  BOOST_TEST(!s.update(false));
  BOOST_TEST(!s.update(false));
  BOOST_TEST(s.scale() == 256.f);
  BOOST_TEST(s.skipped() == 3);
}

BOOST_AUTO_TEST_CASE(the_scale_stops_at_one) {
  LossScaler s(4, 2000);
  for (int i = 0; i < 5; ++i) BOOST_TEST(!s.update(false));
  BOOST_TEST(s.scale() == 1.f);
  BOOST_TEST(s.skipped() == 5);
  BOOST_TEST(s.update(true));
  BOOST_TEST(s.scale() == 1.f);
}

BOOST_AUTO_TEST_CASE(the_scale_stops_at_two_to_the_64) {
  LossScaler s(std::ldexp(1.0, 63), 1);
  s.update(true);
  BOOST_TEST(s.scale() == std::ldexp(1.f, 64));
  s.update(true);
  BOOST_TEST(s.scale() == std::ldexp(1.f, 64));
}

// A checkpoint's state comes back: the scale and the good steps towards the next doubling.
BOOST_AUTO_TEST_CASE(restore_takes_a_checkpoints_scale_and_window) {
  LossScaler s(65536, 4);
  BOOST_TEST(s.log2_scale() == 16);
  s.restore(20, 3);
  BOOST_TEST(s.scale() == std::ldexp(1.0f, 20));
  BOOST_TEST(s.log2_scale() == 20);
  BOOST_TEST(s.good_run() == 3);
  BOOST_TEST(s.update(true));  // the 4th good step in a row: doubles
  BOOST_TEST(s.log2_scale() == 21);
  BOOST_TEST(s.good_run() == 0);
  s.restore(0, 0);
  BOOST_TEST(s.scale() == 1.0f);
  BOOST_CHECK_THROW(s.restore(65, 0), Error);
  BOOST_CHECK_THROW(s.restore(-1, 0), Error);
  BOOST_CHECK_THROW(s.restore(10, 4), Error);  // not below the window
  BOOST_CHECK_THROW(s.restore(10, -1), Error);
}

BOOST_AUTO_TEST_CASE(bad_settings_name_the_option) {
  BOOST_CHECK_EXCEPTION(LossScaler(3, 10), Error, (dense_test::Names{"train.loss_scale_init", "power of two", "3"}));
  BOOST_CHECK_EXCEPTION(LossScaler(0.5, 10), Error, (dense_test::Names{"train.loss_scale_init", "0.5"}));
  BOOST_CHECK_EXCEPTION(LossScaler(std::ldexp(1.0, 65), 10), Error, (dense_test::Names{"train.loss_scale_init"}));
  BOOST_CHECK_EXCEPTION(LossScaler(64, 0), Error, (dense_test::Names{"train.loss_scale_window", "found 0"}));
  BOOST_CHECK_NO_THROW(LossScaler(1, 1));
}

namespace {

// scale_values, then unscale_and_check over two arrays: finite ones (flag 0, every value times s exactly), and
// with one NaN or inf planted in either array, at the start, the middle or the end (flag 1).
void grad_scale_kernels(Backend be) {
  Device dev = dense_test::device_for(be);
  for (size_t na : {size_t(0), size_t(1), size_t(1000), size_t(70001)})
    for (size_t nb : {size_t(0), size_t(5), size_t(4099)}) {
      const std::vector<float> a = testing::random_floats(na, -100.f, 100.f), b = testing::random_floats(nb);
      BOOST_TEST_CONTEXT(dev.name() << " na " << na << " nb " << nb) {
        Buffer<float> ad(dev, a), bd(dev, b);
        Buffer<int> flag(dev, 1);
        scale_values(dev, ad.data(), na, 256.f, dev.stream);
        std::vector<float> got = ad.download();
        size_t bad = 0;
        for (size_t i = 0; i < na; ++i) bad += got[i] != a[i] * 256.f;
        BOOST_CHECK_EQUAL(bad, 0u);
        flag.fill_bytes(0x7F);  // poisoned
        unscale_and_check(dev, ad.data(), na, bd.data(), nb, 1.f / 256, flag.data(), dev.stream);
        BOOST_CHECK_EQUAL(flag.download()[0], 0);
        BOOST_CHECK(ad.download() == a);  // times 256, then over 256: exact
        got = bd.download();
        bad = 0;
        for (size_t i = 0; i < nb; ++i) bad += got[i] != b[i] / 256;
        BOOST_CHECK_EQUAL(bad, 0u);
        for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()})
          for (int where = 0; where < 2; ++where) {
            const size_t n = where == 0 ? na : nb;
            if (n == 0) continue;
            for (size_t at : {size_t(0), n / 2, n - 1}) {
              std::vector<float> pa = a, pb = b;
              (where == 0 ? pa : pb)[at] = poison;
              Buffer<float> pad(dev, pa), pbd(dev, pb);
              flag.fill_bytes(0);
              unscale_and_check(dev, pad.data(), na, pbd.data(), nb, 0.5f, flag.data(), dev.stream);
              BOOST_CHECK_MESSAGE(flag.download()[0] == 1, "non-finite in array " << where << " at " << at);
            }
          }
      }
    }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(unscale_and_check_flags_any_non_finite_value, grad_scale_kernels)
