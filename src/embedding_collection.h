// embedding_collection.h: the model-parallel embedding layer: many tables, each serving one slot or several,
// each with its own rows bound, dim, combiner, optimizer and placement (src/placement.h; the planner picks them,
// src/planner.h). Every rank gives its own slice of the global batch and gets the pooled embeddings of its own
// samples; the backward takes their gradient and updates, at the rows' owners, only the rows the batch touched.
//
// Input per rank (device memory): CSR offsets [local_batch * num_slots + 1] over rows sample * num_slots + slot,
// and keys [offsets[last]]. Local batches may differ between ranks (the reader gives them by one); empty samples
// and slots are fine. Output per rank: [local_batch, output_width] of CollectionConfig::output (float32, bfloat16 or
// float16), where a sample's row holds its slots in order, each slot the dim of its table: [local_batch, num_slots,
// dim] when the tables share one dim. The gradient the backward takes has the output's type and shape. The
// placements pool in float32 whatever the output type; a 16-bit output is their float result rounded to nearest
// even once, as each group's slots are put into the output (kernels/route.h route_put_slots_half), and a 16-bit
// gradient is widened to float32 (exact) as each group's slots are taken out of it. So a 16-bit collection's
// output is its float32 output rounded, bit for bit, and its backward updates the tables exactly as a float32
// backward fed the same gradient values widened.
//
// Placement groups. Tables that can be one physical table (the same placement, dim, combiner, optimizer
// settings, init_scale and max_load_factor) and whose keys are bounded (0 < key_bound <= 2^56, table index <= 126)
// form a group: their keys are tagged, key k of table i becoming (i << 56) | k (kernels/key_init.h), and the group
// is placed as one table over the union of its tables' slots (table order, each table's slots in its order), with
// the sum of their rows. Localized tables of different owners group too: each owner holds its own tables' part,
// and the group's exchanges reach every owner at once (src/placement_localized.cpp); their table order is owner by
// owner. Direct-index tables group among themselves,
// their keys end to end instead: key k of table i becomes begin_i + k, begin_i the sum of the earlier members'
// key_bound, in one direct index over them all (hybrid: its hot copy hashed over the same keys), a key's initial
// values given by its segment (EmbeddingTableConfig::key_segments). Any
// other table is a group of its own, its keys as they are. A grouped row's initial values are those of (seed,
// table index, key) as for a table alone, so
// the model does not depend on the grouping; checkpoints, held_rows and owner_of speak of tables and untagged
// keys. A key outside [0, key_bound) of a grouped table is an error (after the forward, on every rank).
//
// One step, per group: cut the group's slots out of the batch and tag its keys (kernels/route.h; a group of all
// slots in order takes the batch's offsets as they are and, under a float32 output, writes the output directly),
// run the placement's forward, put the pooled bags into the output (rounding them to a 16-bit output type). The
// offsets are checked on the device; the check and every group's key count come to the host in one download. After the forward, keys outside their bounds and every
// group's lookup errors (a full table) are agreed on by all ranks, so an error is thrown everywhere and no rank
// waits in a collective. The backward goes the same way with the gradient. The model is the same whatever the
// placements and the world size: a row's initial values depend on (seed, table index, key) only, and every
// placement sums a row's gradients over the global batch in a fixed order (that of the global batch, or per rank
// and then over ranks), deterministically.
//
// With one rank nothing goes through the communicator: replicated and localized look the bags up in place and
// update from the bags' gradients; the other placements' exchanges copy on the device instead.
//
// ---- Streams and overlap (c = the compute stream, Device::stream; m = the exchange's communication stream) ----
//
// Every collective of the placements runs on m (src/placement_common.h Exchange; the communicator orders its own
// work after m's), after the work queued on c so far (an event). A
// step runs each part of the placements' work (src/placement.h PlacedTable) for every group before the next
// part of any group, and c does not wait for a group's exchange until that group's next part (events, no host
// wait):
//   forward   1. for every group t: cut its slots and keys (c), build its route (c; the host reads its counts),
//                post its keys' exchange on m                                  → event posted[t]
//             2. for every t: c waits posted[t]; the lookup (c); post what it found (per-key vectors, pooled
//                bags, partial sums) on m                                      → posted[t]
//                (replicated tables and hybrid's hot keys look up on c alone while m moves other groups' data)
//             3. for every t: c waits posted[t]; unpermute, pool, put the group's slots into the output.
//   backward  1. for every t: cut its gradient, the gradient sums it sends (c); post their exchange on m
//             2. for every t: c waits posted[t]; the update (c), while m still moves later groups' gradients.
// So group t's lookup runs while m moves group t-1's vectors, and group t's update while m moves group t+1's
// gradients. A group's buffers are written only by its own parts, each of which first waits for its last post;
// collectives on m run one after the other in the order they were posted, the same order on every rank. Where
// the host needs a count it synchronizes c (Exchange::download, whose wait polls for a failed peer instead of
// hanging): the offsets check with every group's key count (one download), the distinct keys and bucket sizes of
// a route (in part 1, while c holds only route work), replicated's distinct rows (backward part 1), hybrid's
// touched hot rows (backward part 2), and the key-bound and lookup error check after the forward. On the cpu
// backend, and with one rank, every exchange is done when its call returns (one rank: copies on c). Step buffers grow by reallocation (grow():
// the old memory is freed only after c and m are synchronized with the communicator's wait, Exchange::settle, so
// no free runs under a collective; after the first steps of a shape nothing grows and nothing is waited for).
//
// Route ahead (route_ahead). Part 1 of a later forward can be queued early: the batch's checks (one download,
// agreed), its cuts and, for dispatch groups, the route with its two downloads and the count exchange, the keys'
// exchange posted on m; the forward of that batch then starts at part 2. The trainer calls it between step i's
// forward and backward with step i+1's batch, once step i's dense forward is queued on its compute stream, so
// that this work and its host waits run beside the dense layers instead of at the head of step i+1. The batch
// routed ahead is cut and routed into the second of two sets of cut and route buffers (Group::cut, status_,
// DispatchShard's routes): step i's backward reads its own set, and a forward of another batch in between (an
// evaluation) uses that one too once the backward is queued, leaving the routed batch's set alone. Replicated has
// nothing to route; localized, distributed and hybrid route at the forward (their cut is still made ahead).
// Look up ahead (look_up_ahead), after the current batch's backward: part 2 of the routed batch too, its lookups
// (after the update on c) and their exchanges posted on m, so that they run beside the caller's remaining work
// and before the caller's next collective (the trainer's dense all-reduce); its forward then runs part 3 and the
// checks. Only where every group routed ahead (no host wait in part 1); nothing but that
// batch's forward may follow (its route and vectors are the placements' current ones now).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "src/base/buffer.h"
#include "src/placement.h"

namespace sparta {

class Communicator;
class Exchange;

class EmbeddingCollection {
 public:
  // Collective over world. comm: the ranks' communicator (may be null when world has one rank). Checks the
  // configuration and the plan (sparta::Error naming the table) and allocates every shard of the plan.
  EmbeddingCollection(MPI_Comm world, Communicator* comm, const Device& dev, const CollectionConfig& cfg,
                      const Plan& plan);
  ~EmbeddingCollection();
  EmbeddingCollection(const EmbeddingCollection&) = delete;
  EmbeddingCollection& operator=(const EmbeddingCollection&) = delete;

  const CollectionConfig& config() const { return cfg_; }
  const Plan& plan() const { return plan_; }
  int rank() const;
  int world() const;
  // Values per sample of the output and the gradient: the sum over slots of their table's dim.
  int64_t output_width() const { return width_; }
  // The type of the output's and the gradient's values: config().output.
  OutputType output_type() const { return cfg_.output; }
  // Where slot s starts in a sample's output row.
  int64_t slot_column(int slot) const { return slot_cols_[size_t(slot)]; }
  // Device bytes this rank's shards take.
  size_t memory_bytes() const;
  // Rows this rank's shards hold (PlacedTable::rows_in_use summed over the groups): how full its hash tables
  // are. Waits for the device's stream; no communication.
  int64_t rows_in_use();

  // Collective. offsets [local_batch * num_slots + 1], keys [offsets[last]]: device; out [local_batch,
  // output_width] of config().output: device, float values for f32, the 16-bit values' bits (uint16_t, bf16 or
  // IEEE half) for bf16 and f16. Train inserts unseen keys; eval gives zeros for keys never trained. Bad offsets,
  // keys outside a grouped table's key_bound and full tables throw sparta::Error on every rank.
  void forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, void* out,
               LookupMode mode = LookupMode::train);
  // The same with a float output: config().output must be f32 (sparta::Error otherwise, on every rank). (A
  // literal nullptr matches both overloads: cast it.)
  void forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, float* out,
               LookupMode mode = LookupMode::train);
  // Collective. grad [local_batch, output_width] of config().output, as forward's out (device): the gradient of
  // the last forward's output, which must have been a train forward (no other forward in between: the routes
  // hold one batch). step: the global optimizer step, from 1. lr_scale (finite, >= 0): every table's configured
  // learning rate is multiplied by it for this step (the trainer's learning-rate schedule).
  void backward(const void* grad, int64_t step, float lr_scale = 1.0f);
  // The same with a float gradient: config().output must be f32 (sparta::Error otherwise, on every rank).
  void backward(const float* grad, int64_t step, float lr_scale = 1.0f);
  // Collective; optional. The part of a later forward of (offsets, keys, local_batch) that needs no table values,
  // queued now on the collection's stream: the batch's checks, each group's cut and, where its placement routes
  // ahead (PlacedTable::route_ahead: dispatch; replicated has nothing to route), the route of its keys with their
  // exchange posted. For a trainer, between a step's forward and its backward, with the next step's batch, so that
  // this work and its host waits run beside the dense layers instead of at the start of the next step. The
  // current batch's backward, and forwards of other batches in between (an evaluation), are not affected: the
  // batch routed ahead has cut and route buffers of its own. The forward whose three arguments are these pointers
  // and batch starts from it (the arrays must stay valid and unchanged until then); the results are the same bit
  // for bit as without it (mpi_test_collection route_ahead_changes_no_bit). Returns false, on every rank, when a
  // rank's batch fails the checks (nothing is routed; its forward throws the error). A later route_ahead
  // replaces one no forward took; forget_route_ahead drops it (the arrays are about to change).
  bool route_ahead(const int64_t* offsets, const int64_t* keys, int64_t local_batch);
  void forget_route_ahead() { ahead_ = Ahead{}; }
  // Collective; optional. After the backward of the current batch (or with no train batch pending), with a batch
  // routed ahead: that batch's forward up to its lookups, queued now (each group's route taken or made, its
  // lookup, the exchange of what it found posted), so that the lookups and exchanges run beside the caller's
  // remaining work (a trainer: the step's last dense layers, before the dense gradients' all-reduce, which the
  // communicator would otherwise run first). out: the forward's output, which the lookups may write already (the
  // caller's work in between must not read it). The batch's forward, with the same arguments and out, then only
  // pools and checks. Returns false (nothing queued) without a batch routed ahead, or where a group did not
  // route ahead.
  bool look_up_ahead(void* out, LookupMode mode = LookupMode::train);
  // Optional, after a train forward whose output the caller has taken (e.g. its stream now waits for it): queues
  // the backward's work that needs no gradient on the collection's stream (replicated tables on more than one
  // rank sort their rows for the per-row gradient sums), to run while the caller computes the gradient.
  // Asynchronous; no communication. The backward does that work itself when this was not called.
  void prepare_backward();

  // The step's timeline, for diagnostics (bench_collection --trace): while on, forward and backward mark points
  // on the compute and the communication stream (src/placement_common.h Exchange::mark); read_trace waits for
  // this rank's work, then returns the points since the last read, in ms since the first. Off by default.
  void trace(bool on);
  std::vector<StreamClock::Point> read_trace();
  // While tracing: a point of the caller's stream s (a trainer's dense stream) on the same clock.
  void mark(Stream s, const char* what);
  // Placement groups (physical tables) the tables form.
  int groups() const;

  // ---- checkpoints (io/checkpoint.h): the same model loads into another world size or plan

  std::vector<TableSpec> table_specs() const;
  // This rank's rows of every table, each row written by one rank (replicated and hot rows by rank 0).
  std::vector<TableRows> rows_to_save();
  // Owner of a key of table t under this collection's plan: a rank or kEveryRank.
  int owner_of(int table, int64_t key) const;
  // Loads the rows this rank owns (what load_checkpoint gives with owner_of) into a collection that has not
  // been trained yet. Throws sparta::Error naming the table on a mismatch.
  void load_rows(const std::vector<TableRows>& tables);
  // Collective: saves the tables (no dense part) under root as step meta.step; meta.plan is set to the plan.
  // Returns the step directory.
  std::string save(const std::string& root, CheckpointMeta meta);
  // Collective: loads a checkpoint written by save (or by a trainer with these tables) into this untrained
  // collection; returns its metadata.
  CheckpointMeta load(const std::string& path);

  // Every row this rank holds of table t, replicas included (for tests and inspection; synchronizes).
  TableRows held_rows(int table);

 private:
  struct Group;
  // A batch's cut: the set of cut buffers (Group::cut, status_) it is in, and whether it has keys to check
  // against their bounds (tagged groups).
  struct Cut {
    int set = 0;
    bool tagged = false;
  };
  // A batch routed ahead (route_ahead), waiting for its forward.
  struct Ahead {
    bool pending = false;
    const int64_t* offsets = nullptr;
    const int64_t* keys = nullptr;
    int64_t local_batch = 0;
    Cut cut;
    bool looked_up = false;  // look_up_ahead queued its lookups, into out, in mode
    void* out = nullptr;
    LookupMode mode = LookupMode::train;
  };
  // A group's part 1 (its route taken when routed ahead, else made); returns where it pools.
  float* begin_group(Group& gr, const Cut& c, bool routed, void* out, LookupMode mode);
  // A forward's parts 1 and 2 for every group (src/embedding_collection.h "Streams and overlap"), overlapped.
  void begin_and_look_up(const Cut& c, bool routed, void* out, LookupMode mode);
  std::vector<TableRows> split_rows(const Group& g, const TableRows& r) const;
  // A forward's first part: the batch's offsets checked (agreed: a bad batch throws on every rank) and each
  // group's key count (returned: [2 + group]), then each group's keys cut into set `set`.
  std::vector<int64_t> check_batch(const int64_t* offsets, int64_t local_batch, int set);
  Cut cut_batch(const int64_t* offsets, const int64_t* keys, int64_t local_batch, int set,
                const std::vector<int64_t>& status);
  void check_key_bounds(const int64_t* offsets, const int64_t* keys, int64_t local_batch, int set);
  // A group's pooled [local_batch, its slots, dim] into its columns of the output (rounded to a 16-bit output).
  void put_slots(const Group& gr, const float* pooled, int64_t local_batch, void* out);

  MPI_Comm world_;
  Device dev_;
  CollectionConfig cfg_;
  Plan plan_;
  std::vector<std::unique_ptr<Group>> groups_;  // the placement groups, each with its placed table and cut batch
  // Declared after the groups, so destroyed before them: its communication stream's work is done (its
  // destruction waits for it) before the groups' buffers go.
  std::unique_ptr<Exchange> ex_;
  std::vector<int> group_of_;                    // per table: its group
  std::vector<int> table_of_slot_;
  Buffer<int64_t> status_[2];                    // [2 + groups] per cut set: the checks and key counts (forward)
  int now_ = 0;                                  // the cut set of the last forward
  Ahead ahead_;
  std::vector<int64_t> slot_cols_;
  int64_t width_ = 0;
  int64_t batch_ = 0;         // local batch of the last train forward
  bool trained_ = false;      // a train forward waits for its backward
};

}  // namespace sparta
