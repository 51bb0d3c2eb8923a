// kernels/cross_layer: DCNv2's low-rank cross network, forward and backward (fp32 and bf16 GEMMs), on every
// backend against the network computed in double in the test, cuda also against the cpu reference; the cpu
// reference against a hand-computed layer and against central finite differences of its forward; the
// elementwise steps alone; errors naming the network.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "kernels/cross_layer.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct NetResult {
  std::vector<float> x, grads, dx0;
};

// Columns [0, a_cols) of a row-major [rows, cols] matrix, and the rest; and the two put back together.
std::vector<float> left_block(const std::vector<float>& m, int64_t rows, int cols, int a_cols) {
  std::vector<float> out(size_t(rows) * a_cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < a_cols; ++c) out[r * a_cols + c] = m[r * cols + c];
  return out;
}
std::vector<float> right_block(const std::vector<float>& m, int64_t rows, int cols, int a_cols) {
  std::vector<float> out(size_t(rows) * (cols - a_cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int c = a_cols; c < cols; ++c) out[r * (cols - a_cols) + c - a_cols] = m[r * cols + c];
  return out;
}
std::vector<float> join_blocks(const std::vector<float>& a, const std::vector<float>& b, int64_t rows, int cols,
                               int a_cols) {
  std::vector<float> out(size_t(rows) * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[r * cols + c] = c < a_cols ? a[r * a_cols + c] : b[r * (cols - a_cols) + c - a_cols];
  return out;
}

// The network's forward and backward; a_cols > 0: x0 given, and dx0 taken, as two column blocks split there.
NetResult run_net(const Device& dev, const CrossConfig& cfg, int64_t max_batch, const std::vector<float>& params,
                  const std::vector<float>& x0, const std::vector<float>& dx, int64_t batch, int a_cols = 0) {
  CrossNet net(dev, cfg, max_batch);
  const int D = cfg.dim;
  Buffer<float> p(dev, params), dxd(dev, dx);
  Buffer<float> grads = dense_test::poisoned(dev, net.param_count());
  NetResult r;
  r.x.resize(size_t(batch) * D);
  if (a_cols == 0) {
    Buffer<float> xd(dev, x0), dx0 = dense_test::poisoned(dev, x0.size());
    const float* out = net.forward(p.data(), xd.data(), batch, dev.stream);
    copy_to_host(dev, r.x.data(), out, r.x.size() * sizeof(float));
    net.backward(p.data(), dxd.data(), grads.data(), dx0.data(), dev.stream);
    r.dx0 = dx0.download();
  } else {
    Buffer<float> xa(dev, left_block(x0, batch, D, a_cols)), xb(dev, right_block(x0, batch, D, a_cols));
    Buffer<float> da = dense_test::poisoned(dev, size_t(batch) * a_cols);
    Buffer<float> db = dense_test::poisoned(dev, size_t(batch) * (D - a_cols));
    const float* out = net.forward(p.data(), CrossInput(xa.data(), xb.data(), a_cols), batch, dev.stream);
    copy_to_host(dev, r.x.data(), out, r.x.size() * sizeof(float));
    net.backward(p.data(), dxd.data(), grads.data(), CrossInputGrad(da.data(), db.data(), a_cols), dev.stream);
    r.dx0 = join_blocks(da.download(), db.download(), batch, D, a_cols);
  }
  r.grads = grads.download();
  return r;
}

struct Naive {
  std::vector<double> x, grads, dx0;
};

// The network in double from the formulas in cross_layer.h; in 16-bit training R rounds what the network keeps in
// 16 bits (x0's copy, which the products read; x_l; h_l; the product h U^T before the bias is added; every g; dz;
// dh; the weights) to bf16 or f16; identity for fp32.
Naive naive_net(const CrossConfig& cfg, const std::vector<float>& params, const std::vector<float>& x0_in,
                const std::vector<float>& dxL, int64_t B) {
  const GemmType t = cfg.precision;
  const bool half = is_half(t);
  auto R = [&](double v) { return half ? double(half_to_float(t)(half_from_float(t)(float(v)))) : double(float(v)); };
  const int D = cfg.dim, r = cfg.rank, L = cfg.layers;
  const size_t per = size_t(2) * r * D + D;
  auto V = [&](int l, int k, int i) { return R(params[l * per + size_t(k) * D + i]); };
  auto U = [&](int l, int i, int k) { return R(params[l * per + size_t(r) * D + size_t(i) * r + k]); };
  auto bias = [&](int l, int i) { return double(params[l * per + size_t(2) * r * D + i]); };
  std::vector<double> x0(x0_in.size());  // what the products read
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = R(x0_in[i]);
  std::vector<std::vector<double>> xs(L + 1), hs(L), zs(L);
  xs[0] = half ? x0 : std::vector<double>(x0_in.begin(), x0_in.end());
  for (int l = 0; l < L; ++l) {
    hs[l].assign(size_t(B) * r, 0.0);
    zs[l].assign(size_t(B) * D, 0.0);
    xs[l + 1].assign(size_t(B) * D, 0.0);
    for (int64_t b = 0; b < B; ++b) {
      for (int k = 0; k < r; ++k) {
        double s = 0;
        for (int i = 0; i < D; ++i) s += R(xs[l][b * D + i]) * V(l, k, i);
        hs[l][b * r + k] = R(s);
      }
      for (int i = 0; i < D; ++i) {
        double s = 0;
        for (int k = 0; k < r; ++k) s += hs[l][b * r + k] * U(l, i, k);
        zs[l][b * D + i] = float((half ? R(s) : s) + bias(l, i));
        const double v = double(float(x0[b * D + i] * zs[l][b * D + i] + xs[l][b * D + i]));
        xs[l + 1][b * D + i] = half && l + 1 < L ? R(v) : v;  // the network's output: fp32
      }
    }
  }
  Naive n;
  n.x = xs[L];
  n.grads.assign(L * per, 0.0);
  n.dx0.assign(x0.size(), 0.0);
  std::vector<double> g(dxL.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = R(dxL[i]);
  for (int l = L - 1; l >= 0; --l) {
    std::vector<double> dz(size_t(B) * D), dh(size_t(B) * r, 0.0), gl(g);
    for (size_t i = 0; i < dz.size(); ++i) {
      dz[i] = R(float(g[i] * x0[i]));
      n.dx0[i] += g[i] * zs[l][i];
      n.grads[l * per + size_t(2) * r * D + i % D] += double(float(g[i] * x0[i]));
    }
    for (int64_t b = 0; b < B; ++b)
      for (int i = 0; i < D; ++i)
        for (int k = 0; k < r; ++k) {
          n.grads[l * per + size_t(r) * D + size_t(i) * r + k] += dz[b * D + i] * hs[l][b * r + k];
          dh[b * r + k] += dz[b * D + i] * U(l, i, k);
        }
    for (double& v : dh) v = R(v);
    for (int64_t b = 0; b < B; ++b)
      for (int k = 0; k < r; ++k)
        for (int i = 0; i < D; ++i) {
          n.grads[l * per + size_t(k) * D + i] += dh[b * r + k] * R(xs[l][b * D + i]);
          gl[b * D + i] += dh[b * r + k] * V(l, k, i);
        }
    if (l == 0) {
      // x_0 is x0: g_0 = g_1 + dh V_0 (16-bit: rounded once)
      for (size_t i = 0; i < g.size(); ++i) n.dx0[i] += R(gl[i]);
    } else {
      for (size_t i = 0; i < gl.size(); ++i) gl[i] = R(gl[i]);
      g = gl;
    }
  }
  return n;
}

void net_matches_reference(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Case {
    int dim, rank, layers;
    int64_t batch, max_batch;
    int a_cols;  // x0 and dx0 as two blocks split there; 0: one array
  };
  const Case cases[] = {{13, 4, 3, 37, 40, 0},  {13, 4, 3, 37, 40, 5},   {2, 1, 1, 1, 1, 1},   {64, 16, 2, 65, 65, 0},
                        {64, 16, 2, 65, 65, 16}, {129, 33, 3, 20, 32, 7}, {8, 3, 2, 0, 4, 4},  {24, 8, 2, 7, 7, 8}};
  for (GemmType t : {GemmType::f32, GemmType::bf16, GemmType::f16})
    for (const Case& k : cases) {
      const CrossConfig cfg{"cross_under_test", k.dim, k.rank, k.layers, t};
      std::vector<float> params = CrossNet::initial_params(k.dim, k.rank, k.layers, testing::rng()());
      // random biases too: the initialization leaves them at zero
      for (int l = 0; l < k.layers; ++l)
        for (int i = 0; i < k.dim; ++i)
          params[l * (size_t(2) * k.rank * k.dim + k.dim) + size_t(2) * k.rank * k.dim + i] =
              testing::random_floats(1, -0.5f, 0.5f)[0];
      std::vector<float> x0 = testing::random_floats(size_t(k.batch) * k.dim);
      std::vector<float> dx = testing::random_floats(size_t(k.batch) * k.dim);
      NetResult got = run_net(dev, cfg, k.max_batch, params, x0, dx, k.batch, k.a_cols);
      Naive want = naive_net(cfg, params, x0, dx, k.batch);
      // 16-bit: the reference rounds where the layers do, but a value near a rounding boundary may fall either way
      const double tol = t == GemmType::bf16 ? 2e-2 : t == GemmType::f16 ? 1e-2 : 1e-4;
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " dim " << k.dim << " rank " << k.rank
                                    << " layers " << k.layers << " batch " << k.batch << " a_cols " << k.a_cols) {
        BOOST_CHECK_EQUAL(dense_test::mismatches(got.x, want.x, tol, tol, "x_L"), 0u);
        BOOST_CHECK_EQUAL(dense_test::mismatches(got.grads, want.grads, tol, tol, "grads"), 0u);
        BOOST_CHECK_EQUAL(dense_test::mismatches(got.dx0, want.dx0, tol, tol, "dx0"), 0u);
        if (dev.is_cuda()) {
          NetResult ref = run_net(host, cfg, k.max_batch, params, x0, dx, k.batch, k.a_cols);
          BOOST_CHECK_EQUAL(testing::count_mismatches(got.x, ref.x, tol, tol, "x_L vs cpu"), 0u);
          BOOST_CHECK_EQUAL(testing::count_mismatches(got.grads, ref.grads, tol, tol, "grads vs cpu"), 0u);
          BOOST_CHECK_EQUAL(testing::count_mismatches(got.dx0, ref.dx0, tol, tol, "dx0 vs cpu"), 0u);
        }
        if (k.a_cols > 0) {  // x0 in blocks: the forward and the weights' gradients the bits of x0 in one array
          NetResult whole = run_net(dev, cfg, k.max_batch, params, x0, dx, k.batch);
          BOOST_CHECK(got.x == whole.x);
          BOOST_CHECK(got.grads == whole.grads);
        }
      }
    }
  close_device(dev);
}

// 16-bit: the network's output written straight in 16 bits (CrossNet::forward's out16, the top MLP's input) is the
// fp32 output rounded once, and the backward after it gives the same bits as after the fp32-output forward. Odd
// widths, batch 1, 7 and 65537.
void half_output(Backend be) {
  Device dev = dense_test::device_for(be);
  struct Case {
    int dim, rank, layers;
    int64_t batch;
  };
  for (GemmType t : {GemmType::bf16, GemmType::f16})
    for (const Case& k : {Case{13, 4, 3, 7}, Case{64, 16, 1, 1}, Case{24, 8, 2, 65537}}) {
      const CrossConfig cfg{"cross16", k.dim, k.rank, k.layers, t};
      const std::vector<float> params = CrossNet::initial_params(k.dim, k.rank, k.layers, testing::rng()());
      const std::vector<float> x0 = testing::random_floats(size_t(k.batch) * k.dim);
      const std::vector<float> dx = testing::random_floats(size_t(k.batch) * k.dim);
      const NetResult plain = run_net(dev, cfg, k.batch, params, x0, dx, k.batch);
      CrossNet net(dev, cfg, k.batch);
      Buffer<float> p(dev, params), xd(dev, x0), dxd(dev, dx);
      Buffer<float> grads = dense_test::poisoned(dev, net.param_count()), dx0 = dense_test::poisoned(dev, x0.size());
      Buffer<uint16_t> out16(dev, x0.size());
      out16.fill_bytes(0xFF);
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " dim " << k.dim << " batch " << k.batch) {
        BOOST_CHECK(net.forward(p.data(), xd.data(), k.batch, dev.stream, out16.data()) == nullptr);
        net.backward(p.data(), dxd.data(), grads.data(), dx0.data(), dev.stream);
        std::vector<uint16_t> want(plain.x.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = half_from_float(t)(plain.x[i]);
        BOOST_CHECK(out16.download() == want);
        BOOST_CHECK(grads.download() == plain.grads);
        BOOST_CHECK(dx0.download() == plain.dx0);
      }
    }
  close_device(dev);
}

// One layer, D = 2, rank 1: x0 = (1, 2), V = (1, 1), U = (2, -1)^T, b = (0.5, 0.5).
// h = 3, z = (6.5, -2.5), x1 = x0 ⊙ z + x0 = (7.5, -3). From dx1 = (1, 0): dz = (1, 0), db = (1, 0),
// dU = dz^T h = (3, 0)^T, dh = dz U = 2, dV = dh x0 = (2, 4), dx0 = dx1 ⊙ z + dx1 + dh V = (9.5, 2).
void hand_computed_layer(Backend be) {
  Device dev = dense_test::device_for(be);
  const CrossConfig cfg{"hand", 2, 1, 1, GemmType::f32};
  NetResult r = run_net(dev, cfg, 1, {1, 1, 2, -1, 0.5f, 0.5f}, {1, 2}, {1, 0}, 1);
  BOOST_CHECK(r.x == (std::vector<float>{7.5f, -3}));
  BOOST_CHECK(r.grads == (std::vector<float>{2, 4, 3, 0, 1, 0}));  // dV, dU, db
  BOOST_CHECK(r.dx0 == (std::vector<float>{9.5f, 2}));
  close_device(dev);
}

// The elementwise steps alone, every flag, against their formulas (computed here in the order the steps promise,
// each product and sum rounded to float): fp32 with x_l given or x0 itself, x0 and dx0 in one array or two blocks;
// 16-bit (every [batch, D] array in 16 bits, x0's gradient from several layers' terms, more than one pass of them).
// Outputs poisoned. Widths that are not multiples of 4 or 8 (the cuda kernels' one-column paths), the model's
// (3456 = 128 + 3328), batch 1 and 65537.
struct Shape {
  int64_t batch;
  int D, a_cols;  // a_cols 0: x0 in one array
};
const Shape kShapes[] = {{45, 70, 0}, {64, 72, 0}, {64, 72, 8}, {7, 70, 13}, {1, 12, 4}, {65537, 12, 4}, {3, 3456, 128}};

// x0 (or a gradient's starting values) as a step reads it: one array or two blocks.
struct Blocks {
  Buffer<float> whole, a, b;
  int a_cols = 0;
  Blocks(const Device& dev, const std::vector<float>& m, int64_t rows, int cols, int a_cols_) : a_cols(a_cols_) {
    if (a_cols == 0) {
      whole = Buffer<float>(dev, m);
    } else {
      a = Buffer<float>(dev, left_block(m, rows, cols, a_cols));
      b = Buffer<float>(dev, right_block(m, rows, cols, a_cols));
    }
  }
  CrossInput in() const { return a_cols == 0 ? CrossInput(whole.data()) : CrossInput(a.data(), b.data(), a_cols); }
  CrossInputGrad grad() {
    return a_cols == 0 ? CrossInputGrad(whole.data()) : CrossInputGrad(a.data(), b.data(), a_cols);
  }
  std::vector<float> joined(int64_t rows, int cols) const {
    return a_cols == 0 ? whole.download() : join_blocks(a.download(), b.download(), rows, cols, a_cols);
  }
};

void elementwise_steps_f32(Backend be) {
  Device dev = dense_test::device_for(be);
  for (const Shape& sh : kShapes) {
    const LinearDims d{"cross.elementwise", sh.batch, sh.D, sh.D};
    BOOST_TEST_CONTEXT(dev.name() << " batch " << d.batch << " D " << sh.D << " a_cols " << sh.a_cols) {
      const size_t n = size_t(d.batch) * d.out;
      const std::vector<float> x0 = testing::random_floats(n), xl = testing::random_floats(n),
                               g = testing::random_floats(n), prior = testing::random_floats(n),
                               z = testing::random_floats(n), bias = testing::random_floats(d.out);
      Buffer<float> zd(dev, z), xld(dev, xl), gd(dev, g), biasd(dev, bias);
      const Blocks x0b(dev, x0, d.batch, sh.D, sh.a_cols);
      for (bool residual : {true, false}) {
        Buffer<float> out = dense_test::poisoned(dev, n);
        cross_forward_elementwise(dev, d, x0b.in(), zd.data(), biasd.data(), residual ? xld.data() : nullptr,
                                  out.data(), dev.stream);
        const std::vector<float> o = out.download();
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const float zb = z[i] + bias[i % d.out];
          bad += o[i] != x0[i] * zb + (residual ? xl[i] : x0[i]);
        }
        BOOST_CHECK_MESSAGE(bad == 0, bad << " forward elements differ (residual " << residual << ")");
      }
      for (bool accumulate : {false, true})
        for (bool identity : {false, true}) {
          Buffer<float> dz = dense_test::poisoned(dev, n), db = dense_test::poisoned(dev, d.out);
          Blocks dx0(dev, prior, d.batch, sh.D, sh.a_cols);  // read when accumulating
          cross_backward_elementwise(dev, d, gd.data(), x0b.in(), zd.data(), biasd.data(), dz.data(), db.data(),
                                     dx0.grad(), accumulate, identity, dev.stream);
          std::vector<double> want_db(d.out, 0.0);
          std::vector<float> want_dz(n), want_dx0(n);
          for (size_t i = 0; i < n; ++i) {
            want_dz[i] = g[i] * x0[i];
            want_db[i % d.out] += want_dz[i];
            const float gz = g[i] * (z[i] + bias[i % d.out]);
            float v = accumulate ? prior[i] + gz : gz;
            if (identity) v += g[i];
            want_dx0[i] = v;
          }
          BOOST_TEST_CONTEXT("accumulate " << accumulate << " identity " << identity) {
            BOOST_CHECK(dz.download() == want_dz);
            BOOST_CHECK(dx0.joined(d.batch, sh.D) == want_dx0);
            BOOST_CHECK_EQUAL(dense_test::mismatches(db.download(), want_db, 1e-4, 1e-4, "db"), 0u);
          }
        }
    }
  }
  close_device(dev);
}

void elementwise_steps_half(Backend be) {
  Device dev = dense_test::device_for(be);
  for (const Shape& sh : kShapes)
    for (GemmType t : {GemmType::bf16, GemmType::f16}) {
      const LinearDims d{"cross.elementwise", sh.batch, sh.D, sh.D};
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " batch " << d.batch << " D " << sh.D
                                    << " a_cols " << sh.a_cols) {
        const size_t n = size_t(d.batch) * d.out;
        const HalfFromFloat round16 = half_from_float(t);
        auto r16 = [&](size_t count) { return dense_test::half_rounded(t, testing::random_floats(count)); };
        const std::vector<float> x0 = testing::random_floats(n), bias = testing::random_floats(d.out);
        const std::vector<float> x = dense_test::half_rounded(t, x0), xl = r16(n), z = r16(n), g = r16(n);
        Buffer<uint16_t> x16d(dev, dense_test::half_bits(t, x)), xl16d(dev, dense_test::half_bits(t, xl)),
            z16d(dev, dense_test::half_bits(t, z)), g16d(dev, dense_test::half_bits(t, g));
        Buffer<float> biasd(dev, bias);
        {  // x0's 16-bit copy, from one array or two blocks
          const Blocks x0b(dev, x0, d.batch, sh.D, sh.a_cols);
          Buffer<uint16_t> x16(dev, n);
          x16.fill_bytes(0xFF);
          cross_input_to_half(dev, d, t, x0b.in(), x16.data(), dev.stream);
          BOOST_CHECK(x16.download() == dense_test::half_bits(t, x0));
        }
        for (bool residual : {true, false})
          for (int outputs : {1, 2, 3}) {  // 16-bit, fp32, both
            Buffer<float> out = dense_test::poisoned(dev, n);
            Buffer<uint16_t> out16(dev, n);
            out16.fill_bytes(0xFF);
            cross_forward_half(dev, d, t, x16d.data(), z16d.data(), biasd.data(), residual ? xl16d.data() : nullptr,
                               outputs & 1 ? out16.data() : nullptr, outputs & 2 ? out.data() : nullptr, dev.stream);
            const std::vector<float> o = out.download();
            const std::vector<uint16_t> o16 = out16.download();
            size_t bad = 0;
            for (size_t i = 0; i < n; ++i) {
              const float want = x[i] * (z[i] + bias[i % d.out]) + (residual ? xl[i] : x[i]);
              bad += (outputs & 1) && o16[i] != round16(want);
              bad += (outputs & 2) && o[i] != want;
            }
            BOOST_CHECK_MESSAGE(bad == 0, bad << " forward elements differ (residual " << residual << ", outputs "
                                              << outputs << ")");
          }
        for (bool with_db : {true, false}) {
          Buffer<float> db = dense_test::poisoned(dev, d.out);
          Buffer<uint16_t> dz16(dev, n);
          dz16.fill_bytes(0xFF);
          cross_backward_half(dev, d, t, g16d.data(), x16d.data(), dz16.data(), with_db ? db.data() : nullptr,
                              dev.stream);
          std::vector<double> want_db(d.out, 0.0);
          std::vector<float> want_dz(n);
          for (size_t i = 0; i < n; ++i) {
            want_dz[i] = g[i] * x[i];
            want_db[i % d.out] += want_dz[i];
          }
          BOOST_CHECK(dz16.download() == dense_test::half_bits(t, want_dz));
          if (with_db) BOOST_CHECK_EQUAL(dense_test::mismatches(db.download(), want_db, 1e-4, 1e-4, "db"), 0u);
        }
        // x0's gradient from 1, 3 and 10 layers (10: two passes of at most kMaxCrossTerms)
        for (int layers : {1, 3, 10}) {
          std::vector<std::vector<float>> gs, zs, bs;
          std::vector<Buffer<uint16_t>> gd, zd;
          std::vector<Buffer<float>> bd;
          std::vector<const uint16_t*> gp, zp;
          std::vector<const float*> bp;
          for (int k = 0; k < layers; ++k) {
            gs.push_back(r16(n)), zs.push_back(r16(n)), bs.push_back(testing::random_floats(d.out));
            gd.emplace_back(dev, dense_test::half_bits(t, gs[k])), zd.emplace_back(dev, dense_test::half_bits(t, zs[k]));
            bd.emplace_back(dev, bs[k]);
          }
          for (int k = 0; k < layers; ++k) gp.push_back(gd[k].data()), zp.push_back(zd[k].data()), bp.push_back(bd[k].data());
          const std::vector<float> g0 = r16(n);
          Buffer<uint16_t> g0d(dev, dense_test::half_bits(t, g0));
          Blocks dx0(dev, testing::random_floats(n), d.batch, sh.D, sh.a_cols);  // poison: overwritten
          cross_input_grad_half(dev, d, t, gp, zp, bp, g0d.data(), dx0.grad(), dev.stream);
          std::vector<float> want(n);
          for (size_t i = 0; i < n; ++i) {
            float v = 0.f;
            for (int k = layers - 1; k >= 0; --k) {
              const float gz = gs[k][i] * (zs[k][i] + bs[k][i % d.out]);
              v = k == layers - 1 ? gz : v + gz;
            }
            want[i] = v + g0[i];
          }
          BOOST_TEST_CONTEXT("layers " << layers) { BOOST_CHECK(dx0.joined(d.batch, sh.D) == want); }
        }
      }
    }
  close_device(dev);
}

// x0 = [bottom, embeddings] as one array: every element where its index says, nothing else written.
void concat_blocks(Backend be) {
  Device dev = dense_test::device_for(be);
  for (int64_t batch : {0, 1, 37}) {
    const int a_cols = 13, b_cols = 26 * 4;
    const std::vector<float> a = testing::random_floats(size_t(batch) * a_cols),
                             b = testing::random_floats(size_t(batch) * b_cols);
    Buffer<float> ad(dev, a), bd(dev, b), x0 = dense_test::poisoned(dev, size_t(batch) * (a_cols + b_cols));
    concat_columns(dev, "cross_input", batch, ad.data(), a_cols, bd.data(), b_cols, x0.data(), dev.stream);
    BOOST_CHECK(x0.download() == join_blocks(a, b, batch, a_cols + b_cols, a_cols));
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(cross_input_concat, concat_blocks)
SPARTA_BACKEND_CASES(cross_net_matches_a_double_precision_reference, net_matches_reference)
SPARTA_BACKEND_CASES(cross_net_matches_a_hand_computed_layer, hand_computed_layer)
SPARTA_BACKEND_CASES(cross_elementwise_steps_match_their_formulas, elementwise_steps_f32)
SPARTA_BACKEND_CASES(cross_16_bit_elementwise_steps_match_their_formulas, elementwise_steps_half)
SPARTA_BACKEND_CASES(cross_net_writes_its_output_in_16_bits, half_output)

// The cpu network's gradients against central differences of its forward, through every parameter and x0.
BOOST_AUTO_TEST_CASE(cpu_cross_backward_matches_finite_differences) {
  Device dev = dense_test::device_for(Backend::cpu);
  const CrossConfig cfg{"fd", 5, 3, 2, GemmType::f32};
  const int64_t B = 3;
  std::vector<float> params = testing::random_floats(CrossNet::param_count(5, 3, 2), -0.5f, 0.5f);
  std::vector<float> x0 = testing::random_floats(size_t(B) * 5, -0.5f, 0.5f);
  const std::vector<float> r = testing::random_floats(size_t(B) * 5);
  CrossNet net(dev, cfg, B);
  auto loss = [&] {
    const float* out = net.forward(params.data(), x0.data(), B, dev.stream);
    return dense_test::weighted_sum(std::vector<float>(out, out + B * 5), r);
  };
  std::vector<float> grads(net.param_count()), dx0(x0.size());
  net.forward(params.data(), x0.data(), B, dev.stream);
  net.backward(params.data(), r.data(), grads.data(), dx0.data(), dev.stream);
  const double h = 3e-3;  // cubic in x0 over two layers: O(h^2) truncation stays below the tolerance
  BOOST_CHECK_EQUAL(dense_test::mismatches(grads, dense_test::central_differences(params, loss, h), 2e-3, 2e-3, "grads"), 0u);
  BOOST_CHECK_EQUAL(dense_test::mismatches(dx0, dense_test::central_differences(x0, loss, h), 2e-3, 2e-3, "dx0"), 0u);
}

BOOST_AUTO_TEST_CASE(cross_layout_and_errors) {
  Device dev = dense_test::device_for(Backend::cpu);
  CrossNet net(dev, CrossConfig{"dcn", 3456, 512, 3, GemmType::f32}, 1);
  BOOST_CHECK_EQUAL(net.param_count(), size_t(3) * (2 * 512 * 3456 + 3456));
  BOOST_CHECK_EQUAL(net.u_offset(0), size_t(512) * 3456);
  BOOST_CHECK_EQUAL(net.b_offset(2), net.param_count() - 3456);
  std::vector<float> init = CrossNet::initial_params(40, 8, 2, 5);
  const double limit = std::sqrt(6.0 / 48);
  bool inside = true, zero_bias = true;
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < 2 * 8 * 40; ++i) inside = inside && std::fabs(init[l * 680 + i]) <= limit;
    for (int i = 0; i < 40; ++i) zero_bias = zero_bias && init[l * 680 + 640 + i] == 0.f;
  }
  BOOST_CHECK(inside);
  BOOST_CHECK(zero_bias);
  BOOST_CHECK(init == CrossNet::initial_params(40, 8, 2, 5));

  BOOST_CHECK_EXCEPTION(CrossNet(dev, CrossConfig{"dcn", 16, 0, 3, GemmType::f32}, 4), Error,
                        (dense_test::Names{"dcn", "rank 0"}));
  BOOST_CHECK_EXCEPTION(CrossNet(dev, CrossConfig{"dcn", 16, 4, 3, GemmType::f32}, 0), Error,
                        (dense_test::Names{"dcn", "max_batch", "found 0"}));
  CrossNet small(dev, CrossConfig{"dcn_small", 4, 2, 1, GemmType::f32}, 2);
  std::vector<float> p(small.param_count()), x(12), g(small.param_count());
  BOOST_CHECK_EXCEPTION(small.backward(p.data(), x.data(), g.data(), x.data(), dev.stream), Error,
                        (dense_test::Names{"dcn_small", "before any forward"}));
  BOOST_CHECK_EXCEPTION(small.forward(p.data(), x.data(), 3, dev.stream), Error, (dense_test::Names{"dcn_small", "found 3"}));
  BOOST_CHECK_EXCEPTION(concat_columns(dev, "dcn_input", 2, x.data(), 0, x.data(), 3, x.data(), dev.stream), Error,
                        (dense_test::Names{"dcn_input", "widths 0 and 3"}));
  BOOST_CHECK_EXCEPTION(cross_forward_elementwise(dev, LinearDims{"cross.x", 1, 4, 5}, x.data(), x.data(), x.data(),
                                                  x.data(), x.data(), dev.stream),
                        Error, (dense_test::Names{"cross.x", "in == out", "found in 4, out 5"}));
  BOOST_CHECK_EXCEPTION(cross_forward_elementwise(dev, LinearDims{"cross.x", 1, 4, 4},
                                                  CrossInput(x.data(), x.data(), 4), x.data(), x.data(), nullptr,
                                                  x.data(), dev.stream),
                        Error, (dense_test::Names{"cross.x", "a_cols 4"}));
  BOOST_CHECK_EXCEPTION(small.forward(p.data(), CrossInput(x.data(), x.data(), 0), 1, dev.stream), Error,
                        (dense_test::Names{"dcn_small", "a_cols 0"}));
}
