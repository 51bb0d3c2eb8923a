// tier_index.cpp: CPU reference of tier_index.h, and the backend dispatch.
#include "kernels/tier_index.h"

#include <algorithm>
#include <cstring>

#include "kernels/row_storage.h"
#include "src/base/check.h"

namespace sparta {

void tier_reset_cpu(const TierIndex& t) {
  std::fill_n(t.slot_of_row, t.capacity_rows, int32_t(-1));
  std::fill_n(t.slot_key, t.cache_rows, int64_t(0));
  std::fill_n(t.slot_row, t.cache_rows, int64_t(-1));
  std::fill_n(t.slot_last, t.cache_rows, int64_t(-1));
  std::fill_n(t.slot_uses, t.cache_rows, int64_t(0));
  std::fill_n(t.slot_pin, t.cache_rows, int64_t(0));
}

void tier_lookup_cpu(const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n, int64_t tick,
                     int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                     int64_t* counters) {
  std::fill_n(counters, int(kTierCounters), int64_t(0));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i];
    const int64_t r = rows_in ? rows_in[i] : tier_direct_row(t, key);
    row[i] = r;
    if (r < 0) {
      slot[i] = -1;
      if (list_absent) {
        const int64_t a = counters[kTierAbsent]++;
        misses[2 * (n - 1 - a)] = key;
        misses[2 * (n - 1 - a) + 1] = -1;
      }
      continue;
    }
    const int32_t s = t.slot_of_row[r];
    if (s >= 0) {  // a hit
      slot[i] = s;
      if (t.slot_last[s] != tick) {
        t.slot_last[s] = tick;
        ++t.slot_uses[s];
        ++counters[kTierHits];
      }
      if (pin_gen > 0) t.slot_pin[s] = pin_gen;
      continue;
    }
    slot[i] = -2;
    if (s == -1) {  // the first use of this missing row in the call
      t.slot_of_row[r] = -2;
      const int64_t m = counters[kTierMisses]++;
      misses[2 * m] = key;
      misses[2 * m + 1] = r;
    }
  }
}

void tier_select_count_cpu(const TierIndex& t, const TierPolicy& pol, const TierDigit& d, int64_t* hist,
                           int64_t* counters) {
  std::fill_n(hist, kTierBins, int64_t(0));
  counters[kTierEvictable] = counters[kTierPinned] = 0;
  for (int64_t s = 0; s < t.cache_rows; ++s) {
    const bool evictable = tier_evictable(t, pol, s);
    const int digit = evictable ? tier_digit(t, pol, d, s) : -1;
    if (digit >= 0) ++hist[digit];
    counters[kTierEvictable] += evictable ? 1 : 0;
    counters[kTierPinned] += tier_pinned(t, pol, s) ? 1 : 0;
  }
}

void tier_select_collect_cpu(const TierIndex& t, const TierPolicy& pol, const TierThreshold& th, int pack_bits,
                             int64_t at_base, int64_t capacity, int64_t* slot, int64_t* key, int64_t* tie,
                             int64_t* counters) {
  int64_t& nb = counters[kTierBelow];
  int64_t& na = counters[kTierAt];
  nb = na = 0;
  for (int64_t s = 0; s < t.cache_rows; ++s) {
    if (!tier_evictable(t, pol, s)) continue;
    const int side = tier_side(t, pol, th, s);
    if (side > 0) continue;
    const int64_t i = side < 0 ? nb++ : at_base + na++;
    if (i >= capacity) continue;
    slot[i] = s;
    key[i] = tier_sort_key(t, pol, pack_bits, s);
    tie[i] = tier_tie(t, pol, s);
  }
}

void tier_stage_cpu(const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                    const float* cache_state, const TierRecord& rec, float* stage, int64_t* stage_rows,
                    int64_t* keys_out) {
  const int rf = rec.rf, sw = rec.state_width;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t s = slots[j], r = t.slot_row[s];
    float* to = stage + j * rec.floats;
    std::memcpy(to, cache_values + s * rf, size_t(rf) * sizeof(float));
    if (sw > 0) std::memcpy(to + rf, cache_state + s * sw, size_t(sw) * sizeof(float));
    std::fill(to + rf + sw, to + rec.uses_at(), 0.f);
    std::memcpy(to + rec.uses_at(), &t.slot_uses[s], sizeof(int64_t));
    stage_rows[j] = r;
    keys_out[j] = t.slot_key[s];
    t.slot_of_row[r] = -1;
    t.slot_row[s] = -1;
    t.slot_last[s] = -1;
    t.slot_pin[s] = 0;
  }
}

void tier_store_cpu(const float* stage, const int64_t* stage_rows, const int64_t* order, int64_t n,
                    const TierRecord& rec, float* host_records) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = order[i], r = stage_rows[j];
    std::memcpy(host_records + r * rec.floats, stage + j * rec.floats, size_t(rec.floats) * sizeof(float));
  }
}

void tier_place_cpu(const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p, int64_t tick,
                    int64_t pin_gen, uint8_t* row_made, const float* host_records, const TierRecord& rec, int dim,
                    float initial_state, const KeyInit& init, float* cache_values, float* cache_state) {
  const int rf = rec.rf, sw = rec.state_width;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t key = misses[2 * j], r = misses[2 * j + 1];
    const int64_t s = tier_placed_slot(p, j);
    if (s < 0) {
      t.slot_of_row[r] = -1;
      continue;
    }
    const bool made = row_made[r] != 0;
    const float* from = host_records + r * rec.floats;
    int64_t uses = 0;
    if (made) std::memcpy(&uses, from + rec.uses_at(), sizeof(int64_t));
    t.slot_of_row[r] = int32_t(s);
    t.slot_key[s] = key;
    t.slot_row[s] = r;
    t.slot_last[s] = tick;
    t.slot_uses[s] = uses + 1;
    t.slot_pin[s] = pin_gen > 0 ? pin_gen : 0;
    if (made) {
      std::memcpy(cache_values + s * rf, from, size_t(rf) * sizeof(float));
      if (sw > 0) std::memcpy(cache_state + s * sw, from + rf, size_t(sw) * sizeof(float));
    } else {
      for (int e = 0; e < dim; ++e)
        rowstore::store_nearest(cache_values + s * rf, init.storage, e, initial_value(init, uint64_t(key), uint32_t(e)));
      std::fill_n(cache_state + s * sw, sw, initial_state);
      row_made[r] = 1;
    }
  }
}

void tier_resolve_cpu(const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot) {
  for (int64_t i = 0; i < n; ++i)
    if (slot[i] == -2) slot[i] = t.slot_of_row[row[i]];
}

// ---- dispatch

#if SPARTA_CUDA
#define TIER_DISPATCH(cpu_call, cuda_call) \
  if (!dev.is_cuda()) return cpu_call;     \
  return cuda_call
#else
#define TIER_DISPATCH(cpu_call, cuda_call)                                              \
  (void)stream;                                                                         \
  if (!dev.is_cuda()) return cpu_call;                                                  \
  SPARTA_FATAL("host tier index on %s in a CUDA=0 build", dev.name().c_str())
#endif

void tier_reset(const Device& dev, const TierIndex& t, Stream stream) {
  TIER_DISPATCH(tier_reset_cpu(t), tier_reset_cuda(t, stream));
}

void tier_lookup(const Device& dev, const TierIndex& t, const int64_t* keys, const int64_t* rows_in, int64_t n,
                 int64_t tick, int64_t pin_gen, bool list_absent, int64_t* row, int64_t* slot, int64_t* misses,
                 int64_t* counters, Stream stream) {
  TIER_DISPATCH(
      tier_lookup_cpu(t, keys, rows_in, n, tick, pin_gen, list_absent, row, slot, misses, counters),
      tier_lookup_cuda(t, keys, rows_in, n, tick, pin_gen, list_absent, row, slot, misses, counters,
                       stream));
}

void tier_select_count(const Device& dev, const TierIndex& t, const TierPolicy& pol, const TierDigit& d,
                       int64_t* hist, int64_t* counters, Stream stream) {
  TIER_DISPATCH(tier_select_count_cpu(t, pol, d, hist, counters),
                tier_select_count_cuda(t, pol, d, hist, counters, stream));
}

void tier_select_collect(const Device& dev, const TierIndex& t, const TierPolicy& pol, const TierThreshold& th,
                         int pack_bits, int64_t at_base, int64_t capacity, int64_t* slot, int64_t* key, int64_t* tie,
                         int64_t* counters, Stream stream) {
  TIER_DISPATCH(tier_select_collect_cpu(t, pol, th, pack_bits, at_base, capacity, slot, key, tie, counters),
                tier_select_collect_cuda(t, pol, th, pack_bits, at_base, capacity, slot, key, tie, counters,
                                         stream));
}

void tier_stage(const Device& dev, const TierIndex& t, const int64_t* slots, int64_t n, const float* cache_values,
                const float* cache_state, const TierRecord& rec, float* stage, int64_t* stage_rows,
                int64_t* keys_out, Stream stream) {
  TIER_DISPATCH(tier_stage_cpu(t, slots, n, cache_values, cache_state, rec, stage, stage_rows, keys_out),
                tier_stage_cuda(t, slots, n, cache_values, cache_state, rec, stage, stage_rows, keys_out, stream));
}

void tier_store(const Device& dev, const float* stage, const int64_t* stage_rows, const int64_t* order, int64_t n,
                const TierRecord& rec, float* host_records, Stream stream) {
  TIER_DISPATCH(tier_store_cpu(stage, stage_rows, order, n, rec, host_records),
                tier_store_cuda(stage, stage_rows, order, n, rec, host_records, stream));
}

void tier_place(const Device& dev, const TierIndex& t, const int64_t* misses, int64_t m, const TierPlacement& p,
                int64_t tick, int64_t pin_gen, uint8_t* made, const float* host_records, const TierRecord& rec,
                int dim, float initial_state, const KeyInit& init, float* cache_values, float* cache_state,
                Stream stream) {
  TIER_DISPATCH(tier_place_cpu(t, misses, m, p, tick, pin_gen, made, host_records, rec, dim, initial_state, init,
                               cache_values, cache_state),
                tier_place_cuda(t, misses, m, p, tick, pin_gen, made, host_records, rec, dim, initial_state, init,
                                cache_values, cache_state, stream));
}

void tier_resolve(const Device& dev, const TierIndex& t, const int64_t* row, int64_t n, int64_t* slot,
                  Stream stream) {
  TIER_DISPATCH(tier_resolve_cpu(t, row, n, slot), tier_resolve_cuda(t, row, n, slot, stream));
}

}  // namespace sparta
