// interaction_dot.h: DLRM's "dot" feature interaction (MLPerf DLRM v1).
//
// Per sample, the S + 1 vectors T = [bottom, emb_0, ..., emb_{S-1}] (each of width dim) give
//   out [batch, dim + (S+1)S/2] = [bottom, T_i · T_j for i = 1..S, j = 0..i-1]
// i.e. the bottom MLP's output followed by the strictly lower triangle of T T^T in row-major order.
// Backward, from dout: dT_i = Σ_{j != i} dZ_ij T_j (dZ symmetric, from the pairs' gradients), then
//   dbottom = dout[:, :dim] + dT_0,   demb_s = dT_{s+1}.
//
// cuda: where S + 1 <= 32 (MLPerf DLRM's 27 x 128 does), each warp streams its samples through shared memory in
// chunks of 32 columns of T, its next chunks copied in while it computes: the forward (dim <= 1024) computes T T^T
// on the tensor cores in TF32 with fp32's accuracy (each value split into two TF32 parts, three products: the
// .cu says how), the backward (any dim) register tiles of dT = dZ T (j in order). Otherwise: a block holds a sample's
// vectors and copies its next sample in meanwhile (two buffers) where interaction_dot_tiled_smem fits, the
// forward register tiles of T T^T (each dot product as four interleaved partial sums over k, added in order),
// the backward register tiles of dT; else the forward each pair with one warp (lanes over dim, a shuffle
// reduction), the backward one element of dT per thread. No atomics: two runs give the same bits. cpu: the
// reference, the same sums in loops (in another order: the backends agree to rounding).
// 16-bit training: the top MLP's first GEMM reads the interaction's output as 16 bits in rows padded to a
// multiple of 8 (dense_mlp.h), and its data gradient comes back in rows of that pitch. So the forward can write
// the 16-bit copy alone (interaction_dot_forward_half: the fp32 values rounded to nearest even once, the bits a
// separate to_half_padded pass of the fp32 output gives), and the output and dout take a row pitch (ld).
// Every launcher takes the stream it runs on last (cuda: asynchronous on it; cpu: runs on the calling thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/device.h"
#include "kernels/dense_linear.h"

namespace sparta {

struct InteractionDims {
  const char* layer = "interaction";
  int64_t batch = 0;
  int slots = 0;  // S: pooled embeddings per sample
  int dim = 0;    // width of the bottom output and of every embedding
  int64_t ld = 0; // row pitch of out / out16 (forward) and of dout (backward), >= the width; 0: the width
};

// dim + (S+1)S/2: the width of the output.
int64_t interaction_dot_width(int slots, int dim);

// Throws sparta::Error naming the layer unless batch >= 0, slots >= 1, dim >= 1, ld == 0 or ld >= width, and
// batch * max(width, ld) < 2^62.
void check_interaction_dims(const InteractionDims& d);
// d.ld, or the width where d.ld is 0.
int64_t interaction_dot_ld(const InteractionDims& d);

// bottom [batch, dim], emb [batch, S, dim] → out [batch, ld]: the width interaction_dot_width(S, dim) of values,
// zeros in columns width .. ld - 1
void interaction_dot_forward(const Device& dev, const InteractionDims& d, const float* bottom, const float* emb,
                             float* out, Stream stream);
// The same values in the 16-bit type t (bf16 or f16; throws sparta::Error naming the layer otherwise), each
// rounded to nearest even from the fp32 value interaction_dot_forward gives: out16 [batch, ld], zeros in the
// padding. No fp32 output.
void interaction_dot_forward_half(const Device& dev, const InteractionDims& d, GemmType t, const float* bottom,
                                  const float* emb, uint16_t* out16, Stream stream);

// dout [batch, ld] (columns width .. ld - 1 not read) → dbottom [batch, dim], demb [batch, S, dim] (overwritten)
void interaction_dot_backward(const Device& dev, const InteractionDims& d, const float* dout, const float* bottom,
                              const float* emb, float* dbottom, float* demb, Stream stream);

// out16 == nullptr: out in fp32; otherwise out16 in t (out unused).
void interaction_dot_forward_cpu(const InteractionDims& d, const float* bottom, const float* emb, float* out,
                                 GemmType t = GemmType::f32, uint16_t* out16 = nullptr);
void interaction_dot_backward_cpu(const InteractionDims& d, const float* dout, const float* bottom,
                                  const float* emb, float* dbottom, float* demb);
// Bytes of shared memory a block of the tiled cuda kernels takes (backward or forward); where S + 1 > 32 they run
// where this is at most 48 KiB (interaction_dot_forward_path), the general kernels elsewhere.
size_t interaction_dot_tiled_smem(int slots, int dim, bool backward);

// The cuda kernel a forward of this shape takes: "tensor" (S + 1 <= 32, dim <= 1024), else "tiled"
// (interaction_dot_tiled_smem at most 48 KiB), else "general". The backward takes the streamed kernel where
// S + 1 <= 32, else the tiled or general one as interaction_dot_tiled_smem(backward) says.
const char* interaction_dot_forward_path(int slots, int dim);

// Throws sparta::Error naming the layer when the sample's vectors do not fit in a block's shared memory.
void interaction_dot_forward_cuda(const InteractionDims& d, const float* bottom, const float* emb, float* out,
                                  GemmType t, uint16_t* out16, Stream stream);
void interaction_dot_backward_cuda(const InteractionDims& d, const float* dout, const float* bottom,
                                   const float* emb, float* dbottom, float* demb, Stream stream);

}  // namespace sparta
