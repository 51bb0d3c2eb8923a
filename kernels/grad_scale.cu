// grad_scale.cu: CUDA version of grad_scale.h. The check is one grid-stride pass over both arrays; a block
// that saw a non-finite value sets the flag (after the flag's memset on the same stream).
#include <cuda_runtime.h>

#include "src/base/check.h"
#include "kernels/grad_scale.h"

namespace sparta {

namespace {

__global__ void __launch_bounds__(256) scale_kernel(float* x, size_t n, float s) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}

__global__ void __launch_bounds__(256) unscale_check_kernel(float* a, size_t na, float* b, size_t nb, float s,
                                                            int* nonfinite) {
  int bad = 0;
  const size_t n = na + nb;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float* p = i < na ? a + i : b + (i - na);
    const float v = *p;
    bad |= !isfinite(v);
    *p = __fmul_rn(v, s);
  }
  // every thread of the block reaches this (the loop above has no early exit)
  if (__syncthreads_or(bad) && threadIdx.x == 0) *nonfinite = 1;
}

int grid_for(size_t n) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t blocks = (n + 255) / 256, cap = size_t(sms) * 8;
  return int(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

}  // namespace

void scale_values_cuda(float* x, size_t n, float s, Stream stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), 256, 0, stream>>>(x, n, s);
  CUDA_CHECK_LAUNCH("scale_kernel");
}

void unscale_and_check_cuda(float* a, size_t na, float* b, size_t nb, float s, int* nonfinite, Stream stream) {
  CUDA_CHECK(cudaMemsetAsync(nonfinite, 0, sizeof(int), stream));
  if (na + nb == 0) return;
  unscale_check_kernel<<<grid_for(na + nb), 256, 0, stream>>>(a, na, b, nb, s, nonfinite);
  CUDA_CHECK_LAUNCH("unscale_check_kernel");
}

}  // namespace sparta
