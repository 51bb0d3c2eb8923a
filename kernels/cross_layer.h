// cross_layer.h: DCNv2's low-rank cross network (MLPerf DLRM-DCNv2: 3 layers, rank 512) over
// x0 [batch, D] = [bottom output, flattened pooled embeddings].
//
// Layer l, with V_l [rank, D], U_l [D, rank], b_l [D]:
//   h_l = x_l V_l^T                [batch, rank]
//   z_l = h_l U_l^T + b_l          [batch, D]
//   x_{l+1} = x0 ⊙ z_l + x_l
// Backward, from g_{l+1} = dL/dx_{l+1}:
//   dz = g ⊙ x0,  db_l = Σ_batch dz,  dU_l = dz^T h_l,  dh = dz U_l,  dV_l = dh^T x_l,
//   g_l = g_{l+1} + dh V_l,  and x0 collects g_{l+1} ⊙ z_l from every layer, plus g_1 (x_0 is x0) and dh V_0.
// The GEMMs are dense_linear.h's steps (cuBLASLt on cuda); z's GEMM writes the product without the bias, and the
// elementwise steps add b where they read z, so each layer makes one pass over [batch, D] each way.
//
// fp32: x_l, z_l, dz and g in fp32; the backward's elementwise step writes dz, db and the x0 gradient of its
// layer (accumulated layer after layer); the arithmetic is that of the bias in the GEMM's epilogue (fl(fl(hU) + b)).
//
// 16-bit training (bf16, f16): every [batch, D] array the network keeps is in the 16-bit type, as autocast keeps
// activations: x0's copy x16 (rounded once), z_l = fl16(h U^T) (+ b in fp32 where read), x_{l+1} rounded from its
// fp32 sum, and the gradients g_l (each the GEMM's fp32 sum g_{l+1} + dh V_l rounded once, g_0 included). The
// products x0 ⊙ z and g ⊙ x0 read x16. The backward's per-layer step writes dz (16 bits) and db; x0's gradient
// is one pass at the end over every layer's g and z and g_0 (cross_input_grad_half), in fp32. Each pass moves 16
// bytes a thread.
//
// The backward comes in two parts (backward_data, backward_weights), so that work waiting for x0's gradient (the
// embeddings' update) can start before the weight gradients' GEMMs (dU, dV) run.
// x0 need not exist as one array: the network reads it as two column blocks (DCNv2: the bottom MLP's output and
// the pooled embeddings, where their producers wrote them), and writes its gradient as two blocks likewise.
// Every launcher takes the stream it runs on last (cuda: asynchronous on it, no host synchronization; cpu: runs
// on the calling thread, the stream unused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "kernels/dense_linear.h"

namespace sparta {

// ---------------------------------------------------------------------------------------------------------
// The network's input x0 [batch, D] as two column blocks: columns [0, a_cols) in a [batch, a_cols] and columns
// [a_cols, D) in b [batch, D - a_cols] (DCNv2: the bottom MLP's output and the pooled embeddings [batch, slots *
// dim]); b == nullptr: all of x0 in a. Its gradient likewise.
struct CrossInput {
  const float* a = nullptr;
  const float* b = nullptr;
  int a_cols = 0;
  CrossInput() = default;
  CrossInput(const float* whole) : a(whole) {}  // NOLINT: one array is the common case
  CrossInput(const float* a_, const float* b_, int a_cols_) : a(a_), b(b_), a_cols(a_cols_) {}
};
struct CrossInputGrad {
  float* a = nullptr;
  float* b = nullptr;
  int a_cols = 0;
  CrossInputGrad() = default;
  CrossInputGrad(float* whole) : a(whole) {}  // NOLINT
  CrossInputGrad(float* a_, float* b_, int a_cols_) : a(a_), b(b_), a_cols(a_cols_) {}
};

// out [batch, a_cols + b_cols] = [a, b]: the input as one array (the fp32 network's first GEMM reads it so).
void concat_columns(const Device& dev, const char* layer, int64_t batch, const float* a, int a_cols, const float* b,
                    int b_cols, float* out, Stream stream);

// Copies rows x cols floats from src (row pitch src_ld floats) to dst (row pitch dst_ld floats).
void copy_columns_cpu(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols);
void copy_columns_cuda(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                       Stream stream);

// ---------------------------------------------------------------------------------------------------------
// The elementwise steps (shapes [batch, D]; d.in == d.out == D; bias [D]).

// fp32: out = x0 ⊙ (z + bias) + xl (xl == nullptr: x0 itself, the first layer's x_l, read once).
void cross_forward_elementwise(const Device& dev, const LinearDims& d, const CrossInput& x0, const float* z,
                               const float* bias, const float* xl, float* out, Stream stream);

// fp32: dz = g ⊙ x0; db [D] = Σ_batch dz; dx0 = (accumulate ? dx0 : 0) + g ⊙ (z + bias) + (identity ? g : 0).
void cross_backward_elementwise(const Device& dev, const LinearDims& d, const float* g, const CrossInput& x0,
                                const float* z, const float* bias, float* dz, float* db, const CrossInputGrad& dx0,
                                bool accumulate, bool identity, Stream stream);

// 16-bit type t (bf16, f16) from here on; 16-bit arrays are bits (src/base/half.h's formats).
// x16 [batch, D] = x0 in t (rounded to nearest even): the first V GEMM's input and the products' x0.
void cross_input_to_half(const Device& dev, const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16,
                         Stream stream);
// x16's columns [0, a_cols) (rows of D values) = a [batch, a_cols] in t (rounded to nearest even), its other
// columns untouched: x0's first block, where the producer of the rest wrote it in 16 bits already
// (CrossNet::forward_from_input16). 1 <= a_cols <= D.
void cross_block_to_half(const Device& dev, const LinearDims& d, GemmType t, const float* a, int a_cols,
                         uint16_t* x16, Stream stream);

// v = x16 ⊙ (z16 + bias) + xl16 in fp32 (xl16 == nullptr: x16 itself); out16 = v in t when not nullptr, out = v
// when not nullptr (one of them at least).
void cross_forward_half(const Device& dev, const LinearDims& d, GemmType t, const uint16_t* x16,
                        const uint16_t* z16, const float* bias, const uint16_t* xl16, uint16_t* out16, float* out,
                        Stream stream);

// dz16 = g16 ⊙ x16 in t; db [D] = Σ_batch of the fp32 products (db may be nullptr).
void cross_backward_half(const Device& dev, const LinearDims& d, GemmType t, const uint16_t* g16,
                         const uint16_t* x16, uint16_t* dz16, float* db, Stream stream);

// x0's gradient from the network's layers (16-bit training), in fp32: for layers k = 0 .. n-1 with g16[k] the
// gradient of x_{k+1}, z16[k] and bias[k], and g0 the gradient of x_0 through the layers' residuals and V GEMMs,
//   dx0 = g16[n-1] ⊙ (z16[n-1] + bias[n-1]) + ... + g16[0] ⊙ (z16[0] + bias[0]) + g0,
// added in that order (the top layer first), every product and sum rounded to fp32.
void cross_input_grad_half(const Device& dev, const LinearDims& d, GemmType t,
                           const std::vector<const uint16_t*>& g16, const std::vector<const uint16_t*>& z16,
                           const std::vector<const float*>& bias, const uint16_t* g0, const CrossInputGrad& dx0,
                           Stream stream);

// The steps' arguments, for the backends.
struct CrossElementwise {
  GemmType half = GemmType::bf16;  // the 16-bit arrays' type
  CrossInput x0;                   // fp32 steps
  const uint16_t* x16 = nullptr;   // 16-bit steps
  const float* z = nullptr;
  const uint16_t* z16 = nullptr;
  const float* bias = nullptr;
  const float* xl = nullptr;       // forward
  const uint16_t* xl16 = nullptr;
  float* out = nullptr;
  uint16_t* out16 = nullptr;
  const float* g = nullptr;        // backward
  const uint16_t* g16 = nullptr;
  float* dz = nullptr;
  uint16_t* dz16 = nullptr;
  float* db = nullptr;
  CrossInputGrad dx0;
  bool accumulate = false, identity = false;
};
// cross_input_grad_half's layers, at most kMaxCrossTerms a pass (the launcher chains passes for more).
constexpr int kMaxCrossTerms = 8;
struct CrossGradTerms {
  GemmType half = GemmType::bf16;
  int n = 0;
  const uint16_t* g16[kMaxCrossTerms] = {};
  const uint16_t* z16[kMaxCrossTerms] = {};
  const float* bias[kMaxCrossTerms] = {};
  bool accumulate = false;           // dx0 holds the terms of the layers above: add to it
  const uint16_t* identity = nullptr;  // add this last (g_0), or nullptr
  CrossInputGrad dx0;
};
void cross_input_to_half_cpu(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16);
void cross_input_to_half_cuda(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16, Stream stream);
void cross_block_to_half_cpu(const LinearDims& d, GemmType t, const float* a, int a_cols, uint16_t* x16);
void cross_block_to_half_cuda(const LinearDims& d, GemmType t, const float* a, int a_cols, uint16_t* x16,
                              Stream stream);
void cross_forward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a);
void cross_forward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream);
void cross_backward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a);
void cross_backward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream);
void cross_forward_half_cpu(const LinearDims& d, const CrossElementwise& a);
void cross_forward_half_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream);
void cross_backward_half_cpu(const LinearDims& d, const CrossElementwise& a);
void cross_backward_half_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream);
void cross_input_grad_half_cpu(const LinearDims& d, const CrossGradTerms& a);
void cross_input_grad_half_cuda(const LinearDims& d, const CrossGradTerms& a, Stream stream);

// ---------------------------------------------------------------------------------------------------------
// The network, with what it saves for backward. Parameters are not owned (as in dense_mlp.h): the caller's
// flat fp32 array holds, layer after layer, V [rank, D], U [D, rank], b [D]; gradients the same.

struct CrossConfig {
  std::string name = "cross";  // errors name it: "cross.1.U"
  int dim = 0;                 // D
  int rank = 0;
  int layers = 0;
  GemmType precision = GemmType::f32;
};

class CrossNet {
 public:
  // Throws sparta::Error naming the network for dim, rank, layers or max_batch < 1.
  CrossNet(const Device& dev, CrossConfig cfg, int64_t max_batch);

  static size_t param_count(int dim, int rank, int layers);
  size_t param_count() const { return param_count(cfg_.dim, cfg_.rank, cfg_.layers); }
  size_t v_offset(int l) const { return size_t(l) * layer_floats(); }
  size_t u_offset(int l) const { return v_offset(l) + size_t(cfg_.rank) * cfg_.dim; }
  size_t b_offset(int l) const { return u_offset(l) + size_t(cfg_.dim) * cfg_.rank; }
  const CrossConfig& config() const { return cfg_; }

  // x0 [batch, D] → x_L [batch, D], held by the network until the next forward. x0's arrays must stay unchanged
  // until backward. Throws sparta::Error naming the network when batch is not in [0, max_batch] or x0's blocks do
  // not fit D. out16 (16-bit precision): x_L is written there in the precision's 16-bit type alone ([batch, D],
  // what the next layer's GEMM reads: dense_mlp.h's input16) and nullptr is returned.
  const float* forward(const float* params, const CrossInput& x0, int64_t batch, Stream stream,
                       uint16_t* out16 = nullptr);
  // 16-bit precision: x0's 16-bit array [max_batch, D] (rows of D values), into which a producer may write x0's
  // columns from a_cols on (DCNv2: the pooled embeddings, each value rounded once from its float) before
  // forward_from_input16; nullptr for fp32. The network reads it until backward_weights.
  uint16_t* input16();
  // forward, with x0's columns [a_cols, D) in input16() already and its first block a [batch, a_cols] (fp32,
  // rounded into input16() here): no fp32 x0 and no pass over all of it. The same values as forward with x0 =
  // [a, the fp32 values input16() holds rounded]. Throws sparta::Error for fp32 precision.
  const float* forward_from_input16(const float* params, const float* a, int a_cols, int64_t batch, Stream stream,
                                    uint16_t* out16 = nullptr);

  // 16-bit precision: where a producer may write dL/dx_L [max_batch, D] in the 16-bit type (dense_mlp.h's
  // backward_data dx16) before backward_data(params, nullptr, ...); nullptr for fp32.
  uint16_t* output_grad16();

  // From dxL [batch, D] (16-bit precision: nullptr when the gradient is in output_grad16()): grads [param_count]
  // and dx0 [batch, D] (its blocks as x0's were given, any split) are overwritten.
  void backward(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0, Stream stream);
  // The same in two parts: backward_data writes the bias gradients and dx0 and keeps every layer's dz and dh;
  // backward_weights then writes U's and V's gradients from them (the same values as backward).
  void backward_data(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0, Stream stream);
  void backward_weights(float* grads, Stream stream);

  // DCNv2's initialization on the host, deterministic by seed: U and V uniform in ±sqrt(6 / (fan_in +
  // fan_out)) (Glorot), b zero.
  static std::vector<float> initial_params(int dim, int rank, int layers, uint64_t seed);

 private:
  size_t layer_floats() const { return size_t(2) * cfg_.rank * cfg_.dim + cfg_.dim; }
  LinearDims v_dims(int l) const;  // h = x_l V^T: in D, out rank
  LinearDims u_dims(int l) const;  // z = h U^T + b: in rank, out D
  LinearDims x_dims() const;       // the elementwise steps: D by D
  // what V_l's GEMMs read as x_l: fp32 x0 or x_l, or the 16-bit x_l
  const void* x_gemm(int l) const;
  // V_l and U_l as the GEMMs read them: in the parameters (fp32) or their 16-bit copies
  const void* v_gemm(const float* params, int l) const;
  const void* u_gemm(const float* params, int l) const;
  void backward_data_f32(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                         Stream stream);
  void backward_data_half(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                          Stream stream);
  void check_batch(int64_t batch) const;
  // the 16-bit forward from x0's copy in xs16_[0] on
  const float* forward_half_layers(const float* params, Stream stream, uint16_t* out16);
  // dx0 += dh V_0, block by block when dx0 is in two
  void add_bottom_data_grad(const float* params, const void* dh, const CrossInputGrad& dx0, Stream stream);

  Device dev_;
  CrossConfig cfg_;
  int64_t max_batch_ = 0;
  int64_t batch_ = -1;
  bool have_grads_ = false;          // backward_data ran since the last forward
  std::vector<std::string> names_;  // per layer: V, U, x
  CrossInput x0_;                         // the last forward's input
  // fp32
  Buffer<float> x0_whole_;                // x0 in two blocks: x0 as one array [max_batch, D]
  std::vector<Buffer<float>> xs_;         // x_{l+1} [max_batch, D], l < layers
  std::vector<Buffer<float>> hs_, zs_;    // h_l [max_batch, rank], z_l [max_batch, D] (without the bias)
  std::vector<Buffer<float>> dzs_, dhs_;  // per layer: dz [max_batch, D], dh [max_batch, rank]
  Buffer<float> g_;                       // g_l [max_batch, D] between layers
  // 16-bit
  std::vector<Buffer<uint16_t>> xs16_;    // x_l [max_batch, D], l < layers (x_0 = x0's copy included)
  std::vector<Buffer<uint16_t>> hs16_, zs16_;
  std::vector<Buffer<uint16_t>> v16_, u16_;  // copies of V_l and U_l, each its own aligned buffer
  std::vector<Buffer<uint16_t>> gs16_;    // g_l [max_batch, D], l = 0 .. layers (g_L: output_grad16())
  std::vector<Buffer<uint16_t>> dzs16_, dhs16_;
  Buffer<float> out_;                     // x_L in fp32 when the caller gives no out16 (made on first use)
};

}  // namespace sparta
