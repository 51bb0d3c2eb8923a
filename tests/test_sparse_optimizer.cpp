// kernels/sparse_optimizer: every optimizer against an independent double-precision implementation (cpu), lazy
// Adam's catch-up against a dense simulation, bad steps, and the cuda version against the cpu reference over
// several steps (values and state after each), on fresh random rows and gradients.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "kernels/sparse_optimizer.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

const OptimizerKind kAll[] = {OptimizerKind::sgd,       OptimizerKind::momentum, OptimizerKind::nesterov,
                              OptimizerKind::adagrad,   OptimizerKind::adam,     OptimizerKind::lazy_adam,
                              OptimizerKind::rowwise_adagrad};

bool has_accumulator(OptimizerKind k) { return k == OptimizerKind::adagrad || k == OptimizerKind::rowwise_adagrad; }

// A random subset of [0, capacity), ascending, of about fraction * capacity rows.
std::vector<int64_t> random_rows(int64_t capacity, double fraction) {
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < capacity; ++r)
    if (unit(testing::rng()) < fraction) rows.push_back(r);
  return rows;
}

int32_t last_step_of(const std::vector<float>& state, size_t at) {
  int32_t s;
  std::memcpy(&s, &state[at], sizeof(s));
  return s;
}

// Independent implementation, in double, from the formulas as written in sparse_optimizer.h's comment.
struct NaiveStore {
  OptimizerConfig cfg;
  int dim;
  std::vector<double> w, s0, s1;
  std::vector<int64_t> last;
  NaiveStore(const OptimizerConfig& c, int d, const std::vector<float>& values, int64_t capacity)
      : cfg(c), dim(d), w(values.begin(), values.end()), s0(values.size(), 0.0), s1(values.size(), 0.0),
        last(capacity, 0) {
    if (has_accumulator(c.kind)) std::fill(s0.begin(), s0.end(), double(c.initial_accumulator));
  }
  void update(int64_t row, const float* g, int64_t t) {
    const double lr = cfg.lr, mu = cfg.momentum, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.epsilon;
    const int64_t k = std::max<int64_t>(0, t - 1 - last[row]);
    std::vector<double> xs(static_cast<size_t>(dim));  // the gradient with the weight decay, from the values before the step
    double mean_square = 0;
    for (int e = 0; e < dim; ++e) {
      xs[e] = double(g[e]) + double(cfg.weight_decay) * w[size_t(row) * dim + e];
      mean_square += xs[e] * xs[e] / dim;
    }
    // rowwise_adagrad: the row's accumulator is held at its first element
    const size_t first = size_t(row) * dim;
    if (cfg.kind == OptimizerKind::rowwise_adagrad) s0[first] += mean_square;
    for (int e = 0; e < dim; ++e) {
      const size_t i = size_t(row) * dim + e;
      const double x = xs[e];
      switch (cfg.kind) {
        case OptimizerKind::rowwise_adagrad: w[i] -= lr / (std::sqrt(s0[first]) + eps) * x; break;
        case OptimizerKind::sgd: w[i] -= lr * x; break;
        case OptimizerKind::momentum:
          s0[i] = mu * s0[i] + x;
          w[i] -= lr * s0[i];
          break;
        case OptimizerKind::nesterov:
          s0[i] = mu * s0[i] + x;
          w[i] -= lr * (x + mu * s0[i]);
          break;
        case OptimizerKind::adagrad:
          s0[i] += x * x;
          w[i] -= lr * x / (std::sqrt(s0[i]) + eps);
          break;
        case OptimizerKind::adam:
        case OptimizerKind::lazy_adam:
          if (cfg.kind == OptimizerKind::lazy_adam) s0[i] *= std::pow(b1, double(k)), s1[i] *= std::pow(b2, double(k));
          s0[i] = b1 * s0[i] + (1 - b1) * x;
          s1[i] = b2 * s1[i] + (1 - b2) * x * x;
          w[i] -= lr * (s0[i] / (1 - std::pow(b1, double(t)))) / (std::sqrt(s1[i] / (1 - std::pow(b2, double(t)))) + eps);
          break;
      }
    }
    last[row] = t;
  }
  // The state laid out as the store holds it.
  std::vector<float> state_floats(int64_t capacity) const {
    const int width = optimizer_state_width(cfg.kind, dim);
    std::vector<float> out(size_t(capacity) * width);
    for (int64_t r = 0; r < capacity; ++r) {
      if (cfg.kind == OptimizerKind::rowwise_adagrad) {
        out[r] = float(s0[r * dim]);
        continue;
      }
      for (int e = 0; e < dim && width > 0; ++e) {
        out[r * width + e] = float(s0[r * dim + e]);
        if (width >= 2 * dim) out[r * width + dim + e] = float(s1[r * dim + e]);
      }
      if (cfg.kind == OptimizerKind::lazy_adam) {
        int32_t s = int32_t(last[r]);
        std::memcpy(&out[r * width + 2 * dim], &s, sizeof(s));
      }
    }
    return out;
  }
};

// The lazy_adam slot holds int32 bits, not a float: compared as integers, the floats around it as floats.
size_t state_mismatches(OptimizerKind kind, int dim, const std::vector<float>& got, const std::vector<float>& want,
                        double atol, double rtol) {
  if (kind != OptimizerKind::lazy_adam) return testing::count_mismatches(got, want, atol, rtol, "state");
  const size_t width = 2 * dim + 1;
  std::vector<float> g, w;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (i % width == width - 1) {
      bad += last_step_of(got, i) != last_step_of(want, i);
    } else {
      g.push_back(got[i]), w.push_back(want[i]);
    }
  }
  return bad + testing::count_mismatches(g, w, atol, rtol, "state");
}

struct Store {
  Buffer<float> values, state;
  Store(const Device& dev, const std::vector<float>& v, const std::vector<float>& s) : values(dev, v), state(dev, s) {}
};

std::vector<float> initial_state(const OptimizerConfig& cfg, int64_t capacity, int dim) {
  return std::vector<float>(size_t(capacity) * optimizer_state_width(cfg.kind, dim),
                            has_accumulator(cfg.kind) ? cfg.initial_accumulator : 0.0f);
}

// One step on dev: rows and their gradients uploaded, the count in device memory. Returns nothing; the store
// changes.
// shift: the gradients start that many floats into their buffer (1: not 16-byte aligned, so the cuda kernel
// reads them one float at a time instead of four).
void step_on(const Device& dev, const OptimizerConfig& cfg, int64_t step, const std::vector<int64_t>& rows,
             const std::vector<float>& grads, int64_t max_unique, Store& store, int64_t capacity, int dim,
             int shift = 0) {
  std::vector<int64_t> padded_rows = rows;
  padded_rows.resize(size_t(max_unique), 0);  // rows past the count: row 0, which must not change through them
  std::vector<float> padded_grads(size_t(shift), std::nanf(""));
  padded_grads.insert(padded_grads.end(), grads.begin(), grads.end());
  padded_grads.resize(size_t(shift + max_unique * dim), std::nanf(""));  // NaN past the count: read, it would show
  Buffer<int64_t> r(dev, padded_rows);
  Buffer<float> g(dev, padded_grads);
  Buffer<int32_t> n(dev, std::vector<int32_t>{int32_t(rows.size())});
  sparse_optimizer_update(dev, cfg, step, r.data(), g.data() + shift, n.data(), max_unique, store.values.data(),
                          store.state.data(), capacity, dim, dev.stream);
  synchronize(dev);
}

OptimizerConfig config_for(OptimizerKind kind) {
  OptimizerConfig cfg;
  cfg.kind = kind;
  cfg.lr = 0.05f;
  cfg.momentum = 0.8f;
  cfg.beta1 = 0.85f;
  cfg.beta2 = 0.99f;
  cfg.epsilon = 1e-6f;
  cfg.initial_accumulator = 0.1f;
  return cfg;
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_optimizers_match_a_double_precision_implementation) {
  Device dev = open_device(Backend::cpu, -1);
  const int64_t capacity = 60;
  for (OptimizerKind kind : kAll) {
    for (int dim : {1, 3, 16, 100})
    for (float decay : {0.0f, 0.25f}) {
      BOOST_TEST_CONTEXT(optimizer_name(kind) << " dim " << dim << " weight_decay " << decay) {
        OptimizerConfig cfg = config_for(kind);
        cfg.weight_decay = decay;
        std::vector<float> values0 = testing::random_floats(capacity * dim);
        Store store(dev, values0, initial_state(cfg, capacity, dim));
        NaiveStore naive(cfg, dim, values0, capacity);
        for (int64_t step = 1; step <= 6; ++step) {
          std::vector<int64_t> rows = random_rows(capacity, 0.4);
          std::vector<float> grads = testing::random_floats(rows.size() * dim);
          // rows outside the table are skipped
          std::vector<int64_t> with_bad = rows;
          with_bad.push_back(capacity);
          with_bad.push_back(-1);
          std::vector<float> grads_bad = grads;
          grads_bad.resize(with_bad.size() * dim, 1.0f);
          step_on(dev, cfg, step, with_bad, grads_bad, int64_t(with_bad.size()) + 3, store, capacity, dim);
          for (size_t u = 0; u < rows.size(); ++u) naive.update(rows[u], grads.data() + u * dim, step);
          BOOST_TEST_CONTEXT("step " << step) {
            std::vector<float> want_w(naive.w.begin(), naive.w.end());
            BOOST_CHECK_EQUAL(testing::count_mismatches(store.values.download(), want_w, 1e-6, 1e-5, "values"), 0u);
            BOOST_CHECK_EQUAL(
                state_mismatches(kind, dim, store.state.download(), naive.state_floats(capacity), 1e-6, 1e-5), 0u);
          }
        }
      }
    }
  }
}

// Lazy Adam against a dense simulation (double): every row's m and v move every step, with a zero gradient
// when the row is absent, but its value moves only when present. Plain Adam leaves absent rows' m and v as
// they were, so the two differ exactly on the rows that skipped steps.
BOOST_AUTO_TEST_CASE(lazy_adam_applies_the_decay_a_row_missed) {
  Device dev = open_device(Backend::cpu, -1);
  const int64_t capacity = 40;
  const int dim = 4;
  OptimizerConfig lazy = config_for(OptimizerKind::lazy_adam), adam = config_for(OptimizerKind::adam);
  std::vector<float> values0 = testing::random_floats(capacity * dim);
  Store lazy_store(dev, values0, initial_state(lazy, capacity, dim));
  Store adam_store(dev, values0, initial_state(adam, capacity, dim));
  std::vector<double> w(values0.begin(), values0.end()), m(values0.size(), 0.0), v(values0.size(), 0.0);
  std::vector<bool> skipped(capacity, false), seen(capacity, false);
  const double b1 = lazy.beta1, b2 = lazy.beta2;
  for (int64_t t = 1; t <= 12; ++t) {
    // rows 0..9 every step; the rest now and then
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < capacity; ++r) {
      bool present = r < 10 || std::uniform_real_distribution<double>(0, 1)(testing::rng()) < 0.3;
      if (present) rows.push_back(r);
      if (!present && seen[r]) skipped[r] = true;
      seen[r] = seen[r] || present;
    }
    std::vector<float> grads = testing::random_floats(rows.size() * dim);
    step_on(dev, lazy, t, rows, grads, int64_t(rows.size()), lazy_store, capacity, dim);
    step_on(dev, adam, t, rows, grads, int64_t(rows.size()), adam_store, capacity, dim);
    std::vector<double> g(values0.size(), 0.0);
    std::vector<bool> present(capacity, false);
    for (size_t u = 0; u < rows.size(); ++u) {
      present[rows[u]] = true;
      for (int e = 0; e < dim; ++e) g[rows[u] * dim + e] = grads[u * dim + e];
    }
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      if (present[i / dim])
        w[i] -= lazy.lr * (m[i] / (1 - std::pow(b1, double(t)))) /
                (std::sqrt(v[i] / (1 - std::pow(b2, double(t)))) + lazy.epsilon);
    }
  }
  // m and v of rows last seen before the final step still owe the decay since: compare them as of their last
  // update, the point where lazy Adam has caught up
  std::vector<float> lazy_state = lazy_store.state.download(), adam_state = adam_store.state.download();
  std::vector<float> lazy_w = lazy_store.values.download();
  std::vector<float> want_w(w.begin(), w.end());
  BOOST_CHECK_EQUAL(testing::count_mismatches(lazy_w, want_w, 1e-6, 1e-5, "lazy adam values"), 0u);
  const int width = 2 * dim + 1;
  size_t bad = 0, differs_on_skipped = 0, same_on_every_step = 0;
  for (int64_t r = 0; r < capacity; ++r) {
    const int32_t last = last_step_of(lazy_state, r * width + 2 * dim);
    const double owed1 = std::pow(b1, double(12 - last)), owed2 = std::pow(b2, double(12 - last));
    for (int e = 0; e < dim; ++e) {
      // the simulation's m is the lazy row's m decayed over the steps after `last`
      const double want_m = m[r * dim + e] / owed1, want_v = v[r * dim + e] / owed2;
      const double got_m = lazy_state[r * width + e], got_v = lazy_state[r * width + dim + e];
      bad += !(std::fabs(got_m - want_m) <= 1e-6 + 1e-4 * std::fabs(want_m));
      bad += !(std::fabs(got_v - want_v) <= 1e-7 + 1e-4 * std::fabs(want_v));
      const float adam_m = adam_state[r * 2 * dim + e];
      if (skipped[r]) differs_on_skipped += adam_m != lazy_state[r * width + e];
      if (r < 10) same_on_every_step += adam_m == lazy_state[r * width + e];
    }
    if (seen[r] && r < 10) BOOST_CHECK_EQUAL(last, 12);
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  BOOST_CHECK_EQUAL(same_on_every_step, size_t(10 * dim));  // no step missed: lazy Adam is Adam, bit for bit
  BOOST_CHECK_GT(differs_on_skipped, 0u);
}

BOOST_AUTO_TEST_CASE(optimizer_step_rejects_bad_steps_and_betas) {
  OptimizerConfig cfg = config_for(OptimizerKind::adam);
  BOOST_CHECK_THROW(optimizer_step(cfg, 0), Error);
  BOOST_CHECK_THROW(optimizer_step(cfg, int64_t(1) << 31), Error);
  BOOST_CHECK_NO_THROW(optimizer_step(cfg, 1));
  cfg.beta1 = 1.0f;
  BOOST_CHECK_THROW(optimizer_step(cfg, 5), Error);
  OptimizerStep c = optimizer_step(config_for(OptimizerKind::lazy_adam), 7);
  BOOST_CHECK_EQUAL(c.step, 7);
  BOOST_CHECK_CLOSE(double(c.inv_bias1), 1.0 / (1.0 - std::pow(0.85, 7)), 1e-4);
}

BOOST_AUTO_TEST_CASE(pow_steps_is_repeated_multiplication) {
  for (float base : {0.9f, 0.999f, 0.5f}) {
    float want = 1.0f;
    for (int k = 0; k <= 40; ++k) {
      BOOST_CHECK_CLOSE(double(pow_steps(base, k)), double(want), 1e-4);
      want *= base;
    }
  }
  BOOST_CHECK_EQUAL(pow_steps(0.9f, 0), 1.0f);
}

BOOST_AUTO_TEST_CASE(cuda_optimizers_match_cpu_over_several_steps, *testing::needs_gpu()) {
  Device gpu = open_device(Backend::cuda, 0);
  Device host = open_device(Backend::cpu, -1);
  const int64_t capacity = 3000;
  for (OptimizerKind kind : kAll) {
    for (int dim : {1, 3, 16, 100, 128, 200, 256})
    for (float decay : {0.0f, 0.25f}) {
      BOOST_TEST_CONTEXT(optimizer_name(kind) << " dim " << dim << " weight_decay " << decay) {
        OptimizerConfig cfg = config_for(kind);
        cfg.weight_decay = decay;
        std::vector<float> values0 = testing::random_floats(capacity * dim);
        Store on_cpu(host, values0, initial_state(cfg, capacity, dim));
        Store on_gpu(gpu, values0, initial_state(cfg, capacity, dim));
        // the same on gradients read one float at a time (another row shape: the same sums, sparse_optimizer.h)
        Store on_gpu1(gpu, values0, initial_state(cfg, capacity, dim));
        for (int64_t step = 1; step <= 5; ++step) {
          std::vector<int64_t> rows = random_rows(capacity, step == 3 ? 1.0 : 0.3);
          rows.push_back(capacity);  // outside: skipped on both
          std::vector<float> grads = testing::random_floats(rows.size() * dim);
          const int64_t max_unique = int64_t(rows.size()) + 100;  // launch over more than the count
          step_on(host, cfg, step, rows, grads, max_unique, on_cpu, capacity, dim);
          step_on(gpu, cfg, step, rows, grads, max_unique, on_gpu, capacity, dim);
          step_on(gpu, cfg, step, rows, grads, max_unique, on_gpu1, capacity, dim, 1);
          BOOST_TEST_CONTEXT("step " << step) {
            std::vector<float> vc = on_cpu.values.download(), vg = on_gpu.values.download();
            std::vector<float> sc = on_cpu.state.download(), sg = on_gpu.state.download();
            std::vector<float> vg1 = on_gpu1.values.download(), sg1 = on_gpu1.state.download();
            BOOST_CHECK(std::memcmp(vg1.data(), vc.data(), vc.size() * sizeof(float)) == 0);
            BOOST_CHECK(sc.empty() || std::memcmp(sg1.data(), sc.data(), sc.size() * sizeof(float)) == 0);
            BOOST_CHECK_EQUAL(testing::count_mismatches(vg, vc, 1e-6, 1e-5, "values"), 0u);
            BOOST_CHECK_EQUAL(state_mismatches(kind, dim, sg, sc, 1e-6, 1e-5), 0u);
            // only IEEE-rounded operations on both sides: the same bits
            BOOST_CHECK(std::memcmp(vg.data(), vc.data(), vc.size() * sizeof(float)) == 0);
            BOOST_CHECK(sc.empty() || std::memcmp(sg.data(), sc.data(), sc.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
  close_device(gpu);
}
