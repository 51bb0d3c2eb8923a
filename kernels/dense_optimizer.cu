// dense_optimizer.cu: CUDA version of dense_optimizer.h: one grid-stride pass, each thread one element at a
// time through sparse_optimizer.h's update_element (the formulas the cpu reference uses, bit for bit).
#include "src/base/check.h"
#include "kernels/dense_optimizer.h"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

template <OptimizerKind K>
__global__ void __launch_bounds__(256)
    dense_update_kernel(OptimizerStep c, float weight_decay, float* params, const float* grads, float* state,
                        size_t n) {
  const RowDecay none;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float w = params[i];
    float s0 = optimizer_has_s0(K) ? state[i] : 0.f;
    float s1 = optimizer_has_s1(K) ? state[n + i] : 0.f;
    update_element<K>(c, none, decayed_gradient(grads[i], w, weight_decay), w, s0, s1);
    params[i] = w;
    if (optimizer_has_s0(K)) state[i] = s0;
    if (optimizer_has_s1(K)) state[n + i] = s1;
  }
}

// ----------------------------------------------------------------------------
// launchers

void dense_optimizer_update_cuda(const OptimizerStep& c, float weight_decay, float* params, const float* grads,
                                 float* state, size_t n, Stream stream) {
  if (n == 0) return;
  const int block = 256;
  const size_t blocks = (n + block - 1) / block;
  const int grid = static_cast<int>(blocks < 8192 ? blocks : 8192);
  dispatch_optimizer(c.kind, [&](auto kind) {
    constexpr OptimizerKind K = decltype(kind)::value;
    dense_update_kernel<K><<<grid, block, 0, stream>>>(c, weight_decay, params, grads, state, n);
    CUDA_CHECK_LAUNCH("dense_update_kernel");
  });
}

}  // namespace sparta
