// embedding_collection.cpp: see embedding_collection.h.
#include "src/embedding_collection.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/fill.h"
#include "kernels/key_init.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/placement_common.h"
#include "src/planner.h"

namespace sparta {

static_assert(kAllRanks == kEveryRank, "placements and checkpoints name 'every rank' alike");

namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();  // "no bad row / key" in the step status
constexpr int kMaxTag = 126;

// Whether a table's rows all live in HBM: tier hbm, or a host tier whose cache holds every row (the table is then
// an HBM table: src/embedding_table.cpp).
bool in_hbm(const CollectionTableConfig& t) {
  return t.tier.tier == TableTier::hbm || t.tier.cache_rows >= std::max(t.rows, t.key_bound);
}

// Whether table i may share a physical table with others: its keys are known to fit under a tag.
bool groupable(const CollectionTableConfig& t, size_t i) {
  return t.key_bound > 0 && t.key_bound <= (int64_t(1) << kKeyTagShift) && i <= size_t(kMaxTag);
}

bool same_optimizer(const OptimizerConfig& a, const OptimizerConfig& b) {
  return a.kind == b.kind && a.lr == b.lr && a.momentum == b.momentum && a.beta1 == b.beta1 && a.beta2 == b.beta2 &&
         a.epsilon == b.epsilon && a.initial_accumulator == b.initial_accumulator &&
         a.atomic_update == b.atomic_update;
}

// Whether two groupable tables can be one physical table under their plans.
bool compatible(const CollectionTableConfig& a, const TablePlan& pa, const CollectionTableConfig& b,
                const TablePlan& pb) {
  if (a.direct_index != b.direct_index) return false;  // direct-index tables group among themselves (keys end to end)
  // tables in host memory group among themselves under one cache of their caches' rows (src/host_tier.h), one
  // residency pass and one update a step for all of them instead of one each
  if (in_hbm(a) != in_hbm(b) || (!in_hbm(a) && a.tier.eviction != b.tier.eviction)) return false;
  return pa.placement == pb.placement && a.dim == b.dim && a.combiner == b.combiner && same_optimizer(a.optimizer, b.optimizer) &&
         a.storage == b.storage && a.init_scale == b.init_scale && a.max_load_factor == b.max_load_factor;
}

int tag_of(int64_t tagged_key) { return static_cast<int>(uint64_t(tagged_key) >> kKeyTagShift); }
int64_t untag(int64_t tagged_key) { return static_cast<int64_t>(uint64_t(tagged_key) & kKeyTagMask); }

}  // namespace

// One placement group: tables placed as one physical table, or one table alone (its keys as they are). A
// group's keys: a hashed group tags each table's keys (kernels/key_init.h tag_key), a direct-index group lays
// them end to end (table t's key k is key_begin[t] + k, its key_segments). Its slots in concatenation order
// (table order, each table's slots in its order), where they go in a sample's output row, and the group's cut
// of the current batch (kept until the backward).
struct EmbeddingCollection::Group {
  std::vector<int> tables;  // indices in the configuration, ascending (localized: owner by owner, then ascending)
  bool tagged = false;        // keys moved into the group's key space (hashed: tags; direct: end to end)
  bool direct = false;        // a direct-index group
  std::vector<int64_t> key_begin;  // direct: each member table's first group key
  std::string name;         // for messages: "table 'a'" or "tables a, b, c"
  int dim = 0;
  // The group serves slots 0..num_slots-1 in order: the batch's offsets are its own, and its pooled
  // [batch, num_slots, dim] is the collection's output (no cut, no put or take).
  bool all_slots = false;
  // The placement writes the collection's output and reads its float gradient itself: all slots in order (then
  // [batch, num_slots, dim] is the group's own layout), or a placement that puts its bags into place anyway
  // (PlacedTable::writes_output). Otherwise the group pools into its buffer, put into the output after.
  bool writes_output = false;
  std::vector<int32_t> slots, cols;
  std::vector<int64_t> bases, bounds;  // per slot: its table's move into the group's keys, its key bound
  Buffer<int32_t> slots_dev, cols_dev, grad_cols_dev;  // grad_cols: cols in the gradient ([batch, output_width])
  Buffer<int64_t> bases_dev, bounds_dev;

  // The group key of key k of member table t, and back.
  int64_t group_key(int t, int64_t k) const {
    if (!tagged) return k;
    return direct ? key_begin[member(t)] + k : tag_key(t, k);
  }
  std::pair<int, int64_t> table_key(int64_t gk) const {
    if (!tagged) return {tables[0], gk};
    if (!direct) return {tag_of(gk), untag(gk)};
    const size_t m = size_t(std::upper_bound(key_begin.begin(), key_begin.end(), gk) - key_begin.begin()) - 1;
    return {tables[m], gk - key_begin[m]};
  }
  size_t member(int t) const { return size_t(std::find(tables.begin(), tables.end(), t) - tables.begin()); }
  std::unique_ptr<PlacedTable> placed;
  // The cut (or tagged) batch: offsets [bags + 1], keys [nnz]. Two sets (EmbeddingCollection::Cut's `set`): the
  // batch being trained keeps its own while the next one is cut into the other (route_ahead).
  struct CutArrays {
    Buffer<int64_t> offsets, keys;
    RouteScratch scratch;
  } cut[2];
  Buffer<float> pooled;           // [bags, dim]: pooled vectors, then their gradients (float32 whatever the output)
  TableBatch batch[2];            // the placement's view of each set's batch
  bool routed = false;            // the placement routed the batch ahead (PlacedTable::route_ahead)
};

EmbeddingCollection::EmbeddingCollection(MPI_Comm world, Communicator* comm, const Device& dev,
                                         const CollectionConfig& cfg, const Plan& plan)
    : world_(world), dev_(dev), cfg_(cfg), plan_(plan) {
  agree_on_error(world_, guarded([&] {
    check_collection_config(cfg_);
    SPARTA_REQUIRE(plan_.tables.size() == cfg_.tables.size(), "embedding collection: a plan of %zu tables for %zu",
                   plan_.tables.size(), cfg_.tables.size());
    // embedding.tier auto: the tier the planner chose
    for (size_t i = 0; i < cfg_.tables.size(); ++i) {
      cfg_.tables[i].tier = planned_tier(cfg_.tables[i], plan_.tables[i]);
      SPARTA_REQUIRE(cfg_.tables[i].tier.tier != TableTier::automatic,
                     "embedding collection: table '%s' has tier auto and its plan no tier for it (make_plan chooses)",
                     cfg_.tables[i].name.c_str());
    }
  }));
  ex_ = std::make_unique<Exchange>(comm, dev_, world_, cfg_.exchange);
  const int S = cfg_.num_slots;
  slot_cols_.assign(size_t(S), 0);
  table_of_slot_.assign(size_t(S), 0);
  std::vector<int> dim_of_slot(size_t(S), 0);
  for (size_t i = 0; i < cfg_.tables.size(); ++i)
    for (int s : cfg_.tables[i].slots) dim_of_slot[size_t(s)] = cfg_.tables[i].dim, table_of_slot_[size_t(s)] = int(i);
  for (int s = 0; s < S; ++s) slot_cols_[size_t(s)] = cfg_.output_col + width_, width_ += dim_of_slot[size_t(s)];
  row_ = cfg_.output_row > 0 ? cfg_.output_row : width_;
  const bool plain = row_ == width_;  // the output is [local_batch, output_width]
  // Every rank builds the same groups and shards' structure; a bad plan fails alike everywhere, a failed
  // allocation ends the job (device_alloc).
  agree_on_error(world_, guarded([&] {
    // the groups: a groupable table joins the first group it is compatible with (and whose rows stay within
    // what one table may hold), else starts one
    std::vector<std::vector<int>> members;
    std::vector<bool> tagged;
    std::vector<int64_t> rows;
    for (size_t i = 0; i < cfg_.tables.size(); ++i) {
      const CollectionTableConfig& t = cfg_.tables[i];
      size_t g = members.size();
      if (groupable(t, i))
        for (size_t h = 0; h < members.size(); ++h) {
          const size_t f = size_t(members[h][0]);
          if (tagged[h] && compatible(cfg_.tables[f], plan_.tables[f], t, plan_.tables[i]) &&
              rows[h] + t.rows <= kBackwardMaxRows) {
            g = h;
            break;
          }
        }
      if (g == members.size()) members.emplace_back(), tagged.push_back(groupable(t, i)), rows.push_back(0);
      members[g].push_back(int(i));
      rows[g] += t.rows;
    }
    // a localized group's tables owner by owner (src/placement_localized.cpp: each owner's keys one range)
    for (std::vector<int>& m : members)
      if (plan_.tables[size_t(m[0])].placement == Placement::localized)
        std::stable_sort(m.begin(), m.end(),
                         [&](int x, int y) { return plan_.tables[size_t(x)].owner < plan_.tables[size_t(y)].owner; });
    group_of_.assign(cfg_.tables.size(), 0);
    for (size_t g = 0; g < members.size(); ++g) {
      auto gr = std::make_unique<Group>();
      gr->tables = members[g];
      gr->tagged = tagged[g];
      const int first = members[g][0];
      gr->direct = cfg_.tables[size_t(first)].direct_index;
      PlacedTableSetup s;
      s.table = cfg_.tables[size_t(first)];
      if (in_hbm(s.table)) s.table.tier = TierConfig{};
      s.table_id = first;
      s.tagged_keys = gr->tagged && !gr->direct;
      int64_t begin = 0;
      for (int i : members[g]) {
        const CollectionTableConfig& t = cfg_.tables[size_t(i)];
        if (gr->direct && gr->tagged) {  // end to end: each table's keys after the previous ones
          gr->key_begin.push_back(begin);
          s.key_segments.push_back({begin, i});
        }
        s.members.push_back({i, t.rows, begin, t.key_bound, int(t.slots.size()), plan_.tables[size_t(i)].owner});
        begin += t.key_bound;
      }
      if (gr->direct && gr->tagged) s.table.key_bound = begin;
      if (s.table.tier.tier == TableTier::host) {  // the group's cache: its tables' caches together
        s.table.tier.cache_rows = 0;
        for (int i : members[g]) s.table.tier.cache_rows += cfg_.tables[size_t(i)].tier.cache_rows;
      }
      s.seed = cfg_.seed;
      s.shard_slack = cfg_.shard_slack;
      s.plan = plan_.tables[size_t(first)];
      s.table.rows = rows[g];
      s.table.slots.clear();
      s.plan.hot_keys.clear();
      std::string names;
      for (int i : members[g]) {
        const CollectionTableConfig& t = cfg_.tables[size_t(i)];
        group_of_[size_t(i)] = int(g);
        names += (names.empty() ? "" : ", ") + t.name;
        for (int slot : t.slots) {
          gr->slots.push_back(slot);
          gr->cols.push_back(static_cast<int32_t>(slot_cols_[size_t(slot)]));
          gr->bases.push_back(gr->group_key(i, 0));
          gr->bounds.push_back(t.key_bound);
          s.table.slots.push_back(slot);
        }
        for (int64_t k : plan_.tables[size_t(i)].hot_keys) {
          if (gr->tagged) {
            SPARTA_REQUIRE(k >= 0 && k < t.key_bound, "table '%s': hot key %lld outside [0, %lld) (its key_bound)",
                           t.name.c_str(), (long long)k, (long long)t.key_bound);
            k = gr->group_key(i, k);
          }
          s.plan.hot_keys.push_back(k);  // ascending: tags ascend with the tables
        }
      }
      gr->name = members[g].size() == 1 ? "table '" + names + "'" : "tables " + names;
      if (members[g].size() > 1) s.table.name = "tables " + names;
      gr->dim = s.table.dim;
      gr->all_slots = int(gr->slots.size()) == S;
      for (int j = 0; j < S && gr->all_slots; ++j) gr->all_slots = gr->slots[size_t(j)] == j;
      gr->slots_dev = Buffer<int32_t>(dev_, gr->slots);
      gr->cols_dev = Buffer<int32_t>(dev_, gr->cols);
      std::vector<int32_t> grad_cols;  // the gradient's: [local_batch, output_width]
      for (int32_t c : gr->cols) grad_cols.push_back(c - static_cast<int32_t>(cfg_.output_col));
      gr->grad_cols_dev = Buffer<int32_t>(dev_, grad_cols);
      gr->bases_dev = Buffer<int64_t>(dev_, gr->bases);
      gr->bounds_dev = Buffer<int64_t>(dev_, gr->bounds);
      if (float_gradient()) {
        s.output_cols = gr->cols;
        s.output_row = row_;
        s.output_type = cfg_.output;
        s.grad_cols = grad_cols;
        s.grad_row = width_;
      }
      gr->placed = make_placed_table(s, *ex_);
      gr->writes_output = (cfg_.output == OutputType::f32 && plain && gr->all_slots) ||
                          (float_gradient() && gr->placed->writes_output());
      groups_.push_back(std::move(gr));
    }
    for (Buffer<int64_t>& st : status_) st = Buffer<int64_t>(dev_, 2 + groups_.size());
  }));
}

EmbeddingCollection::~EmbeddingCollection() = default;

int EmbeddingCollection::rank() const { return ex_->rank(); }
int EmbeddingCollection::world() const { return ex_->world(); }
int EmbeddingCollection::groups() const { return static_cast<int>(groups_.size()); }

size_t EmbeddingCollection::memory_bytes() const {
  size_t b = 0;
  for (const auto& g : groups_) b += g->placed->memory_bytes();
  return b;
}

int64_t EmbeddingCollection::rows_in_use() {
  int64_t n = 0;
  for (const auto& g : groups_) n += g->placed->rows_in_use();
  return n;
}

void EmbeddingCollection::forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, float* out,
                                  LookupMode mode) {
  SPARTA_REQUIRE(cfg_.output == OutputType::f32,
                 "embedding collection forward: a float output given to a collection whose output is %s (pass its "
                 "values as void*)",
                 output_type_name(cfg_.output));
  forward(offsets, keys, local_batch, static_cast<void*>(out), mode);
}

std::vector<int64_t> EmbeddingCollection::check_batch(const int64_t* offsets, int64_t local_batch, int set) {
  const int S = cfg_.num_slots;
  const size_t G = groups_.size();
  // The step status on the device: [0] the first bad offsets row, [1] the first key outside its table's bound,
  // [2 + g] the key count of group g; one download after the cuts, before any collective (a bad batch on one
  // rank fails every rank there).
  int64_t* st = status_[set].data();
  std::vector<int64_t> status;
  ex_->agree(guarded([&] {
    SPARTA_REQUIRE(local_batch >= 0, "embedding collection forward, rank %d: local batch %lld", ex_->rank(),
                   (long long)local_batch);
    const int64_t rows = local_batch * S;
    fill(dev_, st, 2, kNone, dev_.stream);
    route_check_offsets(dev_, offsets, rows, st, dev_.stream);
    for (size_t g = 0; g < G; ++g) {
      Group& gr = *groups_[g];
      const int ts = static_cast<int>(gr.slots.size());
      const int64_t bags = local_batch * ts;
      const int64_t* last = offsets + rows;
      if (!gr.all_slots) {
        int64_t* t_offsets = grow(gr.cut[set].offsets, *ex_, size_t(bags) + 1);
        route_select_slot_offsets(dev_, offsets, local_batch, S, gr.slots_dev.data(), ts, t_offsets,
                                  gr.cut[set].scratch, dev_.stream);
        last = t_offsets + bags;
      }
      copy_on_device(dev_, st + 2 + g, last, sizeof(int64_t));
    }
    status = ex_->download(st, 2 + G);
    if (status[0] != kNone) {
      const int64_t r = status[0];
      if (r == 0) {
        const int64_t first = ex_->download(offsets, 1)[0];
        throw Error(strprintf("embedding collection forward, rank %d: offsets[0] must be 0, found %lld", ex_->rank(),
                     (long long)first));
      }
      std::vector<int64_t> h = ex_->download(offsets + r - 1, 2);
      throw Error(strprintf("embedding collection forward, rank %d: offsets decrease at row %lld (sample %lld, slot %lld): "
                   "%lld then %lld",
                   ex_->rank(), (long long)(r - 1), (long long)((r - 1) / S), (long long)((r - 1) % S),
                   (long long)h[0], (long long)h[1]));
    }
  }), "checking a batch");
  ex_->mark("forward: batch checked");
  return status;
}

EmbeddingCollection::Cut EmbeddingCollection::cut_batch(const int64_t* offsets, const int64_t* keys,
                                                         int64_t local_batch, int set,
                                                         const std::vector<int64_t>& status) {
  const int S = cfg_.num_slots;
  int64_t* st = status_[set].data();
  Cut c;
  c.set = set;
  std::vector<size_t> b = ex_->counts(std::vector<size_t>(size_t(world()), size_t(local_batch)));
  const std::vector<int64_t> rank_batches(b.begin(), b.end());
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& gr = *groups_[g];
    const int ts = static_cast<int>(gr.slots.size());
    const int64_t nnz = status[2 + g];
    const int64_t* t_offsets = gr.all_slots ? offsets : gr.cut[set].offsets.data();
    const int64_t* t_keys = keys;
    if (gr.tagged) {
      int64_t* k = grow(gr.cut[set].keys, *ex_, size_t(nnz));
      route_select_group_keys(dev_, offsets, keys, local_batch, S, gr.slots_dev.data(), ts, t_offsets,
                              gr.bases_dev.data(), gr.bounds_dev.data(), k, st + 1, dev_.stream);
      t_keys = k;
      c.tagged = true;
    } else if (!gr.all_slots) {
      int64_t* k = grow(gr.cut[set].keys, *ex_, size_t(nnz));
      route_select_slot_keys(dev_, offsets, keys, local_batch, S, gr.slots_dev.data(), ts, t_offsets, k,
                             dev_.stream);
      t_keys = k;
    }
    TableBatch& tb = gr.batch[set];
    tb.offsets = t_offsets;
    tb.keys = t_keys;
    tb.bags = local_batch * ts;
    tb.nnz = nnz;
    tb.table_slots = ts;
    tb.rank_batches = rank_batches;
  }
  return c;
}

bool EmbeddingCollection::route_ahead(const int64_t* offsets, const int64_t* keys, int64_t local_batch) {
  SPARTA_REQUIRE(!ahead_.looked_up, "embedding collection route_ahead: a batch was looked up ahead (look_up_ahead): "
                                    "its forward comes first");
  ahead_ = Ahead{};
  const int set = 1 - now_;
  std::vector<int64_t> status;
  try {
    status = check_batch(offsets, local_batch, set);
  } catch (const Error&) {
    return false;  // agreed: every rank drops it; the batch's forward finds the error again and throws it
  }
  const Cut c = cut_batch(offsets, keys, local_batch, set, status);
  for (auto& g : groups_) g->routed = g->placed->route_ahead(g->batch[set]);
  ex_->mark("route ahead: routed");
  ahead_ = Ahead{true, offsets, keys, local_batch, c};
  return true;
}

bool EmbeddingCollection::look_up_ahead(void* out, LookupMode mode) {
  if (!ahead_.pending || ahead_.looked_up) return false;
  for (auto& g : groups_)
    if (!g->routed) return false;  // its route would wait for the host here
  SPARTA_REQUIRE(!trained_, "embedding collection look_up_ahead: the train batch's backward has not run yet (the "
                            "lookups would read rows it has still to update)");
  begin_and_look_up(ahead_.cut, true, out, mode);
  ex_->mark("look up ahead: looked up");
  ahead_.looked_up = true;
  ahead_.out = out;
  ahead_.mode = mode;
  return true;
}

float* EmbeddingCollection::begin_group(Group& gr, const Cut& c, bool routed, void* out, LookupMode mode) {
  const TableBatch& tb = gr.batch[c.set];
  // A group that writes the output (all slots in order, or a placement that puts its bags into place itself)
  // gets it; otherwise the group pools into its buffer and its slots are put into the output (rounded there to
  // a 16-bit output type).
  float* pooled = gr.writes_output ? static_cast<float*>(out) : grow(gr.pooled, *ex_, size_t(tb.bags) * gr.dim);
  if (routed && gr.routed)
    gr.placed->begin_forward_routed(tb, mode, pooled);
  else
    gr.placed->begin_forward(tb, mode, pooled);
  return pooled;
}

void EmbeddingCollection::begin_and_look_up(const Cut& c, bool routed, void* out, LookupMode mode) {
  for (auto& g : groups_) begin_group(*g, c, routed, out, mode);
  for (auto& g : groups_) g->placed->lookup();
}

void EmbeddingCollection::forward(const int64_t* offsets, const int64_t* keys, int64_t local_batch, void* out,
                                  LookupMode mode) {
  const bool routed = ahead_.pending && ahead_.offsets == offsets && ahead_.keys == keys &&
                      ahead_.local_batch == local_batch;
  const bool looked_up = ahead_.looked_up;
  if (looked_up)
    ex_->agree(guarded([&] {
      SPARTA_REQUIRE(routed && ahead_.out == out && ahead_.mode == mode,
                     "embedding collection forward: a batch was looked up ahead (look_up_ahead): its forward, "
                     "with the same batch, output and mode, must come next");
    }));
  else
    ex_->join_all();  // a step left by an error may have posted exchanges no part waited for
  ex_->mark("forward");
  // A batch routed ahead takes its set of cuts and routes; any other batch is cut into the current set (whose
  // backward, if any, is queued already), leaving a route ahead for its own forward.
  Cut c;
  if (routed) {
    c = ahead_.cut;
    ahead_ = Ahead{};
  } else {
    c = cut_batch(offsets, keys, local_batch, now_, check_batch(offsets, local_batch, now_));
  }
  now_ = c.set;
  if (!looked_up) begin_and_look_up(c, routed, out, mode);
  for (auto& g : groups_) {
    g->placed->finish_forward();
    if (!g->writes_output) put_slots(*g, g->pooled.data(), local_batch, out);
  }
  ex_->mark("forward: pooled");
  // Keys outside their table's bound and full tables: agreed on by every rank.
  // (A tiered table checks its evaluations too: keys its cache had no room for.)
  const bool tiered = std::any_of(cfg_.tables.begin(), cfg_.tables.end(),
                                  [](const CollectionTableConfig& t) { return t.tier.tier == TableTier::host; });
  if (mode == LookupMode::train || c.tagged || tiered) {
    ex_->agree(guarded([&] {
      if (c.tagged) check_key_bounds(offsets, keys, local_batch, c.set);
      if (mode == LookupMode::train || tiered)
        for (auto& g : groups_) g->placed->check_lookups();
    }));
  }
  if (mode == LookupMode::train) {
    batch_ = local_batch;
    trained_ = true;
  } else {
    trained_ = false;  // the placements' routes now hold this batch's: the train batch's backward cannot follow
  }
}

void EmbeddingCollection::put_slots(const Group& gr, const float* pooled, int64_t local_batch, void* out) {
  const int ts = static_cast<int>(gr.slots.size());
  if (cfg_.output == OutputType::f32)
    route_put_slots(dev_, pooled, local_batch, ts, gr.dim, gr.cols_dev.data(), row_, static_cast<float*>(out),
                    dev_.stream);
  else
    route_put_slots_half(dev_, pooled, local_batch, ts, gr.dim, gr.cols_dev.data(), row_, cfg_.output,
                         static_cast<uint16_t*>(out), dev_.stream);
}

void EmbeddingCollection::check_key_bounds(const int64_t* offsets, const int64_t* keys, int64_t local_batch,
                                           int set) {
  const int64_t i = ex_->download(status_[set].data() + 1, 1)[0];
  if (i == kNone) return;
  // the error path: find the key's row (sample, slot), hence its table
  const int S = cfg_.num_slots;
  std::vector<int64_t> h = ex_->download(offsets, size_t(local_batch * S + 1));
  const int64_t r = int64_t(std::upper_bound(h.begin(), h.end(), i) - h.begin()) - 1;
  const int slot = static_cast<int>(r % S);
  const CollectionTableConfig& t = cfg_.tables[size_t(table_of_slot_[size_t(slot)])];
  const int64_t key = ex_->download(keys + i, 1)[0];
  throw Error(strprintf("embedding collection forward, rank %d: table '%s' takes keys in [0, %lld) (its key_bound), found "
               "key %lld (sample %lld, slot %d)",
               ex_->rank(), t.name.c_str(), (long long)t.key_bound, (long long)key, (long long)(r / S), slot));
}

void EmbeddingCollection::trace(bool on) {
  ex_->trace(on);
  for (auto& g : groups_) g->placed->trace(ex_->clock());
}

std::vector<StreamClock::Point> EmbeddingCollection::read_trace() { return ex_->read_marks(); }

void EmbeddingCollection::mark(Stream s, const char* what) { ex_->mark_on(s, what); }

void EmbeddingCollection::prepare_backward() {
  SPARTA_REQUIRE(trained_, "embedding collection prepare_backward: no train forward right before it");
  for (auto& g : groups_) g->placed->prepare_backward();
}

void EmbeddingCollection::backward(const float* grad, int64_t step, float lr_scale) {
  SPARTA_REQUIRE(float_gradient(),
                 "embedding collection backward: a float gradient given to a collection whose gradient is %s (pass its "
                 "values as const void*)",
                 output_type_name(cfg_.output));
  backward(static_cast<const void*>(grad), step, lr_scale);
}

void EmbeddingCollection::backward(const void* grad, int64_t step, float lr_scale) {
  SPARTA_REQUIRE(trained_, "embedding collection backward: no train forward right before it (each train forward "
                           "takes one backward, with no other forward in between)");
  SPARTA_REQUIRE(step >= 1, "embedding collection backward: step must be >= 1, found %lld", (long long)step);
  ex_->join_all();
  ex_->mark("backward");
  SPARTA_REQUIRE(std::isfinite(lr_scale) && lr_scale >= 0,
                 "embedding collection backward: lr_scale must be finite and >= 0, found %g", double(lr_scale));
  const bool f32 = float_gradient();
  for (auto& g : groups_) {
    Group& gr = *g;
    const int ts = static_cast<int>(gr.slots.size());
    const float* gg = f32 ? static_cast<const float*>(grad) : nullptr;
    if (!gr.writes_output) {
      // the group's slots of the gradient, widened to float from a 16-bit one, into the group's buffer (the
      // forward sized it for this batch)
      float* cut = gr.pooled.data();
      if (f32)
        route_take_slots(dev_, gg, batch_, ts, gr.dim, gr.grad_cols_dev.data(), width_, cut, dev_.stream);
      else
        route_take_slots_half(dev_, static_cast<const uint16_t*>(grad), batch_, ts, gr.dim,
                              gr.grad_cols_dev.data(), width_, cfg_.output, cut, dev_.stream);
      gg = cut;
    }
    gr.placed->begin_backward(gg);
  }
  for (auto& g : groups_) g->placed->update(step, lr_scale);
  ex_->mark("backward: updated");
  trained_ = false;
}

// ----------------------------------------------------------------------------
// checkpoints

std::vector<TableSpec> EmbeddingCollection::table_specs() const {
  std::vector<TableSpec> specs;
  for (const CollectionTableConfig& t : cfg_.tables)
    specs.push_back({t.name, t.dim, optimizer_name(t.optimizer.kind), optimizer_state_width(t.optimizer.kind, t.dim)});
  return specs;
}

namespace {
void describe(TableRows& r, const TableSpec& s) {
  r.name = s.name;
  r.dim = s.dim;
  r.optimizer = s.optimizer;
  r.state_width = s.state_width;
}
}  // namespace

// A group's rows, one TableRows per table of the group (keys untagged), described as its table.
std::vector<TableRows> EmbeddingCollection::split_rows(const Group& g, const TableRows& r) const {
  std::vector<TableSpec> specs = table_specs();
  std::vector<TableRows> out;
  for (int t : g.tables) {
    TableRows x;
    if (g.tagged) {
      std::vector<bool> keep(r.rows());
      for (size_t i = 0; i < r.rows(); ++i) keep[i] = g.table_key(r.keys[i]).first == t;
      x = select_rows(r, keep);
      for (int64_t& k : x.keys) k = g.table_key(k).second;
    } else {
      x = r;
    }
    describe(x, specs[size_t(t)]);
    out.push_back(std::move(x));
  }
  return out;
}

std::vector<TableRows> EmbeddingCollection::rows_to_save() {
  SPARTA_REQUIRE(!ahead_.looked_up, "embedding collection rows_to_save: a batch was looked up ahead (look_up_ahead): "
                                    "its lookups may have added rows; its forward comes first");
  std::vector<TableRows> out(cfg_.tables.size());
  for (const auto& g : groups_) {
    std::vector<TableRows> parts = split_rows(*g, g->placed->rows_to_save());
    for (size_t j = 0; j < parts.size(); ++j) out[size_t(g->tables[j])] = std::move(parts[j]);
  }
  return out;
}

TableRows EmbeddingCollection::held_rows(int table) {
  const Group& g = *groups_.at(size_t(group_of_.at(size_t(table))));
  std::vector<TableRows> parts = split_rows(g, g.placed->held_rows());
  for (size_t j = 0; j < parts.size(); ++j)
    if (g.tables[j] == table) return parts[j];
  SPARTA_ASSERT(false, "table %d is not in its group", table);
  return {};
}

int EmbeddingCollection::owner_of(int table, int64_t key) const {
  const Group& g = *groups_.at(size_t(group_of_.at(size_t(table))));
  return g.placed->owner_of(g.group_key(table, key));
}

void EmbeddingCollection::load_rows(const std::vector<TableRows>& tables) {
  SPARTA_REQUIRE(tables.size() == cfg_.tables.size(), "embedding collection: rows of %zu tables for %zu",
                 tables.size(), cfg_.tables.size());
  std::vector<TableSpec> specs = table_specs();
  for (const auto& g : groups_) {
    TableRows merged;
    describe(merged, specs[size_t(g->tables[0])]);
    for (int t : g->tables) {
      const TableRows& r = tables[size_t(t)];
      const CollectionTableConfig& c = cfg_.tables[size_t(t)];
      const int sw = optimizer_state_width(c.optimizer.kind, c.dim);
      SPARTA_REQUIRE(r.rows() == 0 || (r.dim == c.dim && r.state_width == sw &&
                                       r.values.size() == r.rows() * size_t(c.dim) &&
                                       r.state.size() == r.rows() * size_t(sw)),
                     "table '%s': rows of dim %d, state width %d (%zu values, %zu state floats for %zu keys); the "
                     "table has dim %d, state width %d",
                     c.name.c_str(), r.dim, r.state_width, r.values.size(), r.state.size(), r.rows(), c.dim, sw);
      for (int64_t k : r.keys) {
        if (g->tagged)
          SPARTA_REQUIRE(k >= 0 && k < c.key_bound, "table '%s': key %lld outside [0, %lld) (its key_bound)",
                         c.name.c_str(), (long long)k, (long long)c.key_bound);
        int o = owner_of(t, k);
        SPARTA_REQUIRE(o == rank() || o == kAllRanks, "table '%s': rank %d was given key %lld, which rank %d owns",
                       c.name.c_str(), rank(), (long long)k, o);
      }
      for (int64_t k : r.keys) merged.keys.push_back(g->group_key(t, k));
      merged.values.insert(merged.values.end(), r.values.begin(), r.values.end());
      merged.state.insert(merged.state.end(), r.state.begin(), r.state.end());
    }
    try {
      g->placed->load_rows(merged);
    } catch (const Error& e) {
      throw Error(g->name + ": " + e.what());
    }
  }
}

std::string EmbeddingCollection::save(const std::string& root, CheckpointMeta meta) {
  meta.plan = plan_summary(cfg_, plan_);
  return save_checkpoint(world_, root, meta, {}, rows_to_save());
}

CheckpointMeta EmbeddingCollection::load(const std::string& path) {
  ModelSpec spec;
  spec.tables = table_specs();
  LoadedCheckpoint c =
      load_checkpoint(world_, path, spec, [this](int table, int64_t key) { return owner_of(table, key); });
  ex_->agree(guarded([&] { load_rows(c.tables); }));
  return c.manifest.meta;
}

}  // namespace sparta
