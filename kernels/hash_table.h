// hash_table.h: a fixed-capacity GPU hash table from 64-bit keys to row ids of an embedding store
// (values [capacity_rows, dim] live beside it, owned by the caller).
//
// Layout: open addressing over buckets of 8 slots of 16 bytes {uint64 key, int64 row} (one 128-byte line,
// loaded by a tile of 8 lanes, one 16-byte slot each); bucket = hash(key) & mask, then linear probing over
// buckets. Slot count = next power of two of capacity_rows / max_load_factor, rounded up to whole buckets.
// get_insert: the first empty slot along the probe is claimed with atomicCAS on the key; the winner takes a
// row from a counter (atomicAdd, aggregated over the warp), writes the row's initial values, fences, then
// publishes the row; losers (the same key elsewhere in the batch) wait for the row word. Rows are handed
// out densely, 0, 1, 2, ..., so export is a scatter by row and values[0:size) are exactly the live rows.
//
// Every 64-bit key is accepted. The empty marker (key ~0, i.e. int64 -1) cannot live in a slot; it has a
// slot of its own in HashTableMeta, with the same protocol.
//
// Full: a get_insert that needs a row beyond capacity_rows (or finds no free slot) does not store the key's
// row: its rows[i] is -1 and meta.refused counts it. HashTable::check_errors() (host, after the call) turns
// that into a sparta::Error naming the table, its capacity and the rows asked for. Nothing asserts on the
// device, nothing is overwritten. After a full error the table keeps the keys it held (refused keys stay
// refused); clear() empties it.
//
// Row ids depend on the order in which concurrent inserts win (they differ between runs and backends);
// keys and the values by key do not.
//
// A direct index instead (DirectIndex below): a table whose keys are bounded needs no slots. Key k is row
// (k - offset) / stride, for k >= offset with (k - offset) % stride == 0 and the row < capacity_rows (stride 1,
// offset 0: row = key; the shard of the keys with key % world == rank: stride world, offset rank; one owner's
// tables of a localized group: stride 1, offset their first key). Every row exists from the start (its owner
// writes all initial values up front: EmbeddingTable), so a lookup loads the row and nothing else. Keys outside the index: get_insert refuses them (row -1, meta.refused), find counts them
// in meta.missing; check_errors names the index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "src/base/device.h"
#include "kernels/key_init.h"

namespace sparta {

constexpr uint64_t kEmptyKey = ~0ull;  // the slot marker; as int64 the key -1, served by HashTableMeta::marker
constexpr int kBucketSlots = 8;
constexpr int64_t kRowPending = -1;  // slot claimed, row not yet published (also: an empty slot's row)
constexpr int64_t kRowRefused = -2;  // slot claimed, no row: the table was full

struct alignas(16) HashSlot {
  uint64_t key;
  int64_t row;
};

// Counters and the marker key's slot, one 64-byte block on the device.
struct alignas(16) HashTableMeta {
  int64_t next_row;    // rows handed out so far, refused ones included (+ slotless: the "rows asked for")
  int64_t refused;     // keys refused a row (table full) since the last check
  int64_t missing;     // keys not found by find-mode lookups since the last check
  int64_t duplicates;  // keys that load() found already present since the last check
  HashSlot marker;     // the slot of key kEmptyKey: key word kEmptyKey when absent, 0 when present
  int64_t bad_key;     // one of the duplicate keys, for the message
  int64_t slotless;    // keys refused because no free slot was left (they asked for a row too)
};
static_assert(sizeof(HashTableMeta) == 64, "HashTableMeta is one 64-byte block");

// The keys of a direct index: k = offset + row * stride for row in [0, capacity_rows).
struct DirectIndex {
  int64_t stride = 1;
  int64_t offset = 0;
};

// What kernels need of a table: trivially copyable, passed by value (see hash_table_ref.cuh).
struct HashTableView {
  HashSlot* slots = nullptr;  // [num_buckets * kBucketSlots]; null for a direct index
  HashTableMeta* meta = nullptr;
  uint64_t bucket_mask = 0;   // num_buckets - 1
  int64_t capacity_rows = 0;
  int64_t direct_stride = 0;  // > 0: a direct index (DirectIndex::stride), no slots
  int64_t direct_offset = 0;
};

// The row of key in a direct index, or -1 when the index does not hold it.
SPARTA_HD int64_t direct_row(const HashTableView& t, uint64_t key) {
  const int64_t k = static_cast<int64_t>(key);
  if (k < t.direct_offset) return -1;
  const int64_t d = k - t.direct_offset;
  const int64_t r = t.direct_stride == 1 ? d : d / t.direct_stride;
  return r * t.direct_stride == d && r < t.capacity_rows ? r : -1;
}

// What get_insert writes into a new row: its initial values by key. values == nullptr: nothing.
struct RowInit {
  float* values = nullptr;  // [capacity_rows, dim]
  int dim = 0;
  KeyInit key_init;
};

// ---- operations on a view (backend-dispatching launchers) ----
// Each runs on `stream` (cuda; the cpu backend ignores it and runs at once) and is asynchronous: none
// synchronizes the host; errors are counted in the table's meta, which HashTable::check_errors reads.

// rows[i] = row of keys[i], inserting missing keys with a fresh row (initialized per `init`).
// Refused keys (table full) get -1 and count in meta.refused. keys, rows: [n].
void hash_get_insert(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                     const RowInit& init, Stream stream);
// rows[i] = row of keys[i] or -1 (rows may be null); found[i] = 1 or 0 (found may be null). Counts misses
// in meta.missing.
void hash_find(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
               uint8_t* found, Stream stream);
// Inserts keys[i] with row first_row + i. Keys already present are left alone and counted in meta.duplicates.
// The caller sets meta.next_row afterwards (HashTable::load does).
void hash_load(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row,
               Stream stream);
// keys_by_row[r] = the key of row r, for every published row r (r < capacity_rows).
void hash_export(const Device& dev, const HashTableView& t, int64_t num_slots, int64_t* keys_by_row, Stream stream);

void hash_get_insert_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init);
void hash_find_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found);
void hash_load_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row);
void hash_export_cpu(const HashTableView& t, int64_t num_slots, int64_t* keys_by_row);

void hash_get_insert_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init,
                          Stream stream);
void hash_find_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows, uint8_t* found,
                    Stream stream);
void hash_load_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t first_row, Stream stream);
void hash_export_cuda(const HashTableView& t, int64_t num_slots, int64_t* keys_by_row, Stream stream);

// get_insert that also copies every key's values out (HierarchicalKV's find_or_insert): out[i] =
// values[rows[i]] of init.values (new rows: their initial values), zeros for refused keys. out: [n, init.dim];
// init.values must be set. Asynchronous on stream, as hash_get_insert.
void hash_get_insert_copy(const Device& dev, const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                          const RowInit& init, float* out, Stream stream);
void hash_get_insert_copy_cpu(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                              const RowInit& init, float* out);
void hash_get_insert_copy_cuda(const HashTableView& t, const int64_t* keys, int64_t n, int64_t* rows,
                               const RowInit& init, float* out, Stream stream);

// Bucket of a key: a 64-bit finalizer so that sequential keys spread.
SPARTA_HD uint64_t hash_key(uint64_t key) {
  key ^= key >> 33;
  key *= 0xFF51AFD7ED558CCDull;
  key ^= key >> 33;
  key *= 0xC4CEB9FE1A85EC53ull;
  return key ^ (key >> 33);
}

// ---- the owning table ----

// Every operation takes the stream it runs on (the cpu backend ignores it). Operations on different streams
// are not ordered by the table: the caller orders them (events, or a synchronization), as for any CUDA work.
// Which operations synchronize the host is said at each; the others are asynchronous and report their errors
// through check_errors.
class HashTable {
 public:
  // max_load_factor in (0, 1]; capacity_rows >= 1. Throws sparta::Error naming the table otherwise, before
  // allocating. The empty table is written on dev.stream, which is then synchronized: the table is ready for
  // work on any stream when the constructor returns.
  HashTable(const Device& dev, std::string name, int64_t capacity_rows, double max_load_factor = 0.5);
  // A direct index of capacity_rows rows (no slots). Throws sparta::Error naming the table when stride < 1, offset
  // < 0 or the largest key overflows int64.
  HashTable(const Device& dev, std::string name, int64_t capacity_rows, DirectIndex direct);

  // Slots for a table of capacity_rows at max_load_factor, and the bytes the table itself takes (a direct index:
  // its counters only).
  static int64_t slot_count(int64_t capacity_rows, double max_load_factor);
  static size_t memory_bytes(int64_t capacity_rows, double max_load_factor, bool direct = false);

  const std::string& name() const { return name_; }
  const Device& device() const { return dev_; }
  int64_t capacity_rows() const { return capacity_rows_; }
  double max_load_factor() const { return max_load_factor_; }
  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }  // 0 for a direct index
  bool is_direct() const { return direct_.stride > 0; }
  DirectIndex direct_index() const { return direct_; }
  HashTableView view();

  // Device pointers; [n] each. Asynchronous: a full table (get_insert: refused keys get row -1) and missing
  // keys (find, contains) are counted, and check_errors reports them.
  void get_insert(const int64_t* keys, int64_t n, int64_t* rows, const RowInit& init, Stream stream);
  void find(const int64_t* keys, int64_t n, int64_t* rows, Stream stream);       // -1: absent
  void contains(const int64_t* keys, int64_t n, uint8_t* found, Stream stream);  // 1/0
  // Appends keys with rows size(), size()+1, ...; returns the first row. Keys must be absent. Synchronizes
  // stream and checks: throws sparta::Error (changing nothing) when a key is present or the rows do not fit.
  // A direct index holds every row already: sparta::Error (its rows are written by key: find, then by row).
  int64_t load(const int64_t* keys, int64_t n, Stream stream);
  // Live rows: min(rows asked for, capacity); a direct index: capacity. Synchronizes stream.
  int64_t size(Stream stream);
  // keys_by_row[r] for r in [0, size()): keys_by_row is replaced by a buffer of size() keys (the old one is
  // freed after stream was synchronized); returns size(). Synchronizes stream to read the size; the export
  // itself is then asynchronous on stream.
  int64_t export_keys(Buffer<int64_t>& keys_by_row, Stream stream);
  // Empties the table. Asynchronous.
  void clear(Stream stream);

  // Reads and resets the error counters (synchronizes stream); throws sparta::Error when keys were refused
  // (full), when missing_is_error and keys were missing, or when load found present keys.
  void check_errors(bool missing_is_error, Stream stream);
  HashTableMeta read_meta(Stream stream);  // synchronizes stream

 private:
  Device dev_;
  std::string name_;
  int64_t capacity_rows_;
  double max_load_factor_;
  DirectIndex direct_{0, 0};  // stride 0: hashed
  Buffer<HashSlot> slots_;
  Buffer<HashTableMeta> meta_;
};

}  // namespace sparta
