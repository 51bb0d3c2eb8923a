// cross_layer.cu: CUDA version of cross_layer.h's elementwise steps. The forward and x0's 16-bit copy are one pass
// each over [batch, D] (threads across columns, four at a time where the shapes and addresses allow, blocks down
// the rows: a thread's column and its bias stay fixed); the backward is an op of dense_reduce.cuh's column sum, so
// the bias gradient comes out of the same pass that writes dz and the x0 gradient (deterministic: no atomics).
#include <cstdint>
#include <initializer_list>

#include "src/base/check.h"
#include "kernels/cross_layer.h"
#include "kernels/dense_reduce.cuh"
#include "kernels/half16.cuh"

namespace sparta {

namespace {

// N consecutive floats of a row (N = 1 or 4; 4: 16-byte aligned), and the same of a 16-bit array (8-byte aligned).
template <int N>
struct Floats {
  float v[N];
};

template <int N>
__device__ __forceinline__ Floats<N> load_floats(const float* p) {
  Floats<N> f;
  if constexpr (N == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    f.v[0] = q.x, f.v[1] = q.y, f.v[2] = q.z, f.v[3] = q.w;
  } else {
    f.v[0] = *p;
  }
  return f;
}

template <int N>
__device__ __forceinline__ void store_floats(float* p, const Floats<N>& f) {
  if constexpr (N == 4)
    *reinterpret_cast<float4*>(p) = make_float4(f.v[0], f.v[1], f.v[2], f.v[3]);
  else
    *p = f.v[0];
}

template <class H, int N>
__device__ __forceinline__ Floats<N> load_half(const uint16_t* p) {
  Floats<N> f;
  if constexpr (N == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    f.v[0] = H::value(uint16_t(q.x & 0xFFFFu)), f.v[1] = H::value(uint16_t(q.x >> 16));
    f.v[2] = H::value(uint16_t(q.y & 0xFFFFu)), f.v[3] = H::value(uint16_t(q.y >> 16));
  } else {
    f.v[0] = H::value(*p);
  }
  return f;
}

template <class H, int N>
__device__ __forceinline__ void store_half(uint16_t* p, const Floats<N>& f) {
  if constexpr (N == 4)
    *reinterpret_cast<uint2*>(p) = make_uint2(H::pair(f.v[0], f.v[1]), H::pair(f.v[2], f.v[3]));
  else
    *p = H::bits(f.v[0]);
}

// Where element (r, c) of x0 (or of its gradient) lives: in a, or in b when x0 is two column blocks.
template <class T>
__device__ __forceinline__ T* x0_ptr(T* a, T* b, int a_cols, int cols, int64_t r, int c) {
  if (!b) return a + r * cols + c;
  return c < a_cols ? a + r * a_cols + c : b + r * (cols - a_cols) + (c - a_cols);
}

}  // namespace

// ----------------------------------------------------------------------------
// kernels

// Threads across the columns (N at a time), blocks down the rows. z16 != nullptr: z in 16 bits (H), else fp32 z.
template <class H, int N>
__global__ void __launch_bounds__(128) cross_forward_kernel(CrossInput x0, const float* z, const uint16_t* z16,
                                                            const float* bias, const float* xl, float* out,
                                                            uint16_t* out16, int64_t rows, int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  if (c >= cols) return;
  const Floats<N> b = load_floats<N>(bias + c);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i = r * cols + c;
    const Floats<N> x = load_floats<N>(x0_ptr(x0.a, x0.b, x0.a_cols, cols, r, c));
    const Floats<N> zv = z16 ? load_half<H, N>(z16 + i) : load_floats<N>(z + i);
    const Floats<N> res = xl ? load_floats<N>(xl + i) : x;
    Floats<N> v;
#pragma unroll
    for (int k = 0; k < N; ++k)  // no FMA: the CPU reference rounds the product and the sum each
      v.v[k] = __fadd_rn(__fmul_rn(x.v[k], __fadd_rn(zv.v[k], b.v[k])), res.v[k]);
    if (out) store_floats<N>(out + i, v);
    if (out16) store_half<H, N>(out16 + i, v);
  }
}

template <class H, int N>
__global__ void __launch_bounds__(128) cross_input_to_half_kernel(CrossInput x0, uint16_t* x16, int64_t rows,
                                                                  int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    store_half<H, N>(x16 + r * cols + c, load_floats<N>(x0_ptr(x0.a, x0.b, x0.a_cols, cols, r, c)));
}

namespace {

// Element (r, c) of the backward step; dz may be nullptr (16-bit training reads dz16, of type H, alone).
template <class H>
struct CrossGrad {
  const float* g;
  CrossInput x0;
  const float* z;
  const uint16_t* z16;
  const float* bias;
  float* dz;
  uint16_t* dz16;
  CrossInputGrad dx0;
  bool accumulate, identity;
  int cols;
  struct In {
    float g, x0, zb, dx0;
  };
  __device__ __forceinline__ In load(int64_t r, int c) const {
    const int64_t i = r * cols + c;
    const float zv = z16 ? H::value(z16[i]) : z[i];
    return {g[i], *x0_ptr(x0.a, x0.b, x0.a_cols, cols, r, c), __fadd_rn(zv, bias[c]),
            accumulate ? *x0_ptr(dx0.a, dx0.b, dx0.a_cols, cols, r, c) : 0.f};
  }
  __device__ __forceinline__ float finish(const In& in, int64_t r, int c) const {
    const int64_t i = r * cols + c;
    const float d = __fmul_rn(in.g, in.x0);
    const float gz = __fmul_rn(in.g, in.zb);
    float x = accumulate ? __fadd_rn(in.dx0, gz) : gz;
    if (identity) x = __fadd_rn(x, in.g);
    if (dz) dz[i] = d;
    if (dz16) dz16[i] = H::bits(d);
    *x0_ptr(dx0.a, dx0.b, dx0.a_cols, cols, r, c) = x;
    return d;
  }
};

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// Whether the row-block kernels may take four columns at a time: the width and x0's first block a multiple of
// four, every fp32 array 16-byte aligned and every 16-bit one 8-byte aligned.
bool by_four(int cols, const CrossInput& x0, std::initializer_list<const void*> f32,
             std::initializer_list<const void*> f16) {
  if (cols % 4 != 0 || (x0.b && x0.a_cols % 4 != 0) || !aligned(x0.a, 16) || (x0.b && !aligned(x0.b, 16)))
    return false;
  for (const void* p : f32)
    if (p && !aligned(p, 16)) return false;
  for (const void* p : f16)
    if (p && !aligned(p, 8)) return false;
  return true;
}

// The grid of the row-block kernels: enough column blocks for the width, row blocks for about 16 blocks of 128
// threads on every SM (a full SM: memory requests in flight).
dim3 row_block_grid(int64_t rows, int cols, int n) {
  const int64_t col_blocks = ((cols + n - 1) / n + 127) / 128;
  int64_t row_blocks = int64_t(dense::sm_count()) * 16 / col_blocks;
  if (row_blocks < 1) row_blocks = 1;
  if (row_blocks > rows) row_blocks = rows;
  if (row_blocks > 65535) row_blocks = 65535;
  return dim3(unsigned(col_blocks), unsigned(row_blocks));
}

}  // namespace

// ----------------------------------------------------------------------------
// launchers

void cross_forward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  if (d.batch == 0) return;
  // without a 16-bit array the type is not read: the bf16 instance serves fp32
  dense::with_half(a.out16 || a.z16 ? a.half : GemmType::bf16, [&](auto h) {
    using H = decltype(h);
    if (by_four(d.out, a.x0, {a.z, a.bias, a.xl, a.out}, {a.z16, a.out16})) {
      cross_forward_kernel<H, 4><<<row_block_grid(d.batch, d.out, 4), 128, 0, stream>>>(
          a.x0, a.z, a.z16, a.bias, a.xl, a.out, a.out16, d.batch, d.out);
    } else {
      cross_forward_kernel<H, 1><<<row_block_grid(d.batch, d.out, 1), 128, 0, stream>>>(
          a.x0, a.z, a.z16, a.bias, a.xl, a.out, a.out16, d.batch, d.out);
    }
    CUDA_CHECK_LAUNCH("cross_forward_kernel");
  });
}

void cross_input_to_half_cuda(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16, Stream stream) {
  if (d.batch == 0) return;
  dense::with_half(t, [&](auto h) {
    using H = decltype(h);
    if (by_four(d.out, x0, {}, {x16}))
      cross_input_to_half_kernel<H, 4><<<row_block_grid(d.batch, d.out, 4), 128, 0, stream>>>(x0, x16, d.batch, d.out);
    else
      cross_input_to_half_kernel<H, 1><<<row_block_grid(d.batch, d.out, 1), 128, 0, stream>>>(x0, x16, d.batch, d.out);
    CUDA_CHECK_LAUNCH("cross_input_to_half_kernel");
  });
}

void copy_columns_cuda(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                       Stream stream) {
  if (rows == 0 || cols == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_ld) * sizeof(float), src, size_t(src_ld) * sizeof(float),
                               size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
}

void cross_backward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  dense::with_half(a.dz16 || a.z16 ? a.half : GemmType::bf16, [&](auto h) {
    CrossGrad<decltype(h)> op{a.g, a.x0, a.z, a.z16, a.bias, a.dz, a.dz16, a.dx0, a.accumulate, a.identity, d.out};
    dense::column_sums(op, d.batch, d.out, a.db, stream, "cross_backward (column_sum_kernel)");
  });
}

}  // namespace sparta
