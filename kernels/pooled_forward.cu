// pooled_forward.cu: CUDA version of pooled_forward.h: hash lookup (get_insert or find), gather and pooling
// in one kernel. A direct index (hash_table.h) takes the same walk without the bucket stage: a batch's rows
// follow from its keys.
//
// A tile of 8 lanes takes a span of 4 consecutive bags (their keys are contiguous in the CSR) and walks its
// keys in batches of 2 (4 for 16-bit rows of a direct index: batch_keys), as a pipeline of three stages: while
// batch n's rows are gathered, batch n+1's first buckets and batch n+2's keys are loaded (hash_table_ref.cuh:
// load_first_buckets, then resolve_loaded_rows), so each step of the walk waits for one round trip to memory, not
// three. A batch's rows are gathered with all loads issued before the first add (lane l holds elements
// (c*8 + l)*VEC .. +VEC, VEC 4 for fp32 rows and 8 for 16-bit ones: 8 lanes read 128 contiguous bytes per chunk)
// and added to the current bag's accumulator in key order; a bag is written when the walk passes its end.
// One-hot bags thus get the same lookups in flight per tile as multi-hot ones. Persistent grid, grid-stride over
// spans.
//
// Occupancy over batch width: the memory in flight comes from resident warps, not from wide batches, so a batch
// of fp32 rows is 2 keys and 2 rows (wider batches took too many registers for more than one block per SM); the
// blocks per SM below were the fastest settings measured (experiments/NOTES_embedding.md).
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

// Keys resolved together, then rows gathered together: 2, or 4 for 16-bit rows read 8 elements a lane from a
// direct index: their rows stay packed in registers until added, so 4 of them take the registers of 2 fp32 rows
// and keep as many bytes in flight (the gather is bound by the rows in flight, not by their bytes). A hashed
// table's batch keeps 2 (the probe's state per key would spill).
template <int VEC, RowStorage S, bool kDirect>
constexpr int batch_keys() {
  return S != RowStorage::fp32 && VEC == 8 && kDirect ? 4 : 2;
}

// 256-thread blocks per SM the kernel is compiled for, by the floats a lane holds per row (C*VEC): 1, 4 or 8
// → 3 (at most 80 registers), 16 → 2, 32 → 1; a batch of 4 keys takes 2 up to 16 floats.
template <int VEC, int C, RowStorage S, bool kDirect>
constexpr int blocks_per_sm() {
  if (batch_keys<VEC, S, kDirect>() == 4) return C * VEC <= 16 ? 2 : 1;
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

// The VEC elements of a row a lane holds: fp32 as loaded, or 16-bit elements packed two a word as loaded (half
// the registers of a row in flight), widened when added; one 16-bit element widened when loaded.
template <int VEC, RowStorage S, bool kWide = S == RowStorage::fp32 || VEC == 1>
struct RowChunk {
  float v[VEC];
  __device__ __forceinline__ float at(int q) const { return v[q]; }
};
template <int VEC, RowStorage S>
struct RowChunk<VEC, S, false> {
  uint32_t u[(VEC + 1) / 2];  // element q in the low (q even) or high half of u[q / 2]
  __device__ __forceinline__ float at(int q) const {
    return rowstore::widen(S, uint16_t(q & 1 ? u[q / 2] >> 16 : u[q / 2] & 0xffffu));
  }
};

// Elements i .. i + VEC - 1 of values [capacity_rows, dim] of storage S (aligned to their size for VEC > 1). Train:
// rows initialized during this kernel by other SMs, so read through L2 (ld.cg); eval: the read-only path.
template <int VEC, bool kTrain, RowStorage S>
__device__ __forceinline__ void load_chunk(const void* values, int64_t i, RowChunk<VEC, S>& x) {
  if constexpr (S == RowStorage::fp32) {
    const float* p = static_cast<const float*>(values) + i;
    if constexpr (VEC == 4) {
      float4 y = kTrain ? __ldcg(reinterpret_cast<const float4*>(p)) : __ldg(reinterpret_cast<const float4*>(p));
      x.v[0] = y.x, x.v[1] = y.y, x.v[2] = y.z, x.v[3] = y.w;
    } else {
      static_assert(VEC == 1, "fp32 rows: 1 or 4 elements a lane");
      x.v[0] = kTrain ? __ldcg(p) : __ldg(p);
    }
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(values) + i;
    if constexpr (VEC == 8) {
      const uint4 y = kTrain ? __ldcg(reinterpret_cast<const uint4*>(p)) : __ldg(reinterpret_cast<const uint4*>(p));
      x.u[0] = y.x, x.u[1] = y.y, x.u[2] = y.z, x.u[3] = y.w;
    } else if constexpr (VEC == 4) {
      const uint2 y = kTrain ? __ldcg(reinterpret_cast<const uint2*>(p)) : __ldg(reinterpret_cast<const uint2*>(p));
      x.u[0] = y.x, x.u[1] = y.y;
    } else {
      static_assert(VEC == 1, "16-bit rows: 1, 4 or 8 elements a lane");
      x.v[0] = rowstore::widen(S, kTrain ? __ldcg(p) : __ldg(p));
    }
  }
}

// This lane's chunks of row `row` (zeros for row < 0 and past dim): chunk c holds elements (c*8 + lane)*VEC ..
template <int VEC, int C, bool kTrain, RowStorage S>
__device__ __forceinline__ void load_row(const void* values, int64_t row, int dim, int lane,
                                         RowChunk<VEC, S> (&v)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    int e = (c * kTile + lane) * VEC;
    if (row >= 0 && e < dim) {
      load_chunk<VEC, kTrain, S>(values, row * dim + e, v[c]);
    } else {
      v[c] = RowChunk<VEC, S>{};  // zeros: +0.0 in every storage
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
      if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int h = 0; h < VEC; h += 4) {
          float v4[4] = {acc[c][h], acc[c][h + 1], acc[c][h + 2], acc[c][h + 3]};
          store_out<OutT>(o + e + h, v4);
        }
      } else {
        store_one(o + e, acc[c][0]);
      }
    }
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[c][q] = 0.f;
  }
}

// Keys of the span's batch of B keys that starts at key i (0 past the span's end).
template <int B>
__device__ __forceinline__ int batch_count(int64_t i, int64_t k_end) {
  return static_cast<int>(k_end - i < B ? (k_end > i ? k_end - i : 0) : B);
}

// kDirect: a direct index (hash_table.h): a batch's rows follow from its keys, so stage 2 has nothing to load.
template <int VEC, int C, class OutT, bool kTrain, bool kDirect, RowStorage S>
__global__ void __launch_bounds__(256, blocks_per_sm<VEC, C, S, kDirect>()) embedding_forward_kernel(ForwardArgs a) {
  Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int lane = tile.thread_rank();
  const int dim = a.rows_init.dim;
  constexpr int kBatch = batch_keys<VEC, S, kDirect>();
  const void* values = a.rows_init.values;
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
    int cnt = batch_count<kBatch>(i0, k_end);
    uint64_t k[kBatch];
    int64_t r[kBatch];
    HashSlot snap[kBatch];
    hashdev::load_keys(tile, a.keys, i0, cnt, k);
    uint64_t key_next = lane < batch_count<kBatch>(i0 + kBatch, k_end) ? static_cast<uint64_t>(a.keys[i0 + kBatch + lane]) : 0;
    if (cnt > 0) {
      if constexpr (kDirect) hashdev::direct_rows<kTrain, kBatch>(tile, a.table, k, cnt, r);
      else hashdev::resolve_rows<kTrain, kBatch>(tile, a.table, a.rows_init, k, cnt, r);
    }
    for (; i0 < k_end; i0 += kBatch) {
      // Stage 3 of batch n: its rows' loads.
      RowChunk<VEC, S> v[kBatch][C];
#pragma unroll
      for (int g = 0; g < kBatch; ++g) load_row<VEC, C, kTrain, S>(values, g < cnt ? r[g] : -1, dim, lane, v[g]);
      // Stage 2 of batch n+1: its first buckets' loads; stage 1 of batch n+2: its keys' loads.
      const int64_t i1 = i0 + kBatch;
      const int cnt1 = batch_count<kBatch>(i1, k_end);
      uint64_t k1[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) k1[j] = tile.shfl(key_next, j);
      if constexpr (!kDirect)
        if (cnt1 > 0) hashdev::load_first_buckets<kBatch>(tile, a.table, k1, cnt1, snap);
      key_next = lane < batch_count<kBatch>(i1 + kBatch, k_end) ? static_cast<uint64_t>(a.keys[i1 + kBatch + lane]) : 0;
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
          for (int q = 0; q < VEC; ++q) acc[c][q] += v[g][c].at(q);
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
            RowChunk<4, S> x;
            load_chunk<4, kTrain, S>(values, r * dim + e, x);
            v[j] = make_float4(x.at(0), x.at(1), x.at(2), x.at(3));
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
  if constexpr (S != RowStorage::fp32) {
    // 16-bit rows: lane chunks of 8 elements (16-byte loads): C = dim / 64 rounded up to a power of two
    if (vec4 && dim % 8 == 0) {
      if (dim <= 64) return launch<8, 1, OutT, kTrain, S>(a, stream);
      if (dim <= 128) return launch<8, 2, OutT, kTrain, S>(a, stream);
      return launch<8, 4, OutT, kTrain, S>(a, stream);
    }
  }
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
