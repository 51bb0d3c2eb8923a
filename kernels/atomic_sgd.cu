// atomic_sgd.cu: CUDA version of atomic_sgd.h. A group of G lanes per bag (the row shape of sparse_optimizer.h:
// float4s or floats, G a power of two up to 32, P vectors per lane) holds the bag's gradient, scaled by -lr (and
// 1/n for mean), in registers, then walks the bag's keys: each key's row gets one vector atomic add per lane and
// vector (red.global.add.v4.f32 on sm_90; no return value, so the keys' adds are all in flight together).
// Grid-stride over bags. With marks (dims >= kAtomicSgdMarkedDim): mark_rows first, then marked_sgd_kernel, whose
// lanes each load one key's row and mark (G keys at a time) and walk them by shuffles, a row one key touches
// taking a plain load, add and store, the others the atomics.
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

template <int V>
__device__ __forceinline__ void add_atomic(float* p, const float* u) {
  if constexpr (V == 4) add_row(p, make_float4(u[0], u[1], u[2], u[3]));
  else atomicAdd(p, u[0]);
}

// Without atomics: for a row no other key of the batch touches.
template <int V>
__device__ __forceinline__ void add_plain(float* p, const float* u) {
  float w[V];
  rowvec::load<V>(p, w);
#pragma unroll
  for (int q = 0; q < V; ++q) w[q] = __fadd_rn(w[q], u[q]);
  rowvec::store<V>(p, w);
}

// Bag `bag`'s keys [s, e), clamped into rows[] (offsets that are not a CSR never reach outside it), and this lane's
// -(lr * g) (lane l of a group holds floats (l + c G) V .. + V for c < P). False for an empty bag.
template <int V, int P>
__device__ __forceinline__ bool bag_step(const BackwardBatch& b, int64_t bag, float lr, int lane, int G, int dim,
                                         int64_t& s, int64_t& e, float (&u)[P][V]) {
  s = b.offsets[bag], e = b.offsets[bag + 1];
  if (s < 0) s = 0;
  if (e > b.nnz) e = b.nnz;
  if (e <= s) return false;
  const bool mean = b.combiner == Combiner::mean;
  const float scale = 1.0f / static_cast<float>(e - s);
  const float* g_bag = b.grad + b.grad_layout.at(bag, dim);
#pragma unroll
  for (int c = 0; c < P; ++c) {
    const int el = (lane + c * G) * V;
#pragma unroll
    for (int q = 0; q < V; ++q) {
      float g = el + q < dim ? g_bag[el + q] : 0.f;
      if (mean) g = __fmul_rn(g, scale);
      u[c][q] = -__fmul_rn(lr, g);
    }
  }
  return true;
}

template <int V, int P>
__global__ void __launch_bounds__(256) atomic_sgd_kernel(BackwardBatch b, float lr, float* values,
                                                         int64_t capacity_rows, int dim, rowvec::RowShape shape) {
  const int G = shape.G;
  const int lane = threadIdx.x & (G - 1);
  const int64_t groups = (int64_t(gridDim.x) * blockDim.x) >> shape.log2_G;
  for (int64_t bag = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> shape.log2_G; bag < b.bags; bag += groups) {
    int64_t s, e;
    float u[P][V];  // -(lr * g) for this lane's elements
    if (!bag_step<V, P>(b, bag, lr, lane, G, dim, s, e, u)) continue;
    for (int64_t k = s; k < e; ++k) {
      const int64_t row = b.rows[k];
      if (row < 0 || row >= capacity_rows) continue;
      float* w = values + row * dim;
#pragma unroll
      for (int c = 0; c < P; ++c) {
        const int el = (lane + c * G) * V;
        if (el >= dim) continue;
        add_atomic<V>(w + el, u[c]);
      }
    }
  }
}

// seen, repeated: bitmaps of (capacity_rows + 31) / 32 words, zeroed. A row's "repeated" bit ends set when two or
// more keys touch it. A key whose row is already marked repeated (read through L2) sets nothing: with skewed keys
// a hot row's keys would otherwise queue one atomic each at the same word (on one H200, 13.6M keys at alpha 1.1:
// 1.12 ms for this pass against 0.27 with the read first; uniform keys 0.25 against 0.28). A stale clear bit only
// costs the atomics it would have cost anyway.
__global__ void __launch_bounds__(256) mark_rows(const int64_t* rows, int64_t nnz, int64_t capacity_rows,
                                                 uint32_t* seen, uint32_t* repeated) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < nnz; k += stride) {
    const int64_t row = rows[k];
    if (row < 0 || row >= capacity_rows) continue;
    const int64_t w = row >> 5;
    const uint32_t bit = 1u << (row & 31);
    if (__ldcg(repeated + w) & bit) continue;
    if (atomicOr(seen + w, bit) & bit) atomicOr(repeated + w, bit);
  }
}

template <int V, int P>
__global__ void __launch_bounds__(256) marked_sgd_kernel(BackwardBatch b, float lr, float* values,
                                                         int64_t capacity_rows, int dim, rowvec::RowShape shape,
                                                         const uint32_t* repeated) {
  const int G = shape.G;
  const int lane = threadIdx.x & (G - 1);
  const unsigned mask = rowvec::group_mask(G);
  const int64_t groups = (int64_t(gridDim.x) * blockDim.x) >> shape.log2_G;
  for (int64_t bag = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> shape.log2_G; bag < b.bags; bag += groups) {
    int64_t s, e;
    float u[P][V];  // -(lr * g) for this lane's elements
    if (!bag_step<V, P>(b, bag, lr, lane, G, dim, s, e, u)) continue;
    for (int64_t k0 = s; k0 < e; k0 += G) {
      // lane j: key k0 + j's row (-1: skipped) and whether other keys touch it
      int64_t my_row = -1;
      int my_repeated = 0;
      if (k0 + lane < e) {
        const int64_t row = b.rows[k0 + lane];
        if (row >= 0 && row < capacity_rows) {
          my_row = row;
          my_repeated = (repeated[row >> 5] >> (row & 31)) & 1u;
        }
      }
      const int n = static_cast<int>(e - k0 < G ? e - k0 : G);
      for (int j = 0; j < n; ++j) {
        const int64_t row = __shfl_sync(mask, my_row, j, G);
        const int rep = __shfl_sync(mask, my_repeated, j, G);
        if (row < 0) continue;
        float* w = values + row * dim;
#pragma unroll
        for (int c = 0; c < P; ++c) {
          const int el = (lane + c * G) * V;
          if (el >= dim) continue;
          if (rep) add_atomic<V>(w + el, u[c]);
          else add_plain<V>(w + el, u[c]);
        }
      }
    }
  }
}

}  // namespace

void atomic_sgd_update_cuda(const BackwardBatch& b, float lr, float* values, int64_t capacity_rows, int dim,
                            uint32_t* marks, Stream stream) {
  if (b.bags == 0 || b.nnz == 0) return;
  const rowvec::RowShape shape = rowvec::row_shape(dim, reinterpret_cast<uintptr_t>(values) % 16 == 0);
  const int block = 256;
  const int64_t words = marks != nullptr ? atomic_sgd_mark_words(capacity_rows, dim) : 0;
  uint32_t* repeated = words > 0 ? marks + words / 2 : nullptr;  // after the seen bits
  if (words > 0) {
    CUDA_CHECK(cudaMemsetAsync(marks, 0, size_t(words) * sizeof(uint32_t), stream));
    mark_rows<<<rowvec::grid_for(b.nnz, 1, block), block, 0, stream>>>(b.rows, b.nnz, capacity_rows, marks, repeated);
    CUDA_CHECK_LAUNCH("mark_rows");
  }
  rowvec::dispatch_shape(shape, [&](auto vv, auto pp) {
    constexpr int V = decltype(vv)::value, P = decltype(pp)::value;
    const int grid = rowvec::grid_for(b.bags, shape.G, block);
    if (words > 0) {
      marked_sgd_kernel<V, P><<<grid, block, 0, stream>>>(b, lr, values, capacity_rows, dim, shape, repeated);
      CUDA_CHECK_LAUNCH("marked_sgd_kernel");
    } else {
      atomic_sgd_kernel<V, P><<<grid, block, 0, stream>>>(b, lr, values, capacity_rows, dim, shape);
      CUDA_CHECK_LAUNCH("atomic_sgd_kernel");
    }
  });
}

}  // namespace sparta
