// host_tier.h: a table's rows in host memory under a GPU cache of its hot rows (EmbeddingTableConfig::tier).
//
// Every row of a tiered table (values and optimizer state) lives in a host store (pinned host memory on cuda,
// plain host memory on cpu) of capacity_rows rows, allocated up front after a check against the host's available
// memory. The table's device part is a cache of cache_rows rows: a direct index whose keys are slot numbers
// (0 .. cache_rows - 1), on which the existing lookup, backward and optimizer kernels run unchanged. Before a
// lookup, HostTier::resident makes the call's distinct keys resident and turns each key into its slot:
//   - a key already cached keeps its slot;
//   - a missing key takes a free slot, else the policy's victim among the slots no pending batch uses: LRU the
//     slot used by the oldest call, LFU the one with the fewest uses over the row's life (a call counts once),
//     ties broken by the key (ascending), so the choice is deterministic; the victim's row and state are written
//     back to the host store first;
//   - then the missing rows are copied in: a key seen before from the host store, a new key (train) with its
//     initial values from (seed, table, key) (kernels/key_init.h) and the optimizer's initial state, as an HBM
//     table would give it.
// So the cache changes where a row lives, never what it holds or the order of its updates: the values and state
// are those of an all-HBM table bit for bit, for any cache size (tests/test_host_tier.cpp). The store holds a row as
// one record of whole 64-byte lines (its values, state and use count: kernels/tier_index.h TierRecord), so that a
// victim's write-back over the link is whole lines.
//
// A train lookup pins its slots until the table's next update (backward_and_update, finish_update), so that a
// later lookup before that update (an evaluation, a replicated table's insert of other ranks' keys) cannot
// evict a row whose gradient is still to come. A call that needs more slots than are free or evictable gets
// row -1 for the keys that do not fit (skipped, as a full table's refused keys are), and check() reports it:
// the table, its cache size, the rows the call needed and those pinned. A hashed table whose host store is full
// refuses new keys the same way (the "table full" error, with the host store's capacity).
//
// Hits stay on the device (kernels/tier_index.h): a device array maps each host row to its slot (a direct index
// computes the row from the key; a hashed table finds it in a device hash table of its keys, kernels/hash_table.h,
// whose dense rows are the host store's), and a kernel stamps the hits (LRU: the call; LFU: one use per call; the
// pin) and lists the call's distinct missing rows. Only their count comes to the host: the host decides how many
// take free slots (lowest first) and which slots are the policy's victims, found on the device by a radix select of
// the slots' priorities (a histogram a digit, read by the host; then only the victims are listed and sorted), and
// kernels place the misses, moving rows from the page-locked host store directly (a row's use count lives in the
// store too, its made flag on the device: read for every miss, it must not cross the link). A victim's row goes to
// a device staging area at once, and from there to the store (in ascending host rows, which the link takes at about
// twice the rate of rows spread in the policy's order) on a stream of the tier's own, so that the link's writes
// overlap the work that follows; the next call that reads the store, an export or a load waits for it first.
// Which slot a row takes changes no value, so the misses keep the device's order (a call that refuses some sorts
// them by key first, so that the keys refused are the largest). So a call costs one synchronization when its keys
// all hit, and otherwise a few more (one a digit of the threshold), with host work that grows with neither its
// misses nor its victims. A cache of every row holds the whole table: EmbeddingTable then makes an HBM table, with
// no tier. Rows move as they are stored: row_storage_floats floats of values (dim for fp32 rows; dim / 2 for 16-bit
// ones, their bits in pairs, half the bytes over the link) and state_width floats of state; export widens 16-bit
// values and load rounds them to nearest, as an HBM table of that storage does.
//
// Why page-locked host memory moved by kernels rather than CUDA managed memory: managed memory larger than the
// GPU's free memory can stall the GPU for every process of a shared machine; pinned memory cannot.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/table_rows.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "kernels/route.h"
#include "kernels/tier_index.h"
#include "src/base/buffer.h"
#include "src/base/device.h"

namespace sparta {

// automatic: the planner's choice (src/planner.h make_plan): HBM where the table fits, else host.
enum class TableTier { hbm, host, automatic };
enum class Eviction { error, lru, lfu };
const char* tier_name(TableTier t);
const char* eviction_name(Eviction e);
// "hbm"/"host"/"auto", "error"/"lru"/"lfu"; sparta::Error naming `what` (the option as the user typed it) otherwise.
TableTier parse_tier(const std::string& s, const std::string& what);
Eviction parse_eviction(const std::string& s, const std::string& what);

// Where a table's rows live (EmbeddingTableConfig::tier).
struct TierConfig {
  TableTier tier = TableTier::hbm;
  // host: rows of the GPU cache, 1 .. capacity_rows (more is clamped; a cache of every row holds the whole table
  // on the device, and the table runs as an HBM table: EmbeddingTable::host_tier() is null). automatic: the cache
  // the table gets if it goes to host memory; 0: what the memory budget leaves (the planner sizes it).
  int64_t cache_rows = 0;
  Eviction eviction = Eviction::lru;  // host: the cache's policy (error: a call that needs an eviction fails)
};
// The tier of a table whose rows take row_floats floats of values as stored (row_storage_floats) and state_width
// of state, from a program's options: cache_rows, else cache_mb MiB of cache rows (values and state, at least 1
// row). hbm: both must be 0; automatic: both may be 0 (the planner sizes the cache).
TierConfig make_tier(TableTier tier, int64_t cache_rows, double cache_mb, Eviction eviction, int row_floats,
                     int state_width);

// What a host tier needs of its table.
struct HostTierSetup {
  std::string name;
  int dim = 0;
  int state_width = 0;
  int64_t capacity_rows = 0;  // rows of the host store
  int64_t cache_rows = 0;
  Eviction eviction = Eviction::lru;
  float initial_state = 0;    // every state float of a new row
  RowStorage storage = RowStorage::fp32;  // the values as the table stores them (kernels/row_storage.h)
  // Initial values by key, as the table computes them (its segments on the host here).
  uint64_t seed = 0;
  uint32_t table_id = 0;
  float init_scale = 0;
  bool tagged_keys = false;
  std::vector<KeySegment> key_segments;
  int64_t direct_stride = 0;  // > 0: a direct index over the keys direct_offset + row * direct_stride
  int64_t direct_offset = 0;
};

class HostTier {
 public:
  // Throws sparta::Error naming the table, before allocating, when the host store (host_bytes) exceeds the
  // host's available memory (/proc/meminfo MemAvailable) or the setup is bad. Synchronizes dev.stream.
  HostTier(const Device& dev, const HostTierSetup& s);

  // Host bytes of the store: every row's record (its values, row_floats: row_storage_floats, its state and its use
  // count, in whole 64-byte lines).
  static size_t host_bytes(int64_t capacity_rows, int row_floats, int state_width);
  // Bytes of a row's record: what a row moves over the link, in and out.
  static size_t record_bytes(int row_floats, int state_width);
  // Device bytes of the tier beside its cache's rows (what the planner counts): a slot (int32) and a made flag per
  // host row, about
  // kSlotWords int64 per cache slot (its key, row, stamps and pin, the victims' select lists and sort space),
  // and for a hashed table the device index of its keys (kernels/hash_table.h at load factor 0.5).
  static constexpr int kSlotWords = 16;
  static size_t device_bytes(int64_t capacity_rows, int64_t cache_rows, bool hashed);
  // Device bytes of the staging area that a call evicting `victims` rows uses (their records and host rows, and the
  // store's sort of their host rows): a call evicts at most its distinct keys, and at most the cache.
  static size_t staging_bytes(int64_t victims, int row_floats, int state_width);

  // Makes the distinct keys of keys [n] (device memory) resident in the cache (cache_values [cache_rows, dim],
  // cache_state [cache_rows, state_width], device memory) and returns their slots [n] (device memory, valid
  // until the next call): -1 for a key that is absent and not created (eval of an unseen key of a hashed
  // table), outside a direct index, or refused (no slot, host store full). create: train (new keys get rows);
  // pin: keep the slots until release_pins. Synchronizes stream (once when every key hits; a few times more when
  // some miss); the slots are written asynchronously on stream.
  const int64_t* resident(const int64_t* keys, int64_t n, bool create, bool pin, float* cache_values,
                          float* cache_state, Stream stream);
  // The update of the pinned batch is queued: its slots may be evicted again.
  void release_pins() { ++pin_gen_; }
  // Throws sparta::Error (and forgets it) when a call since the last check refused keys.
  void check();
  // While clock is set, resident() marks its parts on it ("tier NAME: ..." on the call's stream, the store on the
  // tier's own), for a step's timeline (EmbeddingCollection::trace); null: no marks.
  void trace(StreamClock* clock) { clock_ = clock; }
  // Live rows: created keys (hashed), capacity_rows (direct index). Synchronizes stream.
  int64_t size(Stream stream);
  int64_t cache_rows() const { return s_.cache_rows; }
  // Every live row (host store, with the cache's newer copies), ordered by host row. Synchronizes stream.
  TableRows export_rows(const float* cache_values, const float* cache_state, Stream stream);
  // Writes rows into the host store after writing the cache back and emptying it: hashed, appended (keys must
  // be absent, and fit); a direct index, by key (keys must be in the index). Checks everything first
  // (sparta::Error naming the table and the key), then changes. Synchronizes stream.
  void load_rows(const TableRows& rows, const float* cache_values, const float* cache_state, Stream stream);
  // Empties the store and the cache. Synchronizes stream.
  void clear(Stream stream);

  // For tests and benches: the keys the last resident() call evicted, in the order they were chosen; the keys
  // in the cache now, ascending (both synchronize the last call's stream); rows copied in and written back since
  // construction; keys missed since construction (each call's distinct misses, and its distinct train keys without
  // a row).
  std::vector<int64_t> last_evicted();
  std::vector<int64_t> cached_keys();
  int64_t rows_in() const { return rows_in_; }
  int64_t rows_out() const { return rows_out_; }
  int64_t misses() const { return misses_; }

 private:
  bool direct() const { return s_.direct_stride > 0; }
  TierIndex index();
  // The policy's first `wanted` victims among the evictable slots, in its order, into moves_ (fewer when fewer are
  // evictable); returns their count; *pinned: the slots pinned now. Synchronizes stream (a few times: once a
  // digit of the threshold).
  int64_t choose_victims(int64_t wanted, int64_t* pinned, Stream stream);
  // The first `victims` of the n listed slots (slot, key, tie: tier_select_collect's lists) in the policy's order
  // (by key, packed with the tie where pack_bits > 0, else by prio and then tie), into moves_; returns victims.
  int64_t sort_victims(int64_t n, int64_t victims, int prio_bits, int tie_bits, int pack_bits, const int64_t* slot,
                       const int64_t* key, const int64_t* tie, Stream stream);
  // Evicts the n slots of moves_: their rows to the staging area on stream, the slots freed and their keys to
  // evicted_dev_. store_staged then writes the staging area to the host store on wb_, after stream's work so far
  // (waited for before the store is read or the staging area reused: wb_.join_into).
  void write_back(int64_t n, const float* cache_values, const float* cache_state, Stream stream);
  void store_staged(Stream stream);
  void flush(const float* cache_values, const float* cache_state, Stream stream);
  void mark(Stream s, const char* what) {
    if (clock_) clock_->mark(s, "tier " + s_.name + ": " + what);
  }
  // A row's initial values and state (a row never made), as an HBM table would give it.
  void initial_row(int64_t key, float* values, float* state) const;
  // b grown to hold n elements (its old memory freed once stream is done with it).
  template <class T>
  T* grown(Buffer<T>& b, size_t n, Stream stream);

  Device dev_;
  HostTierSetup s_;
  KeyInit key_init_;      // its segments point into s_.key_segments (host)
  Buffer<KeySegment> segments_;  // s_.key_segments on the device
  KeyInit key_init_dev_;  // its segments point into segments_
  int rf_;                       // row_storage_floats(s_.storage, s_.dim)
  TierRecord rec_;               // a row's record in the store: values, state, and its uses (calls that used it,
                                 // LFU), valid while the row is made and out of the cache
  PinnedBuffer<float> records_;  // [capacity_rows, rec_.floats]
  Buffer<uint8_t> made_;         // per host row, on the device: its values are in the store (else its initial
                                 // values are due)
  std::unique_ptr<HashTable> keys_;  // hashed: key → host row, on the device; rows dense from 0
  // the cache's index on the device (kernels/tier_index.h)
  Buffer<int32_t> slot_of_row_;
  Buffer<int64_t> slot_key_dev_, slot_row_dev_, slot_last_, slot_uses_, slot_pin_;
  int64_t free_next_ = 0;       // slots free_next_ .. cache_rows - 1 are free (taken lowest first)
  int64_t guess_prio_ = -1;     // LRU: the last call whose slots the next select lists first (-1: none)
  int64_t tick_ = 0;            // calls so far
  int64_t pin_gen_ = 1;         // slots stamped with it are pinned
  // errors since the last check
  int64_t refused_ = 0, full_ = 0, needed_ = 0, pinned_at_error_ = 0;
  Buffer<int64_t> evicted_dev_;  // the keys the last call evicted
  int64_t evicted_ = 0;
  Stream last_stream_{};
  StreamClock* clock_ = nullptr;  // trace
  int64_t rows_in_ = 0, rows_out_ = 0, misses_ = 0;
  // per call, grown as needed
  static constexpr size_t kReportHead = 8;  // the counters' place at the head of report_ (kTierCounters <= 8)
  Buffer<int64_t> rows_dev_, slots_dev_, hash_rows_, report_;
  // the victims' selection (counters and histogram, the slots' lists, sort space) and the victims (moves_)
  Buffer<int64_t> select_, lists_, work_, moves_;
  RouteScratch scratch_;
  PinnedBuffer<int64_t> counters_host_, select_host_;
  // a write-back's staging area (records and host rows) and the stream that stores it; last, so
  // that its destruction waits for the stream before the store is freed
  Buffer<float> stage_;          // [staged_, rec_.floats] records
  Buffer<int64_t> stage_rows_;  // [staged_] host rows
  Buffer<int64_t> store_order_;  // the store's sort of stage_rows_: [staged_] sorted, then [staged_] their order
  RouteScratch wb_scratch_;      // that sort's space, on wb_
  int64_t staged_ = 0;          // rows staged and not yet stored
  SideStream wb_;
};

}  // namespace sparta
