// tier_index.cu: CUDA version of tier_index.h: a host tier's cache index, hits stamped on the device, distinct
// misses listed, the victims selected, rows moved between the cache and the host store (page-locked memory,
// read and written through unified addressing).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "src/base/check.h"
#include "kernels/row_storage.h"
#include "kernels/tier_index.h"

namespace sparta {

// ----------------------------------------------------------------------------
// kernels

namespace {
// counters[c] += the lanes of the warp (those active here) with flag set: one atomic per warp.
__device__ __forceinline__ void warp_count(int64_t* counters, int c, bool flag) {
  const unsigned mask = __activemask();
  const unsigned set = __ballot_sync(mask, flag);
  if (set != 0 && int(threadIdx.x & 31) == __ffs(mask) - 1)
    atomicAdd(reinterpret_cast<unsigned long long*>(counters + c), (unsigned long long)__popc(set));
}

__device__ __forceinline__ int64_t append(int64_t* counters) {
  return int64_t(atomicAdd(reinterpret_cast<unsigned long long*>(counters + kTierMisses), 1ull));
}
}  // namespace

__global__ void __launch_bounds__(256) tier_reset_kernel(TierIndex t) {
  const int64_t n = t.capacity_rows > t.cache_rows ? t.capacity_rows : t.cache_rows;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (i < t.capacity_rows) t.slot_of_row[i] = -1;
    if (i < t.cache_rows) {
      t.slot_key[i] = 0;
      t.slot_row[i] = -1;
      t.slot_last[i] = -1;
      t.slot_uses[i] = 0;
      t.slot_pin[i] = 0;
    }
  }
}

__global__ void __launch_bounds__(256) tier_lookup_kernel(TierIndex t, const int64_t* keys, const int64_t* rows_in,
                                                          int64_t n, int64_t tick, int64_t pin_gen, bool list_absent,
                                                          int64_t* row, int64_t* slot, int64_t* misses,
                                                          int64_t* counters) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t key = keys[i];
    const int64_t r = rows_in ? rows_in[i] : tier_direct_row(t, key);
    row[i] = r;
    bool first_hit = false;
    if (r < 0) {
      slot[i] = -1;
      if (list_absent) {
        const int64_t a = int64_t(atomicAdd(reinterpret_cast<unsigned long long*>(counters + kTierAbsent), 1ull));
        misses[2 * (n - 1 - a)] = key;
        misses[2 * (n - 1 - a) + 1] = -1;
      }
    } else {
      const int32_t s = t.slot_of_row[r];
      if (s >= 0) {  // a hit: the first of the call's threads on this slot counts the use
        slot[i] = s;
        // a hot key's threads mostly find the stamp set already: read before the atomic
        if (t.slot_last[s] != tick &&
            atomicExch(reinterpret_cast<unsigned long long*>(t.slot_last + s), (unsigned long long)tick) !=
                (unsigned long long)tick) {
          t.slot_uses[s] += 1;
          first_hit = true;
        }
        if (pin_gen > 0 && t.slot_pin[s] != pin_gen) t.slot_pin[s] = pin_gen;
      } else {
        slot[i] = -2;
        if (s == -1 && atomicCAS(reinterpret_cast<int*>(t.slot_of_row + r), -1, -2) == -1) {
          const int64_t m = append(counters);
          misses[2 * m] = key;
          misses[2 * m + 1] = r;
        }
      }
    }
    warp_count(counters, kTierHits, first_hit);
  }
}

// The position of this lane's entry among the warp's lanes with flag set, after the entries already counted in
// *counter (one atomic per warp), or -1 without flag.
__device__ __forceinline__ int64_t warp_append(int64_t* counter, bool flag) {
  const unsigned mask = __activemask();
  const unsigned set = __ballot_sync(mask, flag);
  if (!flag) return -1;
  const int lane = int(threadIdx.x & 31), leader = __ffs(set) - 1;
  unsigned long long base = 0;
  if (lane == leader) base = atomicAdd(reinterpret_cast<unsigned long long*>(counter), (unsigned long long)__popc(set));
  base = __shfl_sync(set, base, leader);
  return int64_t(base) + __popc(set & ((1u << lane) - 1));
}

// A block's histogram of the digits in shared memory (the lanes of a warp with the same digit add once), added to
// hist's nonzero bins at the end; the counts likewise, a thread's in registers, then the block's, then one atomic.
__global__ void __launch_bounds__(256) tier_select_count_kernel(TierIndex t, TierPolicy pol, TierDigit dg,
                                                                int64_t* hist, int64_t* counters) {
  __shared__ unsigned int h[kTierBins];
  __shared__ unsigned long long block_counts[2];
  for (int b = threadIdx.x; b < kTierBins; b += blockDim.x) h[b] = 0;
  if (threadIdx.x < 2) block_counts[threadIdx.x] = 0;
  __syncthreads();
  unsigned long long evictable_n = 0, pinned_n = 0;
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < t.cache_rows;
       s += int64_t(gridDim.x) * blockDim.x) {
    const bool evictable = tier_evictable(t, pol, s);
    const int d = evictable ? tier_digit(t, pol, dg, s) : -1;
    const unsigned same = __match_any_sync(__activemask(), d);
    if (d >= 0 && int(threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&h[d], unsigned(__popc(same)));
    evictable_n += evictable ? 1 : 0;
    pinned_n += tier_pinned(t, pol, s) ? 1 : 0;
  }
  if (evictable_n) atomicAdd(&block_counts[0], evictable_n);
  if (pinned_n) atomicAdd(&block_counts[1], pinned_n);
  __syncthreads();
  for (int b = threadIdx.x; b < kTierBins; b += blockDim.x)
    if (h[b] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(hist + b), (unsigned long long)h[b]);
  if (threadIdx.x < 2 && block_counts[threadIdx.x] != 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(counters + kTierEvictable + threadIdx.x), block_counts[threadIdx.x]);
}

__global__ void __launch_bounds__(256) tier_select_collect_kernel(TierIndex t, TierPolicy pol, TierThreshold th,
                                                                  int pack_bits, int64_t at_base, int64_t capacity,
                                                                  int64_t* slot, int64_t* key, int64_t* tie,
                                                                  int64_t* counters) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < t.cache_rows;
       s += int64_t(gridDim.x) * blockDim.x) {
    const int side = tier_evictable(t, pol, s) ? tier_side(t, pol, th, s) : 1;
    const int64_t b = warp_append(counters + kTierBelow, side < 0);
    const int64_t a = warp_append(counters + kTierAt, side == 0);
    const int64_t i = side < 0 ? b : at_base + a;
    if (side <= 0 && i < capacity) {
      slot[i] = s;
      key[i] = tier_sort_key(t, pol, pack_bits, s);
      tie[i] = tier_tie(t, pol, s);
    }
  }
}

// A row's floats between the cache and the store, by one warp: 16 bytes a lane where both ends allow it (n a
// multiple of 4, both 16-byte aligned), so that a lane has more bytes in flight over the link.
__device__ __forceinline__ void warp_copy_row(float* to, const float* from, int n, int lane) {
  if ((n & 3) == 0 && ((reinterpret_cast<uintptr_t>(to) | reinterpret_cast<uintptr_t>(from)) & 15) == 0) {
    float4* t4 = reinterpret_cast<float4*>(to);
    const float4* f4 = reinterpret_cast<const float4*>(from);
    for (int e = lane; e < n / 4; e += 32) t4[e] = f4[e];
  } else {
    for (int e = lane; e < n; e += 32) to[e] = from[e];
  }
}

constexpr int kRowWarps = 4;  // warps a block, a row each
// tier_store's grid keeps about as many bytes in flight over the link as 16 blocks of records of 128 floats with one
// state float (576 bytes; the shape it was tuned at in the step): more blocks for narrower records, at most 128
constexpr int64_t kStoreBytesInFlight = 16 * int64_t(kRowWarps) * 144 * 4;
constexpr int kStoreMaxBlocks = 128;

// One warp per slot: its row's values, state and uses to its record in the staging area, then the slot freed.
__global__ void __launch_bounds__(32 * kRowWarps) tier_stage_kernel(TierIndex t, const int64_t* slots, int64_t n,
                                                                    const float* cache_values,
                                                                    const float* cache_state, TierRecord rec,
                                                                    float* stage, int64_t* stage_rows,
                                                                    int64_t* keys_out) {
  const int lane = threadIdx.x & 31, rf = rec.rf, sw = rec.state_width;
  for (int64_t j = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32; j < n; j += int64_t(gridDim.x) * kRowWarps) {
    const int64_t s = slots[j], r = t.slot_row[s];
    float* to = stage + j * rec.floats;
    warp_copy_row(to, cache_values + s * rf, rf, lane);
    if (sw > 0) warp_copy_row(to + rf, cache_state + s * sw, sw, lane);
    for (int e = rf + sw + lane; e < rec.uses_at(); e += 32) to[e] = 0.f;  // the padding
    __syncwarp();  // every lane read slot_row[s] before it is cleared
    if (lane == 0) {
      *reinterpret_cast<int64_t*>(to + rec.uses_at()) = t.slot_uses[s];
      stage_rows[j] = r;
      keys_out[j] = t.slot_key[s];
      t.slot_of_row[r] = -1;
      t.slot_row[s] = -1;
      t.slot_last[s] = -1;
      t.slot_pin[s] = 0;
    }
  }
}

// One warp per staged record, in the order given (ascending host rows): whole to its host row over the link.
__global__ void __launch_bounds__(32 * kRowWarps) tier_store_kernel(const float* stage, const int64_t* stage_rows,
                                                                    const int64_t* order, int64_t n, int floats,
                                                                    float* host_records) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32; i < n; i += int64_t(gridDim.x) * kRowWarps) {
    const int64_t j = order[i], r = stage_rows[j];
    warp_copy_row(host_records + r * floats, stage + j * floats, floats, lane);
  }
}

// One warp per miss: its slot (TierPlacement), the slot's stamps, and its row from the host store or its initial
// values. Each distinct row is one miss, so its made flag has one writer.
__global__ void __launch_bounds__(32 * kRowWarps) tier_place_kernel(TierIndex t, const int64_t* misses, int64_t m,
                                                                    TierPlacement p, int64_t tick, int64_t pin_gen,
                                                                    uint8_t* row_made, const float* host_records,
                                                                    TierRecord rec, int dim, float initial_state,
                                                                    KeyInit init, float* cache_values,
                                                                    float* cache_state) {
  const int lane = threadIdx.x & 31, rf = rec.rf, sw = rec.state_width;
  for (int64_t j = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32; j < m; j += int64_t(gridDim.x) * kRowWarps) {
    const int64_t key = misses[2 * j], r = misses[2 * j + 1];
    const int64_t s = tier_placed_slot(p, j);
    if (s < 0) {
      if (lane == 0) t.slot_of_row[r] = -1;
      continue;
    }
    const bool made = row_made[r] != 0;  // device memory
    const float* from = host_records + r * rec.floats;
    // over the link, in flight beside the row's loads
    const int64_t uses = made && lane == 0 ? *reinterpret_cast<const int64_t*>(from + rec.uses_at()) : 0;
    if (made) {
      warp_copy_row(cache_values + s * rf, from, rf, lane);
      if (sw > 0) warp_copy_row(cache_state + s * sw, from + rf, sw, lane);
    } else {
      for (int e = lane; e < dim; e += 32)
        rowstore::store_nearest(cache_values + s * rf, init.storage, e, initial_value(init, uint64_t(key), uint32_t(e)));
      for (int k = lane; k < sw; k += 32) cache_state[s * sw + k] = initial_state;
    }
    __syncwarp();  // every lane read the flag before lane 0 sets it
    if (lane == 0) {
      t.slot_of_row[r] = int32_t(s);
      t.slot_key[s] = key;
      t.slot_row[s] = r;
      t.slot_last[s] = tick;
      t.slot_uses[s] = uses + 1;
      t.slot_pin[s] = pin_gen > 0 ? pin_gen : 0;
      if (!made) row_made[r] = 1;
    }
  }
}

__global__ void __launch_bounds__(256) tier_resolve_kernel(TierIndex t, const int64_t* row, int64_t n,
                                                           int64_t* slot) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (slot[i] == -2) slot[i] = t.slot_of_row[row[i]];
}

// ----------------------------------------------------------------------------
// launchers

namespace {
int grid_for(int64_t n, int block) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride beyond that
}
int blocks_for_rows(int64_t n) { return grid_for(n, kRowWarps); }  // a warp a row
}  // namespace

void tier_reset_cuda(const TierIndex& t, Stream stream) {
  const int64_t n = t.capacity_rows > t.cache_rows ? t.capacity_rows : t.cache_rows;
  if (n == 0) return;
  tier_reset_kernel<<<grid_for(n, 256), 256, 0, stream>>>(t);
  CUDA_CHECK_LAUNCH("tier_reset_kernel");
}

void tier_lookup_cuda(const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n, int64_t tick,
                      int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                      int64_t* counters, Stream stream) {
  CUDA_CHECK(cudaMemsetAsync(counters, 0, kTierCounters * sizeof(int64_t), stream));
  if (n == 0) return;
  tier_lookup_kernel<<<grid_for(n, 256), 256, 0, stream>>>(t, keys, rows_in, n, tick, pin_gen, list_absent, row, slot,
                                                           misses, counters);
  CUDA_CHECK_LAUNCH("tier_lookup_kernel");
}

namespace {
// A grid-stride pass over the cache's slots: enough blocks to fill the GPU, each thread at least a few slots.
int grid_for_slots(int64_t n) {
  const int64_t blocks = (n + 256 * 8 - 1) / (256 * 8);
  return static_cast<int>(blocks < 1 ? 1 : blocks < 2048 ? blocks : 2048);
}
}  // namespace

void tier_select_count_cuda(const TierIndex& t, const TierPolicy& pol, const TierDigit& d, int64_t* hist,
                            int64_t* counters, Stream stream) {
  CUDA_CHECK(cudaMemsetAsync(hist, 0, kTierBins * sizeof(int64_t), stream));
  CUDA_CHECK(cudaMemsetAsync(counters + kTierEvictable, 0, 2 * sizeof(int64_t), stream));
  static_assert(kTierPinned == kTierEvictable + 1, "the two counters are adjacent");
  if (t.cache_rows == 0) return;
  tier_select_count_kernel<<<grid_for_slots(t.cache_rows), 256, 0, stream>>>(t, pol, d, hist, counters);
  CUDA_CHECK_LAUNCH("tier_select_count_kernel");
}

void tier_select_collect_cuda(const TierIndex& t, const TierPolicy& pol, const TierThreshold& th, int pack_bits,
                              int64_t at_base, int64_t capacity, int64_t* slot, int64_t* key, int64_t* tie,
                              int64_t* counters, Stream stream) {
  CUDA_CHECK(cudaMemsetAsync(counters + kTierBelow, 0, 2 * sizeof(int64_t), stream));
  static_assert(kTierAt == kTierBelow + 1, "the two counters are adjacent");
  if (t.cache_rows == 0) return;
  tier_select_collect_kernel<<<grid_for_slots(t.cache_rows), 256, 0, stream>>>(t, pol, th, pack_bits, at_base,
                                                                               capacity, slot, key, tie, counters);
  CUDA_CHECK_LAUNCH("tier_select_collect_kernel");
}

void tier_stage_cuda(const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                     const float* cache_state, const TierRecord& rec, float* stage, int64_t* stage_rows,
                     int64_t* keys_out, Stream stream) {
  if (n == 0) return;
  tier_stage_kernel<<<blocks_for_rows(n), 32 * kRowWarps, 0, stream>>>(t, slots, n, cache_values, cache_state, rec,
                                                                         stage, stage_rows, keys_out);
  CUDA_CHECK_LAUNCH("tier_stage_kernel");
}

void tier_store_cuda(const float* stage, const int64_t* stage_rows, const int64_t* order, int64_t n,
                     const TierRecord& rec, float* host_records, Stream stream) {
  if (n == 0) return;
  // Posted writes over the link need few bytes in flight, and more stall the step's own memory traffic while the
  // link drains them: a small grid leaves the SMs and the memory system to the work the store overlaps; narrow
  // records take more blocks for the same bytes (fewer keep the next call waiting on the store).
  const int64_t block_bytes = int64_t(rec.floats) * 4 * kRowWarps;
  const int64_t by_bytes = std::min<int64_t>((kStoreBytesInFlight + block_bytes - 1) / block_bytes, kStoreMaxBlocks);
  const int blocks = std::min(blocks_for_rows(n), int(by_bytes));
  tier_store_kernel<<<blocks, 32 * kRowWarps, 0, stream>>>(stage, stage_rows, order, n, rec.floats, host_records);
  CUDA_CHECK_LAUNCH("tier_store_kernel");
}

void tier_place_cuda(const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p, int64_t tick,
                     int64_t pin_gen, uint8_t* made, const float* host_records, const TierRecord& rec, int dim,
                     float initial_state, const KeyInit& init, float* cache_values, float* cache_state,
                     Stream stream) {
  if (m == 0) return;
  tier_place_kernel<<<blocks_for_rows(m), 32 * kRowWarps, 0, stream>>>(t, misses, m, p, tick, pin_gen, made,
                                                                         host_records, rec, dim, initial_state, init,
                                                                         cache_values, cache_state);
  CUDA_CHECK_LAUNCH("tier_place_kernel");
}

void tier_resolve_cuda(const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot, Stream stream) {
  if (n == 0) return;
  tier_resolve_kernel<<<grid_for(n, 256), 256, 0, stream>>>(t, row, n, slot);
  CUDA_CHECK_LAUNCH("tier_resolve_kernel");
}

}  // namespace sparta
