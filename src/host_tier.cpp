// host_tier.cpp: see host_tier.h.
#include "src/host_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/route.h"
#include "kernels/row_storage.h"
#include "src/base/check.h"
#include "src/base/deadline.h"

namespace sparta {

namespace {
constexpr double kIndexLoadFactor = 0.5;  // a hashed table's device index of its keys
}  // namespace

const char* tier_name(TableTier t) {
  switch (t) {
    case TableTier::host: return "host";
    case TableTier::automatic: return "auto";
    default: return "hbm";
  }
}

const char* eviction_name(Eviction e) {
  switch (e) {
    case Eviction::lru: return "lru";
    case Eviction::lfu: return "lfu";
    default: return "error";
  }
}

TableTier parse_tier(const std::string& s, const std::string& what) {
  if (s == "hbm") return TableTier::hbm;
  if (s == "host") return TableTier::host;
  if (s == "auto") return TableTier::automatic;
  throw Error(strprintf("%s: '%s' is not a tier (hbm, host or auto)", what.c_str(), s.c_str()));
}

Eviction parse_eviction(const std::string& s, const std::string& what) {
  if (s == "error") return Eviction::error;
  if (s == "lru") return Eviction::lru;
  if (s == "lfu") return Eviction::lfu;
  throw Error(strprintf("%s: '%s' is not an eviction policy (error, lru or lfu)", what.c_str(), s.c_str()));
}

TierConfig make_tier(TableTier tier, int64_t cache_rows, double cache_mb, Eviction eviction, int row_floats,
                     int state_width) {
  TierConfig t;
  t.tier = tier;
  t.eviction = eviction;
  if (tier == TableTier::hbm) return t;
  if (tier == TableTier::automatic && cache_rows == 0 && cache_mb == 0) return t;  // the planner sizes the cache
  const double row_bytes = double(row_floats + state_width) * sizeof(float);
  t.cache_rows = cache_rows > 0 ? cache_rows : std::max<int64_t>(1, int64_t(cache_mb * 1048576.0 / row_bytes));
  return t;
}

size_t HostTier::record_bytes(int row_floats, int state_width) {
  return size_t(tier_record(row_floats, state_width).floats) * sizeof(float);
}

size_t HostTier::host_bytes(int64_t capacity_rows, int row_floats, int state_width) {
  return size_t(capacity_rows) * record_bytes(row_floats, state_width);
}

size_t HostTier::device_bytes(int64_t capacity_rows, int64_t cache_rows, bool hashed) {
  // per host row its slot and its made flag; per slot its bookkeeping
  size_t b = size_t(capacity_rows) * (sizeof(int32_t) + 1) + size_t(cache_rows) * kSlotWords * sizeof(int64_t);
  if (hashed) b += HashTable::memory_bytes(capacity_rows, kIndexLoadFactor);
  return b;
}

size_t HostTier::staging_bytes(int64_t victims, int row_floats, int state_width) {
  // a row's record and its host row; the store's sort of the host rows (sorted and their order, and the sort's
  // space: an index and the alternate keys and values)
  return size_t(victims) * (record_bytes(row_floats, state_width) + 6 * sizeof(int64_t));
}

namespace {
const HostTierSetup& checked(const HostTierSetup& s) {
  const char* name = s.name.c_str();
  SPARTA_REQUIRE(s.capacity_rows >= 1 && s.cache_rows >= 1 && s.cache_rows <= s.capacity_rows,
                 "embedding table '%s': a host tier needs 1 <= cache_rows <= capacity_rows, found cache_rows %lld, "
                 "capacity_rows %lld",
                 name, (long long)s.cache_rows, (long long)s.capacity_rows);
  SPARTA_REQUIRE(s.eviction != Eviction::error,
                 "embedding table '%s': a host tier's cache evicts rows: its eviction must be lru or lfu, found "
                 "error",
                 name);
  const size_t need = HostTier::host_bytes(s.capacity_rows, row_storage_floats(s.storage, s.dim), s.state_width);
  const size_t avail = device_free_bytes(Device{});  // a cpu device: the host's MemAvailable
  SPARTA_REQUIRE(avail == 0 || need <= avail,
                 "embedding table '%s': its host tier needs %.3f GB of host memory (%lld rows of dim %d with %d "
                 "optimizer state floats, and their index) but the host has %.3f GB available (/proc/meminfo "
                 "MemAvailable): lower the table's capacity or use more ranks",
                 name, need / 1e9, (long long)s.capacity_rows, s.dim, s.state_width, avail / 1e9);
  return s;
}
}  // namespace

HostTier::HostTier(const Device& dev, const HostTierSetup& s)
    : dev_(dev),
      s_(checked(s)),
      segments_(dev, s_.key_segments),
      rf_(row_storage_floats(s.storage, s.dim)),
      rec_(tier_record(rf_, s.state_width)),
      records_(dev.backend, size_t(s.capacity_rows) * size_t(rec_.floats)),
      made_(dev, size_t(s.capacity_rows)),
      keys_(s.direct_stride > 0 ? nullptr : std::make_unique<HashTable>(dev, s.name, s.capacity_rows, kIndexLoadFactor)),
      slot_of_row_(dev, size_t(s.capacity_rows)),
      slot_key_dev_(dev, size_t(s.cache_rows)),
      slot_row_dev_(dev, size_t(s.cache_rows)),
      slot_last_(dev, size_t(s.cache_rows)),
      slot_uses_(dev, size_t(s.cache_rows)),
      slot_pin_(dev, size_t(s.cache_rows)),
      counters_host_(dev.backend, size_t(kTierCounters)),
      select_host_(dev.backend, kReportHead + size_t(kTierBins)),
      wb_(dev) {
  last_stream_ = dev_.stream;
  key_init_.seed = s_.seed;
  key_init_.table_id = s_.table_id;
  key_init_.scale = s_.init_scale;
  key_init_.tagged = s_.tagged_keys;
  key_init_.segments = s_.key_segments.data();
  key_init_.num_segments = int(s_.key_segments.size());
  key_init_.storage = s_.storage;
  key_init_dev_ = key_init_;
  key_init_dev_.segments = segments_.data();
  clear(dev_.stream);
}

TierIndex HostTier::index() {
  TierIndex t;
  t.slot_of_row = slot_of_row_.data();
  t.slot_key = slot_key_dev_.data();
  t.slot_row = slot_row_dev_.data();
  t.slot_last = slot_last_.data();
  t.slot_uses = slot_uses_.data();
  t.slot_pin = slot_pin_.data();
  t.capacity_rows = s_.capacity_rows;
  t.cache_rows = s_.cache_rows;
  t.direct_stride = s_.direct_stride;
  t.direct_offset = s_.direct_offset;
  return t;
}

void HostTier::clear(Stream stream) {
  if (keys_) keys_->clear(stream);
  tier_reset(dev_, index(), stream);
  wb_.join_into(stream);  // no write-back lands in the store after this
  synchronize(dev_, stream);
  memset_device(dev_, made_.data(), 0, made_.size(), stream);  // a record is read only once its row is made
  free_next_ = 0;
  evicted_ = 0;
  ++pin_gen_;
  refused_ = full_ = needed_ = pinned_at_error_ = 0;
}

int64_t HostTier::size(Stream stream) { return keys_ ? keys_->size(stream) : s_.capacity_rows; }

void HostTier::initial_row(int64_t key, float* values, float* state) const {
  for (int e = 0; e < s_.dim; ++e) {  // as the row is stored: rounded to nearest in 16 bits
    const float x = initial_value(key_init_, uint64_t(key), uint32_t(e));
    values[e] = s_.storage == RowStorage::fp32 ? x : rowstore::widen(s_.storage, rowstore::round_nearest(s_.storage, x));
  }
  std::fill_n(state, s_.state_width, s_.initial_state);
}

template <class T>
T* HostTier::grown(Buffer<T>& b, size_t n, Stream stream) {
  n = std::max<size_t>(n, 1);
  if (b.size() < n) {
    if (b.empty()) b = Buffer<T>(dev_, n);
    else b.resize(std::max(n, b.size() * 2), stream);
  }
  return b.data();
}

int64_t HostTier::choose_victims(int64_t wanted, int64_t* pinned, Stream stream) {
  TierPolicy pol;
  pol.tick = tick_;
  pol.pin_gen = pin_gen_;
  pol.lfu = s_.eviction == Eviction::lfu;
  pol.by_row = direct();
  const int prio_bits = route_key_bits(tick_ + 1), tie_bits = direct() ? route_key_bits(s_.capacity_rows) : 64;
  const int pack_bits = prio_bits + tie_bits <= 64 ? tie_bits : 0;
  int64_t* sel = grown(select_, kReportHead + kTierBins, stream);
  // 0. LRU: the victims are the slots of the oldest calls, and from call to call the threshold moves by about a
  // call. So one pass first lists every evictable slot last used by a call up to guess_prio_; when they are at
  // least `wanted` and few enough to sort, the victims are the first `wanted` of them in the policy's order, the
  // same the full select finds, without its histograms. The guess follows the threshold: up a call when the list
  // comes short of 1.5x what is wanted, down when it passes 3x. Else (and for LFU) the full select, which sets it.
  if (!pol.lfu && guess_prio_ >= 0) {
    // (within the lists' room the full select has: kSlotWords)
    const int64_t cap = std::min(4 * wanted + (int64_t(1) << 16), s_.cache_rows);
    int64_t* lists = grown(lists_, 3 * size_t(cap), stream);
    TierThreshold th;
    th.prio = guess_prio_ + 1;  // below it: prio <= guess_prio_; those at it go past the lists' capacity, unwritten
    tier_select_collect(dev_, index(), pol, th, pack_bits, cap, cap, lists, lists + cap, lists + 2 * cap, sel, stream);
    copy_to_host(dev_, select_host_.data(), sel, kReportHead * sizeof(int64_t), stream);  // synchronizes
    const int64_t listed = select_host_[kTierBelow];
    if (listed >= wanted && listed <= cap) {
      if (2 * listed < 3 * wanted) ++guess_prio_;
      else if (listed > 3 * wanted) --guess_prio_;
      *pinned = 0;  // every victim wanted was found: no key is refused, whose error reports the pinned slots
      return sort_victims(listed, wanted, prio_bits, tie_bits, pack_bits, lists, lists + cap, lists + 2 * cap, stream);
    }
  }
  guess_prio_ = -1;
  // 1. the threshold: a radix select, a digit a pass from the top, of the prio and then, while too many slots share
  // the threshold's prio to sort them at little cost, of the tie. The host reads each pass's histogram and keeps the
  // digit where the count reaches the victims still wanted.
  int64_t* hist = sel + kReportHead;
  const int64_t* h = select_host_.data() + kReportHead;
  TierDigit d;
  d.bits = std::min(prio_bits, kTierDigitBits);
  d.shift = prio_bits - d.bits;
  tier_select_count(dev_, index(), pol, d, hist, sel, stream);
  copy_to_host(dev_, select_host_.data(), sel, (kReportHead + kTierBins) * sizeof(int64_t), stream);  // synchronizes
  *pinned = select_host_[kTierPinned];
  TierThreshold th;
  th.prio = tick_ + 1;  // every evictable slot is below it: when there are too few
  int64_t n_below = select_host_[kTierEvictable], n_at = 0, need = 0;
  if (n_below > wanted) {
    n_below = 0;
    need = wanted;
    for (;;) {
      int digit = 0;
      for (; h[digit] < need; ++digit) {  // the bins below hold fewer than need: the threshold is further on
        need -= h[digit];
        n_below += h[digit];
      }
      d.prefix = (d.prefix << d.bits) | uint64_t(digit);
      n_at = h[digit];
      if (d.tie) {
        th.tie_shift = d.shift;
        th.tie_prefix = d.prefix;
      } else if (d.shift == 0) {
        th.prio = int64_t(d.prefix);
      }
      const bool few = n_at <= 2 * need + (int64_t(1) << 16);  // few enough to sort
      if ((d.shift == 0 || d.tie) && (few || (d.shift == 0 && d.tie))) break;
      if (d.shift == 0) {  // on to the tie of the slots of that prio
        d.tie = true;
        d.prio = th.prio;
        d.bits = std::min(tie_bits, kTierDigitBits);
        d.shift = tie_bits - d.bits;
        d.prefix = 0;
      } else {
        d.bits = std::min(d.shift, kTierDigitBits);
        d.shift -= d.bits;
      }
      tier_select_count(dev_, index(), pol, d, hist, sel, stream);
      copy_to_host(dev_, select_host_.data() + kReportHead, hist, kTierBins * sizeof(int64_t), stream);  // syncs
    }
  }
  mark(stream, "threshold found");
  // 2. the slots below the threshold, all victims, and those at it, of which the first `need` by tie are; sorted
  // by (prio, tie), one packed key where both fit 64 bits, they are the victims in the policy's order, into moves_
  const int64_t n = n_below + n_at, victims = n_below + need;
  if (n == 0) return 0;
  if (!pol.lfu && n_below + need == wanted) guess_prio_ = th.prio + 2;  // the next call's first look (step 0)
  int64_t* lists = grown(lists_, 3 * size_t(n), stream);
  int64_t *slot = lists, *key = lists + n, *tie = lists + 2 * n;
  tier_select_collect(dev_, index(), pol, th, pack_bits, n_below, n, slot, key, tie, sel, stream);
  return sort_victims(n, victims, prio_bits, tie_bits, pack_bits, slot, key, tie, stream);
}

int64_t HostTier::sort_victims(int64_t n, int64_t victims, int prio_bits, int tie_bits, int pack_bits,
                               const int64_t* slot, const int64_t* key, const int64_t* tie, Stream stream) {
  int64_t* work = grown(work_, 5 * size_t(n), stream);
  int64_t *sorted = work, *perm = work + n, *key_by_tie = work + 2 * n, *perm_key = work + 3 * n, *order = work + 4 * n;
  int64_t* out = grown(moves_, size_t(victims), stream);
  if (pack_bits > 0) {
    route_sort_keys(dev_, key, n, prio_bits + tie_bits, sorted, perm, scratch_, stream);
    route_gather_keys(dev_, slot, perm, victims, out, stream);
  } else {  // a stable sort by the tie, then a stable sort of that order by the prio
    route_sort_keys(dev_, tie, n, tie_bits, sorted, perm, scratch_, stream);
    route_gather_keys(dev_, key, perm, n, key_by_tie, stream);
    route_sort_keys(dev_, key_by_tie, n, prio_bits, sorted, perm_key, scratch_, stream);
    route_gather_keys(dev_, perm, perm_key, victims, order, stream);
    route_gather_keys(dev_, slot, order, victims, out, stream);
  }
  return victims;
}

void HostTier::write_back(int64_t n, const float* cache_values, const float* cache_state, Stream stream) {
  evicted_ = staged_ = n;
  if (n == 0) return;
  fault_point("host tier write-back");  // the kill tests' hook (src/base/deadline.h)
  const size_t nn = size_t(n);
  // (HostTier::staging_bytes)
  float* stage = grown(stage_, nn * size_t(rec_.floats), stream);
  int64_t* sr = grown(stage_rows_, nn, stream);
  int64_t* keys = grown(evicted_dev_, nn, stream);
  tier_stage(dev_, index(), moves_.data(), n, cache_values, cache_state, rec_, stage, sr, keys, stream);
  rows_out_ += n;
}

void HostTier::store_staged(Stream stream) {
  if (staged_ == 0) return;
  const size_t nn = size_t(staged_);
  int64_t* order = grown(store_order_, 2 * nn, stream);  // the staged rows sorted, and their order
  wb_.wait_for(stream);
  // written in ascending host rows: the link takes them at about twice the rate of the policy's order
  route_sort_keys(dev_, stage_rows_.data(), staged_, route_key_bits(s_.capacity_rows), order, order + nn,
                  wb_scratch_, wb_.stream());
  mark(wb_.stream(), "store begins");
  tier_store(dev_, stage_.data(), stage_rows_.data(), order + nn, staged_, rec_, records_.data(), wb_.stream());
  mark(wb_.stream(), "stored");
  staged_ = 0;
}

static_assert(int(kTierCounters) <= 8, "the counters fit the report's head");

const int64_t* HostTier::resident(const int64_t* keys, int64_t n, bool create, bool pin, float* cache_values,
                                  float* cache_state, Stream stream) {
  evicted_ = 0;
  last_stream_ = stream;
  ++tick_;
  const size_t nn = size_t(std::max<int64_t>(n, 1));
  int64_t* rows = grown(rows_dev_, nn, stream);
  int64_t* slots = grown(slots_dev_, nn, stream);
  // the report: the counters, then the (key, row) pairs of the misses from the front, of the keys without a row
  // from the back
  int64_t* report = grown(report_, kReportHead + 2 * nn, stream);
  int64_t* pairs = report + kReportHead;
  const int64_t* rows_in = nullptr;
  if (keys_) {  // hashed: the keys' host rows from the device hash table (train creates new keys' rows)
    int64_t* hr = grown(hash_rows_, nn, stream);
    if (n > 0) {
      if (create) keys_->get_insert(keys, n, hr, RowInit{}, stream);
      else keys_->find(keys, n, hr, stream);
    }
    rows_in = hr;
  }
  // 1. hits keep their slot and are stamped on the device; the distinct misses are listed, and only their count
  // comes to the host (one synchronization)
  mark(stream, "keys");
  tier_lookup(dev_, index(), keys, rows_in, n, tick_, pin ? pin_gen_ : 0, create, rows, slots, pairs, report, stream);
  mark(stream, "looked up");
  copy_to_host(dev_, counters_host_.data(), report, kTierCounters * sizeof(int64_t), stream);  // synchronizes
  const int64_t m = counters_host_[kTierMisses], hits = counters_host_[kTierHits];
  const int64_t absent_listed = counters_host_[kTierAbsent];

  // 2. the train keys refused a row (outside a direct index, or a full host store), listed per use: counted once
  int64_t absent = 0;
  if (absent_listed > 0) {
    std::vector<int64_t> a(2 * size_t(absent_listed));
    copy_to_host(dev_, a.data(), pairs + 2 * (n - absent_listed), a.size() * sizeof(int64_t), stream);
    std::vector<int64_t> k(static_cast<size_t>(absent_listed));
    for (size_t i = 0; i < k.size(); ++i) k[i] = a[2 * i];
    std::sort(k.begin(), k.end());
    absent = int64_t(std::unique(k.begin(), k.end()) - k.begin());
    (direct() ? refused_ : full_) += absent;
  }
  misses_ += m + absent;
  if (m == 0) return slots;

  // 3. slots for the misses: free ones, then the policy's victims (their rows written back). The last call's
  // write-back is in the store first (misses read it) and its staging area free.
  wb_.join_into(stream);
  mark(stream, "store joined");
  const int64_t free_slots = s_.cache_rows - free_next_;
  const int64_t wanted = m > free_slots ? m - free_slots : 0;
  int64_t pinned = 0;
  const int64_t victims = wanted > 0 ? choose_victims(wanted, &pinned, stream) : 0;
  const int64_t fit = std::min(m, free_slots + victims);
  if (fit < m) {  // the call needs more slots than the cache can give: the keys beyond are refused, by key
    std::vector<std::pair<int64_t, int64_t>> list(static_cast<size_t>(m));
    copy_to_host(dev_, list.data(), pairs, size_t(m) * 2 * sizeof(int64_t), stream);  // synchronizes
    std::sort(list.begin(), list.end());
    copy_to_device(dev_, pairs, list.data(), size_t(m) * 2 * sizeof(int64_t), stream);
    refused_ += m - fit;
    needed_ = std::max(needed_, hits + m + absent);
    pinned_at_error_ = pinned;
  }
  mark(stream, "victims chosen");
  write_back(victims, cache_values, cache_state, stream);
  mark(stream, "staged");

  // 4. the misses placed, their rows copied in (or made), then every key's slot
  TierPlacement p;
  p.first_free = free_next_;
  p.n_free = std::min(m, free_slots);
  p.victims = moves_.data();
  p.n_victims = fit - p.n_free;
  free_next_ += p.n_free;
  tier_place(dev_, index(), pairs, m, p, tick_, pin ? pin_gen_ : 0, made_.data(), records_.data(), rec_, s_.dim,
             s_.initial_state, key_init_dev_, cache_values, cache_state, stream);
  rows_in_ += fit;
  tier_resolve(dev_, index(), rows, n, slots, stream);
  mark(stream, "placed");
  // the victims' rows to the store, once the misses' reads over the link are queued before them
  store_staged(stream);
  return slots;
}

void HostTier::check() {
  const int64_t refused = refused_, full = full_, needed = needed_, pinned = pinned_at_error_;
  refused_ = full_ = needed_ = pinned_at_error_ = 0;
  if (full > 0)
    throw Error(strprintf("embedding table '%s' is full: its host tier holds %lld rows (capacity_rows) and %lld new "
                          "keys were refused",
                          s_.name.c_str(), (long long)s_.capacity_rows, (long long)full));
  if (refused > 0 && needed > 0)
    throw Error(strprintf("embedding table '%s': a batch needs %lld distinct keys resident in the GPU cache of "
                          "%lld rows (cache_rows), %lld of them pinned by a batch awaiting its update; %lld keys "
                          "were refused: raise the cache size or lower the batch",
                          s_.name.c_str(), (long long)needed, (long long)s_.cache_rows, (long long)pinned,
                          (long long)refused));
  if (refused > 0)
    throw Error(strprintf("embedding table '%s': %lld train keys lie outside its direct index (capacity %lld)",
                          s_.name.c_str(), (long long)refused, (long long)s_.capacity_rows));
}

std::vector<int64_t> HostTier::last_evicted() {
  std::vector<int64_t> k(static_cast<size_t>(evicted_));
  if (evicted_ > 0) copy_to_host(dev_, k.data(), evicted_dev_.data(), k.size() * sizeof(int64_t), last_stream_);
  return k;
}

std::vector<int64_t> HostTier::cached_keys() {
  const size_t c = size_t(s_.cache_rows);
  std::vector<int64_t> key(c), row(c), k;
  copy_to_host(dev_, key.data(), slot_key_dev_.data(), c * sizeof(int64_t), last_stream_);
  copy_to_host(dev_, row.data(), slot_row_dev_.data(), c * sizeof(int64_t), last_stream_);  // synchronizes
  for (size_t s = 0; s < c; ++s)
    if (row[s] >= 0) k.push_back(key[s]);
  std::sort(k.begin(), k.end());
  return k;
}

TableRows HostTier::export_rows(const float* cache_values, const float* cache_state, Stream stream) {
  const size_t c = size_t(s_.cache_rows), dim = size_t(s_.dim), rf = size_t(rf_), sw = size_t(s_.state_width);
  std::vector<float> cv(c * rf), cs(c * sw);
  wb_.join_into(stream);  // the store holds every write-back
  copy_to_host(dev_, cv.data(), cache_values, cv.size() * sizeof(float), stream);  // synchronizes
  if (sw > 0) copy_to_host(dev_, cs.data(), cache_state, cs.size() * sizeof(float), stream);
  TableRows r;
  r.dim = s_.dim;
  r.state_width = s_.state_width;
  const size_t n = size_t(size(stream));
  r.keys.resize(n);
  if (keys_ && n > 0) {
    Buffer<int64_t> k;
    keys_->export_keys(k, stream);
    copy_to_host(dev_, r.keys.data(), k.data(), n * sizeof(int64_t), stream);  // synchronizes
  }
  std::vector<int64_t> slot_row(c), slot_of(n, -1);
  std::vector<uint8_t> made(n);
  if (n > 0) copy_to_host(dev_, made.data(), made_.data(), n, stream);
  copy_to_host(dev_, slot_row.data(), slot_row_dev_.data(), c * sizeof(int64_t), stream);  // synchronizes
  for (size_t s = 0; s < c; ++s)
    if (slot_row[s] >= 0) slot_of[size_t(slot_row[s])] = int64_t(s);
  r.values.resize(n * dim);
  r.state.resize(n * sw);
  for (size_t i = 0; i < n; ++i) {
    if (!keys_) r.keys[i] = s_.direct_offset + int64_t(i) * s_.direct_stride;
    const float* v = records_.data() + i * size_t(rec_.floats);
    const float* st = v + rf;
    if (slot_of[i] >= 0) {
      v = cv.data() + size_t(slot_of[i]) * rf;
      st = cs.data() + size_t(slot_of[i]) * sw;
    } else if (!made[i]) {  // a row never used: its initial values
      initial_row(r.keys[i], r.values.data() + i * dim, r.state.data() + i * sw);
      continue;
    }
    for (size_t e = 0; e < dim; ++e) r.values[i * dim + e] = rowstore::load(v, s_.storage, int64_t(e));  // widened
    std::copy_n(st, sw, r.state.data() + i * sw);
  }
  return r;
}

void HostTier::flush(const float* cache_values, const float* cache_state, Stream stream) {
  const size_t c = size_t(s_.cache_rows);
  std::vector<int64_t> row(c), slots;
  copy_to_host(dev_, row.data(), slot_row_dev_.data(), c * sizeof(int64_t), stream);  // synchronizes
  for (size_t s = 0; s < c; ++s)
    if (row[s] >= 0) slots.push_back(int64_t(s));
  wb_.join_into(stream);  // the last write-back's staging area is free
  if (!slots.empty())
    copy_to_device(dev_, grown(moves_, slots.size(), stream), slots.data(), slots.size() * sizeof(int64_t), stream);
  write_back(int64_t(slots.size()), cache_values, cache_state, stream);
  store_staged(stream);
  wb_.join_into(stream);
  synchronize(dev_, stream);  // the store is written
  free_next_ = 0;
  evicted_ = 0;
}

void HostTier::load_rows(const TableRows& rows, const float* cache_values, const float* cache_state, Stream stream) {
  const size_t n = rows.rows(), dim = size_t(s_.dim), sw = size_t(s_.state_width);
  const char* name = s_.name.c_str();
  std::vector<int64_t> at(n);
  if (direct()) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t key = rows.keys[i], d = key - s_.direct_offset;
      const int64_t r = key >= s_.direct_offset ? d / s_.direct_stride : -1;
      SPARTA_REQUIRE(r >= 0 && r * s_.direct_stride == d && r < s_.capacity_rows,
                     "embedding table '%s': load of key %lld, outside its direct index (%lld rows, stride %lld, "
                     "offset %lld)",
                     name, (long long)key, (long long)s_.capacity_rows, (long long)s_.direct_stride,
                     (long long)s_.direct_offset);
      at[i] = r;
    }
  } else if (n > 0) {  // the device index checks the keys (absent, and they fit) before it changes
    Buffer<int64_t> k(dev_, n);
    copy_to_device(dev_, k.data(), rows.keys.data(), n * sizeof(int64_t), stream);
    const int64_t first = keys_->load(k.data(), int64_t(n), stream);  // synchronizes
    for (size_t i = 0; i < n; ++i) at[i] = first + int64_t(i);
  }
  flush(cache_values, cache_state, stream);
  std::vector<uint8_t> made(made_.size());
  copy_to_host(dev_, made.data(), made_.data(), made.size(), stream);  // synchronizes
  for (size_t i = 0; i < n; ++i) {
    const size_t r = size_t(at[i]);
    made[r] = 1;
    float* record = records_.data() + r * size_t(rec_.floats);
    for (size_t e = 0; e < dim; ++e)  // as stored: 16 bits rounded to nearest, as an HBM table loads them
      rowstore::store_nearest(record, s_.storage, int64_t(e), rows.values[i * dim + e]);
    std::copy_n(rows.state.data() + i * sw, sw, record + rf_);
    std::fill(record + rf_ + sw, record + rec_.uses_at(), 0.f);
    const int64_t uses = 0;
    std::memcpy(record + rec_.uses_at(), &uses, sizeof(uses));
  }
  copy_to_device(dev_, made_.data(), made.data(), made.size(), stream);
  synchronize(dev_, stream);
}

}  // namespace sparta
