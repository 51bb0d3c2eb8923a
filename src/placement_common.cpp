// placement_common.cpp: see placement_common.h.
#include "src/placement_common.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/base/agree.h"
#include "src/base/check.h"

namespace sparta {

namespace {
std::vector<size_t> times(const std::vector<size_t>& v, size_t k) {
  std::vector<size_t> r(v);
  for (size_t& x : r) x *= k;
  return r;
}
size_t total(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t(0)); }
}  // namespace


// ----------------------------------------------------------------------------
// names, shard sizes, the factory

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::dispatch: return "dispatch";
    case Placement::localized: return "localized";
    case Placement::replicated: return "replicated";
    case Placement::distributed: return "distributed";
    case Placement::hybrid: return "hybrid";
  }
  return "?";
}

Placement parse_placement(const std::string& name) {
  for (Placement p : {Placement::dispatch, Placement::localized, Placement::replicated, Placement::distributed,
                      Placement::hybrid})
    if (name == placement_name(p)) return p;
  throw Error("placement: expected dispatch, localized, replicated, distributed or hybrid, found '" + name + "'");
}

int64_t modulo_shard_rows(int64_t rows, int world, double shard_slack) {
  if (world <= 1) return rows;
  double share = std::ceil(double(rows) * shard_slack / double(world));
  return std::min<int64_t>(rows, static_cast<int64_t>(share) + kShardHeadroom);
}

int64_t direct_shard_rows(int64_t key_bound, int world, int rank) {
  return std::max<int64_t>(1, (key_bound - rank + world - 1) / world);
}

std::unique_ptr<PlacedTable> make_placed_table(const PlacedTableSetup& s, Exchange& ex) {
  switch (s.plan.placement) {
    case Placement::dispatch: return make_dispatch(s, ex);
    case Placement::localized: return make_localized(s, ex);
    case Placement::replicated: return make_replicated(s, ex);
    case Placement::distributed: return make_distributed(s, ex);
    case Placement::hybrid: return make_hybrid(s, ex);
  }
  throw Error("table '" + s.table.name + "': unknown placement");
}

// ----------------------------------------------------------------------------
// Exchange: every call into the Communicator

Exchange::Exchange(Communicator* comm, const Device& dev, MPI_Comm mpi_world, DataType wire)
    : comm_(comm), dev_(dev), mpi_(mpi_world), wire_(wire) {
  SPARTA_ASSERT(wire_ == DataType::f32 || wire_ == DataType::bf16, "exchange: wire type %s", dtype_name(wire_));
  MPI_CHECK(MPI_Comm_rank(mpi_, &rank_));
  MPI_CHECK(MPI_Comm_size(mpi_, &world_));
  SPARTA_ASSERT(world_ == 1 || comm_, "an exchange over %d ranks needs a communicator", world_);
  SPARTA_ASSERT(!comm_ || (comm_->size() == world_ && comm_->rank() == rank_),
                "communicator rank %d of %d, MPI rank %d of %d", comm_ ? comm_->rank() : -1,
                comm_ ? comm_->size() : -1, rank_, world_);
  if (world_ > 1 && dev_.is_cuda()) side_ = SideStream(dev_);
}

Stream Exchange::begin_collective() {
  side_.wait_for(dev_.stream);
  return side_.stream() ? side_.stream() : dev_.stream;
}

void Exchange::end_collective() {
  if (!posting_) side_.join_into(dev_.stream);
}

std::vector<size_t> Exchange::counts(const std::vector<size_t>& send_counts) {
  if (world_ == 1) return send_counts;
  return comm_->exchange_counts(send_counts);
}

void Exchange::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                            const std::vector<size_t>& recv_counts, DataType type) {
  if (world_ == 1) {
    if (send_counts[0] > 0) copy_on_device(dev_, recv, send, send_counts[0] * dtype_size(type));
    return;
  }
  comm_->all_to_all_v(send, send_counts, recv, recv_counts, type, begin_collective());
  end_collective();
}

void Exchange::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type) {
  if (world_ == 1) {
    if (recv_count > 0) copy_on_device(dev_, recv, send, recv_count * dtype_size(type));
    return;
  }
  comm_->reduce_scatter(send, recv, recv_count, type, begin_collective());
  end_collective();
}

void Exchange::all_reduce(const void* send, void* recv, size_t count, DataType type) {
  if (world_ == 1) {
    if (count > 0 && send != recv) copy_on_device(dev_, recv, send, count * dtype_size(type));
    return;
  }
  comm_->all_reduce(send, recv, count, type, begin_collective());
  end_collective();
}

void Exchange::all_gather_v(const void* send, void* recv, const std::vector<size_t>& counts, DataType type) {
  if (world_ == 1) {
    if (counts[0] > 0 && send != recv) copy_on_device(dev_, recv, send, counts[0] * dtype_size(type));
    return;
  }
  comm_->all_gather_v(send, recv, counts, type, begin_collective());
  end_collective();
}

// The bf16 wire: the rounding, the collective and the widening all run on the communication stream, so the staging
// buffers are never used by two collectives at once (and grow on that stream).
void Exchange::all_to_all_v_floats(const float* send, const std::vector<size_t>& send_counts, float* recv,
                                   const std::vector<size_t>& recv_counts) {
  if (world_ == 1 || wire_ == DataType::f32) return all_to_all_v(send, send_counts, recv, recv_counts, DataType::f32);
  const size_t ns = total(send_counts), nr = total(recv_counts);
  const Stream s = begin_collective();
  uint16_t* s16 = grow(send16_, *this, ns);
  uint16_t* r16 = grow(recv16_, *this, nr);
  route_to_bf16(dev_, send, int64_t(ns), s16, s);
  comm_->all_to_all_v(s16, send_counts, r16, recv_counts, DataType::bf16, s);
  route_from_bf16(dev_, r16, int64_t(nr), recv, s);
  end_collective();
}

void Exchange::all_gather_v_floats(const float* send, float* recv, const std::vector<size_t>& counts) {
  if (world_ == 1 || wire_ == DataType::f32) return all_gather_v(send, recv, counts, DataType::f32);
  const size_t ns = counts[size_t(rank_)], nr = total(counts);
  const Stream s = begin_collective();
  uint16_t* s16 = grow(send16_, *this, ns);
  uint16_t* r16 = grow(recv16_, *this, nr);
  route_to_bf16(dev_, send, int64_t(ns), s16, s);
  comm_->all_gather_v(s16, r16, counts, DataType::bf16, s);
  route_from_bf16(dev_, r16, int64_t(nr), recv, s);
  end_collective();
}

void Exchange::agree(const std::string& error, const char* what) { agree_on_error(mpi_, error, what); }

void Exchange::trace(bool on) {
  if (on && !clock_) clock_ = std::make_unique<StreamClock>(dev_);
  if (!on) clock_.reset();
}

void Exchange::mark(const char* what) {
  if (clock_) clock_->mark(dev_.stream, what);
}

void Exchange::mark_side(const char* what) {
  if (clock_) clock_->mark(side_.stream() ? side_.stream() : dev_.stream, what);
}

void Exchange::mark_on(Stream s, const char* what) {
  if (clock_) clock_->mark(s, what);
}

std::vector<StreamClock::Point> Exchange::read_marks() {
  if (!clock_) return {};
  settle();
  return clock_->read();
}

std::vector<int64_t> Exchange::download(const int64_t* p, size_t n) {
  // The communicator's wait polls for a failed peer and aborts; a bare stream synchronization behind a
  // collective whose peer died would wait forever.
  if (world_ > 1) comm_->synchronize(dev_.stream);
  return sparta::download(dev_, p, n);
}

int64_t Exchange::download_count(const int32_t* p) {
  if (world_ > 1) comm_->synchronize(dev_.stream);
  return read_count(dev_, p, dev_.stream);
}

void Exchange::settle() {
  if (world_ == 1) return synchronize(dev_, dev_.stream);
  if (side_.stream()) comm_->synchronize(side_.stream());
  comm_->synchronize(dev_.stream);
}

// ----------------------------------------------------------------------------
// every call into EmbeddingTable

void table_lookup_pooled(EmbeddingTable& t, const int64_t* offsets, const int64_t* keys, int64_t bags, int64_t nnz,
                         Combiner combiner, LookupMode mode, float* out, int64_t* rows, const BagLayout& layout,
                         OutputType out_type) {
  int64_t* kept = mode == LookupMode::train ? rows : nullptr;
  t.pooled_forward(offsets, keys, bags, combiner, mode, out, out_type, kept, MissingKey::zeros, Check::deferred,
                   t.device().stream, layout, nnz);
}

void table_lookup_keys(EmbeddingTable& t, const int64_t* keys, int64_t n, LookupMode mode, float* out, int64_t* rows) {
  int64_t* kept = mode == LookupMode::train ? rows : nullptr;
  t.unpooled_forward(keys, n, mode, out, OutputType::f32, kept, MissingKey::zeros, Check::deferred, t.device().stream);
}

void table_update(EmbeddingTable& t, const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                  const float* grad, Combiner combiner, int64_t step, float lr_scale, const BagLayout& layout) {
  t.backward_and_update(offsets, rows, bags, nnz, grad, combiner, step, lr_scale, t.device().stream, layout);
}

void table_prepare_update(EmbeddingTable& t, const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                          Combiner combiner) {
  t.prepare_update(offsets, rows, bags, nnz, combiner, t.device().stream);
}

void table_finish_update(EmbeddingTable& t, const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                         const float* grad, Combiner combiner, int64_t step, float lr_scale) {
  t.finish_update(offsets, rows, bags, nnz, grad, combiner, step, lr_scale, t.device().stream);
}

void table_check(EmbeddingTable& t) { t.check_lookups(MissingKey::zeros, t.device().stream); }

TableRows table_export(EmbeddingTable& t) { return t.export_rows(t.device().stream); }

void table_load(EmbeddingTable& t, const TableRows& rows) { t.load_rows(rows, t.device().stream); }

size_t table_memory_bytes(int64_t capacity_rows, int dim, OptimizerKind optimizer, double max_load_factor,
                          bool direct_index, RowStorage storage) {
  return EmbeddingTable::memory_bytes(capacity_rows, dim, optimizer, max_load_factor, direct_index, storage);
}

size_t table_memory_bytes(const EmbeddingTable& t) {
  const EmbeddingTableConfig& c = t.config();
  return table_memory_bytes(EmbeddingTable::device_rows(c), c.dim, c.optimizer.kind, c.max_load_factor,
                            c.direct_stride > 0 || c.tier.tier == TableTier::host, c.storage);
}

EmbeddingTableConfig shard_config(const PlacedTableSetup& s, int64_t capacity_rows, const std::string& suffix,
                                  DirectIndex direct) {
  EmbeddingTableConfig c;
  c.direct_stride = direct.stride;
  c.direct_offset = direct.offset;
  c.key_segments = s.key_segments;
  c.name = s.table.name + suffix;
  c.table_id = s.table_id;
  c.tagged_keys = s.tagged_keys;
  c.dim = s.table.dim;
  c.capacity_rows = capacity_rows;
  c.max_load_factor = s.table.max_load_factor;
  c.seed = s.seed;
  c.init_scale = s.table.init_scale;
  c.optimizer = s.table.optimizer;
  c.storage = s.table.storage;
  c.tier = s.table.tier;
  return c;
}

std::unique_ptr<EmbeddingTable> make_shard(const Device& dev, const PlacedTableSetup& s, int64_t capacity_rows,
                                           const std::string& suffix, DirectIndex direct) {
  return std::make_unique<EmbeddingTable>(dev, shard_config(s, capacity_rows, suffix, direct));
}

std::unique_ptr<EmbeddingTable> make_whole_shard(const Device& dev, const PlacedTableSetup& s,
                                                 const std::string& suffix) {
  return make_shard(dev, s, s.table.rows, suffix, s.table.direct_index ? DirectIndex{1, 0} : DirectIndex{0, 0});
}

std::unique_ptr<EmbeddingTable> make_modulo_shard(const Device& dev, const PlacedTableSetup& s, int world, int rank,
                                                  const std::string& suffix) {
  if (!s.table.direct_index) return make_shard(dev, s, modulo_shard_rows(s.table.rows, world, s.shard_slack), suffix);
  return make_shard(dev, s, direct_shard_rows(s.table.key_bound, world, rank), suffix, DirectIndex{world, rank});
}

// ----------------------------------------------------------------------------
// helpers

std::vector<int64_t> download(const Device& dev, const int64_t* p, size_t n) {
  std::vector<int64_t> h(n);
  if (n > 0) copy_to_host(dev, h.data(), p, n * sizeof(int64_t));
  return h;
}

TableRows select_rows(const TableRows& t, const std::vector<bool>& keep) {
  TableRows s;
  s.name = t.name;
  s.dim = t.dim;
  s.optimizer = t.optimizer;
  s.state_width = t.state_width;
  s.storage = t.storage;
  for (size_t i = 0; i < t.rows(); ++i) {
    if (!keep[i]) continue;
    s.keys.push_back(t.keys[i]);
    s.values.insert(s.values.end(), t.values.begin() + i * t.dim, t.values.begin() + (i + 1) * t.dim);
    s.state.insert(s.state.end(), t.state.begin() + i * t.state_width, t.state.begin() + (i + 1) * t.state_width);
  }
  return s;
}

// ----------------------------------------------------------------------------
// DispatchShard

DispatchShard::DispatchShard(Exchange& ex, const PlacedTableSetup& s, const std::string& suffix)
    : ex_(ex),
      dim_(s.table.dim),
      key_bits_(s.table.direct_index ? route_key_bits(s.table.key_bound) : 64),
      table_(make_modulo_shard(ex.device(), s, ex.world(), ex.rank(), suffix)),
      sums_(ex, s.table.dim),
      posted_(ex.device()) {
  for (Route& r : routes_) r.posted = StreamEvent(ex.device());
}

int64_t table_rows_in_use(EmbeddingTable& t, const Device& dev) { return t.size(dev.stream); }

void table_trace(EmbeddingTable& t, StreamClock* clock) {
  if (HostTier* tier = t.host_tier()) tier->trace(clock);
}

size_t DispatchShard::memory_bytes() const { return table_memory_bytes(*table_); }

void DispatchShard::route(const int64_t* keys, int64_t n) { route_into(now(), keys, n); }

void DispatchShard::route_ahead(const int64_t* keys, int64_t n) {
  route_into(routes_[1 - now_], keys, n);
  ahead_ = true;
}

void DispatchShard::take_ahead() {
  SPARTA_ASSERT(ahead_, "dispatch: no route ahead to take");
  now_ = 1 - now_;
  ahead_ = false;
}

void DispatchShard::route_into(Route& r, const int64_t* keys, int64_t n) {
  const Device& dev = ex_.device();
  const int world = ex_.world();
  RouteTemps& t = temps_;
  r.n = n;
  // the distinct keys (a hot key travels once per rank, not once per lookup)
  int64_t* sorted = grow(t.sorted, ex_, n);
  int64_t* key_perm = grow(t.key_perm, ex_, n);
  route_sort_keys(dev, keys, n, key_bits_, sorted, key_perm, t.scratch, dev.stream);
  int64_t* distinct = grow(t.distinct, ex_, n);
  int64_t* runs = grow(t.runs, ex_, n + 1);
  int64_t* uid = grow(t.uid, ex_, n);
  int64_t* num_unique = grow(t.num_unique, ex_, 1);
  route_unique_sorted(dev, sorted, n, distinct, runs, uid, num_unique, t.scratch, dev.stream);
  ex_.mark("dispatch: keys sorted");
  const int64_t u = r.unique = ex_.download(num_unique, 1)[0];
  // their route: stable buckets by owner
  int32_t* part = grow(t.part, ex_, u);
  int64_t* perm = grow(t.perm, ex_, u);
  int64_t* counts = grow(t.counts, ex_, world);
  route_owner_by_key(dev, distinct, u, world, part, dev.stream);
  route_bucket(dev, part, u, world, perm, counts, t.scratch, dev.stream);
  std::vector<int64_t> c = ex_.download(counts, world);
  r.send_counts.assign(c.begin(), c.end());
  int64_t* send_keys = grow(r.send_keys, ex_, u);
  route_gather_keys(dev, distinct, perm, u, send_keys, dev.stream);
  // where each key's vector will arrive: distinct key perm[p] at row p of the vectors sent back, so key
  // key_perm[j] (sorted position j, distinct key uid[j]) at row pos[uid[j]]
  int64_t* pos = grow(t.pos, ex_, u);
  int64_t* iota = grow(t.iota, ex_, u);
  route_iota(dev, u, iota, dev.stream);
  route_scatter_keys(dev, iota, perm, u, pos, dev.stream);
  int64_t* at_sorted = sorted;  // (the sorted keys are done with)
  route_gather_keys(dev, pos, uid, n, at_sorted, dev.stream);
  route_scatter_keys(dev, at_sorted, key_perm, n, grow(r.key_src, ex_, n), dev.stream);
  r.recv_counts = ex_.counts(r.send_counts);
  r.n_recv = static_cast<int64_t>(total(r.recv_counts));
  int64_t* recv_keys = grow(r.recv_keys, ex_, r.n_recv);
  ex_.mark("dispatch: keys routed");
  ex_.post(r.posted, [&] { ex_.all_to_all_v(send_keys, r.send_counts, recv_keys, r.recv_counts, DataType::i64); });
  ex_.mark_side("dispatch: keys exchanged");
}

void DispatchShard::lookup(LookupMode mode) {
  Route& r = now();
  ex_.join(r.posted);
  float* recv_vecs = grow(recv_vecs_, ex_, size_t(r.n_recv) * dim_);
  table_lookup_keys(*table_, r.recv_keys.data(), r.n_recv, mode, recv_vecs, grow(rows_, ex_, r.n_recv));
  ex_.mark("dispatch: keys looked up");
  float* send_vecs = grow(send_vecs_, ex_, size_t(r.unique) * dim_);
  ex_.post(posted_, [&] {
    ex_.all_to_all_v_floats(recv_vecs, times(r.recv_counts, dim_), send_vecs, times(r.send_counts, dim_));
  });
  ex_.mark_side("dispatch: vectors exchanged");
}

void DispatchShard::finish() { ex_.join(posted_); }

void DispatchShard::send(const int64_t* offsets, int64_t bags, const float* grad, Combiner combiner,
                         const BagLayout& grad_layout) {
  const Device& dev = ex_.device();
  const Route& r = now();
  // each distinct key's gradient, grouped by the row its vector came in (key_src): every row has keys, so the
  // sums come out in the order the keys were sent, ready to go (a group's sum does not depend on its id)
  const float* send = send_vecs_.data();
  if (r.n > 0) {
    sums_.sum(offsets, bags, r.key_src.data(), r.n, r.unique, grad, combiner, grad_layout);
    send = sums_.sums();
  }
  ex_.mark("dispatch: key sums");
  float* recv = recv_vecs_.data();
  ex_.post(posted_,
           [&] { ex_.all_to_all_v_floats(send, times(r.send_counts, dim_), recv, times(r.recv_counts, dim_)); });
  ex_.mark_side("dispatch: sums exchanged");
  // one bag per received key: the owner sums each row's keys in the order they arrived; the sort of those rows
  // while the sums travel
  int64_t* iota = grow(iota_, ex_, r.n_recv + 1);
  route_iota(dev, r.n_recv + 1, iota, dev.stream);
  table_prepare_update(*table_, iota, rows_.data(), r.n_recv, r.n_recv, Combiner::sum);
  ex_.mark("dispatch: update sorted");
}

void DispatchShard::prepare_sums(const int64_t* offsets, int64_t bags, Combiner combiner) {
  const Route& r = now();
  if (r.n == 0) return;
  sums_.prepare(offsets, bags, r.key_src.data(), r.n, r.unique, combiner);
  ex_.mark("dispatch: key sums prepared");
}

void DispatchShard::update(int64_t step, float lr_scale) {
  ex_.join(posted_);
  const Route& r = now();
  table_finish_update(*table_, iota_.data(), rows_.data(), r.n_recv, r.n_recv, recv_vecs_.data(), Combiner::sum,
                      step, lr_scale);
  ex_.mark("dispatch: rows updated");
}

// ----------------------------------------------------------------------------
// GroupSums

void GroupSums::reserve(int64_t nnz, int64_t groups) {
  const Device& dev = ex_.device();
  const int64_t n = std::max<int64_t>(1, std::max(nnz, groups));
  if (!ws_ || ws_->max_nnz() < n || ws_->capacity_rows() < n) {
    if (ws_) ex_.settle();
    ws_.reset();
    ws_ = std::make_unique<BackwardWorkspace>(dev, n, n, dim_, dev.stream);
  }
  grow(groups_, ex_, size_t(ws_->max_nnz()));
  grow(count_, ex_, 1);
  grow(sums_, ex_, size_t(ws_->max_nnz()) * dim_);
}

void GroupSums::prepare(const int64_t* offsets, int64_t bags, const int64_t* ids, int64_t nnz, int64_t groups,
                        Combiner combiner) {
  prepared_ = false;
  reserve(nnz, groups);
  const BackwardBatch b{offsets, ids, nullptr, bags, nnz, combiner, {}};  // a group id stands for a row id
  embedding_backward_prepare(ex_.device(), b, *ws_, groups_.data(), count_.data(), nullptr, nullptr,
                             ex_.device().stream);
  prepared_batch_ = Prepared{offsets, ids, bags, nnz, groups, combiner};
  prepared_ = true;
}

void GroupSums::sum(const int64_t* offsets, int64_t bags, const int64_t* ids, int64_t nnz, int64_t groups,
                    const float* grad, Combiner combiner, const BagLayout& grad_layout) {
  const Prepared& p = prepared_batch_;
  const bool ready = prepared_ && ws_->prepared().valid && p.offsets == offsets && p.ids == ids && p.bags == bags &&
                     p.nnz == nnz && p.groups == groups && p.combiner == combiner;
  if (!ready) prepare(offsets, bags, ids, nnz, groups, combiner);
  prepared_ = false;
  const BackwardBatch b{offsets, ids, grad, bags, nnz, combiner, grad_layout};
  embedding_backward_finish(ex_.device(), b, *ws_, sums_.data(), ex_.device().stream);
}

// ----------------------------------------------------------------------------
// OutputLayout

namespace {
// cols [slots] of rows of `row` values as a BagLayout (cols_dev holds them on the device), or the default
// [bags, dim] one where that is what they say.
BagLayout bag_layout(const Device& dev, const std::vector<int32_t>& cols, int64_t row, int dim, bool plain_type,
                     Buffer<int32_t>& cols_dev) {
  const int slots = static_cast<int>(cols.size());
  bool contiguous = row == int64_t(slots) * dim && plain_type;
  bool by_four = row % 4 == 0;
  for (int j = 0; j < slots; ++j) {
    contiguous = contiguous && cols[size_t(j)] == j * dim;
    by_four = by_four && cols[size_t(j)] % 4 == 0;
  }
  if (slots == 0 || contiguous) return BagLayout{};
  cols_dev = Buffer<int32_t>(dev, cols);
  return BagLayout{row, cols_dev.data(), slots, by_four};
}
}  // namespace

OutputLayout::OutputLayout(const Device& dev, const PlacedTableSetup& s, bool any_type) : type_(s.output_type) {
  if (s.output_type != OutputType::f32 && !any_type) return;  // pooled as floats, put into place by the collection
  const int dim = s.table.dim;
  layout_ = bag_layout(dev, s.output_cols, s.output_row, dim, s.output_type == OutputType::f32, cols_);
  if (in_place()) grad_layout_ = bag_layout(dev, s.grad_cols, s.grad_row, dim, true, grad_cols_);
}

// ----------------------------------------------------------------------------
// ReplicaShard

namespace {
// A copy that applies every rank's sums of a row: in the fixed order, so that the copies stay identical (sgd's
// atomic update would add a row's sums in any order). The only copy (one rank) keeps the table's update.
PlacedTableSetup replica_setup(PlacedTableSetup s, int world) {
  if (world > 1) s.table.optimizer.atomic_update = false;
  return s;
}
}  // namespace

ReplicaShard::ReplicaShard(Exchange& ex, const PlacedTableSetup& s, const std::string& suffix)
    : ex_(ex),
      dim_(s.table.dim),
      table_(make_whole_shard(ex.device(), replica_setup(s, ex.world()), suffix)),
      posted_(ex.device()) {}

size_t ReplicaShard::memory_bytes() const { return table_memory_bytes(*table_); }

void ReplicaShard::prepare(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags,
                           int64_t nnz, Combiner combiner) {
  const Device& dev = ex_.device();
  int64_t* unique_keys = grow(unique_keys_, ex_, nnz);
  int32_t* num_unique = grow(num_unique_, ex_, 1);
  table_->prepare_row_gradients(offsets, keys, rows, bags, nnz, combiner, unique_keys, num_unique, dev.stream);
  prepared_ = true;
}

void ReplicaShard::send(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags, int64_t nnz,
                        const float* grad, Combiner combiner, const BagLayout& grad_layout) {
  const Device& dev = ex_.device();
  // this rank's sum per touched row, and the key of each such row (refused keys, row -1, are left out)
  if (!prepared_) prepare(offsets, keys, rows, bags, nnz, combiner);
  prepared_ = false;
  int64_t* unique_keys = unique_keys_.data();
  int32_t* num_unique = num_unique_.data();
  float* row_grads = grow(row_grads_, ex_, size_t(nnz) * dim_);
  table_->finish_row_gradients(grad, row_grads, dev.stream, grad_layout);
  ex_.mark("replicated: row sums");
  const int64_t u = ex_.download_count(num_unique);
  const std::vector<size_t> counts = ex_.counts(std::vector<size_t>(size_t(ex_.world()), size_t(u)));
  // every rank's sums, in rank order
  all_ = static_cast<int64_t>(total(counts));
  int64_t* all_keys = grow(all_keys_, ex_, all_);
  float* all_grads = grow(all_grads_, ex_, size_t(all_) * dim_);
  ex_.post(posted_, [&] {
    ex_.all_gather_v(unique_keys, all_keys, counts, DataType::i64);
    ex_.all_gather_v_floats(row_grads, all_grads, times(counts, dim_));
  });
  ex_.mark_side("replicated: sums gathered");
}

void ReplicaShard::update(int64_t step, float lr_scale) {
  const Device& dev = ex_.device();
  ex_.join(posted_);
  // their rows in this copy (inserting keys only other ranks had seen: values by key, so every copy inserts the
  // same values), then one bag per sum: a row adds its ranks' sums in rank order
  int64_t* all_rows = grow(rows_, ex_, all_);
  table_->insert_rows(all_keys_.data(), all_, all_rows, dev.stream);
  int64_t* iota = grow(iota_, ex_, all_ + 1);
  route_iota(dev, all_ + 1, iota, dev.stream);
  // A key this copy had no room for (row -1: skipped) is counted by the table: the next check_lookups (the
  // collection's check after the next forward, agreed on by every rank) or a save reports it. Every copy holds
  // the same keys after an update, so every copy runs out of room at the same step.
  table_update(*table_, iota, all_rows, all_, all_, all_grads_.data(), Combiner::sum, step, lr_scale);
}

}  // namespace sparta
