// pooled_forward.cu: CUDA version of pooled_forward.h: hash lookup (get_insert or find), gather and pooling
// in one kernel. A direct index (hash_table.h) takes the same walk without the bucket stage: a batch's rows
// follow from its keys.
//
// A tile of 8 lanes takes a span of 4 consecutive bags (their keys are contiguous in the CSR) and walks its
// keys in batches of 2, as a pipeline of three stages: while batch n's rows are gathered, batch n+1's first
// buckets and batch n+2's keys are loaded (hash_table_ref.cuh: load_first_buckets, then resolve_loaded_rows),
// so each step of the walk waits for one round trip to memory, not three. A batch's rows are gathered with all
// loads issued before the first add (lane l holds elements (c*8 + l)*VEC .. +VEC: 8 lanes read 128 contiguous
// bytes per chunk) and added to the current bag's accumulator in key order; a bag is written when the walk
// passes its end. One-hot bags thus get the same lookups in flight per tile as multi-hot ones. Persistent grid,
// grid-stride over spans.
//
// Occupancy over batch width: the memory in flight comes from resident warps, not from wide batches, so a batch
// is 2 keys and 2 rows (wider batches took too many registers for more than one block per SM); the blocks per
// SM below were the fastest settings measured (experiments/NOTES_embedding.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "src/base/check.h"
#include "kernels/hash_table_ref.cuh"
#include "kernels/pooled_forward.h"
#include "kernels/row_storage.h"

namespace sparta {

namespace cg = cooperative_groups;
using hashdev::kTile;
using hashdev::Tile;

constexpr int kSpan = 4;  // bags per tile task
constexpr int kBatch = 2;  // keys resolved together, then rows gathered together

// 256-thread blocks per SM the kernel is compiled for, by the floats a lane holds per row (C*VEC): 1, 4 or 8
// → 3 (at most 80 registers), 16 → 2, 32 → 1.
template <int VEC, int C>
constexpr int blocks_per_sm() {
  return C * VEC <= 8 ? 3 : C * VEC <= 16 ? 2 : 1;
}

// ----------------------------------------------------------------------------
// kernels

template <class OutT>
__device__ __forceinline__ void store_out(OutT* p, const float (&v)[4]);

template <>
__device__ __forceinline__ void store_out<float>(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
template <>
__device__ __forceinline__ void store_out<__nv_bfloat16>(__nv_bfloat16* p, const float (&v)[4]) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
  uint2 u;
  u.x = *reinterpret_cast<unsigned*>(&a);
  u.y = *reinterpret_cast<unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
template <>
__device__ __forceinline__ void store_out<__half>(__half* p, const float (&v)[4]) {
  __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
  uint2 u;
  u.x = *reinterpret_cast<unsigned*>(&a);
  u.y = *reinterpret_cast<unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

__device__ __forceinline__ void store_one(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_one(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_one(__half* p, float v) { *p = __float2half_rn(v); }

// VEC elements of a 16-bit row at p (8-byte aligned when VEC is 4), widened.
template <int VEC, RowStorage S, bool kTrain>
__device__ __forceinline__ void load16(const uint16_t* p, float* v) {
  if constexpr (VEC == 4) {
    const uint2 x = kTrain ? __ldcg(reinterpret_cast<const uint2*>(p)) : __ldg(reinterpret_cast<const uint2*>(p));
    v[0] = rowstore::widen(S, uint16_t(x.x & 0xffffu)), v[1] = rowstore::widen(S, uint16_t(x.x >> 16));
    v[2] = rowstore::widen(S, uint16_t(x.y & 0xffffu)), v[3] = rowstore::widen(S, uint16_t(x.y >> 16));
  } else {
    v[0] = rowstore::widen(S, kTrain ? __ldcg(p) : __ldg(p));
  }
}

// values: [capacity_rows, dim] of storage S (kernels/row_storage.h).
template <int VEC, int C, bool kTrain, RowStorage S>
__device__ __forceinline__ void load_row(const void* values_, int64_t row, int dim, int lane, float (&v)[C][VEC]) {
  const float* values = static_cast<const float*>(values_);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    int e = (c * kTile + lane) * VEC;
    if (row >= 0 && e < dim) {
      if constexpr (S != RowStorage::fp32) {
        load16<VEC, S, kTrain>(static_cast<const uint16_t*>(values_) + row * dim + e, v[c]);
        continue;
      }
      const float* p = values + row * dim + e;
      if constexpr (VEC == 4) {
        // Train: rows initialized during this kernel by other SMs, so read through L2 (ld.cg); eval: the
        // read-only path.
        float4 x = kTrain ? __ldcg(reinterpret_cast<const float4*>(p)) : __ldg(reinterpret_cast<const float4*>(p));
        v[c][0] = x.x, v[c][1] = x.y, v[c][2] = x.z, v[c][3] = x.w;
      } else {
        v[c][0] = kTrain ? __ldcg(p) : __ldg(p);
      }
    } else {
#pragma unroll
      for (int q = 0; q < VEC; ++q) v[c][q] = 0.f;
    }
  }
}

template <int VEC, int C, class OutT>
__device__ __forceinline__ void write_bag(OutT* o, int dim, int lane, int64_t n, bool mean, float (&acc)[C][VEC]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    int e = (c * kTile + lane) * VEC;
    if (e < dim) {
      if (mean && n > 0) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[c][q] = acc[c][q] / static_cast<float>(n);
      }
      if constexpr (VEC == 4) {
        float v4[4] = {acc[c][0], acc[c][1], acc[c][2], acc[c][3]};
        store_out<OutT>(o + e, v4);
      } else {
        store_one(o + e, acc[c][0]);
      }
    }
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[c][q] = 0.f;
  }
}

// Keys of the span's batch that starts at key i (0 past the span's end).
__device__ __forceinline__ int batch_count(int64_t i, int64_t k_end) {
  return static_cast<int>(k_end - i < kBatch ? (k_end > i ? k_end - i : 0) : kBatch);
}

// kDirect: a direct index (hash_table.h): a batch's rows follow from its keys, so stage 2 has nothing to load.
template <int VEC, int C, class OutT, bool kTrain, bool kDirect, RowStorage S>
__global__ void __launch_bounds__(256, blocks_per_sm<VEC, C>()) embedding_forward_kernel(ForwardArgs a) {
  Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int lane = tile.thread_rank();
  const int dim = a.rows_init.dim;
  const float* values = a.rows_init.values;
  const bool mean = a.combiner == Combiner::mean;
  OutT* out = static_cast<OutT*>(a.out);

  int64_t tasks = (a.bags + kSpan - 1) / kSpan;
  int64_t tiles = int64_t(gridDim.x) * (blockDim.x / kTile);
  for (int64_t task = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kTile; task < tasks; task += tiles) {
    int64_t b0 = task * kSpan;
    int nb = static_cast<int>(a.bags - b0 < kSpan ? a.bags - b0 : kSpan);
    int64_t off = 0;
    if (lane <= nb) off = a.offsets ? a.offsets[b0 + lane] : b0 + lane;
    const int64_t k_end = tile.shfl(off, nb);
    int bag = 0;
    int64_t bag_start = tile.shfl(off, 0), bag_end = tile.shfl(off, 1);
    float acc[C][VEC];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int q = 0; q < VEC; ++q) acc[c][q] = 0.f;

    // The walk is a pipeline of three stages: while batch n's rows are gathered, batch n+1's first buckets and
    // batch n+2's keys are loaded, so an iteration waits for one round trip to memory instead of three (keys,
    // then buckets, then rows). Lane j < count holds key j of the batch whose keys are in flight.
    int64_t i0 = bag_start;
    int cnt = batch_count(i0, k_end);
    uint64_t k[kBatch];
    int64_t r[kBatch];
    HashSlot snap[kBatch];
    hashdev::load_keys(tile, a.keys, i0, cnt, k);
    uint64_t key_next = lane < batch_count(i0 + kBatch, k_end) ? static_cast<uint64_t>(a.keys[i0 + kBatch + lane]) : 0;
    if (cnt > 0) {
      if constexpr (kDirect) hashdev::direct_rows<kTrain, kBatch>(tile, a.table, k, cnt, r);
      else hashdev::resolve_rows<kTrain, kBatch>(tile, a.table, a.rows_init, k, cnt, r);
    }
    for (; i0 < k_end; i0 += kBatch) {
      // Stage 3 of batch n: its rows' loads.
      float v[kBatch][C][VEC];
#pragma unroll
      for (int g = 0; g < kBatch; ++g) load_row<VEC, C, kTrain, S>(values, g < cnt ? r[g] : -1, dim, lane, v[g]);
      // Stage 2 of batch n+1: its first buckets' loads; stage 1 of batch n+2: its keys' loads.
      const int64_t i1 = i0 + kBatch;
      const int cnt1 = batch_count(i1, k_end);
      uint64_t k1[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) k1[j] = tile.shfl(key_next, j);
      if constexpr (!kDirect)
        if (cnt1 > 0) hashdev::load_first_buckets<kBatch>(tile, a.table, k1, cnt1, snap);
      key_next = lane < batch_count(i1 + kBatch, k_end) ? static_cast<uint64_t>(a.keys[i1 + kBatch + lane]) : 0;
      if (a.rows) {
        int64_t mine = r[0];
#pragma unroll
        for (int j = 1; j < kBatch; ++j)
          if (lane == j) mine = r[j];
        if (lane < cnt) a.rows[i0 + lane] = mine;
      }
      // Batch n's rows added to their bags in key order.
#pragma unroll
      for (int g = 0; g < kBatch; ++g) {
        if (g >= cnt) break;
        int64_t i = i0 + g;
        while (i >= bag_end) {  // the walk passed the end of `bag`: write it (and any empty bags after it)
          write_bag<VEC, C, OutT>(out + a.out_layout.at(b0 + bag, dim), dim, lane, bag_end - bag_start, mean, acc);
          ++bag;
          bag_start = bag_end;
          bag_end = tile.shfl(off, bag + 1);
        }
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[c][q] += v[g][c][q];
      }
      // Batch n+1's rows from its buckets.
      if (cnt1 > 0) {
        if constexpr (kDirect) hashdev::direct_rows<kTrain, kBatch>(tile, a.table, k1, cnt1, r);
        else hashdev::resolve_loaded_rows<kTrain, kBatch>(tile, a.table, a.rows_init, k1, cnt1, snap, r);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) k[j] = k1[j];
      cnt = cnt1;
    }
    while (bag < nb) {
      write_bag<VEC, C, OutT>(out + a.out_layout.at(b0 + bag, dim), dim, lane, bag_end - bag_start, mean, acc);
      ++bag;
      bag_start = bag_end;
      bag_end = tile.shfl(off, bag + 1);
    }
  }
}

// A direct index with rows of at most 4 G floats (dim % 4 == 0; G = 4 up to dim 16, 8 up to dim 32): a group of G
// lanes per span of kQuadSpan bags, one float4 of the row per lane, walking the span's keys kQuadBatch at a time:
// each lane turns kQuadBatch / G of the batch's keys into rows (arithmetic), all kQuadBatch rows are loaded before
// the first add, then added to their bags in key
// order (the sums and the rows out are those of embedding_forward_kernel, bit for bit). The 8-lane tile of that
// kernel keeps half its lanes idle on a 64-byte row and has 2 rows in flight per tile; here every group keeps 8
// in flight.
constexpr int kQuadSpan = 4;   // bags per quad task (lane j < nb + 1 loads offsets[b0 + j], the last by all)

// B: keys per batch (B / G per lane)
template <int G, int B, class OutT, bool kTrain, RowStorage S>
__global__ void __launch_bounds__(256) direct_quad_kernel(ForwardArgs a) {
  constexpr int kQuad = G;
  constexpr int kQuadBatch = B;
  constexpr int kPerLane = kQuadBatch / G;
  auto quad = cg::tiled_partition<kQuad>(cg::this_thread_block());
  const int lane = quad.thread_rank();
  const int dim = a.rows_init.dim;
  const int e = lane * 4;  // this lane's float4 of a row
  const bool active = e < dim;
  const float* values = a.rows_init.values;
  const bool mean = a.combiner == Combiner::mean;
  OutT* out = static_cast<OutT*>(a.out);
  const int64_t tasks = (a.bags + kQuadSpan - 1) / kQuadSpan;
  const int64_t quads = int64_t(gridDim.x) * (blockDim.x / kQuad);
  for (int64_t task = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kQuad; task < tasks; task += quads) {
    const int64_t b0 = task * kQuadSpan;
    const int nb = static_cast<int>(a.bags - b0 < kQuadSpan ? a.bags - b0 : kQuadSpan);
    const int64_t off = lane < nb ? (a.offsets ? a.offsets[b0 + lane] : b0 + lane) : 0;
    const int64_t k_end = a.offsets ? a.offsets[b0 + nb] : b0 + nb;
    int bag = 0;
    int64_t bag_start = quad.shfl(off, 0);
    int64_t bag_end = nb > 1 ? quad.shfl(off, 1) : k_end;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    auto write = [&]() {  // the current bag out, then the next bag's bounds
      if (active) {
        const float n = static_cast<float>(bag_end - bag_start);
        if (mean && bag_end > bag_start)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[q] = acc[q] / n;
        store_out<OutT>(out + a.out_layout.at(b0 + bag, dim) + e, acc);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] = 0.f;
      ++bag;
      bag_start = bag_end;
      const int64_t next = quad.shfl(off, bag + 1 < kQuadSpan ? bag + 1 : 0);
      bag_end = bag + 1 < nb ? next : k_end;
    };
    for (int64_t i0 = bag_start; i0 < k_end; i0 += kQuadBatch) {
      const int cnt = static_cast<int>(k_end - i0 < kQuadBatch ? k_end - i0 : kQuadBatch);
      // Lane l resolves keys l, l + G, ... of the batch.
      int64_t mine[kPerLane];
      int bad = 0;
#pragma unroll
      for (int h = 0; h < kPerLane; ++h) {
        const int j = h * kQuad + lane;
        mine[h] = j < cnt ? direct_row(a.table, static_cast<uint64_t>(a.keys[i0 + j])) : -1;
        bad += j < cnt && mine[h] < 0;
        if (a.rows && j < cnt) a.rows[i0 + j] = mine[h];
      }
      if (bad)
        atomicAdd(reinterpret_cast<unsigned long long*>(kTrain ? &a.table.meta->refused : &a.table.meta->missing),
                  (unsigned long long)bad);
      float4 v[kQuadBatch];
#pragma unroll
      for (int j = 0; j < kQuadBatch; ++j) {
        const int64_t r = quad.shfl(mine[j / kQuad], j % kQuad);
        v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (j < cnt && r >= 0 && active) {
          if constexpr (S != RowStorage::fp32) {
            float x[4];
            load16<4, S, kTrain>(reinterpret_cast<const uint16_t*>(values) + r * dim + e, x);
            v[j] = make_float4(x[0], x[1], x[2], x[3]);
          } else {
            const float4* p = reinterpret_cast<const float4*>(values + r * dim + e);
            v[j] = kTrain ? __ldcg(p) : __ldg(p);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kQuadBatch; ++j) {
        if (j >= cnt) break;
        while (i0 + j >= bag_end) write();  // the walk passed the end of `bag` (and of any empty bags after it)
        acc[0] += v[j].x, acc[1] += v[j].y, acc[2] += v[j].z, acc[3] += v[j].w;
      }
    }
    while (bag < nb) write();
  }
}

// ----------------------------------------------------------------------------
// launchers

namespace {

template <int VEC, int C, class OutT, bool kTrain, RowStorage S>
void launch(const ForwardArgs& a, Stream stream) {
  const int block = 256;
  int64_t tasks = (a.bags + kSpan - 1) / kSpan;
  auto kernel = a.table.direct_stride > 0 ? embedding_forward_kernel<VEC, C, OutT, kTrain, true, S>
                                          : embedding_forward_kernel<VEC, C, OutT, kTrain, false, S>;
  int grid = hashdev::resident_grid(kernel, block, (tasks + block / kTile - 1) / (block / kTile));
  kernel<<<grid, block, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH("embedding_forward_kernel");
}

template <int G, int B, class OutT, bool kTrain, RowStorage S>
void launch_quad(const ForwardArgs& a, Stream stream) {
  const int block = 256;
  const int64_t tasks = (a.bags + kQuadSpan - 1) / kQuadSpan;
  auto kernel = direct_quad_kernel<G, B, OutT, kTrain, S>;
  int grid = hashdev::resident_grid(kernel, block, (tasks + block / G - 1) / (block / G));
  kernel<<<grid, block, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH("direct_quad_kernel");
}

template <class OutT, bool kTrain, RowStorage S>
void launch_for_dim(const ForwardArgs& a, bool vec4, Stream stream) {
  int dim = a.rows_init.dim;
  // 8 keys a batch (16 was slower: experiments/NOTES_embedding.md)
  if (vec4 && dim <= 16 && a.table.direct_stride > 0) return launch_quad<4, 8, OutT, kTrain, S>(a, stream);
  if (vec4 && dim <= 32 && a.table.direct_stride > 0) return launch_quad<8, 8, OutT, kTrain, S>(a, stream);
  if (vec4) {  // lane chunks of 4 floats: C = dim / 32 rounded up to a power of two
    if (dim <= 32) return launch<4, 1, OutT, kTrain, S>(a, stream);
    if (dim <= 64) return launch<4, 2, OutT, kTrain, S>(a, stream);
    if (dim <= 128) return launch<4, 4, OutT, kTrain, S>(a, stream);
    return launch<4, 8, OutT, kTrain, S>(a, stream);
  }
  if (dim <= 8) return launch<1, 1, OutT, kTrain, S>(a, stream);
  if (dim <= 32) return launch<1, 4, OutT, kTrain, S>(a, stream);
  if (dim <= 128) return launch<1, 16, OutT, kTrain, S>(a, stream);
  return launch<1, 32, OutT, kTrain, S>(a, stream);
}

template <class OutT, RowStorage S>
void launch_for_mode(const ForwardArgs& a, bool vec4, Stream stream) {
  if (a.mode == LookupMode::train) return launch_for_dim<OutT, true, S>(a, vec4, stream);
  launch_for_dim<OutT, false, S>(a, vec4, stream);
}

// The row storage as a template argument (16-bit rows: half the bytes gathered, widened to fp32 before the sums).
template <class OutT>
void launch_for_storage(const ForwardArgs& a, bool vec4, Stream stream) {
  switch (a.rows_init.key_init.storage) {
    case RowStorage::fp32: return launch_for_mode<OutT, RowStorage::fp32>(a, vec4, stream);
    case RowStorage::bf16: return launch_for_mode<OutT, RowStorage::bf16>(a, vec4, stream);
    case RowStorage::fp16: return launch_for_mode<OutT, RowStorage::fp16>(a, vec4, stream);
  }
}

}  // namespace

void embedding_forward_cuda(const ForwardArgs& a, Stream stream) {
  if (a.bags == 0) return;
  int dim = a.rows_init.dim;
  size_t store = a.out_type == OutputType::f32 ? 16 : 8;  // bytes of one 4-element store
  bool vec4 = dim % 4 == 0 && reinterpret_cast<uintptr_t>(a.rows_init.values) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(a.out) % store == 0 && a.out_layout.four_aligned();
  switch (a.out_type) {
    case OutputType::f32: return launch_for_storage<float>(a, vec4, stream);
    case OutputType::bf16: return launch_for_storage<__nv_bfloat16>(a, vec4, stream);
    case OutputType::f16: return launch_for_storage<__half>(a, vec4, stream);
  }
}

}  // namespace sparta
