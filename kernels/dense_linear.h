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

// The forward and the data gradient writing the 16-bit type t directly (the next GEMM's operand, rounded once from
// the fp32 sum; no fp32 copy): y16 [batch, out] = t(x · w^T) (no bias, no activation), dx16 [batch, in] =
// t(dpre · w). x, w, dpre of type t (bf16 or f16).
void linear_forward_half(const Device& dev, const LinearDims& d, GemmType t, const void* x, const void* w,
                         uint16_t* y16, Stream stream);
void linear_backward_data_half(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                               uint16_t* dx16, Stream stream);
// dx16 [batch, in] = t(dpre · w + addend16): linear_backward_data_half plus a 16-bit addend of type t (another
// array than dx16), added in fp32 before the one rounding.
void linear_backward_data_half_plus(const Device& dev, const LinearDims& d, GemmType t, const void* dpre,
                                    const void* w, const uint16_t* addend16, uint16_t* dx16, Stream stream);
// dx [batch, in] = dpre · w + addend (addend [batch, in] fp32, another array than dx): linear_backward_data
// accumulating onto a copy of addend, without the copy.
void linear_backward_data_plus(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                               const float* addend, float* dx, Stream stream);

// dx [batch, cols] (+)= dpre · w[:, col0 .. col0 + cols): linear_backward_data for the input columns [col0, col0 +
// cols) alone, into an array of their own (row pitch cols): an input made of blocks gets its gradient block by
// block. 0 <= col0, 1 <= cols, col0 + cols <= in. dpre and w of type t.
void linear_backward_data_columns(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                                  int col0, int cols, float* dx, bool accumulate, Stream stream);

// dpre [batch, out] = (dy · dy_scale) ⊙ act'(y) (dy · dy_scale for none; 0 where y <= 0 for relu; dy_scale 1: dy
// exactly, a dropout layer's 1 / (1 - p) after it: kernels/dense_dropout.h), and db [out] = Σ_batch dpre
// when db != nullptr; dpre16 != nullptr also receives dpre in the 16-bit type t (bf16 or f16) for 16-bit GEMMs
// (t is not read otherwise). dpre may be dy (in place), or nullptr when dpre16 is not (16-bit training: only the
// 16-bit copy is read).
void activation_bias_backward(const Device& dev, const LinearDims& d, GemmType t, Activation act, const float* y,
                              const float* dy, float* dpre, uint16_t* dpre16, float* db, float dy_scale,
                              Stream stream);

// dw [out, in] = dpre [batch, out]^T · x [batch, in]   (dpre and x of type t)
void linear_backward_weight(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* x,
                            float* dw, Stream stream);

// dx [batch, in] = dpre [batch, out] · w [out, in], or dx += that when accumulate   (dpre and w of type t)
void linear_backward_data(const Device& dev, const LinearDims& d, GemmType t, const void* dpre, const void* w,
                          float* dx, bool accumulate, Stream stream);

// cuda: the GEMMs' algorithm search (dense_linear.cu): on (the default), the first call of every kind (shape,
// types, epilogue, alignments; per stream) times up to 8 of cuBLASLt's heuristic answers on its own buffers and
// keeps the fastest of those whose outputs equal the first answer's bit for bit, logged on rank 0; off, the
// heuristic's first answer. Either way the same bits: the search changes the speed only. Process-wide;
// gemm_algo_searches counts the kinds searched so far (cpu backend, CUDA=0: always 0).
void set_gemm_algo_search(bool on);
bool gemm_algo_search();
uint64_t gemm_algo_searches();

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
// Fused ReLU steps (16-bit training; dense_mlp.h chains them). A hidden layer's forward writes its output in the
// 16-bit type t alone (the next layer's GEMM input; the bias and the ReLU in the GEMM's epilogue), the next layer's
// data gradient GEMM writes its output in t too, and one pass over the two 16-bit arrays makes the layer's
// pre-activation gradient and its bias gradient: no fp32 activation, no fp32 gradient, no conversion pass.

// y16 [batch, out] = t(relu(x · w^T + t(b))), rounded to nearest even once from the fp32 sum, the bias rounded to t
// first (cuda: cuBLASLt's RELU_BIAS epilogue with a 16-bit D, which takes the bias only in D's type; autocast
// rounds a linear's bias so too). x and w of type t (bf16 or f16).
void linear_forward_relu_half(const Device& dev, const LinearDims& d, GemmType t, const void* x, const void* w,
                              const float* b, uint16_t* y16, Stream stream);

// The ReLU + bias gradient from 16-bit arrays: dpre16 [batch, out] = dy16 where y16 > 0, else 0 (exact: no
// rounding), db [out] = Σ_batch dpre16 in fp32 (a fixed-order column sum: two runs, same bits). y16 is the
// layer's 16-bit output (linear_forward_relu_half's), dy16 its gradient in t (linear_backward_data_half's);
// dpre16 may be dy16 (in place).
void relu_bias_backward_half(const Device& dev, const LinearDims& d, GemmType t, const uint16_t* y16,
                             const uint16_t* dy16, uint16_t* dpre16, float* db, Stream stream);

// Whether the backend runs the fused steps for the layer d_below (its forward) under the layer d (its 16-bit data
// gradient), d.in == d_below.out, at batch d.batch, with 256-byte-aligned buffers (cpu: always; cuda: cuBLASLt has
// algorithms for both GEMMs). Where not, the MLP takes the separate steps above.
bool relu_half_fusion_available(const Device& dev, const LinearDims& d_below, const LinearDims& d, GemmType t,
                                Stream stream);

// ---------------------------------------------------------------------------------------------------------
// Backends. The GEMMs in column-major terms (what BLAS and cuBLASLt take): a row-major [r, c] matrix is a
// column-major [c, r] one, so every step above is one column-major GEMM without copies.
//   D [m, n] (ldd) = op(A) · op(B) + beta · C,  op(A) [m, k], op(B) [k, n]; A, B of type t; C of D's type (D
//   itself unless c is given; added in fp32 before D is rounded); D fp32 or of the 16-bit type t (d_type); bias [m] added to every column of D and relu
//   applied after it when asked (the forward's epilogue), before D is rounded to d_type; with a 16-bit D the
//   bias is rounded to d_type first (cuBLASLt takes it so).
struct GemmCall {
  const char* layer = "linear";
  GemmType type = GemmType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;            // float* for d_type f32, uint16_t* otherwise
  int64_t ldd = 0;
  GemmType d_type = GemmType::f32;
  float beta = 0.f;
  const void* c = nullptr;      // beta != 0: C when not D (D's type, ldd); a 16-bit D with beta != 0 needs it
  const float* bias = nullptr;  // [m] or nullptr
  bool relu = false;
};

uint64_t scratch_epoch_cuda(Stream stream);
void note_gemm_algo_search();  // the cuda backend counts a search

void gemm_cpu(const GemmCall& g);
void gemm_cuda(const GemmCall& g, Stream stream);
bool gemm_available_cuda(const GemmCall& g, Stream stream);  // cuBLASLt has an algorithm (heuristic only, cached)

void activation_bias_backward_cpu(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                  float* dpre, uint16_t* dpre16, float* db, float dy_scale);
void activation_bias_backward_cuda(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                   float* dpre, uint16_t* dpre16, float* db, float dy_scale, Stream stream);
void relu_bias_backward_half_cpu(const LinearDims& d, GemmType t, const uint16_t* y16, const uint16_t* dy16,
                                 uint16_t* dpre16, float* db);
void relu_bias_backward_half_cuda(const LinearDims& d, GemmType t, const uint16_t* y16, const uint16_t* dy16,
                                  uint16_t* dpre16, float* db, Stream stream);

void to_half_cpu(GemmType t, const float* src, uint16_t* dst, size_t n);
void to_half_cuda(GemmType t, const float* src, uint16_t* dst, size_t n, Stream stream);
void to_half_padded_cpu(GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld);
void to_half_padded_cuda(GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld,
                         Stream stream);

}  // namespace sparta
