// embedding_backward.cu: CUDA version of embedding_backward.h. Sort-based and deterministic:
//   1. bag_pairs_kernel      (row, bag) of every key; rows outside the table become `capacity_rows` (dropped)
//   2. CUB radix sort        by row on end_bit bits only (26 for 40M rows); stable, so key order within a row
//   3. CUB scans             a running maximum of the row heads' positions (each position's row start, int32),
//                            then the sum of (row head, item head) flags packed in one int64: the unique row and
//                            the item of every sorted position; a row's items start every kBackwardChunk positions
//                            from the row's first one
//   4. segments_kernel       item and unique-row tables from the scan; the counts, in device memory
//   5. reduce_items_kernel   one group of lanes per item sums its contributions (float4 loads, fixed order);
//                            a row within one item is finished here: its gradient written, or the optimizer
//                            applied to it at once (fused), else the item's partial sum is kept
//   6. combine_rows_kernel   one block per row over several items sums their partials in kCombineGroups ranges
//                            and finishes the row; segments_kernel lists those rows, so with none (uniform keys)
//                            its blocks read a zero count and exit
// Kernels 5 and 6 read their counts from device memory and grid-stride over an upper bound: no host sync.
// embedding_backward_prepare runs steps 1-4 and embedding_backward_finish steps 5-6; the workspace keeps what
// lies between (the sorted rows and bags, in the halves the sort chose, and the item tables).
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include "src/base/check.h"
#include "kernels/embedding_backward.h"

namespace sparta {

namespace {

constexpr int C = kBackwardChunk;
using WS = BackwardWorkspace;

// ceil(x / C) for 0 <= x <= INT32_MAX, without overflowing
__host__ __device__ __forceinline__ int32_t chunks(int32_t x) { return x / C + int32_t(x % C != 0); }

// Where reduce_items_kernel keeps the partial sum of item t of a row over m >= 2 items whose first position is a
// (blocks = chunks(nnz)): item t < m - 1 holds C positions, [a + t*C, a + (t+1)*C), so it holds exactly one
// multiple of C, (chunks(a) + t) * C, which no other item holds: slot chunks(a) + t < blocks. The last item may
// hold none: slot blocks + chunks(a), unique as the row's first item (which holds chunks(a) * C) is. So the
// partials of a row are slots chunks(a) .. chunks(a) + m - 2, then blocks + chunks(a): fewer than 2 * blocks.
__host__ __device__ __forceinline__ int32_t partial_slot(int32_t a, int32_t t, int32_t m, int32_t blocks) {
  return t < m - 1 ? chunks(a) + t : blocks + chunks(a);
}

// Everything kernels 5 and 6 read.
struct ReduceView {
  const uint32_t* keys;              // [nnz] sorted rows (capacity_rows for dropped keys)
  const uint32_t* bags;              // [nnz] bag of each sorted key
  const int32_t* item_start;         // [items + 1]
  const int32_t* item_u;             // [items]
  const int32_t* row_item_start;     // [rows + 1]
  const int32_t* multi_rows;         // [counts[kCountMultiRows]] unique row of each row over several items
  const int32_t* counts;             // [WS::kCounts]
  const int64_t* offsets;            // [bags + 1] (mean)
  const float* grad;                 // [bags, dim], or laid out as grad_layout says
  BagLayout grad_layout;
  float* partials;                   // [2 * blocks, dim] (partial_slot)
  int32_t nnz;
  int32_t blocks;                    // chunks(nnz)
  int32_t bag_count;
  int dim;
  uint32_t sentinel;                 // capacity_rows
  bool mean;
  int G, log2_G;                     // lanes per row
};

// Step 3, first scan: the first position of the row of every sorted position, as the running maximum of the row
// heads' positions (an int32 scan).
struct RowHeadPosition {
  const uint32_t* keys;
  __host__ __device__ int32_t operator()(int32_t j) const { return j == 0 || keys[j] != keys[j - 1] ? j : 0; }
};
struct MaxPosition {
  __host__ __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};
using HeadPositionIterator = thrust::transform_iterator<RowHeadPosition, thrust::counting_iterator<int32_t>, int32_t>;

// Step 3, second scan: the head flags of sorted position j packed as (row head) << 32 | (item head), summed. An item
// starts at a row's first position and every C positions after it.
struct HeadFlags {
  const uint32_t* keys;
  const int32_t* row_start;  // the first scan's output
  __host__ __device__ int64_t operator()(int32_t j) const {
    const bool row_head = j == 0 || keys[j] != keys[j - 1];
    const bool item_head = (j - row_start[j]) % C == 0;
    return (int64_t(row_head) << 32) | int64_t(item_head);
  }
};
// The inclusive sum at j, (row heads << 32 | item heads) in [0, j], as (unique row << 32 | item) of j.
struct HeadsToIndices {
  __host__ __device__ int64_t operator()(int64_t heads) const { return heads - ((int64_t(1) << 32) | 1); }
};
using FlagIterator = thrust::transform_iterator<HeadFlags, thrust::counting_iterator<int32_t>, int64_t>;
using IndexOutput = thrust::transform_output_iterator<HeadsToIndices, int64_t*>;

// The key of a row, found from its first sorted position j: a key of bag bags[j] (sorted) whose row is r (every
// key of a row is the same key). unique_keys == nullptr: not asked for.
struct KeyOfRow {
  const uint32_t* bags = nullptr;  // [nnz] bag of each sorted position
  const int64_t* offsets = nullptr;
  const int64_t* rows = nullptr;
  const int64_t* keys = nullptr;
  int64_t nnz = 0;
  int64_t* unique_keys = nullptr;
  __device__ int64_t key(int32_t j, uint32_t r) const {
    const int64_t b = bags[j];
    const int64_t k0 = max(offsets[b], int64_t(0)), k1 = min(offsets[b + 1], nnz);  // clamped: never outside
    for (int64_t k = k0; k < k1; ++k)
      if (rows[k] == int64_t(r)) return keys[k];
    return 0;  // not reached for a consistent batch
  }
};

// Contributions handled per batch of loads: loads of the batch are issued together, then added in order.
template <int V, int P>
constexpr int batch_of() {
  return P * V >= 4 ? 2 : 4;
}

}  // namespace

// ----------------------------------------------------------------------------
// kernels

// Every position k gets its key (so the sort never sees a stale key); bag b writes its bag id over its keys.
// Also zeroes the count of rows over several items that segments_kernel adds to.
__global__ void __launch_bounds__(256)
    bag_pairs_kernel(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz, int64_t capacity_rows,
                     uint32_t* keys, uint32_t* bag_of, int32_t* counts) {
  if (blockIdx.x == 0 && threadIdx.x == 0) counts[WS::kCountMultiRows] = 0;
  const int64_t n = nnz > bags ? nnz : bags;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (i < nnz) {
      const int64_t r = rows[i];
      keys[i] = (r >= 0 && r < capacity_rows) ? uint32_t(r) : uint32_t(capacity_rows);
    }
    if (i < bags) {
      const int64_t k0 = max(offsets[i], int64_t(0)), k1 = min(offsets[i + 1], nnz);  // clamped: never outside
      for (int64_t k = k0; k < k1; ++k) bag_of[k] = uint32_t(i);
    }
  }
}

// One thread per sorted position: item and row tables, from the scan's unique row and item of each position.
// A valid row's second item (its head C positions after the row's) lists the row in multi_rows (in no particular
// order: each listed row is finished by one block, alone).
__global__ void __launch_bounds__(256)
    segments_kernel(const uint32_t* keys, const int64_t* scan, int32_t nnz, uint32_t sentinel, int32_t* item_start,
                    int32_t* item_u, int32_t* row_item_start, int32_t* multi_rows, int64_t* unique_rows,
                    int32_t* num_unique, int32_t* counts, const KeyOfRow key_of) {
  for (int32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += gridDim.x * blockDim.x) {
    const uint32_t r = keys[j];
    const bool row_head = j == 0 || keys[j - 1] != r;
    const int64_t s = scan[j];
    const int32_t u = int32_t(s >> 32), item = int32_t(s & 0xffffffff);  // the unique row and item of j
    const bool item_head = j == 0 || int32_t(scan[j - 1] & 0xffffffff) != item;
    if (item_head) {
      item_start[item] = j;
      item_u[item] = u;
      // not a row head: j is C * t positions after its row's head, t >= 1 (so j >= C)
      if (!row_head && r < sentinel && (j == C || keys[j - C - 1] != r))
        multi_rows[atomicAdd(&counts[WS::kCountMultiRows], 1)] = u;
    }
    if (row_head) {
      row_item_start[u] = item;
      if (r < sentinel) {
        if (unique_rows) unique_rows[u] = r;
        if (key_of.unique_keys) key_of.unique_keys[u] = key_of.key(j, r);
      } else {  // dropped keys sort last: their run holds nnz - j keys, and u rows come before it
        counts[WS::kCountDropped] = nnz - j;
        num_unique[0] = u;
      }
    }
    if (j == nnz - 1) {
      const int32_t items = item + 1;
      item_start[items] = nnz;
      row_item_start[u + 1] = items;
      counts[WS::kCountItems] = items;
      if (r < sentinel) {
        counts[WS::kCountDropped] = 0;
        num_unique[0] = u + 1;
      }
    }
  }
}

// acc[P*V] += this lane's share of the contributions at sorted positions [a, e), in order.
// kLaid: the gradient laid out as s.grad_layout says. A separate instantiation, so that the [bags, dim] gradient's
// loop keeps no layout test (it slowed the update: experiments/NOTES_embedding.md).
template <int V, int P, bool kLaid>
__device__ __forceinline__ void sum_contributions(const ReduceView& s, int32_t a, int32_t e, int lane, float* acc) {
  constexpr int U = batch_of<V, P>();
  const int nv = s.dim / V;
  for (int32_t j = a; j < e; j += U) {
    uint32_t b[U];
    float scale[U];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      // a bag id outside [0, bags) is only possible with offsets that are not a CSR: skipped, never read
      b[q] = j + q < e ? s.bags[j + q] : uint32_t(s.bag_count);
      scale[q] = 1.0f;
      if (s.mean && b[q] < uint32_t(s.bag_count))
        scale[q] = rn::div(1.0f, float(s.offsets[b[q] + 1] - s.offsets[b[q]]));
    }
    float x[U][P * V];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const float* g = kLaid ? s.grad + (b[q] < uint32_t(s.bag_count) ? s.grad_layout.at(b[q], s.dim) : 0)
                             : s.grad + size_t(b[q]) * s.dim;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int col = lane + p * s.G;
        if (b[q] < uint32_t(s.bag_count) && col < nv) {
          rowvec::load_ro<V>(g + col * V, x[q] + p * V);
        } else {
#pragma unroll
          for (int v = 0; v < V; ++v) x[q][p * V + v] = 0.f;
        }
      }
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
      if (b[q] >= uint32_t(s.bag_count)) continue;
#pragma unroll
      for (int i = 0; i < P * V; ++i)
        acc[i] = rn::add(acc[i], s.mean ? rn::mul(x[q][i], scale[q]) : x[q][i]);
    }
  }
}

// Finishing a row: write its gradient ...
template <int V, int P>
struct GradOut {
  float* row_grads;  // [max_nnz, dim]
  int dim;
  __device__ __forceinline__ void prefetch(uint32_t, int, int) const {}
  __device__ __forceinline__ void finish(int32_t u, uint32_t, int lane, int G, const float* acc) const {
    float* out = row_grads + size_t(u) * dim;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int col = lane + p * G;
      if (col < dim / V) rowvec::store<V>(out + col * V, acc + p * V);
    }
  }
};

// ... or apply the optimizer to it (fused), on a row of storage S.
template <OptimizerKind K, int V, int P, RowStorage S>
struct FusedUpdate {
  rowvec::RowUpdate<K, V, P, S> update;
  __device__ __forceinline__ void prefetch(uint32_t row, int lane, int G) const { update.prefetch(row, lane, G); }
  __device__ __forceinline__ void finish(int32_t, uint32_t row, int lane, int G, const float* acc) const {
    update.apply(row, lane, G, acc);
  }
};

// One group of G lanes per item (grid-stride over the item count in device memory).
template <int V, int P, class Op, bool kLaid>
__global__ void __launch_bounds__(256) reduce_items_kernel(ReduceView s, Op op) {
  const int32_t items = min(s.counts[WS::kCountItems], s.nnz);
  const int lane = threadIdx.x & (s.G - 1);
  const int nv = s.dim / V;
  const int64_t groups = (int64_t(gridDim.x) * blockDim.x) >> s.log2_G;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> s.log2_G; i < items; i += groups) {
    const int32_t a = s.item_start[i], e = s.item_start[i + 1];
    const uint32_t row = s.keys[a];
    if (row >= s.sentinel) continue;  // dropped keys (uniform in the group)
    op.prefetch(row, lane, s.G);
    float acc[P * V];
#pragma unroll
    for (int k = 0; k < P * V; ++k) acc[k] = 0.f;
    sum_contributions<V, P, kLaid>(s, a, e, lane, acc);
    const bool whole = (a == 0 || s.keys[a - 1] != row) && (e == s.nnz || s.keys[e] != row);
    if (whole) {
      op.finish(s.item_u[i], row, lane, s.G, acc);
    } else {
      const int32_t u = s.item_u[i], first = s.row_item_start[u];
      const int32_t slot = partial_slot(s.item_start[first], int32_t(i) - first, s.row_item_start[u + 1] - first,
                                        s.blocks);
      float* out = s.partials + size_t(slot) * s.dim;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int col = lane + p * s.G;
        if (col < nv) rowvec::store<V>(out + col * V, acc + p * V);
      }
    }
  }
}

// One block of kCombineGroups groups per row over several items (listed in multi_rows). Group g sums the g-th
// range of the row's partials; group 0 adds the range sums in order and finishes the row.
template <int V, int P, class Op>
__global__ void __launch_bounds__(kCombineGroups * 32) combine_rows_kernel(ReduceView s, Op op) {
  extern __shared__ float range_sums[];  // [kCombineGroups, dim]
  constexpr int U = batch_of<V, P>();
  const int g = threadIdx.x >> s.log2_G, lane = threadIdx.x & (s.G - 1);
  const int nv = s.dim / V;
  const int32_t multi = min(s.counts[WS::kCountMultiRows], s.nnz);
  for (int32_t t = blockIdx.x; t < multi; t += gridDim.x) {
    // the same values in every thread of the block: the branches below are uniform, so __syncthreads is safe
    const int32_t u = s.multi_rows[t];
    const int32_t first = s.row_item_start[u];
    const int32_t m = s.row_item_start[u + 1] - first;
    const int32_t a = s.item_start[first];  // the row's first position
    const uint32_t row = s.keys[a];
    const int32_t per_range = (m + kCombineGroups - 1) / kCombineGroups;
    const int32_t lo = g * per_range, hi = min(m, lo + per_range);
    float acc[P * V];
#pragma unroll
    for (int k = 0; k < P * V; ++k) acc[k] = 0.f;
    for (int32_t k = lo; k < hi; k += U) {
      float x[U][P * V];
#pragma unroll
      for (int q = 0; q < U; ++q) {
        const int32_t kk = k + q;
        const float* src = s.partials + size_t(partial_slot(a, kk, m, s.blocks)) * s.dim;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int col = lane + p * s.G;
          if (kk < hi && col < nv) {
            rowvec::load<V>(src + col * V, x[q] + p * V);
          } else {
#pragma unroll
            for (int v = 0; v < V; ++v) x[q][p * V + v] = 0.f;
          }
        }
      }
#pragma unroll
      for (int q = 0; q < U; ++q) {
        if (k + q >= hi) break;
#pragma unroll
        for (int i = 0; i < P * V; ++i) acc[i] = rn::add(acc[i], x[q][i]);
      }
    }
    if (lo < hi) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int col = lane + p * s.G;
        if (col < nv) rowvec::store<V>(range_sums + g * s.dim + col * V, acc + p * V);
      }
    }
    __syncthreads();
    if (g == 0) {
      float total[P * V];
#pragma unroll
      for (int k = 0; k < P * V; ++k) total[k] = 0.f;
      for (int r = 0; r < kCombineGroups && r * per_range < m; ++r) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int col = lane + p * s.G;
          if (col >= nv) continue;
          float y[V];
          rowvec::load<V>(range_sums + r * s.dim + col * V, y);
#pragma unroll
          for (int v = 0; v < V; ++v) total[p * V + v] = rn::add(total[p * V + v], y[v]);
        }
      }
      op.finish(u, row, lane, s.G, total);
    }
    __syncthreads();  // range_sums is reused by the next row
  }
}

// ----------------------------------------------------------------------------
// launchers

size_t backward_cub_temp_bytes(int64_t max_nnz, int end_bit) {
  const int n = static_cast<int>(max_nnz > 0 ? max_nnz : 1);
  size_t sort_bytes = 0, scan_bytes = 0;
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr), bags(nullptr, nullptr);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, bags, n, 0, end_bit));
  size_t start_bytes = 0;
  HeadPositionIterator heads(thrust::counting_iterator<int32_t>(0), RowHeadPosition{nullptr});
  CUDA_CHECK(cub::DeviceScan::InclusiveScan(nullptr, start_bytes, heads, static_cast<int32_t*>(nullptr), MaxPosition{}, n));
  FlagIterator flags(thrust::counting_iterator<int32_t>(0), HeadFlags{nullptr, nullptr});
  IndexOutput out(static_cast<int64_t*>(nullptr), HeadsToIndices{});
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, flags, out, n));
  return std::max({sort_bytes, start_bytes, scan_bytes});
}

namespace {

// An empty batch: no rows, nothing dropped.
void zero_counts(BackwardWorkspace& ws, int32_t* num_unique, Stream stream) {
  CUDA_CHECK(cudaMemsetAsync(ws.counts(), 0, WS::kCounts * sizeof(int32_t), stream));
  CUDA_CHECK(cudaMemsetAsync(num_unique, 0, sizeof(int32_t), stream));
}

// Steps 1-4: sort, scan and the item tables; records in ws.prepared() the halves the sort left its output in.
// unique_rows may be null; num_unique receives the count (device memory).
void sort_batch(const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows, int32_t* num_unique,
                const int64_t* batch_keys, int64_t* unique_keys, Stream stream) {
  if (batch.nnz == 0) return zero_counts(ws, num_unique, stream);
  const WS::Layout& l = ws.arrays();
  const int32_t nnz = static_cast<int32_t>(batch.nnz);
  const int block = 256;
  const int64_t pair_threads = batch.nnz > batch.bags ? batch.nnz : batch.bags;
  if (pair_threads > 0) {
    bag_pairs_kernel<<<rowvec::grid_for(pair_threads, 1, block), block, 0, stream>>>(
        batch.offsets, batch.rows, batch.bags, batch.nnz, ws.capacity_rows(), ws.at<uint32_t>(l.keys_a),
        ws.at<uint32_t>(l.bags_a), ws.counts());
    CUDA_CHECK_LAUNCH("bag_pairs_kernel");
  }

  cub::DoubleBuffer<uint32_t> keys(ws.at<uint32_t>(l.keys_a), ws.at<uint32_t>(l.keys_b));
  cub::DoubleBuffer<uint32_t> bags(ws.at<uint32_t>(l.bags_a), ws.at<uint32_t>(l.bags_b));
  size_t temp_bytes = l.temp_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws.at<void>(l.temp), temp_bytes, keys, bags, nnz, 0, ws.end_bit(),
                                             stream));
  const uint32_t* sorted_keys = keys.Current();
  // item_u is the first scan's output until segments_kernel writes the item tables (it reads only the second's).
  int32_t* row_start = ws.at<int32_t>(l.item_u);
  HeadPositionIterator heads(thrust::counting_iterator<int32_t>(0), RowHeadPosition{sorted_keys});
  temp_bytes = l.temp_bytes;
  CUDA_CHECK(cub::DeviceScan::InclusiveScan(ws.at<void>(l.temp), temp_bytes, heads, row_start, MaxPosition{}, nnz,
                                            stream));
  FlagIterator flags(thrust::counting_iterator<int32_t>(0), HeadFlags{sorted_keys, row_start});
  IndexOutput out(ws.at<int64_t>(l.scan), HeadsToIndices{});
  temp_bytes = l.temp_bytes;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(ws.at<void>(l.temp), temp_bytes, flags, out, nnz, stream));
  KeyOfRow key_of;
  if (unique_keys) key_of = KeyOfRow{bags.Current(), batch.offsets, batch.rows, batch_keys, batch.nnz, unique_keys};
  segments_kernel<<<rowvec::grid_for(nnz, 1, block), block, 0, stream>>>(
      sorted_keys, ws.at<int64_t>(l.scan), nnz, uint32_t(ws.capacity_rows()), ws.at<int32_t>(l.item_start),
      ws.at<int32_t>(l.item_u), ws.at<int32_t>(l.row_item_start), ws.at<int32_t>(l.multi_rows), unique_rows,
      num_unique, ws.counts(), key_of);
  CUDA_CHECK_LAUNCH("segments_kernel");
  ws.prepared().keys_half = keys.selector;
  ws.prepared().bags_half = bags.selector;
}

// The view kernels 5 and 6 read, of the batch sort_batch left in ws (batch.grad: the gradient to reduce).
ReduceView reduce_view(const BackwardBatch& batch, const BackwardWorkspace& ws) {
  const WS::Layout& l = ws.arrays();
  const WS::Prepared& p = ws.prepared();
  ReduceView v;
  v.keys = ws.at<uint32_t>(p.keys_half ? l.keys_b : l.keys_a);
  v.bags = ws.at<uint32_t>(p.bags_half ? l.bags_b : l.bags_a);
  v.item_start = ws.at<int32_t>(l.item_start);
  v.item_u = ws.at<int32_t>(l.item_u);
  v.row_item_start = ws.at<int32_t>(l.row_item_start);
  v.multi_rows = ws.at<int32_t>(l.multi_rows);
  v.counts = ws.counts();
  v.offsets = batch.offsets;
  v.grad = batch.grad;
  v.grad_layout = batch.grad_layout;
  v.partials = ws.at<float>(l.partials);
  v.nnz = static_cast<int32_t>(batch.nnz);
  v.blocks = chunks(v.nnz);
  v.bag_count = static_cast<int32_t>(batch.bags);
  v.dim = ws.dim();
  v.sentinel = uint32_t(ws.capacity_rows());
  v.mean = batch.combiner == Combiner::mean;
  v.G = 0;
  v.log2_G = 0;
  return v;
}

// Steps 5 and 6 with the finishing op for the row shape.
template <int V, int P, class Op>
void reduce(ReduceView v, const rowvec::RowShape& shape, const Op& op, Stream stream) {
  v.G = shape.G;
  v.log2_G = shape.log2_G;
  const int block = 256;
  if (v.grad_layout.contiguous())
    reduce_items_kernel<V, P, Op, false><<<rowvec::grid_for(v.nnz, shape.G, block), block, 0, stream>>>(v, op);
  else
    reduce_items_kernel<V, P, Op, true><<<rowvec::grid_for(v.nnz, shape.G, block), block, 0, stream>>>(v, op);
  CUDA_CHECK_LAUNCH("reduce_items_kernel");
  const int32_t most = v.nnz / (C + 1);  // rows over several items: each holds more than C positions
  if (most > 0) {
    const int combine_block = kCombineGroups * shape.G;
    const size_t shared = size_t(kCombineGroups) * v.dim * sizeof(float);
    combine_rows_kernel<V, P, Op><<<rowvec::grid_for(most, combine_block, combine_block), combine_block, shared,
                                    stream>>>(v, op);
    CUDA_CHECK_LAUNCH("combine_rows_kernel");
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The lanes per item of kernels 5 and 6: at most 16 (8 with row-wise Adagrad), each lane holding more vectors,
// so that a warp works on 2-4 items at once. An item mostly holds 1-3 keys, and its loads wait in a chain (item
// table, then bags, then gradient rows), so items in flight are what keeps the memory busy; the row-wise
// accumulator's shuffle tree is also shorter with fewer lanes (experiments/NOTES_embedding.md, run 36). The sums
// keep their order: a row's elements meet in the same pairs whatever the lanes (bits of the element index).
rowvec::RowShape reduce_shape(rowvec::RowShape s, int most_lanes) {
  while (s.V == 4 && s.G > most_lanes && s.P < 4) s.G /= 2, s.log2_G -= 1, s.P *= 2;
  return s;
}

}  // namespace

void embedding_backward_prepare_cuda(const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                                     int32_t* num_unique, const int64_t* keys, int64_t* unique_keys, Stream stream) {
  sort_batch(batch, ws, unique_rows, num_unique, keys, unique_keys, stream);
}

void embedding_backward_finish_cuda(const BackwardBatch& batch, BackwardWorkspace& ws, float* row_grads,
                                    Stream stream) {
  if (batch.nnz == 0) return;
  const ReduceView v = reduce_view(batch, ws);
  const rowvec::RowShape shape = reduce_shape(
      rowvec::row_shape(ws.dim(), aligned16(batch.grad) && batch.grad_layout.four_aligned() && aligned16(row_grads)),
      16);
  rowvec::dispatch_shape(shape, [&](auto vv, auto pp) {
    constexpr int V = decltype(vv)::value, P = decltype(pp)::value;
    reduce<V, P>(v, shape, GradOut<V, P>{row_grads, ws.dim()}, stream);
  });
}

void backward_and_update_finish_cuda(const BackwardBatch& batch, BackwardWorkspace& ws, const OptimizerStep& c,
                                     void* values, float* state, Stream stream) {
  if (batch.nnz == 0) return;
  const ReduceView v = reduce_view(batch, ws);
  const int dim = ws.dim();
  const int width = optimizer_state_width(c.kind, dim);
  const bool state_vec = width == 0 || c.kind == OptimizerKind::lazy_adam || aligned16(state);
  const rowvec::RowShape shape = reduce_shape(
      rowvec::row_shape(dim, aligned16(batch.grad) && batch.grad_layout.four_aligned() && aligned16(values) && state_vec),
      c.kind == OptimizerKind::rowwise_adagrad ? 8 : 16);
  auto run = [&](auto kind, auto storage) {
    constexpr OptimizerKind K = decltype(kind)::value;
    constexpr RowStorage S = decltype(storage)::value;
    rowvec::dispatch_shape(shape, [&](auto vv, auto pp) {
      constexpr int V = decltype(vv)::value, P = decltype(pp)::value;
      reduce<V, P>(v, shape, FusedUpdate<K, V, P, S>{{c, static_cast<rowvec::stored_t<S>*>(values), state, dim, width}},
                   stream);
    });
  };
  using OK = OptimizerKind;
  using RS = RowStorage;
  if (c.storage != RS::fp32) {  // sgd or rowwise_adagrad (the launcher checked)
    auto run16 = [&](auto storage) {
      if (c.kind == OK::sgd) return run(std::integral_constant<OK, OK::sgd>{}, storage);
      run(std::integral_constant<OK, OK::rowwise_adagrad>{}, storage);
    };
    if (c.storage == RS::bf16) return run16(std::integral_constant<RS, RS::bf16>{});
    return run16(std::integral_constant<RS, RS::fp16>{});
  }
  dispatch_optimizer(c.kind, [&](auto kind) { run(kind, std::integral_constant<RS, RS::fp32>{}); });
}

}  // namespace sparta
