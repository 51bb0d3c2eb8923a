// interaction_dot.cu: CUDA version of interaction_dot.h. T, a sample's S + 1 vectors, is two contiguous spans:
// the bottom row and the S embedding rows.
//
// Where S + 1 <= 32 (MLPerf DLRM: 27 x 128), the streamed kernels: every warp a pipeline of its own over its
// samples, in chunks of 32 columns of T with a ring of cp.async stages per warp, so an SM keeps a dozen warps'
// next chunks in flight while it computes (the forward on the tensor cores, the backward register tiles of
// dZ T). Larger S where a sample fits in 48 KiB: the tiled kernels, a block a sample with its next sample
// copied into a second buffer meanwhile (register tiles of T T^T and of dZ T). Beyond: the general kernels, the
// forward each pair's dot product with one warp (lanes over dim, a shuffle reduction), the backward each element
// of dT with one thread. The grid of the streamed and tiled kernels is the blocks that fit on the GPU at once.
// Every sum has a fixed order: two runs give the same bits. The forward writes fp32 or 16 bits (one rounding of
// the same fp32 value: half16.cuh's).
#include <cmath>
#include <cstdint>
#include <string>

#include "src/base/check.h"
#include "kernels/half16.cuh"
#include "kernels/interaction_dot.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/interaction_dot.cu needs sm_80 or later (cp.async, TF32 mma.sync): build with ARCH=sm_80 or newer"
#endif

namespace sparta {

namespace {
constexpr int kBlock = 256;

// Where the forward's values go: fp32, or the bits of the 16-bit type H (rounded to nearest even once).
struct OutF32 {
  float* p;
  __device__ __forceinline__ void put(int64_t i, float v) const { p[i] = v; }
};
template <class H>
struct OutHalf {
  uint16_t* p;
  __device__ __forceinline__ void put(int64_t i, float v) const { p[i] = H::bits(v); }
};
}  // namespace

// ----------------------------------------------------------------------------
// kernels

// Pair p of the strictly lower triangle in row-major order: (i, j) with p = i(i-1)/2 + j, j < i.
__device__ __forceinline__ void pair_of(int p, int& i, int& j) {
  i = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * float(p))) * 0.5f);
  while (i * (i - 1) / 2 > p) --i;   // float rounding of the square root, either way
  while ((i + 1) * i / 2 <= p) ++i;
  j = p - i * (i - 1) / 2;
}

// Copies sample b's vectors into t [(S+1) * dim].
__device__ __forceinline__ void load_sample(float* t, const float* bottom, const float* emb, int64_t b, int slots,
                                            int dim) {
  const float* bot = bottom + b * dim;
  const float* em = emb + b * int64_t(slots) * dim;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) t[k] = bot[k];
  for (int k = threadIdx.x; k < slots * dim; k += blockDim.x) t[dim + k] = em[k];
}

template <class Out>
__global__ void __launch_bounds__(kBlock)
    interaction_forward_kernel(const float* bottom,  // [batch, dim]
                               const float* emb,     // [batch, slots, dim]
                               Out out,              // [batch, ld]
                               int64_t batch, int slots, int dim, int64_t width, int64_t ld) {
  extern __shared__ float t[];  // [(slots + 1) * dim]
  const int pairs = (slots + 1) * slots / 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    __syncthreads();  // the previous sample's reads are done
    load_sample(t, bottom, emb, b, slots, dim);
    __syncthreads();
    const int64_t o = b * ld;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) out.put(o + k, t[k]);
    for (int64_t c = width + threadIdx.x; c < ld; c += blockDim.x) out.put(o + c, 0.f);
    for (int p = warp; p < pairs; p += warps) {
      int i, j;
      pair_of(p, i, j);
      const float* ti = t + i * dim;
      const float* tj = t + j * dim;
      float s = 0.f;
      for (int k = lane; k < dim; k += 32) s += ti[k] * tj[k];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) out.put(o + dim + p, s);
    }
  }
}

__global__ void __launch_bounds__(kBlock)
    interaction_backward_kernel(const float* dout,    // [batch, ld]
                                const float* bottom,  // [batch, dim]
                                const float* emb,     // [batch, slots, dim]
                                float* dbottom,       // [batch, dim]
                                float* demb,          // [batch, slots, dim]
                                int64_t batch, int slots, int dim, int64_t ld) {
  extern __shared__ float t[];  // [(slots + 1) * dim], then dz [pairs]
  const int n = slots + 1, pairs = n * slots / 2;
  float* dz = t + n * dim;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    __syncthreads();
    load_sample(t, bottom, emb, b, slots, dim);
    const float* g = dout + b * ld;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) dz[p] = g[dim + p];
    __syncthreads();
    for (int e = threadIdx.x; e < n * dim; e += blockDim.x) {
      const int i = e / dim, k = e - i * dim;
      float acc = i == 0 ? g[k] : 0.f;
      const int row_i = i * (i - 1) / 2;
      for (int j = 0; j < i; ++j) acc += dz[row_i + j] * t[j * dim + k];
      for (int j = i + 1; j < n; ++j) acc += dz[j * (j - 1) / 2 + i] * t[j * dim + k];
      if (i == 0) {
        dbottom[b * dim + k] = acc;
      } else {
        demb[(b * slots + (i - 1)) * int64_t(dim) + k] = acc;
      }
    }
  }
}

// ----------------------------------------------------------------------------
// the tiled kernels (S + 1 > 32 where two samples' vectors and the partial sums fit in 48 KiB)
//
// Both keep two buffers of a sample's vectors: while the block computes on sample b in one, the copies of its
// next sample b + gridDim.x into the other are in flight (cp.async, 4 bytes each: any dim, any alignment).
//
// Forward: the Gram matrix T T^T of the sample, in 4 x 4 tiles of its lower block triangle (nb = ceil(n / 4)
// block rows, nb (nb + 1) / 2 tiles). Work item (tile, q) sums k = q, q + 4, q + 8, ... < dim for the tile's 16
// entries in registers (8 shared loads per 16 FMAs); an output entry is then the four items' partial sums
// added in q order. Rows of t have stride ld ≡ 1 (mod 32), so the rows a warp reads at one k fall in different
// banks. Rows n .. 4 nb - 1 of t are zeros.
//
// Backward: dT = dZ T per sample (dZ symmetric, zero diagonal), each work item 8 rows x 4 adjacent columns of
// dT in registers, j from 0 to n - 1 in order (a float4 of dZ^T's column j and one of T's row j per step). The
// sample's row of dout is copied in beside its vectors.

namespace {
constexpr int kTiledBlock = 128;
constexpr int kKSplit = 4;            // forward: k interleaved over four items per tile
constexpr int kPartStride = 17;       // forward: floats per item's 16 partial sums (odd: fewer bank conflicts)
constexpr int kRowsPerItem = 8;       // backward: rows of dT per item
constexpr size_t kTiledSmemLimit = 48 * 1024;

struct ForwardLayout {
  int n, nb, tiles, ld;
  size_t t_floats, part_floats;  // t_floats: one buffer
  size_t bytes() const { return (2 * t_floats + part_floats) * sizeof(float); }
};
ForwardLayout forward_layout(int slots, int dim) {
  ForwardLayout l;
  l.n = slots + 1;
  l.nb = (l.n + 3) / 4;
  l.tiles = l.nb * (l.nb + 1) / 2;
  l.ld = dim + ((33 - dim % 32) % 32);  // the smallest ld >= dim with ld % 32 == 1
  l.t_floats = size_t(4) * l.nb * l.ld;
  l.part_floats = size_t(l.tiles) * kKSplit * kPartStride;
  return l;
}

struct BackwardLayout {
  int n, ni, ld;
  int64_t width;
  size_t t_floats, dz_floats, g_floats;  // t_floats, g_floats: one buffer
  size_t bytes() const { return (2 * t_floats + dz_floats + 2 * g_floats) * sizeof(float); }
};
BackwardLayout backward_layout(int slots, int dim) {
  BackwardLayout l;
  l.n = slots + 1;
  l.ni = (l.n + kRowsPerItem - 1) / kRowsPerItem * kRowsPerItem;
  l.ld = (dim + 3) / 4 * 4;
  l.width = interaction_dot_width(slots, dim);
  l.t_floats = size_t(l.n) * l.ld;
  l.dz_floats = size_t(l.n) * l.ni;
  l.g_floats = size_t(l.width);
  return l;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Asynchronous copies global → shared (sm_80 and later) of 4 or 16 bytes, committed in groups.
__device__ __forceinline__ void copy_async4(float* dst, const float* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async16(float* dst, const float* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for this thread's copies but those of the group committed last.
__device__ __forceinline__ void copy_async_wait_all_but_last() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}
}  // namespace

// Starts copying sample b's vectors into t (row stride ld; columns dim .. ld - 1 untouched) and, when g_src,
// the row g_src [width] into g; commits them as one group, an empty one when b >= batch. kVec: 16 bytes a copy
// (dim and ld multiples of 4, bottom and emb 16-byte aligned), else 4.
template <bool kVec>
__device__ __forceinline__ void fetch_sample(float* t, int ld, const float* bottom, const float* emb, int64_t b,
                                             int64_t batch, int slots, int dim, const float* g_src = nullptr,
                                             float* g = nullptr, int64_t width = 0) {
  if (b < batch) {
    const float* bot = bottom + b * dim;
    const float* em = emb + b * int64_t(slots) * dim;
    const int step = kVec ? 4 : 1, per_row = dim / step, total = (slots + 1) * per_row;
    int row = int(threadIdx.x) / per_row, c = int(threadIdx.x) - row * per_row;  // element e = row, column c * step
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      const int k = c * step;
      float* dst = t + row * ld + k;
      const float* src = row == 0 ? bot + k : em + (e - per_row) * step;
      if (kVec) copy_async16(dst, src);
      else copy_async4(dst, src);
      for (c += blockDim.x; c >= per_row; c -= per_row) ++row;
    }
    if (g_src)
      for (int e = threadIdx.x; e < width; e += blockDim.x) copy_async4(g + e, g_src + e);
  }
  copy_async_commit();
}

// Tile index → its block row bi and block column bj <= bi (tiles in row-major order of the lower triangle).
__device__ __forceinline__ void tile_of(int tile, int& bi, int& bj) {
  bi = static_cast<int>((sqrtf(8.0f * float(tile) + 1.0f) - 1.0f) * 0.5f);
  while (bi * (bi + 1) / 2 > tile) --bi;
  while ((bi + 1) * (bi + 2) / 2 <= tile) ++bi;
  bj = tile - bi * (bi + 1) / 2;
}

template <class Out>
__global__ void __launch_bounds__(kTiledBlock)
    interaction_forward_tiled_kernel(const float* __restrict__ bottom, const float* __restrict__ emb, Out out,
                                     int64_t batch, int slots, int dim, int64_t width, int64_t ld_out, int nb,
                                     int ld) {
  extern __shared__ __align__(16) float smem[];
  const int n = slots + 1, pairs = n * slots / 2, tiles = nb * (nb + 1) / 2, items = tiles * kKSplit;
  const int t_floats = 4 * nb * ld;
  float* part = smem + 2 * t_floats;  // [items][kPartStride], after the two buffers [4 nb][ld]
  for (int e = threadIdx.x + n * ld; e < t_floats; e += blockDim.x) smem[e] = smem[t_floats + e] = 0.f;  // rows past n
  fetch_sample<false>(smem, ld, bottom, emb, blockIdx.x, batch, slots, dim);
  int cur = 0;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x, cur ^= 1) {
    const float* t = smem + cur * t_floats;
    __syncthreads();  // the previous sample's reads of the other buffer and of part are done
    fetch_sample<false>(smem + (cur ^ 1) * t_floats, ld, bottom, emb, b + gridDim.x, batch, slots, dim);
    copy_async_wait_all_but_last();  // this thread's copies of sample b have landed
    __syncthreads();                 // and every thread's
    for (int w = threadIdx.x; w < items; w += blockDim.x) {
      const int tile = w / kKSplit, q = w - tile * kKSplit;
      int bi, bj;
      tile_of(tile, bi, bj);
      const float* ti = t + (4 * bi) * ld;
      const float* tj = t + (4 * bj) * ld;
      float acc[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][c] = 0.f;
      for (int k = q; k < dim; k += kKSplit) {
        float x[4], y[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) x[a] = ti[a * ld + k], y[a] = tj[a * ld + k];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[a][c] = fmaf(x[a], y[c], acc[a][c]);
      }
      float* pp = part + w * kPartStride;
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) pp[a * 4 + c] = acc[a][c];
    }
    __syncthreads();
    const int64_t o = b * ld_out;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) out.put(o + k, t[k]);
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      int i, j;
      pair_of(p, i, j);
      const int bi = i >> 2, bj = j >> 2;
      const float* pp = part + ((bi * (bi + 1) / 2 + bj) * kKSplit) * kPartStride + (i & 3) * 4 + (j & 3);
      float s = pp[0];
#pragma unroll
      for (int q = 1; q < kKSplit; ++q) s += pp[q * kPartStride];
      out.put(o + dim + p, s);
    }
    for (int64_t c = width + threadIdx.x; c < ld_out; c += blockDim.x) out.put(o + c, 0.f);
  }
}

// The backward's register tile: rows i0 .. i0 + kRowsPerItem of dT at columns k0 .. k0 + 3. It starts at the
// identity term (dout's bottom columns, in the first tile only: first != nullptr, valid of them in range) and adds
// dZ[j, i] T[j, k] for j in order, from t (T's row j at t + j * t_ld) and dzt (dZ^T's row j at dzt + j * dz_ld),
// both already offset to the tile.
__device__ __forceinline__ void dt_tile_start(float (&acc)[kRowsPerItem][4], const float* first, int valid) {
#pragma unroll
  for (int a = 0; a < kRowsPerItem; ++a)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[a][e] = 0.f;
  if (first) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][e] = e < valid ? first[e] : 0.f;
  }
}
__device__ __forceinline__ void dt_tile_add(float (&acc)[kRowsPerItem][4], const float* t, const float* dzt) {
  const float4 tv = *reinterpret_cast<const float4*>(t);
  const float4 z0 = *reinterpret_cast<const float4*>(dzt);
  const float4 z1 = *reinterpret_cast<const float4*>(dzt + 4);
  const float zs[kRowsPerItem] = {z0.x, z0.y, z0.z, z0.w, z1.x, z1.y, z1.z, z1.w};
  const float ts[4] = {tv.x, tv.y, tv.z, tv.w};
#pragma unroll
  for (int a = 0; a < kRowsPerItem; ++a)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[a][e] = fmaf(zs[a], ts[e], acc[a][e]);
}

template <bool kVec>
__global__ void __launch_bounds__(kTiledBlock)
    interaction_backward_tiled_kernel(const float* __restrict__ dout, const float* __restrict__ bottom,
                                      const float* __restrict__ emb, float* __restrict__ dbottom,
                                      float* __restrict__ demb, int64_t batch, int slots, int dim, int64_t width,
                                      int64_t ld_dout, int ni, int ld) {
  extern __shared__ __align__(16) float smem[];  // float4 reads: ld and ni are multiples of 4
  const int n = slots + 1, pairs = n * slots / 2;
  const int t_floats = n * ld;
  float* dzt = smem + 2 * t_floats;  // [n][ni]: dzt[j][i] = dZ_ij; the diagonal and i >= n zero
  float* gs = dzt + n * ni;          // two buffers [width]: the samples' rows of dout
  const int groups = ni / kRowsPerItem, quads = ld / 4, items = groups * quads;
  for (int e = threadIdx.x; e < n * ni; e += blockDim.x) dzt[e] = 0.f;
  for (int e = threadIdx.x; e < n * (ld - dim); e += blockDim.x) {  // columns dim .. ld - 1 of both buffers
    const int at = (e / (ld - dim)) * ld + dim + e % (ld - dim);
    smem[at] = smem[t_floats + at] = 0.f;
  }
  fetch_sample<kVec>(smem, ld, bottom, emb, blockIdx.x, batch, slots, dim, dout + blockIdx.x * ld_dout, gs, width);
  int cur = 0;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x, cur ^= 1) {
    const float* t = smem + cur * t_floats;
    const float* g = gs + cur * width;
    __syncthreads();  // the previous sample's reads of the other buffers and of dzt are done
    const int64_t next = b + gridDim.x;
    fetch_sample<kVec>(smem + (cur ^ 1) * t_floats, ld, bottom, emb, next, batch, slots, dim, dout + next * ld_dout,
                 gs + (cur ^ 1) * width, width);
    copy_async_wait_all_but_last();
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      int i, j;
      pair_of(p, i, j);
      const float v = g[dim + p];
      dzt[j * ni + i] = v;
      dzt[i * ni + j] = v;
    }
    __syncthreads();
    for (int w = threadIdx.x; w < items; w += blockDim.x) {
      const int grp = w / quads, k0 = (w - grp * quads) * 4, i0 = grp * kRowsPerItem;
      float acc[kRowsPerItem][4];
      dt_tile_start(acc, i0 == 0 ? g + k0 : nullptr, dim - k0);
      for (int j = 0; j < n; ++j) dt_tile_add(acc, t + j * ld + k0, dzt + j * ni + i0);
#pragma unroll
      for (int a = 0; a < kRowsPerItem; ++a) {
        const int i = i0 + a;
        if (i >= n) break;
        float* dst = i == 0 ? dbottom + b * dim : demb + (b * slots + (i - 1)) * int64_t(dim);
        if (kVec) {
          *reinterpret_cast<float4*>(dst + k0) = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (k0 + c < dim) dst[k0 + c] = acc[a][c];
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------
// the streamed kernels (n = S + 1 <= 32: MLPerf DLRM's 27 x 128, any dim)
//
// Every warp of a block is a pipeline of its own: it takes samples grid-stride (warp w of block x: samples
// x kWarps + w, then every gridDim.x kWarps after) and walks each sample in chunks of kChunk columns of its
// vectors, with a ring of stages in shared memory: while it computes on one chunk, the copies (cp.async) of its
// next stages - 1 chunks are in flight. Shared memory per sample in flight is a chunk's (n rows of kChunk
// floats), not the whole sample's, so an SM keeps many more bytes in flight than with two whole-sample buffers
// (the kernels were bound by the latency of too few bytes in flight). A chunk row has stride kChunkLd ≡ 4
// (mod 8): a tensor-core fragment load (rows 8 r + g, columns k + tq) hits 32 different banks.
//
// Forward: T T^T with mma.sync m16n8k8 on TF32 operands, three products each: every value x split into
// hi = tf32(x) and lo = tf32(x - hi), and x y summed as hi lo' + lo hi' + hi hi' into fp32 accumulators (the
// lo lo' term, about 2^-22 of x y, left out): fp32's accuracy up to the accumulation's rounding. The
// accumulators run over the sample's chunks, k steps of 8 in order; columns past dim read as zeros and rows
// past n read row n - 1 (the products they give are not written). The bottom output is copied out of each
// chunk's row 0; the pairs are gathered in shared memory, then stored lanes over pairs (coalesced).
//
// Backward: dT = dZ T chunk by chunk (columns are independent), each lane 8 rows x 4 adjacent columns of the
// chunk in registers, j from 0 to n - 1 in order (a float4 of dZ^T's column j and one of T's row j per step),
// row 0 starting from dout's first dim columns. A chunk's stage also holds those dout columns (row n), and the
// sample's first chunk the pairs' gradients, which the warp then spreads into its dZ^T [n][32] (diagonal and
// rows past n zero).

namespace {
constexpr int kChunk = 32;         // columns of the sample's vectors a stage holds
constexpr int kChunkLd = 36;       // floats per stage row: ≡ 4 (mod 8), a multiple of 4 (16-byte copies)
constexpr int kFwdWarps = 4;       // forward: warps a block, each its own pipeline
constexpr int kFwdStages = 4;      // forward: stages per warp (kFwdStages - 1 chunks in flight)
constexpr int kBwdWarps = 2;       // backward: warps a block
constexpr int kBwdStages = 3;      // backward: stages per warp
constexpr int kStreamMaxRows = 32; // n <= 32: one m16n8k8 pair of m-tiles (forward), one lane per item (backward)

size_t pairs_floats(int n) { return (size_t(n) * (n - 1) / 2 + 3) / 4 * 4; }  // a multiple of 4: 16-byte copies
size_t fwd_warp_floats(int n) { return kFwdStages * size_t(n) * kChunkLd + pairs_floats(n); }
size_t fwd_stream_bytes(int n) { return size_t(kFwdWarps) * fwd_warp_floats(n) * sizeof(float); }
size_t bwd_stage_floats(int n) {  // rows 0 .. n - 1: T; row n: dout's columns; then the pairs (first chunk)
  return size_t(n + 1) * kChunkLd + pairs_floats(n);
}
size_t bwd_warp_floats(int n) { return kBwdStages * bwd_stage_floats(n) + size_t(n) * kStreamMaxRows; }
size_t bwd_stream_bytes(int n) { return size_t(kBwdWarps) * bwd_warp_floats(n) * sizeof(float); }

__device__ __forceinline__ uint32_t tf32_of(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// c += A B for one m16n8k8 tile: A 16 x 8 row-major (a0 = A[g][tq], a1 = A[g + 8][tq], a2 = A[g][tq + 4],
// a3 = A[g + 8][tq + 4]), B 8 x 8 column-major (b0 = B[tq][g], b1 = B[tq + 4][g]), C 16 x 8 in fp32 (c0, c1 =
// C[g][2 tq], C[g][2 tq + 1]; c2, c3 the same in row g + 8); g = lane / 4, tq = lane % 4 (PTX's fragments).
__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Waits for this thread's copies but those of the kPending groups committed last.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
}  // namespace

// One warp starts copying columns c0 .. min(c0 + kChunk, dim) - 1 of sample b's n vectors into stage [n][kChunkLd]
// (the other columns untouched). kVec: 16 bytes a copy (dim a multiple of 4, bottom and emb 16-byte aligned).
template <bool kVec>
__device__ __forceinline__ void fetch_chunk(float* stage, const float* bottom, const float* emb, int64_t b, int n,
                                            int dim, int c0, int lane) {
  const float* bot = bottom + b * dim + c0;
  const float* em = emb + b * (n - 1) * int64_t(dim) + c0;  // row r >= 1 at em + (r - 1) dim
  if (kVec) {
    const int k = 4 * (lane & 7);
    if (c0 + k < dim)
      for (int r = lane >> 3; r < n; r += 4)
        copy_async16(stage + r * kChunkLd + k, (r == 0 ? bot : em + (r - 1) * int64_t(dim)) + k);
  } else if (c0 + lane < dim) {
    for (int r = 0; r < n; ++r)
      copy_async4(stage + r * kChunkLd + lane, (r == 0 ? bot : em + (r - 1) * int64_t(dim)) + lane);
  }
}

template <class Out, bool kVec>
__global__ void __launch_bounds__(kFwdWarps * 32, 1)
    interaction_forward_mma_kernel(const float* __restrict__ bottom, const float* __restrict__ emb, Out out,
                                   int64_t batch, int slots, int dim, int64_t width, int64_t ld_out) {
  extern __shared__ __align__(16) float smem[];  // per warp kFwdStages stages [n][kChunkLd], then the pairs
  const int n = slots + 1, pairs = n * slots / 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2,
            tq = lane & 3;
  const int64_t first = int64_t(blockIdx.x) * kFwdWarps + warp, stride = int64_t(gridDim.x) * kFwdWarps;
  if (first >= batch) return;  // no block-wide barrier below: the warps are independent
  const int chunks = (dim + kChunk - 1) / kChunk, stage_floats = n * kChunkLd;
  float* stages = smem + warp * (kFwdStages * stage_floats + (pairs + 3) / 4 * 4);
  float* zp = stages + kFwdStages * stage_floats;  // the sample's pairs, gathered for coalesced stores
  // The warp's units are its (sample, chunk) pairs in order; unit u goes to stage u % kFwdStages.
  int64_t fb = first;  // the next unit to fetch: its sample, chunk and stage
  int fc = 0, fs = 0;
  auto fetch = [&] {  // that unit into its stage, committed as one group (empty past the last)
    if (fb < batch) fetch_chunk<kVec>(stages + fs * stage_floats, bottom, emb, fb, n, dim, fc * kChunk, lane);
    copy_async_commit();
    if (++fc == chunks) fc = 0, fb += stride;
    if (++fs == kFwdStages) fs = 0;
  };
  int rows[4];  // where this lane's fragment rows 8 r + g start, clamped to the sample's rows
#pragma unroll
  for (int r = 0; r < 4; ++r) rows[r] = min(8 * r + g, n - 1) * kChunkLd;
#pragma unroll
  for (int u = 0; u < kFwdStages - 1; ++u) fetch();
  // the lower triangle's tiles q = (m, j): m-tile 0 (rows 0-15) with n-tiles 0, 1; m-tile 1 (rows 16-31)
  // with n-tiles 0-3. A of m-tile m: row groups 2 m and 2 m + 1; B of n-tile j: row group j.
  float acc[6][4];
#pragma unroll
  for (int q = 0; q < 6; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[q][e] = 0.f;
  int c = 0, st = 0;  // unit u: its chunk, stage and sample b
  for (int64_t b = first; b < batch; st = st + 1 == kFwdStages ? 0 : st + 1) {
    fetch();  // unit u + kFwdStages - 1, into the stage unit u - 1 used (its reads done: __syncwarp below)
    copy_async_wait<kFwdStages - 1>();
    __syncwarp();  // every lane's copies of unit u have landed
    const float* t = stages + st * stage_floats;
    const int c0 = c * kChunk;
    const int64_t o = b * ld_out;
    if (c0 + lane < dim) out.put(o + c0 + lane, t[lane]);  // row 0: the bottom output, copied
#pragma unroll
    for (int ks = 0; ks < kChunk / 8; ++ks) {
      if (c0 + ks * 8 >= dim) break;
      uint32_t hi[4][2], lo[4][2];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int k = ks * 8 + tq + 4 * h;
          const float x = c0 + k < dim ? t[rows[r] + k] : 0.f;
          hi[r][h] = tf32_of(x);
          lo[r][h] = tf32_of(x - __uint_as_float(hi[r][h]));
        }
#pragma unroll
      for (int q = 0; q < 6; ++q) {
        const int m = q < 2 ? 0 : 1, j = q < 2 ? q : q - 2, ra = 2 * m, rb = 2 * m + 1;
        mma_tf32(acc[q], hi[ra][0], hi[rb][0], hi[ra][1], hi[rb][1], lo[j][0], lo[j][1]);
        mma_tf32(acc[q], lo[ra][0], lo[rb][0], lo[ra][1], lo[rb][1], hi[j][0], hi[j][1]);
        mma_tf32(acc[q], hi[ra][0], hi[rb][0], hi[ra][1], hi[rb][1], hi[j][0], hi[j][1]);
      }
    }
    if (++c == chunks) {  // the sample's last chunk: its pairs and the padding
#pragma unroll
      for (int q = 0; q < 6; ++q) {
        const int m = q < 2 ? 0 : 1, j = q < 2 ? q : q - 2;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = 16 * m + g + (e >= 2 ? 8 : 0), col = 8 * j + 2 * tq + (e & 1);
          if (col < row && row < n) zp[row * (row - 1) / 2 + col] = acc[q][e];
          acc[q][e] = 0.f;
        }
      }
      __syncwarp();
      for (int p = lane; p < pairs; p += 32) out.put(o + dim + p, zp[p]);
      for (int64_t k = width + lane; k < ld_out; k += 32) out.put(o + k, 0.f);
      c = 0;
      b += stride;
    }
    __syncwarp();  // this stage's (and zp's) reads are done before unit u + 1 copies into it
  }
  copy_async_wait<0>();  // no copy outlives the block (only empty groups remain)
}

template <bool kVec>
__global__ void __launch_bounds__(kBwdWarps * 32, 1)
    interaction_backward_stream_kernel(const float* __restrict__ dout, const float* __restrict__ bottom,
                                       const float* __restrict__ emb, float* __restrict__ dbottom,
                                       float* __restrict__ demb, int64_t batch, int slots, int dim,
                                       int64_t ld_dout) {
  extern __shared__ __align__(16) float smem[];  // per warp kBwdStages stages, then dZ^T [n][32]
  const int n = slots + 1, pairs = n * slots / 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first = int64_t(blockIdx.x) * kBwdWarps + warp, stride = int64_t(gridDim.x) * kBwdWarps;
  if (first >= batch) return;  // no block-wide barrier below: the warps are independent
  const int chunks = (dim + kChunk - 1) / kChunk;
  const int stage_floats = (n + 1) * kChunkLd + (pairs + 3) / 4 * 4;
  float* stages = smem + warp * (kBwdStages * stage_floats + n * kStreamMaxRows);
  float* dzt = stages + kBwdStages * stage_floats;  // dzt[j][i] = dZ_ij
  for (int e = lane; e < n * kStreamMaxRows; e += 32) dzt[e] = 0.f;
  int64_t fb = first;  // the next unit to fetch (as in the forward)
  int fc = 0, fs = 0;
  auto fetch = [&] {
    if (fb < batch) {
      const int c0 = fc * kChunk;
      float* st = stages + fs * stage_floats;
      fetch_chunk<kVec>(st, bottom, emb, fb, n, dim, c0, lane);
      const float* g = dout + fb * ld_dout;
      if (c0 + lane < dim) copy_async4(st + n * kChunkLd + lane, g + c0 + lane);
      if (c0 == 0)
        for (int p = lane; p < pairs; p += 32) copy_async4(st + (n + 1) * kChunkLd + p, g + dim + p);
    }
    copy_async_commit();
    if (++fc == chunks) fc = 0, fb += stride;
    if (++fs == kBwdStages) fs = 0;
  };
#pragma unroll
  for (int u = 0; u < kBwdStages - 1; ++u) fetch();
  const int i0 = (lane >> 3) * 8, k0 = (lane & 7) * 4;  // this lane's rows i0 .. i0 + 7, columns k0 .. k0 + 3
  int c = 0, st = 0;
  for (int64_t b = first; b < batch; st = st + 1 == kBwdStages ? 0 : st + 1) {
    fetch();
    copy_async_wait<kBwdStages - 1>();
    __syncwarp();
    const float* t = stages + st * stage_floats;
    const int c0 = c * kChunk;
    if (c == 0) {  // the sample's dZ (the previous sample's reads of dzt are done: __syncwarp below)
      const float* dz = t + (n + 1) * kChunkLd;
      for (int p = lane; p < pairs; p += 32) {
        int i, j;
        pair_of(p, i, j);
        const float v = dz[p];
        dzt[j * kStreamMaxRows + i] = v;
        dzt[i * kStreamMaxRows + j] = v;
      }
      __syncwarp();
    }
    float acc[kRowsPerItem][4];
    dt_tile_start(acc, i0 == 0 ? t + n * kChunkLd + k0 : nullptr, dim - c0 - k0);
#pragma unroll 4
    for (int j = 0; j < n; ++j)  // unrolled: the next steps' shared loads issued ahead of this step's FMAs
      dt_tile_add(acc, t + j * kChunkLd + k0, dzt + j * kStreamMaxRows + i0);
    const int k = c0 + k0;
    const int64_t row0 = (b * slots + i0 - 1) * int64_t(dim) + k;  // demb's row i >= 1 at row0 + (i - i0) dim
#pragma unroll
    for (int a = 0; a < kRowsPerItem; ++a) {
      const int i = i0 + a;
      if (i >= n || k >= dim) break;
      float* dst = i == 0 ? dbottom + b * dim + k : demb + (row0 + a * int64_t(dim));
      if (kVec) {
        *reinterpret_cast<float4*>(dst) = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k + e < dim) dst[e] = acc[a][e];
      }
    }
    if (++c == chunks) c = 0, b += stride;
    __syncwarp();  // this stage's (and dzt's) reads are done before they are written again
  }
  copy_async_wait<0>();
}

// ----------------------------------------------------------------------------
// launchers

namespace {

// The general kernels: blocks for one sample each, grid-stride beyond; the dynamic shared memory opted in when
// above 48 KiB.
template <class Kernel>
int prepare(Kernel kernel, const InteractionDims& d, size_t smem, const char* what) {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SPARTA_REQUIRE(smem <= size_t(optin),
                 "interaction '%s': %s needs %zu bytes of shared memory per sample ((slots + 1) x dim = %d x %d "
                 "floats), expected at most %d on this GPU",
                 d.layer, what, smem, d.slots + 1, d.dim, optin);
  if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t cap = int64_t(1) << 20;
  return static_cast<int>(d.batch < cap ? d.batch : cap);
}

// The tiled kernels: the blocks that are resident at once (each then takes its samples grid-stride, so that its
// copy of the next sample overlaps its work on this one), at most one per sample.
template <class Kernel>
int resident_grid(Kernel kernel, int64_t batch, int block, size_t smem) {
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem));
  const int64_t cap = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<int>(batch < cap ? batch : cap);
}

// The streamed kernels: their shared memory opted in, then the resident blocks, at most one warp per sample.
template <class Kernel>
int stream_grid(Kernel kernel, const InteractionDims& d, int warps, size_t smem, const char* what) {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SPARTA_REQUIRE(smem <= size_t(optin),
                 "interaction '%s': %s needs %zu bytes of shared memory per block (slots + 1 = %d vectors), "
                 "expected at most %d on this GPU",
                 d.layer, what, smem, d.slots + 1, optin);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  return resident_grid(kernel, (d.batch + warps - 1) / warps, warps * 32, smem);
}

template <class Out>
void forward_with(const InteractionDims& d, const float* bottom, const float* emb, Out out, Stream stream) {
  const int64_t width = interaction_dot_width(d.slots, d.dim), ld = interaction_dot_ld(d);
  const std::string path = interaction_dot_forward_path(d.slots, d.dim);
  if (path == "tensor") {
    const int n = d.slots + 1;
    SPARTA_ASSERT(n <= kStreamMaxRows, "interaction: tensor-core forward");
    const size_t smem = fwd_stream_bytes(n);
    auto launch = [&](auto kernel) {
      const int grid = stream_grid(kernel, d, kFwdWarps, smem, "the tensor-core forward");
      kernel<<<grid, kFwdWarps * 32, smem, stream>>>(bottom, emb, out, d.batch, d.slots, d.dim, width, ld);
      CUDA_CHECK_LAUNCH("interaction_forward_mma_kernel");
    };
    if (d.dim % 4 == 0 && aligned16(bottom) && aligned16(emb))
      launch(interaction_forward_mma_kernel<Out, true>);
    else
      launch(interaction_forward_mma_kernel<Out, false>);
    return;
  }
  const ForwardLayout l = forward_layout(d.slots, d.dim);
  SPARTA_ASSERT(l.bytes() == interaction_dot_tiled_smem(d.slots, d.dim, false), "interaction: tiled layout");
  if (path == "tiled") {
    SPARTA_ASSERT(l.bytes() <= kTiledSmemLimit, "interaction: tiled layout");
    const int grid = resident_grid(interaction_forward_tiled_kernel<Out>, d.batch, kTiledBlock, l.bytes());
    interaction_forward_tiled_kernel<Out><<<grid, kTiledBlock, l.bytes(), stream>>>(bottom, emb, out, d.batch, d.slots,
                                                                                     d.dim, width, ld, l.nb, l.ld);
    CUDA_CHECK_LAUNCH("interaction_forward_tiled_kernel");
    return;
  }
  const size_t smem = size_t(d.slots + 1) * d.dim * sizeof(float);
  const int grid = prepare(interaction_forward_kernel<Out>, d, smem, "the forward");
  interaction_forward_kernel<Out><<<grid, kBlock, smem, stream>>>(bottom, emb, out, d.batch, d.slots, d.dim, width, ld);
  CUDA_CHECK_LAUNCH("interaction_forward_kernel");
}

}  // namespace

void interaction_dot_forward_cuda(const InteractionDims& d, const float* bottom, const float* emb, float* out,
                                  GemmType t, uint16_t* out16, Stream stream) {
  if (d.batch == 0) return;
  if (!out16) return forward_with(d, bottom, emb, OutF32{out}, stream);
  dense::with_half(t, [&](auto h) { forward_with(d, bottom, emb, OutHalf<decltype(h)>{out16}, stream); });
}

void interaction_dot_backward_cuda(const InteractionDims& d, const float* dout, const float* bottom,
                                   const float* emb, float* dbottom, float* demb, Stream stream) {
  if (d.batch == 0) return;
  const int64_t width = interaction_dot_width(d.slots, d.dim), ld = interaction_dot_ld(d);
  if (d.slots + 1 <= kStreamMaxRows) {
    const size_t smem = bwd_stream_bytes(d.slots + 1);
    auto launch = [&](auto kernel) {
      const int grid = stream_grid(kernel, d, kBwdWarps, smem, "the backward");
      kernel<<<grid, kBwdWarps * 32, smem, stream>>>(dout, bottom, emb, dbottom, demb, d.batch, d.slots, d.dim, ld);
      CUDA_CHECK_LAUNCH("interaction_backward_stream_kernel");
    };
    if (d.dim % 4 == 0 && aligned16(bottom) && aligned16(emb) && aligned16(dbottom) && aligned16(demb))
      launch(interaction_backward_stream_kernel<true>);
    else
      launch(interaction_backward_stream_kernel<false>);
    return;
  }
  const BackwardLayout l = backward_layout(d.slots, d.dim);
  SPARTA_ASSERT(l.bytes() == interaction_dot_tiled_smem(d.slots, d.dim, true), "interaction: tiled layout");
  if (l.bytes() <= kTiledSmemLimit) {
    auto launch = [&](auto kernel) {
      const int grid = resident_grid(kernel, d.batch, kTiledBlock, l.bytes());
      kernel<<<grid, kTiledBlock, l.bytes(), stream>>>(dout, bottom, emb, dbottom, demb, d.batch, d.slots, d.dim,
                                                       width, ld, l.ni, l.ld);
      CUDA_CHECK_LAUNCH("interaction_backward_tiled_kernel");
    };
    if (d.dim % 4 == 0 && aligned16(bottom) && aligned16(emb) && aligned16(dbottom) && aligned16(demb))
      launch(interaction_backward_tiled_kernel<true>);
    else
      launch(interaction_backward_tiled_kernel<false>);
    return;
  }
  const size_t pairs = size_t(d.slots + 1) * d.slots / 2;
  const size_t smem = (size_t(d.slots + 1) * d.dim + pairs) * sizeof(float);
  const int grid = prepare(interaction_backward_kernel, d, smem, "the backward");
  interaction_backward_kernel<<<grid, kBlock, smem, stream>>>(dout, bottom, emb, dbottom, demb, d.batch, d.slots,
                                                              d.dim, ld);
  CUDA_CHECK_LAUNCH("interaction_backward_kernel");
}

}  // namespace sparta
