// tier_index.h: the device side of a host tier's cache (src/host_tier.h): which host rows are cached in which slot,
// each slot's policy stamps, and the kernels that keep hits on the device, so that only a call's missing keys reach
// the host.
//
// TierIndex holds device arrays: slot_of_row [capacity_rows] (the slot of a cached host row, -1 when not cached,
// -2 while a call has claimed it as a miss) and per slot [cache_rows]: its key, host row (-1: free), last call
// (LRU), uses over the row's life (LFU; the store keeps the count while the row is out of the cache) and the pin
// generation that pinned it (pinned while equal to the tier's current one, so releasing every pin is one increment
// on the host). Placing a call's misses runs on the device too (tier_place): the host decides only how many take
// free slots and which slots are the victims, so its work per call does not grow with the misses. On the cpu
// backend these are host arrays and the kernels plain loops (tier_index.cpp), with the same results: a key's slot,
// the distinct misses (as a set; their order in the list is the host's to fix) and the stamps do not depend on
// thread order.
//
// Launchers run on `stream` (cuda; the cpu backend ignores it) and never synchronize the host. host_values,
// host_state and host_uses are the host store: page-locked memory (cudaMallocHost), which a CUDA kernel reads and
// writes through unified addressing, so rows move between the store and the cache without staging on the host.
#pragma once

#include <cstdint>

#include "kernels/key_init.h"
#include "src/base/device.h"

namespace sparta {

struct TierIndex {
  int32_t* slot_of_row = nullptr;  // [capacity_rows]
  int64_t* slot_key = nullptr;     // [cache_rows]
  int64_t* slot_row = nullptr;     // [cache_rows] host row, -1 free
  int64_t* slot_last = nullptr;    // [cache_rows] last call that used the slot, -1 free
  int64_t* slot_uses = nullptr;    // [cache_rows] the row's uses (calls) over its life
  int64_t* slot_pin = nullptr;     // [cache_rows] pin generation of the last pinning call
  int64_t capacity_rows = 0;
  int64_t cache_rows = 0;
  // Host rows by arithmetic (a direct index: key direct_offset + row * direct_stride), when direct_stride > 0.
  int64_t direct_stride = 0;
  int64_t direct_offset = 0;
};

// Counters a lookup and a victim ranking write (device memory, [kTierCounters] int64, zeroed by tier_lookup).
enum TierCounter { kTierMisses, kTierHits, kTierEvictable, kTierPinned, kTierRanked, kTierAbsent, kTierCounters };

// Every slot free, no row cached. Asynchronous.
void tier_reset(const Device& dev, const TierIndex& t, Stream stream);

// The call `tick`'s keys [n]: row[i] = the key's host row (given in rows_in [n], a hashed table's, or by a direct
// index's arithmetic when rows_in is null; -1 outside it), slot[i] = its cached slot, -2 when the row is not cached
// (resolved by tier_resolve once the misses are placed), -1 without a row. A hit stamps its slot: last = tick,
// uses + 1 once per call (counters[kTierHits] counts those distinct hits), pin = pin_gen when pin_gen > 0. Each
// distinct uncached row is claimed (slot_of_row = -2) and listed once in misses [n, 2] as (key, row) from the front
// (count in counters[kTierMisses]); with list_absent, keys without a row are listed from the back (pair n - 1 - a
// for the a-th, as (key, -1), once per occurrence; count in counters[kTierAbsent]).
void tier_lookup(const Device& dev, const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n,
                 int64_t tick, int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                 int64_t* counters, Stream stream);

// The policy's order of the slots: prio[s], tie[s] sort the ranked slots (cached, not used by call tick, and not
// pinned by pin_gen unless rank_pinned) by (prio, tie) ascending, prio = uses (lfu) or last call (lru), tie = the
// host row (by_row: a direct index, whose rows ascend with their keys) or the key's bits with the sign flipped (so
// that an unsigned order is the keys' signed order); the other slots get prio tick + 1, after every ranked one.
// Counts the evictable (ranked and unpinned), pinned and ranked slots into counters.
void tier_victim_order(const Device& dev, const TierIndex& t, int64_t tick, int64_t pin_gen, bool lfu, bool by_row,
                       bool rank_pinned, int64_t* prio, int64_t* tie, int64_t* counters, Stream stream);

// Writes the cached rows of slots [n] back to the host store (values [capacity_rows, dim], state [capacity_rows,
// state_width], uses [capacity_rows]: the slot's uses) and frees the slots (slot_of_row of their rows back to -1);
// keys_out [n] = each slot's key.
void tier_evict(const Device& dev, const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                const float* cache_state, int dim, int state_width, float* host_values, float* host_state,
                int64_t* host_uses, int64_t* keys_out, Stream stream);

// Where a call's misses go (tier_place): miss j takes slot first_free + j for j < n_free, then victims[j - n_free]
// for j - n_free < n_victims (victims: device memory); the misses beyond get no slot.
struct TierPlacement {
  int64_t first_free = 0, n_free = 0;
  const int64_t* victims = nullptr;
  int64_t n_victims = 0;
};

// Places the distinct misses [m] (misses[2j] the key, misses[2j + 1] its host row) as p says: a placed row is
// stamped (last = tick, pinned by pin_gen when > 0) and takes its values and state from the host store with uses
// host_uses + 1 when made [capacity_rows] (device memory) says the store holds it, else its initial values by key
// (init: kernels/key_init.h, its segments on the device) and initial_state with uses 1, and made is set. A miss
// without a slot drops its row's claim (slot_of_row back to -1).
void tier_place(const Device& dev, const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p,
                int64_t tick, int64_t pin_gen, uint8_t* made, const int64_t* host_uses, const float* host_values,
                const float* host_state, int dim, int state_width, float initial_state, const KeyInit& init,
                float* cache_values, float* cache_state, Stream stream);

// slot[i] = slot_of_row[row[i]] where slot[i] == -2 (a miss, placed now or refused: -1). [n].
void tier_resolve(const Device& dev, const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot,
                  Stream stream);

void tier_reset_cpu(const TierIndex& t);
void tier_lookup_cpu(const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n, int64_t tick,
                     int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                     int64_t* counters);
void tier_victim_order_cpu(const TierIndex& t, int64_t tick, int64_t pin_gen, bool lfu, bool by_row, bool rank_pinned,
                           int64_t* prio, int64_t* tie, int64_t* counters);
void tier_evict_cpu(const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                    const float* cache_state, int dim, int state_width, float* host_values, float* host_state,
                    int64_t* host_uses, int64_t* keys_out);
void tier_place_cpu(const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p, int64_t tick,
                    int64_t pin_gen, uint8_t* made, const int64_t* host_uses, const float* host_values,
                    const float* host_state, int dim, int state_width, float initial_state, const KeyInit& init,
                    float* cache_values, float* cache_state);
void tier_resolve_cpu(const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot);

void tier_reset_cuda(const TierIndex& t, Stream stream);
void tier_lookup_cuda(const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n, int64_t tick,
                      int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                      int64_t* counters, Stream stream);
void tier_victim_order_cuda(const TierIndex& t, int64_t tick, int64_t pin_gen, bool lfu, bool by_row,
                            bool rank_pinned, int64_t* prio, int64_t* tie, int64_t* counters, Stream stream);
void tier_evict_cuda(const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                     const float* cache_state, int dim, int state_width, float* host_values, float* host_state,
                     int64_t* host_uses, int64_t* keys_out, Stream stream);
void tier_place_cuda(const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p, int64_t tick,
                     int64_t pin_gen, uint8_t* made, const int64_t* host_uses, const float* host_values,
                     const float* host_state, int dim, int state_width, float initial_state, const KeyInit& init,
                     float* cache_values, float* cache_state, Stream stream);
void tier_resolve_cuda(const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot, Stream stream);

// The slot miss j takes under p, or -1.
SPARTA_HD int64_t tier_placed_slot(const TierPlacement& p, int64_t j) {
  if (j < p.n_free) return p.first_free + j;
  return j - p.n_free < p.n_victims ? p.victims[j - p.n_free] : -1;
}

// The host row of key in a direct index of t, or -1 outside it.
SPARTA_HD int64_t tier_direct_row(const TierIndex& t, int64_t key) {
  if (key < t.direct_offset) return -1;
  const int64_t d = key - t.direct_offset;
  const int64_t r = t.direct_stride == 1 ? d : d / t.direct_stride;
  return r * t.direct_stride == d && r < t.capacity_rows ? r : -1;
}

}  // namespace sparta
