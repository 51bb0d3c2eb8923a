// dense_dropout.cu: CUDA version of dense_dropout.h: one grid-stride pass, the step's key read from device
// memory (so a recorded CUDA graph drops each step's elements), the same mask and rounding as the cpu reference.
#include "src/base/check.h"
#include "kernels/dense_dropout.h"
#include "kernels/dense_reduce.cuh"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

__global__ void __launch_bounds__(256) dropout_kernel(const uint64_t* key_ptr, uint64_t layer, uint32_t threshold,
                                                      float scale, float* y, int64_t n) {
  const uint64_t key = *key_ptr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = dropout_keeps(key, layer, uint64_t(i), threshold) ? __fmul_rn(y[i], scale) : 0.f;
}

// ----------------------------------------------------------------------------
// launchers

void dropout_forward_cuda(const uint64_t* key, uint64_t layer, uint32_t threshold, float scale, float* y, int64_t n,
                          Stream stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256, cap = int64_t(dense::sm_count()) * 16;
  dropout_kernel<<<int(blocks < cap ? blocks : cap), 256, 0, stream>>>(key, layer, threshold, scale, y, n);
  CUDA_CHECK_LAUNCH("dropout_kernel");
}

}  // namespace sparta
