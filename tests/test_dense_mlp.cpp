// kernels/dense_mlp: forward and backward of whole MLPs (fp32 and bf16 GEMMs) on every backend against a
// double-precision chain computed in the test from the same numbers (bf16 rounding where the GEMMs read
// bf16), cuda also against the cpu reference; parameter layout and initialization; errors naming the MLP.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "kernels/dense_dropout.h"
#include "kernels/dense_mlp.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct MlpResult {
  std::vector<float> y, grads, dx;
};

// dropout_key: a training step's key (dropout, when cfg has it), or 0: a forward without one.
MlpResult run_mlp(const Device& dev, const MlpConfig& cfg, int64_t max_batch, const std::vector<float>& params,
                  const std::vector<float>& x, const std::vector<float>& dy, int64_t batch,
                  uint64_t dropout_key = 0) {
  Mlp mlp(dev, cfg, max_batch);
  Buffer<float> p(dev, params), xd(dev, x), dyd(dev, dy);
  Buffer<float> grads = dense_test::poisoned(dev, mlp.param_count());
  Buffer<float> dx = dense_test::poisoned(dev, size_t(batch) * mlp.in_width());
  Buffer<uint64_t> key(dev, std::vector<uint64_t>{dropout_key});
  const float* y = mlp.forward(p.data(), xd.data(), batch, dev.stream, dropout_key ? key.data() : nullptr);
  MlpResult r;
  r.y.resize(size_t(batch) * mlp.out_width());
  copy_to_host(dev, r.y.data(), y, r.y.size() * sizeof(float));
  mlp.backward(p.data(), dyd.data(), grads.data(), dx.data(), dev.stream);
  r.grads = grads.download();
  r.dx = dx.download();
  return r;
}

struct Chain {
  std::vector<double> y, grads, dx;
  // Each value's scale: the sum of its terms' magnitudes, through the whole chain (a 16-bit GEMM's rounding
  // error is a fraction of it, not of the value, which a sum of terms of both signs can make far smaller).
  std::vector<double> y_scale, grads_scale, dx_scale;
  // What a ReLU unit whose pre-activation lies within near_zero of its scale from 0 may add or leave out of each
  // gradient: the code sums in another order (and a 16-bit rounding tie below may fall the other way), so such a
  // unit's sign is the code's to decide.
  std::vector<double> grads_unsure, dx_unsure;
};

// The MLP in double, from the layer formulas; R rounds what a 16-bit GEMM reads (identity for fp32), at the
// places the MLP rounds: the input, the weights, each saved activation, each pre-activation gradient. With a
// dropout key and cfg.dropout > 0, a hidden output is dropped where dense_dropout.h's hash says (the mask's
// definition), kept ones and their gradients times the fp32 1 / (1 - p).
Chain naive_mlp(const MlpConfig& cfg, const std::vector<float>& params, const std::vector<float>& x,
                const std::vector<float>& dy, int64_t B, uint64_t dropout_key = 0, double near_zero = 0.0) {
  const bool drop = dropout_key != 0 && cfg.dropout > 0.f;
  const uint32_t threshold = uint32_t(std::lround(double(cfg.dropout) * 16777216.0));
  const float scale = 1.f / (1.f - cfg.dropout);
  const GemmType t = cfg.precision;
  auto R = [&](double v) {
    return is_half(t) ? double(half_to_float(t)(half_from_float(t)(float(v)))) : double(float(v));
  };
  const int L = int(cfg.sizes.size()) - 1;
  std::vector<size_t> off(L);
  size_t at = 0;
  for (int l = 0; l < L; ++l) off[l] = at, at += size_t(cfg.sizes[l]) * cfg.sizes[l + 1] + cfg.sizes[l + 1];
  auto W = [&](int l, int o, int i) { return R(params[off[l] + size_t(o) * cfg.sizes[l] + i]); };
  // a 16-bit hidden layer whose output the next layer reads unpadded takes the fused ReLU steps without dropout:
  // its bias rounded to 16 bits (dense_linear.h's linear_forward_relu_half)
  auto fused = [&](int l) { return is_half(t) && !drop && l < L - 1 && cfg.sizes[l + 1] % 8 == 0; };
  auto bias = [&](int l, int o) {
    const double b = params[off[l] + size_t(cfg.sizes[l]) * cfg.sizes[l + 1] + o];
    return fused(l) ? R(b) : b;
  };
  // in[l]: what layer l reads (rounded), ys[l]: its output; in_scale[l], ys_scale[l]: their scales
  std::vector<std::vector<double>> in(L + 1), ys(L), in_scale(L + 1), ys_scale(L);
  std::vector<std::vector<char>> unsure(L);  // a kept ReLU unit whose pre-activation is within near_zero of 0
  in[0].resize(x.size());
  in_scale[0].resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) in_scale[0][i] = std::fabs(in[0][i] = R(x[i]));
  for (int l = 0; l < L; ++l) {
    const int n_in = cfg.sizes[l], n_out = cfg.sizes[l + 1];
    const bool relu = l < L - 1 || cfg.relu_last;
    ys[l].assign(size_t(B) * n_out, 0.0);
    ys_scale[l].assign(size_t(B) * n_out, 0.0);
    unsure[l].assign(size_t(B) * n_out, 0);
    for (int64_t r = 0; r < B; ++r)
      for (int o = 0; o < n_out; ++o) {
        double s = bias(l, o), sa = std::fabs(s);
        for (int i = 0; i < n_in; ++i) {
          s += in[l][r * n_in + i] * W(l, o, i);
          sa += in_scale[l][r * n_in + i] * std::fabs(W(l, o, i));
        }
        const bool keep = !(drop && l < L - 1) ||
                          dropout_keeps(dropout_key, uint64_t(l), uint64_t(r * n_out + o), threshold);
        unsure[l][r * n_out + o] = relu && keep && std::fabs(s) <= near_zero * sa;
        if (relu && s < 0) s = 0;
        if (drop && l < L - 1) {
          s = keep ? float(s) * scale : 0.f;
          sa *= keep ? scale : 0.f;
        }
        ys[l][r * n_out + o] = float(s);  // the MLP saves fp32 activations
        ys_scale[l][r * n_out + o] = sa;
      }
    in[l + 1].resize(ys[l].size());
    for (size_t i = 0; i < ys[l].size(); ++i) in[l + 1][i] = R(float(ys[l][i]));
    in_scale[l + 1] = ys_scale[l];
  }
  Chain c;
  c.y = ys[L - 1];
  c.y_scale = ys_scale[L - 1];
  c.grads.assign(at, 0.0);
  c.grads_scale.assign(at, 0.0);
  c.grads_unsure.assign(at, 0.0);
  // g: the gradient reaching the layer's output; ga: its scale; gu: what unsure units above may change in it
  std::vector<double> g(dy.begin(), dy.end()), ga(dy.size()), gu(dy.size(), 0.0);
  for (size_t i = 0; i < dy.size(); ++i) ga[i] = std::fabs(dy[i]);
  for (int l = L - 1; l >= 0; --l) {
    const int n_in = cfg.sizes[l], n_out = cfg.sizes[l + 1];
    const bool relu = l < L - 1 || cfg.relu_last;
    std::vector<double> dpre(g.size()), dpre_scale(g.size()), dpre_unsure(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const float dy_scale = drop && l < L - 1 ? scale : 1.f;
      const bool masked = relu && !(ys[l][i] > 0);
      const double v = masked ? 0.0 : double(float(g[i]) * dy_scale);
      dpre_scale[i] = masked ? 0.0 : ga[i] * dy_scale;
      dpre_unsure[i] = unsure[l][i] ? (ga[i] + gu[i]) * dy_scale : masked ? 0.0 : gu[i] * dy_scale;
      const size_t b = off[l] + size_t(n_in) * n_out + i % n_out;
      c.grads[b] += v;
      c.grads_scale[b] += dpre_scale[i];
      c.grads_unsure[b] += dpre_unsure[i];
      dpre[i] = R(v);
    }
    std::vector<double> gin(size_t(B) * n_in, 0.0), gin_scale(size_t(B) * n_in, 0.0), gin_unsure(gin.size(), 0.0);
    for (int64_t r = 0; r < B; ++r)
      for (int o = 0; o < n_out; ++o)
        for (int i = 0; i < n_in; ++i) {
          const size_t ro = r * n_out + o, ri = r * n_in + i;
          c.grads[off[l] + size_t(o) * n_in + i] += dpre[ro] * in[l][ri];
          c.grads_scale[off[l] + size_t(o) * n_in + i] += dpre_scale[ro] * in_scale[l][ri];
          c.grads_unsure[off[l] + size_t(o) * n_in + i] += dpre_unsure[ro] * in_scale[l][ri];
          gin[ri] += dpre[ro] * W(l, o, i);
          gin_scale[ri] += dpre_scale[ro] * std::fabs(W(l, o, i));
          gin_unsure[ri] += dpre_unsure[ro] * std::fabs(W(l, o, i));
        }
    g = gin;
    ga = gin_scale;
    gu = gin_unsure;
  }
  c.dx = g;
  c.dx_scale = ga;
  c.dx_unsure = gu;
  return c;
}

// Elements of got further from want than times (tol + tol |want| + scale_tol scale + unsure) (scale and unsure:
// Chain's, for each element; an empty unsure: none): printed (the first few) and counted.
template <class Want>
size_t mismatches(const std::vector<float>& got, const std::vector<Want>& want, const std::vector<double>& scale,
                  const std::vector<double>& unsure, double tol, double scale_tol, const std::string& what,
                  double times = 1) {
  if (got.size() != want.size() || scale.size() != want.size() || (!unsure.empty() && unsure.size() != want.size())) {
    BOOST_ERROR(what << ": size " << got.size() << ", expected " << want.size());
    return std::max(got.size(), want.size());
  }
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double u = unsure.empty() ? 0.0 : unsure[i];
    const double w = want[i];
    if (!(std::fabs(got[i] - w) <= times * (tol + tol * std::fabs(w) + scale_tol * scale[i] + u))) {
      if (bad < 5)
        BOOST_TEST_MESSAGE(what << "[" << i << "] = " << got[i] << ", expected " << w << " (scale " << scale[i]
                                << ", unsure " << u << ")");
      ++bad;
    }
  }
  return bad;
}

void mlp_matches_reference(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Case {
    std::vector<int> sizes;
    bool relu_last;
    int64_t batch, max_batch;
  };
  const Case cases[] = {{{13, 64, 32, 1}, false, 37, 50}, {{5, 8}, true, 1, 1}, {{16, 48, 24, 7}, true, 64, 64},
                        {{13, 512, 256, 128}, true, 20, 33}, {{9, 4, 3}, false, 0, 5},
                        // DLRM's top MLP input width (bf16: its GEMMs run padded to 480, the gradients copied back)
                        {{479, 32, 1}, false, 70, 80}};
  for (GemmType t : {GemmType::f32, GemmType::bf16, GemmType::f16})
    for (const Case& k : cases)
    for (float p : {0.f, 0.3f}) {  // without and with dropout (a training forward's key)
      MlpConfig cfg;
      cfg.name = "mlp_under_test";
      cfg.sizes = k.sizes;
      cfg.relu_last = k.relu_last;
      cfg.precision = t;
      cfg.dropout = p;
      const uint64_t key = p > 0.f ? testing::rng()() | 1 : 0;
      std::vector<float> params = Mlp::initial_params(k.sizes, testing::rng()());
      std::vector<float> x = testing::random_floats(size_t(k.batch) * k.sizes.front());
      std::vector<float> dy = testing::random_floats(size_t(k.batch) * k.sizes.back());
      MlpResult got = run_mlp(dev, cfg, k.max_batch, params, x, dy, k.batch, key);
      // 16-bit: a value at a rounding boundary may fall either way, and the rounding of the terms of a sum
      // (half an ulp, 2^-9 of each for bf16) adds up to a fraction of their magnitudes' sum, the value's scale;
      // a pre-activation that close to 0 may take either sign
      const double tol = is_half(t) ? 1e-2 : 1e-4, scale_tol = is_half(t) ? 4e-3 : 1e-6;
      Chain want = naive_mlp(cfg, params, x, dy, k.batch, key, is_half(t) ? scale_tol : 1e-5);
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " sizes[0] " << k.sizes[0] << " layers "
                                    << k.sizes.size() - 1 << " batch " << k.batch << " dropout " << p) {
        BOOST_CHECK_EQUAL(mismatches(got.y, want.y, want.y_scale, {}, tol, scale_tol, "y"), 0u);
        BOOST_CHECK_EQUAL(mismatches(got.grads, want.grads, want.grads_scale, want.grads_unsure, tol, scale_tol, "grads"),
                          0u);
        BOOST_CHECK_EQUAL(mismatches(got.dx, want.dx, want.dx_scale, want.dx_unsure, tol, scale_tol, "dx"), 0u);
        if (dev.is_cuda()) {
          // each within its bound of the chain, so within twice that of each other
          MlpResult ref = run_mlp(host, cfg, k.max_batch, params, x, dy, k.batch, key);
          BOOST_CHECK_EQUAL(mismatches(got.y, ref.y, want.y_scale, {}, tol, scale_tol, "y vs cpu", 2), 0u);
          BOOST_CHECK_EQUAL(mismatches(got.grads, ref.grads, want.grads_scale, want.grads_unsure, tol, scale_tol,
                                       "grads vs cpu", 2),
                            0u);
          BOOST_CHECK_EQUAL(
              mismatches(got.dx, ref.dx, want.dx_scale, want.dx_unsure, tol, scale_tol, "dx vs cpu", 2), 0u);
        }
      }
    }
  close_device(dev);
}

// Two forwards of different batches through one MLP, and a backward without dx: buffers sized by max_batch
// serve every batch up to it, and the second backward uses the second forward's activations.
void mlp_reuses_its_buffers(Backend be) {
  Device dev = dense_test::device_for(be);
  MlpConfig cfg;
  cfg.sizes = {6, 10, 3};
  Mlp mlp(dev, cfg, 40);
  std::vector<float> params = Mlp::initial_params(cfg.sizes, 7);
  Buffer<float> p(dev, params), grads = dense_test::poisoned(dev, mlp.param_count());
  for (int64_t batch : {40, 9}) {
    std::vector<float> x = testing::random_floats(size_t(batch) * 6), dy = testing::random_floats(size_t(batch) * 3);
    Buffer<float> xd(dev, x), dyd(dev, dy);
    mlp.forward(p.data(), xd.data(), batch, dev.stream);
    mlp.backward(p.data(), dyd.data(), grads.data(), nullptr, dev.stream);
    Chain want = naive_mlp(cfg, params, x, dy, batch);
    BOOST_CHECK_EQUAL(dense_test::mismatches(grads.download(), want.grads, 1e-4, 1e-4, "grads"), 0u);
  }
  close_device(dev);
}

// backward_data with the input's gradient in 16 bits (dx16, what a 16-bit cross network reads) against the fp32
// dx of the same MLP and numbers: cpu bit for bit its rounding, cuda within the GEMMs' rounding; the parameters'
// gradients the same bits either way. Batches 1, 7, 65537; fp32 precision refuses dx16, naming the MLP.
void input_gradient_in_16_bits(Backend be) {
  Device dev = dense_test::device_for(be);
  for (GemmType t : {GemmType::bf16, GemmType::f16})
    for (int64_t batch : {1, 7, 65537}) {
      MlpConfig cfg;
      cfg.name = "top16";
      cfg.sizes = {24, 16, 8, 1};
      cfg.precision = t;
      const std::vector<float> params = Mlp::initial_params(cfg.sizes, testing::rng()());
      const std::vector<float> x = testing::random_floats(size_t(batch) * 24), dy = testing::random_floats(size_t(batch));
      Buffer<float> p(dev, params), xd(dev, x), dyd(dev, dy);
      Mlp a(dev, cfg, batch), b(dev, cfg, batch);
      Buffer<float> ga = dense_test::poisoned(dev, a.param_count()), gb = dense_test::poisoned(dev, b.param_count());
      Buffer<float> dx = dense_test::poisoned(dev, size_t(batch) * 24);
      Buffer<uint16_t> dx16(dev, size_t(batch) * 24);
      dx16.fill_bytes(0xFF);
      a.forward(p.data(), xd.data(), batch, dev.stream);
      a.backward_data(p.data(), dyd.data(), ga.data(), dx.data(), dev.stream);
      a.backward_weights(ga.data(), dev.stream);
      b.forward(p.data(), xd.data(), batch, dev.stream);
      b.backward_data(p.data(), dyd.data(), gb.data(), nullptr, dev.stream, false, dx16.data());
      b.backward_weights(gb.data(), dev.stream);
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " batch " << batch) {
        BOOST_CHECK(ga.download() == gb.download());
        const std::vector<float> want = dx.download();
        const std::vector<uint16_t> got = dx16.download();
        if (!dev.is_cuda()) {
          BOOST_CHECK(got == dense_test::half_bits(t, want));
        } else {
          std::vector<float> widened(got.size());
          for (size_t i = 0; i < got.size(); ++i) widened[i] = half_to_float(t)(got[i]);
          const double tol = t == GemmType::bf16 ? 1.6e-2 : 2e-3;
          BOOST_CHECK_EQUAL(testing::count_mismatches(widened, want, tol, tol, "dx16"), 0u);
        }
      }
    }
  MlpConfig f32;
  f32.name = "top32";
  f32.sizes = {8, 4};
  Mlp m(dev, f32, 2);
  Buffer<float> p(dev, Mlp::initial_params(f32.sizes, 3)), x(dev, testing::random_floats(16)),
      g(dev, m.param_count());
  Buffer<uint16_t> dx16(dev, 16);
  m.forward(p.data(), x.data(), 2, dev.stream);
  BOOST_CHECK_EXCEPTION(m.backward_data(p.data(), x.data(), g.data(), nullptr, dev.stream, false, dx16.data()),
                        Error,
                        (dense_test::Names{"top32", "16-bit input gradient"}));
  close_device(dev);
}

// The dropout pass on its own: every element as the mask's definition says (dropped: 0; kept: y times the fp32
// 1 / (1 - p), bit for bit), about p of them dropped, p = 0 the identity; the key read from memory when the pass
// runs (a new key in the same buffer, as a replayed graph sees it, drops other elements); cuda bit for bit
// against the cpu reference. Shapes: one row, odd widths, and 65537 rows.
void dropout_pass(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Shape {
    int64_t rows;
    int cols;
  };
  for (const Shape sh : {Shape{1, 7}, Shape{7, 1024}, Shape{65537, 13}, Shape{0, 5}})
    for (float p : {0.f, 0.1f, 0.5f, 0.9f}) {
      const size_t n = size_t(sh.rows) * sh.cols;
      const std::vector<float> y0 = testing::random_floats(n, 0.01f, 2.f);  // ReLU outputs: positive
      const uint64_t k1 = testing::rng()(), k2 = k1 ^ 0x9e3779b97f4a7c15ull;
      Buffer<uint64_t> key(dev, std::vector<uint64_t>{k1});
      Buffer<float> y(dev, y0);
      const DropoutArgs a{p, key.data(), 3};
      dropout_forward(dev, "top_mlp.1", a, y.data(), sh.rows, sh.cols, dev.stream);
      const std::vector<float> got1 = y.download();
      key.upload(std::vector<uint64_t>{k2});
      y.upload(y0);
      dropout_forward(dev, "top_mlp.1", a, y.data(), sh.rows, sh.cols, dev.stream);
      const std::vector<float> got2 = y.download();
      const uint32_t threshold = uint32_t(std::lround(double(p) * 16777216.0));
      const float scale = 1.f / (1.f - p);
      size_t bad = 0, dropped = 0, differ = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool keep1 = dropout_keeps(k1, 3, i, threshold), keep2 = dropout_keeps(k2, 3, i, threshold);
        bad += got1[i] != (keep1 ? y0[i] * scale : 0.f);
        bad += got2[i] != (keep2 ? y0[i] * scale : 0.f);
        dropped += got1[i] == 0.f;
        differ += keep1 != keep2;
      }
      BOOST_TEST_CONTEXT(dev.name() << " rows " << sh.rows << " cols " << sh.cols << " p " << p) {
        BOOST_CHECK_EQUAL(bad, 0u);
        if (p == 0.f) BOOST_CHECK(got1 == y0);
        if (n > 10000) {  // the dropped fraction within 5 standard deviations of p; the second key's mask is new
          const double sd = std::sqrt(double(p) * (1 - p) / double(n));
          BOOST_CHECK_LE(std::fabs(double(dropped) / double(n) - p), 5 * sd + 1e-12);
          if (p > 0.f) BOOST_CHECK_GT(differ, 0u);
        }
        if (dev.is_cuda()) {
          Buffer<uint64_t> hkey(host, std::vector<uint64_t>{k1});
          std::vector<float> ref = y0;
          dropout_forward(host, "top_mlp.1", DropoutArgs{p, hkey.data(), 3}, ref.data(), sh.rows, sh.cols,
                          host.stream);
          BOOST_CHECK(ref == got1);
        }
      }
    }
  Buffer<uint64_t> key(dev, std::vector<uint64_t>{1});
  Buffer<float> y(dev, 4);
  BOOST_CHECK_EXCEPTION(dropout_forward(dev, "top_mlp.0", DropoutArgs{1.f, key.data(), 0}, y.data(), 1, 4, dev.stream),
                        Error, (dense_test::Names{"top_mlp.0", "dropout", "found 1"}));
  close_device(dev);
}

// A producer's input in input16_padded() (its padding zero) gives the bits the fp32 input gives, and a dx taken
// padded (dx_padded) holds the bits of the unpadded dx in its first in_width columns, with the same gradients:
// 16-bit MLPs of an input width that is not a multiple of 8 (DLRM's top MLP reads 479) and of one that is.
void padded_input_and_dx(Backend be) {
  Device dev = dense_test::device_for(be);
  for (GemmType t : {GemmType::bf16, GemmType::f16})
    for (int in : {13, 16}) {
      MlpConfig c;
      c.name = "top_mlp";
      c.sizes = {in, 24, 8, 1};
      c.precision = t;
      const int64_t batch = 7;
      Mlp a(dev, c, 9), b(dev, c, 9);
      const int ld = b.input_ld();
      BOOST_CHECK_EQUAL(ld, (in + 7) / 8 * 8);
      BOOST_CHECK(b.input16_padded() != nullptr);
      Buffer<float> params(dev, Mlp::initial_params(c.sizes, 5));
      const std::vector<float> xs = testing::random_floats(size_t(batch) * in);
      const std::vector<float> dys = testing::random_floats(size_t(batch));
      Buffer<float> x(dev, xs), dy(dev, dys);
      Buffer<float> ga = dense_test::poisoned(dev, a.param_count()), gb = dense_test::poisoned(dev, b.param_count());
      Buffer<float> dxa = dense_test::poisoned(dev, size_t(batch) * in), dxb = dense_test::poisoned(dev, size_t(batch) * ld);
      std::vector<float> ya(batch), yb(batch);
      copy_to_host(dev, ya.data(), a.forward(params.data(), x.data(), batch, dev.stream), batch * sizeof(float));
      to_half_padded(dev, t, x.data(), batch, in, b.input16_padded(), ld, dev.stream);
      copy_to_host(dev, yb.data(), b.forward(params.data(), nullptr, batch, dev.stream), batch * sizeof(float));
      a.backward_data(params.data(), dy.data(), ga.data(), dxa.data(), dev.stream);
      a.backward_weights(ga.data(), dev.stream);
      b.backward_data(params.data(), dy.data(), gb.data(), dxb.data(), dev.stream, true);
      b.backward_weights(gb.data(), dev.stream);
      const std::vector<float> da = dxa.download(), db = dxb.download();
      std::vector<float> db_rows(size_t(batch) * in);
      for (int64_t r = 0; r < batch; ++r)
        for (int k = 0; k < in; ++k) db_rows[r * in + k] = db[r * ld + k];
      BOOST_TEST_CONTEXT(dev.name() << " " << gemm_type_name(t) << " in " << in) {
        BOOST_CHECK(testing::same_bits(ya, yb));
        BOOST_CHECK(testing::same_bits(ga.download(), gb.download()));
        BOOST_CHECK(testing::same_bits(da, db_rows));
      }
    }
  MlpConfig f;
  f.sizes = {13, 4, 1};
  Mlp m(dev, f, 2);
  BOOST_CHECK(m.input16_padded() == nullptr);
  BOOST_CHECK_EQUAL(m.input_ld(), 13);
  BOOST_CHECK_EXCEPTION(m.forward(nullptr, nullptr, 1, dev.stream), Error, (dense_test::Names{"mlp", "16-bit", "f32"}));
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(mlp_takes_a_padded_16_bit_input_and_gives_a_padded_dx, padded_input_and_dx)
SPARTA_BACKEND_CASES(dropout_pass_matches_its_definition, dropout_pass)
SPARTA_BACKEND_CASES(mlp_matches_a_double_precision_chain, mlp_matches_reference)
SPARTA_BACKEND_CASES(mlp_serves_any_batch_up_to_max_batch, mlp_reuses_its_buffers)
SPARTA_BACKEND_CASES(mlp_gives_its_input_gradient_in_16_bits, input_gradient_in_16_bits)

BOOST_AUTO_TEST_CASE(mlp_layout_and_initialization) {
  const std::vector<int> sizes{13, 512, 256, 128};
  BOOST_CHECK_EQUAL(Mlp::param_count(sizes), size_t(13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128));
  Mlp mlp(dense_test::device_for(Backend::cpu), MlpConfig{"bottom", sizes, true, GemmType::f32}, 4);
  BOOST_CHECK_EQUAL(mlp.weight_offset(0), 0u);
  BOOST_CHECK_EQUAL(mlp.bias_offset(0), size_t(13 * 512));
  BOOST_CHECK_EQUAL(mlp.weight_offset(1), size_t(13 * 512 + 512));
  BOOST_CHECK_EQUAL(mlp.bias_offset(2), Mlp::param_count(sizes) - 128);
  // deterministic by seed, different across seeds, with the spread DLRM asks for
  std::vector<float> a = Mlp::initial_params(sizes, 11), b = Mlp::initial_params(sizes, 11), c = Mlp::initial_params(sizes, 12);
  BOOST_CHECK(a == b);
  BOOST_CHECK(a != c);
  double sq = 0;
  for (size_t i = mlp.weight_offset(1); i < mlp.bias_offset(1); ++i) sq += double(a[i]) * a[i];
  const double sd = std::sqrt(sq / (512.0 * 256)), want = std::sqrt(2.0 / (512 + 256));
  BOOST_CHECK_CLOSE(sd, want, 3.0);  // 131072 draws: within 3%
}

BOOST_AUTO_TEST_CASE(mlp_errors_name_the_mlp) {
  Device dev = dense_test::device_for(Backend::cpu);
  BOOST_CHECK_EXCEPTION(Mlp(dev, MlpConfig{"top", {13}, false, GemmType::f32}, 8), Error,
                        (dense_test::Names{"top", "found 1 sizes"}));
  BOOST_CHECK_EXCEPTION(Mlp(dev, MlpConfig{"top", {13, 0, 1}, false, GemmType::f32}, 8), Error,
                        (dense_test::Names{"top", "sizes[1]", "found 0"}));
  BOOST_CHECK_EXCEPTION(Mlp(dev, MlpConfig{"top", {13, 4}, false, GemmType::f32}, 0), Error,
                        (dense_test::Names{"top", "max_batch", "found 0"}));
  Mlp mlp(dev, MlpConfig{"bottom", {3, 2}, true, GemmType::f32}, 8);
  std::vector<float> p(mlp.param_count()), x(27), g(mlp.param_count());
  BOOST_CHECK_EXCEPTION(mlp.backward(p.data(), x.data(), g.data(), nullptr, dev.stream), Error,
                        (dense_test::Names{"bottom", "before any forward"}));
  BOOST_CHECK_EXCEPTION(mlp.forward(p.data(), x.data(), 9, dev.stream), Error, (dense_test::Names{"bottom", "[0, 8]", "found 9"}));
}
