// fill.h: sets every element of a float or int64 array to one value. The smallest kernel, and the pattern every
// kernel follows: this header declares the launcher callers use (it picks the backend), the CUDA version
// (fill.cu) and the CPU reference (fill.cpp). Every launcher takes the stream it runs on as its last parameter
// (the cpu backend ignores it) and says whether it synchronizes the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/device.h"

namespace sparta {

// out[i] = value for i in [0, n). Asynchronous on stream (cuda).
void fill(const Device& dev, float* out, size_t n, float value, Stream stream);
void fill(const Device& dev, int64_t* out, size_t n, int64_t value, Stream stream);

void fill_cpu(float* out, size_t n, float value);
void fill_cpu(int64_t* out, size_t n, int64_t value);
void fill_cuda(float* out, size_t n, float value, Stream stream);
void fill_cuda(int64_t* out, size_t n, int64_t value, Stream stream);

}  // namespace sparta
