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

// The network in double from the formulas in cross_layer.h; R rounds what 16-bit GEMMs read or write in 16 bits
// (x_l, h_l, the product h U^T before the bias is added, dz, dh and the weights) to bf16 or f16, identity for fp32.
Naive naive_net(const CrossConfig& cfg, const std::vector<float>& params, const std::vector<float>& x0,
                const std::vector<float>& dxL, int64_t B) {
  const GemmType t = cfg.precision;
  auto R = [&](double v) {
    return is_half(t) ? double(half_to_float(t)(half_from_float(t)(float(v)))) : double(float(v));
  };
  const int D = cfg.dim, r = cfg.rank, L = cfg.layers;
  const size_t per = size_t(2) * r * D + D;
  auto V = [&](int l, int k, int i) { return R(params[l * per + size_t(k) * D + i]); };
  auto U = [&](int l, int i, int k) { return R(params[l * per + size_t(r) * D + size_t(i) * r + k]); };
  auto bias = [&](int l, int i) { return double(params[l * per + size_t(2) * r * D + i]); };
  std::vector<std::vector<double>> xs(L + 1), hs(L), zs(L);
  xs[0].assign(x0.begin(), x0.end());
  for (int l = 0; l < L; ++l) {
    hs[l].assign(size_t(B) * r, 0.0);
    zs[l].assign(size_t(B) * D, 0.0);
    xs[l + 1].assign(size_t(B) * D, 0.0);
    for (int64_t b = 0; b < B; ++b) {
      for (int k = 0; k < r; ++k) {
        double s = 0;
        for (int i = 0; i < D; ++i) s += R(xs[l][b * D + i]) * V(l, k, i);
        hs[l][b * r + k] = float(s);
      }
      for (int i = 0; i < D; ++i) {
        double s = 0;
        for (int k = 0; k < r; ++k) s += R(hs[l][b * r + k]) * U(l, i, k);
        zs[l][b * D + i] = float((is_half(t) ? R(s) : s) + bias(l, i));
        xs[l + 1][b * D + i] = float(double(x0[b * D + i]) * zs[l][b * D + i] + xs[l][b * D + i]);
      }
    }
  }
  Naive n;
  n.x = xs[L];
  n.grads.assign(L * per, 0.0);
  n.dx0.assign(x0.size(), 0.0);
  std::vector<double> g(dxL.begin(), dxL.end());
  for (int l = L - 1; l >= 0; --l) {
    std::vector<double> dz(size_t(B) * D), dh(size_t(B) * r, 0.0), gl(g);
    for (size_t i = 0; i < dz.size(); ++i) {
      dz[i] = double(float(g[i] * x0[i]));
      n.dx0[i] += g[i] * zs[l][i];
      n.grads[l * per + size_t(2) * r * D + i % D] += dz[i];
    }
    for (int64_t b = 0; b < B; ++b)
      for (int i = 0; i < D; ++i)
        for (int k = 0; k < r; ++k) {
          n.grads[l * per + size_t(r) * D + size_t(i) * r + k] += R(dz[b * D + i]) * R(hs[l][b * r + k]);
          dh[b * r + k] += R(dz[b * D + i]) * U(l, i, k);
        }
    for (int64_t b = 0; b < B; ++b)
      for (int k = 0; k < r; ++k)
        for (int i = 0; i < D; ++i) {
          n.grads[l * per + size_t(k) * D + i] += R(dh[b * r + k]) * R(xs[l][b * D + i]);
          gl[b * D + i] += R(dh[b * r + k]) * V(l, k, i);
        }
    g = gl;
  }
  for (size_t i = 0; i < g.size(); ++i) n.dx0[i] += g[i];  // x_0 is x0
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

// The elementwise steps alone, every flag, against their formulas (computed here in the order the steps promise:
// z + bias, times x0, plus x_l, each rounded to float): z fp32 and z in 16 bits, x_l given or x0 itself, x0 and dx0
// in one array or two blocks, dz also as nullptr beside dz16. Outputs poisoned. Widths that are not multiples of 4
// (the cuda kernels' one-column path), the model's (3456 = 128 + 3328), batch 1 and 65537.
void elementwise_steps(Backend be) {
  Device dev = dense_test::device_for(be);
  struct Shape {
    int64_t batch;
    int D, a_cols;  // a_cols 0: x0 in one array
  };
  const Shape shapes[] = {{45, 70, 0}, {64, 72, 0}, {64, 72, 8}, {7, 70, 13}, {1, 12, 4}, {65537, 12, 4}, {3, 3456, 128}};
  for (const Shape& sh : shapes)
  for (GemmType t : {GemmType::bf16, GemmType::f16})
  for (bool z_half : {false, true}) {
  const LinearDims d{"cross.elementwise", sh.batch, sh.D, sh.D};
  BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " batch " << d.batch << " D " << sh.D << " a_cols "
                                << sh.a_cols << " z " << (z_half ? "16-bit" : "fp32")) {
  const size_t n = size_t(d.batch) * d.out;
  const int a_cols = sh.a_cols;
  const std::vector<float> x0 = testing::random_floats(n), xl = testing::random_floats(n),
                           g = testing::random_floats(n), prior = testing::random_floats(n),
                           bias = testing::random_floats(d.out);
  const std::vector<float> z = z_half ? dense_test::half_rounded(t, testing::random_floats(n)) : testing::random_floats(n);
  const std::vector<uint16_t> z_bits = dense_test::half_bits(t, z);
  Buffer<float> zd(dev, z), xld(dev, xl), gd(dev, g), biasd(dev, bias);
  Buffer<uint16_t> z16d(dev, z_bits);
  const float* zp = z_half ? nullptr : zd.data();
  const uint16_t* z16p = z_half ? z16d.data() : nullptr;
  // x0 as the step reads it
  Buffer<float> x0d(dev, x0), x0a, x0b;
  CrossInput in(x0d.data());
  if (a_cols > 0) {
    x0a = Buffer<float>(dev, left_block(x0, d.batch, sh.D, a_cols));
    x0b = Buffer<float>(dev, right_block(x0, d.batch, sh.D, a_cols));
    in = CrossInput(x0a.data(), x0b.data(), a_cols);
  }
  for (bool residual : {true, false}) {
    Buffer<float> out = dense_test::poisoned(dev, n);
    Buffer<uint16_t> out16(dev, n);
    out16.fill_bytes(0xFF);
    cross_forward_elementwise(dev, d, t, in, zp, z16p, biasd.data(), residual ? xld.data() : nullptr, out.data(),
                              out16.data(), dev.stream);
    const std::vector<float> o = out.download();
    const std::vector<uint16_t> o16 = out16.download();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float zb = z[i] + bias[i % d.out];
      const float want = x0[i] * zb + (residual ? xl[i] : x0[i]);
      bad += o[i] != want || o16[i] != half_from_float(t)(want);
    }
    BOOST_CHECK_MESSAGE(bad == 0, bad << " forward elements differ (residual " << residual << ")");
  }
  {  // x0's 16-bit copy
    Buffer<uint16_t> x16(dev, n);
    x16.fill_bytes(0xFF);
    cross_input_to_half(dev, d, t, in, x16.data(), dev.stream);
    BOOST_CHECK(x16.download() == dense_test::half_bits(t, x0));
  }
  for (bool accumulate : {false, true})
    for (bool identity : {false, true}) {
      Buffer<float> dz = dense_test::poisoned(dev, n), db = dense_test::poisoned(dev, d.out);
      Buffer<uint16_t> dz16(dev, n);
      dz16.fill_bytes(0xFF);
      // dx0 starts as prior (read when accumulating), in the blocks x0 has
      auto grad_blocks = [&](Buffer<float>& whole, Buffer<float>& ga, Buffer<float>& gb) {
        whole = Buffer<float>(dev, prior);
        if (a_cols == 0) return CrossInputGrad(whole.data());
        ga = Buffer<float>(dev, left_block(prior, d.batch, sh.D, a_cols));
        gb = Buffer<float>(dev, right_block(prior, d.batch, sh.D, a_cols));
        return CrossInputGrad(ga.data(), gb.data(), a_cols);
      };
      auto joined = [&](Buffer<float>& whole, Buffer<float>& ga, Buffer<float>& gb) {
        return a_cols == 0 ? whole.download() : join_blocks(ga.download(), gb.download(), d.batch, sh.D, a_cols);
      };
      Buffer<float> dx0, dxa, dxb;
      const CrossInputGrad out_grad = grad_blocks(dx0, dxa, dxb);
      cross_backward_elementwise(dev, d, t, gd.data(), in, zp, z16p, biasd.data(), dz.data(), dz16.data(), db.data(),
                                 out_grad, accumulate, identity, dev.stream);
      const std::vector<float> got_dx0 = joined(dx0, dxa, dxb);
      {  // without the fp32 dz: the same 16-bit copy, bias gradient and dx0
        Buffer<float> db2(dev, size_t(d.out)), dx2, dx2a, dx2b;
        const CrossInputGrad out2 = grad_blocks(dx2, dx2a, dx2b);
        Buffer<uint16_t> dz16b(dev, n);
        cross_backward_elementwise(dev, d, t, gd.data(), in, zp, z16p, biasd.data(), nullptr, dz16b.data(),
                                   db2.data(), out2, accumulate, identity, dev.stream);
        BOOST_CHECK(dz16b.download() == dz16.download());
        BOOST_CHECK(db2.download() == db.download());
        BOOST_CHECK(joined(dx2, dx2a, dx2b) == got_dx0);
      }
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
        const std::vector<float> got_dz = dz.download();
        BOOST_CHECK(got_dz == want_dz);
        BOOST_CHECK(got_dx0 == want_dx0);
        BOOST_CHECK_EQUAL(dense_test::mismatches(db.download(), want_db, 1e-4, 1e-4, "db"), 0u);
        BOOST_CHECK(dz16.download() == dense_test::half_bits(t, want_dz));
      }
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
SPARTA_BACKEND_CASES(cross_elementwise_steps_match_their_formulas, elementwise_steps)
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
  BOOST_CHECK_EXCEPTION(cross_forward_elementwise(dev, LinearDims{"cross.x", 1, 4, 5}, GemmType::f32, x.data(), x.data(),
                                                  nullptr, x.data(), x.data(), x.data(), nullptr, dev.stream),
                        Error, (dense_test::Names{"cross.x", "in == out", "found in 4, out 5"}));
  BOOST_CHECK_EXCEPTION(cross_forward_elementwise(dev, LinearDims{"cross.x", 1, 4, 4}, GemmType::f32,
                                                  CrossInput(x.data(), x.data(), 4), x.data(), nullptr, x.data(),
                                                  nullptr, x.data(), nullptr, dev.stream),
                        Error, (dense_test::Names{"cross.x", "a_cols 4"}));
  BOOST_CHECK_EXCEPTION(small.forward(p.data(), CrossInput(x.data(), x.data(), 0), 1, dev.stream), Error,
                        (dense_test::Names{"dcn_small", "a_cols 0"}));
}
