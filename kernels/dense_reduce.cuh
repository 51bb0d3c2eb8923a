// dense_reduce.cuh: what the dense layers' CUDA files share: the per-stream cuBLASLt handle and scratch
// (dense_linear.cu owns them), and a fused "elementwise op, then sum over the batch" kernel for bias
// gradients (dense_linear.cu, cross_layer.cu).
//
// The column sum is deterministic: rows are cut into a fixed number of chunks (by the GPU's SM count and the
// shape, never by timing), each block sums its rows of its columns in a fixed order and a tree in shared
// memory, and a second pass adds the chunks' partial sums in a fixed order. No atomics: two runs, same bits.
// Reads are coalesced (a warp reads adjacent columns of a row: one each, or eight 16-bit ones, 16 bytes) and
// each thread has kSumUnroll rows of loads in flight, which the pass needs to run at the memory's bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "src/base/check.h"
#include "src/base/device.h"

namespace sparta {
namespace dense {

// fp32 scratch of at least `floats` elements for work queued on `stream` (one per device and stream; grows,
// waiting for the stream when it does; never shrinks).
float* stream_scratch(Stream stream, size_t floats);
// Multiprocessors of the current device.
int sm_count();

constexpr int kSumBlock = 256;

// Eight 16-bit values (16 bytes, 16-byte aligned) and their loads and stores: the 16-bit passes move 16 bytes a
// thread, as the fp32 ones move a float4.
struct Halves8 {
  uint16_t h[8];
};
__device__ __forceinline__ Halves8 load8(const uint16_t* p) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  Halves8 v;
  const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) v.h[2 * k] = uint16_t(w[k] & 0xFFFFu), v.h[2 * k + 1] = uint16_t(w[k] >> 16);
  return v;
}
__device__ __forceinline__ void store8(uint16_t* p, const Halves8& v) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = unsigned(v.h[2 * k]) | (unsigned(v.h[2 * k + 1]) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
// V = 8: load8/store8; V = 1: the first value alone.
template <int V>
__device__ __forceinline__ Halves8 load_halves(const uint16_t* p) {
  if constexpr (V == 8) return load8(p);
  Halves8 v;
  v.h[0] = *p;
  return v;
}
template <int V>
__device__ __forceinline__ void store_halves(uint16_t* p, const Halves8& v) {
  if constexpr (V == 8)
    store8(p, v);
  else
    *p = v.h[0];
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

constexpr int kSumUnroll = 4;  // rows each thread loads before it finishes any: memory requests in flight

// Columns [c, c + Op::kCols) of rows [chunk * rows_per_chunk, ...): tc column groups side by side, kSumBlock / tc
// row lanes; a thread's group of kCols adjacent columns (1, or 8 for 16-byte loads of 16-bit arrays) stays fixed.
// op.load(r, c) reads what the group's elements of row r need; op.finish(in, r, c, acc) computes them (writing
// whatever outputs it has) and adds what each column sums to acc[0 .. kCols). A thread loads kSumUnroll rows
// before it finishes them (in row order): an element's outputs are written by the thread that read its inputs,
// so outputs may alias inputs. cols is a multiple of kCols.
template <class Op>
__global__ void __launch_bounds__(kSumBlock)
    column_sum_kernel(Op op, int64_t rows, int cols, int tc, int log2_tc, int64_t rows_per_chunk,
                      float* partial) {  // [chunks, cols] or nullptr
  constexpr int V = Op::kCols;
  __shared__ float part[V][kSumBlock];
  const int tx = threadIdx.x & (tc - 1), ty = threadIdx.x >> log2_tc, lanes = kSumBlock / tc;
  const int c = (blockIdx.x * tc + tx) * V;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float acc[V];
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] = 0.f;
  if (c < cols) {
    int64_t r = begin + ty;
    for (; r + int64_t(kSumUnroll - 1) * lanes < end; r += int64_t(kSumUnroll) * lanes) {
      typename Op::In in[kSumUnroll];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) in[u] = op.load(r + int64_t(u) * lanes, c);
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) op.finish(in[u], r + int64_t(u) * lanes, c, acc);
    }
    for (; r < end; r += lanes) op.finish(op.load(r, c), r, c, acc);
  }
  if (!partial) return;
#pragma unroll
  for (int v = 0; v < V; ++v) part[v][threadIdx.x] = acc[v];
  __syncthreads();
  for (int s = lanes / 2; s > 0; s >>= 1) {
    if (ty < s) {
#pragma unroll
      for (int v = 0; v < V; ++v) part[v][threadIdx.x] += part[v][threadIdx.x + s * tc];
    }
    __syncthreads();
  }
  if (ty == 0 && c < cols) {
#pragma unroll
    for (int v = 0; v < V; ++v) partial[int64_t(blockIdx.y) * cols + c + v] = part[v][tx];
  }
}

// sums[c] = Σ_chunk partial[chunk, c] in a fixed order (a launcher: dense_linear.cu holds its kernel).
void add_chunks(const float* partial, int chunks, int cols, float* sums, Stream stream);

// Runs op over every element of a [rows, cols] matrix (cols a multiple of Op::kCols) and, when sums != nullptr,
// writes its column sums.
template <class Op>
void column_sums(Op op, int64_t rows, int cols, float* sums, Stream stream, const char* kernel_name) {
  if (cols <= 0) return;
  const int groups = cols / Op::kCols;
  int tc = 1, log2_tc = 0;
  while (tc < groups && tc < 32) tc *= 2, log2_tc += 1;
  const int lanes = kSumBlock / tc;
  const int64_t col_blocks = (groups + tc - 1) / tc;
  // about four full waves of blocks (few blocks left for a last partial wave), in chunks of at least kSumUnroll
  // rows per lane; the count depends on the GPU and the compiled kernel alone, never on timing
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, column_sum_kernel<Op>, kSumBlock, 0));
  if (per_sm < 1) per_sm = 1;
  const int64_t want = int64_t(sm_count()) * per_sm * 4;
  int64_t chunks = want / col_blocks;
  const int64_t most = (rows + int64_t(lanes) * kSumUnroll - 1) / (int64_t(lanes) * kSumUnroll);
  if (chunks > most) chunks = most;
  if (chunks > 4096) chunks = 4096;
  if (chunks < 1) chunks = 1;
  const int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  chunks = rows == 0 ? 1 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  float* partial = nullptr;
  if (sums) partial = chunks == 1 ? sums : stream_scratch(stream, size_t(chunks) * cols);
  dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  column_sum_kernel<Op><<<grid, kSumBlock, 0, stream>>>(op, rows, cols, tc, log2_tc, rows_per_chunk, partial);
  CUDA_CHECK_LAUNCH(kernel_name);
  if (sums && chunks > 1) add_chunks(partial, int(chunks), cols, sums, stream);
}

}  // namespace dense
}  // namespace sparta
