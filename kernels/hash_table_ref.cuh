// hash_table_ref.cuh: device-side operations on a HashTableView (hash_table.h), for kernels that fuse the
// lookup with their own work (hash_table.cu, pooled_forward.cu).
//
// Unit of work: a tile of 8 lanes (one lane per slot of a 128-byte bucket) resolves a batch of up to 8 keys:
// the first buckets of all keys are loaded at once (one independent 16-byte load per key per lane), each
// key is then matched with a tile ballot; only a bucket without the key and without an empty slot costs
// another load. In insert mode winners of a CAS take rows, write the initial values, fence and publish;
// keys that another tile is
// inserting are waited for only after this tile published its own, so a winner never waits: no deadlock.
// Winners take rows with one atomicAdd per tile (not per key): the row counter is the one shared address.
//
// Coherence: slots are read with ld.global.cg (L2; L1 is not coherent across SMs) and the row word that is
// waited for with volatile loads; a stale "empty" only makes the CAS fail, which the code handles.
#pragma once

#include <cooperative_groups.h>

#include "src/base/check.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "kernels/row_storage.h"

namespace sparta {
namespace hashdev {

namespace cg = cooperative_groups;
constexpr int kTile = kBucketSlots;
using Tile = cg::thread_block_tile<kTile>;

enum State : int { kFound, kWon, kPending, kAbsent, kRefused };

__device__ __forceinline__ HashSlot load_slot(const HashSlot* p) {
  ulonglong2 v = __ldcg(reinterpret_cast<const ulonglong2*>(p));
  return HashSlot{v.x, static_cast<int64_t>(v.y)};
}

// Where a key's probe starts: its first bucket, or the marker slot for kEmptyKey (stored there as 0).
struct Start {
  HashSlot* bucket;
  uint64_t bucket_index;
  uint64_t stored;  // the key word searched for
  bool marker;
};

__device__ __forceinline__ Start probe_start(const HashTableView& t, uint64_t key) {
  if (key == kEmptyKey) return Start{&t.meta->marker, 0, 0, true};
  uint64_t b = hash_key(key) & t.bucket_mask;
  return Start{t.slots + b * kBucketSlots, b, key, false};
}

// This lane's slot of the start bucket (lanes past the marker's single slot see a slot that never matches).
__device__ __forceinline__ HashSlot load_lane(const Start& s, int lane) {
  if (s.marker) return lane == 0 ? load_slot(s.bucket) : HashSlot{1, kRowPending};
  return load_slot(s.bucket + lane);
}

struct Probe {
  int state;
  int64_t row;     // kFound: the row
  HashSlot* slot;  // kWon, kPending: the slot whose row word is (to be) published
};

// Finds key (kInsert: or claims a slot for it), starting from the snapshot `snap` of this lane's slot in
// the start bucket. Tile-uniform result.
template <bool kInsert>
__device__ Probe probe(const Tile& tile, const HashTableView& t, Start s, HashSlot snap) {
  const int lane = tile.thread_rank();
  for (uint64_t n = 0;;) {
    unsigned hit = tile.ballot(snap.key == s.stored);
    if (hit) {
      int l = __ffs(hit) - 1;
      int64_t row = tile.shfl(snap.row, l);
      if (row >= 0) return Probe{kFound, row, s.bucket + l};
      if (!kInsert) return Probe{kAbsent, -1, nullptr};  // no concurrent inserts in find kernels
      if (row == kRowRefused) return Probe{kRefused, -1, s.bucket + l};
      return Probe{kPending, -1, s.bucket + l};
    }
    unsigned empty = tile.ballot(snap.key == kEmptyKey);
    if (!kInsert) {
      if (empty) return Probe{kAbsent, -1, nullptr};
    } else {
      while (empty) {
        int l = __ffs(empty) - 1;
        unsigned long long old = 0;
        if (lane == l)
          old = atomicCAS(reinterpret_cast<unsigned long long*>(&s.bucket[l].key), kEmptyKey, s.stored);
        old = tile.shfl(old, l);
        if (old == kEmptyKey) return Probe{kWon, -1, s.bucket + l};
        if (old == s.stored) return Probe{kPending, -1, s.bucket + l};  // its row may already be published
        empty &= ~(1u << l);
      }
    }
    if (s.marker || ++n > t.bucket_mask) return Probe{kInsert ? kRefused : kAbsent, -1, nullptr};
    s.bucket_index = (s.bucket_index + 1) & t.bucket_mask;
    s.bucket = t.slots + s.bucket_index * kBucketSlots;
    snap = load_slot(s.bucket + lane);
  }
}

// The initial values of a new row, elements strided by lane. Out of line: one copy of the per-element hashing,
// not one per key of every caller's unrolled batch (the insert path's code is what a lookup's warps fetch while
// tables fill). Scalars only: nothing goes through the stack.
inline __device__ __noinline__ void write_initial_values(float* v, int dim, KeyInit key_init, uint64_t key, int lane) {
  const uint64_t stream = key_stream(key_init, key);
  for (int e = lane; e < dim; e += kTile) v[e] = initial_value_at(stream, key_init.scale, e);
}

// The same for 16-bit rows (kernels/row_storage.h: rounded to nearest).
inline __device__ __noinline__ void write_initial_values16(uint16_t* v, int dim, KeyInit key_init, uint64_t key,
                                                           int lane) {
  const uint64_t stream = key_stream(key_init, key);
  for (int e = lane; e < dim; e += kTile)
    v[e] = rowstore::round_nearest(key_init.storage, initial_value_at(stream, key_init.scale, e));
}

// Writes the initial values of a new row (the whole tile), in the storage of init.key_init.
__device__ __forceinline__ void write_initial_row(const Tile& tile, const RowInit& init, uint64_t key, int64_t row) {
  if (init.values == nullptr) return;
  if (init.key_init.storage != RowStorage::fp32)
    return write_initial_values16(reinterpret_cast<uint16_t*>(init.values) + row * init.dim, init.dim, init.key_init,
                                  key, tile.thread_rank());
  write_initial_values(init.values + row * init.dim, init.dim, init.key_init, key, tile.thread_rank());
}

// Issues the loads of the first buckets of keys k[j], j < cnt: this lane's slot of each, in snap[j]. Nothing
// waits for them until resolve_loaded_rows reads snap, so a caller can issue other loads in between (the fused
// forward gathers the previous batch's rows meanwhile).
template <int B>
__device__ __forceinline__ void load_first_buckets(const Tile& tile, const HashTableView& t, const uint64_t (&k)[B],
                                                   int cnt, HashSlot (&snap)[B]) {
  const int lane = tile.thread_rank();
#pragma unroll
  for (int j = 0; j < B; ++j)
    if (j < cnt) snap[j] = load_lane(probe_start(t, k[j]), lane);
}

// Resolves rows[j] for keys k[j], j < cnt (tile-uniform), from snap, which load_first_buckets filled for the same
// keys. kInsert: get_insert (refused → -1, counted in meta.refused); else find (absent → -1, counted in
// meta.missing).
template <bool kInsert, int B>
__device__ __forceinline__ void resolve_loaded_rows(const Tile& tile, const HashTableView& t, const RowInit& init,
                                                    const uint64_t (&k)[B], int cnt, const HashSlot (&snap)[B],
                                                    int64_t (&rows)[B]) {
  static_assert(B <= kTile, "one winner lane per key");
  const int lane = tile.thread_rank();
  Probe p[B];
#pragma unroll
  for (int j = 0; j < B; ++j) {
    p[j] = Probe{kAbsent, -1, nullptr};
    if (j < cnt) p[j] = probe<kInsert>(tile, t, probe_start(t, k[j]), snap[j]);
  }
  int bad = 0;  // refused (insert) or absent (find) keys of this batch
  if (kInsert) {
    // Lane j takes the row of key j when the tile won its slot; one atomicAdd per tile for all its winners
    // (a counter shared by every insert would otherwise serialize them).
    bool wins = false;
#pragma unroll
    for (int j = 0; j < B; ++j)
      if (lane == j) wins = p[j].state == kWon;
    unsigned won = tile.ballot(wins);
    int64_t mine = -1;
    if (won) {
      unsigned long long base = 0;
      if (lane == 0) base = atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->next_row), (unsigned long long)__popc(won));
      base = tile.shfl(base, 0);
      mine = static_cast<int64_t>(base) + __popc(won & ((1u << lane) - 1));
    }
    bool any_won = false;
#pragma unroll
    for (int j = 0; j < B; ++j) {
      if (p[j].state != kWon) continue;
      any_won = true;
      int64_t row = tile.shfl(mine, j);
      if (row < t.capacity_rows) {
        write_initial_row(tile, init, k[j], row);
        p[j].row = row;
      } else {
        p[j].row = kRowRefused;
      }
    }
    if (any_won) {
      __threadfence();  // the initial values are visible before the row that points at them,
      tile.sync();      // in every lane (lanes run independently between collectives)
#pragma unroll
      for (int j = 0; j < B; ++j)
        if (p[j].state == kWon && lane == 0)
          atomicExch(reinterpret_cast<unsigned long long*>(&p[j].slot->row), (unsigned long long)p[j].row);
      tile.sync();
    }
#pragma unroll
    for (int j = 0; j < B; ++j) {
      int64_t row = p[j].row;
      if (p[j].state == kPending) {
        if (lane == 0) {
          volatile const long long* w = reinterpret_cast<volatile const long long*>(&p[j].slot->row);
          while ((row = *w) == kRowPending) {
          }
        }
        row = tile.shfl(row, 0);
        __threadfence();
      }
      if (p[j].state == kRefused || row < 0) row = -1, bad += j < cnt;
      rows[j] = row;
    }
    if (bad && lane == 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->refused), (unsigned long long)bad);
      int slotless = 0;  // keys that found no free slot asked for a row all the same
#pragma unroll
      for (int j = 0; j < B; ++j) slotless += j < cnt && p[j].state == kRefused && p[j].slot == nullptr;
      if (slotless) atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->slotless), (unsigned long long)slotless);
    }
  } else {
#pragma unroll
    for (int j = 0; j < B; ++j) {
      rows[j] = p[j].state == kFound ? p[j].row : -1;
      bad += j < cnt && p[j].state != kFound;
    }
    if (bad && lane == 0) atomicAdd(reinterpret_cast<unsigned long long*>(&t.meta->missing), (unsigned long long)bad);
  }
}

// Both at once: all first-bucket loads of the batch in flight together, then the probes.
template <bool kInsert, int B>
__device__ __forceinline__ void resolve_rows(const Tile& tile, const HashTableView& t, const RowInit& init,
                                             const uint64_t (&k)[B], int cnt, int64_t (&rows)[B]) {
  HashSlot snap[B];
  load_first_buckets<B>(tile, t, k, cnt, snap);
  resolve_loaded_rows<kInsert, B>(tile, t, init, k, cnt, snap, rows);
}

// A direct index's rows for keys k[j], j < cnt (tile-uniform): arithmetic, no load. Keys outside the index get -1
// and count in meta.refused (kInsert) or meta.missing, as resolve_loaded_rows counts refused and absent keys.
template <bool kInsert, int B>
__device__ __forceinline__ void direct_rows(const Tile& tile, const HashTableView& t, const uint64_t (&k)[B], int cnt,
                                            int64_t (&rows)[B]) {
  int bad = 0;
#pragma unroll
  for (int j = 0; j < B; ++j) {
    rows[j] = j < cnt ? direct_row(t, k[j]) : -1;
    bad += j < cnt && rows[j] < 0;
  }
  if (bad && tile.thread_rank() == 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(kInsert ? &t.meta->refused : &t.meta->missing), (unsigned long long)bad);
}

// Loads keys [i0, i0 + cnt) of keys[] into every lane (one load per lane, then shuffles).
template <int B>
__device__ __forceinline__ void load_keys(const Tile& tile, const int64_t* keys, int64_t i0, int cnt,
                                          uint64_t (&k)[B]) {
  int lane = tile.thread_rank();
  uint64_t mine = lane < cnt ? static_cast<uint64_t>(keys[i0 + lane]) : 0;
#pragma unroll
  for (int j = 0; j < B; ++j) k[j] = tile.shfl(mine, j);
}

// A persistent grid for a kernel of `block` threads: as many blocks as fit on the device at once, fewer when
// there is less work.
template <class Kernel>
inline int resident_grid(Kernel kernel, int block, int64_t blocks_needed) {
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0));
  int64_t resident = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  if (blocks_needed < 1) blocks_needed = 1;
  return static_cast<int>(blocks_needed < resident ? blocks_needed : resident);
}

}  // namespace hashdev
}  // namespace sparta
