// cross_layer.cu: CUDA version of cross_layer.h's elementwise steps. The forward is one grid-stride pass; the
// backward is an op of dense_reduce.cuh's column sum, so the bias gradient comes out of the same pass that
// writes dz, the x0 gradient and the copy of g (deterministic: no atomics).
#include <cuda_bf16.h>

#include "src/base/check.h"
#include "kernels/cross_layer.h"
#include "kernels/dense_reduce.cuh"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

__global__ void __launch_bounds__(256) cross_forward_kernel(const float* x0, const float* z, const float* xl,
                                                            float* out, __nv_bfloat16* out16, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __fadd_rn(__fmul_rn(x0[i], z[i]), xl[i]);  // no FMA: the CPU reference rounds twice too
    out[i] = v;
    if (out16) out16[i] = __float2bfloat16_rn(v);
  }
}

namespace {

struct CrossGrad {
  const float* g;
  const float* x0;
  const float* z;
  float* dz;
  __nv_bfloat16* dz16;
  float* dx0;
  float* g_copy;
  int cols;
  bool accumulate, identity;
  __device__ __forceinline__ float operator()(int64_t r, int c) const {
    const int64_t i = r * cols + c;
    const float gi = g[i];
    const float d = __fmul_rn(gi, x0[i]);
    const float gz = __fmul_rn(gi, z[i]);
    float x = accumulate ? __fadd_rn(dx0[i], gz) : gz;
    if (identity) x = __fadd_rn(x, gi);
    dz[i] = d;
    if (dz16) dz16[i] = __float2bfloat16_rn(d);
    dx0[i] = x;
    if (g_copy) g_copy[i] = gi;
    return d;
  }
};

}  // namespace

// ----------------------------------------------------------------------------
// launchers

void cross_forward_elementwise_cuda(const LinearDims& d, const float* x0, const float* z, const float* xl,
                                    float* out, uint16_t* out16, Stream stream) {
  const size_t n = size_t(d.batch) * d.out;
  if (n == 0) return;
  const int block = 256;
  const size_t blocks = (n + block - 1) / block, cap = size_t(dense::sm_count()) * 16;
  cross_forward_kernel<<<int(blocks < cap ? blocks : cap), block, 0, stream>>>(
      x0, z, xl, out, reinterpret_cast<__nv_bfloat16*>(out16), n);
  CUDA_CHECK_LAUNCH("cross_forward_kernel");
}

void copy_columns_cuda(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                       Stream stream) {
  if (rows == 0 || cols == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_ld) * sizeof(float), src, size_t(src_ld) * sizeof(float),
                               size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
}

void cross_backward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  CrossGrad op{a.g,   a.x0,     a.z, a.dz, reinterpret_cast<__nv_bfloat16*>(a.dz16), a.dx0, a.g_copy,
               d.out, a.accumulate, a.identity};
  dense::column_sums(op, d.batch, d.out, a.db, stream, "cross_backward (column_sum_kernel)");
}

}  // namespace sparta
