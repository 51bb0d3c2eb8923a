// cuda version of cross_layer.h's elementwise steps. Each is one pass over [batch, D]: threads across
// the columns (fp32: four at a time, 16-bit: eight, 16 bytes a load, where the shapes and addresses allow; else
// one), blocks down the rows, so a thread's columns and their bias stay fixed. The backward steps are ops of
// dense_reduce.cuh's column sum: the bias gradient comes out of the pass that writes dz (deterministic: no atomics).
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

// fp32: threads across the columns (N at a time), blocks down the rows.
template <int N>
__global__ void __launch_bounds__(128) cross_forward_kernel(CrossInput x0, const float* z, const float* bias,
                                                            const float* xl, float* out, int64_t rows, int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  if (c >= cols) return;
  const Floats<N> b = load_floats<N>(bias + c);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i = r * cols + c;
    const Floats<N> x = load_floats<N>(x0_ptr(x0.a, x0.b, x0.a_cols, cols, r, c));
    const Floats<N> zv = load_floats<N>(z + i);
    const Floats<N> res = xl ? load_floats<N>(xl + i) : x;
    Floats<N> v;
#pragma unroll
    for (int k = 0; k < N; ++k)  // no FMA: the CPU reference rounds the product and the sum each
      v.v[k] = __fadd_rn(__fmul_rn(x.v[k], __fadd_rn(zv.v[k], b.v[k])), res.v[k]);
    store_floats<N>(out + i, v);
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

// x16's first a_cols columns (rows of ld values) from a [rows, a_cols].
template <class H, int N>
__global__ void __launch_bounds__(128) block_to_half_kernel(const float* a, int a_cols, uint16_t* x16, int64_t rows,
                                                            int ld) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * N;
  if (c >= a_cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    store_half<H, N>(x16 + r * ld + c, load_floats<N>(a + r * a_cols + c));
}

namespace {

// V 16-bit values at p (V = 8: 16 bytes, 16-byte aligned), widened; and V floats rounded into p.
template <class H, int V>
__device__ __forceinline__ void widen(const uint16_t* p, float (&f)[V]) {
  const dense::Halves8 h = dense::load_halves<V>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) f[k] = H::value(h.h[k]);
}
template <class H, int V>
__device__ __forceinline__ void round_into(uint16_t* p, const float (&f)[V]) {
  dense::Halves8 h;
#pragma unroll
  for (int k = 0; k < V; ++k) h.h[k] = H::bits(f[k]);
  dense::store_halves<V>(p, h);
}
template <int V>
__device__ __forceinline__ void load_v(const float* p, float (&f)[V]) {
  if constexpr (V == 8) {
    const Floats<4> a = load_floats<4>(p), b = load_floats<4>(p + 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) f[k] = a.v[k], f[4 + k] = b.v[k];
  } else {
    f[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store_v(float* p, const float (&f)[V]) {
  if constexpr (V == 8) {
    store_floats<4>(p, Floats<4>{{f[0], f[1], f[2], f[3]}});
    store_floats<4>(p + 4, Floats<4>{{f[4], f[5], f[6], f[7]}});
  } else {
    *p = f[0];
  }
}

}  // namespace

// 16-bit forward: threads across the columns (V at a time), blocks down the rows.
template <class H, int V>
__global__ void __launch_bounds__(128) cross_forward_half_kernel(const uint16_t* x16, const uint16_t* z16,
                                                                 const float* bias, const uint16_t* xl16,
                                                                 uint16_t* out16, float* out, int64_t rows,
                                                                 int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  float b[V];
  load_v<V>(bias + c, b);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i = r * cols + c;
    float x[V], zv[V], res[V], v[V];
    widen<H, V>(x16 + i, x);
    widen<H, V>(z16 + i, zv);
    if (xl16) widen<H, V>(xl16 + i, res);
#pragma unroll
    for (int k = 0; k < V; ++k)
      v[k] = __fadd_rn(__fmul_rn(x[k], __fadd_rn(zv[k], b[k])), xl16 ? res[k] : x[k]);
    if (out16) round_into<H, V>(out16 + i, v);
    if (out) store_v<V>(out + i, v);
  }
}

// x0's gradient from every layer's g and z (16-bit), in fp32, into its one or two blocks. Every term's loads are
// issued before the first sum (NT >= t.n terms, unrolled), so that a thread has all of them in flight at once;
// the sums then run in the reference's order (the top layer first, then g_0).
template <class H, int V, int NT>
__global__ void __launch_bounds__(128) cross_input_grad_half_kernel(CrossGradTerms t, int64_t rows, int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i = r * cols + c;
    float* dst = x0_ptr(t.dx0.a, t.dx0.b, t.dx0.a_cols, cols, r, c);
    dense::Halves8 g16[NT], z16[NT], id16;
#pragma unroll
    for (int k = 0; k < NT; ++k)
      if (k < t.n) g16[k] = dense::load_halves<V>(t.g16[k] + i), z16[k] = dense::load_halves<V>(t.z16[k] + i);
    if (t.identity) id16 = dense::load_halves<V>(t.identity + i);
    float v[V];
    if (t.accumulate) load_v<V>(dst, v);
#pragma unroll
    for (int k = NT - 1; k >= 0; --k) {
      if (k >= t.n) continue;
      float b[V];
      load_v<V>(t.bias[k] + c, b);
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const float gz = __fmul_rn(H::value(g16[k].h[q]), __fadd_rn(H::value(z16[k].h[q]), b[q]));
        v[q] = (t.accumulate || k < t.n - 1) ? __fadd_rn(v[q], gz) : gz;
      }
    }
    if (t.identity) {
#pragma unroll
      for (int q = 0; q < V; ++q) v[q] = __fadd_rn(v[q], H::value(id16.h[q]));
    }
    store_v<V>(dst, v);
  }
}

namespace {

// fp32: element (r, c) of the backward step.
struct CrossGrad {
  static constexpr int kCols = 1;
  const float* g;
  CrossInput x0;
  const float* z;
  const float* bias;
  float* dz;
  CrossInputGrad dx0;
  bool accumulate, identity;
  int cols;
  struct In {
    float g, x0, zb, dx0;
  };
  __device__ __forceinline__ In load(int64_t r, int c) const {
    const int64_t i = r * cols + c;
    return {g[i], *x0_ptr(x0.a, x0.b, x0.a_cols, cols, r, c), __fadd_rn(z[i], bias[c]),
            accumulate ? *x0_ptr(dx0.a, dx0.b, dx0.a_cols, cols, r, c) : 0.f};
  }
  __device__ __forceinline__ void finish(const In& in, int64_t r, int c, float* acc) const {
    const int64_t i = r * cols + c;
    const float d = __fmul_rn(in.g, in.x0);
    const float gz = __fmul_rn(in.g, in.zb);
    float x = accumulate ? __fadd_rn(in.dx0, gz) : gz;
    if (identity) x = __fadd_rn(x, in.g);
    dz[i] = d;
    *x0_ptr(dx0.a, dx0.b, dx0.a_cols, cols, r, c) = x;
    acc[0] += d;
  }
};

// 16-bit: elements (r, c .. c + V) of dz = g ⊙ x0, summed into db.
template <class H, int V>
struct CrossGradHalf {
  static constexpr int kCols = V;
  const uint16_t* g16;
  const uint16_t* x16;
  uint16_t* dz16;
  int cols;
  struct In {
    dense::Halves8 g, x;
  };
  __device__ __forceinline__ In load(int64_t r, int c) const {
    const int64_t i = r * cols + c;
    return {dense::load_halves<V>(g16 + i), dense::load_halves<V>(x16 + i)};
  }
  __device__ __forceinline__ void finish(const In& in, int64_t r, int c, float* acc) const {
    float d[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      d[k] = __fmul_rn(H::value(in.g.h[k]), H::value(in.x.h[k]));
      acc[k] += d[k];
    }
    round_into<H, V>(dz16 + r * cols + c, d);
  }
};

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// Whether the fp32 kernels may take four columns at a time: the width and x0's first block a multiple of four,
// every fp32 array 16-byte aligned and every 16-bit one 8-byte aligned.
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

// Whether the 16-bit kernels may take eight columns at a time: the width (and a split x0 gradient's first
// block) a multiple of eight, every array 16-byte aligned.
bool by_eight(int cols, std::initializer_list<const void*> arrays, const CrossInputGrad* dx0 = nullptr) {
  if (cols % 8 != 0) return false;
  if (dx0 && (!aligned(dx0->a, 16) || (dx0->b && (dx0->a_cols % 8 != 0 || !aligned(dx0->b, 16))))) return false;
  for (const void* p : arrays)
    if (p && !aligned(p, 16)) return false;
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
  if (by_four(d.out, a.x0, {a.z, a.bias, a.xl, a.out}, {})) {
    cross_forward_kernel<4><<<row_block_grid(d.batch, d.out, 4), 128, 0, stream>>>(a.x0, a.z, a.bias, a.xl, a.out,
                                                                                   d.batch, d.out);
  } else {
    cross_forward_kernel<1><<<row_block_grid(d.batch, d.out, 1), 128, 0, stream>>>(a.x0, a.z, a.bias, a.xl, a.out,
                                                                                   d.batch, d.out);
  }
  CUDA_CHECK_LAUNCH("cross_forward_kernel");
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

void cross_block_to_half_cuda(const LinearDims& d, GemmType t, const float* a, int a_cols, uint16_t* x16,
                              Stream stream) {
  if (d.batch == 0) return;
  const bool four = a_cols % 4 == 0 && d.out % 4 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(x16) % 8 == 0;
  dense::with_half(t, [&](auto h) {
    using H = decltype(h);
    if (four)
      block_to_half_kernel<H, 4><<<row_block_grid(d.batch, a_cols, 4), 128, 0, stream>>>(a, a_cols, x16, d.batch,
                                                                                          d.out);
    else
      block_to_half_kernel<H, 1><<<row_block_grid(d.batch, a_cols, 1), 128, 0, stream>>>(a, a_cols, x16, d.batch,
                                                                                          d.out);
    CUDA_CHECK_LAUNCH("block_to_half_kernel");
  });
}

void copy_columns_cuda(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                       Stream stream) {
  if (rows == 0 || cols == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_ld) * sizeof(float), src, size_t(src_ld) * sizeof(float),
                               size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
}

void cross_backward_elementwise_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  CrossGrad op{a.g, a.x0, a.z, a.bias, a.dz, a.dx0, a.accumulate, a.identity, d.out};
  dense::column_sums(op, d.batch, d.out, a.db, stream, "cross_backward (column_sum_kernel)");
}

void cross_forward_half_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  if (d.batch == 0) return;
  dense::with_half(a.half, [&](auto h) {
    using H = decltype(h);
    if (by_eight(d.out, {a.x16, a.z16, a.bias, a.xl16, a.out16, a.out}))
      cross_forward_half_kernel<H, 8><<<row_block_grid(d.batch, d.out, 8), 128, 0, stream>>>(
          a.x16, a.z16, a.bias, a.xl16, a.out16, a.out, d.batch, d.out);
    else
      cross_forward_half_kernel<H, 1><<<row_block_grid(d.batch, d.out, 1), 128, 0, stream>>>(
          a.x16, a.z16, a.bias, a.xl16, a.out16, a.out, d.batch, d.out);
    CUDA_CHECK_LAUNCH("cross_forward_half_kernel");
  });
}

void cross_backward_half_cuda(const LinearDims& d, const CrossElementwise& a, Stream stream) {
  dense::with_half(a.half, [&](auto h) {
    using H = decltype(h);
    if (by_eight(d.out, {a.g16, a.x16, a.dz16})) {
      CrossGradHalf<H, 8> op{a.g16, a.x16, a.dz16, d.out};
      dense::column_sums(op, d.batch, d.out, a.db, stream, "cross_backward_half (column_sum_kernel)");
    } else {
      CrossGradHalf<H, 1> op{a.g16, a.x16, a.dz16, d.out};
      dense::column_sums(op, d.batch, d.out, a.db, stream, "cross_backward_half (column_sum_kernel)");
    }
  });
}

void cross_input_grad_half_cuda(const LinearDims& d, const CrossGradTerms& a, Stream stream) {
  if (d.batch == 0) return;
  bool eight = by_eight(d.out, {a.identity}, &a.dx0);
  for (int k = 0; k < a.n; ++k) eight = eight && by_eight(d.out, {a.g16[k], a.z16[k], a.bias[k]});
  dense::with_half(a.half, [&](auto h) {
    using H = decltype(h);
    if (eight && a.n <= 4)
      cross_input_grad_half_kernel<H, 8, 4><<<row_block_grid(d.batch, d.out, 8), 128, 0, stream>>>(a, d.batch, d.out);
    else if (eight)
      cross_input_grad_half_kernel<H, 8, kMaxCrossTerms>
          <<<row_block_grid(d.batch, d.out, 8), 128, 0, stream>>>(a, d.batch, d.out);
    else
      cross_input_grad_half_kernel<H, 1, kMaxCrossTerms>
          <<<row_block_grid(d.batch, d.out, 1), 128, 0, stream>>>(a, d.batch, d.out);
    CUDA_CHECK_LAUNCH("cross_input_grad_half_kernel");
  });
}

}  // namespace sparta
