// placement_common.h: what the placements share: the one place where they call the communicator (Exchange) and
// the embedding table (the table_* functions), growing device arrays, and the two routes several placements
// use: a key % world shard reached by dispatch (DispatchShard: dispatch, and hybrid's cold keys) and a replica
// kept identical on every rank by all-gathered gradients (ReplicaShard: replicated).
//
// Lookups are made with deferred checks: a full table on one rank must not leave the others waiting in the next
// collective, so errors are read by check_lookups() and agreed on by the collection after the forward.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/embedding_backward.h"
#include "kernels/route.h"
#include "src/base/buffer.h"
#include "src/embedding_table.h"
#include "src/placement.h"

namespace sparta {

// The collectives of the placements. world == 1 never touches the communicator (copies on the device instead).
//
// Streams. With more than one rank on the cuda backend, every collective runs on the exchange's own stream (the
// communication stream; the communicator orders its work after that stream's), which first waits for the work
// queued on the compute stream (Device::stream) so far. A plain call then makes the compute stream wait for the
// collective: work queued on it afterwards sees the results. A call made inside post(done, f) does not: `done`
// marks the end of f's collectives, and the compute stream waits for them only at join(done), so that it runs
// other tables' work meanwhile. Between post and join the call's inputs must stay unchanged and its outputs
// unread. Collectives run on the communication stream one after the other, in the order they were called. With
// one rank, or on the cpu backend, post runs f as it is and join does nothing.
//
// The wire type (CollectionConfig::exchange) applies to the *_floats calls only: the per-key vectors and
// gradients and the pooled vectors and gradients that dispatch, localized, replicated and hybrid's cold keys move.
// With bf16 the sender rounds them to nearest even into a staging buffer and the receiver widens them exactly to
// float (every rank's own block included, so all ranks see the same values); all arithmetic stays float. The sums
// (distributed's reduce-scatter, hybrid's hot all-reduce) stay float: a sum rounded to bf16 at every addition
// would lose far more than the one rounding of a payload. With one rank nothing is rounded.
class Exchange {
 public:
  // comm may be null when world == 1. mpi_world: for agree() (host-side agreement on errors).
  // wire: f32 or bf16 (check_collection_config's rule).
  Exchange(Communicator* comm, const Device& dev, MPI_Comm mpi_world, DataType wire = DataType::f32);
  const Device& device() const { return dev_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  MPI_Comm mpi_world() const { return mpi_; }
  DataType wire() const { return wire_; }

  // Runs f, whose collectives the compute stream does not wait for until join(done) (see above).
  template <class F>
  void post(StreamEvent& done, F&& f) {
    posting_ = true;
    try {
      f();
    } catch (...) {
      posting_ = false;
      throw;
    }
    posting_ = false;
    if (side_.stream()) done.record(side_.stream());
  }
  // The compute stream's later work waits for the collectives of the post that recorded `done`.
  void join(StreamEvent& done) { done.wait_in(dev_.stream); }
  // The compute stream's later work waits for every collective posted so far.
  void join_all() { side_.join_into(dev_.stream); }

  // all_to_all_v / all_gather_v of float payloads (counts in floats), sent in the wire type.
  void all_to_all_v_floats(const float* send, const std::vector<size_t>& send_counts, float* recv,
                           const std::vector<size_t>& recv_counts);
  void all_gather_v_floats(const float* send, float* recv, const std::vector<size_t>& counts);

  // recv_counts[p] = what rank p sends to this rank (host counts).
  std::vector<size_t> counts(const std::vector<size_t>& send_counts);
  void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                    const std::vector<size_t>& recv_counts, DataType type);
  // recv = block `rank` of the sum over ranks of send ([world][recv_count]).
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type);
  // recv = the element-wise sum over ranks of send ([count]); send == recv allowed.
  void all_reduce(const void* send, void* recv, size_t count, DataType type);
  // recv: rank p's counts[p] elements in rank order (counts the same on every rank).
  void all_gather_v(const void* send, void* recv, const std::vector<size_t>& counts, DataType type);
  // Every rank throws the lowest failing rank's message when any rank's error is not empty.
  void agree(const std::string& error, const char* what = nullptr);
  // Copies n device elements to the host once the work queued on the compute stream before is done
  // (fault-aware wait).
  std::vector<int64_t> download(const int64_t* p, size_t n);
  // The same for one int32 count (kernels/embedding_backward.h's counts).
  int64_t download_count(const int32_t* p);
  // The host waits until the work this rank queued is done: the compute stream's and every collective's, posted
  // ones included (with more than one rank, the communicator's wait, which notices a failed peer).
  void settle();

  // The step's timeline (EmbeddingCollection::trace): while on, mark(what) records a point on the compute stream
  // and mark_side(what) one on the communication stream after the collectives queued so far (on the compute
  // stream with one rank); off, both do nothing. read_marks settles, then returns the points since the last read.
  void trace(bool on);
  void mark(const char* what);
  void mark_side(const char* what);
  void mark_on(Stream s, const char* what);  // a point of another stream on the same clock (a caller's)
  std::vector<StreamClock::Point> read_marks();
  StreamClock* clock() { return clock_.get(); }  // null unless tracing

 private:
  // The stream a collective runs on, after the compute stream's work so far; then, outside a post, the compute
  // stream waits for it.
  Stream begin_collective();
  void end_collective();

  Communicator* comm_;
  Device dev_;
  MPI_Comm mpi_;
  int rank_ = 0, world_ = 1;
  DataType wire_ = DataType::f32;
  Buffer<uint16_t> send16_, recv16_;  // bf16 staging (grown; used on the communication stream only)
  // The communication stream (cuda, world > 1); declared last, so that its destruction waits for its work
  // before the staging buffers go.
  SideStream side_;
  bool posting_ = false;
  std::unique_ptr<StreamClock> clock_;  // while tracing
};

// ---- calls into EmbeddingTable (one place for each)

// rows: the keys' rows for the backward, written in train mode only (no backward follows an eval forward:
// EmbeddingCollection::backward refuses it), so an eval lookup writes no 8 bytes per key. layout: where each bag
// goes in out (default [bags, dim]); the same for the gradient of table_update. nnz: the keys' count where the
// caller knows it on the host, else -1 (EmbeddingTable::pooled_forward).
void table_lookup_pooled(EmbeddingTable& t, const int64_t* offsets, const int64_t* keys, int64_t bags, int64_t nnz,
                         Combiner combiner, LookupMode mode, float* out, int64_t* rows, const BagLayout& layout = {},
                         OutputType out_type = OutputType::f32);
void table_lookup_keys(EmbeddingTable& t, const int64_t* keys, int64_t n, LookupMode mode, float* out, int64_t* rows);
void table_update(EmbeddingTable& t, const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                  const float* grad, Combiner combiner, int64_t step, float lr_scale, const BagLayout& layout = {});
// table_update in two parts (EmbeddingTable::prepare_update / finish_update): the sort before the gradient is there.
void table_prepare_update(EmbeddingTable& t, const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                          Combiner combiner);
void table_finish_update(EmbeddingTable& t, const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                         const float* grad, Combiner combiner, int64_t step, float lr_scale);
void table_check(EmbeddingTable& t);
TableRows table_export(EmbeddingTable& t);
void table_load(EmbeddingTable& t, const TableRows& rows);
size_t table_memory_bytes(int64_t capacity_rows, int dim, OptimizerKind optimizer, double max_load_factor,
                          bool direct_index = false, RowStorage storage = RowStorage::fp32);
size_t table_memory_bytes(const EmbeddingTable& t);
// Rows the table holds (EmbeddingTable::size on dev's stream; waits for it).
int64_t table_rows_in_use(EmbeddingTable& t, const Device& dev);
// A table in host memory marks its tier's parts on clock (HostTier::trace); others ignore it.
void table_trace(EmbeddingTable& t, StreamClock* clock);
// The EmbeddingTable config of one shard of a collection table: hashed with capacity_rows, or (direct.stride > 0)
// a direct index of capacity_rows rows.
EmbeddingTableConfig shard_config(const PlacedTableSetup& s, int64_t capacity_rows, const std::string& suffix,
                                  DirectIndex direct = DirectIndex{0, 0});
// A shard of capacity_rows: hashed (hybrid's hot keys), or a direct index when direct.stride > 0.
std::unique_ptr<EmbeddingTable> make_shard(const Device& dev, const PlacedTableSetup& s, int64_t capacity_rows,
                                           const std::string& suffix, DirectIndex direct = DirectIndex{0, 0});
// A shard of the whole table (localized, replicated): s.table.rows rows, a direct index when the table has one.
std::unique_ptr<EmbeddingTable> make_whole_shard(const Device& dev, const PlacedTableSetup& s,
                                                 const std::string& suffix);
// This rank's key % world shard (dispatch, distributed, hybrid's other keys): modulo_shard_rows hashed, or the
// direct index of the keys with key % world == rank.
std::unique_ptr<EmbeddingTable> make_modulo_shard(const Device& dev, const PlacedTableSetup& s, int world, int rank,
                                                  const std::string& suffix);

// A device array that grows (never shrinks) to what a step needs; at least one element, so pointers are not null.
// Growing frees the old memory once this rank's queued work is done (Exchange::settle: the compute stream and
// every posted collective, waited for with the communicator's fault-aware wait), so nothing is freed under a
// running collective and no free waits behind one where a failed peer could leave it hanging.
template <class T>
T* grow(Buffer<T>& b, Exchange& ex, size_t n) {
  if (n == 0) n = 1;
  if (b.size() >= n) return b.data();
  if (!b.empty()) ex.settle();
  b = Buffer<T>(ex.device(), n);
  return b.data();
}
// Copies n device elements to a host vector (synchronizes).
std::vector<int64_t> download(const Device& dev, const int64_t* p, size_t n);

// Gradients summed per group of keys, in the fixed order of kernels/embedding_backward.h (a group's keys in key
// order; a group of many keys, such as a power-law key's occurrences, spread over many warps): keys [nnz] in
// bags offsets [bags + 1] (a CSR over them, in their order), key i in group ids[i] of [0, groups); each key's
// gradient is its bag's row of grad [bags, dim], or its place there as grad_layout says (mean: divided by the
// bag's length). Asynchronous on the device's stream; the workspace grows (after Exchange::settle) to the largest
// batch seen.
class GroupSums {
 public:
  GroupSums(Exchange& ex, int dim) : ex_(ex), dim_(dim) {}
  void sum(const int64_t* offsets, int64_t bags, const int64_t* ids, int64_t nnz, int64_t groups, const float* grad,
           Combiner combiner, const BagLayout& grad_layout = {});
  // Optional: the part of sum that needs no gradient (the sort of the ids: embedding_backward_prepare), queued
  // now on the device's stream, where the device would otherwise wait. A sum of the same offsets and ids pointers,
  // bags, nnz, groups and combiner (the arrays unchanged in between) then only reduces; any other sum does both.
  void prepare(const int64_t* offsets, int64_t bags, const int64_t* ids, int64_t nnz, int64_t groups,
               Combiner combiner);
  // After sum: the groups with keys, ascending ([nnz] device; *count() of them, device memory), and their sums
  // ([nnz, dim], in that order).
  const int64_t* groups() const { return groups_.data(); }
  const int32_t* count() const { return count_.data(); }
  const float* sums() const { return sums_.data(); }

 private:
  void reserve(int64_t nnz, int64_t groups);  // the workspace and the outputs for such a sum
  struct Prepared {
    const int64_t* offsets = nullptr;
    const int64_t* ids = nullptr;
    int64_t bags = 0, nnz = 0, groups = 0;
    Combiner combiner = Combiner::sum;
  };
  Exchange& ex_;
  int dim_;
  std::unique_ptr<BackwardWorkspace> ws_;
  Buffer<int64_t> groups_;
  Buffer<int32_t> count_;
  Buffer<float> sums_;
  bool prepared_ = false;  // prepare ran for the batch in prepared_batch_, and no sum since
  Prepared prepared_batch_;
};

// The collection's float output where a group of some of its slots writes its bags and reads their gradients
// (PlacedTable::writes_output): PlacedTableSetup::output_row and output_cols as a BagLayout, the columns on the
// device. Contiguous (in_place() false) where the setup names no output, or where the output is [bags, dim]
// anyway (a group of every slot in order).
// any_type: the placement pools into a 16-bit output_type too (else such an output is not written in place).
class OutputLayout {
 public:
  OutputLayout(const Device& dev, const PlacedTableSetup& s, bool any_type);
  const BagLayout& layout() const { return layout_; }            // the forward's output
  const BagLayout& grad_layout() const { return grad_layout_; }  // the backward's gradient
  bool in_place() const { return !layout_.contiguous(); }
  // The type of the values the placement writes into its forward's out: the output's in place, else float.
  OutputType type() const { return in_place() ? type_ : OutputType::f32; }

 private:
  Buffer<int32_t> cols_, grad_cols_;
  BagLayout layout_, grad_layout_;
  OutputType type_ = OutputType::f32;
};

// TableRows of the keys for which keep(key) holds (order kept).
TableRows select_rows(const TableRows& t, const std::vector<bool>& keep);

// ---- routes shared by several placements

// A table's key % world shard reached by dispatch (after SOK): each rank sends its distinct keys to their owners
// (stable buckets), gets one vector per distinct key back, from which every occurrence reads its own; the
// backward sums each distinct key's gradients (GroupSums), sends the sums back the same way, and the owner adds
// them in rank order (so a row's gradient is the global batch's, summed per rank, then over ranks).
class DispatchShard {
 public:
  DispatchShard(Exchange& ex, const PlacedTableSetup& s, const std::string& suffix);
  // The vectors of keys [n] (device) in three parts (PlacedTable's forward): route posts the distinct keys'
  // exchange, lookup looks up the keys that arrived and posts their vectors' exchange, finish joins it. Then key
  // i's vector is row vector_of_key()[i] of vectors() ([distinct keys, dim], each distinct key's once, as they
  // arrived): callers pool or copy from there (route_pool_bags with an index), without a per-key copy. keys
  // stays unchanged until finish; vectors() until the next lookup.
  void route(const int64_t* keys, int64_t n);
  // route into the second set of route buffers (PlacedTable::route_ahead), for a batch whose lookup comes after
  // the current batch's backward; take_ahead() then makes it the current route, in place of a call to route.
  void route_ahead(const int64_t* keys, int64_t n);
  void take_ahead();
  void lookup(LookupMode mode);
  void finish();
  const float* vectors() const { return send_vecs_.data(); }
  const int64_t* vector_of_key() const { return now().key_src.data(); }
  // The keys of the last train forward, in bags: offsets [bags + 1] a CSR over them in their order, grad
  // [bags, dim] or laid out as grad_layout says (device). send sums each distinct key's gradients (GroupSums:
  // its keys in key order, in kernels/embedding_backward.h's fixed order; the sums come out in the order the
  // distinct keys were sent, and go as they are) and posts the sums' exchange (the arrays may change once it
  // returns); update joins it and updates the rows.
  void send(const int64_t* offsets, int64_t bags, const float* grad, Combiner combiner,
            const BagLayout& grad_layout = {});
  // Optional, after lookup of a train forward, with the offsets, bags and combiner send will be given (kept
  // unchanged until then): the gradient-free part of send's sums (GroupSums::prepare), queued now, so that the
  // device sorts while the vectors travel instead of idling until finish.
  void prepare_sums(const int64_t* offsets, int64_t bags, Combiner combiner);
  void update(int64_t step, float lr_scale);
  EmbeddingTable& table() { return *table_; }
  size_t memory_bytes() const;

 private:
  Exchange& ex_;
  int dim_;
  int key_bits_;  // the bits the keys' sort looks at: those of a direct index's bound, else 64
  std::unique_ptr<EmbeddingTable> table_;
  // One batch's route of its keys: what outlives route_into. Two: the batch being trained reads its own (the
  // backward: key_src, the counts) while the next one is routed into the other (route_ahead).
  struct Route {
    int64_t n = 0, unique = 0, n_recv = 0;
    std::vector<size_t> send_counts, recv_counts;  // distinct keys per rank
    Buffer<int64_t> send_keys, recv_keys;  // the distinct keys in owner order, and those this rank owns
    Buffer<int64_t> key_src;  // [n]: the row of send_vecs_ holding key i's vector (its distinct key's send order)
    StreamEvent posted;       // the keys' exchange
  };
  Route routes_[2];
  // What route_into computes a route with and leaves: one set for both routes, since every route is queued on
  // the compute stream (the next route's kernels come after the last one's reads of these).
  struct RouteTemps {
    Buffer<int32_t> part;
    Buffer<int64_t> sorted, key_perm, distinct, runs, uid, num_unique;  // [n]: the keys' distinct set
    Buffer<int64_t> perm, counts, iota;                                 // the route of the distinct keys
    Buffer<int64_t> pos;  // [unique]: where each distinct key's vector arrives in send_vecs_
    RouteScratch scratch;
  };
  RouteTemps temps_;
  int now_ = 0;         // the current batch's route
  bool ahead_ = false;  // routes_[1 - now_] holds a batch routed ahead
  Route& now() { return routes_[now_]; }
  const Route& now() const { return routes_[now_]; }
  void route_into(Route& r, const int64_t* keys, int64_t n);
  Buffer<int64_t> rows_, iota_;  // the received keys' rows at the owner, and the update's one bag per key
  GroupSums sums_;              // the gradient sums, in send order (grouped by key_src); sent from there
  Buffer<float> send_vecs_, recv_vecs_;
  StreamEvent posted_;  // the end of the last posted exchange of vectors or sums
};

// A copy of a table on every rank. Lookups are local; an update sums this rank's gradient per touched row
// (kernels/embedding_backward.h's fixed order), all-gathers those sums with their keys (one per distinct key, not
// one per lookup: a hot key travels once per rank), and every copy applies every rank's sums, in rank order.
// A row's gradient is thus summed per rank, then over ranks, the same on every copy: with one contribution per
// rank, a row's sum over ranks is the same chain of additions on every copy, bit for bit, though the copies hold
// the row under other ids (the fixed order depends on a row's own contributions only). With more than one rank
// the copy takes that fixed order even when the table's sgd asks for the atomic update.
class ReplicaShard {
 public:
  ReplicaShard(Exchange& ex, const PlacedTableSetup& s, const std::string& suffix);  // a whole-table shard
  EmbeddingTable& table() { return *table_; }
  // This rank's bags of the last train forward: offsets [bags + 1], keys [nnz] and their rows in this copy,
  // grad [bags, dim] the gradient of the pooled output (or laid out as grad_layout says), pooled with combiner.
  // Device pointers. Collective, in
  // two parts (PlacedTable's backward): send posts the all-gather of this rank's sums (the arrays may change
  // once it returns), update joins it and applies every rank's sums.
  void send(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags, int64_t nnz,
            const float* grad, Combiner combiner, const BagLayout& grad_layout = {});
  void update(int64_t step, float lr_scale);
  // Optional, before send with the same offsets, keys, rows, bags, nnz and combiner (kept unchanged
  // until then): the gradient-free part of its per-row sums (EmbeddingTable::prepare_row_gradients), queued now.
  void prepare(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags, int64_t nnz,
               Combiner combiner);
  // A new forward: a prepare made for the previous batch no longer applies.
  void forget_prepare() { prepared_ = false; }
  size_t memory_bytes() const;

 private:
  Exchange& ex_;
  int dim_;
  std::unique_ptr<EmbeddingTable> table_;
  Buffer<int64_t> unique_keys_, all_keys_, rows_, iota_;
  Buffer<int32_t> num_unique_;
  Buffer<float> row_grads_, all_grads_;
  int64_t all_ = 0;        // every rank's sums: their count
  bool prepared_ = false;  // prepare() ran for the coming send
  StreamEvent posted_;
};

std::unique_ptr<PlacedTable> make_dispatch(const PlacedTableSetup& s, Exchange& ex);
std::unique_ptr<PlacedTable> make_localized(const PlacedTableSetup& s, Exchange& ex);
std::unique_ptr<PlacedTable> make_replicated(const PlacedTableSetup& s, Exchange& ex);
std::unique_ptr<PlacedTable> make_distributed(const PlacedTableSetup& s, Exchange& ex);
std::unique_ptr<PlacedTable> make_hybrid(const PlacedTableSetup& s, Exchange& ex);

}  // namespace sparta
