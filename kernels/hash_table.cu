// hash_table.cu: CUDA version of the hash-table operations of hash_table.h (the probing itself lives in
// hash_table_ref.cuh, shared with the fused lookup kernels).
#include <cuda/atomic>
#include <cooperative_groups/scan.h>

#include "src/base/check.h"
#include "kernels/hash_table.h"
#include "kernels/hash_table_ref.cuh"

namespace sparta {

namespace cg = cooperative_groups;
constexpr int kBatch = hashdev::kTile;  // a key per lane: 8 bucket loads in flight, one row atomic per 8 keys
using hashdev::kTile;
using hashdev::Tile;

// ----------------------------------------------------------------------------
// kernels

// find: a tile per batch of 8 consecutive keys, grid-stride over batches.
__global__ void __launch_bounds__(256) hash_find_kernel(HashTableView t, const int64_t* keys, int64_t n, int64_t* rows,
                                                        uint8_t* found) {
  Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int lane = tile.thread_rank();
  int64_t batches = (n + kBatch - 1) / kBatch;
  int64_t tiles = int64_t(gridDim.x) * (blockDim.x / kTile);
  for (int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kTile; b < batches; b += tiles) {
    int64_t i0 = b * kBatch;
    int cnt = static_cast<int>(n - i0 < kBatch ? n - i0 : kBatch);
    uint64_t k[kBatch];
    hashdev::load_keys(tile, keys, i0, cnt, k);
    int64_t r[kBatch];
    hashdev::resolve_rows<false, kBatch>(tile, t, RowInit(), k, cnt, r);
    int64_t mine = r[0];
#pragma unroll
    for (int j = 1; j < kBatch; ++j)
      if (lane == j) mine = r[j];
    if (lane < cnt) {
      if (rows) rows[i0 + lane] = mine;
      if (found) found[i0 + lane] = mine >= 0;
    }
  }
}

// Writes key's initial values into values[row] and, when out is set, into out too (the whole tile: float4
// chunks by lane when vec4, else elements strided by lane).
__device__ __forceinline__ void write_new_row(const Tile& tile, const RowInit& init, uint64_t key, int64_t row,
                                              float* out, bool vec4) {
  const uint64_t stream = key_stream(init.key_init, key);
  const float scale = init.key_init.scale;
  if (init.key_init.storage != RowStorage::fp32) {  // 16-bit rows (no copy out: the launcher refuses one)
    uint16_t* v16 = reinterpret_cast<uint16_t*>(init.values) + row * init.dim;
    for (int e = tile.thread_rank(); e < init.dim; e += kTile)
      v16[e] = rowstore::round_nearest(init.key_init.storage, initial_value_at(stream, scale, e));
    return;
  }
  float* v = init.values + row * init.dim;
  if (vec4) {
    for (int e = tile.thread_rank() * 4; e < init.dim; e += kTile * 4) {
      float4 x = make_float4(initial_value_at(stream, scale, e), initial_value_at(stream, scale, e + 1),
                             initial_value_at(stream, scale, e + 2), initial_value_at(stream, scale, e + 3));
      *reinterpret_cast<float4*>(v + e) = x;
      if (out) *reinterpret_cast<float4*>(out + e) = x;
    }
  } else {
    for (int e = tile.thread_rank(); e < init.dim; e += kTile) {
      float x = initial_value_at(stream, scale, e);
      v[e] = x;
      if (out) out[e] = x;
    }
  }
}

// get_insert for bulk calls (the fused kernels keep hashdev::resolve_rows, tuned for their hit path).
// A tile takes a batch of 8 consecutive keys, lane j owning key j; the batch's round trips are shared:
//   1. the first buckets of all 8 keys are loaded at once; a ballot per key finds it or its first empty slot;
//   2. every lane with an empty slot CASes it at the same time (one round trip for the batch, not one per key);
//   3. keys the fast path could not settle (CAS lost to another key, full first bucket, a pending row, the
//      marker key) go through the general probe, one at a time;
//   4. one atomicAdd takes the rows of all winners of the converged tiles (usually the warp's 4); the tile
//      writes its winners' initial values (and copies);
//   5. after a tile barrier each winner publishes its row with a release store: the barrier orders the
//      other lanes' value writes before it and release is cumulative, so the values are visible before
//      the row (as fast as every lane's __threadfence() before the barrier);
//   6. keys another tile is inserting wait for their row word (acquire), only now that this tile has
//      published its own, so no tile waits on one that waits on it;
//   7. out (may be null): rows of found keys are copied, all loads of the batch in flight at once.
// Occupancy: 128-thread blocks, 7 per SM (72 registers, no spills), with the row atomic per warp: the fastest of
// the block shapes measured (experiments/NOTES_embedding.md).
constexpr int kGetInsertBlock = 128;
__global__ void __launch_bounds__(kGetInsertBlock, 7)
    hash_get_insert_kernel(HashTableView t, const int64_t* keys, int64_t n, int64_t* rows, RowInit init, float* out,
                           bool vec4) {
  using hashdev::kFound;
  using hashdev::kWon;
  using hashdev::kPending;
  using hashdev::kAbsent;
  using hashdev::kRefused;
  Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int lane = tile.thread_rank();
  const unsigned below = (1u << lane) - 1;
  const int dim = init.dim;
  int64_t batches = (n + kBatch - 1) / kBatch;
  int64_t tiles = int64_t(gridDim.x) * (blockDim.x / kTile);
  for (int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kTile; b < batches; b += tiles) {
    const int64_t i0 = b * kBatch;
    const int cnt = static_cast<int>(n - i0 < kBatch ? n - i0 : kBatch);
    const uint64_t my_key = lane < cnt ? static_cast<uint64_t>(keys[i0 + lane]) : 0;
    const uint64_t my_bucket = hash_key(my_key) & t.bucket_mask;

    // 1. All first buckets in flight, then a ballot per key. kAbsent here: not settled yet.
    uint64_t k[kBatch];
    HashSlot snap[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      k[j] = tile.shfl(my_key, j);
      snap[j] = HashSlot{~k[j] ^ 1, 0};  // neither the key nor empty: settled by the general probe
      if (j < cnt && k[j] != kEmptyKey)
        snap[j] = hashdev::load_slot(t.slots + (hash_key(k[j]) & t.bucket_mask) * kBucketSlots + lane);
    }
    int state = kAbsent;
    int64_t row = -1;
    HashSlot* slot = nullptr;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (j >= cnt) break;
      unsigned hit = tile.ballot(snap[j].key == k[j]);
      unsigned empty = tile.ballot(snap[j].key == kEmptyKey);
      int l = __ffs(hit ? hit : empty) - 1;
      int64_t r = tile.shfl(snap[j].row, l < 0 ? 0 : l);
      if (lane == j && l >= 0) {
        if (hit && r >= 0) state = kFound, row = r;
        if (!hit) state = kWon, slot = t.slots + my_bucket * kBucketSlots + l;  // a candidate until the CAS
      }
    }
    // 2. The CASes of the batch together.
    if (state == kWon) {
      unsigned long long old = atomicCAS(reinterpret_cast<unsigned long long*>(&slot->key), kEmptyKey, my_key);
      if (old != kEmptyKey) state = old == my_key ? kPending : kAbsent;
    }
    // 3. The rest through the general probe.
    for (unsigned rest = tile.ballot(lane < cnt && state == kAbsent); rest; rest &= rest - 1) {
      int j = __ffs(rest) - 1;
      hashdev::Start s = hashdev::probe_start(t, tile.shfl(my_key, j));
      hashdev::Probe p = hashdev::probe<true>(tile, t, s, hashdev::load_lane(s, lane));
      if (lane == j) state = p.state, row = p.row, slot = p.slot;
    }
    // 4. Rows for the winners, their values.
    unsigned won = tile.ballot(state == kWon);
    if (won) {
      // One atomicAdd per group of converged tiles (usually the warp's 4): tile leaders scan their winner
      // counts. Any grouping is correct: a tile's base is its lane 0's, and a group without a leader adds 0.
      cg::coalesced_group g = cg::coalesced_threads();
      const unsigned long long mine = lane == 0 ? (unsigned long long)__popc(won) : 0ull;
      const unsigned long long incl = cg::inclusive_scan(g, mine);
      unsigned long long group_base = 0;
      if (g.thread_rank() == g.num_threads() - 1)
        group_base = atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->next_row), incl);
      group_base = g.shfl(group_base, g.num_threads() - 1);
      const unsigned long long base = tile.shfl(group_base + incl - mine, 0);
      if (state == kWon) {
        row = static_cast<int64_t>(base) + __popc(won & below);
        if (row >= t.capacity_rows) row = kRowRefused;
      }
      if (init.values != nullptr)
        for (unsigned fill = tile.ballot(state == kWon && row >= 0); fill; fill &= fill - 1) {
          int j = __ffs(fill) - 1;
          write_new_row(tile, init, tile.shfl(my_key, j), tile.shfl(row, j), out ? out + (i0 + j) * dim : nullptr,
                        vec4);
        }
      // 5. Publish.
      tile.sync();
      if (state == kWon) {
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> w(
            *reinterpret_cast<unsigned long long*>(&slot->row));
        w.store(static_cast<unsigned long long>(row), cuda::memory_order_release);
      }
    }
    // 6. Rows other tiles are publishing.
    if (state == kPending) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> w(
          *reinterpret_cast<unsigned long long*>(&slot->row));
      while ((row = static_cast<int64_t>(w.load(cuda::memory_order_acquire))) == kRowPending) {
      }
    }
    const bool refused = lane < cnt && row < 0;  // kRefused, or a winner or pending key refused a row
    if (refused) row = -1;
    // 7. Copy out the rows this batch did not write (found and pending keys; zeros for refused ones).
    if (out) {
      unsigned copy = tile.ballot(lane < cnt && state != kWon);
      if (copy) {
        tile.sync();  // pending rows were acquired by their lane; the barrier passes that on to the tile
        if (vec4) {
          int64_t rr[kBatch];  // shuffled before the loop: not every lane enters it when dim < 32
#pragma unroll
          for (int j = 0; j < kBatch; ++j) rr[j] = tile.shfl(row, j);
          for (int e = lane * 4; e < dim; e += kTile * 4) {
            float4 x[kBatch];
#pragma unroll
            for (int j = 0; j < kBatch; ++j) {
              x[j] = make_float4(0.f, 0.f, 0.f, 0.f);
              if ((copy >> j & 1) && rr[j] >= 0) x[j] = __ldcg(reinterpret_cast<const float4*>(init.values + rr[j] * dim + e));
            }
#pragma unroll
            for (int j = 0; j < kBatch; ++j)
              if (copy >> j & 1) *reinterpret_cast<float4*>(out + (i0 + j) * dim + e) = x[j];
          }
        } else {
          for (; copy; copy &= copy - 1) {
            int j = __ffs(copy) - 1;
            int64_t r = tile.shfl(row, j);
            for (int e = lane; e < dim; e += kTile) out[(i0 + j) * dim + e] = r >= 0 ? __ldcg(init.values + r * dim + e) : 0.f;
          }
        }
      }
    }
    if (rows && lane < cnt) rows[i0 + lane] = row;
    unsigned bad = tile.ballot(refused);
    if (bad && lane == 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->refused), (unsigned long long)__popc(bad));
    }
    unsigned slotless = tile.ballot(refused && state == kRefused && slot == nullptr);  // asked for a row too
    if (slotless && lane == 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->slotless), (unsigned long long)__popc(slotless));
  }
}

// A tile per key: key i gets row first_row + i unless present.
__global__ void __launch_bounds__(256) hash_load_kernel(HashTableView t, const int64_t* keys, int64_t n,
                                                        int64_t first_row) {
  Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  int64_t tiles = int64_t(gridDim.x) * (blockDim.x / kTile);
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kTile; i < n; i += tiles) {
    uint64_t key = static_cast<uint64_t>(keys[i]);
    hashdev::Start s = hashdev::probe_start(t, key);
    hashdev::Probe p = hashdev::probe<true>(tile, t, s, hashdev::load_lane(s, tile.thread_rank()));
    if (tile.thread_rank() != 0) continue;
    if (p.state == hashdev::kWon) {
      atomicExch(reinterpret_cast<unsigned long long*>(&p.slot->row), (unsigned long long)(first_row + i));
    } else if (p.state == hashdev::kRefused) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->refused), 1ull);
    } else {
      atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->duplicates), 1ull);
      atomicExch(reinterpret_cast<unsigned long long*>(&t.meta->bad_key), (unsigned long long)key);
    }
  }
}

// A direct index: a thread per key, rows by arithmetic (and out, when set: the key's values, zeros outside the
// index); keys outside it counted in *bad (meta.refused or meta.missing).
__global__ void __launch_bounds__(256) direct_rows_kernel(HashTableView t, const int64_t* keys, int64_t n,
                                                          int64_t* rows, uint8_t* found, unsigned long long* bad,
                                                          const float* values, int dim, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = direct_row(t, static_cast<uint64_t>(keys[i]));
    if (row < 0) atomicAdd(bad, 1ull);
    if (rows) rows[i] = row;
    if (found) found[i] = row >= 0;
    if (out)
      for (int e = 0; e < dim; ++e) out[i * dim + e] = row >= 0 ? values[row * dim + e] : 0.f;
  }
}

__global__ void __launch_bounds__(256) direct_export_kernel(HashTableView t, int64_t* keys_by_row) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < t.capacity_rows; r += int64_t(gridDim.x) * blockDim.x)
    keys_by_row[r] = t.direct_offset + r * t.direct_stride;
}

// Rows are dense, so export is a scatter by row: no atomics, deterministic.
__global__ void __launch_bounds__(256) hash_export_kernel(HashTableView t, int64_t num_slots, int64_t* keys_by_row) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i <= num_slots; i += int64_t(gridDim.x) * blockDim.x) {
    HashSlot s = i < num_slots ? t.slots[i] : t.meta->marker;
    if (s.key != kEmptyKey && s.row >= 0 && s.row < t.capacity_rows)
      keys_by_row[s.row] = i < num_slots ? static_cast<int64_t>(s.key) : static_cast<int64_t>(kEmptyKey);
  }
}

// ----------------------------------------------------------------------------
// launchers

using hashdev::resident_grid;

namespace {
void direct_rows_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found,
                      int64_t* bad, const float* values, int dim, float* out, Stream stream) {
  const int block = 256;
  int grid = resident_grid(direct_rows_kernel, block, (n + block - 1) / block);
  direct_rows_kernel<<<grid, block, 0, stream>>>(t, keys, n, rows, found, reinterpret_cast<unsigned long long*>(bad),
                                                 values, dim, out);
  CUDA_CHECK_LAUNCH("direct_rows_kernel");
}
}  // namespace

void hash_get_insert_copy_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                               const RowInit& init, float* out, Stream stream) {
  if (n == 0) return;
  SPARTA_REQUIRE(out == nullptr || init.key_init.storage == RowStorage::fp32,
                 "hash_get_insert_copy: copies fp32 rows only, the rows are %s", row_storage_name(init.key_init.storage));
  if (t.direct_stride > 0)
    return direct_rows_cuda(t, keys, n, rows, nullptr, &t.meta->refused, init.values, init.dim, out, stream);
  const int block = kGetInsertBlock;
  int64_t batches = (n + kBatch - 1) / kBatch;
  bool vec4 = init.dim % 4 == 0 && reinterpret_cast<uintptr_t>(init.values) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(out) % 16 == 0;
  int grid = resident_grid(hash_get_insert_kernel, block, (batches + block / kTile - 1) / (block / kTile));
  hash_get_insert_kernel<<<grid, block, 0, stream>>>(t, keys, n, rows, init, out, vec4);
  CUDA_CHECK_LAUNCH("hash_get_insert_kernel");
}

void hash_get_insert_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init,
                          Stream stream) {
  hash_get_insert_copy_cuda(t, keys, n, rows, init, nullptr, stream);
}

void hash_find_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found,
                    Stream stream) {
  if (n == 0) return;
  if (t.direct_stride > 0)
    return direct_rows_cuda(t, keys, n, rows, found, &t.meta->missing, nullptr, 0, nullptr, stream);
  const int block = 256;
  int64_t batches = (n + kBatch - 1) / kBatch;
  int grid = resident_grid(hash_find_kernel, block, (batches + block / kTile - 1) / (block / kTile));
  hash_find_kernel<<<grid, block, 0, stream>>>(t, keys, n, rows, found);
  CUDA_CHECK_LAUNCH("hash_find_kernel");
}

void hash_load_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row, Stream stream) {
  SPARTA_REQUIRE(t.direct_stride == 0, "hash_load: a direct index holds every row already");
  if (n == 0) return;
  const int block = 256;
  int grid = resident_grid(hash_load_kernel, block, (n + block / kTile - 1) / (block / kTile));
  hash_load_kernel<<<grid, block, 0, stream>>>(t, keys, n, first_row);
  CUDA_CHECK_LAUNCH("hash_load_kernel");
}

void hash_export_cuda(const HashTableView& t, int64_t num_slots, int64_t* keys_by_row, Stream stream) {
  const int block = 256;
  if (t.direct_stride > 0) {
    int grid = resident_grid(direct_export_kernel, block, (t.capacity_rows + block - 1) / block);
    direct_export_kernel<<<grid, block, 0, stream>>>(t, keys_by_row);
    CUDA_CHECK_LAUNCH("direct_export_kernel");
    return;
  }
  int grid = resident_grid(hash_export_kernel, block, (num_slots + 1 + block - 1) / block);
  hash_export_kernel<<<grid, block, 0, stream>>>(t, num_slots, keys_by_row);
  CUDA_CHECK_LAUNCH("hash_export_kernel");
}

}  // namespace sparta
