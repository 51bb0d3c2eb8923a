// cross_layer.h: DCNv2's low-rank cross network (MLPerf DLRM-DCNv2: 3 layers, rank 512) over
// x0 [batch, D] = [bottom output, flattened pooled embeddings].
//
// Layer l, with V_l [rank, D], U_l [D, rank], b_l [D]:
//   h_l = x_l V_l^T                [batch, rank]
//   z_l = h_l U_l^T + b_l          [batch, D]
//   x_{l+1} = x0 ⊙ z_l + x_l
// Backward, from g = dL/dx_{l+1}:
//   dz = g ⊙ x0,  db_l = Σ_batch dz,  dU_l = dz^T h_l,  dh = dz U_l,  dV_l = dh^T x_l,
//   dx_l = g + dh V_l,  and x0 collects g ⊙ z_l from every layer (plus, at l = 0 where x_l is x0, dx_0).
// The GEMMs are dense_linear.h's steps (cuBLASLt on cuda); z's GEMM writes the product without the bias (in 16-bit
// training straight in 16 bits, like h and dh), and the elementwise steps add b where they read z, so each
// layer makes one pass over [batch, D] each way: forward x_{l+1} (and its 16-bit copy); backward dz (or its 16-bit
// copy), db (a fixed-order column sum) and the x0 gradient. In fp32 that is the same arithmetic as the bias in the
// GEMM's epilogue (fl(fl(hU) + b)); in 16-bit training z = fl16(hU) + b, the bias added in fp32.
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
// The elementwise steps (shapes [batch, D]; d.in == d.out == D). z is the product h U^T without the bias: fp32 z,
// or its 16-bit copy z16 (the other nullptr); bias [D].

// x16 [batch, D] = x0 in the 16-bit type t (rounded to nearest even): the first V GEMM's input.
void cross_input_to_half(const Device& dev, const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16,
                         Stream stream);

// out = x0 ⊙ (z + bias) + xl (xl == nullptr: x0 itself, the first layer's x_l, read once); out16 (the copy of out
// in the 16-bit type t) when not nullptr; out may be nullptr when out16 is not (only the 16-bit copy is read).
// t is read where there is a 16-bit array.
void cross_forward_elementwise(const Device& dev, const LinearDims& d, GemmType t, const CrossInput& x0,
                               const float* z, const uint16_t* z16, const float* bias, const float* xl, float* out,
                               uint16_t* out16, Stream stream);

// dz = g ⊙ x0 (dz16: its copy in the 16-bit type t when not nullptr; dz may be nullptr when dz16 is not);
// db [D] = Σ_batch dz; dx0 = (accumulate ? dx0 : 0) + g ⊙ (z + bias) + (identity ? g : 0).
void cross_backward_elementwise(const Device& dev, const LinearDims& d, GemmType t, const float* g,
                                const CrossInput& x0, const float* z, const uint16_t* z16, const float* bias,
                                float* dz, uint16_t* dz16, float* db, const CrossInputGrad& dx0, bool accumulate,
                                bool identity, Stream stream);

struct CrossElementwise {  // the steps' arguments, for the backends
  GemmType half;           // the 16-bit arrays' type
  const float* g;          // backward
  CrossInput x0;
  const float* z;
  const uint16_t* z16;
  const float* bias;
  const float* xl;         // forward
  float* out;
  uint16_t* out16;
  float* dz;               // backward
  uint16_t* dz16;
  float* db;
  CrossInputGrad dx0;
  bool accumulate, identity;
};
void cross_input_to_half_cpu(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16);
void cross_input_to_half_cuda(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16, Stream stream);
void cross_forward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a);
void cross_forward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream);
void cross_backward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a);
void cross_backward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream);

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

  // From dxL [batch, D]: grads [param_count] and dx0 [batch, D] (its blocks as x0's were given, any split) are
  // overwritten.
  void backward(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0, Stream stream);

  // DCNv2's initialization on the host, deterministic by seed: U and V uniform in ±sqrt(6 / (fan_in +
  // fan_out)) (Glorot), b zero.
  static std::vector<float> initial_params(int dim, int rank, int layers, uint64_t seed);

 private:
  size_t layer_floats() const { return size_t(2) * cfg_.rank * cfg_.dim + cfg_.dim; }
  LinearDims v_dims(int l) const;  // h = x_l V^T: in D, out rank
  LinearDims u_dims(int l) const;  // z = h U^T + b: in rank, out D
  LinearDims x_dims() const;       // the elementwise steps: D by D
  const float* x_in(int l) const { return l == 0 ? x0_.a : xs_[l - 1].data(); }  // fp32: what V_l's GEMM reads
  // V_l and U_l as the GEMMs read them: in the parameters (fp32) or their 16-bit copies
  const void* v_gemm(const float* params, int l) const;
  const void* u_gemm(const float* params, int l) const;

  Device dev_;
  CrossConfig cfg_;
  int64_t max_batch_ = 0;
  int64_t batch_ = -1;
  std::vector<std::string> names_;  // per layer: V, U, x
  CrossInput x0_;                         // the last forward's input
  Buffer<float> x0_whole_;                // fp32 with x0 in two blocks: x0 as one array [max_batch, D]
  std::vector<Buffer<float>> xs_;         // x_{l+1} [max_batch, D], l < layers
  std::vector<Buffer<float>> hs_, zs_;    // fp32: h_l [max_batch, rank], z_l [max_batch, D] (without the bias)
  std::vector<Buffer<uint16_t>> zs16_;    // 16-bit: z_l
  std::vector<Buffer<uint16_t>> xs16_;    // 16-bit: x_l [max_batch, D], l < layers (x_0 included)
  std::vector<Buffer<uint16_t>> hs16_;    // 16-bit: h_l
  std::vector<Buffer<uint16_t>> v16_, u16_;  // 16-bit copies of V_l and U_l, each its own aligned buffer
  Buffer<float> dz_, g_, dh_;             // [max_batch, D] (fp32 only), [max_batch, D], [max_batch, rank]
  Buffer<uint16_t> dz16_, dh16_;
};

}  // namespace sparta
