// key_init.cu: CUDA version of key_init.h: values[rows[i], :] = initial values of keys[i].
#include "src/base/check.h"
#include "kernels/key_init.h"
#include "kernels/row_storage.h"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

// One thread per (key, element): consecutive threads write consecutive elements of a row.
__global__ void __launch_bounds__(256) init_rows_by_key_kernel(const int64_t* keys, const int64_t* rows, int64_t n,
                                                               void* values, int dim, KeyInit init) {
  int64_t total = n * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t k = i / dim;
    int e = static_cast<int>(i - k * dim);
    int64_t row = rows[k];
    if (row >= 0)
      rowstore::store_nearest(values, init.storage, row * dim + e, initial_value(init, static_cast<uint64_t>(keys[k]), e));
  }
}

// One thread per (row, element), as above; the key of row r is offset + r * stride.
__global__ void __launch_bounds__(256) init_rows_strided_kernel(int64_t n, int64_t stride, int64_t offset,
                                                                void* values, int dim, KeyInit init) {
  int64_t total = n * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / dim;
    int e = static_cast<int>(i - r * dim);
    rowstore::store_nearest(values, init.storage, i, initial_value(init, static_cast<uint64_t>(offset + r * stride), e));
  }
}

// ----------------------------------------------------------------------------
// launchers

void init_rows_strided_cuda(int64_t n, int64_t stride, int64_t offset, void* values, int dim, const KeyInit& init,
                            Stream stream) {
  if (n == 0 || dim == 0) return;
  const int block = 256;
  int64_t blocks = (n * dim + block - 1) / block;
  int grid = static_cast<int>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  init_rows_strided_kernel<<<grid, block, 0, stream>>>(n, stride, offset, values, dim, init);
  CUDA_CHECK_LAUNCH("init_rows_strided_kernel");
}

void init_rows_by_key_cuda(const int64_t* keys, const int64_t* rows, int64_t n, void* values, int dim,
                           const KeyInit& init, Stream stream) {
  if (n == 0 || dim == 0) return;
  const int block = 256;
  int64_t blocks = (n * dim + block - 1) / block;
  int grid = static_cast<int>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  init_rows_by_key_kernel<<<grid, block, 0, stream>>>(keys, rows, n, values, dim, init);
  CUDA_CHECK_LAUNCH("init_rows_by_key_kernel");
}

}  // namespace sparta
