// atomic_sgd.cu: CUDA version of atomic_sgd.h. A group of G lanes per bag (the row shape of sparse_optimizer.h:
// float4s or floats, G a power of two up to 32, P vectors per lane) holds the bag's gradient, scaled by -lr (and
// 1/n for mean), in registers, then walks the bag's keys: each key's row gets one vector atomic add per lane and
// vector (red.global.add.v4.f32 on sm_90; no return value, so the keys' adds are all in flight together).
// Grid-stride over bags.
#include <cuda_runtime.h>

#include "src/base/check.h"
#include "kernels/atomic_sgd.h"
#include "kernels/sparse_optimizer.h"

namespace sparta {

namespace {

__device__ __forceinline__ void add_row(float* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), v);
#else
  atomicAdd(p, v.x), atomicAdd(p + 1, v.y), atomicAdd(p + 2, v.z), atomicAdd(p + 3, v.w);
#endif
}

// Lane l of a group holds floats (l + c G) V .. + V for c < P.
template <int V, int P>
__global__ void __launch_bounds__(256) atomic_sgd_kernel(BackwardBatch b, float lr, float* values,
                                                         int64_t capacity_rows, int dim, rowvec::RowShape shape) {
  const int G = shape.G;
  const int lane = threadIdx.x & (G - 1);
  const int64_t groups = (int64_t(gridDim.x) * blockDim.x) >> shape.log2_G;
  const bool mean = b.combiner == Combiner::mean;
  for (int64_t bag = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> shape.log2_G; bag < b.bags; bag += groups) {
    int64_t s = b.offsets[bag], e = b.offsets[bag + 1];
    if (s < 0) s = 0;  // offsets that are not a CSR: never outside rows[]
    if (e > b.nnz) e = b.nnz;
    if (e <= s) continue;
    const float scale = 1.0f / static_cast<float>(e - s);
    float u[P][V];  // -(lr * g) for this lane's elements
#pragma unroll
    for (int c = 0; c < P; ++c) {
      const int el = (lane + c * G) * V;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        float g = el + q < dim ? b.grad[bag * dim + el + q] : 0.f;
        if (mean) g = __fmul_rn(g, scale);
        u[c][q] = -__fmul_rn(lr, g);
      }
    }
    for (int64_t k = s; k < e; ++k) {
      const int64_t row = b.rows[k];
      if (row < 0 || row >= capacity_rows) continue;
      float* w = values + row * dim;
#pragma unroll
      for (int c = 0; c < P; ++c) {
        const int el = (lane + c * G) * V;
        if (el >= dim) continue;
        if constexpr (V == 4) add_row(w + el, make_float4(u[c][0], u[c][1], u[c][2], u[c][3]));
        else atomicAdd(w + el, u[c][0]);
      }
    }
  }
}

}  // namespace

void atomic_sgd_update_cuda(const BackwardBatch& b, float lr, float* values, int64_t capacity_rows, int dim,
                            Stream stream) {
  if (b.bags == 0 || b.nnz == 0) return;
  const rowvec::RowShape shape = rowvec::row_shape(dim, reinterpret_cast<uintptr_t>(values) % 16 == 0);
  const int block = 256;
  rowvec::dispatch_shape(shape, [&](auto vv, auto pp) {
    constexpr int V = decltype(vv)::value, P = decltype(pp)::value;
    atomic_sgd_kernel<V, P><<<rowvec::grid_for(b.bags, shape.G, block), block, 0, stream>>>(b, lr, values,
                                                                                           capacity_rows, dim, shape);
    CUDA_CHECK_LAUNCH("atomic_sgd_kernel");
  });
}

}  // namespace sparta
