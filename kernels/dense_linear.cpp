// dense_linear.cpp: shape checks, the CPU reference of dense_linear.h (cblas_sgemm), and the backend dispatch.
#include "kernels/dense_linear.h"

#include <cblas.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "src/base/check.h"
#include "src/base/half.h"
#include "kernels/fill.h"

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
  SPARTA_ASSERT(g.d_type == GemmType::f32 || (g.d_type == g.type && (g.beta == 0.f || g.c)),
                "layer %s: a 16-bit D needs 16-bit inputs of its type, and C apart from D for beta != 0", g.layer);
  // D in fp32: g.d itself, or a temporary rounded into the 16-bit D at the end
  std::vector<float> tmp;
  float* d = static_cast<float*>(g.d);
  if (g.d_type != GemmType::f32) {
    tmp.assign(size_t((g.n - 1) * g.ldd + g.m), 0.f);
    d = tmp.data();
  }
  if (g.c && g.beta != 0.f) {  // D = C first (widened when 16-bit), then the product is added to it
    const HalfToFloat widen = g.d_type == GemmType::f32 ? nullptr : half_to_float(g.d_type);
    const float* c32 = static_cast<const float*>(g.c);
    const uint16_t* c16 = static_cast<const uint16_t*>(g.c);
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) d[j * g.ldd + i] = widen ? widen(c16[j * g.ldd + i]) : c32[j * g.ldd + i];
  }
  if (g.k == 0) {  // an empty product: D = beta * C (BLAS implementations differ on whether they touch D here)
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) d[j * g.ldd + i] = g.beta == 0.f ? 0.f : g.beta * d[j * g.ldd + i];
  } else {
    std::vector<float> ta, tb;
    const float* a = as_floats(g.type, g.a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, ta);
    const float* b = as_floats(g.type, g.b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, tb);
    cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                int(g.m), int(g.n), int(g.k), 1.0f, a, int(g.lda), b, int(g.ldb), g.beta, d, int(g.ldd));
  }
  if (g.bias || g.relu) {
    std::vector<float> bias16;  // a 16-bit D's bias, rounded to its type
    if (g.bias && g.d_type != GemmType::f32) {
      bias16.resize(size_t(g.m));
      const HalfFromFloat round16 = half_from_float(g.d_type);
      const HalfToFloat widen = half_to_float(g.d_type);
      for (int64_t i = 0; i < g.m; ++i) bias16[i] = widen(round16(g.bias[i]));
    }
    const float* bias = bias16.empty() ? g.bias : bias16.data();
    for (int64_t j = 0; j < g.n; ++j) {
      float* col = d + j * g.ldd;
      for (int64_t i = 0; i < g.m; ++i) {
        const float v = bias ? col[i] + bias[i] : col[i];
        col[i] = g.relu && !(v > 0.f) ? 0.f : v;
      }
    }
  }
  if (g.d_type != GemmType::f32) {
    const HalfFromFloat round16 = half_from_float(g.d_type);
    uint16_t* d16 = static_cast<uint16_t*>(g.d);
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) d16[j * g.ldd + i] = round16(d[j * g.ldd + i]);
  }
}

void activation_bias_backward_cpu(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                  float* dpre, uint16_t* dpre16, float* db, float dy_scale) {
  const HalfFromFloat round16 = dpre16 ? half_from_float(t) : nullptr;
  std::vector<double> sum(db ? d.out : 0, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float v = act == Activation::relu && !(y[i] > 0.f) ? 0.f : dy[i] * dy_scale;
      if (dpre) dpre[i] = v;
      if (dpre16) dpre16[i] = round16(v);
      if (db) sum[c] += v;
    }
  }
  for (int c = 0; db && c < d.out; ++c) db[c] = static_cast<float>(sum[c]);
}

void relu_bias_backward_half_cpu(const LinearDims& d, GemmType t, const uint16_t* y16, const uint16_t* dy16,
                                 uint16_t* dpre16, float* db) {
  const HalfToFloat widen = half_to_float(t);
  std::vector<double> sum(db ? d.out : 0, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const uint16_t v = widen(y16[i]) > 0.f ? dy16[i] : uint16_t(0);
      dpre16[i] = v;
      if (db) sum[c] += double(widen(v));
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
std::atomic<bool> g_algo_search{true};
std::atomic<uint64_t> g_algo_searches{0};
}  // namespace

void set_gemm_algo_search(bool on) { g_algo_search.store(on); }
bool gemm_algo_search() { return g_algo_search.load(); }
uint64_t gemm_algo_searches() { return g_algo_searches.load(); }
void note_gemm_algo_search() { g_algo_searches.fetch_add(1); }


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

void linear_backward_data_columns(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                                  int col0, int cols, float* dx, bool accumulate, Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(col0 >= 0 && cols >= 1 && int64_t(col0) + cols <= d.in,
                 "dense layer '%s': input columns [%d, %lld) are not within its %d inputs", d.layer, col0,
                 (long long)(int64_t(col0) + cols), d.in);
  GemmCall g;  // dx^T [cols, batch] = w^T [col0 .., out] · dpre^T [out, batch]
  g.layer = d.layer, g.type = t, g.trans_a = false, g.trans_b = false;
  g.m = cols, g.n = d.batch, g.k = d.out;
  g.a = static_cast<const char*>(w) + size_t(col0) * gemm_type_bytes(t), g.lda = d.in;
  g.b = dpre, g.ldb = d.out, g.d = dx, g.ldd = cols;
  g.beta = accumulate ? 1.f : 0.f;
  run_gemm(dev, g, stream);
}

void linear_forward_half(const Device& dev, const LinearDims& d, GemmType t, const void* x, const void* w,
                         uint16_t* y16, Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(is_half(t), "dense layer '%s': a 16-bit output needs bf16 or f16 inputs, found %s", d.layer,
                 gemm_type_name(t));
  GemmCall g;  // y^T [out, batch] = w [out, in] · x^T [in, batch], in t
  g.layer = d.layer, g.type = t, g.trans_a = true, g.trans_b = false;
  g.m = d.out, g.n = d.batch, g.k = d.in;
  g.a = w, g.lda = d.in, g.b = x, g.ldb = d.in, g.d = y16, g.ldd = d.out, g.d_type = t;
  run_gemm(dev, g, stream);
}

void linear_backward_data_plus(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                               const float* addend, float* dx, Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(d.batch == 0 || (addend && addend != dx),
                 "dense layer '%s': the addend must be another array than dx", d.layer);
  GemmCall g;  // dx^T [in, batch] = w^T [in, out] · dpre^T [out, batch] + addend^T
  g.layer = d.layer, g.type = t, g.trans_a = false, g.trans_b = false;
  g.m = d.in, g.n = d.batch, g.k = d.out;
  g.a = w, g.lda = d.in, g.b = dpre, g.ldb = d.out, g.d = dx, g.ldd = d.in;
  g.beta = 1.f, g.c = addend;
  run_gemm(dev, g, stream);
}

void activation_bias_backward(const Device& dev, const LinearDims& d, GemmType t, Activation act, const float* y,
                              const float* dy, float* dpre, uint16_t* dpre16, float* db, float dy_scale,
                              Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(!dpre16 || is_half(t), "dense layer '%s': a 16-bit gradient copy needs bf16 or f16, found %s",
                 d.layer, gemm_type_name(t));
  SPARTA_REQUIRE(std::isfinite(dy_scale), "dense layer '%s': dy_scale must be finite, found %g", d.layer,
                 double(dy_scale));
  if (!dev.is_cuda()) return activation_bias_backward_cpu(d, t, act, y, dy, dpre, dpre16, db, dy_scale);
#if SPARTA_CUDA
  activation_bias_backward_cuda(d, t, act, y, dy, dpre, dpre16, db, dy_scale, stream);
#else
  SPARTA_FATAL("dense layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

namespace {

GemmCall forward_relu_half_call(const LinearDims& d, GemmType t, const void* x, const void* w, const float* b,
                                uint16_t* y16) {
  GemmCall g;  // y^T [out, batch] = relu(w [out, in] · x^T [in, batch] + b), in t
  g.layer = d.layer, g.type = t, g.trans_a = true, g.trans_b = false;
  g.m = d.out, g.n = d.batch, g.k = d.in;
  g.a = w, g.lda = d.in, g.b = x, g.ldb = d.in, g.d = y16, g.ldd = d.out, g.d_type = t;
  g.bias = b, g.relu = true;
  return g;
}

GemmCall backward_data_half_call(const LinearDims& d, GemmType t, const void* dpre, const void* w, uint16_t* dx16) {
  GemmCall g;  // dx^T [in, batch] = w^T [in, out] · dpre^T [out, batch], in t
  g.layer = d.layer, g.type = t, g.trans_a = false, g.trans_b = false;
  g.m = d.in, g.n = d.batch, g.k = d.out;
  g.a = w, g.lda = d.in, g.b = dpre, g.ldb = d.out, g.d = dx16, g.ldd = d.in, g.d_type = t;
  return g;
}

void require_half(const LinearDims& d, GemmType t) {
  SPARTA_REQUIRE(is_half(t), "dense layer '%s': the fused ReLU steps take bf16 or f16, found %s", d.layer,
                 gemm_type_name(t));
}

}  // namespace

void linear_backward_data_half(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                               uint16_t* dx16, Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(is_half(t), "dense layer '%s': a 16-bit output needs bf16 or f16 inputs, found %s", d.layer,
                 gemm_type_name(t));
  run_gemm(dev, backward_data_half_call(d, t, dpre, w, dx16), stream);
}

void linear_backward_data_half_plus(const Device& dev, const LinearDims& d, GemmType t, const void* dpre,
                                    const void* w, const uint16_t* addend16, uint16_t* dx16, Stream stream) {
  check_linear_dims(d);
  SPARTA_REQUIRE(is_half(t), "dense layer '%s': a 16-bit output needs bf16 or f16 inputs, found %s", d.layer,
                 gemm_type_name(t));
  SPARTA_REQUIRE(d.batch == 0 || (addend16 && addend16 != dx16),
                 "dense layer '%s': the addend must be another array than dx", d.layer);
  GemmCall g = backward_data_half_call(d, t, dpre, w, dx16);
  g.beta = 1.f, g.c = addend16;
  run_gemm(dev, g, stream);
}

void linear_forward_relu_half(const Device& dev, const LinearDims& d, GemmType t, const void* x, const void* w,
                              const float* b, uint16_t* y16, Stream stream) {
  check_linear_dims(d);
  require_half(d, t);
  run_gemm(dev, forward_relu_half_call(d, t, x, w, b, y16), stream);
}

void relu_bias_backward_half(const Device& dev, const LinearDims& d, GemmType t, const uint16_t* y16,
                             const uint16_t* dy16, uint16_t* dpre16, float* db, Stream stream) {
  check_linear_dims(d);
  require_half(d, t);
  if (!dev.is_cuda()) return relu_bias_backward_half_cpu(d, t, y16, dy16, dpre16, db);
#if SPARTA_CUDA
  relu_bias_backward_half_cuda(d, t, y16, dy16, dpre16, db, stream);
#else
  SPARTA_FATAL("dense layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

bool relu_half_fusion_available(const Device& dev, const LinearDims& d_below, const LinearDims& d, GemmType t,
                                Stream stream) {
  SPARTA_REQUIRE(d_below.out == d.in && d_below.batch == d.batch,
                 "dense layer '%s': fused below '%s' needs its input width (%d) to be that layer's output (%d)",
                 d.layer, d_below.layer, d.in, d_below.out);
  if (!is_half(t)) return false;
  if (!dev.is_cuda()) return true;
#if SPARTA_CUDA
  if (d.batch == 0) return true;  // nothing runs
  // the calls' shapes with 256-byte-aligned stand-ins for the buffers (what the MLP's own buffers are); the
  // heuristic reads no memory
  void* p = reinterpret_cast<void*>(uintptr_t(256));
  const float* f = static_cast<const float*>(p);
  uint16_t* h = static_cast<uint16_t*>(p);
  return gemm_available_cuda(forward_relu_half_call(d_below, t, p, p, f, h), stream) &&
         gemm_available_cuda(backward_data_half_call(d, t, p, p, h), stream);
#else
  (void)stream;
  return false;
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
