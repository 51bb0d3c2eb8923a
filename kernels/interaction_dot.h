// interaction_dot.h: DLRM's "dot" feature interaction (MLPerf DLRM v1).
//
// Per sample, the S + 1 vectors T = [bottom, emb_0, ..., emb_{S-1}] (each of width dim) give
//   out [batch, dim + (S+1)S/2] = [bottom, T_i · T_j for i = 1..S, j = 0..i-1]
// i.e. the bottom MLP's output followed by the strictly lower triangle of T T^T in row-major order.
// Backward, from dout: dT_i = Σ_{j != i} dZ_ij T_j (dZ symmetric, from the pairs' gradients), then
//   dbottom = dout[:, :dim] + dT_0,   demb_s = dT_{s+1}.
//
// cuda: a block holds a sample's S + 1 vectors in shared memory at a time. Where they fit with the kernel's
// partial sums in 48 KiB (interaction_dot_tiled_smem; MLPerf DLRM's 27 x 128 does), the tiled kernels compute
// register tiles of T T^T (each dot product as four interleaved partial sums over k, added in order) and of
// dT = dZ T (j in order); otherwise the forward gives each warp whole pairs (lanes over dim, a shuffle
// reduction) and the backward each thread one element of dT (j in order). No atomics: two runs give the same
// bits. cpu: the reference, the same sums in loops (in another order: the backends agree to rounding).
// Every launcher takes the stream it runs on last (cuda: asynchronous on it; cpu: runs on the calling thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/device.h"

namespace sparta {

struct InteractionDims {
  const char* layer = "interaction";
  int64_t batch = 0;
  int slots = 0;  // S: pooled embeddings per sample
  int dim = 0;    // width of the bottom output and of every embedding
};

// dim + (S+1)S/2: the width of the output.
int64_t interaction_dot_width(int slots, int dim);

// Throws sparta::Error naming the layer unless batch >= 0, slots >= 1, dim >= 1 and batch * width < 2^62.
void check_interaction_dims(const InteractionDims& d);

// bottom [batch, dim], emb [batch, S, dim] → out [batch, interaction_dot_width(S, dim)]
void interaction_dot_forward(const Device& dev, const InteractionDims& d, const float* bottom, const float* emb,
                             float* out, Stream stream);

// dout [batch, width] → dbottom [batch, dim], demb [batch, S, dim] (overwritten)
void interaction_dot_backward(const Device& dev, const InteractionDims& d, const float* dout, const float* bottom,
                              const float* emb, float* dbottom, float* demb, Stream stream);

void interaction_dot_forward_cpu(const InteractionDims& d, const float* bottom, const float* emb, float* out);
void interaction_dot_backward_cpu(const InteractionDims& d, const float* dout, const float* bottom,
                                  const float* emb, float* dbottom, float* demb);
// Bytes of shared memory a block of the tiled cuda kernels takes (backward or forward); they run where this is
// at most 48 KiB, the general kernels elsewhere.
size_t interaction_dot_tiled_smem(int slots, int dim, bool backward);

// Throws sparta::Error naming the layer when the sample's vectors do not fit in a block's shared memory.
void interaction_dot_forward_cuda(const InteractionDims& d, const float* bottom, const float* emb, float* out,
                                  Stream stream);
void interaction_dot_backward_cuda(const InteractionDims& d, const float* dout, const float* bottom,
                                   const float* emb, float* dbottom, float* demb, Stream stream);

}  // namespace sparta
