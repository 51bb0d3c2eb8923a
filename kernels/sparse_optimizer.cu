// sparse_optimizer.cu: CUDA version of sparse_optimizer.h: one group of lanes per unique row reads the row's
// gradient and applies the optimizer to its values and state (the formulas are in the header).
#include <cstdint>

#include "src/base/check.h"
#include "kernels/sparse_optimizer.h"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

// Grid-stride over unique rows u < min(*num_unique, max_unique): the count is read on the device.
template <OptimizerKind K, int V, int P>
__global__ void __launch_bounds__(256)
    sparse_update_kernel(rowvec::RowUpdate<K, V, P> op, const int64_t* unique_rows,  // [max_unique]
                         const float* row_grads,                                       // [max_unique, dim]
                         const int32_t* num_unique, int64_t max_unique, int64_t capacity_rows, int G, int log2_G) {
  const int64_t n = min(int64_t(*num_unique), max_unique);
  const int lane = threadIdx.x & (G - 1);
  const int nv = op.dim / V;
  const int64_t groups = (int64_t(gridDim.x) * blockDim.x) >> log2_G;
  for (int64_t u = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> log2_G; u < n; u += groups) {
    const int64_t row = unique_rows[u];
    if (row < 0 || row >= capacity_rows) continue;  // uniform in the group
    const float* g = row_grads + u * op.dim;
    float acc[P * V];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int col = lane + p * G;
      if (col < nv) {
        rowvec::load_ro<V>(g + col * V, acc + p * V);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) acc[p * V + v] = 0.f;
      }
    }
    op.apply(uint32_t(row), lane, G, acc);
  }
}

// ----------------------------------------------------------------------------
// launchers

namespace rowvec {

RowShape row_shape(int dim, bool aligned16) {
  RowShape s;
  s.V = (dim % 4 == 0 && aligned16) ? 4 : 1;
  const int nv = dim / s.V;
  while (s.G < nv && s.G < 32) s.G *= 2, s.log2_G += 1;
  const int p = (nv + s.G - 1) / s.G;
  while (s.P < p) s.P *= 2;
  return s;
}

int grid_for(int64_t units, int G, int block) {
  static thread_local int sms = 0, sms_device = -1;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device != sms_device) {
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    sms_device = device;
  }
  const int64_t per_block = block / G;
  int64_t blocks = (units + per_block - 1) / per_block;
  // Two waves of full occupancy; beyond that the kernels grid-stride (latency is hidden by resident warps).
  const int64_t cap = int64_t(sms) * (2048 / block) * 2;
  if (blocks > cap) blocks = cap;
  return static_cast<int>(blocks < 1 ? 1 : blocks);
}

}  // namespace rowvec

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace

void sparse_optimizer_update_cuda(const OptimizerStep& c, const int64_t* unique_rows, const float* row_grads,
                                  const int32_t* num_unique, int64_t max_unique, float* values, float* state,
                                  int64_t capacity_rows, int dim, Stream stream) {
  if (max_unique <= 0) return;
  const int width = optimizer_state_width(c.kind, dim);
  const bool state_vec = width == 0 || c.kind == OptimizerKind::lazy_adam || aligned16(state);
  const rowvec::RowShape shape = rowvec::row_shape(dim, aligned16(values) && aligned16(row_grads) && state_vec);
  const int block = 256;
  const int grid = rowvec::grid_for(max_unique, shape.G, block);
  dispatch_optimizer(c.kind, [&](auto kind) {
    constexpr OptimizerKind K = decltype(kind)::value;
    rowvec::dispatch_shape(shape, [&](auto v, auto p) {
      constexpr int V = decltype(v)::value, P = decltype(p)::value;
      rowvec::RowUpdate<K, V, P> op{c, values, state, dim, width};
      sparse_update_kernel<K, V, P><<<grid, block, 0, stream>>>(op, unique_rows, row_grads, num_unique, max_unique,
                                                                capacity_rows, shape.G, shape.log2_G);
      CUDA_CHECK_LAUNCH("sparse_update_kernel");
    });
  });
}

}  // namespace sparta
