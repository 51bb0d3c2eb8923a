// grad_scale.h: the device side of dynamic loss scaling (fp16 training, src/loss_scale.h): scaling the loss
// gradient up before backward, and the one pass after it that unscales the gradients and tells whether any of
// them overflowed.
#pragma once

#include <cstddef>

#include "src/base/device.h"

namespace sparta {

// x[i] *= s, i < n. Asynchronous on stream (cuda).
void scale_values(const Device& dev, float* x, size_t n, float s, Stream stream);

// One pass over a [na] and b [nb] (either may be empty): nonfinite[0] (device) = 1 when any value is NaN or ±inf,
// else 0, read before the scaling; then every value is multiplied by s (exact for a power of two without
// underflow). Asynchronous on stream (cuda): the caller downloads the flag.
void unscale_and_check(const Device& dev, float* a, size_t na, float* b, size_t nb, float s, int* nonfinite,
                       Stream stream);

void scale_values_cpu(float* x, size_t n, float s);
void scale_values_cuda(float* x, size_t n, float s, Stream stream);
void unscale_and_check_cpu(float* a, size_t na, float* b, size_t nb, float s, int* nonfinite);
void unscale_and_check_cuda(float* a, size_t na, float* b, size_t nb, float s, int* nonfinite, Stream stream);

}  // namespace sparta
