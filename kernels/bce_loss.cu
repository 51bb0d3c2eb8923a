// bce_loss.cu: CUDA version of bce_loss.h. The loss is one block's fixed-order sum (per thread, then a tree
// in shared memory), so it needs no scratch and no atomics; the gradient is written in the same pass.
#include "src/base/check.h"
#include "kernels/bce_loss.h"

namespace sparta {

namespace {
constexpr int kLossBlock = 1024;

__device__ __forceinline__ float sigmoid_of(float z) {
  if (z >= 0.f) return 1.f / (1.f + expf(-z));
  const float e = expf(z);
  return e / (1.f + e);
}
}  // namespace

// ----------------------------------------------------------------------------
// kernels

__global__ void __launch_bounds__(kLossBlock)
    bce_kernel(const float* logits, const float* labels, float* loss, float* dlogits, int64_t n, int64_t mean_over) {
  __shared__ double part[kLossBlock];
  const float inv = static_cast<float>(1.0 / double(mean_over));
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float z = logits[i], y = labels[i];
    sum += double(fmaxf(z, 0.f) - z * y) + double(log1pf(expf(-fabsf(z))));
    if (dlogits) dlogits[i] = (sigmoid_of(z) - y) * inv;
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(part[0] / double(mean_over));
}

__global__ void __launch_bounds__(256) sigmoid_kernel(const float* logits, float* probs, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    probs[i] = sigmoid_of(logits[i]);
}

// ----------------------------------------------------------------------------
// launchers

void bce_with_logits_cuda(const float* logits, const float* labels, float* loss, float* dlogits, int64_t n,
                          int64_t mean_over, Stream stream) {
  bce_kernel<<<1, kLossBlock, 0, stream>>>(logits, labels, loss, dlogits, n, mean_over);
  CUDA_CHECK_LAUNCH("bce_kernel");
}

void sigmoid_cuda(const float* logits, float* probs, int64_t n, Stream stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  sigmoid_kernel<<<int(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(logits, probs, n);
  CUDA_CHECK_LAUNCH("sigmoid_kernel");
}

}  // namespace sparta
