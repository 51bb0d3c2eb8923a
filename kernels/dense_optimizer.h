// dense_optimizer.h: the optimizers of the dense parameters (the MLPs, the cross network): flat fp32 arrays
// where every element is updated every step, with the learning rate given per step (the trainer's warm-up
// and decay schedule lives with the trainer).
//
// The element formulas are the sparse optimizers' (kernels/sparse_optimizer.h, where they are written out),
// with t = step counted from 1:
//   sgd        w -= lr g
//   momentum   v = momentum v + g;  w -= lr v                 nesterov: w -= lr (g + momentum v)
//   adagrad    a += g²;  w -= lr g / (sqrt(a) + epsilon)      (a starts at OptimizerConfig::initial_accumulator)
//   adam       m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g²;
//              w -= lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
// with g = grad + weight_decay w (L2 on the parameters, OptimizerConfig::weight_decay; 0: grad exactly).
// lazy_adam is a sparse optimizer (rows a batch did not touch); on dense parameters it is an error.
// State, for n parameters: momentum, nesterov, adagrad: s[n]; adam: m[n] then v[n]; sgd: none.
// Both backends round every operation alike (no fused multiply-add): the same bits on cpu and cuda.
// Every launcher takes the stream it runs on last (cuda: asynchronous on it, no host synchronization; cpu: runs
// on the calling thread, the stream unused).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/device.h"
#include "kernels/embedding_types.h"
#include "kernels/sparse_optimizer.h"

namespace sparta {

// Floats of optimizer state for n parameters. Throws sparta::Error for lazy_adam.
size_t dense_optimizer_state_size(OptimizerKind kind, size_t n);

// Sets the state to its start: initial_accumulator for adagrad, zeros otherwise (asynchronous on stream).
void dense_optimizer_init_state(const Device& dev, const OptimizerConfig& cfg, float* state, size_t n, Stream stream);

// One step on params [n] with grads [n] and state [dense_optimizer_state_size(kind, n)]. lr replaces cfg.lr.
// Throws sparta::Error for lazy_adam, a step outside [1, 2^31 - 1], betas outside [0, 1) or a weight decay that
// is negative or not finite.
void dense_optimizer_update(const Device& dev, const OptimizerConfig& cfg, int64_t step, float lr, float* params,
                            const float* grads, float* state, size_t n, Stream stream);

void dense_optimizer_update_cpu(const OptimizerStep& c, float weight_decay, float* params, const float* grads,
                                float* state, size_t n);
void dense_optimizer_update_cuda(const OptimizerStep& c, float weight_decay, float* params, const float* grads,
                                 float* state, size_t n, Stream stream);

// The gradient the formulas take: g + weight_decay w, rounded alike on both backends (0: g exactly).
SPARTA_HD float decayed_gradient(float g, float w, float weight_decay) {
  return weight_decay == 0.f ? g : rn::add(g, rn::mul(weight_decay, w));
}

}  // namespace sparta
