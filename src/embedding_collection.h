// embedding_collection.h: the model-parallel embedding layer: many tables, each serving one slot or several, each
// with its own rows bound, dim, combiner, optimizer and placement (src/placement.h; src/planner.h picks them).
// Every rank gives its slice of the global batch and gets the pooled embeddings of its own samples; the backward
// takes their gradient and updates, at the rows' owners, only the rows the batch touched.
//
// Shapes per rank (device memory): offsets [local_batch * num_slots + 1] (CSR over rows sample * num_slots +
// slot), keys [offsets[last]]; output and gradient [local_batch, output_width] of CollectionConfig::output, a
// sample's slots in order, each its table's dim. Local batches may differ between ranks. The placements pool in
// float32; a 16-bit output is that result rounded once (and a 16-bit gradient widened exactly), so it equals the
// float32 output rounded, bit for bit.
//
// The model does not depend on the placements, the grouping or the world size: a row's initial values depend on
// (seed, table index, key) only, and every placement sums a row's gradients in a fixed order. Errors (bad
// offsets, keys outside a table's key_bound, full tables) are agreed on by all ranks, so every rank throws and
// none waits in a collective.
//
// Placement groups: tables that can share one physical table (same placement, dim, combiner, optimizer
// settings, init_scale, max_load_factor; bounded keys) are placed as one, so a step has fewer groups to route
// and exchange. Hashed tables tag their keys (key k of table i becomes (i << 56) | k, kernels/key_init.h);
// direct-index tables put their keys end to end (EmbeddingTableConfig::key_segments). Checkpoints, held_rows and
// owner_of speak of tables and untagged keys.
//
// Streams (c = the compute stream, Device::stream; m = the communication stream of src/placement_common.h
// Exchange). A step runs each part of the placements' work (src/placement.h PlacedTable) for every group before
// the next part of any, and c waits for a group's exchange only at that group's next part (events, no host wait):
//   forward   1. cut each group's slots and keys, route them (the host reads counts), post the keys on m;
//             2. look up what arrived, post what was found on m;  3. pool into the output.
//   backward  1. cut each group's gradient, post its exchange on m;  2. update the rows.
// So one group's lookup or update runs while m moves another group's data. The host synchronizes c only where
// it needs a count (Exchange::download, which notices a failed peer). Step buffers grow only after c and m are
// settled (Exchange::settle), so no free runs under a collective.
//
// Route ahead (route_ahead): a later batch's part 1 (checks, cuts and, for dispatch, its route and the keys'
// exchange) queued early, into a second set of cut and route buffers, so the trainer runs it beside the dense
// layers of the step before; the current batch's backward and an evaluation in between keep their own set.
// Look up ahead (look_up_ahead): after the backward, that batch's part 2 as well, so its lookups and exchanges
// run before the trainer's dense all-reduce. Both change no bit (mpi_test_collection route_ahead_changes_no_bit).
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
  // Where slot s starts in a sample's output row (CollectionConfig::output_col on).
  int64_t slot_column(int slot) const { return slot_cols_[size_t(slot)]; }
  // Values a row of the output: CollectionConfig::output_row, else output_width().
  int64_t output_row() const { return row_; }
  // Device bytes this rank's shards take.
  size_t memory_bytes() const;
  // Rows this rank's shards hold (PlacedTable::rows_in_use summed over the groups): how full its hash tables
  // are. Waits for the device's stream; no communication.
  int64_t rows_in_use();

  // Collective. offsets [local_batch * num_slots + 1], keys [offsets[last]]: device; out [local_batch,
  // output_width] of config().output (rows of output_row() values, the slots from CollectionConfig::output_col;
  // the other columns untouched): device, float values for f32, the 16-bit values' bits (uint16_t, bf16 or
  // IEEE half) for bf16 and f16. Train inserts unseen keys; eval gives zeros for keys never trained. Bad offsets,
  // keys outside a grouped table's key_bound and full tables throw sparta::Error on every rank.
  void forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, void* out,
               LookupMode mode = LookupMode::train);
  // The same with a float output: config().output must be f32 (sparta::Error otherwise, on every rank). (A
  // literal nullptr matches both overloads: cast it.)
  void forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, float* out,
               LookupMode mode = LookupMode::train);
  // Collective. grad [local_batch, output_width] of config().output (float with CollectionConfig::float_gradient;
  // device, rows of output_width values whatever output_row()): the gradient of
  // the last forward's output, which must have been a train forward (no other forward in between: the routes
  // hold one batch). step: the global optimizer step, from 1. lr_scale (finite, >= 0): every table's configured
  // learning rate is multiplied by it for this step (the trainer's learning-rate schedule).
  void backward(const void* grad, int64_t step, float lr_scale = 1.0f);
  // The same with a float gradient: config().output f32 or float_gradient (sparta::Error otherwise, on every rank).
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
  // on the compute and the communication stream (src/placement_common.h Exchange::mark), and a table in host
  // memory its tier's parts (HostTier::trace); read_trace waits for this rank's work, then returns the points since
  // the last read, in ms since the first. Off by default.
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
  int64_t row_ = 0;  // values a row of the output (CollectionConfig::output_row)
  bool float_gradient() const { return cfg_.output == OutputType::f32 || cfg_.float_gradient; }
  int64_t batch_ = 0;         // local batch of the last train forward
  bool trained_ = false;      // a train forward waits for its backward
};

}  // namespace sparta
