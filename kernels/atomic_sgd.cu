// atomic_sgd.cu: CUDA version of atomic_sgd.h. A group of L lanes per bag (L = the row's float4s, or floats,
// rounded up to a power of two, at most 32) holds the bag's gradient, scaled by -lr (and 1/n for mean), in
// registers, then walks the bag's keys: each key's row gets one vector atomic add per lane (red.global.add.v4.f32
// on sm_90; no return value, so the keys' adds are all in flight together). Grid-stride over bags.
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

constexpr int kRows = 8;  // keys of a bag whose rows are loaded together

// VEC 4: lane l holds floats [4 (l + c L), 4 (l + c L) + 4) for c < C; VEC 1: floats l + c L.
template <int VEC, int L, int C>
__global__ void __launch_bounds__(256) atomic_sgd_kernel(BackwardBatch b, float lr, float* values,
                                                         int64_t capacity_rows, int dim) {
  const int lane = threadIdx.x % L;
  const int64_t groups = int64_t(gridDim.x) * (blockDim.x / L);
  const bool mean = b.combiner == Combiner::mean;
  for (int64_t bag = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / L; bag < b.bags; bag += groups) {
    int64_t s = b.offsets[bag], e = b.offsets[bag + 1];
    if (s < 0) s = 0;  // offsets that are not a CSR: never outside rows[]
    if (e > b.nnz) e = b.nnz;
    if (e <= s) continue;
    const float scale = 1.0f / static_cast<float>(e - s);
    float u[C][VEC];  // -(lr * g) for this lane's elements
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int el = (lane + c * L) * VEC;
#pragma unroll
      for (int q = 0; q < VEC; ++q) {
        float g = el + q < dim ? b.grad[bag * dim + el + q] : 0.f;
        if (mean) g = __fmul_rn(g, scale);
        u[c][q] = -__fmul_rn(lr, g);
      }
    }
    // kRows keys at a time: their rows loaded before the first add (an atomic may alias rows[] for the
    // compiler, so a load after it would wait for it)
    for (int64_t k0 = s; k0 < e; k0 += kRows) {
      int64_t row[kRows];
#pragma unroll
      for (int j = 0; j < kRows; ++j) row[j] = k0 + j < e ? __ldg(b.rows + k0 + j) : -1;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        if (row[j] < 0 || row[j] >= capacity_rows) continue;
        float* w = values + row[j] * dim;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const int el = (lane + c * L) * VEC;
          if (el >= dim) continue;
          if constexpr (VEC == 4) add_row(w + el, make_float4(u[c][0], u[c][1], u[c][2], u[c][3]));
          else atomicAdd(w + el, u[c][0]);
        }
      }
    }
  }
}

template <int VEC, int L, int C>
void launch(const BackwardBatch& b, float lr, float* values, int64_t capacity_rows, int dim, Stream stream) {
  const int block = 256;
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t needed = (b.bags + block / L - 1) / (block / L), cap = int64_t(sms) * 8;
  const int grid = int(needed < cap ? needed : cap);
  atomic_sgd_kernel<VEC, L, C><<<grid, block, 0, stream>>>(b, lr, values, capacity_rows, dim);
  CUDA_CHECK_LAUNCH("atomic_sgd_kernel");
}

}  // namespace

void atomic_sgd_update_cuda(const BackwardBatch& b, float lr, float* values, int64_t capacity_rows, int dim,
                            Stream stream) {
  if (b.bags == 0 || b.nnz == 0) return;
  const bool vec4 = dim % 4 == 0 && reinterpret_cast<uintptr_t>(values) % 16 == 0;
  if (vec4) {  // L lanes of float4s: dims 4 / 8 / 16 / 32 / 64 / 128 / 256 → 1 / 2 / 4 / 8 / 16 / 32 / 32 x2
    const int n4 = dim / 4;
    if (n4 <= 1) return launch<4, 1, 1>(b, lr, values, capacity_rows, dim, stream);
    if (n4 <= 2) return launch<4, 2, 1>(b, lr, values, capacity_rows, dim, stream);
    if (n4 <= 4) return launch<4, 4, 1>(b, lr, values, capacity_rows, dim, stream);
    if (n4 <= 8) return launch<4, 8, 1>(b, lr, values, capacity_rows, dim, stream);
    if (n4 <= 16) return launch<4, 16, 1>(b, lr, values, capacity_rows, dim, stream);
    if (n4 <= 32) return launch<4, 32, 1>(b, lr, values, capacity_rows, dim, stream);
    return launch<4, 32, 2>(b, lr, values, capacity_rows, dim, stream);
  }
  if (dim <= 8) return launch<1, 8, 1>(b, lr, values, capacity_rows, dim, stream);
  if (dim <= 32) return launch<1, 32, 1>(b, lr, values, capacity_rows, dim, stream);
  if (dim <= 64) return launch<1, 32, 2>(b, lr, values, capacity_rows, dim, stream);
  if (dim <= 128) return launch<1, 32, 4>(b, lr, values, capacity_rows, dim, stream);
  return launch<1, 32, 8>(b, lr, values, capacity_rows, dim, stream);
}

}  // namespace sparta
