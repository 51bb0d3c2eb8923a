// kernels/bce_loss: binary cross-entropy with logits and the sigmoid on every backend against values worked
// out by hand (including logits of ±100, where a naive formula overflows) and against a double-precision
// computation on fresh random inputs, cuda also against the cpu reference; dlogits against central
// differences of the loss; errors for bad counts.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "kernels/bce_loss.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct Result {
  float loss;
  std::vector<float> dlogits, probs;
};

Result run(const Device& dev, const std::vector<float>& logits, const std::vector<float>& labels, int64_t mean_over) {
  const int64_t n = int64_t(logits.size());
  Buffer<float> z(dev, logits), y(dev, labels);
  Buffer<float> loss = dense_test::poisoned(dev, 1), d = dense_test::poisoned(dev, logits.size()),
                p = dense_test::poisoned(dev, logits.size());
  bce_with_logits(dev, z.data(), y.data(), loss.data(), d.data(), n, mean_over, dev.stream);
  sigmoid(dev, z.data(), p.data(), n, dev.stream);
  return {loss.download()[0], d.download(), p.download()};
}

void hand_computed_values(Backend be) {
  Device dev = dense_test::device_for(be);
  const std::vector<float> z{0, 2, -3, 100, -100, 100}, y{1, 0, 1, 1, 1, 0};
  // l = max(z, 0) - z y + log1p(exp(-|z|)): log 2, 2 + log1p(e^-2), 3 + log1p(e^-3), ~0, 100, 100
  Result r = run(dev, z, y, 6);
  BOOST_CHECK_CLOSE(r.loss, 34.31144375719611, 1e-4);
  const std::vector<double> want_d{-0.08333333333333333, 0.14679951299631372, -0.15876235447040554, 0.0,
                                   -0.16666666666666666, 0.16666666666666666};
  BOOST_CHECK_EQUAL(dense_test::mismatches(r.dlogits, want_d, 1e-7, 1e-6, "dlogits"), 0u);
  const std::vector<double> want_p{0.5, 0.8807970779778823, 0.04742587317756678, 1.0, 3.720075976020836e-44, 1.0};
  BOOST_CHECK_EQUAL(dense_test::mismatches(r.probs, want_p, 1e-7, 1e-6, "probs"), 0u);
  // the mean over a global batch twice as large: half the loss, half the gradient
  Result half = run(dev, z, y, 12);
  BOOST_CHECK_CLOSE(half.loss, 17.155721878598055, 1e-4);
  BOOST_CHECK_CLOSE(half.dlogits[1], 0.14679951299631372 / 2, 1e-4);
  // an empty batch: zero loss
  Buffer<float> loss = dense_test::poisoned(dev, 1);
  bce_with_logits(dev, nullptr, nullptr, loss.data(), nullptr, 0, 1, dev.stream);
  BOOST_CHECK_EQUAL(loss.download()[0], 0.f);
  close_device(dev);
}

void matches_reference(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  for (int64_t n : {1, 37, 1000, 65536 + 3}) {
    std::vector<float> z = testing::random_floats(size_t(n), -20, 20);
    std::vector<float> y = testing::random_floats(size_t(n), 0, 1);
    for (auto& v : y) v = v < 0.3f ? 0.f : v < 0.6f ? 1.f : v;  // hard and soft labels
    Result got = run(dev, z, y, n + 5);
    double sum = 0;
    std::vector<double> want_d(n), want_p(n);
    for (int64_t i = 0; i < n; ++i) {
      const double zi = z[i], yi = y[i];
      const double p = 1.0 / (1.0 + std::exp(-zi));
      sum += zi >= 0 ? zi - zi * yi + std::log1p(std::exp(-zi)) : -zi * yi + std::log1p(std::exp(zi));
      want_p[i] = p;
      want_d[i] = (p - yi) / double(n + 5);
    }
    BOOST_TEST_CONTEXT(dev.name() << " n " << n) {
      BOOST_CHECK_CLOSE(double(got.loss), sum / double(n + 5), 1e-3);
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.dlogits, want_d, 5e-8, 1e-5, "dlogits"), 0u);
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.probs, want_p, 3e-7, 1e-5, "probs"), 0u);
      if (dev.is_cuda()) {
        Result ref = run(host, z, y, n + 5);
        BOOST_CHECK_CLOSE(got.loss, ref.loss, 1e-3);
        BOOST_CHECK_EQUAL(testing::count_mismatches(got.dlogits, ref.dlogits, 5e-8, 1e-5, "dlogits vs cpu"), 0u);
        BOOST_CHECK_EQUAL(testing::count_mismatches(got.probs, ref.probs, 3e-7, 1e-5, "probs vs cpu"), 0u);
        // the loss is a fixed-order sum: every run gives the same bits
        BOOST_CHECK_EQUAL(run(dev, z, y, n + 5).loss, got.loss);
      }
    }
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(bce_matches_hand_computed_values, hand_computed_values)
SPARTA_BACKEND_CASES(bce_matches_a_double_precision_reference, matches_reference)

BOOST_AUTO_TEST_CASE(cpu_bce_gradient_matches_finite_differences) {
  Device dev = dense_test::device_for(Backend::cpu);
  std::vector<float> z = testing::random_floats(20, -6, 6), y = testing::random_floats(20, 0, 1);
  auto loss = [&] {
    float l = 0;
    bce_with_logits(dev, z.data(), y.data(), &l, nullptr, 20, 20, dev.stream);
    return double(l);
  };
  std::vector<float> d(20);
  float l = 0;
  bce_with_logits(dev, z.data(), y.data(), &l, d.data(), 20, 20, dev.stream);
  BOOST_CHECK_EQUAL(dense_test::mismatches(d, dense_test::central_differences(z, loss, 1e-2), 2e-4, 1e-3, "dlogits"), 0u);
}

BOOST_AUTO_TEST_CASE(bce_rejects_bad_counts) {
  Device dev = dense_test::device_for(Backend::cpu);
  float buf[4] = {0, 0, 0, 0};
  BOOST_CHECK_EXCEPTION(bce_with_logits(dev, buf, buf, buf, buf, 4, 3, dev.stream), Error,
                        (dense_test::Names{"bce loss", "n <= mean_over", "found n 4, mean_over 3"}));
  BOOST_CHECK_EXCEPTION(bce_with_logits(dev, buf, buf, buf, buf, 0, 0, dev.stream), Error,
                        (dense_test::Names{"bce loss", "mean_over 0"}));
  BOOST_CHECK_EXCEPTION(sigmoid(dev, buf, buf, -1, dev.stream), Error, (dense_test::Names{"sigmoid", "found -1"}));
}
