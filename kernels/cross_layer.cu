// cross_layer.cu: CUDA version of cross_layer.h's elementwise steps. The forward is one grid-stride pass; the
// backward is an op of dense_reduce.cuh's column sum, so the bias gradient comes out of the same pass that
// writes dz, the x0 gradient and the copy of g (deterministic: no atomics).
#include <cstdint>

#include "src/base/check.h"
#include "kernels/cross_layer.h"
#include "kernels/dense_reduce.cuh"
#include "kernels/half16.cuh"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

// out16 (when not nullptr) in the 16-bit type H (half16.cuh).
template <class H>
__global__ void __launch_bounds__(256) cross_forward_kernel(const float* x0, const float* z, const float* xl,
                                                            float* out, uint16_t* out16, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __fadd_rn(__fmul_rn(x0[i], z[i]), xl[i]);  // no FMA: the CPU reference rounds twice too
    if (out) out[i] = v;
    if (out16) out16[i] = H::bits(v);
  }
}

// The same over n4 groups of four elements: float4 loads and stores (every array 16-byte aligned, out16 8-byte).
template <class H>
__global__ void __launch_bounds__(256) cross_forward_vec_kernel(const float4* __restrict__ x0,
                                                                const float4* __restrict__ z,
                                                                const float4* __restrict__ xl, float4* __restrict__ out,
                                                                uint2* __restrict__ out16, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 a = x0[i], b = z[i], c = xl[i];
    float4 v;
    v.x = __fadd_rn(__fmul_rn(a.x, b.x), c.x);
    v.y = __fadd_rn(__fmul_rn(a.y, b.y), c.y);
    v.z = __fadd_rn(__fmul_rn(a.z, b.z), c.z);
    v.w = __fadd_rn(__fmul_rn(a.w, b.w), c.w);
    if (out) out[i] = v;
    if (out16) {
      uint2 bits;
      bits.x = H::pair(v.x, v.y);
      bits.y = H::pair(v.z, v.w);
      out16[i] = bits;
    }
  }
}

namespace {

// Element i of the backward step; dz may be nullptr (16-bit training reads dz16, of type H, alone).
template <class H>
struct CrossGrad {
  const float* g;
  const float* x0;
  const float* z;
  float* dz;
  uint16_t* dz16;
  float* dx0;
  float* g_copy;
  bool accumulate, identity;
  struct In {
    float g, x0, z, dx0;
  };
  __device__ __forceinline__ In load(int64_t i) const { return {g[i], x0[i], z[i], accumulate ? dx0[i] : 0.f}; }
  __device__ __forceinline__ float finish(const In& in, int64_t i) const {
    const float d = __fmul_rn(in.g, in.x0);
    const float gz = __fmul_rn(in.g, in.z);
    float x = accumulate ? __fadd_rn(in.dx0, gz) : gz;
    if (identity) x = __fadd_rn(x, in.g);
    if (dz) dz[i] = d;
    if (dz16) dz16[i] = H::bits(d);
    dx0[i] = x;
    if (g_copy) g_copy[i] = in.g;
    return d;
  }
};

}  // namespace

// ----------------------------------------------------------------------------
// launchers

void cross_forward_elementwise_cuda(const LinearDims& d, GemmType t, const float* x0, const float* z,
                                    const float* xl, float* out, uint16_t* out16, Stream stream) {
  const size_t n = size_t(d.batch) * d.out;
  if (n == 0) return;
  const int block = 256;
  const size_t cap = size_t(dense::sm_count()) * 16;
  auto aligned = [](const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; };
  // without a 16-bit copy the type is not read: the bf16 instance serves fp32
  dense::with_half(out16 ? t : GemmType::bf16, [&](auto h) {
    using H = decltype(h);
    if (n % 4 == 0 && aligned(x0, 16) && aligned(z, 16) && aligned(xl, 16) && (!out || aligned(out, 16)) &&
        (!out16 || aligned(out16, 8))) {
      const size_t n4 = n / 4, blocks = (n4 + block - 1) / block;
      cross_forward_vec_kernel<H><<<int(blocks < cap ? blocks : cap), block, 0, stream>>>(
          reinterpret_cast<const float4*>(x0), reinterpret_cast<const float4*>(z),
          reinterpret_cast<const float4*>(xl), reinterpret_cast<float4*>(out), reinterpret_cast<uint2*>(out16), n4);
      CUDA_CHECK_LAUNCH("cross_forward_vec_kernel");
      return;
    }
    const size_t blocks = (n + block - 1) / block;
    cross_forward_kernel<H><<<int(blocks < cap ? blocks : cap), block, 0, stream>>>(x0, z, xl, out, out16, n);
    CUDA_CHECK_LAUNCH("cross_forward_kernel");
  });
}

void copy_columns_cuda(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                       Stream stream) {
  if (rows == 0 || cols == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_ld) * sizeof(float), src, size_t(src_ld) * sizeof(float),
                               size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
}

void cross_backward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  dense::with_half(a.dz16 ? a.half : GemmType::bf16, [&](auto h) {
    CrossGrad<decltype(h)> op{a.g, a.x0, a.z, a.dz, a.dz16, a.dx0, a.g_copy, a.accumulate, a.identity};
    dense::column_sums(op, d.batch, d.out, a.db, stream, "cross_backward (column_sum_kernel)");
  });
}

}  // namespace sparta
