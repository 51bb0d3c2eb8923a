// fill.cu: CUDA version of fill.h: out[i] = value.
#include "src/base/check.h"
#include "kernels/fill.h"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

template <typename T>
__global__ void __launch_bounds__(256) fill_kernel(T* out, size_t n, T value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

// ----------------------------------------------------------------------------
// launchers

namespace {
template <typename T>
void launch_fill(T* out, size_t n, T value, Stream stream) {
  if (n == 0) return;
  const int block = 256;
  size_t blocks = (n + block - 1) / block;
  int grid = static_cast<int>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond that
  fill_kernel<T><<<grid, block, 0, stream>>>(out, n, value);
  CUDA_CHECK_LAUNCH("fill_kernel");
}
}  // namespace

void fill_cuda(float* out, size_t n, float value, Stream stream) { launch_fill(out, n, value, stream); }
void fill_cuda(int64_t* out, size_t n, int64_t value, Stream stream) { launch_fill(out, n, value, stream); }

}  // namespace sparta
