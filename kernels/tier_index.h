// tier_index.h: the device side of a host tier's cache (src/host_tier.h): which host rows are cached in which slot,
// each slot's policy stamps, and the kernels that keep hits on the device, so that only a call's missing keys reach
// the host.
//
// TierIndex holds device arrays: slot_of_row [capacity_rows] (the slot of a cached host row, -1 when not cached,
// -2 while a call has claimed it as a miss) and per slot [cache_rows]: its key, host row (-1: free), last call
// (LRU), uses over the row's life (LFU; the store keeps the count while the row is out of the cache) and the pin
// generation that pinned it (pinned while equal to the tier's current one, so releasing every pin is one increment
// on the host). Choosing the victims (tier_select_*) and placing a call's misses (tier_place) run on the device
// too: the host reads only counts and a histogram a digit, so its work per call grows with neither the misses nor
// the victims. On the cpu backend these are host arrays and the kernels plain loops (tier_index.cpp), with the same
// results: a key's slot, the distinct misses and the selection's lists (as sets; their order is the host's to fix)
// and the stamps do not depend on thread order.
//
// Launchers run on `stream` (cuda; the cpu backend ignores it) and never synchronize the host. host_records is the
// host store: page-locked memory (cudaMallocHost), which a CUDA kernel reads and writes through unified addressing,
// so rows move between the store and the cache without staging on the host (evicted rows pass through a device
// staging area, so that their writes over the link can trail on a stream of their own). The store holds a row as
// one record (TierRecord): its values as stored, its optimizer state and its use count in whole 64-byte lines, so
// that a victim's write over the link is whole lines: rows spread over the store are written at about twice the
// rate of values, state and count written to three arrays (each a partial line the host must merge).
#pragma once

#include <cstdint>

#include "kernels/key_init.h"
#include "src/base/device.h"

namespace sparta {

struct TierIndex {
  int32_t* slot_of_row = nullptr;  // [capacity_rows]
  int64_t* slot_key = nullptr;     // [cache_rows]
  int64_t* slot_row = nullptr;     // [cache_rows] host row, -1 free
  int64_t* slot_last = nullptr;    // [cache_rows] last call that used the slot (>= 1), -1 exactly when free
  int64_t* slot_uses = nullptr;    // [cache_rows] the row's uses (calls) over its life
  int64_t* slot_pin = nullptr;     // [cache_rows] pin generation of the last pinning call
  int64_t capacity_rows = 0;
  int64_t cache_rows = 0;
  // Host rows by arithmetic (a direct index: key direct_offset + row * direct_stride), when direct_stride > 0.
  int64_t direct_stride = 0;
  int64_t direct_offset = 0;
};

// Counters a lookup and a victim selection write (device memory, [kTierCounters] int64; tier_lookup zeroes them).
enum TierCounter {
  kTierMisses,
  kTierHits,
  kTierEvictable,
  kTierPinned,
  kTierAbsent,
  kTierBelow,  // tier_select_collect's lists
  kTierAt,
  kTierCounters
};

// A host row's record in the store: rf floats of values as stored (row_storage_floats: 16-bit values as their bits,
// pairs in a float), state_width floats of state, padding, and the row's use count (an int64 in the last two
// floats; valid once the row is made), floats (a multiple of 16: whole 64-byte lines) in all.
struct TierRecord {
  int rf = 0, state_width = 0, floats = 0;
  SPARTA_HD int uses_at() const { return floats - 2; }
};
SPARTA_HD TierRecord tier_record(int row_floats, int state_width) {
  TierRecord r;
  r.rf = row_floats;
  r.state_width = state_width;
  r.floats = (row_floats + state_width + 2 + 15) / 16 * 16;
  return r;
}

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

// The policy's victims are the evictable slots (cached, not used by call tick, not pinned by pin_gen) with the
// least (prio, tie): prio = uses (lfu) or the last call (lru), in [0, tick]; tie = the host row (by_row: a direct
// index, whose rows ascend with their keys) or the key's bits with the sign flipped (so that an unsigned order is
// the keys' signed order), compared as unsigned. The host finds the threshold digit by digit (a radix select,
// kTierDigitBits a pass from the top: the prio's digits, then, while too many slots share the threshold's prio,
// the tie's), then collects and sorts only the victims, so nothing of the size of the cache is sorted or crosses
// the link.
struct TierPolicy {
  int64_t tick = 0, pin_gen = 0;
  bool lfu = false, by_row = false;
};
constexpr int kTierDigitBits = 12;
constexpr int kTierBins = 1 << kTierDigitBits;

// A pass of the select: the digit of `bits` bits (<= kTierDigitBits) at shift of the prio (tie false) or of the
// tie of the slots whose prio is prio (tie true), among the values whose higher bits are prefix.
struct TierDigit {
  bool tie = false;
  int64_t prio = 0;
  int shift = 0, bits = kTierDigitBits;
  uint64_t prefix = 0;
};

// hist [kTierBins] (zeroed here) counts the evictable slots that d selects, by their digit; counters[kTierEvictable]
// and counters[kTierPinned] count every evictable and pinned slot (both zeroed here).
void tier_select_count(const Device& dev, const TierIndex& t, const TierPolicy& pol, const TierDigit& d,
                       int64_t* hist, int64_t* counters, Stream stream);

// The threshold of a select: the slots with prio < prio, or prio == prio and (tie >> tie_shift) < tie_prefix
// (unsigned), are below it; those with prio == prio and (tie >> tie_shift) == tie_prefix are at it (tie_shift 64:
// every slot of that prio).
struct TierThreshold {
  int64_t prio = 0;
  int tie_shift = 64;
  uint64_t tie_prefix = 0;
};

// The evictable slots below th and at it, listed in slot, key and tie: those below at 0, 1, ... (count in
// counters[kTierBelow]), those at it at at_base, at_base + 1, ... (counters[kTierAt]), each list in no set order
// (both counters zeroed here). key = the prio, or with pack_bits > 0 (prio and tie fit 64 bits together) the
// prio << pack_bits | tie, one key to sort by. Entries at list positions >= capacity are counted, not written.
void tier_select_collect(const Device& dev, const TierIndex& t, const TierPolicy& pol, const TierThreshold& th,
                         int pack_bits, int64_t at_base, int64_t capacity, int64_t* slot, int64_t* key, int64_t* tie,
                         int64_t* counters, Stream stream);

// Evicts the cached rows of slots [n] through a device staging area of records: tier_stage copies each row's values,
// state and uses into its record stage [n, rec.floats] (padding zeroed) with its host row in stage_rows [n], frees
// the slots (slot_of_row of their rows back to -1) and writes each slot's key to keys_out [n]; tier_store then writes
// the staged records whole to the host store (host_records [capacity_rows, rec.floats]), on a stream of its own, so
// that the link's writes overlap the work that follows. Its j-th write is the staged row order[j]: in ascending host
// rows (route_sort_keys of stage_rows), the link's writes run at about twice the rate of rows spread in the
// policy's order. The rows are copied, never read as values.
void tier_stage(const Device& dev, const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                const float* cache_state, const TierRecord& rec, float* stage, int64_t* stage_rows,
                int64_t* keys_out, Stream stream);
void tier_store(const Device& dev, const float* stage, const int64_t* stage_rows, const int64_t* order, int64_t n,
                const TierRecord& rec, float* host_records, Stream stream);

// Where a call's misses go (tier_place): miss j takes slot first_free + j for j < n_free, then victims[j - n_free]
// for j - n_free < n_victims (victims: device memory); the misses beyond get no slot.
struct TierPlacement {
  int64_t first_free = 0, n_free = 0;
  const int64_t* victims = nullptr;
  int64_t n_victims = 0;
};

// Places the distinct misses [m] (misses[2j] the key, misses[2j + 1] its host row) as p says: a placed row is
// stamped (last = tick, pinned by pin_gen when > 0) and takes its values, state and uses + 1 from its record in the
// host store when made [capacity_rows] (device memory) says the store holds it, else its initial values by key
// (init: kernels/key_init.h, its segments on the device; dim values in init.storage, rounded to nearest) and
// initial_state with uses 1, and made is set. A miss without a slot drops its row's claim (slot_of_row back to -1).
// rec: the store's records (rec.rf == row_storage_floats(init.storage, dim)).
void tier_place(const Device& dev, const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p,
                int64_t tick, int64_t pin_gen, uint8_t* made, const float* host_records, const TierRecord& rec,
                int dim, float initial_state, const KeyInit& init, float* cache_values, float* cache_state,
                Stream stream);

// slot[i] = slot_of_row[row[i]] where slot[i] == -2 (a miss, placed now or refused: -1). [n].
void tier_resolve(const Device& dev, const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot,
                  Stream stream);

void tier_reset_cpu(const TierIndex& t);
void tier_lookup_cpu(const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n, int64_t tick,
                     int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                     int64_t* counters);
void tier_select_count_cpu(const TierIndex& t, const TierPolicy& pol, const TierDigit& d, int64_t* hist,
                           int64_t* counters);
void tier_select_collect_cpu(const TierIndex& t, const TierPolicy& pol, const TierThreshold& th, int pack_bits,
                             int64_t at_base, int64_t capacity, int64_t* slot, int64_t* key, int64_t* tie,
                             int64_t* counters);
void tier_stage_cpu(const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                    const float* cache_state, const TierRecord& rec, float* stage, int64_t* stage_rows,
                    int64_t* keys_out);
void tier_store_cpu(const float* stage, const int64_t* stage_rows, const int64_t* order, int64_t n,
                    const TierRecord& rec, float* host_records);
void tier_place_cpu(const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p, int64_t tick,
                    int64_t pin_gen, uint8_t* made, const float* host_records, const TierRecord& rec, int dim,
                    float initial_state, const KeyInit& init, float* cache_values, float* cache_state);
void tier_resolve_cpu(const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot);

void tier_reset_cuda(const TierIndex& t, Stream stream);
void tier_lookup_cuda(const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n, int64_t tick,
                      int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                      int64_t* counters, Stream stream);
void tier_select_count_cuda(const TierIndex& t, const TierPolicy& pol, const TierDigit& d, int64_t* hist,
                            int64_t* counters, Stream stream);
void tier_select_collect_cuda(const TierIndex& t, const TierPolicy& pol, const TierThreshold& th, int pack_bits,
                              int64_t at_base, int64_t capacity, int64_t* slot, int64_t* key, int64_t* tie,
                              int64_t* counters, Stream stream);
void tier_stage_cuda(const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                     const float* cache_state, const TierRecord& rec, float* stage, int64_t* stage_rows,
                     int64_t* keys_out, Stream stream);
void tier_store_cuda(const float* stage, const int64_t* stage_rows, const int64_t* order, int64_t n,
                     const TierRecord& rec, float* host_records, Stream stream);
void tier_place_cuda(const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p, int64_t tick,
                     int64_t pin_gen, uint8_t* made, const float* host_records, const TierRecord& rec, int dim,
                     float initial_state, const KeyInit& init, float* cache_values, float* cache_state,
                     Stream stream);
void tier_resolve_cuda(const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot, Stream stream);

// The slot miss j takes under p, or -1.
SPARTA_HD int64_t tier_placed_slot(const TierPlacement& p, int64_t j) {
  if (j < p.n_free) return p.first_free + j;
  return j - p.n_free < p.n_victims ? p.victims[j - p.n_free] : -1;
}

// A slot's standing under pol: cached, pinned, evictable (cached, not used by the call, not pinned), and its prio
// and tie. A slot's last call is set (>= 1) exactly while it holds a row (free: -1), so the select's passes over the
// whole cache read its last call and pin, not its row.
SPARTA_HD bool tier_cached(const TierIndex& t, int64_t s) { return t.slot_last[s] >= 0; }
SPARTA_HD bool tier_pinned(const TierIndex& t, const TierPolicy& pol, int64_t s) {
  return tier_cached(t, s) && t.slot_pin[s] == pol.pin_gen;
}
SPARTA_HD bool tier_evictable(const TierIndex& t, const TierPolicy& pol, int64_t s) {
  const int64_t last = t.slot_last[s];
  return last >= 0 && last != pol.tick && t.slot_pin[s] != pol.pin_gen;
}
SPARTA_HD int64_t tier_prio(const TierIndex& t, const TierPolicy& pol, int64_t s) {
  return pol.lfu ? t.slot_uses[s] : t.slot_last[s];
}
SPARTA_HD int64_t tier_tie(const TierIndex& t, const TierPolicy& pol, int64_t s) {
  return pol.by_row ? t.slot_row[s] : int64_t(uint64_t(t.slot_key[s]) ^ (uint64_t(1) << 63));
}
// The digit of slot s's prio or tie under d, or -1 when d does not select the slot.
SPARTA_HD int tier_digit(const TierIndex& t, const TierPolicy& pol, const TierDigit& d, int64_t s) {
  const int64_t p = tier_prio(t, pol, s);
  if (d.tie && p != d.prio) return -1;
  const uint64_t v = d.tie ? uint64_t(tier_tie(t, pol, s)) : uint64_t(p);
  const int hi = d.shift + d.bits;
  if ((hi >= 64 ? 0 : v >> hi) != d.prefix) return -1;
  return int((v >> d.shift) & ((uint64_t(1) << d.bits) - 1));
}
// The key a select sorts slot s by (tier_select_collect).
SPARTA_HD int64_t tier_sort_key(const TierIndex& t, const TierPolicy& pol, int pack_bits, int64_t s) {
  const int64_t p = tier_prio(t, pol, s);
  return pack_bits > 0 ? int64_t((uint64_t(p) << pack_bits) | uint64_t(tier_tie(t, pol, s))) : p;
}
// Where slot s stands against th: -1 below, 0 at, 1 above.
SPARTA_HD int tier_side(const TierIndex& t, const TierPolicy& pol, const TierThreshold& th, int64_t s) {
  const int64_t p = tier_prio(t, pol, s);
  if (p != th.prio) return p < th.prio ? -1 : 1;
  if (th.tie_shift >= 64) return 0;
  const uint64_t v = uint64_t(tier_tie(t, pol, s)) >> th.tie_shift;
  return v < th.tie_prefix ? -1 : v == th.tie_prefix ? 0 : 1;
}

// The host row of key in a direct index of t, or -1 outside it.
SPARTA_HD int64_t tier_direct_row(const TierIndex& t, int64_t key) {
  if (key < t.direct_offset) return -1;
  const int64_t d = key - t.direct_offset;
  const int64_t r = t.direct_stride == 1 ? d : d / t.direct_stride;
  return r * t.direct_stride == d && r < t.capacity_rows ? r : -1;
}

}  // namespace sparta
