// row_traffic.cu: CUDA version of row_traffic.h. A row is L = dim / V lanes of V floats (V = 4: float4 loads and
// stores). The gather: a thread per (bag, lane), grid-stride, loading a bag's rows 8 at a time before adding them
// (8 loads in flight per thread), in key order. The updates: a group of L lanes per kWalk keys (update_kernel).
#include <cuda_runtime.h>

#include "src/base/check.h"
#include "experiments/lab/row_traffic.h"
#include "kernels/sparse_optimizer.h"

namespace sparta {

namespace {

constexpr int kBlock = 256;
constexpr int kGatherBatch = 8;  // rows a gather thread loads before it adds them
constexpr int kWalk = 8;         // keys an update group walks

template <int V>
__global__ void __launch_bounds__(kBlock) gather_kernel(const int64_t* offsets, const int64_t* rows, int64_t bags,
                                                        const float* values, int64_t capacity_rows, int dim,
                                                        float* out) {
  const int lanes = dim / V;
  const int64_t items = bags * lanes;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bag = item / lanes;
    const int lane = int(item % lanes);
    float acc[V];
#pragma unroll
    for (int q = 0; q < V; ++q) acc[q] = 0.f;
    const int64_t end = offsets[bag + 1];
    for (int64_t i = offsets[bag]; i < end; i += kGatherBatch) {
      float x[kGatherBatch][V];
#pragma unroll
      for (int j = 0; j < kGatherBatch; ++j) {
        const int64_t r = i + j < end ? rows[i + j] : -1;
        if (r >= 0 && r < capacity_rows) {
          rowvec::load<V>(values + r * dim + lane * V, x[j]);
        } else {
#pragma unroll
          for (int q = 0; q < V; ++q) x[j][q] = 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < kGatherBatch; ++j)
#pragma unroll
        for (int q = 0; q < V; ++q) acc[q] = __fadd_rn(acc[q], x[j][q]);  // +0 for a skipped key: same bits
    }
    rowvec::store<V>(out + bag * dim + lane * V, acc);
  }
}

// p[0..V) += add, one vector atomic (red.global.add.v4.f32) for V = 4 on sm_90, else one atomic a value.
template <int V>
__device__ __forceinline__ void atomic_add(float* p, float add) {
#if __CUDA_ARCH__ >= 900
  if constexpr (V == 4) {
    atomicAdd(reinterpret_cast<float4*>(p), make_float4(add, add, add, add));
  } else
#endif
  {
#pragma unroll
    for (int q = 0; q < V; ++q) atomicAdd(p + q, add);
  }
}

// A group of dim / V lanes walks kWalk consecutive keys one by one: each row read, added to and written back before
// the next key's (or, atomic, its adds issued). The read and write took longer every other way tried: on one H200
// (13.6M uniform keys over 40M rows) this walk 1.09 / 3.58 ms at dims 32 / 128, one key a thread 1.28 / 3.65, the
// rows of 4 keys a thread loaded before they were stored 1.36 / 4.17, of 8 keys 1.42 / 4.44
// (experiments/NOTES_embedding.md run 22).
template <int V, bool Atomic>
__global__ void __launch_bounds__(kBlock) update_kernel(const int64_t* rows, int64_t nnz, float* values,
                                                        int64_t capacity_rows, int dim, float add) {
  const int lanes = dim / V;
  const int64_t step = (int64_t(gridDim.x) * blockDim.x / lanes) * lanes;  // the threads of whole groups
  const int64_t t0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t0 >= step) return;
  const int lane = int(t0 % lanes);
  for (int64_t first = t0 / lanes * kWalk; first < nnz; first += step / lanes * kWalk) {
    const int64_t end = first + kWalk < nnz ? first + kWalk : nnz;
    for (int64_t k = first; k < end; ++k) {
      const int64_t r = rows[k];
      if (r < 0 || r >= capacity_rows) continue;
      float* p = values + r * dim + lane * V;
      if constexpr (Atomic) {
        atomic_add<V>(p, add);
      } else {
        float w[V];
        rowvec::load<V>(p, w);
#pragma unroll
        for (int q = 0; q < V; ++q) w[q] = __fadd_rn(w[q], add);
        rowvec::store<V>(p, w);
      }
    }
  }
}

int grid_for(int64_t threads) {
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond that
}

bool vectors(int dim, const void* a, const void* b = nullptr) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return dim % 4 == 0 && aligned(a) && (b == nullptr || aligned(b));
}

template <bool Atomic>
void launch_update(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim, float add,
                   Stream stream) {
  if (nnz == 0) return;
  const int64_t groups = (nnz + kWalk - 1) / kWalk;
  if (vectors(dim, values)) {
    update_kernel<4, Atomic><<<grid_for(groups * (dim / 4)), kBlock, 0, stream>>>(rows, nnz, values,
                                                                                    capacity_rows, dim, add);
  } else {
    update_kernel<1, Atomic><<<grid_for(groups * dim), kBlock, 0, stream>>>(rows, nnz, values, capacity_rows,
                                                                              dim, add);
  }
  CUDA_CHECK_LAUNCH(Atomic ? "row_traffic update_kernel (atomic)" : "row_traffic update_kernel (read_write)");
}

}  // namespace

void row_traffic_gather_cuda(const int64_t* offsets, const int64_t* rows, int64_t bags, const float* values,
                             int64_t capacity_rows, int dim, float* out, Stream stream) {
  if (bags == 0) return;
  if (vectors(dim, values, out)) {
    gather_kernel<4><<<grid_for(bags * (dim / 4)), kBlock, 0, stream>>>(offsets, rows, bags, values,
                                                                           capacity_rows, dim, out);
  } else {
    gather_kernel<1><<<grid_for(bags * dim), kBlock, 0, stream>>>(offsets, rows, bags, values, capacity_rows,
                                                                     dim, out);
  }
  CUDA_CHECK_LAUNCH("row_traffic gather_kernel");
}

void row_traffic_read_write_cuda(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim,
                                 float add, Stream stream) {
  launch_update<false>(rows, nnz, values, capacity_rows, dim, add, stream);
}

void row_traffic_atomic_cuda(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim,
                             float add, Stream stream) {
  launch_update<true>(rows, nnz, values, capacity_rows, dim, add, stream);
}

}  // namespace sparta
