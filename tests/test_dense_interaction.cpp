// kernels/interaction_dot: DLRM's dot interaction forward and backward on every backend against a
// double-precision computation in the test, cuda also against the cpu reference; the cpu reference against a
// hand-computed sample and against central finite differences of its forward; rows with a pitch and the 16-bit
// output against the unpadded fp32 passes and a separate conversion; shape errors naming the layer.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/interaction_dot.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct Result {
  std::vector<float> out, dbottom, demb;
};

Result run(const Device& dev, const InteractionDims& d, const std::vector<float>& bottom, const std::vector<float>& emb,
           const std::vector<float>& dout) {
  Buffer<float> b(dev, bottom), e(dev, emb), g(dev, dout);
  Buffer<float> out = dense_test::poisoned(dev, size_t(d.batch) * interaction_dot_width(d.slots, d.dim));
  Buffer<float> db = dense_test::poisoned(dev, bottom.size()), de = dense_test::poisoned(dev, emb.size());
  interaction_dot_forward(dev, d, b.data(), e.data(), out.data(), dev.stream);
  interaction_dot_backward(dev, d, g.data(), b.data(), e.data(), db.data(), de.data(), dev.stream);
  return {out.download(), db.download(), de.download()};
}

// The interaction written as T T^T over the (S+1) x dim matrix of each sample, in double.
struct Naive {
  std::vector<double> out, dbottom, demb;
};
Naive naive(const InteractionDims& d, const std::vector<float>& bottom, const std::vector<float>& emb,
            const std::vector<float>& dout) {
  const int n = d.slots + 1;
  const int64_t width = d.dim + int64_t(n) * d.slots / 2;
  Naive r;
  r.out.assign(size_t(d.batch) * width, 0.0);
  r.dbottom.assign(bottom.size(), 0.0);
  r.demb.assign(emb.size(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    auto T = [&](int i, int k) -> double {
      return i == 0 ? bottom[b * d.dim + k] : emb[(b * d.slots + i - 1) * d.dim + k];
    };
    std::vector<double> Z(size_t(n) * n, 0.0), dZ(size_t(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < d.dim; ++k) Z[i * n + j] += T(i, k) * T(j, k);
    int64_t p = d.dim;
    for (int k = 0; k < d.dim; ++k) r.out[b * width + k] = T(0, k);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j, ++p) {
        r.out[b * width + p] = Z[i * n + j];
        dZ[i * n + j] = dout[b * width + p];  // Z_ij = Z_ji: the pair's gradient reaches both rows
        dZ[j * n + i] = dout[b * width + p];
      }
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < d.dim; ++k) {
        double s = i == 0 ? dout[b * width + k] : 0.0;
        for (int j = 0; j < n; ++j) s += dZ[i * n + j] * T(j, k);
        if (i == 0) r.dbottom[b * d.dim + k] = s;
        else r.demb[(b * d.slots + i - 1) * d.dim + k] = s;
      }
  }
  return r;
}

void interaction_matches_reference(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  struct Shape {
    int64_t batch;
    int slots, dim;
  };
  // slots + 1 <= 32 take the streamed cuda kernels (chunks of 32 columns: {2, 3, 4000} many, {5, 31, 40} a
  // 16-byte tail with the most rows); {3, 40, 33} the tiled ones; {2, 120, 8} exceeds the tiled kernels' 48 KiB
  // both ways (the general kernels run). Dims that are not multiples of 4 take the scalar copies.
  const Shape shapes[] = {{1, 1, 1},   {37, 26, 128}, {5, 3, 17},   {0, 4, 8},   {300, 8, 64}, {3, 40, 33},
                          {2, 26, 16}, {4, 7, 6},     {2, 3, 4000}, {2, 120, 8}, {7, 26, 130}, {7, 26, 3},
                          {1, 3, 130}, {7, 1, 17},    {1, 26, 128}, {5, 31, 40}};
  // every cuda forward path is among the shapes
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(26, 128)), "tensor");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(26, 130)), "tensor");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(31, 40)), "tensor");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(3, 1024)), "tensor");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(3, 4000)), "general");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(40, 33)), "tiled");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(32, 8)), "tiled");
  BOOST_CHECK_EQUAL(std::string(interaction_dot_forward_path(120, 8)), "general");
  const size_t tiled = 48 * 1024;
  for (bool backward : {false, true}) {
    BOOST_CHECK_LE(interaction_dot_tiled_smem(40, 33, backward), tiled);
    BOOST_CHECK_GT(interaction_dot_tiled_smem(120, 8, backward), tiled);
  }
  for (const Shape& s : shapes) {
    const InteractionDims d{"interaction", s.batch, s.slots, s.dim};
    const std::vector<float> bottom = testing::random_floats(size_t(s.batch) * s.dim);
    const std::vector<float> emb = testing::random_floats(size_t(s.batch) * s.slots * s.dim);
    const std::vector<float> dout = testing::random_floats(size_t(s.batch) * interaction_dot_width(s.slots, s.dim));
    Result got = run(dev, d, bottom, emb, dout);
    Naive want = naive(d, bottom, emb, dout);
    BOOST_TEST_CONTEXT(dev.name() << " batch " << s.batch << " slots " << s.slots << " dim " << s.dim) {
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.out, want.out, 1e-4, 1e-4, "out"), 0u);
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.dbottom, want.dbottom, 1e-4, 1e-4, "dbottom"), 0u);
      BOOST_CHECK_EQUAL(dense_test::mismatches(got.demb, want.demb, 1e-4, 1e-4, "demb"), 0u);
      if (dev.is_cuda()) {
        Result ref = run(host, d, bottom, emb, dout);
        BOOST_CHECK_EQUAL(testing::count_mismatches(got.out, ref.out, 1e-4, 1e-4, "out vs cpu"), 0u);
        BOOST_CHECK_EQUAL(testing::count_mismatches(got.dbottom, ref.dbottom, 1e-4, 1e-4, "dbottom vs cpu"), 0u);
        BOOST_CHECK_EQUAL(testing::count_mismatches(got.demb, ref.demb, 1e-4, 1e-4, "demb vs cpu"), 0u);
        // the bottom output is copied, not computed
        for (int64_t b = 0; b < s.batch; ++b)
          for (int k = 0; k < s.dim; ++k)
            BOOST_CHECK_EQUAL(got.out[b * interaction_dot_width(s.slots, s.dim) + k], bottom[b * s.dim + k]);
      }
    }
  }
  close_device(dev);
}

// bottom (1, 2), embeddings (3, 4), (5, 6): pairs (1,0) = 11, (2,0) = 17, (2,1) = 39. With dout all ones,
// dT0 = T1 + T2 = (8, 10), dT1 = T0 + T2 = (6, 8), dT2 = T0 + T1 = (4, 6); dbottom adds dout's (1, 1).
void hand_computed_sample(Backend be) {
  Device dev = dense_test::device_for(be);
  const InteractionDims d{"hand", 1, 2, 2};
  Result r = run(dev, d, {1, 2}, {3, 4, 5, 6}, {1, 1, 1, 1, 1});
  BOOST_CHECK(r.out == (std::vector<float>{1, 2, 11, 17, 39}));
  BOOST_CHECK(r.dbottom == (std::vector<float>{9, 11}));
  BOOST_CHECK(r.demb == (std::vector<float>{6, 8, 4, 6}));
  // one pair's gradient alone: (2,1) reaches rows 1 and 2 only
  Result p = run(dev, d, {1, 2}, {3, 4, 5, 6}, {0, 0, 0, 0, 2});
  BOOST_CHECK(p.dbottom == (std::vector<float>{0, 0}));
  BOOST_CHECK(p.demb == (std::vector<float>{10, 12, 6, 8}));
  close_device(dev);
}

void too_large_for_shared_memory(Backend be) {
  Device dev = dense_test::device_for(be);
  // 4001 vectors of 256 floats: 4 MB per sample, beyond any GPU's shared memory
  const InteractionDims d{"huge_interaction", 1, 4000, 256};
  Buffer<float> bottom(dev, 256), emb(dev, size_t(4000) * 256);
  Buffer<float> out(dev, size_t(interaction_dot_width(4000, 256)));
  BOOST_CHECK_EXCEPTION(interaction_dot_forward(dev, d, bottom.data(), emb.data(), out.data(), dev.stream), Error,
                        (dense_test::Names{"huge_interaction", "shared memory", "expected at most"}));
  close_device(dev);
}

// Two runs give the same bits, and so do inputs and outputs that are not 16-byte aligned (the kernels' scalar
// loads and stores instead of float4: the same sums in the same order).
void deterministic_and_alignment_independent(Backend be) {
  Device dev = dense_test::device_for(be);
  for (int dim : {128, 12}) {
    const InteractionDims d{"interaction", 77, 26, dim};
    const int64_t width = interaction_dot_width(d.slots, d.dim);
    const std::vector<float> bottom = testing::random_floats(size_t(d.batch) * d.dim);
    const std::vector<float> emb = testing::random_floats(size_t(d.batch) * d.slots * d.dim);
    const std::vector<float> dout = testing::random_floats(size_t(d.batch) * width);
    Result a = run(dev, d, bottom, emb, dout), b = run(dev, d, bottom, emb, dout);
    BOOST_CHECK(a.out == b.out);
    BOOST_CHECK(a.dbottom == b.dbottom);
    BOOST_CHECK(a.demb == b.demb);
    // every array one float past a 16-byte boundary
    auto shifted = [&](const std::vector<float>& v) {
      std::vector<float> s(v.size() + 1, 0.f);
      std::copy(v.begin(), v.end(), s.begin() + 1);
      return Buffer<float>(dev, s);
    };
    Buffer<float> bb = shifted(bottom), eb = shifted(emb), gb = shifted(dout);
    Buffer<float> out = dense_test::poisoned(dev, size_t(d.batch) * width + 1);
    Buffer<float> db = dense_test::poisoned(dev, bottom.size() + 1), de = dense_test::poisoned(dev, emb.size() + 1);
    interaction_dot_forward(dev, d, bb.data() + 1, eb.data() + 1, out.data() + 1, dev.stream);
    interaction_dot_backward(dev, d, gb.data() + 1, bb.data() + 1, eb.data() + 1, db.data() + 1, de.data() + 1,
                             dev.stream);
    const std::vector<float> o = out.download(), g0 = db.download(), g1 = de.download();
    BOOST_TEST_CONTEXT(dev.name() << " dim " << dim) {
      BOOST_CHECK(std::vector<float>(o.begin() + 1, o.end()) == a.out);
      BOOST_CHECK(std::vector<float>(g0.begin() + 1, g0.end()) == a.dbottom);
      BOOST_CHECK(std::vector<float>(g1.begin() + 1, g1.end()) == a.demb);
    }
  }
  close_device(dev);
}

// Rows with a pitch (ld) and the 16-bit output: the forward's values are the unpadded fp32 forward's bits
// (16-bit: the bits to_half_padded gives from them), zeros in the padding; the backward reads dout's rows at
// the pitch (its padding NaN: unread) and gives the unpadded backward's bits. On odd shapes (batch 1, 7;
// slots 1, 3, 26; dims 3, 17, 130) and the model's, through every cuda forward path.
void pitch_and_half_output(Backend be) {
  Device dev = dense_test::device_for(be);
  struct Shape {
    int64_t batch;
    int slots, dim;
  };
  const Shape shapes[] = {{1, 1, 3},    {7, 3, 17},    {7, 26, 130}, {1, 26, 128},
                          {37, 26, 128}, {7, 26, 3},   {2, 3, 4000}, {7, 40, 33}, {2, 120, 8}};
  for (const Shape& s : shapes) {
    const int64_t width = interaction_dot_width(s.slots, s.dim);
    // the top MLP's padded rows (a multiple of 8), and 8 more where the width is one already
    const int64_t ld = (width + 7) / 8 * 8 + (width % 8 == 0 ? 8 : 0);
    const InteractionDims flat{"interaction", s.batch, s.slots, s.dim};
    const InteractionDims d{"interaction", s.batch, s.slots, s.dim, ld};
    const std::vector<float> bottom = testing::random_floats(size_t(s.batch) * s.dim);
    const std::vector<float> emb = testing::random_floats(size_t(s.batch) * s.slots * s.dim);
    const std::vector<float> dout = testing::random_floats(size_t(s.batch) * width);
    std::vector<float> dout_ld(size_t(s.batch) * ld, NAN);
    for (int64_t b = 0; b < s.batch; ++b)
      std::copy(dout.begin() + b * width, dout.begin() + (b + 1) * width, dout_ld.begin() + b * ld);
    const Result want = run(dev, flat, bottom, emb, dout);
    Buffer<float> bb(dev, bottom), eb(dev, emb), gb(dev, dout_ld), zf(dev, want.out);
    Buffer<float> out = dense_test::poisoned(dev, size_t(s.batch) * ld);
    Buffer<float> db = dense_test::poisoned(dev, bottom.size()), de = dense_test::poisoned(dev, emb.size());
    interaction_dot_forward(dev, d, bb.data(), eb.data(), out.data(), dev.stream);
    interaction_dot_backward(dev, d, gb.data(), bb.data(), eb.data(), db.data(), de.data(), dev.stream);
    std::vector<float> padded(size_t(s.batch) * ld, 0.f);
    for (int64_t b = 0; b < s.batch; ++b)
      std::copy(want.out.begin() + b * width, want.out.begin() + (b + 1) * width, padded.begin() + b * ld);
    BOOST_TEST_CONTEXT(dev.name() << " batch " << s.batch << " slots " << s.slots << " dim " << s.dim << " ld " << ld) {
      BOOST_CHECK(testing::same_bits(out.download(), padded));
      BOOST_CHECK(testing::same_bits(db.download(), want.dbottom));
      BOOST_CHECK(testing::same_bits(de.download(), want.demb));
      for (GemmType t : {GemmType::bf16, GemmType::f16}) {
        Buffer<uint16_t> h(dev, size_t(s.batch) * ld), conv(dev, size_t(s.batch) * ld);
        h.fill_bytes(0xFF);
        conv.fill_bytes(0xFF);
        interaction_dot_forward_half(dev, d, t, bb.data(), eb.data(), h.data(), dev.stream);
        to_half_padded(dev, t, zf.data(), s.batch, width, conv.data(), ld, dev.stream);
        BOOST_TEST_CONTEXT(gemm_type_name(t)) { BOOST_CHECK(h.download() == conv.download()); }
      }
    }
  }
  close_device(dev);
}

// The model's shape at a batch past 65536 (cuda: grid-stride beyond the resident blocks) against the cpu
// reference.
void large_batch_matches_cpu(Backend be) {
  Device dev = dense_test::device_for(be);
  Device host = dense_test::device_for(Backend::cpu);
  const InteractionDims d{"interaction", 65537, 26, 128, 480};
  const std::vector<float> bottom = testing::random_floats(size_t(d.batch) * d.dim);
  const std::vector<float> emb = testing::random_floats(size_t(d.batch) * d.slots * d.dim);
  const std::vector<float> dout = testing::random_floats(size_t(d.batch) * d.ld);
  auto go = [&](const Device& on, std::vector<float>* out, std::vector<uint16_t>* out16, std::vector<float>* db,
                std::vector<float>* de) {
    Buffer<float> b(on, bottom), e(on, emb), g(on, dout);
    Buffer<float> o = dense_test::poisoned(on, size_t(d.batch) * d.ld);
    Buffer<uint16_t> h(on, size_t(d.batch) * d.ld);
    h.fill_bytes(0xFF);
    Buffer<float> gb = dense_test::poisoned(on, bottom.size()), ge = dense_test::poisoned(on, emb.size());
    interaction_dot_forward(on, d, b.data(), e.data(), o.data(), on.stream);
    interaction_dot_forward_half(on, d, GemmType::bf16, b.data(), e.data(), h.data(), on.stream);
    interaction_dot_backward(on, d, g.data(), b.data(), e.data(), gb.data(), ge.data(), on.stream);
    *out = o.download(), *out16 = h.download(), *db = gb.download(), *de = ge.download();
  };
  std::vector<float> out, db, de, ref_out, ref_db, ref_de;
  std::vector<uint16_t> out16, ref16;
  go(dev, &out, &out16, &db, &de);
  go(host, &ref_out, &ref16, &ref_db, &ref_de);
  BOOST_CHECK_EQUAL(testing::count_mismatches(out, ref_out, 1e-4, 1e-4, "out"), 0u);
  BOOST_CHECK_EQUAL(testing::count_mismatches(db, ref_db, 1e-4, 1e-4, "dbottom"), 0u);
  BOOST_CHECK_EQUAL(testing::count_mismatches(de, ref_de, 1e-4, 1e-4, "demb"), 0u);
  // 16 bits: the fp32 values rounded once (a value on a rounding boundary may round one bf16 ulp apart)
  std::vector<float> w16(out16.size()), r16(ref16.size());
  for (size_t i = 0; i < out16.size(); ++i) w16[i] = bf16_to_float(out16[i]), r16[i] = bf16_to_float(ref16[i]);
  BOOST_CHECK_EQUAL(testing::count_mismatches(w16, r16, 1e-4, 1.0 / 128, "out16"), 0u);
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(interaction_rows_with_a_pitch_and_16_bit_output, pitch_and_half_output)
BOOST_AUTO_TEST_CASE(cuda_interaction_large_batch_matches_cpu, *testing::needs_gpu()) {
  large_batch_matches_cpu(Backend::cuda);
}
SPARTA_BACKEND_CASES(interaction_is_deterministic_and_alignment_independent, deterministic_and_alignment_independent)
SPARTA_BACKEND_CASES(interaction_matches_a_double_precision_reference, interaction_matches_reference)
SPARTA_BACKEND_CASES(interaction_matches_a_hand_computed_sample, hand_computed_sample)

BOOST_AUTO_TEST_CASE(cuda_interaction_rejects_samples_beyond_shared_memory, *testing::needs_gpu()) {
  too_large_for_shared_memory(Backend::cuda);
}

BOOST_AUTO_TEST_CASE(cpu_interaction_backward_matches_finite_differences) {
  Device dev = dense_test::device_for(Backend::cpu);
  const InteractionDims d{"fd", 3, 4, 5};
  const int64_t width = interaction_dot_width(d.slots, d.dim);
  std::vector<float> bottom = testing::random_floats(size_t(d.batch) * d.dim);
  std::vector<float> emb = testing::random_floats(size_t(d.batch) * d.slots * d.dim);
  const std::vector<float> r = testing::random_floats(size_t(d.batch) * width);
  auto loss = [&] {
    std::vector<float> out(size_t(d.batch) * width);
    interaction_dot_forward(dev, d, bottom.data(), emb.data(), out.data(), dev.stream);
    return dense_test::weighted_sum(out, r);
  };
  std::vector<float> db(bottom.size()), de(emb.size());
  interaction_dot_backward(dev, d, r.data(), bottom.data(), emb.data(), db.data(), de.data(), dev.stream);
  // quadratic in every input: central differences are exact up to rounding
  BOOST_CHECK_EQUAL(dense_test::mismatches(db, dense_test::central_differences(bottom, loss, 1e-2), 1e-3, 1e-3, "dbottom"), 0u);
  BOOST_CHECK_EQUAL(dense_test::mismatches(de, dense_test::central_differences(emb, loss, 1e-2), 1e-3, 1e-3, "demb"), 0u);
}

BOOST_AUTO_TEST_CASE(bad_interaction_shapes_name_the_layer) {
  Device dev = dense_test::device_for(Backend::cpu);
  std::vector<float> buf(64);
  auto fwd = [&](InteractionDims d) { interaction_dot_forward(dev, d, buf.data(), buf.data(), buf.data(), dev.stream); };
  BOOST_CHECK_EXCEPTION(fwd({"dot", 2, 0, 4}), Error, (dense_test::Names{"dot", "slots", "found 0"}));
  BOOST_CHECK_EXCEPTION(fwd({"dot", 2, 3, 0}), Error, (dense_test::Names{"dot", "dim", "found 0"}));
  BOOST_CHECK_EXCEPTION(fwd({"dot", -1, 3, 4}), Error, (dense_test::Names{"dot", "batch", "found -1"}));
  BOOST_CHECK_EXCEPTION(interaction_dot_backward(dev, {"dot_bwd", 1, 5000, 4}, buf.data(), buf.data(), buf.data(),
                                                 buf.data(), buf.data(), dev.stream),
                        Error, (dense_test::Names{"dot_bwd", "slots", "found 5000"}));
  BOOST_CHECK_EQUAL(interaction_dot_width(26, 128), 128 + 351);  // MLPerf DLRM: 479
  BOOST_CHECK_EXCEPTION(fwd({"dot_ld", 2, 3, 4, 9}), Error, (dense_test::Names{"dot_ld", "ld", "found 9"}));
  std::vector<uint16_t> h(64);
  BOOST_CHECK_EXCEPTION(interaction_dot_forward_half(dev, {"dot16", 2, 3, 4}, GemmType::f32, buf.data(), buf.data(),
                                                     h.data(), dev.stream),
                        Error, (dense_test::Names{"dot16", "16-bit", "found f32"}));
}
