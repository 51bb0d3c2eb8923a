// kernels/dense_linear: every step (forward with bias and ReLU, activation + bias gradient, weight and data
// gradients, bf16 conversion) on every backend against a double-precision computation from the inputs, and
// cuda against the cpu reference; the cpu reference against a hand-computed layer and against central finite
// differences of its forward; shape errors naming the layer. Fresh random inputs, outputs poisoned.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>

#include "kernels/dense_linear.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;
using dense_test::poisoned;

namespace {

// Inputs of one layer on a device: fp32, or 16-bit bits when the GEMMs read bf16 or f16.
struct Typed {
  Buffer<float> f32;
  Buffer<uint16_t> h16;
  Typed(const Device& dev, GemmType t, const std::vector<float>& v) {
    if (t == GemmType::f32) f32 = Buffer<float>(dev, v);
    else h16 = Buffer<uint16_t>(dev, dense_test::half_bits(t, v));
  }
  const void* data() const { return f32.empty() ? static_cast<const void*>(h16.data()) : f32.data(); }
};

struct StepOutputs {
  std::vector<float> y, dpre, db, dw, dx, dx2;
  std::vector<uint16_t> dpre16;
};

// Every step of one layer on dev: forward, then backward from dy with the forward's own y.
StepOutputs run_steps(const Device& dev, const LinearDims& d, GemmType t, Activation act, const std::vector<float>& x,
                      const std::vector<float>& w, const std::vector<float>& b, const std::vector<float>& dy) {
  StepOutputs o;
  Typed xd(dev, t, x), wd(dev, t, w);
  Buffer<float> bd(dev, b), dyd(dev, dy);
  Buffer<float> y = poisoned(dev, size_t(d.batch) * d.out);
  linear_forward(dev, d, t, act, xd.data(), wd.data(), bd.data(), y.data(), dev.stream);
  o.y = y.download();

  Buffer<float> dpre = poisoned(dev, size_t(d.batch) * d.out), db = poisoned(dev, d.out);
  Buffer<uint16_t> dpre16(dev, is_half(t) ? size_t(d.batch) * d.out : 0);
  dpre16.fill_bytes(0xFF);
  activation_bias_backward(dev, d, t, act, y.data(), dyd.data(), dpre.data(), dpre16.empty() ? nullptr : dpre16.data(),
                           db.data(), 1.f, dev.stream);
  o.dpre = dpre.download();
  o.db = db.download();
  o.dpre16 = dpre16.download();
  const void* g = is_half(t) ? static_cast<const void*>(dpre16.data()) : dpre.data();

  Buffer<float> dw = poisoned(dev, size_t(d.out) * d.in), dx = poisoned(dev, size_t(d.batch) * d.in);
  linear_backward_weight(dev, d, t, g, xd.data(), dw.data(), dev.stream);
  linear_backward_data(dev, d, t, g, wd.data(), dx.data(), false, dev.stream);
  o.dw = dw.download();
  o.dx = dx.download();
  linear_backward_data(dev, d, t, g, wd.data(), dx.data(), true, dev.stream);  // dx += the same: twice the product
  o.dx2 = dx.download();
  return o;
}

// The expectations in double, from the numbers the GEMMs read (16-bit-rounded inputs for bf16 and f16).
struct Expected {
  std::vector<double> y, dpre, db, dw, dx;
};
Expected expected(const LinearDims& d, GemmType t, Activation act, std::vector<float> x, std::vector<float> w,
                  const std::vector<float>& b, const std::vector<float>& y_dev, const std::vector<float>& dy) {
  if (is_half(t)) x = dense_test::half_rounded(t, x), w = dense_test::half_rounded(t, w);
  Expected e;
  const int64_t B = d.batch;
  e.y.assign(size_t(B) * d.out, 0.0);
  for (int64_t r = 0; r < B; ++r)
    for (int o = 0; o < d.out; ++o) {
      double s = b[o];
      for (int i = 0; i < d.in; ++i) s += double(x[r * d.in + i]) * w[size_t(o) * d.in + i];
      e.y[r * d.out + o] = act == Activation::relu && s < 0 ? 0.0 : s;
    }
  // the mask from the device's own y: a product within rounding of 0 may fall either way
  e.dpre.assign(size_t(B) * d.out, 0.0);
  e.db.assign(d.out, 0.0);
  std::vector<float> g(size_t(B) * d.out);
  for (size_t i = 0; i < g.size(); ++i) {
    const float v = act == Activation::relu && !(y_dev[i] > 0.f) ? 0.f : dy[i];
    e.dpre[i] = v;
    e.db[i % d.out] += v;
    g[i] = is_half(t) ? half_to_float(t)(half_from_float(t)(v)) : v;
  }
  e.dw.assign(size_t(d.out) * d.in, 0.0);
  e.dx.assign(size_t(B) * d.in, 0.0);
  for (int64_t r = 0; r < B; ++r)
    for (int o = 0; o < d.out; ++o)
      for (int i = 0; i < d.in; ++i) {
        e.dw[size_t(o) * d.in + i] += double(g[r * d.out + o]) * x[r * d.in + i];
        e.dx[r * d.in + i] += double(g[r * d.out + o]) * w[size_t(o) * d.in + i];
      }
  return e;
}

std::vector<double> twice(std::vector<double> v) {
  for (auto& x : v) x *= 2;
  return v;
}

void check_outputs(const StepOutputs& o, const Expected& e, GemmType t, double tol, const std::string& where) {
  BOOST_TEST_CONTEXT(where) {
    BOOST_CHECK_EQUAL(dense_test::mismatches(o.y, e.y, tol, tol, "y"), 0u);
    BOOST_CHECK_EQUAL(dense_test::mismatches(o.dpre, e.dpre, 0, 0, "dpre"), 0u);
    BOOST_CHECK_EQUAL(dense_test::mismatches(o.db, e.db, tol, tol, "db"), 0u);
    BOOST_CHECK_EQUAL(dense_test::mismatches(o.dw, e.dw, tol, tol, "dw"), 0u);
    BOOST_CHECK_EQUAL(dense_test::mismatches(o.dx, e.dx, tol, tol, "dx"), 0u);
    BOOST_CHECK_EQUAL(dense_test::mismatches(o.dx2, twice(e.dx), 2 * tol, tol, "dx accumulated"), 0u);
    if (is_half(t)) {
      size_t bad = 0;
      for (size_t i = 0; i < o.dpre16.size(); ++i) bad += o.dpre16[i] != half_from_float(t)(o.dpre[i]);
      BOOST_CHECK_EQUAL(bad, 0u);
    }
  }
}

void steps_match_reference(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Shape {
    int64_t batch;
    int in, out;
  };
  const Shape shapes[] = {{1, 1, 1}, {37, 13, 64}, {64, 127, 33}, {0, 5, 3}, {300, 256, 1}, {129, 64, 512}};
  for (GemmType t : {GemmType::f32, GemmType::bf16, GemmType::f16})
    for (Activation act : {Activation::none, Activation::relu})
      for (const Shape& s : shapes) {
        const LinearDims d{"test_layer", s.batch, s.in, s.out};
        const float scale = 1.0f / std::sqrt(float(s.in));
        std::vector<float> x = testing::random_floats(size_t(s.batch) * s.in);
        std::vector<float> w = testing::random_floats(size_t(s.out) * s.in, -scale, scale);
        std::vector<float> b = testing::random_floats(s.out);
        std::vector<float> dy = testing::random_floats(size_t(s.batch) * s.out);
        const std::string where = std::string(gemm_type_name(t)) + " " + activation_name(act) + " batch " +
                                  std::to_string(s.batch) + " in " + std::to_string(s.in) + " out " +
                                  std::to_string(s.out);
        StepOutputs o = run_steps(dev, d, t, act, x, w, b, dy);
        check_outputs(o, expected(d, t, act, x, w, b, o.y, dy), t, 1e-4, dev.name() + " " + where);
        if (dev.is_cuda()) {  // and against the cpu reference, step by step
          StepOutputs c = run_steps(host, d, t, act, x, w, b, dy);
          // the bias gradient is a fixed-order sum: a second run gives the same bits
          BOOST_CHECK(run_steps(dev, d, t, act, x, w, b, dy).db == o.db);
          BOOST_TEST_CONTEXT("cuda vs cpu " << where) {
            BOOST_CHECK_EQUAL(testing::count_mismatches(o.y, c.y, 1e-4, 1e-4, "y"), 0u);
            BOOST_CHECK_EQUAL(testing::count_mismatches(o.db, c.db, 1e-4, 1e-4, "db"), 0u);
            BOOST_CHECK_EQUAL(testing::count_mismatches(o.dw, c.dw, 1e-4, 1e-4, "dw"), 0u);
            BOOST_CHECK_EQUAL(testing::count_mismatches(o.dx, c.dx, 1e-4, 1e-4, "dx"), 0u);
          }
        }
      }
  close_device(dev);
}

// x [2, 2], w [3, 2], b [3], dy [2, 3], worked by hand.
void hand_computed_layer(Backend be) {
  Device dev = dense_test::device_for(be);
  const LinearDims d{"hand", 2, 2, 3};
  const std::vector<float> x{1, 2, -1, 0.5f}, w{1, -1, 0.5f, 2, 2, 1}, b{0.5f, -1, 0.25f}, dy{1, 2, 3, 4, 5, 6};
  StepOutputs relu = run_steps(dev, d, GemmType::f32, Activation::relu, x, w, b, dy);
  BOOST_CHECK(relu.y == (std::vector<float>{0, 3.5f, 4.25f, 0, 0, 0}));
  BOOST_CHECK(relu.dpre == (std::vector<float>{0, 2, 3, 0, 0, 0}));
  BOOST_CHECK(relu.db == (std::vector<float>{0, 2, 3}));
  BOOST_CHECK(relu.dw == (std::vector<float>{0, 0, 2, 4, 3, 6}));
  BOOST_CHECK(relu.dx == (std::vector<float>{7, 7, 0, 0}));
  StepOutputs none = run_steps(dev, d, GemmType::f32, Activation::none, x, w, b, dy);
  BOOST_CHECK(none.y == (std::vector<float>{-0.5f, 3.5f, 4.25f, -1, -0.5f, -1.25f}));
  BOOST_CHECK(none.db == (std::vector<float>{5, 7, 9}));
  BOOST_CHECK(none.dw == (std::vector<float>{-3, 4, -3, 6.5f, -3, 9}));
  BOOST_CHECK(none.dx == (std::vector<float>{8, 6, 18.5f, 12}));
  BOOST_CHECK(none.dx2 == (std::vector<float>{16, 12, 37, 24}));
  close_device(dev);
}

void bf16_conversion_rounds_to_nearest_even(Backend be) {
  Device dev = dense_test::device_for(be);
  std::vector<float> v = testing::random_floats(10007, -1e3f, 1e3f);
  v[0] = 1.00390625f;   // halfway between two bf16 values, even below: rounds down
  v[1] = 1.01171875f;   // halfway, even above: rounds up
  v[2] = -0.0f;
  Buffer<float> src(dev, v);
  Buffer<uint16_t> dst(dev, v.size());
  dst.fill_bytes(0xFF);
  to_half(dev, GemmType::bf16, src.data(), dst.data(), v.size(), dev.stream);
  std::vector<uint16_t> got = dst.download();
  BOOST_CHECK_EQUAL(got[0], 0x3f80);
  BOOST_CHECK_EQUAL(got[1], 0x3f82);
  BOOST_CHECK_EQUAL(got[2], 0x8000);
  size_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += got[i] != float_to_bf16(v[i]);
  BOOST_CHECK_EQUAL(bad, 0u);
  // from one element in (the cuda conversion's scalar kernel: no 16-byte alignment) and over a few elements
  for (size_t n : {size_t(10006), size_t(3), size_t(1)}) {
    dst.fill_bytes(0xFF);
    to_half(dev, GemmType::bf16, src.data() + 1, dst.data() + 1, n, dev.stream);
    got = dst.download();
    bad = got[0] != 0xFFFF;
    for (size_t i = 1; i <= n; ++i) bad += got[i] != float_to_bf16(v[i]);
    for (size_t i = n + 1; i < v.size(); ++i) bad += got[i] != 0xFFFF;
    BOOST_CHECK_EQUAL(bad, 0u);
  }
  close_device(dev);
}

// The activation + bias gradient over many rows (the column sum's chunks and its unrolled loop, with a row
// remainder) and column counts that are not powers of two: dpre, dpre16 and db against the formulas in double,
// dpre == nullptr with dpre16 (what bf16 training passes), and two runs giving the same bits.
void column_sums_over_many_rows(Backend be) {
  Device dev = dense_test::device_for(be);
  struct Shape {
    int64_t rows;
    int cols;
  };
  for (const Shape s : {Shape{70001, 1}, Shape{20003, 3}, Shape{9000, 33}, Shape{4099, 1000}, Shape{5, 1024}}) {
    const LinearDims d{"colsum", s.rows, s.cols, s.cols};
    const size_t n = size_t(s.rows) * s.cols;
    const std::vector<float> y = testing::random_floats(n), dy = testing::random_floats(n);
    Buffer<float> yd(dev, y), dyd(dev, dy);
    std::vector<double> want(s.cols, 0.0);
    for (size_t i = 0; i < n; ++i) want[i % s.cols] += y[i] > 0.f ? dy[i] : 0.0;
    BOOST_TEST_CONTEXT(dev.name() << " rows " << s.rows << " cols " << s.cols) {
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        Buffer<float> dpre = dense_test::poisoned(dev, n), db = dense_test::poisoned(dev, size_t(s.cols));
        Buffer<uint16_t> dpre16(dev, n);
        dpre16.fill_bytes(0xFF);
        const GemmType t = run == 0 ? GemmType::bf16 : GemmType::f16;  // db the same whatever the copy's type
        activation_bias_backward(dev, d, t, Activation::relu, yd.data(), dyd.data(), run == 0 ? dpre.data() : nullptr,
                                 dpre16.data(), db.data(), 1.f, dev.stream);
        const std::vector<float> got_db = db.download();
        const std::vector<uint16_t> got16 = dpre16.download();
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += got16[i] != half_from_float(t)(y[i] > 0.f ? dy[i] : 0.f);
        BOOST_CHECK_EQUAL(bad, 0u);
        if (run == 0) {
          const std::vector<float> got = dpre.download();
          bad = 0;
          for (size_t i = 0; i < n; ++i) bad += got[i] != (y[i] > 0.f ? dy[i] : 0.f);
          BOOST_CHECK_EQUAL(bad, 0u);
          first = got_db;
        } else {
          BOOST_CHECK(got_db == first);  // deterministic
        }
        BOOST_CHECK_EQUAL(dense_test::mismatches(got_db, want, 1e-2, 1e-4, "db"), 0u);
      }
    }
  }
  close_device(dev);
}

// to_half_padded: the rows in bf16 or f16 (as the host reference rounds them), zeros in the padding.
void half_padded_conversion(Backend be) {
  Device dev = dense_test::device_for(be);
  for (GemmType t : {GemmType::bf16, GemmType::f16})
  for (int64_t cols : {1, 13, 479, 512}) {
    const int64_t rows = 37, ld = (cols + 7) / 8 * 8 + (cols == 512 ? 8 : 0);
    const std::vector<float> v = testing::random_floats(size_t(rows * cols));
    Buffer<float> src(dev, v);
    Buffer<uint16_t> dst(dev, size_t(rows * ld));
    dst.fill_bytes(0xFF);
    to_half_padded(dev, t, src.data(), rows, cols, dst.data(), ld, dev.stream);
    const std::vector<uint16_t> got = dst.download();
    size_t bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ld; ++c)
        bad += got[r * ld + c] != (c < cols ? half_from_float(t)(v[r * cols + c]) : uint16_t(0));
    BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " cols " << cols << " ld " << ld) { BOOST_CHECK_EQUAL(bad, 0u); }
  }
  std::vector<float> f(4);
  std::vector<uint16_t> h(4);
  BOOST_CHECK_EXCEPTION(to_half_padded(dense_test::device_for(Backend::cpu), GemmType::f16, f.data(), 1, 4, h.data(), 3,
                                       nullptr),
                        Error, (dense_test::Names{"to_half_padded", "dst_ld 3"}));
  BOOST_CHECK_EXCEPTION(to_half(dense_test::device_for(Backend::cpu), GemmType::f32, f.data(), h.data(), 4, nullptr),
                        Error, (dense_test::Names{"to_half", "f32"}));
  close_device(dev);
}

// to_half to f16 against bits worked out by hand (IEEE binary16: 1 sign, 5 exponent, 10 fraction bits, bias 15),
// then against the host reference over random values of every magnitude, through the vector and scalar kernels.
void f16_conversion_known_values(Backend be) {
  Device dev = dense_test::device_for(be);
  struct Known {
    float f;
    uint16_t bits;
  };
  const Known known[] = {
      {1.0f, 0x3c00},          {-2.0f, 0xc000},          {0.5f, 0x3800},          {-0.0f, 0x8000},
      {0.0f, 0x0000},          {65504.0f, 0x7bff},       // the largest finite half
      {65519.99f, 0x7bff},     // below the halfway point to 2^16: stays finite
      {65520.0f, 0x7c00},      // halfway to 2^16, whose fraction would be odd: ties to even overflow to inf
      {1e6f, 0x7c00},          {-1e6f, 0xfc00},          {INFINITY, 0x7c00},      {-INFINITY, 0xfc00},
      {6.103515625e-05f, 0x0400},   // 2^-14: the smallest normal
      {5.9604644775390625e-08f, 0x0001},  // 2^-24: the smallest subnormal
      {2.98023223876953125e-08f, 0x0000}, // 2^-25: halfway to the smallest subnormal, ties to even (0)
      {4.470348358154297e-08f, 0x0001},   // 1.5 x 2^-25: rounds up to 2^-24
      {8.940696716308594e-08f, 0x0002},   // 1.5 x 2^-24: halfway between 1 and 2 subnormal units: to even (2)
      {1e-9f, 0x0000},
      {1.00048828125f, 0x3c00},  // 1 + 2^-11: halfway between 1 and 1 + 2^-10, ties to even (down)
      {1.00146484375f, 0x3c02},  // 1 + 3 x 2^-11: halfway, ties to even (up)
      {1.000732421875f, 0x3c01}, // 1 + 1.5 x 2^-11: above halfway, up
      {3.140625f, 0x4248},       // pi to 10 bits: 1.5703125 x 2
  };
  const size_t nk = sizeof(known) / sizeof(known[0]);
  std::vector<float> v = testing::random_floats(10007, -1.0f, 1.0f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], int(i % 50) - 30);  // 2^-30 .. 2^19: every range
  for (size_t i = 0; i < nk; ++i) v[i] = known[i].f;
  Buffer<float> src(dev, v);
  Buffer<uint16_t> dst(dev, v.size());
  for (size_t n : {v.size(), size_t(10006), size_t(3)}) {
    const size_t off = n == v.size() ? 0 : 1;  // from one element in: the scalar kernel (no 16-byte alignment)
    dst.fill_bytes(0xFF);
    to_half(dev, GemmType::f16, src.data() + off, dst.data() + off, n, dev.stream);
    const std::vector<uint16_t> got = dst.download();
    BOOST_TEST_CONTEXT(dev.name() << " n " << n) {
      for (size_t i = off; i < nk && i < off + n; ++i)
        BOOST_CHECK_MESSAGE(got[i] == known[i].bits, "f16(" << known[i].f << ") = 0x" << std::hex << got[i]
                                                               << ", expected 0x" << known[i].bits);
      size_t bad = 0;
      for (size_t i = off; i < off + n; ++i) bad += got[i] != float_to_f16(v[i]);
      for (size_t i = 0; i < v.size(); ++i)
        if (i < off || i >= off + n) bad += got[i] != 0xFFFF;
      BOOST_CHECK_EQUAL(bad, 0u);
    }
  }
  // the host reference widens back exactly: every finite half value round-trips
  size_t bad = 0;
  for (uint32_t h = 0; h < 0x10000; ++h)
    if ((h & 0x7c00) != 0x7c00) bad += float_to_f16(f16_to_float(uint16_t(h))) != h;
  BOOST_CHECK_EQUAL(bad, 0u);
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(column_sums_match_over_many_rows_and_are_deterministic, column_sums_over_many_rows)
SPARTA_BACKEND_CASES(to_half_padded_zeroes_the_padding, half_padded_conversion)
SPARTA_BACKEND_CASES(linear_steps_match_a_double_precision_reference, steps_match_reference)
SPARTA_BACKEND_CASES(linear_steps_match_a_hand_computed_layer, hand_computed_layer)
SPARTA_BACKEND_CASES(to_bf16_matches_the_host_rounding, bf16_conversion_rounds_to_nearest_even)
SPARTA_BACKEND_CASES(to_f16_gives_ieee_half_bits, f16_conversion_known_values)

// The backward steps of the cpu reference against central differences of its forward: the scalar
// Σ r ⊙ y (double) has gradient r with respect to y, so the backward from dy = r gives dL/dx, dL/dw, dL/db.
BOOST_AUTO_TEST_CASE(cpu_linear_backward_matches_finite_differences) {
  Device dev = dense_test::device_for(Backend::cpu);
  const double h = 1e-2;
  for (Activation act : {Activation::none, Activation::relu}) {
    const LinearDims d{"fd", 3, 4, 5};
    std::vector<float> x, w, b;
    // ReLU is not differentiable at 0: draw until every pre-activation is further from 0 than a step moves it
    for (int tries = 0;; ++tries) {
      BOOST_REQUIRE(tries < 1000);
      x = testing::random_floats(size_t(d.batch) * d.in);
      w = testing::random_floats(size_t(d.out) * d.in);
      b = testing::random_floats(d.out);
      std::vector<float> pre(size_t(d.batch) * d.out);
      linear_forward(dev, d, GemmType::f32, Activation::none, x.data(), w.data(), b.data(), pre.data(), dev.stream);
      bool clear = true;
      for (float p : pre) clear = clear && std::fabs(p) > 4 * h;
      if (clear || act == Activation::none) break;
    }
    const std::vector<float> r = testing::random_floats(size_t(d.batch) * d.out);
    auto loss = [&] {
      std::vector<float> y(size_t(d.batch) * d.out);
      linear_forward(dev, d, GemmType::f32, act, x.data(), w.data(), b.data(), y.data(), dev.stream);
      return dense_test::weighted_sum(y, r);
    };
    std::vector<float> y(size_t(d.batch) * d.out), dpre(y.size()), db(d.out), dw(w.size()), dx(x.size());
    linear_forward(dev, d, GemmType::f32, act, x.data(), w.data(), b.data(), y.data(), dev.stream);
    activation_bias_backward(dev, d, GemmType::f32, act, y.data(), r.data(), dpre.data(), nullptr, db.data(), 1.f,
                             dev.stream);
    linear_backward_weight(dev, d, GemmType::f32, dpre.data(), x.data(), dw.data(), dev.stream);
    linear_backward_data(dev, d, GemmType::f32, dpre.data(), w.data(), dx.data(), false, dev.stream);
    BOOST_TEST_CONTEXT(activation_name(act)) {
      BOOST_CHECK_EQUAL(dense_test::mismatches(dx, dense_test::central_differences(x, loss, h), 1e-3, 1e-3, "dx"), 0u);
      BOOST_CHECK_EQUAL(dense_test::mismatches(dw, dense_test::central_differences(w, loss, h), 1e-3, 1e-3, "dw"), 0u);
      BOOST_CHECK_EQUAL(dense_test::mismatches(db, dense_test::central_differences(b, loss, h), 1e-3, 1e-3, "db"), 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_linear_shapes_name_the_layer) {
  Device dev = dense_test::device_for(Backend::cpu);
  std::vector<float> buf(64, 0.f);
  auto forward = [&](LinearDims d) {
    linear_forward(dev, d, GemmType::f32, Activation::none, buf.data(), buf.data(), nullptr, buf.data(), dev.stream);
  };
  BOOST_CHECK_EXCEPTION(forward({"top_mlp.2", 4, 0, 3}), Error, (dense_test::Names{"top_mlp.2", "in", "found in 0"}));
  BOOST_CHECK_EXCEPTION(forward({"top_mlp.2", 4, 3, -1}), Error, (dense_test::Names{"top_mlp.2", "out -1"}));
  BOOST_CHECK_EXCEPTION(forward({"bottom_mlp.0", -2, 3, 3}), Error, (dense_test::Names{"bottom_mlp.0", "found -2"}));
  BOOST_CHECK_EXCEPTION(forward({"wide", int64_t(1) << 30, 4, 4}), Error, (dense_test::Names{"wide", "at most"}));
  BOOST_CHECK_EXCEPTION(activation_bias_backward(dev, {"act", 1, 1, 0}, GemmType::f32, Activation::relu, buf.data(), buf.data(),
                                                 buf.data(), nullptr, nullptr, 1.f, dev.stream),
                        Error, (dense_test::Names{"act", "found in 1, out 0"}));
}

// The GEMMs' algorithm search (cuda): every step's output with the searched algorithm equals the heuristic's
// first answer's bit for bit (the search takes only candidates that give the same bits), at the model's shapes
// and at odd ones, for every type; dx accumulated (beta 1) keeps what D held, and searching is counted. The search
// is restored to on afterwards.
BOOST_AUTO_TEST_CASE(gemm_search_matches_the_heuristic_choice, *testing::needs_gpu()) {
  Device dev = dense_test::device_for(Backend::cuda);
  struct Shape {
    int64_t batch;
    int in, out;
  };
  // DCNv2's cross V and U, the top MLP's first layers, the bottom MLP's first; then odd ones
  const Shape shapes[] = {{8192, 3456, 512}, {8192, 512, 3456}, {4096, 3456, 1024}, {4096, 1024, 1024},
                          {7, 13, 512},      {1, 33, 7},        {65537, 24, 9},     {513, 255, 129}};
  for (GemmType t : {GemmType::f32, GemmType::bf16, GemmType::f16})
    for (const Shape& s : shapes) {
      const LinearDims d{"search_layer", s.batch, s.in, s.out};
      const float scale = 1.0f / std::sqrt(float(s.in));
      std::vector<float> x = testing::random_floats(size_t(s.batch) * s.in);
      std::vector<float> w = testing::random_floats(size_t(s.out) * s.in, -scale, scale);
      std::vector<float> b = testing::random_floats(s.out);
      std::vector<float> g = testing::random_floats(size_t(s.batch) * s.out);
      std::vector<float> d0 = testing::random_floats(size_t(s.batch) * s.in);
      Typed xd(dev, t, x), wd(dev, t, w), gd(dev, t, g);
      Buffer<float> bd(dev, b);
      struct Out {
        std::vector<float> y, dw, dx;
      };
      auto run = [&](bool search) {
        set_gemm_algo_search(search);
        Out o;
        Buffer<float> y = poisoned(dev, size_t(s.batch) * s.out), dw = poisoned(dev, w.size());
        Buffer<float> dx(dev, d0);
        linear_forward(dev, d, t, Activation::relu, xd.data(), wd.data(), bd.data(), y.data(), dev.stream);
        linear_backward_weight(dev, d, t, gd.data(), xd.data(), dw.data(), dev.stream);
        linear_backward_data(dev, d, t, gd.data(), wd.data(), dx.data(), true, dev.stream);
        o.y = y.download(), o.dw = dw.download(), o.dx = dx.download();
        return o;
      };
      const uint64_t before = gemm_algo_searches();
      const Out heuristic = run(false), searched = run(true);
      set_gemm_algo_search(true);
      const std::string where = std::string(gemm_type_name(t)) + " batch " + std::to_string(s.batch) + " in " +
                                std::to_string(s.in) + " out " + std::to_string(s.out);
      auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      BOOST_TEST_CONTEXT(where) {
        BOOST_CHECK_MESSAGE(same_bits(searched.y, heuristic.y), "y differs");
        BOOST_CHECK_MESSAGE(same_bits(searched.dw, heuristic.dw), "dw differs");
        BOOST_CHECK_MESSAGE(same_bits(searched.dx, heuristic.dx), "dx accumulated differs");
      }
      if (s.batch >= 4096) BOOST_CHECK_MESSAGE(gemm_algo_searches() > before, "no search at " << where);
    }
  close_device(dev);
}

namespace {

// The fused ReLU steps against the separate ones they replace and against their formulas, for a layer below (in0 →
// mid, ReLU) and the layer above it (mid → out). Forward: linear_forward_relu_half's 16-bit output is
// linear_forward's fp32 output with the bias rounded to 16 bits, rounded once (cpu: bit for bit; cuda: within a
// 16-bit rounding of the cpu's). Backward: the above layer's data gradient in 16 bits
// (linear_backward_data_half), then relu_bias_backward_half in place: the pre-activation gradient is that 16-bit
// gradient where the 16-bit output is > 0 and 0 elsewhere, bit for bit on every backend, and the bias gradient its
// column sum (cpu: bit for bit as activation_bias_backward's sum of the same values; cuda within the fp32 sum's
// rounding); fed the same 16-bit arrays, cuda's pre-activation gradient equals the cpu's bit for bit. Outputs
// poisoned; widths that are not multiples of 8, batch 0, 1, 7 and 65537.
void fused_relu_steps(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Shape {
    int64_t batch;
    int in0, mid, out;
  };
  const Shape shapes[] = {{1, 13, 16, 8}, {7, 24, 40, 16}, {65, 64, 200, 24}, {0, 8, 16, 8}, {65537, 16, 24, 8},
                          {33, 16, 13, 5}};
  for (GemmType t : {GemmType::bf16, GemmType::f16})
    for (const Shape& s : shapes) {
      const LinearDims below{"below", s.batch, s.in0, s.mid}, above{"above", s.batch, s.mid, s.out};
      const std::string where = std::string(gemm_type_name(t)) + " batch " + std::to_string(s.batch) + " " +
                                std::to_string(s.in0) + "-" + std::to_string(s.mid) + "-" + std::to_string(s.out);
      BOOST_TEST_CONTEXT(dev.name() << " " << where) {
        BOOST_CHECK(relu_half_fusion_available(host, below, above, t, host.stream));
        BOOST_CHECK(!relu_half_fusion_available(host, below, above, GemmType::f32, host.stream));
        if (!relu_half_fusion_available(dev, below, above, t, dev.stream)) {
          BOOST_TEST_MESSAGE("no fused ReLU steps on " << dev.name() << " at " << where);
          continue;
        }
        const size_t n = size_t(s.batch) * s.mid;
        const float scale = 1.0f / std::sqrt(float(s.in0));
        const std::vector<float> x = testing::random_floats(size_t(s.batch) * s.in0);
        const std::vector<float> w0 = testing::random_floats(size_t(s.mid) * s.in0, -scale, scale);
        const std::vector<float> b0 = testing::random_floats(s.mid, -0.5f, 0.5f);
        const std::vector<float> w1 = testing::random_floats(size_t(s.out) * s.mid, -0.2f, 0.2f);
        const std::vector<float> dpre = testing::random_floats(size_t(s.batch) * s.out);
        struct Got {
          std::vector<uint16_t> y16, g16, dpre16;
          std::vector<float> db;
        };
        // the fused steps on d
        auto fused = [&](const Device& d) {
          Typed xd(d, t, x), w0d(d, t, w0), w1d(d, t, w1), gd(d, t, dpre);
          Buffer<float> b0d(d, b0), db = poisoned(d, s.mid);
          Buffer<uint16_t> y16(d, n), g16(d, n);
          y16.fill_bytes(0xFF), g16.fill_bytes(0xFF);
          linear_forward_relu_half(d, below, t, xd.data(), w0d.data(), b0d.data(), y16.data(), d.stream);
          linear_backward_data_half(d, above, t, gd.data(), w1d.data(), g16.data(), d.stream);
          Got o;
          o.g16 = g16.download();
          relu_bias_backward_half(d, below, t, y16.data(), g16.data(), g16.data(), db.data(), d.stream);
          o.y16 = y16.download(), o.dpre16 = g16.download(), o.db = db.download();
          return o;
        };
        const Got got = fused(dev);
        // the formula of the backward pass on what the forward and the data gradient wrote
        std::vector<uint16_t> want_dpre16(n);
        std::vector<double> want_db(s.mid, 0.0);
        for (size_t i = 0; i < n; ++i) {
          want_dpre16[i] = half_to_float(t)(got.y16[i]) > 0.f ? got.g16[i] : uint16_t(0);
          want_db[i % s.mid] += half_to_float(t)(want_dpre16[i]);
        }
        BOOST_CHECK(got.dpre16 == want_dpre16);
        BOOST_CHECK_EQUAL(dense_test::mismatches(got.db, want_db, 1e-4 * std::sqrt(double(s.batch) + 1), 1e-4, "db"),
                          0u);
        // the separate steps on the cpu reference
        Got want;
        {
          Typed xd(host, t, x), w0d(host, t, w0), w1d(host, t, w1), gd(host, t, dpre);
          std::vector<float> y(n), g(n), db(s.mid);
          const std::vector<float> b0_rounded = dense_test::half_rounded(t, b0);
          linear_forward(host, below, t, Activation::relu, xd.data(), w0d.data(), b0_rounded.data(), y.data(),
                         host.stream);
          want.y16.resize(n);
          to_half_cpu(t, y.data(), want.y16.data(), n);
          linear_backward_data(host, above, t, gd.data(), w1d.data(), g.data(), false, host.stream);
          want.g16.resize(n);
          to_half_cpu(t, g.data(), want.g16.data(), n);
          // the mask of the output as the next layer reads it (a positive fp32 output below half the smallest fp16
          // subnormal rounds to 0)
          const std::vector<float> g_rounded = dense_test::half_rounded(t, g), y_rounded = dense_test::half_rounded(t, y);
          want.dpre16.resize(n);
          activation_bias_backward(host, below, t, Activation::relu, y_rounded.data(), g_rounded.data(), nullptr,
                                   want.dpre16.data(), db.data(), 1.f, host.stream);
          want.db = db;
        }
        if (!dev.is_cuda()) {
          BOOST_CHECK(got.y16 == want.y16);
          BOOST_CHECK(got.g16 == want.g16);
          BOOST_CHECK(got.dpre16 == want.dpre16);
          BOOST_CHECK(got.db == want.db);
        } else {  // within a 16-bit rounding (an element at a rounding boundary may round the other way)
          auto widen = [&](const std::vector<uint16_t>& v) {
            std::vector<float> f(v.size());
            for (size_t i = 0; i < v.size(); ++i) f[i] = half_to_float(t)(v[i]);
            return f;
          };
          const double tol = t == GemmType::bf16 ? 1.6e-2 : 2e-3;
          BOOST_CHECK_EQUAL(testing::count_mismatches(widen(got.y16), widen(want.y16), tol, tol, "y16"), 0u);
          BOOST_CHECK_EQUAL(testing::count_mismatches(widen(got.g16), widen(want.g16), tol, tol, "g16"), 0u);
          // the backward pass alone on the same 16-bit arrays: the cpu's bits
          Buffer<uint16_t> y16(host, got.y16), g16(host, got.g16);
          std::vector<float> db(s.mid);
          relu_bias_backward_half(host, below, t, y16.data(), g16.data(), g16.data(), db.data(), host.stream);
          BOOST_CHECK(got.dpre16 == g16.download());
          BOOST_CHECK_EQUAL(testing::count_mismatches(got.db, db, 1e-4 * std::sqrt(double(s.batch) + 1), 1e-4,
                                                      "db vs cpu"), 0u);
        }
      }
    }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(fused_relu_steps_match_the_separate_steps, fused_relu_steps)

// cuda: cuBLASLt runs the fused ReLU steps (the forward's RELU_BIAS epilogue with a 16-bit D, the 16-bit data
// gradient) at the models' bf16 and fp16 shapes, every hidden layer of both MLPs, so the MLPs take them.
BOOST_AUTO_TEST_CASE(fused_relu_steps_available_at_the_model_shapes, *testing::needs_gpu()) {
  Device dev = dense_test::device_for(Backend::cuda);
  for (GemmType t : {GemmType::bf16, GemmType::f16}) {
    for (auto w : {std::vector<int>{3456, 1024, 1024}, std::vector<int>{1024, 1024, 512},
                   std::vector<int>{1024, 512, 256}, std::vector<int>{512, 256, 1}, std::vector<int>{480, 1024, 1024},
                   std::vector<int>{16, 512, 256}, std::vector<int>{512, 256, 128}})
      BOOST_CHECK_MESSAGE(relu_half_fusion_available(dev, {"below", 65536, w[0], w[1]}, {"above", 65536, w[1], w[2]}, t,
                                                     dev.stream),
                          gemm_type_name(t) << " " << w[0] << "-" << w[1] << "-" << w[2]);
  }
  close_device(dev);
}

namespace {

// The steps with a 16-bit output and the data gradient onto another array: linear_forward_half is linear_forward
// (no bias, no activation) rounded once, linear_backward_data_half likewise, linear_backward_data_plus is the
// addend plus linear_backward_data, linear_backward_data_half_plus the 16-bit addend plus linear_backward_data
// rounded once (cpu: bit for bit; cuda within the GEMMs' rounding of the cpu reference). Outputs poisoned; the
// addends left as they were.
void half_outputs_and_plus(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Shape {
    int64_t batch;
    int in, out;
  };
  for (GemmType t : {GemmType::bf16, GemmType::f16})
    for (const Shape& s : {Shape{1, 8, 16}, Shape{7, 24, 40}, Shape{65537, 16, 8}, Shape{0, 8, 8}, Shape{33, 3456, 64}}) {
      const LinearDims d{"half_out", s.batch, s.in, s.out};
      const std::vector<float> x = testing::random_floats(size_t(s.batch) * s.in);
      const std::vector<float> w = testing::random_floats(size_t(s.out) * s.in, -0.3f, 0.3f);
      const std::vector<float> dpre = testing::random_floats(size_t(s.batch) * s.out);
      const std::vector<float> addend = testing::random_floats(size_t(s.batch) * s.in);
      const std::vector<float> addend_h = dense_test::half_rounded(t, testing::random_floats(addend.size()));
      const std::vector<uint16_t> addend16 = dense_test::half_bits(t, addend_h);
      struct Got {
        std::vector<uint16_t> y16, dx16, dx16_plus, addend16;
        std::vector<float> dx, addend;
      };
      auto run = [&](const Device& dv, bool separate) {
        Typed xd(dv, t, x), wd(dv, t, w), gd(dv, t, dpre);
        Got o;
        o.y16.resize(size_t(s.batch) * s.out), o.dx16.resize(size_t(s.batch) * s.in);
        o.dx16_plus.resize(o.dx16.size()), o.addend16 = addend16;
        Buffer<float> dx = poisoned(dv, size_t(s.batch) * s.in), add(dv, addend);
        if (separate) {  // the fp32 steps, rounded on the host
          Buffer<float> y(dv, o.y16.size()), dxs(dv, o.dx16.size());
          linear_forward(dv, d, t, Activation::none, xd.data(), wd.data(), nullptr, y.data(), dv.stream);
          linear_backward_data(dv, d, t, gd.data(), wd.data(), dxs.data(), false, dv.stream);
          const std::vector<float> yh = y.download(), dxh = dxs.download();
          to_half_cpu(t, yh.data(), o.y16.data(), yh.size());
          to_half_cpu(t, dxh.data(), o.dx16.data(), dxh.size());
          copy_on_device(dv, dx.data(), add.data(), addend.size() * sizeof(float), dv.stream);
          linear_backward_data(dv, d, t, gd.data(), wd.data(), dx.data(), true, dv.stream);
          Buffer<float> dxp(dv, addend_h);
          linear_backward_data(dv, d, t, gd.data(), wd.data(), dxp.data(), true, dv.stream);
          const std::vector<float> dxph = dxp.download();
          to_half_cpu(t, dxph.data(), o.dx16_plus.data(), dxph.size());
        } else {
          Buffer<uint16_t> y16(dv, o.y16.size()), dx16(dv, o.dx16.size());
          y16.fill_bytes(0xFF), dx16.fill_bytes(0xFF);
          linear_forward_half(dv, d, t, xd.data(), wd.data(), y16.data(), dv.stream);
          linear_backward_data_half(dv, d, t, gd.data(), wd.data(), dx16.data(), dv.stream);
          linear_backward_data_plus(dv, d, t, gd.data(), wd.data(), add.data(), dx.data(), dv.stream);
          Buffer<uint16_t> a16(dv, addend16), dx16p(dv, o.dx16.size());
          dx16p.fill_bytes(0xFF);
          linear_backward_data_half_plus(dv, d, t, gd.data(), wd.data(), a16.data(), dx16p.data(), dv.stream);
          o.y16 = y16.download(), o.dx16 = dx16.download(), o.dx16_plus = dx16p.download();
          o.addend16 = a16.download();
        }
        o.dx = dx.download(), o.addend = add.download();
        return o;
      };
      const Got got = run(dev, false), want = run(host, true);
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " batch " << s.batch << " in " << s.in << " out "
                                    << s.out) {
        BOOST_CHECK(got.addend == addend);
        BOOST_CHECK(got.addend16 == addend16);
        if (!dev.is_cuda()) {
          BOOST_CHECK(got.y16 == want.y16);
          BOOST_CHECK(got.dx16 == want.dx16);
          BOOST_CHECK(got.dx16_plus == want.dx16_plus);
          BOOST_CHECK(got.dx == want.dx);
        } else {
          auto widen = [&](const std::vector<uint16_t>& v) {
            std::vector<float> f(v.size());
            for (size_t i = 0; i < v.size(); ++i) f[i] = half_to_float(t)(v[i]);
            return f;
          };
          const double tol = t == GemmType::bf16 ? 1.6e-2 : 2e-3;
          BOOST_CHECK_EQUAL(testing::count_mismatches(widen(got.y16), widen(want.y16), tol, tol, "y16"), 0u);
          BOOST_CHECK_EQUAL(testing::count_mismatches(widen(got.dx16), widen(want.dx16), tol, tol, "dx16"), 0u);
          BOOST_CHECK_EQUAL(
              testing::count_mismatches(widen(got.dx16_plus), widen(want.dx16_plus), tol, tol, "dx16 plus"), 0u);
          BOOST_CHECK_EQUAL(testing::count_mismatches(got.dx, want.dx, 1e-4, 1e-4, "dx"), 0u);
        }
      }
    }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(half_outputs_and_the_plus_step_match_the_fp32_steps, half_outputs_and_plus)
