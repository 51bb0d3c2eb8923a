// hash_table.cu: CUDA version of the hash-table operations of hash_table.h (the probing itself lives in
// hash_table_ref.cuh, shared with the fused lookup kernels).
#include "check.h"
#include "hash_table.h"
#include "hash_table_ref.cuh"

namespace sparta {

namespace cg = cooperative_groups;
constexpr int kBatch = hashdev::kTile;  // a key per lane: 8 bucket loads in flight, one row atomic per 8 keys
using hashdev::kTile;
using hashdev::Tile;

// ----------------------------------------------------------------------------
// kernels

// A tile per batch of 8 consecutive keys, grid-stride over batches.
template <bool kInsert>
__global__ void __launch_bounds__(256) hash_rows_kernel(HashTableView t, const int64_t* keys, int64_t n,
                                                        int64_t* rows, uint8_t* found, RowInit init) {
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
    hashdev::resolve_rows<kInsert, kBatch>(tile, t, init, k, cnt, r);
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

void hash_get_insert_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init,
                          Stream stream) {
  if (n == 0) return;
  const int block = 256;
  int64_t batches = (n + kBatch - 1) / kBatch;
  int grid = resident_grid(hash_rows_kernel<true>, block, (batches + block / kTile - 1) / (block / kTile));
  hash_rows_kernel<true><<<grid, block, 0, stream>>>(t, keys, n, rows, nullptr, init);
  CUDA_CHECK_LAUNCH("hash_rows_kernel<insert>");
}

void hash_find_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found,
                    Stream stream) {
  if (n == 0) return;
  const int block = 256;
  int64_t batches = (n + kBatch - 1) / kBatch;
  int grid = resident_grid(hash_rows_kernel<false>, block, (batches + block / kTile - 1) / (block / kTile));
  hash_rows_kernel<false><<<grid, block, 0, stream>>>(t, keys, n, rows, found, RowInit());
  CUDA_CHECK_LAUNCH("hash_rows_kernel<find>");
}

void hash_load_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row, Stream stream) {
  if (n == 0) return;
  const int block = 256;
  int grid = resident_grid(hash_load_kernel, block, (n + block / kTile - 1) / (block / kTile));
  hash_load_kernel<<<grid, block, 0, stream>>>(t, keys, n, first_row);
  CUDA_CHECK_LAUNCH("hash_load_kernel");
}

void hash_export_cuda(const HashTableView& t, int64_t num_slots, int64_t* keys_by_row, Stream stream) {
  const int block = 256;
  int grid = resident_grid(hash_export_kernel, block, (num_slots + 1 + block - 1) / block);
  hash_export_kernel<<<grid, block, 0, stream>>>(t, num_slots, keys_by_row);
  CUDA_CHECK_LAUNCH("hash_export_kernel");
}

}  // namespace sparta
