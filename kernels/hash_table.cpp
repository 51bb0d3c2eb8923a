// hash_table.cpp: CPU reference of the hash-table operations (same layout, same probing, one key at a
// time), the backend dispatch, and the owning HashTable.
#include "kernels/hash_table.h"

#include <cmath>
#include <cstddef>

#include "src/base/check.h"

namespace sparta {

namespace {

enum class CpuState { found, inserted, absent, refused };

// Finds key, or (insert) claims the first empty slot of its probe. Returns the slot in *slot.
CpuState cpu_probe(const HashTableView& t, uint64_t key, bool insert, HashSlot** slot) {
  if (key == kEmptyKey) {
    *slot = &t.meta->marker;
    if (t.meta->marker.key == 0) return t.meta->marker.row >= 0 ? CpuState::found : CpuState::refused;
    if (!insert) return CpuState::absent;
    t.meta->marker.key = 0;
    return CpuState::inserted;
  }
  uint64_t b = hash_key(key) & t.bucket_mask;
  for (uint64_t n = 0; n <= t.bucket_mask; ++n, b = (b + 1) & t.bucket_mask) {
    HashSlot* bucket = t.slots + b * kBucketSlots;
    for (int l = 0; l < kBucketSlots; ++l) {
      if (bucket[l].key == key) {
        *slot = bucket + l;
        return bucket[l].row >= 0 ? CpuState::found : (insert ? CpuState::refused : CpuState::absent);
      }
      if (bucket[l].key == kEmptyKey) {
        if (!insert) return CpuState::absent;
        bucket[l].key = key;
        *slot = bucket + l;
        return CpuState::inserted;
      }
    }
  }
  return insert ? CpuState::refused : CpuState::absent;
}

}  // namespace

// A direct index: rows by arithmetic; keys outside it counted in *bad (refused or missing).
static void direct_rows_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found,
                            int64_t* bad) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = direct_row(t, static_cast<uint64_t>(keys[i]));
    if (row < 0) ++*bad;
    if (rows) rows[i] = row;
    if (found) found[i] = row >= 0;
  }
}

void hash_get_insert_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init) {
  if (t.direct_stride > 0) return direct_rows_cpu(t, keys, n, rows, nullptr, &t.meta->refused);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t key = static_cast<uint64_t>(keys[i]);
    HashSlot* slot = nullptr;
    CpuState s = cpu_probe(t, key, true, &slot);
    int64_t row = -1;
    if (s == CpuState::found) {
      row = slot->row;
    } else if (s == CpuState::inserted) {
      int64_t r = t.meta->next_row++;
      if (r < t.capacity_rows) {
        row = r;
        if (init.values) init_rows_by_key_cpu(&keys[i], &row, 1, init.values, init.dim, init.key_init);
      }
      slot->row = row >= 0 ? row : kRowRefused;
    } else if (s == CpuState::refused && slot == nullptr) {
      t.meta->slotless++;  // no free slot: it asked for a row all the same
    }
    if (row < 0) t.meta->refused++;
    rows[i] = row;
  }
}

void hash_find_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found) {
  if (t.direct_stride > 0) return direct_rows_cpu(t, keys, n, rows, found, &t.meta->missing);
  for (int64_t i = 0; i < n; ++i) {
    HashSlot* slot = nullptr;
    CpuState s = cpu_probe(t, static_cast<uint64_t>(keys[i]), false, &slot);
    int64_t row = s == CpuState::found ? slot->row : -1;
    if (row < 0) t.meta->missing++;
    if (rows) rows[i] = row;
    if (found) found[i] = row >= 0;
  }
}

void hash_load_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row) {
  SPARTA_REQUIRE(t.direct_stride == 0, "hash_load: a direct index holds every row already");
  for (int64_t i = 0; i < n; ++i) {
    HashSlot* slot = nullptr;
    CpuState s = cpu_probe(t, static_cast<uint64_t>(keys[i]), true, &slot);
    if (s == CpuState::inserted) {
      slot->row = first_row + i;
    } else if (s == CpuState::refused) {
      t.meta->refused++;
    } else {
      t.meta->duplicates++;
      t.meta->bad_key = keys[i];
    }
  }
}

void hash_export_cpu(const HashTableView& t, int64_t num_slots, int64_t* keys_by_row) {
  if (t.direct_stride > 0) {
    for (int64_t r = 0; r < t.capacity_rows; ++r) keys_by_row[r] = t.direct_offset + r * t.direct_stride;
    return;
  }
  for (int64_t i = 0; i <= num_slots; ++i) {
    const HashSlot& s = i < num_slots ? t.slots[i] : t.meta->marker;
    if (s.key != kEmptyKey && s.row >= 0 && s.row < t.capacity_rows)
      keys_by_row[s.row] = i < num_slots ? static_cast<int64_t>(s.key) : static_cast<int64_t>(kEmptyKey);
  }
}

void hash_get_insert_copy_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                              const RowInit& init, float* out) {
  hash_get_insert_cpu(t, keys, n, rows, init);
  for (int64_t i = 0; i < n; ++i)
    for (int e = 0; e < init.dim; ++e) out[i * init.dim + e] = rows[i] >= 0 ? init.values[rows[i] * init.dim + e] : 0.f;
}

// ---- dispatch ----

#if SPARTA_CUDA
#define SPARTA_DISPATCH(what, cpu_call, cuda_call) \
  if (!dev.is_cuda()) return cpu_call;             \
  cuda_call;
#else
#define SPARTA_DISPATCH(what, cpu_call, cuda_call) \
  (void)stream;                                    \
  if (!dev.is_cuda()) return cpu_call;             \
  SPARTA_FATAL("%s on %s in a CUDA=0 build", what, dev.name().c_str());
#endif

void hash_get_insert(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                     const RowInit& init, Stream stream) {
  SPARTA_DISPATCH("hash_get_insert", hash_get_insert_cpu(t, keys, n, rows, init),
                  hash_get_insert_cuda(t, keys, n, rows, init, stream));
}

void hash_get_insert_copy(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                          const RowInit& init, float* out, Stream stream) {
  SPARTA_REQUIRE(init.values != nullptr && out != nullptr, "hash_get_insert_copy: values and out must be set");
  SPARTA_REQUIRE(init.key_init.storage == RowStorage::fp32, "hash_get_insert_copy: copies fp32 rows only, the rows "
                 "are %s", row_storage_name(init.key_init.storage));
  SPARTA_DISPATCH("hash_get_insert_copy", hash_get_insert_copy_cpu(t, keys, n, rows, init, out),
                  hash_get_insert_copy_cuda(t, keys, n, rows, init, out, stream));
}

void hash_find(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
               uint8_t* found, Stream stream) {
  SPARTA_DISPATCH("hash_find", hash_find_cpu(t, keys, n, rows, found), hash_find_cuda(t, keys, n, rows, found, stream));
}

void hash_load(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row,
               Stream stream) {
  SPARTA_DISPATCH("hash_load", hash_load_cpu(t, keys, n, first_row), hash_load_cuda(t, keys, n, first_row, stream));
}

void hash_export(const Device& dev, const HashTableView& t, int64_t num_slots, int64_t* keys_by_row, Stream stream) {
  SPARTA_DISPATCH("hash_export", hash_export_cpu(t, num_slots, keys_by_row),
                  hash_export_cuda(t, num_slots, keys_by_row, stream));
}

#undef SPARTA_DISPATCH

// ---- HashTable ----

int64_t HashTable::slot_count(int64_t capacity_rows, double max_load_factor) {
  double want = std::ceil(double(capacity_rows) / max_load_factor);
  int64_t slots = kBucketSlots;
  while (double(slots) < want) slots *= 2;
  return slots;
}

size_t HashTable::memory_bytes(int64_t capacity_rows, double max_load_factor, bool direct) {
  if (direct) return sizeof(HashTableMeta);
  return size_t(slot_count(capacity_rows, max_load_factor)) * sizeof(HashSlot) + sizeof(HashTableMeta);
}

HashTable::HashTable(const Device& dev, std::string name, int64_t capacity_rows, double max_load_factor)
    : dev_(dev), name_(std::move(name)), capacity_rows_(capacity_rows), max_load_factor_(max_load_factor) {
  SPARTA_REQUIRE(capacity_rows >= 1, "hash table '%s': capacity_rows must be >= 1, found %lld", name_.c_str(),
                 (long long)capacity_rows);
  SPARTA_REQUIRE(max_load_factor > 0 && max_load_factor <= 1,
                 "hash table '%s': max_load_factor must be in (0, 1], found %g", name_.c_str(), max_load_factor);
  slots_ = Buffer<HashSlot>(dev_, size_t(slot_count(capacity_rows, max_load_factor)));
  meta_ = Buffer<HashTableMeta>(dev_, 1);
  clear(dev_.stream);
  synchronize(dev_);  // ready for any stream: work on another stream is not ordered after dev.stream
}

HashTable::HashTable(const Device& dev, std::string name, int64_t capacity_rows, DirectIndex direct)
    : dev_(dev), name_(std::move(name)), capacity_rows_(capacity_rows), max_load_factor_(1), direct_(direct) {
  SPARTA_REQUIRE(capacity_rows >= 1, "hash table '%s': capacity_rows must be >= 1, found %lld", name_.c_str(),
                 (long long)capacity_rows);
  SPARTA_REQUIRE(direct.stride >= 1 && direct.offset >= 0,
                 "hash table '%s': a direct index needs stride >= 1 and offset >= 0, found stride %lld, offset %lld",
                 name_.c_str(), (long long)direct.stride, (long long)direct.offset);
  SPARTA_REQUIRE(capacity_rows - 1 <= (INT64_MAX - direct.offset) / direct.stride,
                 "hash table '%s': a direct index of %lld rows with stride %lld passes the largest int64 key",
                 name_.c_str(), (long long)capacity_rows, (long long)direct.stride);
  meta_ = Buffer<HashTableMeta>(dev_, 1);
  clear(dev_.stream);
  synchronize(dev_);
}

HashTableView HashTable::view() {
  HashTableView v;
  v.slots = slots_.empty() ? nullptr : slots_.data();
  v.meta = meta_.data();
  v.bucket_mask = slots_.empty() ? 0 : uint64_t(slots_.size() / kBucketSlots) - 1;
  v.capacity_rows = capacity_rows_;
  v.direct_stride = direct_.stride;
  v.direct_offset = direct_.offset;
  return v;
}

void HashTable::clear(Stream stream) {
  // Device-side sets only, no host source: nothing must outlive the call, so nothing waits.
  static_assert(kEmptyKey == ~0ull && kRowPending == -1, "an empty slot is all ones");
  if (!slots_.empty()) memset_device(dev_, slots_.data(), 0xFF, slots_.bytes(), stream);
  memset_device(dev_, meta_.data(), 0, sizeof(HashTableMeta), stream);
  memset_device(dev_, reinterpret_cast<char*>(meta_.data()) + offsetof(HashTableMeta, marker), 0xFF, sizeof(HashSlot),
                stream);
}

HashTableMeta HashTable::read_meta(Stream stream) {
  HashTableMeta m;
  copy_to_host(dev_, &m, meta_.data(), sizeof(m), stream);
  return m;
}

int64_t HashTable::size(Stream stream) {
  if (is_direct()) return capacity_rows_;
  int64_t asked = read_meta(stream).next_row;
  return asked < capacity_rows_ ? asked : capacity_rows_;
}

void HashTable::check_errors(bool missing_is_error, Stream stream) {
  HashTableMeta m = read_meta(stream);
  if (m.refused == 0 && m.missing == 0 && m.duplicates == 0) return;
  // Reset the counters (bytes 8..32: refused, missing, duplicates) so the next check starts afresh. Queued on
  // stream, from no host memory: work queued after it counts anew.
  memset_device(dev_, reinterpret_cast<char*>(meta_.data()) + offsetof(HashTableMeta, refused), 0, 3 * sizeof(int64_t),
                stream);
  if (is_direct()) {
    const std::string keys = strprintf("keys %lld + row * %lld for row < %lld", (long long)direct_.offset,
                                       (long long)direct_.stride, (long long)capacity_rows_);
    SPARTA_REQUIRE(m.refused == 0, "table '%s' (a direct index of %s): %lld keys outside it", name_.c_str(),
                   keys.c_str(), (long long)m.refused);
    SPARTA_REQUIRE(!missing_is_error || m.missing == 0, "table '%s' (a direct index of %s): %lld keys not found",
                   name_.c_str(), keys.c_str(), (long long)m.missing);
    return;
  }
  SPARTA_REQUIRE(m.refused == 0,
                 "hash table '%s' is full: capacity %lld rows (max load factor %g, %lld slots), %lld rows asked for; "
                 "%lld keys got no row",
                 name_.c_str(), (long long)capacity_rows_, max_load_factor_, (long long)num_slots(),
                 (long long)(m.next_row + m.slotless), (long long)m.refused);
  SPARTA_REQUIRE(m.duplicates == 0, "hash table '%s': load of %lld keys given twice (key %lld among them); clear() the table",
                 name_.c_str(), (long long)m.duplicates, (long long)m.bad_key);
  SPARTA_REQUIRE(!missing_is_error || m.missing == 0, "hash table '%s': %lld keys not found", name_.c_str(),
                 (long long)m.missing);
}

void HashTable::get_insert(const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init, Stream stream) {
  hash_get_insert(dev_, view(), keys, n, rows, init, stream);
}

void HashTable::find(const int64_t* keys, int64_t n, int64_t* rows, Stream stream) {
  hash_find(dev_, view(), keys, n, rows, nullptr, stream);
}

void HashTable::contains(const int64_t* keys, int64_t n, uint8_t* found, Stream stream) {
  hash_find(dev_, view(), keys, n, nullptr, found, stream);
}

int64_t HashTable::load(const int64_t* keys, int64_t n, Stream stream) {
  SPARTA_REQUIRE(!is_direct(), "table '%s': a direct index holds every row already; write rows by key (find, then by row)",
                 name_.c_str());
  int64_t first = read_meta(stream).next_row;
  // Present keys are an error found before anything changes; duplicates inside `keys` are found during the
  // load and leave the table to be cleared (the message says so).
  if (n > 0) {
    Buffer<uint8_t> found(dev_, size_t(n));
    contains(keys, n, found.data(), stream);
    std::vector<uint8_t> f(static_cast<size_t>(n));
    copy_to_host(dev_, f.data(), found.data(), f.size(), stream);  // synchronizes: `found` may be freed
    for (int64_t i = 0; i < n; ++i) {
      if (!f[i]) continue;
      int64_t key = 0;
      copy_to_host(dev_, &key, keys + i, sizeof(key), stream);
      check_errors(false, stream);  // contains counted the absent keys as missing: reset
      throw Error(strprintf("hash table '%s': load of key %lld, which the table already holds", name_.c_str(),
                            (long long)key));
    }
    check_errors(false, stream);
  }
  SPARTA_REQUIRE(first + n <= capacity_rows_,
                 "hash table '%s' is full: capacity %lld rows, %lld rows asked for (%lld held, %lld loaded)",
                 name_.c_str(), (long long)capacity_rows_, (long long)(first + n), (long long)first, (long long)n);
  hash_load(dev_, view(), keys, n, first, stream);
  int64_t next = first + n;  // duplicates leave holes in the rows: they stay allocated, never exported
  copy_to_device(dev_, reinterpret_cast<char*>(meta_.data()) + offsetof(HashTableMeta, next_row), &next, sizeof(next),
                 stream);
  check_errors(false, stream);  // synchronizes stream: `next` may go out of scope
  return first;
}

int64_t HashTable::export_keys(Buffer<int64_t>& keys_by_row, Stream stream) {
  int64_t n = size(stream);  // synchronized stream: the old buffer's memory is not in use on it any more
  keys_by_row = Buffer<int64_t>(dev_, size_t(n));
  if (n > 0) hash_export(dev_, view(), num_slots(), keys_by_row.data(), stream);
  return n;
}

}  // namespace sparta
