// kernels/dense_optimizer: two steps of every dense optimizer against their closed forms worked out by hand,
// several steps with a changing learning rate on every backend against a double-precision implementation
// (cuda also bit for bit against the cpu reference), state initialization, and the errors.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>

#include "kernels/dense_optimizer.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

OptimizerConfig config_for(OptimizerKind kind) {
  OptimizerConfig cfg;
  cfg.kind = kind;
  cfg.lr = 1234.f;  // never used: the learning rate is given per step
  cfg.momentum = 0.8f;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.99f;
  cfg.epsilon = 1e-3f;
  cfg.initial_accumulator = 0.1f;
  return cfg;
}

struct State {
  std::vector<float> w, s;
};

// Steps 1..lrs.size() on dev with grads[t] at step t + 1.
State run_steps(const Device& dev, const OptimizerConfig& cfg, const std::vector<float>& w0,
                const std::vector<std::vector<float>>& grads, const std::vector<float>& lrs) {
  const size_t n = w0.size();
  Buffer<float> w(dev, w0), s(dev, dense_optimizer_state_size(cfg.kind, n));
  s.fill_bytes(0xFF);  // init_state must write every element
  dense_optimizer_init_state(dev, cfg, s.data(), n, dev.stream);
  for (size_t t = 0; t < lrs.size(); ++t) {
    Buffer<float> g(dev, grads[t]);
    dense_optimizer_update(dev, cfg, int64_t(t + 1), lrs[t], w.data(), g.data(), s.data(), n, dev.stream);
  }
  return {w.download(), s.download()};
}

// Two steps written out. With g1, g2 the gradients and lr1, lr2 the rates:
//   adam, step 1: m̂ = g1, v̂ = g1², so w1 = w0 - lr1 g1 / (|g1| + eps);
//         step 2: m̂ = (beta1 g1 + g2) / (1 + beta1), v̂ = (beta2 g1² + g2²) / (1 + beta2)
void two_steps_closed_form(Backend be) {
  Device dev = dense_test::device_for(be);
  const std::vector<float> w0{0.5f, -1.f, 2.f, 0.25f};
  const std::vector<float> g1{0.1f, -0.2f, 0.3f, 0.f}, g2{-0.4f, 0.5f, 0.f, 0.7f};
  const double lr1 = 0.1, lr2 = 0.05, mu = 0.8, b1 = 0.9, b2 = 0.99, eps = 1e-3, a0 = 0.1;
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::nesterov,
                             OptimizerKind::adagrad, OptimizerKind::adam}) {
    const OptimizerConfig cfg = config_for(kind);
    State got = run_steps(dev, cfg, w0, {g1, g2}, {float(lr1), float(lr2)});
    std::vector<double> w(4), s;
    for (int i = 0; i < 4; ++i) {
      const double x = w0[i], p = g1[i], q = g2[i];
      switch (kind) {
        case OptimizerKind::sgd: w[i] = x - lr1 * p - lr2 * q; break;
        case OptimizerKind::momentum: w[i] = x - lr1 * p - lr2 * (mu * p + q); break;
        case OptimizerKind::nesterov: w[i] = x - lr1 * (1 + mu) * p - lr2 * (q + mu * (mu * p + q)); break;
        case OptimizerKind::adagrad:
          w[i] = x - lr1 * p / (std::sqrt(a0 + p * p) + eps) - lr2 * q / (std::sqrt(a0 + p * p + q * q) + eps);
          break;
        default: {
          const double m_hat = (b1 * p + q) / (1 + b1), v_hat = (b2 * p * p + q * q) / (1 + b2);
          w[i] = x - lr1 * p / (std::fabs(p) + eps) - lr2 * m_hat / (std::sqrt(v_hat) + eps);
        }
      }
    }
    // the state after two steps: velocity mu g1 + g2, accumulator a0 + g1² + g2², adam's m then v
    for (int i = 0; i < 4 && kind != OptimizerKind::sgd; ++i) {
      const double p = g1[i], q = g2[i];
      if (kind == OptimizerKind::adagrad) s.push_back(a0 + p * p + q * q);
      else if (kind == OptimizerKind::adam) s.push_back(b1 * (1 - b1) * p + (1 - b1) * q);
      else s.push_back(mu * p + q);
    }
    for (int i = 0; i < 4 && kind == OptimizerKind::adam; ++i)
      s.push_back(b2 * (1 - b2) * g1[i] * g1[i] + (1 - b2) * g2[i] * g2[i]);
    BOOST_TEST_CONTEXT(dev.name() << " " << optimizer_name(kind)) {
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.w, w, 1e-6, 1e-5, "w"), 0u);
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.s, s, 1e-7, 1e-5, "state"), 0u);
    }
  }
  close_device(dev);
}

// Several steps with a warm-up-like rate, against the formulas in double, without and with weight decay (the
// gradient g + weight_decay w of the current w); cuda also bit for bit against cpu.
void matches_reference(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  const size_t n = 100003;
  const std::vector<float> lrs{0.01f, 0.02f, 0.03f, 0.015f};
  for (float wd : {0.f, 0.05f})
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::nesterov,
                             OptimizerKind::adagrad, OptimizerKind::adam}) {
    OptimizerConfig cfg = config_for(kind);
    cfg.weight_decay = wd;
    const std::vector<float> w0 = testing::random_floats(n);
    std::vector<std::vector<float>> grads;
    for (size_t t = 0; t < lrs.size(); ++t) grads.push_back(testing::random_floats(n));
    State got = run_steps(dev, cfg, w0, grads, lrs);
    std::vector<double> w(w0.begin(), w0.end()), s0(n, kind == OptimizerKind::adagrad ? 0.1 : 0.0), s1(n, 0.0);
    const double mu = cfg.momentum, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.epsilon;
    for (size_t t = 0; t < lrs.size(); ++t)
      for (size_t i = 0; i < n; ++i) {
        const double g = grads[t][i] + double(wd) * w[i], lr = lrs[t];
        switch (kind) {
          case OptimizerKind::sgd: w[i] -= lr * g; break;
          case OptimizerKind::momentum: s0[i] = mu * s0[i] + g, w[i] -= lr * s0[i]; break;
          case OptimizerKind::nesterov: s0[i] = mu * s0[i] + g, w[i] -= lr * (g + mu * s0[i]); break;
          case OptimizerKind::adagrad: s0[i] += g * g, w[i] -= lr * g / (std::sqrt(s0[i]) + eps); break;
          default:
            s0[i] = b1 * s0[i] + (1 - b1) * g;
            s1[i] = b2 * s1[i] + (1 - b2) * g * g;
            w[i] -= lr * (s0[i] / (1 - std::pow(b1, t + 1.0))) / (std::sqrt(s1[i] / (1 - std::pow(b2, t + 1.0))) + eps);
        }
      }
    BOOST_TEST_CONTEXT(dev.name() << " " << optimizer_name(kind) << " weight_decay " << wd) {
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.w, w, 1e-6, 1e-5, "w"), 0u);
      if (kind != OptimizerKind::sgd) {
        std::vector<float> first(got.s.begin(), got.s.begin() + n);
        BOOST_CHECK_EQUAL(dense_test::mismatches(first, s0, 1e-6, 1e-5, "state"), 0u);
      }
      if (dev.is_cuda()) {
        State ref = run_steps(host, cfg, w0, grads, lrs);
        BOOST_CHECK(std::memcmp(got.w.data(), ref.w.data(), n * sizeof(float)) == 0);
        BOOST_CHECK(got.s.size() == ref.s.size() &&
                    std::memcmp(got.s.data(), ref.s.data(), got.s.size() * sizeof(float)) == 0);
      }
    }
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(dense_optimizers_match_two_steps_worked_by_hand, two_steps_closed_form)
SPARTA_BACKEND_CASES(dense_optimizers_match_a_double_precision_reference, matches_reference)

BOOST_AUTO_TEST_CASE(dense_optimizer_state_and_errors) {
  BOOST_CHECK_EQUAL(dense_optimizer_state_size(OptimizerKind::sgd, 10), 0u);
  BOOST_CHECK_EQUAL(dense_optimizer_state_size(OptimizerKind::adagrad, 10), 10u);
  BOOST_CHECK_EQUAL(dense_optimizer_state_size(OptimizerKind::adam, 10), 20u);
  BOOST_CHECK_EXCEPTION(dense_optimizer_state_size(OptimizerKind::lazy_adam, 10), Error,
                        (dense_test::Names{"dense optimizer", "found lazy_adam"}));
  Device dev = dense_test::device_for(Backend::cpu);
  std::vector<float> w(4, 1.f), g(4, 1.f), s(8, 0.f);
  BOOST_CHECK_EXCEPTION(dense_optimizer_update(dev, config_for(OptimizerKind::adam), 0, 0.1f, w.data(), g.data(),
                                               s.data(), 4, dev.stream),
                        Error, (dense_test::Names{"step", "found 0"}));
  OptimizerConfig bad = config_for(OptimizerKind::adam);
  bad.beta2 = 1.f;
  BOOST_CHECK_EXCEPTION(dense_optimizer_update(dev, bad, 3, 0.1f, w.data(), g.data(), s.data(), 4, dev.stream), Error,
                        (dense_test::Names{"beta1 and beta2"}));
  BOOST_CHECK(w == std::vector<float>(4, 1.f));  // a refused step changes nothing
  for (float wd : {-0.1f, std::nanf("")}) {
    OptimizerConfig decay = config_for(OptimizerKind::sgd);
    decay.weight_decay = wd;
    BOOST_CHECK_EXCEPTION(dense_optimizer_update(dev, decay, 1, 0.1f, w.data(), g.data(), s.data(), 4, dev.stream),
                          Error, (dense_test::Names{"weight_decay", "found"}));
  }
  BOOST_CHECK(w == std::vector<float>(4, 1.f));
}
