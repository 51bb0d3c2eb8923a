// dense_dropout.h: inverted dropout on an MLP's hidden activations during training (the top MLP's,
// model.dropout), with masks that are a pure function of (seed, step, layer, element), so that both backends,
// every rerun and a CUDA graph's replays drop the same elements:
//   key       = dropout_step_key(seed, step)                  (host; the kernels read it from memory, so a
//                                                               recorded graph takes each step's key)
//   keep(i)   = (hash_mix(hash_mix(key, layer), i) >> 40) >= threshold,  threshold = round(p 2^24)
//   y[i]      = keep(i) ? y[i] * scale : 0,                    scale = 1 / (1 - p) (fp32)
// with i = r * cols + c the element of the rank's [rows, cols] activations. The backward needs no mask: after
// a ReLU, a dropped element is 0 and a kept one > 0 exactly where the ReLU passed it, so the activation
// gradient is dy * scale where y > 0 (activation_bias_backward's dy_scale).
// Every launcher takes the stream it runs on last (cuda: asynchronous on it; cpu: on the calling thread).
#pragma once

#include <cstdint>

#include "src/base/device.h"
#include "src/base/random.h"

namespace sparta {

// What a dropout pass needs besides the activations: p in [0, 1), the step's key (device memory for cuda,
// host memory for cpu; read when the pass runs) and the layer's index.
struct DropoutArgs {
  float p = 0.f;
  const uint64_t* key = nullptr;
  uint64_t layer = 0;
};

uint64_t dropout_step_key(uint64_t seed, int64_t step);
// round(p 2^24): elements whose 24-bit draw is below it are dropped. Throws sparta::Error unless 0 <= p < 1.
uint32_t dropout_threshold(float p);
float dropout_scale(float p);  // 1 / (1 - p) in fp32

SPARTA_HD bool dropout_keeps(uint64_t key, uint64_t layer, uint64_t element, uint32_t threshold) {
  return uint32_t(hash_mix(hash_mix(key, layer), element) >> 40) >= threshold;
}

// y [rows, cols] in place, as above. Throws sparta::Error naming `layer` for p outside [0, 1), rows < 0 or
// cols < 1.
void dropout_forward(const Device& dev, const char* layer, const DropoutArgs& a, float* y, int64_t rows, int cols,
                     Stream stream);

void dropout_forward_cpu(uint64_t key, uint64_t layer, uint32_t threshold, float scale, float* y, int64_t n);
void dropout_forward_cuda(const uint64_t* key, uint64_t layer, uint32_t threshold, float scale, float* y, int64_t n,
                          Stream stream);

}  // namespace sparta
