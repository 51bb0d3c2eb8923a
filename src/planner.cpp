// planner.cpp: see planner.h; the cost model is in experiments/PLANNER.md.
#include "src/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/placement_common.h"
#include "kernels/atomic_sgd.h"
#include "src/base/deadline.h"
#include "kernels/embedding_backward.h"

namespace sparta {

void check_collection_config(const CollectionConfig& cfg) {
  SPARTA_REQUIRE(cfg.num_slots >= 1, "embedding collection: num_slots must be >= 1, found %d", cfg.num_slots);
  SPARTA_REQUIRE(!cfg.tables.empty(), "embedding collection: no tables");
  SPARTA_REQUIRE(cfg.shard_slack >= 1.0, "embedding collection: shard_slack must be >= 1, found %g", cfg.shard_slack);
  SPARTA_REQUIRE(cfg.exchange == DataType::f32 || cfg.exchange == DataType::bf16,
                 "embedding collection: exchange must be float32 or bfloat16, found %s", dtype_name(cfg.exchange));
  SPARTA_REQUIRE(cfg.output == OutputType::f32 || cfg.output == OutputType::bf16 || cfg.output == OutputType::f16,
                 "embedding collection: output must be f32, bf16 or f16, found output type %d", int(cfg.output));
  std::vector<int> served(size_t(cfg.num_slots), -1);
  std::set<std::string> names;
  for (size_t i = 0; i < cfg.tables.size(); ++i) {
    const CollectionTableConfig& t = cfg.tables[i];
    const char* n = t.name.c_str();
    SPARTA_REQUIRE(!t.name.empty() && t.name.find_first_of(" :/") == std::string::npos,
                   "embedding collection: table %zu: name '%s' must be nonempty without spaces, ':' or '/'", i, n);
    SPARTA_REQUIRE(names.insert(t.name).second, "embedding collection: two tables named '%s'", n);
    SPARTA_REQUIRE(t.rows >= 1, "table '%s': rows must be >= 1, found %lld", n, (long long)t.rows);
    SPARTA_REQUIRE(t.dim >= 1 && t.dim <= 256, "table '%s': dim must be in 1..256, found %d", n, t.dim);
    SPARTA_REQUIRE(t.key_bound >= 0, "table '%s': key_bound must be >= 0 (0: unbounded), found %lld", n,
                   (long long)t.key_bound);
    SPARTA_REQUIRE(t.hot_rows >= 0, "table '%s': hot_rows must be >= 0, found %lld", n, (long long)t.hot_rows);
    SPARTA_REQUIRE(!t.direct_index || (t.key_bound > 0 && t.rows == t.key_bound),
                   "table '%s': a direct index holds every key of [0, key_bound): it needs key_bound > 0 and rows == "
                   "key_bound, found key_bound %lld and rows %lld",
                   n, (long long)t.key_bound, (long long)t.rows);
    SPARTA_REQUIRE(!t.slots.empty(), "table '%s': serves no slot", n);
    for (int s : t.slots) {
      SPARTA_REQUIRE(s >= 0 && s < cfg.num_slots, "table '%s': slot %d outside [0, %d)", n, s, cfg.num_slots);
      SPARTA_REQUIRE(served[s] < 0, "table '%s': slot %d is already served by table '%s'", n, s,
                     cfg.tables[size_t(served[s])].name.c_str());
      served[s] = static_cast<int>(i);
    }
  }
  for (int s = 0; s < cfg.num_slots; ++s)
    SPARTA_REQUIRE(served[s] >= 0, "embedding collection: slot %d is served by no table", s);
  int64_t width = 0;
  for (const CollectionTableConfig& t : cfg.tables) width += int64_t(t.dim) * int64_t(t.slots.size());
  SPARTA_REQUIRE(cfg.output_col >= 0 && (cfg.output_row == 0 ? cfg.output_col == 0 : cfg.output_row >= cfg.output_col + width),
                 "embedding collection: the output's rows (output_row %lld values, the slots from column output_col "
                 "%lld) must hold the %lld values of a sample (output_row 0: exactly those, from column 0)",
                 (long long)cfg.output_row, (long long)cfg.output_col, (long long)width);
}

// ----------------------------------------------------------------------------
// key statistics

namespace {
// Sorts keys and counts each: (key, count) pairs, keys ascending.
std::vector<std::pair<int64_t, int64_t>> run_lengths(std::vector<int64_t>& keys) {
  std::sort(keys.begin(), keys.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < keys.size();) {
    size_t j = i;
    while (j < keys.size() && keys[j] == keys[i]) ++j;
    out.emplace_back(keys[i], int64_t(j - i));
    i = j;
  }
  return out;
}
}  // namespace

std::vector<TableKeyStats> count_keys(MPI_Comm comm, const CollectionConfig& cfg, const std::vector<int64_t>& offsets,
                                      const std::vector<int64_t>& keys, int64_t batch, size_t max_top) {
  const size_t T = cfg.tables.size();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> counts(T);  // this rank's (key, count), keys ascending
  std::vector<int64_t> nkeys(T, 0);
  agree_on_error(comm, guarded([&] {
    check_collection_config(cfg);
    const int64_t rows = batch * cfg.num_slots;
    SPARTA_REQUIRE(batch >= 0 && offsets.size() == size_t(rows) + 1,
                   "key statistics: offsets must have batch * num_slots + 1 = %lld entries, found %zu",
                   (long long)(rows + 1), offsets.size());
    SPARTA_REQUIRE(offsets[0] == 0 && offsets.back() == int64_t(keys.size()),
                   "key statistics: offsets must run from 0 to the key count %zu, found %lld .. %lld", keys.size(),
                   (long long)offsets[0], (long long)offsets.back());
    for (int64_t r = 0; r < rows; ++r)
      SPARTA_REQUIRE(offsets[r] <= offsets[r + 1], "key statistics: offsets decrease at row %lld", (long long)r);
    for (size_t t = 0; t < T; ++t) {
      std::vector<int64_t> mine;
      for (int64_t s = 0; s < batch; ++s)
        for (int slot : cfg.tables[t].slots) {
          int64_t r = s * cfg.num_slots + slot;
          mine.insert(mine.end(), keys.begin() + offsets[r], keys.begin() + offsets[r + 1]);
        }
      nkeys[t] = int64_t(mine.size());
      counts[t] = run_lengths(mine);
    }
  }));
  int world = 1;
  MPI_CHECK(MPI_Comm_size(comm, &world));
  int64_t samples = batch;
  timed_allreduce(MPI_IN_PLACE, &samples, 1, MPI_INT64_T, MPI_SUM, comm, "planner key statistics (samples)");
  std::vector<TableKeyStats> out(T);
  for (size_t t = 0; t < T; ++t) {
    // every rank's (key, count) pairs to every rank, merged
    std::vector<int64_t> mine;
    for (const auto& kc : counts[t]) mine.push_back(kc.first), mine.push_back(kc.second);
    int n = static_cast<int>(mine.size());
    std::vector<int> sizes(static_cast<size_t>(world), 0), displs(static_cast<size_t>(world), 0);
    timed_allgather(&n, 1, MPI_INT, sizes.data(), 1, comm, "planner key statistics (sizes)");
    int sum = 0;
    for (int r = 0; r < world; ++r) displs[r] = sum, sum += sizes[r];
    std::vector<int64_t> all(size_t(std::max(sum, 1)));
    timed_allgatherv(mine.data(), n, MPI_INT64_T, all.data(), sizes.data(), displs.data(), comm,
                     "planner key statistics (counts)");
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (int i = 0; i + 1 < sum; i += 2) pairs.emplace_back(all[i], all[i + 1]);
    std::sort(pairs.begin(), pairs.end());
    TableKeyStats& st = out[t];
    st.samples = samples;
    st.keys = nkeys[t];
    timed_allreduce(MPI_IN_PLACE, &st.keys, 1, MPI_INT64_T, MPI_SUM, comm, "planner key statistics (keys)");
    for (const auto& kc : pairs)  // the ranks' counts of a key summed, keys ascending
      if (!st.top.empty() && st.top.back().first == kc.first) st.top.back().second += kc.second;
      else st.top.push_back(kc);
    std::stable_sort(st.top.begin(), st.top.end(), [](const std::pair<int64_t, int64_t>& a,
                                                     const std::pair<int64_t, int64_t>& b) {
      return a.second > b.second;  // keys ascending among equal counts (kept by the stable sort)
    });
    if (st.top.size() > max_top) st.top.resize(max_top);
  }
  return out;
}

// ----------------------------------------------------------------------------
// cost model

namespace {
// Expected distinct keys among `draws` lookups drawn from the counted frequencies, the first `skip` of `top`
// left out (they are looked up elsewhere): sum over keys of 1 - (1 - p)^draws; the share of lookups no counted key
// covers is taken as all distinct. Without statistics: every lookup distinct.
double expected_distinct(const TableKeyStats& st, double draws, size_t skip) {
  if (st.keys <= 0) return draws;
  double covered = 0, distinct = 0;
  for (size_t i = 0; i < st.top.size(); ++i) {
    const double p = double(st.top[i].second) / double(st.keys);
    covered += p;
    if (i >= skip) distinct += 1.0 - std::pow(1.0 - p, draws);
  }
  return distinct + std::max(0.0, 1.0 - covered) * draws;
}
}  // namespace

namespace {
// The share of lookups the first hot_rows counted keys take.
double hot_share(const TableKeyStats& stats, int64_t hot_rows) {
  double covered = 0;
  for (size_t i = 0; i < size_t(std::max<int64_t>(0, hot_rows)) && i < stats.top.size() && stats.keys > 0; ++i)
    covered += double(stats.top[i].second) / double(stats.keys);
  return covered;
}

// The counts the working memory is sized by (placement_cost's): local keys and bags, distinct local keys, the
// key % world shard's rows, the hot rows and the share of lookups they take (hybrid).
struct WorkCounts {
  double K, P, U;
  int64_t shard, hot;
  double hot_share;
};

// PlacementCost::work_busiest and work_every: the buffers each placement grows (src/placement_*.cpp), element
// counts times bytes, at the expected counts, and the backward workspaces of the table and of its gradient sums.
// Data-dependent counts (keys received from other ranks) are taken at their expectation: each rank's distinct
// keys spread evenly over the owners.
void work_memory(PlacementCost& c, const CollectionTableConfig& t, Placement p, const PlannerOptions& opt,
                 const WorkCounts& n) {
  const double W = opt.world, v = 4.0 * t.dim, K = n.K, P = n.P, U = n.U;
  auto ws = [&](double keys, double rows) {  // a BackwardWorkspace for `keys` keys into `rows` rows
    const int64_t k = int64_t(std::min(std::ceil(std::max(1.0, keys)), double(kBackwardMaxKeys)));
    const int64_t r = int64_t(std::min(std::ceil(std::max(1.0, rows)), double(kBackwardMaxRows)));
    return double(BackwardWorkspace::bytes(opt.backend, k, r, t.dim));
  };
  // DispatchShard for k keys of u distinct ones, receiving r keys: the keys' distinct set (5 x k), the route of
  // the distinct keys (4 x u), two routes (route ahead: send and received keys, each key's vector row), the
  // received keys' rows and bag ids, the vectors both ways, the gradient sums (GroupSums: workspace, ids, sums)
  // and the owner's update workspace.
  auto dispatch = [&](double k, double u, double r, double shard_rows) {
    return 40 * k + 28 * u + 2 * (8 * u + 8 * r + 8 * k) + 16 * r + r * v + u * v + ws(k, u) + 8 * k + k * v +
           ws(r, shard_rows);
  };
  double busiest = 0, every = 0;
  // the collection's cut of this table's bags out of the batch (two sets: one routed ahead) and its pooled
  // vectors and their gradients (src/embedding_collection.cpp), on every rank
  const double cut = 2 * (8 * (P + 1) + 8 * K) + P * v;
  switch (p) {
    case Placement::dispatch:
      busiest = every = dispatch(K, U, U, double(n.shard));
      break;
    case Placement::distributed:
      // keys' bags, owners and order (36 x K), the received keys, bags and rows, every rank's bag offsets and
      // partial sums, this rank's pooled share, the owner's update workspace
      busiest = every = 36 * K + 24 * K + 8 * W * P + W * P * v + P * v + ws(K, double(n.shard));
      break;
    case Placement::replicated:
      // this rank's distinct keys, their gradient sums and rows; every rank's keys, sums, rows and bag ids; one
      // workspace for the larger of the two backwards
      busiest = every = K * (16 + v) + W * U * (24 + v) + ws(std::max(K, W * U), double(t.rows));
      break;
    case Placement::localized:
      // the owner: every rank's lengths, keys, offsets, rows and pooled vectors, its own blocks, its update
      // workspace; another rank: its lengths, blocks and keys
      busiest = 8 * P + 16 * W * P + 16 * W * K + W * P * v + P * (8 + v) + 8 * K + ws(W * K, double(t.rows));
      every = opt.world == 1 ? busiest : 8 * P + P * (8 + v) + 8 * K;
      break;
    case Placement::hybrid: {
      const double Kh = K * n.hot_share, Kc = K - Kh, H = double(n.hot);
      // the split into hot and cold keys (52 x K) and its vectors, the bags' hot and cold offsets and scaled
      // gradients, the hot keys' ids, sums (GroupSums), touched rows, vectors and gradients, the hot copy's
      // update workspace; the cold keys as dispatch
      busiest = every = 52 * K + K * v + P * (16 + v) + 12 * Kh + ws(Kh, H) + Kh * (8 + v) + H * (16 + v) +
                        H * (24 + 2 * v) + ws(H, H) + dispatch(Kc, std::min(U, Kc), std::min(U, Kc), double(n.shard));
      break;
    }
  }
  c.work_busiest = size_t(std::ceil(busiest + cut));
  c.work_every = size_t(std::ceil(every + cut));
}
}  // namespace

void check_planner_rates(const PlannerRates& r) {
  auto ok = [](double x) { return x > 0 && std::isfinite(x); };
  SPARTA_REQUIRE(ok(r.link_GBps), "planner: link_GBps must be > 0, found %g", r.link_GBps);
  SPARTA_REQUIRE(ok(r.hbm_GBps), "planner: hbm_GBps must be > 0, found %g", r.hbm_GBps);
  SPARTA_REQUIRE(ok(r.host_GBps), "planner: host_GBps must be > 0, found %g", r.host_GBps);
  SPARTA_REQUIRE(ok(r.collective_us), "planner: collective_us must be > 0, found %g", r.collective_us);
  SPARTA_REQUIRE(ok(r.group_us), "planner: group_us must be > 0, found %g", r.group_us);
}

// The local passes, in device bytes read plus written (experiments/PLANNER.md). n keys, p bags, r rows.
namespace {
constexpr double kKeyPass = 16;           // one pass over n 8-byte keys or indices: read and written
constexpr double kSort = 4 * kKeyPass;    // a sort of n keys (or row ids) with their positions
struct Local {
  double v, s;  // bytes of a vector (fp32, as lookups give and gradients come), of a row's optimizer state
  bool atomic;  // sgd's atomic_update: no sort; each key's row read and written by its atomic add
  bool marked;  // ... after a marking pass over the keys' rows (dims >= kAtomicSgdMarkedDim)
  double rv;    // bytes of a stored row (2 an element with 16-bit storage)
  double lookup_pooled(double n, double p) const { return kKeyPass * n + n * rv + p * v; }  // probe, rows, out
  double lookup_keys(double n) const { return kKeyPass * n + n * rv + n * v; }              // probe, rows, out
  // backward_and_update: the rows sorted, each key's gradient read, the touched rows' values and state updated
  double update(double n, double r) const {
    return atomic ? n * v + 2 * n * rv + (marked ? kKeyPass * n : 0) : kSort * n + n * v + r * (2 * rv + 2 * s);
  }
};
}  // namespace

PlacementCost placement_cost(const CollectionTableConfig& t, Placement p, const PlannerOptions& opt,
                             const TableKeyStats& stats, int64_t hot_rows, double shard_slack) {
  check_planner_rates(opt.rates);
  const double W = opt.world;
  const double b = std::ceil(double(opt.global_batch) / W);                  // local samples
  const double S = double(t.slots.size());                                   // bags per sample
  const double h = stats.samples > 0 ? stats.keys_per_sample() : S;          // keys per sample (hotness)
  const double K = b * h;                                                    // local keys
  const double P = b * S;                                                    // local bags
  const double v = 4.0 * t.dim;                                              // bytes of a vector
  SPARTA_REQUIRE(opt.wire_bytes > 0, "planner: wire bytes per value must be > 0, found %g", opt.wire_bytes);
  const double vw = opt.wire_bytes * t.dim;                                  // bytes of a vector on the wire
  const double f = (W - 1) / W;                                              // share of keys owned elsewhere
  const double R = double(t.rows);
  const bool atomic = t.optimizer.atomic_update;
  const Local L{v, 4.0 * optimizer_state_width(t.optimizer.kind, t.dim), atomic,
                atomic && t.dim >= kAtomicSgdMarkedDim, double(row_storage_bytes(t.storage)) * t.dim};
  const double U = std::min(R, expected_distinct(stats, K, 0));               // distinct keys of a rank
  const double Ug = std::min(R, expected_distinct(stats, W * K, 0));          // distinct keys of the global batch
  const double k = kKeyPass;
  const bool tiered = t.tier.tier == TableTier::host;
  // a host-tier table's device part on a rank of `rows`: its cache (a direct index over slots), the tier's own
  // arrays and the staging area of a call's victims (at most the rank's distinct keys); a cache of every row is an
  // HBM table (EmbeddingTable makes one)
  auto in_host = [&](int64_t rows) { return tiered && t.tier.cache_rows < rows; };
  auto mem = [&](int64_t rows) {
    if (in_host(rows))
      return table_memory_bytes(t.tier.cache_rows, t.dim, t.optimizer.kind, 1.0, true, t.storage) +
             HostTier::device_bytes(rows, t.tier.cache_rows, !t.direct_index) +
             HostTier::staging_bytes(int64_t(std::ceil(std::min(double(t.tier.cache_rows), U))),
                                     row_storage_floats(t.storage, t.dim), optimizer_state_width(t.optimizer.kind, t.dim));
    return table_memory_bytes(rows, t.dim, t.optimizer.kind, t.max_load_factor, t.direct_index, t.storage);
  };
  // a key % world shard (direct: rank 0's, the largest)
  const int64_t shard = t.direct_index ? direct_shard_rows(t.key_bound, opt.world, 0)
                                       : modulo_shard_rows(t.rows, opt.world, shard_slack);
  PlacementCost c;
  double copied = 0;  // bytes one rank's exchanges carry: with one rank, copied locally instead
  switch (p) {
    case Placement::replicated:
      c.memory_busiest = c.memory_every = mem(t.rows);
      c.bytes_per_step = 2 * (W - 1) * U * (8 + vw);  // all-gather of each rank's distinct keys and their sums
      // forward: a pooled lookup; backward: this rank's rows sorted and each key's bag gradient summed per row (U
      // sums and their keys written), every rank's U keys looked up in this copy (rows only), their W U sums
      // applied
      c.local_bytes = L.lookup_pooled(K, P) + kSort * K + K * v + U * v + k * U + k * W * U + L.update(W * U, Ug);
      c.collectives = 3;  // counts, all-gather keys, all-gather sums
      copied = 8 * U + U * v;
      break;
    case Placement::localized:
      c.memory_busiest = mem(t.rows);
      c.memory_every = opt.world == 1 ? c.memory_busiest : 0;
      // the owner receives every rank's lengths and keys and their gradients, and sends the pooled vectors
      c.bytes_per_step = (W - 1) * (b * S * 8 + K * 8 + 2 * b * S * vw);
      // lengths, the owner's offsets and pooled lookup of the global batch; its update
      c.local_bytes = k * P + k * W * P + L.lookup_pooled(W * K, W * P) + L.update(W * K, Ug);
      c.collectives = 5;  // the key counts exchanged, all-to-all of lengths, keys, pooled vectors, gradients
      copied = 8 * P + 8 * K + 2 * P * v;
      break;
    case Placement::dispatch:
      c.memory_busiest = c.memory_every = mem(shard);
      // distinct keys out, their vectors back, their gradient sums out
      c.bytes_per_step = 2 * f * U * (8 + 2 * vw);
      // forward: sort, unique, bucket by owner (3 passes over the distinct keys), where each key's vector will
      // arrive (2 passes over the distinct keys, 2 over the keys), the owner's lookup of the U keys it receives,
      // the bags pooled from the arrived vectors; backward: each distinct key's gradient summed from its bags'
      // gradients (a sort of the keys by the row their vector came in, queued in the forward; each key's bag
      // gradient read, U sums written in the order they are sent), the owner's update of its share Ug / W
      c.local_bytes = kSort * K + k * K + 3 * k * U + 2 * k * U + 2 * k * K + L.lookup_keys(U) + (K + P) * v +
                      kSort * K + (K + U) * v + L.update(U, Ug / W);
      c.collectives = 4;  // count exchange, all-to-all of keys, vectors, gradients
      copied = 8 * U + 2 * U * v;
      break;
    case Placement::distributed:
      c.memory_busiest = c.memory_every = mem(shard);
      c.bytes_per_step = 2 * f * K * 16 + 4 * (W - 1) * b * S * v;  // keys and bag ids; reduce-scatter; all-gather
      // forward: bag ids, bucket by owner (2), keys and bag ids gathered (2), the owner's offsets, its pooled
      // lookup of the K keys it receives into partial sums of all W P bags (the reduce-scatter leaves this rank's
      // share in the output); backward: bag gradients scaled (mean only: a sum's go out as they are), the
      // owner's update
      c.local_bytes = k * K + 2 * k * K + 2 * k * K + k * K + L.lookup_pooled(K, W * P) +
                      (t.combiner == Combiner::mean ? 2 * P * v : 0.0) + L.update(K, Ug / W);
      c.collectives = 5;  // count exchange, all-to-all of keys and bag ids, reduce-scatter, all-gather
      copied = 16 * K + 2 * P * v;
      break;
    case Placement::hybrid: {
      // the hot keys: an all-reduce of their [hot_rows, dim] gradient and counts; the rest: dispatch
      // the hot copy is hashed (with a direct index too: only the cold shard is direct)
      c.memory_busiest = c.memory_every =
          table_memory_bytes(std::max<int64_t>(1, hot_rows), t.dim, t.optimizer.kind, t.max_load_factor, false,
                             t.storage) + mem(shard);
      const double H = double(hot_rows);
      const double covered = hot_share(stats, hot_rows);  // share of lookups the hot keys take
      const double Kh = K * std::min(1.0, covered), Kc = K - Kh;
      const double Uc = std::min(R, expected_distinct(stats, K, size_t(hot_rows)));
      const double Ucg = std::min(R, expected_distinct(stats, W * K, size_t(hot_rows)));
      c.bytes_per_step = 4 * f * H * (v + 8) + 2 * f * Uc * (8 + 2 * vw);
      // forward: hot or cold (3 key passes), each key's place among them and its bag (4), the hot lookup, the
      // cold keys dispatched (as dispatch, less its pooling), their vectors gathered after the hot ones, the bags
      // pooled from there; backward: the hot and the cold keys' bags (2 passes over the bags), each hot key's id
      // in the hot set (4 key passes), its gradients summed per hot key (sorted, read, H sums written) into a
      // zeroed [H, dim], the touched hot keys found (3 key passes over H), gathered, looked up and updated on
      // every copy; the cold ones as dispatch
      const double fwd = 3 * k * K + 4 * k * K + L.lookup_keys(Kh) + kSort * Kc + k * Kc + 3 * k * Uc +
                         2 * k * Uc + 2 * k * Kc + L.lookup_keys(Uc) + 2 * Kc * v + (K + P) * v;
      const double bwd = 2 * k * P + 4 * k * Kh + kSort * Kh + (Kh + H) * v + 3 * H * v + 3 * k * H + 2 * H * v +
                         L.lookup_keys(H) + L.update(H, H) + kSort * Kc + (Kc + Uc) * v + L.update(Uc, Ucg / W);
      c.local_bytes = fwd + bwd;
      c.collectives = 6;  // count exchange, all-to-all of keys, vectors, gradients, all-reduce of sums and counts
      copied = 8 * Uc + 2 * Uc * v;
      break;
    }
  }
  const bool whole = p == Placement::replicated || p == Placement::localized || opt.world == 1;
  if (in_host(whole ? t.rows : shard)) {  // the rows a step touches on the busiest rank; those beyond the cache
                                          // come in and go out
    const int64_t rows = whole ? t.rows : shard;
    const double touched = whole ? Ug : p == Placement::hybrid ? std::min(R, expected_distinct(stats, W * K,
                                                                                               size_t(hot_rows))) / W
                                                                : Ug / W;
    const double miss = std::max(0.0, 1.0 - double(t.tier.cache_rows) / double(std::max<int64_t>(1, rows)));
    c.host_bytes = HostTier::host_bytes(rows, row_storage_floats(t.storage, t.dim),
                                        optimizer_state_width(t.optimizer.kind, t.dim));
    // a row moves as its record in the store (values as stored, state and use count, whole 64-byte lines), in and out
    c.host_transfer_bytes = 2 * touched * miss *
                            double(HostTier::record_bytes(row_storage_floats(t.storage, t.dim),
                                                          optimizer_state_width(t.optimizer.kind, t.dim)));
  }
  work_memory(c, t, p, opt, {K, P, U, shard, std::max<int64_t>(1, hot_rows), std::min(1.0, hot_share(stats, hot_rows))});
  c.bytes_other = c.bytes_per_step;
  c.local_other = c.local_bytes;
  const double quarter = c.bytes_per_step / 4;  // sent as much as received, forward as backward
  c.link_dir = c.link_dir_other = {quarter, quarter, quarter, quarter};
  if (p == Placement::localized && opt.world > 1) {
    c.bytes_other = c.bytes_per_step / (W - 1);  // its own bags' share of the owner's exchanges
    // forward: the owner receives every rank's lengths and keys and sends back their pooled vectors; backward:
    // it receives their gradients
    const double keys = 8 * P + 8 * K, vectors = P * vw;
    c.link_dir = {(W - 1) * vectors, (W - 1) * keys, 0.0, (W - 1) * vectors};
    c.link_dir_other = {keys, vectors, vectors, 0.0};
    // In a group of several owners (src/placement_localized.cpp) every rank also cuts its bags into the owners'
    // blocks (offsets, lengths and keys) and puts the pooled vectors that come back into place and takes the
    // gradients out (read and written): counted for every localized table, though a group of one owner skips them.
    const double blocks = 2 * k * P + k * K + 4 * P * v;
    c.local_bytes += blocks;
    c.local_other = k * P + blocks;  // its lengths
  }
  if (opt.world == 1) {  // one rank: nothing moves and nothing waits on a peer
    c.bytes_per_step = 0;
    c.link_dir = c.link_dir_other = {};
    c.collectives = 0;
    if (p == Placement::replicated || p == Placement::localized)
      c.local_bytes = L.lookup_pooled(K, P) + L.update(K, Ug);  // looked up in place, updated from the bags
    else
      c.local_bytes += 2 * copied;  // the exchanges copy locally
    c.bytes_other = c.bytes_per_step;
    c.local_other = c.local_bytes;
  }
  const PlannerRates& r = opt.rates;
  c.local_bytes += c.host_transfer_bytes * r.hbm_GBps / r.host_GBps;  // as HBM bytes of the same time
  c.local_other += p == Placement::localized && opt.world > 1 ? 0.0 : c.host_transfer_bytes * r.hbm_GBps / r.host_GBps;
  c.seconds_group = c.collectives * r.collective_us * 1e-6 + r.group_us * 1e-6;
  c.seconds_per_step = c.bytes_per_step / (r.link_GBps * 1e9) + c.local_bytes / (r.hbm_GBps * 1e9) + c.seconds_group;
  return c;
}

// ----------------------------------------------------------------------------
// the plan

namespace {

struct Request {
  bool automatic = true;
  Placement placement = Placement::dispatch;
  int owner = -1;  // localized: -1 = the planner picks
};

Request parse_request(const CollectionTableConfig& t, int world) {
  Request r;
  if (t.placement == "auto") return r;
  r.automatic = false;
  std::string name = t.placement, owner;
  size_t colon = name.find(':');
  if (colon != std::string::npos) owner = name.substr(colon + 1), name = name.substr(0, colon);
  try {
    r.placement = parse_placement(name);
  } catch (const Error& e) {
    throw Error("table '" + t.name + "': " + e.what());
  }
  if (!owner.empty()) {
    SPARTA_REQUIRE(r.placement == Placement::localized, "table '%s': placement '%s' takes no owner", t.name.c_str(),
                   t.placement.c_str());
    char* end = nullptr;
    long o = std::strtol(owner.c_str(), &end, 10);
    SPARTA_REQUIRE(end && *end == 0 && o >= 0 && o < world,
                   "table '%s': localized owner must be a rank in [0, %d), found '%s'", t.name.c_str(), world,
                   owner.c_str());
    r.owner = static_cast<int>(o);
  }
  return r;
}

// The tables that run one lookup together: same placement (localized: whatever their owners), dim, combiner,
// optimizer, init_scale, max_load_factor and index kind.
std::string group_key(const CollectionTableConfig& t, Placement p) {
  const OptimizerConfig& o = t.optimizer;
  return strprintf("%s:%d:%d:%d:%d:%a:%a:%a:%a:%a:%a:%a:%a", placement_name(p), t.dim, int(t.combiner), int(o.kind),
                   int(o.atomic_update),
                   double(o.lr), double(o.momentum), double(o.beta1),
                   double(o.beta2), double(o.epsilon), double(o.initial_accumulator), double(t.init_scale),
                   t.max_load_factor) +
         std::string(t.direct_index ? ":direct" : "");  // direct-index tables group among themselves
}

// Estimates closer than this (seconds) tie: the order of preference decides.
constexpr double kTie = 1e-12;

std::string mib(double bytes) { return strprintf("%.2f MiB", bytes / (1024.0 * 1024.0)); }

// Bytes in the unit that reads best: B, KiB, MiB, GiB.
std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  return u == 0 ? strprintf("%.0f B", bytes) : strprintf("%.2f %s", bytes, units[u]);
}

// A table that fits no placement in one pass (place): the planner's error, with what make_plan needs to try the
// table in host memory (embedding.tier auto): its index and the GPU cache rows the rank's budget leaves it.
struct TableDoesNotFit : Error {
  TableDoesNotFit(const std::string& what, size_t table, int64_t cache_rows)
      : Error(what), table(table), cache_rows(cache_rows) {}
  size_t table;
  int64_t cache_rows;  // rows of values and state a host-tier cache could take beside the tier's index (0: none)
};

// One pass of the planner (make_plan): the tables largest first, each request honoured, each automatic table
// where it raises the estimate the least. opt: with the configuration's wire type (make_plan sets it).
// The placements in the order of preference where estimates tie.
constexpr Placement kPlacements[] = {Placement::replicated, Placement::localized, Placement::dispatch,
                                     Placement::distributed, Placement::hybrid};
constexpr size_t kNumPlacements = sizeof(kPlacements) / sizeof(kPlacements[0]);

// placement_cost of every table under every placement, computed once per make_plan: the passes below place the
// tables many times over.
class CostCache {
 public:
  CostCache(const CollectionConfig& cfg, const PlannerOptions& opt, const std::vector<TableKeyStats>& stats)
      : cfg_(cfg), opt_(opt), stats_(stats), costs_(cfg.tables.size() * kNumPlacements) {}
  int64_t hot_rows(size_t i) const {
    const CollectionTableConfig& t = cfg_.tables[i];
    return std::min<int64_t>(
        {t.hot_rows > 0 ? t.hot_rows : opt_.default_hot_rows, t.rows, int64_t(stats_.empty() ? 0 : stats_[i].top.size())});
  }
  const PlacementCost& get(size_t i, Placement p) {
    const size_t k = i * kNumPlacements + size_t(std::find(std::begin(kPlacements), std::end(kPlacements), p) -
                                                 std::begin(kPlacements));
    if (!costs_[k].first) {
      static const TableKeyStats none;
      costs_[k] = {true, placement_cost(cfg_.tables[i], p, opt_, stats_.empty() ? none : stats_[i], hot_rows(i),
                                        cfg_.shard_slack)};
    }
    return costs_[k].second;
  }

 private:
  const CollectionConfig& cfg_;
  const PlannerOptions& opt_;
  const std::vector<TableKeyStats>& stats_;
  std::vector<std::pair<bool, PlacementCost>> costs_;
};

Plan place(const CollectionConfig& cfg, const PlannerOptions& opt, const std::vector<TableKeyStats>& stats,
           const std::vector<Request>& req, CostCache& cache) {
  const size_t T = cfg.tables.size();
  const int W = opt.world;
  Plan plan;
  plan.tables.resize(T);

  // Largest tables first: they have the fewest placements that fit.
  std::vector<size_t> order(T);
  for (size_t i = 0; i < T; ++i) order[i] = i;
  auto size_of = [&](size_t i) {
    const CollectionTableConfig& t = cfg.tables[i];
    return table_memory_bytes(t.rows, t.dim, t.optimizer.kind, t.max_load_factor, t.direct_index);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size_of(a) > size_of(b); });

  std::vector<size_t> used(size_t(W), 0);
  std::set<std::string> groups;  // the groups opened so far (group_key)
  const size_t budget = opt.memory_budget;
  const TableKeyStats none;
  const PlannerRates& rates = opt.rates;
  // The step as the plan grows: every rank's link bytes by phase and direction (PlacementCost::link_dir) and local
  // bytes, and the groups' fixed costs.
  struct Step {
    std::vector<std::array<double, 4>> link;
    std::vector<double> local;
    double fixed = 0;
    int collectives = 0, groups = 0;
    // The link bytes of a balanced exchange (as much sent as received) that takes as long as the step's: each
    // phase lasts as long as the busiest rank's larger direction; link_GBps counts both directions.
    double max_link() const {
      double forward = 0, backward = 0;
      for (const std::array<double, 4>& d : link) {
        forward = std::max({forward, d[0], d[1]});
        backward = std::max({backward, d[2], d[3]});
      }
      return 2 * (forward + backward);
    }
    double max_local() const { return *std::max_element(local.begin(), local.end()); }
    double seconds(const PlannerRates& r) const {
      return max_link() / (r.link_GBps * 1e9) + max_local() / (r.hbm_GBps * 1e9) + fixed;
    }
  };
  Step step{std::vector<std::array<double, 4>>(size_t(W), std::array<double, 4>{}),
            std::vector<double>(size_t(W), 0.0)};
  // The step with table t placed at p (owner: localized), opening its group when it is not open yet.
  auto with = [&](const Step& s, const CollectionTableConfig& t, const PlacementCost& c, Placement p, int owner) {
    Step n = s;
    for (int r = 0; r < W; ++r) {
      const bool other = p == Placement::localized && r != owner;
      for (int d = 0; d < 4; ++d) n.link[size_t(r)][size_t(d)] += other ? c.link_dir_other[size_t(d)] : c.link_dir[size_t(d)];
      n.local[size_t(r)] += other ? c.local_other : c.local_bytes;
    }
    if (!groups.count(group_key(t, p))) n.fixed += c.seconds_group, n.collectives += c.collectives, ++n.groups;
    return n;
  };
  for (size_t i : order) {
    const CollectionTableConfig& t = cfg.tables[i];
    const TableKeyStats& st = stats.empty() ? none : stats[i];
    const int64_t hot_rows = cache.hot_rows(i);
    // Candidates in order of preference where the times tie.
    std::vector<Placement> cands;
    if (req[i].automatic) {
      cands = {Placement::replicated, Placement::localized, Placement::dispatch, Placement::distributed};
      if (hot_rows > 0) cands.push_back(Placement::hybrid);
    } else {
      cands = {req[i].placement};
    }
    struct Option {
      Placement p;
      PlacementCost cost;
      int owner;
      size_t shortfall;  // bytes over the budget on the fullest rank (0: fits)
      double seconds;    // what the table adds to the step's estimate
    };
    auto shortfall = [&](Placement p, const PlacementCost& c, int owner) {
      size_t over = 0;
      if (budget > 0)
        for (int r = 0; r < W; ++r) {
          const bool holder = p == Placement::localized && r == owner;
          size_t need = used[r] + (holder ? c.memory_busiest + c.work_busiest : c.memory_every + c.work_every);
          if (need > budget) over = std::max(over, need - budget);
        }
      return over;
    };
    // The option that adds the least among those that fit (the first of those within kTie of it), else the
    // one that comes closest to fitting.
    auto better = [](const Option& a, const Option* b) {
      if (!b) return true;
      if ((a.shortfall == 0) != (b->shortfall == 0)) return a.shortfall == 0;
      return a.shortfall == 0 ? a.seconds < b->seconds - kTie : a.shortfall < b->shortfall;
    };
    const double now = step.seconds(rates);
    std::vector<Option> opts;
    for (Placement p : cands) {
      const PlacementCost& c = cache.get(i, p);
      std::vector<int> owners = {0};
      if (p == Placement::localized && req[i].owner >= 0) owners = {req[i].owner};
      if (p == Placement::localized && req[i].owner < 0) {  // every rank: least memory placed, then the lowest
        owners.resize(size_t(W));
        for (int r = 0; r < W; ++r) owners[size_t(r)] = r;
        std::stable_sort(owners.begin(), owners.end(), [&](int x, int y) { return used[x] < used[y]; });
      }
      Option best{};  // the owner that raises the estimate the least
      for (size_t j = 0; j < owners.size(); ++j) {
        const int o = owners[j];
        const Option e{p, c, o, shortfall(p, c, o), with(step, t, c, p, o).seconds(rates) - now};
        if (j == 0 || better(e, &best)) best = e;
      }
      opts.push_back(best);
    }
    const Option* pick = nullptr;
    for (const Option& o : opts)
      if (o.shortfall == 0 && better(o, pick)) pick = &o;
    if (!pick) {
      const Option* best = &opts[0];
      for (const Option& o : opts)
        if (o.shortfall < best->shortfall) best = &o;
      // an HBM table that does not fit could live in host memory under a cache of what is left on the rank
      const size_t used_max = *std::max_element(used.begin(), used.end());
      const size_t left = budget > used_max + best->cost.work_busiest ? budget - used_max - best->cost.work_busiest : 0;
      // (the tier's index takes a slot per row, and a hashed table's key index, whatever the cache; each cache row
      // its values and state and HostTier::kSlotWords words of bookkeeping)
      const size_t index = HostTier::device_bytes(t.rows, 0, !t.direct_index);
      const double row_bytes = double(row_storage_bytes(t.storage)) * t.dim +
                               double(optimizer_state_width(t.optimizer.kind, t.dim)) * sizeof(float);
      const double cache = left > index ? double(left - index) * row_bytes /
                                              (row_bytes + HostTier::kSlotWords * sizeof(int64_t))
                                        : 0.0;
      const std::string hint =
          t.tier.tier != TableTier::hbm ? std::string()
          : cache >= row_bytes
              ? strprintf("; or keep its rows in host memory under a GPU cache: embedding.tier host with "
                          "embedding.cache_mb below %s (bench_collection, bench_train: --tier host --cache-gb), or "
                          "embedding.tier auto",
                          mib(cache).c_str())
              : strprintf("; in host memory under a GPU cache (embedding.tier host) its index alone would take %s: "
                          "use more ranks or a direct index",
                          mib(double(index)).c_str());
      throw TableDoesNotFit(strprintf(
          "planner: table '%s' (%lld rows, dim %d, %s) does not fit: %s placement needs %s (%zu bytes) more than the "
          "memory budget of %s (%zu bytes) per rank (tables placed before it use up to %s on a rank; the table's "
          "rows, state and index take %s, its workspaces and route buffers %s)%s",
          t.name.c_str(), (long long)t.rows, t.dim, optimizer_name(t.optimizer.kind), placement_name(best->p),
          mib(double(best->shortfall)).c_str(), best->shortfall, mib(double(budget)).c_str(), budget,
          mib(double(*std::max_element(used.begin(), used.end()))).c_str(),
          mib(double(best->cost.memory_busiest)).c_str(), mib(double(best->cost.work_busiest)).c_str(),
          req[i].automatic ? " (the placement that comes closest)" : "") + hint,
          i, int64_t(cache / row_bytes));
    }
    TablePlan& tp = plan.tables[i];
    tp.placement = pick->p;
    tp.owner = pick->p == Placement::localized ? pick->owner : 0;
    tp.memory_bytes = pick->cost.memory_busiest;
    tp.work_bytes = pick->cost.work_busiest;
    tp.host_bytes = pick->cost.host_bytes;
    tp.host_transfer_bytes = pick->cost.host_transfer_bytes;
    tp.work_bytes_other = pick->p == Placement::localized ? pick->cost.work_every : pick->cost.work_busiest;
    tp.bytes_per_step = pick->cost.bytes_per_step;
    tp.seconds_per_step = pick->seconds;
    tp.local_bytes = pick->cost.local_bytes;
    tp.collectives = pick->cost.collectives;
    step = with(step, t, pick->cost, pick->p, tp.owner);
    tp.opens_group = groups.insert(group_key(t, pick->p)).second;
    if (pick->p == Placement::hybrid) {
      for (int64_t k = 0; k < hot_rows; ++k) tp.hot_keys.push_back(st.top[size_t(k)].first);
      std::sort(tp.hot_keys.begin(), tp.hot_keys.end());
    }
    for (int r = 0; r < W; ++r)
      used[r] += pick->p == Placement::localized && r == tp.owner
                     ? pick->cost.memory_busiest + pick->cost.work_busiest
                     : pick->cost.memory_every + pick->cost.work_every;
  }
  plan.estimate = {step.max_link(), step.max_local(), step.collectives, step.groups, step.seconds(rates)};
  return plan;
}

// make_plan with every table's tier fixed (none automatic).
Plan plan_with_tiers(const CollectionConfig& cfg, const PlannerOptions& opt, const std::vector<TableKeyStats>& stats) {
  check_collection_config(cfg);
  SPARTA_REQUIRE(opt.world >= 1 && opt.global_batch >= 1, "planner: world %d and global batch %lld must be >= 1",
                 opt.world, (long long)opt.global_batch);
  SPARTA_REQUIRE(stats.empty() || stats.size() == cfg.tables.size(), "planner: key statistics of %zu tables for %zu",
                 stats.size(), cfg.tables.size());
  check_planner_rates(opt.rates);
  PlannerOptions wire_opt = opt;  // the exchanges' wire type is the configuration's
  wire_opt.wire_bytes = double(dtype_size(cfg.exchange));
  const size_t T = cfg.tables.size();
  std::vector<Request> req(T);
  for (size_t i = 0; i < T; ++i) req[i] = parse_request(cfg.tables[i], opt.world);
  CostCache cache(cfg, wire_opt, stats);
  Plan best = place(cfg, wire_opt, stats, req, cache);  // a plan that does not fit throws here
  // Every automatic table in one placement, for each placement (hybrid: the tables with counted keys): a pass
  // places one table at a time, and a placement whose fixed costs pay off only over many tables (localized,
  // whose owners look up side by side) can lose at every table and still make the faster plan.
  // The lowest estimate that fits wins; ties keep the first pass's plan.
  for (Placement p : kPlacements) {
    std::vector<Request> all = req;
    bool any = false;
    for (size_t i = 0; i < T; ++i) {
      if (!req[i].automatic) continue;
      if (p == Placement::hybrid && (stats.empty() || stats[i].top.empty())) continue;
      all[i] = Request{false, p, -1};
      any = true;
    }
    if (!any) continue;
    try {
      Plan q = place(cfg, wire_opt, stats, all, cache);
      if (q.estimate.seconds < best.estimate.seconds - kTie) best = std::move(q);
    } catch (const Error&) {
      // does not fit the memory budget: not a candidate
    }
  }
  // Then one table at a time: each automatic table tries every other placement while the others keep theirs
  // (localized owners picked again by the pass), and a change that lowers the estimate stays; rounds until one
  // changes nothing. A mix that neither the pass nor one placement for all finds (one hot table distributed
  // among localized ones) is found so.
  //
  // A table that would open a group of its own pays the group's fixed cost alone, which one table's bytes may not
  // repay where several tables' do (DCNv2's 18 small tables replicated beside the large ones localized on 2 ranks:
  // no single one pays for the replicated group). So each round also tries, for every placement, the tables
  // ranked by what moving each alone to it does to the estimate, and moves the best k of them together, the k
  // that lowers the estimate most.
  std::vector<Request> cur = req;
  for (size_t i = 0; i < T; ++i)
    if (req[i].automatic) cur[i] = Request{false, best.tables[i].placement, -1};
  auto try_plan = [&](const std::vector<Request>& trial, double& seconds) {
    try {
      Plan q = place(cfg, wire_opt, stats, trial, cache);
      seconds = q.estimate.seconds;
      return q;
    } catch (const Error&) {  // does not fit the memory budget
      seconds = std::numeric_limits<double>::infinity();
      return Plan{};
    }
  };
  // keeps the trial when it lowers the estimate
  auto keep_if_better = [&](const std::vector<Request>& trial) {
    double s;
    Plan q = try_plan(trial, s);
    if (!(s < best.estimate.seconds - kTie)) return false;
    best = std::move(q), cur = trial;
    return true;
  };
  auto may_take = [&](size_t i, Placement p) {
    return req[i].automatic && p != cur[i].placement &&
           !(p == Placement::hybrid && (stats.empty() || stats[i].top.empty()));
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < T; ++i)
      for (Placement p : kPlacements) {
        if (!may_take(i, p)) continue;
        std::vector<Request> trial = cur;
        trial[i].placement = p;
        changed |= keep_if_better(trial);
      }
    for (Placement p : kPlacements) {
      std::vector<std::pair<double, size_t>> ranked;  // (estimate with table i alone moved to p, i)
      for (size_t i = 0; i < T; ++i) {
        if (!may_take(i, p)) continue;
        std::vector<Request> trial = cur;
        trial[i].placement = p;
        double s;
        try_plan(trial, s);
        if (std::isfinite(s)) ranked.emplace_back(s, i);
      }
      std::stable_sort(ranked.begin(), ranked.end(),
                       [](const std::pair<double, size_t>& a, const std::pair<double, size_t>& b) {
                         return a.first < b.first;
                       });
      std::vector<Request> trial = cur, pick;
      Plan found;
      double found_s = best.estimate.seconds - kTie;
      for (size_t k = 0; k < ranked.size(); ++k) {  // the best k + 1 moved together
        trial[ranked[k].second].placement = p;
        if (k == 0) continue;  // one table alone: the single moves above
        double s;
        Plan q = try_plan(trial, s);
        if (s < found_s) found = std::move(q), found_s = s, pick = trial;
      }
      if (!pick.empty()) best = std::move(found), cur = pick, changed = true;
    }
  }
  // Last, the owners of the localized tables whose owner the planner picks: one table to another rank, or two
  // tables of different owners swapped, kept while that lowers the estimate. The pass picks each owner in table
  // order, where the rise is least at that table; a swap keeps the owners' slots, hence their exchanges' larger
  // directions, while it evens out their lookups (MLPerf DCNv2 on 2 ranks: 121 and 93 keys a sample before).
  std::vector<size_t> picked;  // the tables concerned
  for (size_t i = 0; i < T; ++i) {
    if (best.tables[i].placement != Placement::localized || req[i].owner >= 0) continue;
    cur[i] = Request{false, Placement::localized, best.tables[i].owner};
    picked.push_back(i);
  }
  for (bool changed = opt.world > 1; changed;) {
    changed = false;
    for (size_t a = 0; a < picked.size(); ++a) {
      const size_t i = picked[a];
      for (int r = 0; r < opt.world; ++r) {
        if (r == cur[i].owner) continue;
        std::vector<Request> trial = cur;
        trial[i].owner = r;
        changed |= keep_if_better(trial);
      }
      for (size_t z = a + 1; z < picked.size(); ++z) {
        const size_t j = picked[z];
        if (cur[i].owner == cur[j].owner) continue;
        std::vector<Request> trial = cur;
        std::swap(trial[i].owner, trial[j].owner);
        changed |= keep_if_better(trial);
      }
    }
  }
  return best;
}

}  // namespace

Plan make_plan(const CollectionConfig& cfg, const PlannerOptions& opt, const std::vector<TableKeyStats>& stats) {
  // An automatic table starts in HBM; one that fits no placement there goes to host memory under the cache asked
  // for, else under the cache the rank's budget leaves it (a little less, then smaller while it still does not
  // fit), and the plan is made again.
  CollectionConfig c = cfg;
  const size_t T = cfg.tables.size();
  std::vector<bool> automatic(T, false);
  for (size_t i = 0; i < T; ++i)
    if (c.tables[i].tier.tier == TableTier::automatic) automatic[i] = true, c.tables[i].tier.tier = TableTier::hbm;
  for (int tries = 0;; ++tries) {
    try {
      Plan plan = plan_with_tiers(c, opt, stats);
      for (size_t i = 0; i < T; ++i) plan.tables[i].tier = c.tables[i].tier;
      return plan;
    } catch (const TableDoesNotFit& e) {
      CollectionTableConfig& t = c.tables[e.table];
      const int64_t asked = cfg.tables[e.table].tier.cache_rows;
      if (!automatic[e.table] || tries > int(4 * T + 16)) throw;
      int64_t rows = 0;
      if (t.tier.tier == TableTier::hbm)
        rows = asked > 0 ? asked : int64_t(0.95 * double(e.cache_rows));
      else if (asked == 0)
        rows = std::min(e.cache_rows, t.tier.cache_rows * 3 / 4);
      if (rows < 1) throw;
      t.tier.tier = TableTier::host;
      t.tier.cache_rows = rows;
    }
  }
}

size_t device_memory_budget(MPI_Comm comm, const Device& dev, size_t reserve) {
  // the ranks of this host that drive the same device share its free memory
  MPI_Comm host = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
  int host_ranks = 1;
  MPI_CHECK(MPI_Comm_size(host, &host_ranks));
  const int mine = dev.is_cuda() ? dev.gpu : -1;
  std::vector<int> devices(size_t(host_ranks), 0);
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, devices.data(), 1, MPI_INT, host));
  MPI_CHECK(MPI_Comm_free(&host));
  const size_t sharing = size_t(std::count(devices.begin(), devices.end(), mine));
  const size_t share = device_free_bytes(dev) / std::max<size_t>(1, sharing);
  unsigned long long budget = share > reserve ? share - reserve : 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &budget, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm));
  return size_t(std::max<unsigned long long>(1, budget));
}

std::string format_plan(const CollectionConfig& cfg, const Plan& plan) {
  std::string out = strprintf("%-16s %12s %5s %-12s %10s %16s %18s %14s %s\n", "table", "rows", "dim", "placement",
                              "owner", "memory/rank", "bytes/step", "est. ms/step", "tier");
  double every = 0;             // memory on every rank
  std::map<int, double> owned;  // localized owner → its tables' memory
  for (size_t i = 0; i < cfg.tables.size() && i < plan.tables.size(); ++i) {
    const CollectionTableConfig& t = cfg.tables[i];
    const TablePlan& p = plan.tables[i];
    std::string owner = p.placement == Placement::localized ? std::to_string(p.owner)
                        : p.placement == Placement::replicated ? "all"
                        : p.placement == Placement::hybrid     ? "all/key%W"
                                                               : "key%W";
    std::string name = placement_name(p.placement);
    if (p.placement == Placement::hybrid) name += strprintf("(%zu)", p.hot_keys.size());
    // a host-tier table: its cache's rows, its host bytes per rank and its host<->GPU bytes per step
    // (embedding.tier auto: where the planner put it, marked "(auto)")
    const TierConfig& tc = planned_tier(t, p);
    const std::string tier = (tc.tier == TableTier::hbm
                                  ? std::string("hbm")
                                  : strprintf("host cache %lld rows, host %s, %s/step in+out",
                                              (long long)tc.cache_rows, human(double(p.host_bytes)).c_str(),
                                              human(p.host_transfer_bytes).c_str())) +
                             (t.tier.tier == TableTier::automatic ? " (auto)" : "");
    out += strprintf("%-16s %12lld %5d %-12s %10s %16s %18s %14.3f %s\n", t.name.c_str(), (long long)t.rows, t.dim,
                     name.c_str(), owner.c_str(), human(double(p.memory_bytes)).c_str(), human(p.bytes_per_step).c_str(),
                     p.seconds_per_step * 1e3, tier.c_str());
    (p.placement == Placement::localized ? owned[p.owner] : every) += double(p.memory_bytes);
  }
  // the total: the fullest rank's memory, the busiest rank's bytes, the plan's estimate
  double memory = every;
  for (const auto& o : owned) memory = std::max(memory, every + o.second);
  out += strprintf("%-16s %12s %5s %-12s %10s %16s %18s %14.3f\n", "total", "", "", "", "", human(memory).c_str(),
                   human(plan.estimate.link_bytes).c_str(), plan.estimate.seconds * 1e3);
  return out;
}

std::string plan_summary(const CollectionConfig& cfg, const Plan& plan) {
  std::string out;
  for (size_t i = 0; i < cfg.tables.size() && i < plan.tables.size(); ++i) {
    const TablePlan& p = plan.tables[i];
    if (!out.empty()) out += " ";
    out += cfg.tables[i].name + ":" + placement_name(p.placement);
    if (p.placement == Placement::localized) out += ":" + std::to_string(p.owner);
  }
  return out;
}

}  // namespace sparta
