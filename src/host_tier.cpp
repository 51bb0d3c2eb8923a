// host_tier.cpp: see host_tier.h.
#include "src/host_tier.h"

#include <algorithm>
#include <cstring>

#include "kernels/route.h"
#include "src/base/check.h"
#include "src/base/deadline.h"

namespace sparta {

const char* tier_name(TableTier t) { return t == TableTier::host ? "host" : "hbm"; }

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
  throw Error(strprintf("%s: '%s' is not a tier (hbm or host)", what.c_str(), s.c_str()));
}

Eviction parse_eviction(const std::string& s, const std::string& what) {
  if (s == "error") return Eviction::error;
  if (s == "lru") return Eviction::lru;
  if (s == "lfu") return Eviction::lfu;
  throw Error(strprintf("%s: '%s' is not an eviction policy (error, lru or lfu)", what.c_str(), s.c_str()));
}

TierConfig make_tier(TableTier tier, int64_t cache_rows, double cache_mb, Eviction eviction, int dim,
                     int state_width) {
  TierConfig t;
  t.tier = tier;
  t.eviction = eviction;
  if (tier == TableTier::hbm) return t;
  const double row_bytes = double(dim + state_width) * sizeof(float);
  t.cache_rows = cache_rows > 0 ? cache_rows : std::max<int64_t>(1, int64_t(cache_mb * 1048576.0 / row_bytes));
  return t;
}

size_t HostTier::host_bytes(int64_t capacity_rows, int dim, int state_width) {
  // values and state, a use count and a made flag per row, and a hashed table's index (key by row, and the
  // key → row map at about 40 bytes an entry)
  return size_t(capacity_rows) * (size_t(dim + state_width) * sizeof(float) + 9 + 48);
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
  const size_t need = HostTier::host_bytes(s.capacity_rows, s.dim, s.state_width);
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
      values_(dev.backend, size_t(s.capacity_rows) * s.dim),
      state_(dev.backend, size_t(s.capacity_rows) * s.state_width),
      uses_(size_t(s.capacity_rows), 0),
      made_(s.direct_stride > 0 ? size_t(s.capacity_rows) : 0, 0) {
  key_init_.seed = s_.seed;
  key_init_.table_id = s_.table_id;
  key_init_.scale = s_.init_scale;
  key_init_.tagged = s_.tagged_keys;
  key_init_.segments = s_.key_segments.data();
  key_init_.num_segments = int(s_.key_segments.size());
  clear();
}

void HostTier::clear() {
  const size_t c = size_t(s_.cache_rows);
  row_of_.clear();
  key_of_row_.clear();
  std::fill(made_.begin(), made_.end(), uint8_t(0));
  slot_of_.clear();
  slot_key_.assign(c, 0);
  slot_row_.assign(c, -1);
  slot_last_.assign(c, -1);
  pinned_.assign(c, 0);
  pinned_slots_.clear();
  free_.resize(c);
  for (size_t i = 0; i < c; ++i) free_[i] = int64_t(c - 1 - i);
  evictable_.clear();
  refused_ = full_ = needed_ = pinned_at_error_ = 0;
}

int64_t HostTier::size() const {
  return s_.direct_stride > 0 ? s_.capacity_rows : int64_t(key_of_row_.size());
}

void HostTier::init_row(int64_t key, int64_t hrow) {
  float* v = values_.data() + size_t(hrow) * s_.dim;
  for (int e = 0; e < s_.dim; ++e) v[e] = initial_value(key_init_, uint64_t(key), uint32_t(e));
  std::fill_n(state_.data() + size_t(hrow) * s_.state_width, s_.state_width, s_.initial_state);
  uses_[size_t(hrow)] = 0;
  if (!made_.empty()) made_[size_t(hrow)] = 1;
}

int64_t HostTier::host_row(int64_t key, bool create) {
  if (s_.direct_stride > 0) {  // every row of the index exists: made on first use
    const int64_t d = key - s_.direct_offset;
    const int64_t r = key >= s_.direct_offset ? d / s_.direct_stride : -1;
    if (r < 0 || r * s_.direct_stride != d || r >= s_.capacity_rows) {
      if (create) ++refused_;
      return -1;
    }
    if (!made_[size_t(r)]) init_row(key, r);
    return r;
  }
  auto it = row_of_.find(key);
  if (it != row_of_.end()) return it->second;
  if (!create) return -1;
  if (int64_t(key_of_row_.size()) >= s_.capacity_rows) {
    ++full_;
    return -1;
  }
  const int64_t r = int64_t(key_of_row_.size());
  row_of_.emplace(key, r);
  key_of_row_.push_back(key);
  init_row(key, r);
  return r;
}

HostTier::Rank HostTier::rank_of(int64_t slot) const {
  const int64_t prio = s_.eviction == Eviction::lfu ? uses_[size_t(slot_row_[size_t(slot)])] : slot_last_[size_t(slot)];
  return Rank(prio, slot_key_[size_t(slot)], slot);
}

template <class T>
T* HostTier::staging(Buffer<T>& b, size_t n) {
  if (b.size() < n) b = Buffer<T>(dev_, std::max(n, b.size() * 2));  // the stream is synchronized: free at once
  return b.data();
}

void HostTier::write_back(const std::vector<int64_t>& slots, const float* cache_values, const float* cache_state,
                          Stream stream) {
  const size_t n = slots.size();
  if (n == 0) return;
  fault_point("host tier write-back");  // the kill tests' hook (src/base/deadline.h)
  if (stage_values_.size() < n * s_.dim) stage_values_ = PinnedBuffer<float>(dev_.backend, n * s_.dim);
  if (stage_state_.size() < n * s_.state_width) stage_state_ = PinnedBuffer<float>(dev_.backend, n * s_.state_width);
  int64_t* idx = staging(idx_dev_, n);
  copy_to_device(dev_, idx, slots.data(), n * sizeof(int64_t), stream);
  float* v = staging(values_dev_, n * s_.dim);
  route_gather_rows(dev_, cache_values, idx, int64_t(n), s_.dim, v, stream);
  copy_to_host(dev_, stage_values_.data(), v, n * s_.dim * sizeof(float), stream);  // synchronizes
  if (s_.state_width > 0) {
    float* st = staging(state_dev_, n * s_.state_width);
    route_gather_rows(dev_, cache_state, idx, int64_t(n), s_.state_width, st, stream);
    copy_to_host(dev_, stage_state_.data(), st, n * s_.state_width * sizeof(float), stream);
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t r = size_t(slot_row_[size_t(slots[i])]);
    std::memcpy(values_.data() + r * s_.dim, stage_values_.data() + i * s_.dim, s_.dim * sizeof(float));
    std::memcpy(state_.data() + r * s_.state_width, stage_state_.data() + i * s_.state_width,
                s_.state_width * sizeof(float));
  }
  rows_out_ += int64_t(n);
}

const int64_t* HostTier::resident(const int64_t* keys, int64_t n, bool create, bool pin, float* cache_values,
                                  float* cache_state, Stream stream) {
  evicted_.clear();
  ++tick_;
  host_keys_.resize(size_t(n));
  if (n > 0) copy_to_host(dev_, host_keys_.data(), keys, size_t(n) * sizeof(int64_t), stream);  // synchronizes
  else synchronize(dev_, stream);
  host_slots_.assign(size_t(n), -1);

  // 1. hits keep their slot (taken out of the evictable set for the call); misses are listed, in first-use order
  std::unordered_map<int64_t, int64_t> seen;  // key → slot, or -2 - (its index in miss_keys)
  std::vector<int64_t> miss_keys, miss_rows, touched;
  int64_t distinct = 0;
  seen.reserve(size_t(n));
  auto touch = [&](int64_t slot) {
    slot_last_[size_t(slot)] = tick_;
    ++uses_[size_t(slot_row_[size_t(slot)])];
    touched.push_back(slot);
    if (pin && !pinned_[size_t(slot)]) {
      pinned_[size_t(slot)] = 1;
      pinned_slots_.push_back(slot);
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = host_keys_[size_t(i)];
    if (seen.count(key)) continue;
    ++distinct;
    auto it = slot_of_.find(key);
    if (it != slot_of_.end()) {
      const int64_t slot = it->second;
      if (!pinned_[size_t(slot)]) evictable_.erase(rank_of(slot));
      touch(slot);
      seen.emplace(key, slot);
      continue;
    }
    const int64_t hrow = host_row(key, create);
    if (hrow < 0) {
      seen.emplace(key, -1);
      continue;
    }
    seen.emplace(key, -2 - int64_t(miss_keys.size()));
    miss_keys.push_back(key);
    miss_rows.push_back(hrow);
  }

  // 2. slots for the misses: free ones, then the policy's victims (their rows written back first)
  const size_t m = miss_keys.size();
  const size_t victims_wanted = m > free_.size() ? m - free_.size() : 0;
  std::vector<int64_t> victims;
  for (auto it = evictable_.begin(); it != evictable_.end() && victims.size() < victims_wanted;)
    victims.push_back(std::get<2>(*it)), it = evictable_.erase(it);
  const size_t fit = free_.size() + victims.size() < m ? free_.size() + victims.size() : m;
  if (fit < m) {  // the call needs more slots than the cache can give: the keys beyond are refused
    refused_ += int64_t(m - fit);
    needed_ = std::max(needed_, distinct);
    pinned_at_error_ = int64_t(pinned_slots_.size());
  }
  write_back(victims, cache_values, cache_state, stream);
  for (int64_t v : victims) {
    evicted_.push_back(slot_key_[size_t(v)]);
    slot_of_.erase(slot_key_[size_t(v)]);
    slot_row_[size_t(v)] = -1;
    slot_last_[size_t(v)] = -1;
  }
  std::reverse(victims.begin(), victims.end());  // taken from the back: the first victim's slot goes first
  if (stage_values_.size() < fit * s_.dim) stage_values_ = PinnedBuffer<float>(dev_.backend, fit * s_.dim);
  if (stage_state_.size() < fit * s_.state_width)
    stage_state_ = PinnedBuffer<float>(dev_.backend, fit * s_.state_width);
  if (stage_idx_.size() < fit) stage_idx_ = PinnedBuffer<int64_t>(dev_.backend, fit);
  for (size_t j = 0; j < fit; ++j) {
    int64_t slot;
    if (!free_.empty()) slot = free_.back(), free_.pop_back();
    else slot = victims.back(), victims.pop_back();
    const int64_t key = miss_keys[j], hrow = miss_rows[j];
    slot_of_[key] = slot;
    slot_key_[size_t(slot)] = key;
    slot_row_[size_t(slot)] = hrow;
    touch(slot);
    seen[key] = slot;
    stage_idx_[j] = slot;
    std::memcpy(stage_values_.data() + j * s_.dim, values_.data() + size_t(hrow) * s_.dim, s_.dim * sizeof(float));
    std::memcpy(stage_state_.data() + j * s_.state_width, state_.data() + size_t(hrow) * s_.state_width,
                s_.state_width * sizeof(float));
  }
  for (size_t j = fit; j < m; ++j) seen[miss_keys[j]] = -1;
  if (fit > 0) {  // 3. the misses' rows into their slots
    int64_t* idx = staging(idx_dev_, fit);
    copy_to_device(dev_, idx, stage_idx_.data(), fit * sizeof(int64_t), stream);
    float* v = staging(values_dev_, fit * s_.dim);
    copy_to_device(dev_, v, stage_values_.data(), fit * s_.dim * sizeof(float), stream);
    route_scatter_rows(dev_, v, idx, int64_t(fit), s_.dim, cache_values, stream);
    if (s_.state_width > 0) {
      float* st = staging(state_dev_, fit * s_.state_width);
      copy_to_device(dev_, st, stage_state_.data(), fit * s_.state_width * sizeof(float), stream);
      route_scatter_rows(dev_, st, idx, int64_t(fit), s_.state_width, cache_state, stream);
    }
    rows_in_ += int64_t(fit);
  }
  for (int64_t slot : touched)
    if (!pinned_[size_t(slot)]) evictable_.insert(rank_of(slot));

  // 4. every key's slot
  for (int64_t i = 0; i < n; ++i) host_slots_[size_t(i)] = seen[host_keys_[size_t(i)]];
  int64_t* out = staging(slots_dev_, size_t(std::max<int64_t>(n, 1)));
  if (n > 0) copy_to_device(dev_, out, host_slots_.data(), size_t(n) * sizeof(int64_t), stream);
  synchronize(dev_, stream);  // the staging above is reused by the next call
  return out;
}

void HostTier::release_pins() {
  for (int64_t slot : pinned_slots_) {
    pinned_[size_t(slot)] = 0;
    evictable_.insert(rank_of(slot));
  }
  pinned_slots_.clear();
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

std::vector<int64_t> HostTier::cached_keys() const {
  std::vector<int64_t> k;
  for (const auto& e : slot_of_) k.push_back(e.first);
  std::sort(k.begin(), k.end());
  return k;
}

TableRows HostTier::export_rows(const float* cache_values, const float* cache_state, Stream stream) {
  const size_t c = size_t(s_.cache_rows), dim = size_t(s_.dim), sw = size_t(s_.state_width);
  std::vector<float> cv(c * dim), cs(c * sw);
  copy_to_host(dev_, cv.data(), cache_values, cv.size() * sizeof(float), stream);  // synchronizes
  if (sw > 0) copy_to_host(dev_, cs.data(), cache_state, cs.size() * sizeof(float), stream);
  TableRows r;
  r.dim = s_.dim;
  r.state_width = s_.state_width;
  const size_t n = size_t(size());
  r.keys.resize(n);
  r.values.resize(n * dim);
  r.state.resize(n * sw);
  for (size_t i = 0; i < n; ++i) {
    const int64_t key = s_.direct_stride > 0 ? s_.direct_offset + int64_t(i) * s_.direct_stride : key_of_row_[i];
    r.keys[i] = key;
    auto it = slot_of_.find(key);
    const float* v = values_.data() + i * dim;
    const float* st = state_.data() + i * sw;
    if (it != slot_of_.end()) {
      v = cv.data() + size_t(it->second) * dim;
      st = cs.data() + size_t(it->second) * sw;
    } else if (!made_.empty() && !made_[i]) {
      init_row(key, int64_t(i));  // a row never used: its initial values
    }
    std::copy_n(v, dim, r.values.data() + i * dim);
    std::copy_n(st, sw, r.state.data() + i * sw);
  }
  return r;
}

void HostTier::flush(const float* cache_values, const float* cache_state, Stream stream) {
  std::vector<int64_t> slots;
  for (const auto& e : slot_of_) slots.push_back(e.second);
  std::sort(slots.begin(), slots.end());
  write_back(slots, cache_values, cache_state, stream);
  slot_of_.clear();
  slot_row_.assign(slot_row_.size(), -1);
  slot_last_.assign(slot_last_.size(), -1);
  pinned_.assign(pinned_.size(), 0);
  pinned_slots_.clear();
  evictable_.clear();
  const size_t c = size_t(s_.cache_rows);
  free_.resize(c);
  for (size_t i = 0; i < c; ++i) free_[i] = int64_t(c - 1 - i);
}

void HostTier::load_rows(const TableRows& rows, const float* cache_values, const float* cache_state, Stream stream) {
  const size_t n = rows.rows(), dim = size_t(s_.dim), sw = size_t(s_.state_width);
  const char* name = s_.name.c_str();
  std::vector<int64_t> at(n);
  if (s_.direct_stride > 0) {
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
  } else {
    SPARTA_REQUIRE(key_of_row_.size() + n <= size_t(s_.capacity_rows),
                   "embedding table '%s': load of %zu rows into a host tier holding %zu of %lld rows", name, n,
                   key_of_row_.size(), (long long)s_.capacity_rows);
    std::unordered_map<int64_t, int64_t> fresh;
    for (size_t i = 0; i < n; ++i) {
      const int64_t key = rows.keys[i];
      SPARTA_REQUIRE(!row_of_.count(key) && fresh.emplace(key, 0).second,
                     "embedding table '%s': load of key %lld, which the table holds already", name, (long long)key);
      at[i] = int64_t(key_of_row_.size() + i);
    }
  }
  flush(cache_values, cache_state, stream);
  for (size_t i = 0; i < n; ++i) {
    const size_t r = size_t(at[i]);
    if (s_.direct_stride == 0) {
      row_of_.emplace(rows.keys[i], int64_t(r));
      key_of_row_.push_back(rows.keys[i]);
    } else {
      made_[r] = 1;
    }
    uses_[r] = 0;
    std::copy_n(rows.values.data() + i * dim, dim, values_.data() + r * dim);
    std::copy_n(rows.state.data() + i * sw, sw, state_.data() + r * sw);
  }
}

}  // namespace sparta
