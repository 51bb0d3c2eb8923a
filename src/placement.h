// placement.h: how the tables of an embedding collection are configured and placed over the ranks, and the
// interface every placement implements (one file each: placement_dispatch.cpp, placement_localized.cpp,
// placement_replicated.cpp, placement_distributed.cpp, placement_hybrid.cpp).
//
// A placed table serves one table's share of this rank's batch: the bags (sample, j) for the table's j-th slot,
// CSR on the device. forward() leaves the pooled [bags, dim] of this rank's samples; backward() takes their
// gradient and updates the rows at their owners. Every rank calls both, in the same order (they are collective).
//
//   dispatch     owner key % world. Forward: keys all-to-all to the owners, one vector per key back, pooled at
//                the requester. Backward: per-key gradients back to the owners.
//   localized    owner: the table's rank. Forward: bag lengths and keys to the owner, which pools; pooled vectors
//                back by all-to-all. Backward: bag gradients to the owner.
//   replicated   every rank. Forward: a local pooled lookup. Backward: keys and per-key gradients all-gathered.
//   distributed  owner key % world. Forward: keys and bag ids to the owners; each pools partial sums for every
//                bag of the global batch; reduce-scatter. Backward: bag gradients all-gathered.
//   hybrid       hot keys on every rank, the rest key % world. Forward: hot keys looked up locally, the rest
//                dispatched, pooled at the requester. Backward: the hot keys' dense [hot, dim] gradient sums and
//                counts all-reduced; the rest as dispatch.
//
// "key % world" is kernels/route.h owner_of_key (the key's 64-bit pattern modulo world).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/dtype.h"
#include "io/table_rows.h"
#include "kernels/embedding_types.h"
#include "kernels/key_init.h"
#include "kernels/pooled_forward.h"
#include "src/host_tier.h"

namespace sparta {

class Exchange;

enum class Placement { dispatch, localized, replicated, distributed, hybrid };
// "dispatch" | "localized" | "replicated" | "distributed" | "hybrid"; parse throws sparta::Error otherwise.
const char* placement_name(Placement p);
Placement parse_placement(const std::string& name);

// One table of a collection.
struct CollectionTableConfig {
  std::string name = "table";
  int64_t rows = 0;            // rows bound of the whole table (its capacity over all ranks)
  int dim = 16;
  Combiner combiner = Combiner::sum;
  OptimizerConfig optimizer;
  std::vector<int> slots;      // the slots this table serves (one, or several sharing the table)
  // "auto" (the planner decides), or a placement name; "localized:<rank>" names the owner.
  std::string placement = "auto";
  // Keys lie in [0, key_bound) (0: unbounded or unknown). Tables with 0 < key_bound <= 2^56 (and index <= 126)
  // may share one physical table with others (src/embedding_collection.h); a key outside is an error then.
  int64_t key_bound = 0;
  int64_t hot_rows = 0;        // hybrid: size of the replicated frequent set (0: the planner's default)
  // Every shard indexes its keys directly (src/embedding_table.h direct_stride) instead of hashing them: a lookup
  // loads the row and nothing else. Needs key_bound > 0 and rows == key_bound (the table holds every key of
  // [0, key_bound) from the start: an eval lookup of an untrained key gives its initial values, checkpoints list
  // every row); such a table shares no physical table with others. Under hybrid the cold shard is direct and the
  // hot copy hashed, holding its keys from the start.
  bool direct_index = false;
  float init_scale = 0.05f;
  double max_load_factor = 0.5;
  // How the rows are stored (src/embedding_table.h EmbeddingTableConfig::storage): fp32, bf16 or fp16.
  RowStorage storage = RowStorage::fp32;
  // Where the rows live (src/host_tier.h): hbm, or host memory under a GPU cache of tier.cache_rows rows on each
  // rank (each rank caches its own shard; a hybrid table's hot copy stays in HBM), or automatic: the planner's
  // choice (TablePlan::tier). A tiered table shares no physical table with others.
  TierConfig tier;
};

struct CollectionConfig {
  int num_slots = 0;
  std::vector<CollectionTableConfig> tables;
  uint64_t seed = 0;           // initial values depend on (seed, table index, key) only
  // A key % world shard holds min(rows, ceil(rows * shard_slack / world) + kShardHeadroom) rows: keys do not
  // split evenly, and a table with fewer rows than ranks must still fit its keys wherever they land.
  double shard_slack = 1.25;
  // The wire type of the vectors and gradients moved between ranks (src/placement_common.h Exchange): f32, or bf16
  // (half the bytes; each value rounded to bf16 once on its way, arithmetic in float). One rank: no effect.
  DataType exchange = DataType::f32;
  // The type of the collection's output and of the gradient its backward takes (src/embedding_collection.h):
  // f32, or bf16 / f16 (each pooled value computed in float and rounded to nearest even once, as it is put into
  // the output; the gradient widened to float before the placements see it).
  OutputType output = OutputType::f32;
  // Where the output's rows lie: output_row values a row (0: output_width), a sample's slots from column
  // output_col on (the gradient stays [local_batch, output_width]). So a caller may have the pooled embeddings
  // written straight into a wider array of its own (the trainer: DCNv2's 16-bit x0, the bottom MLP's output in
  // its first columns).
  int64_t output_row = 0;
  int64_t output_col = 0;
  // The backward's gradient in float32 whatever the output's type (a caller that computes it in float).
  bool float_gradient = false;
};
constexpr int64_t kShardHeadroom = 64;

// Rows one rank holds of a table of `rows` under a key % world placement.
int64_t modulo_shard_rows(int64_t rows, int world, double shard_slack);
// The same with a direct index: the keys k < key_bound with k % world == rank, at least 1.
int64_t direct_shard_rows(int64_t key_bound, int world, int rank);

// Where one table lives (the planner's answer, or an explicit plan).
struct TablePlan {
  Placement placement = Placement::dispatch;
  int owner = 0;                  // localized: the rank that holds the table
  std::vector<int64_t> hot_keys;  // hybrid: the replicated keys, ascending, distinct
  // The planner's estimates (format_plan prints them): device bytes on the busiest rank, bytes this table moves
  // per step on the busiest rank (sent + received, forward + backward), and the seconds it adds to the plan's
  // estimate (src/planner.h make_plan: its group's fixed cost included when it is the group's first table).
  size_t memory_bytes = 0;
  // Working memory on the busiest rank besides the table's own (memory_bytes): the backward's workspaces and
  // the route buffers a step grows, at the planner's expected counts (src/planner.h placement_cost).
  size_t work_bytes = 0;
  size_t work_bytes_other = 0;  // the same on a rank other than a localized table's owner (work_bytes otherwise)
  // A host-tier table: host bytes on the busiest rank and the bytes between host and GPU per step there
  // (src/planner.h PlacementCost::host_bytes, host_transfer_bytes).
  size_t host_bytes = 0;
  double host_transfer_bytes = 0;
  double bytes_per_step = 0;
  double seconds_per_step = 0;
  // The table's own terms: device bytes its local passes read and write on the busiest rank, and, for the
  // group's first table (opens_group), the collectives of its group.
  double local_bytes = 0;
  int collectives = 0;      // the collectives of the table's group per step
  bool opens_group = false;
  // Where the planner put an automatic table's rows (hbm, or host under a cache of tier.cache_rows rows); the
  // configuration's tier otherwise (planned_tier).
  TierConfig tier;
};
// The tier a table runs with under plan entry p: the configuration's, or the planner's where it chose.
inline const TierConfig& planned_tier(const CollectionTableConfig& t, const TablePlan& p) {
  return t.tier.tier == TableTier::automatic ? p.tier : t.tier;
}
// The planner's estimate of the whole step (src/planner.h make_plan): seconds = link_bytes / link_GBps +
// local_bytes / hbm_GBps + collectives x collective_us + groups x group_us.
struct PlanEstimate {
  // The step's link bytes as a balanced exchange that takes as long (each rank sending what it receives): twice
  // the busiest rank's larger direction, forward plus backward (src/planner.cpp). Where every exchange is
  // balanced, the bytes the busiest rank sends plus receives.
  double link_bytes = 0;
  double local_bytes = 0;  // read + written per step by the local passes of the rank with the most
  int collectives = 0;     // over the groups
  int groups = 0;
  double seconds = 0;
};
struct Plan {
  std::vector<TablePlan> tables;  // in CollectionConfig::tables order
  PlanEstimate estimate;
};

// What a rank owns of a key: a rank, or every rank (kAllRanks, the same value as io/checkpoint.h kEveryRank).
constexpr int kAllRanks = -1;

// One table's share of this rank's batch, on the device. bags = local_batch * table_slots, bag
// s * table_slots + j holds the keys of (sample s, the table's j-th slot).
struct TableBatch {
  const int64_t* offsets = nullptr;   // [bags + 1]
  const int64_t* keys = nullptr;      // [nnz]
  int64_t bags = 0, nnz = 0;
  int table_slots = 1;
  std::vector<int64_t> rank_batches;  // local batch (samples) of every rank, in rank order
};

class PlacedTable {
 public:
  virtual ~PlacedTable() = default;
  // out: [in.bags, dim] float32 (device). Train inserts unseen keys at their owners; eval gives zeros for them.
  // Lookup errors (a full table) are left for check_lookups(). Keeps `in` (pointers included) for backward().
  // The forward in three parts, so that a collection overlaps one table's exchanges with other tables' work
  // (src/embedding_collection.h): the collection runs a part for every table before the next part of any.
  //   begin_forward: the keys' route (the host reads its counts), their exchange posted (Exchange::post);
  //   lookup: the lookup of the keys that arrived (joined), the exchange of what it found posted;
  //   finish_forward: the pooled bags into out (the exchange joined).
  // `in`'s arrays and `out` stay valid and unchanged from begin_forward to finish_forward.
  virtual void begin_forward(const TableBatch& in, LookupMode mode, float* out) = 0;
  // Route ahead (optional): begin_forward's route of a batch whose forward comes later, queued now (a trainer:
  // beside the dense work of the step before), into route buffers of its own, so that the current batch's
  // backward, and any forward of another batch in between (an evaluation), still find theirs. Returns false
  // where the placement has no such second route (then begin_forward_routed routes as begin_forward does).
  // Collective like begin_forward: its exchange of keys is posted now. `in`'s arrays stay valid and unchanged
  // until that batch's forward, which calls begin_forward_routed(in, ...) with the same `in`; a later
  // route_ahead replaces a route no forward took.
  virtual bool route_ahead(const TableBatch& in) {
    (void)in;
    return false;
  }
  virtual void begin_forward_routed(const TableBatch& in, LookupMode mode, float* out) { begin_forward(in, mode, out); }
  virtual void lookup() = 0;
  virtual void finish_forward() = 0;
  // grad: [bags, dim] of the last train forward's output; step: the global optimizer step (from 1); lr_scale:
  // the factor on the table's configured learning rate for this step (a schedule). In two parts as the forward:
  // begin_backward posts the gradients' exchange (grad stays valid and unchanged until update), update joins it
  // and updates the rows.
  virtual void begin_backward(const float* grad) = 0;
  virtual void update(int64_t step, float lr_scale) = 0;
  // After a train forward, once its output has been handed on: queues on the device's stream the part of the
  // backward that needs no gradient (e.g. sorting the batch's rows), so that it runs while the caller computes
  // the gradient. Optional (backward does it itself when it was not called); no communication, no host wait.
  virtual void prepare_backward() {}
  // True when this placement puts its bags into the collection's output itself (localized's blocks of several
  // owners, put into place anyway; replicated and dispatch, pooling with the output's BagLayout, OutputLayout in
  // src/placement_common.h): then begin_forward's `out` is the collection's output and begin_backward's `grad`
  // the collection's gradient, rows of PlacedTableSetup::output_row floats of which it reads and writes the
  // group's columns only, and the collection copies nothing in between.
  virtual bool writes_output() const { return false; }
  // Throws sparta::Error (this rank only) when a lookup since the last check was refused (full table).
  virtual void check_lookups() = 0;
  // Owner of a key under this placement on this world: a rank or kAllRanks.
  virtual int owner_of(int64_t key) const = 0;
  // Rows this rank writes in a checkpoint: what it owns; replicated rows only on rank 0.
  virtual TableRows rows_to_save() = 0;
  // Every row this rank holds, replicas included (tests compare them with a reference).
  virtual TableRows held_rows() = 0;
  // Loads rows that this rank owns or replicates (owner_of(key) is this rank or kAllRanks) into empty shards.
  virtual void load_rows(const TableRows& rows) = 0;
  // Device bytes this rank's shards take.
  virtual size_t memory_bytes() const = 0;
  // Rows this rank's shards hold: the keys a hash table took so far (replicas and hot copies included), or every
  // row of a direct index. Waits for the device's stream.
  virtual int64_t rows_in_use() = 0;
  // The step's timeline inside this rank's shards (EmbeddingCollection::trace): a shard in host memory marks its
  // tier's parts on clock (src/host_tier.h); null: no marks.
  virtual void trace(StreamClock* clock) = 0;
};

// What make_placed_table needs beside the exchange: the table, its index (the key-init table id) and its plan.
// A group of tables sharing one physical table (src/embedding_collection.h) is placed as one table of tagged
// keys (tagged_keys: the key-init table id is each key's tag, kernels/key_init.h).
struct PlacedTableSetup {
  CollectionTableConfig table;
  int table_id = 0;
  bool tagged_keys = false;
  // A group of direct-index tables: their keys end to end (kernels/key_init.h), each segment's initial values
  // its own table's. Empty: one table.
  std::vector<KeySegment> key_segments;
  uint64_t seed = 0;
  double shard_slack = 1.25;
  TablePlan plan;  // the first member's (a localized group's members may have other owners: members below)
  // The group's tables in group order: each one's slots follow the previous one's in table.slots, and with a
  // direct index its keys follow the previous one's (key_segments). A localized group holds tables of several
  // owners (src/placement_localized.cpp), each owner's tables one after the other.
  struct Member {
    int table_id = 0;   // its index in the configuration: the tag of its keys when tagged_keys
    int64_t rows = 0;   // its rows bound
    int64_t key_begin = 0, key_bound = 0;  // direct index: its first group key and its key count
    int slots = 1;      // its slots in table.slots
    int owner = 0;      // localized: the rank that holds it
  };
  std::vector<Member> members;  // empty: one table, described by table and plan
  // The collection's output, where a placement may write its bags in place (PlacedTable::writes_output): rows of
  // output_row values of output_type, the group's slot j (in group order) from column output_cols[j]; and its
  // float gradient, read in place then: rows of grad_row floats, slot j from column grad_cols[j]. Empty: the
  // collection's gradient is not float32, and every placement writes [bags, dim] floats (so does one that pools
  // only into floats, given a 16-bit output_type).
  std::vector<int32_t> output_cols;
  int64_t output_row = 0;
  OutputType output_type = OutputType::f32;
  std::vector<int32_t> grad_cols;
  int64_t grad_row = 0;
};

// Allocates this rank's shards of one table for its plan. Bad plans (an owner outside the world, hot keys
// not sorted) throw sparta::Error naming the table.
std::unique_ptr<PlacedTable> make_placed_table(const PlacedTableSetup& setup, Exchange& ex);

}  // namespace sparta
