// dense_linear.cpp: shape checks, the CPU reference of dense_linear.h (cblas_sgemm), and the backend dispatch.
#include "kernels/dense_linear.h"

#include <cblas.h>

#include <climits>
#include <vector>

#include "src/base/check.h"
#include "src/base/half.h"

namespace sparta {

const char* activation_name(Activation a) { return a == Activation::relu ? "relu" : "none"; }
const char* gemm_type_name(GemmType t) {
  return t == GemmType::bf16 ? "bf16" : t == GemmType::f16 ? "f16" : "f32";
}
size_t gemm_type_bytes(GemmType t) { return is_half(t) ? 2 : 4; }

HalfFromFloat half_from_float(GemmType t) {
  SPARTA_ASSERT(is_half(t), "half_from_float of %s", gemm_type_name(t));
  return t == GemmType::f16 ? float_to_f16 : float_to_bf16;
}
HalfToFloat half_to_float(GemmType t) {
  SPARTA_ASSERT(is_half(t), "half_to_float of %s", gemm_type_name(t));
  return t == GemmType::f16 ? f16_to_float : bf16_to_float;
}

void check_linear_dims(const LinearDims& d) {
  const char* layer = d.layer ? d.layer : "linear";
  SPARTA_REQUIRE(d.batch >= 0, "dense layer '%s': batch must be >= 0, found %lld", layer,
                 static_cast<long long>(d.batch));
  SPARTA_REQUIRE(d.in >= 1 && d.out >= 1, "dense layer '%s': in and out must be >= 1, found in %d, out %d", layer,
                 d.in, d.out);
  // BLAS takes int dimensions, and the kernels index a matrix with one int64 from int products
  const int64_t widest = d.in > d.out ? d.in : d.out;
  SPARTA_REQUIRE(d.batch <= INT_MAX / widest && int64_t(d.in) * d.out <= INT_MAX,
                 "dense layer '%s': every matrix must have at most %d elements, found batch %lld x in %d x out %d",
                 layer, INT_MAX, static_cast<long long>(d.batch), d.in, d.out);
}

// ---------------------------------------------------------------------------------------------------------
// CPU reference

namespace {

// The col-major matrix of rows x cols at p (leading dimension ld) widened to fp32: a pointer to the floats.
const float* as_floats(GemmType t, const void* p, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& tmp) {
  if (t == GemmType::f32) return static_cast<const float*>(p);
  const size_t n = cols == 0 ? 0 : size_t((cols - 1) * ld + rows);
  tmp.resize(n);
  const uint16_t* h = static_cast<const uint16_t*>(p);
  const HalfToFloat widen = half_to_float(t);
  for (size_t i = 0; i < n; ++i) tmp[i] = widen(h[i]);
  return tmp.data();
}

}  // namespace

void gemm_cpu(const GemmCall& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty product: D = beta * D (BLAS implementations differ on whether they touch D here)
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) g.d[j * g.ldd + i] = g.beta == 0.f ? 0.f : g.beta * g.d[j * g.ldd + i];
  } else {
    std::vector<float> ta, tb;
    const float* a = as_floats(g.type, g.a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, ta);
    const float* b = as_floats(g.type, g.b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, tb);
    cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                int(g.m), int(g.n), int(g.k), 1.0f, a, int(g.lda), b, int(g.ldb), g.beta, g.d, int(g.ldd));
  }
  if (!g.bias && !g.relu) return;
  for (int64_t j = 0; j < g.n; ++j) {
    float* col = g.d + j * g.ldd;
    for (int64_t i = 0; i < g.m; ++i) {
      float v = g.bias ? col[i] + g.bias[i] : col[i];
      col[i] = g.relu && !(v > 0.f) ? 0.f : v;
    }
  }
}

void activation_bias_backward_cpu(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                  float* dpre, uint16_t* dpre16, float* db) {
  const HalfFromFloat round16 = dpre16 ? half_from_float(t) : nullptr;
  std::vector<double> sum(db ? d.out : 0, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float v = act == Activation::relu && !(y[i] > 0.f) ? 0.f : dy[i];
      if (dpre) dpre[i] = v;
      if (dpre16) dpre16[i] = round16(v);
      if (db) sum[c] += v;
    }
  }
  for (int c = 0; db && c < d.out; ++c) db[c] = static_cast<float>(sum[c]);
}

void to_half_cpu(GemmType t, const float* src, uint16_t* dst, size_t n) {
  const HalfFromFloat round16 = half_from_float(t);
  for (size_t i = 0; i < n; ++i) dst[i] = round16(src[i]);
}

void to_half_padded_cpu(GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld) {
  const HalfFromFloat round16 = half_from_float(t);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dst_ld; ++c) dst[r * dst_ld + c] = c < cols ? round16(src[r * cols + c]) : 0;
}

// ---------------------------------------------------------------------------------------------------------
// dispatch

namespace {

void run_gemm(const Device& dev, const GemmCall& g, Stream stream) {
  if (!dev.is_cuda()) return gemm_cpu(g);
#if SPARTA_CUDA
  gemm_cuda(g, stream);
#else
  SPARTA_FATAL("dense layer '%s' on %s in a CUDA=0 build", g.layer, dev.name().c_str());
#endif
}

}  // namespace

void linear_forward(const Device& dev, const LinearDims& d, GemmType t, Activation act, const void* x,
                    const void* w, const float* b, float* y, Stream stream) {
  check_linear_dims(d);
  GemmCall g;  // y^T [out, batch] = w [out, in] · x^T [in, batch]
  g.layer = d.layer, g.type = t, g.trans_a = true, g.trans_b = false;
  g.m = d.out, g.n = d.batch, g.k = d.in;
  g.a = w, g.lda = d.in, g.b = x, g.ldb = d.in, g.d = y, g.ldd = d.out;
  g.bias = b, g.relu = act == Activation::relu;
  run_gemm(dev, g, stream);
}

void linear_backward_weight(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* x,
                            float* dw, Stream stream) {
  check_linear_dims(d);
  GemmCall g;  // dw^T [in, out] = x^T [in, batch] · dpre [batch, out]
  g.layer = d.layer, g.type = t, g.trans_a = false, g.trans_b = true;
  g.m = d.in, g.n = d.out, g.k = d.batch;
  g.a = x, g.lda = d.in, g.b = dpre, g.ldb = d.out, g.d = dw, g.ldd = d.in;
  run_gemm(dev, g, stream);
}

void linear_backward_data(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                          float* dx, bool accumulate, Stream stream) {
  check_linear_dims(d);
  GemmCall g;  // dx^T [in, batch] = w^T [in, out] · dpre^T [out, batch]
  g.layer = d.layer, g.type = t, g.trans_a = false, g.trans_b = false;
  g.m = d.in, g.n = d.batch, g.k = d.out;
  g.a = w, g.lda = d.in, g.b = dpre, g.ldb = d.out, g.d = dx, g.ldd = d.in;
  g.beta = accumulate ? 1.f : 0.f;
  run_gemm(dev, g, stream);
}

void activation_bias_backward(const Device& dev, const LinearDims& d, GemmType t, Activation act, const float* y,
                              const float* dy, float* dpre, uint16_t* dpre16, float* db, Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(!dpre16 || is_half(t), "dense layer '%s': a 16-bit gradient copy needs bf16 or f16, found %s",
                 d.layer, gemm_type_name(t));
  if (!dev.is_cuda()) return activation_bias_backward_cpu(d, t, act, y, dy, dpre, dpre16, db);
#if SPARTA_CUDA
  activation_bias_backward_cuda(d, t, act, y, dy, dpre, dpre16, db, stream);
#else
  SPARTA_FATAL("dense layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

uint64_t scratch_epoch(const Device& dev, Stream stream) {
  if (!dev.is_cuda()) return 0;
#if SPARTA_CUDA
  return scratch_epoch_cuda(stream);
#else
  (void)stream;
  return 0;
#endif
}

void to_half(const Device& dev, GemmType t, const float* src, uint16_t* dst, size_t n, Stream stream) {
  SPARTA_REQUIRE(is_half(t), "to_half: expected bf16 or f16, found %s", gemm_type_name(t));
  if (!dev.is_cuda()) return to_half_cpu(t, src, dst, n);
#if SPARTA_CUDA
  to_half_cuda(t, src, dst, n, stream);
#else
  SPARTA_FATAL("to_half on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void to_half_padded(const Device& dev, GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst,
                    int64_t dst_ld, Stream stream) {
  SPARTA_REQUIRE(is_half(t), "to_half_padded: expected bf16 or f16, found %s", gemm_type_name(t));
  SPARTA_REQUIRE(rows >= 0 && cols >= 1 && dst_ld >= cols,
                 "to_half_padded: expected rows >= 0 and 1 <= cols <= dst_ld, found rows %lld, cols %lld, dst_ld %lld",
                 (long long)rows, (long long)cols, (long long)dst_ld);
  if (!dev.is_cuda()) return to_half_padded_cpu(t, src, rows, cols, dst, dst_ld);
#if SPARTA_CUDA
  to_half_padded_cuda(t, src, rows, cols, dst, dst_ld, stream);
#else
  SPARTA_FATAL("to_half_padded on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
