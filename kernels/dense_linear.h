// dense_linear.h: the fully connected layer the dense part of DLRM and DCNv2 is built from, as GEMM steps
// over row-major matrices:
//   forward          y [batch, out] = act(x [batch, in] · w [out, in]^T + b [out])       act ∈ {none, relu}
//   activation/bias  dpre = dy ⊙ act'(y);  db [out] = Σ_batch dpre                      (relu'(0) = 0)
//   weight grad      dw [out, in] = dpre^T · x
//   data grad        dx [batch, in] (+)= dpre · w
// kernels/dense_mlp.h chains layers; kernels/cross_layer.h uses the same steps for DCNv2.
//
// Precision: the GEMMs read fp32, bf16 or fp16 (GemmType; the 16-bit types are uint16_t bits, src/base/half.h's
// formats) and always accumulate and write fp32. In 16-bit training the fp32 arrays are the masters; to_half
// makes the copies the GEMMs read, rounding to nearest even (fp16: beyond 65504 to ±inf, as IEEE does), with the
// same bits on both backends. No TF32: fp32 GEMMs are true fp32 so the cpu and cuda backends agree to rounding.
//
// cuda: cuBLASLt with the bias (+ReLU) fused into the forward GEMM as its epilogue; the activation gradient
// and the bias gradient are one fused kernel (a column sum in fixed order: two runs give the same bits).
// cpu: cblas_sgemm (OpenBLAS), 16-bit inputs widened to fp32 first (exact), so both backends multiply the same
// numbers. Every launcher takes the stream it runs on last; for cuda it is asynchronous on that stream (no
// host synchronization); for cpu it runs on the calling thread and the stream is not used.
//
// Shapes are checked: a batch < 0, a width < 1 or a product beyond 2^31 - 1 elements per matrix throws
// sparta::Error naming the layer, what was expected and what was found.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/device.h"

namespace sparta {

enum class Activation { none, relu };
enum class GemmType { f32, bf16, f16 };

// The GEMMs' 16-bit operand types: bf16 and f16.
inline bool is_half(GemmType t) { return t != GemmType::f32; }

const char* activation_name(Activation a);
const char* gemm_type_name(GemmType t);
size_t gemm_type_bytes(GemmType t);
// The host conversions of a 16-bit type t (src/base/half.h's): float → bits (rounded to nearest even) and back.
using HalfFromFloat = uint16_t (*)(float);
using HalfToFloat = float (*)(uint16_t);
HalfFromFloat half_from_float(GemmType t);  // t must be bf16 or f16
HalfToFloat half_to_float(GemmType t);

// The shape of one layer, with the name its errors carry ("bottom_mlp.0", "cross.2.V").
struct LinearDims {
  const char* layer = "linear";
  int64_t batch = 0;
  int in = 0;
  int out = 0;
};

// Throws sparta::Error unless batch >= 0, in >= 1, out >= 1 and every matrix has < 2^31 elements.
void check_linear_dims(const LinearDims& d);

// y [batch, out] = act(x [batch, in] · w [out, in]^T + b [out]); b == nullptr: no bias.
// x and w are fp32 (GemmType::f32) or 16-bit bits (GemmType::bf16, GemmType::f16), y is fp32.
void linear_forward(const Device& dev, const LinearDims& d, GemmType t, Activation act, const void* x,
                    const void* w, const float* b, float* y, Stream stream);

// dpre [batch, out] = dy ⊙ act'(y) (dy itself for none; 0 where y <= 0 for relu), and db [out] = Σ_batch dpre
// when db != nullptr; dpre16 != nullptr also receives dpre in the 16-bit type t (bf16 or f16) for 16-bit GEMMs
// (t is not read otherwise). dpre may be dy (in place), or nullptr when dpre16 is not (16-bit training: only the
// 16-bit copy is read).
void activation_bias_backward(const Device& dev, const LinearDims& d, GemmType t, Activation act, const float* y,
                              const float* dy, float* dpre, uint16_t* dpre16, float* db, Stream stream);

// dw [out, in] = dpre [batch, out]^T · x [batch, in]   (dpre and x of type t)
void linear_backward_weight(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* x,
                            float* dw, Stream stream);

// dx [batch, in] = dpre [batch, out] · w [out, in], or dx += that when accumulate   (dpre and w of type t)
void linear_backward_data(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                          float* dx, bool accumulate, Stream stream);

// A count of the times the layers' shared scratch on stream (the split reductions' partial sums) was made
// anew at another address: a CUDA graph recorded before holds the old one (cpu: always 0).
uint64_t scratch_epoch(const Device& dev, Stream stream);

// dst[i] = src[i] in the 16-bit type t (bf16 or f16), rounded to nearest even, i < n.
void to_half(const Device& dev, GemmType t, const float* src, uint16_t* dst, size_t n, Stream stream);

// The rows x cols matrix src (row pitch cols) in the 16-bit type t into dst with row pitch dst_ld >= cols, zeros in columns
// cols .. dst_ld - 1: a GEMM operand whose rows are padded to a multiple of 8 elements (16 bytes), so that
// cuBLASLt can use its aligned kernels; the zero columns add exactly nothing to the products.
void to_half_padded(const Device& dev, GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst,
                    int64_t dst_ld, Stream stream);

// ---------------------------------------------------------------------------------------------------------
// Backends. The GEMMs in column-major terms (what BLAS and cuBLASLt take): a row-major [r, c] matrix is a
// column-major [c, r] one, so every step above is one column-major GEMM without copies.
//   D [m, n] (ldd) = op(A) · op(B) + beta · D,  op(A) [m, k], op(B) [k, n]; A, B of type t; D fp32;
//   bias [m] added to every column of D and relu applied after it when asked (the forward's epilogue).
struct GemmCall {
  const char* layer = "linear";
  GemmType type = GemmType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  float* d = nullptr;
  int64_t ldd = 0;
  float beta = 0.f;
  const float* bias = nullptr;  // [m] or nullptr
  bool relu = false;
};

uint64_t scratch_epoch_cuda(Stream stream);

void gemm_cpu(const GemmCall& g);
void gemm_cuda(const GemmCall& g, Stream stream);

void activation_bias_backward_cpu(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                  float* dpre, uint16_t* dpre16, float* db);
void activation_bias_backward_cuda(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                   float* dpre, uint16_t* dpre16, float* db, Stream stream);

void to_half_cpu(GemmType t, const float* src, uint16_t* dst, size_t n);
void to_half_cuda(GemmType t, const float* src, uint16_t* dst, size_t n, Stream stream);
void to_half_padded_cpu(GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld);
void to_half_padded_cuda(GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld,
                         Stream stream);

}  // namespace sparta
