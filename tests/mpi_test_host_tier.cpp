// Tiered tables (src/host_tier.h) in a collection under every placement, on however many ranks the suite runs
// with: the same outputs, tables and evaluations as the same collection with its tables in HBM, bit for bit, for
// caches of about one batch, half the keys and every key, with fp32 and bf16 rows; and a checkpoint of the tiered collection loads into an
// HBM one (and back) with every row's bits; embedding.tier auto puts a table in host memory where the memory budget
// is short, with the same results; a traced step marks the tier's parts on the collection's timeline.
#include <mpi.h>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/base/check.h"
#include "src/embedding_collection.h"
#include "src/planner.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

const bool kSharesGpus = testing::accept_shared_gpus();

struct World {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  Device dev;
  std::unique_ptr<Communicator> communicator;
  explicit World(Backend backend) {
    rank = testing::world_rank();
    size = testing::world_size();
    Topology topo = make_topology(comm, 0);
    CommOptions o;
    if (backend == Backend::cuda) {
      dev = open_device(Backend::cuda, testing::gpu_of_local_rank(topo.host_rank));
      o.mode = testing::shared_gpus() ? CommMode::mpi : CommMode::nccl;
    } else {
      o.mode = CommMode::mpi;
    }
    o.timeout_s = 120;
    if (size > 1) communicator = std::make_unique<Communicator>(topo, dev, o);
  }
  ~World() {
    communicator.reset();
    if (dev.is_cuda()) close_device(dev);
  }
};

constexpr int kSlots = 3;
constexpr int64_t kKeys = 300;

// Two tables: a hashed one on slots 0 and 1 (adagrad), a direct index on slot 2 (rowwise adagrad, its rows stored
// as direct_storage says).
CollectionConfig make_config(uint64_t seed, const std::string& placement, int64_t cache_rows,
                             RowStorage direct_storage = RowStorage::fp32) {
  CollectionConfig c;
  c.num_slots = kSlots;
  c.seed = seed;
  CollectionTableConfig a;
  a.name = "hashed";
  a.rows = kKeys;
  a.dim = 6;
  a.combiner = Combiner::sum;
  a.optimizer.kind = OptimizerKind::adagrad;
  a.optimizer.lr = 0.05f;
  a.slots = {0, 1};
  a.placement = placement;
  CollectionTableConfig b = a;
  b.name = "direct";
  b.dim = 4;
  b.combiner = Combiner::mean;
  b.optimizer.kind = OptimizerKind::rowwise_adagrad;
  b.slots = {2};
  b.key_bound = kKeys;
  b.direct_index = true;
  b.storage = direct_storage;
  c.tables = {a, b};
  if (cache_rows > 0)
    for (auto& t : c.tables) {
      t.tier.tier = TableTier::host;
      t.tier.cache_rows = cache_rows;
      t.tier.eviction = cache_rows % 2 ? Eviction::lfu : Eviction::lru;
    }
  return c;
}

struct Batch {
  std::vector<int64_t> offsets, keys;  // this rank's samples
  int64_t samples = 0;
};

// The global batch (the same generator on every rank), this rank's slice of it: 0..3 keys per slot, skewed.
Batch make_batch(std::mt19937_64& g, int64_t global_samples, const World& w) {
  std::vector<std::vector<int64_t>> bags;
  for (int64_t s = 0; s < global_samples * kSlots; ++s) {
    std::vector<int64_t> bag(size_t(g() % 4));
    for (int64_t& k : bag) {
      const int64_t u = int64_t(g() % 1000);
      k = u * u / 3334 % kKeys;
    }
    bags.push_back(bag);
  }
  const int64_t per = global_samples / w.size, first = per * w.rank;
  Batch b;
  b.samples = w.rank == w.size - 1 ? global_samples - first : per;
  b.offsets.push_back(0);
  for (int64_t s = first * kSlots; s < (first + b.samples) * kSlots; ++s) {
    b.keys.insert(b.keys.end(), bags[size_t(s)].begin(), bags[size_t(s)].end());
    b.offsets.push_back(int64_t(b.keys.size()));
  }
  return b;
}

// The test's seed, the same on every rank.
uint64_t shared_seed(const World& w) {
  uint64_t seed = testing::seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, w.comm);
  return seed;
}

// Every placement, each table of a localized one on the last rank.
std::vector<std::string> every_placement(const World& w) {
  return {"dispatch", "localized:" + std::to_string(w.size - 1), "distributed", "replicated", "hybrid"};
}

Plan plan_of(const CollectionConfig& cfg, const World& w, const Batch& sample) {
  std::vector<TableKeyStats> stats = count_keys(w.comm, cfg, sample.offsets, sample.keys, sample.samples, 64);
  PlannerOptions po;
  po.world = w.size;
  po.global_batch = 8 * w.size;
  return make_plan(cfg, po, stats);
}

bool same_tables(EmbeddingCollection& a, EmbeddingCollection& b) {
  bool ok = true;
  for (int t = 0; t < 2; ++t) {
    auto x = testing::rows_by_key(a.held_rows(t)), y = testing::rows_by_key(b.held_rows(t));
    ok = ok && x.size() == y.size();
    for (auto& e : x) ok = ok && y.count(e.first) && testing::same_bits(e.second, y[e.first]);
  }
  return ok;
}

// forward (train or eval) of one batch on a collection: its output
std::vector<float> forward(EmbeddingCollection& c, const World& w, const Batch& b, LookupMode mode) {
  Buffer<int64_t> o(w.dev, b.offsets), k(w.dev, b.keys.empty() ? std::vector<int64_t>{0} : b.keys);
  Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, b.samples * c.output_width())));
  out.fill_bytes(0xFF);
  c.forward(o.data(), k.data(), b.samples, out.data(), mode);
  std::vector<float> r = out.download();
  r.resize(size_t(b.samples * c.output_width()));
  return r;
}

// Trains both collections on the batches, the same random gradient for both at each step (from seed + 1): whether
// every train output was the same, bit for bit.
bool train_alike(EmbeddingCollection& hbm, EmbeddingCollection& tier, const World& w,
                 const std::vector<Batch>& batches, uint64_t seed) {
  std::mt19937_64 gg(seed + 1);
  bool ok = true;
  for (size_t s = 0; s < batches.size(); ++s) {
    const Batch& b = batches[s];
    ok = ok && testing::same_bits(forward(hbm, w, b, LookupMode::train), forward(tier, w, b, LookupMode::train));
    std::vector<float> grad(size_t(std::max<int64_t>(1, b.samples * hbm.output_width())));
    for (float& x : grad) x = float(int64_t(gg() % 2001) - 1000) / 1000.f;
    Buffer<float> gd(w.dev, grad);
    hbm.backward(gd.data(), int64_t(s) + 1);
    tier.backward(gd.data(), int64_t(s) + 1);
  }
  return ok;
}

void tiered_collection_equals_hbm(Backend backend) {
  World w(backend);
  const uint64_t seed = shared_seed(w);
  for (RowStorage storage : {RowStorage::fp32, RowStorage::bf16})  // the direct table's rows (16-bit: as stored)
  for (const std::string& placement : every_placement(w)) {
    std::mt19937_64 g(seed);
    const int64_t samples = 8 * w.size;
    std::vector<Batch> batches;
    for (int s = 0; s < 6; ++s) batches.push_back(make_batch(g, samples, w));
    const CollectionConfig hbm_cfg = make_config(seed, placement, 0, storage);
    const Plan plan = plan_of(hbm_cfg, w, batches[0]);
    // about one global batch's distinct keys (what a replicated table's update makes resident), half, all
    const int64_t one_batch = std::min<int64_t>(kKeys, samples * 2 * 3 + 8);
    for (int64_t cache : {one_batch, kKeys / 2, kKeys}) {
      const std::string what =
          placement + " cache " + std::to_string(cache) + " direct table " + row_storage_name(storage);
      EmbeddingCollection hbm(w.comm, w.communicator.get(), w.dev, hbm_cfg, plan);
      EmbeddingCollection tier(w.comm, w.communicator.get(), w.dev, make_config(seed, placement, cache, storage),
                               plan);
      BOOST_CHECK_LE(tier.memory_bytes(), hbm.memory_bytes());
      BOOST_CHECK_MESSAGE(testing::all_ranks(train_alike(hbm, tier, w, batches, seed)),
                          what << ": train outputs differ");
      BOOST_CHECK_MESSAGE(testing::all_ranks(same_tables(hbm, tier)), what << ": tables differ");
      std::mt19937_64 ge(seed + 2);
      const Batch e = make_batch(ge, samples, w);
      BOOST_CHECK_MESSAGE(testing::all_ranks(testing::same_bits(forward(hbm, w, e, LookupMode::eval),
                                                       forward(tier, w, e, LookupMode::eval))),
                          what << ": eval outputs differ");
      if (cache != one_batch) continue;
      // a checkpoint of the tiered collection into an HBM one under another plan, and into a tiered one
      testing::SharedTempPath dir("mpi_test_host_tier", "ckpt");
      CheckpointMeta meta;
      meta.step = 6;
      const std::string at = tier.save(dir.path, meta);
      // (distributed pools a bag's keys per owner first: its outputs are compared with distributed's own)
      const std::string moved = placement == "distributed" ? placement : "dispatch";
      CollectionConfig other = make_config(seed, moved, 0, storage);
      EmbeddingCollection loaded(w.comm, w.communicator.get(), w.dev, other, plan_of(other, w, batches[0]));
      loaded.load(at);
      CollectionConfig other_tier = make_config(seed, moved, kKeys / 3, storage);
      EmbeddingCollection loaded_tier(w.comm, w.communicator.get(), w.dev, other_tier,
                                      plan_of(other_tier, w, batches[0]));
      loaded_tier.load(at);
      BOOST_CHECK_MESSAGE(testing::all_ranks(testing::same_bits(forward(hbm, w, e, LookupMode::eval),
                                                       forward(loaded, w, e, LookupMode::eval))),
                          what << ": the checkpoint loaded into HBM tables differs");
      BOOST_CHECK_MESSAGE(testing::all_ranks(testing::same_bits(forward(hbm, w, e, LookupMode::eval),
                                                       forward(loaded_tier, w, e, LookupMode::eval))),
                          what << ": the checkpoint loaded into tiered tables differs");
    }
  }
}

// Tables whose caches hold every row are HBM tables, and group as HBM tables do (one physical table for two
// compatible direct-index tables); tables in host memory group among themselves, under one cache of their caches'
// rows; a table in HBM and one in host memory stay apart. Outputs as HBM's, bit for bit.
void full_caches_group_as_hbm(Backend backend) {
  World w(backend);
  const uint64_t seed = shared_seed(w);
  auto config = [&](int64_t cache) {
    CollectionConfig c = make_config(seed, "dispatch", cache);
    c.tables[0] = c.tables[1];  // two direct-index tables alike
    c.tables[0].name = "direct0";
    c.tables[0].slots = {0, 1};
    return c;
  };
  std::mt19937_64 g(seed);
  const Batch b = make_batch(g, 8 * w.size, w);
  const CollectionConfig hbm_cfg = config(0);
  const Plan plan = plan_of(hbm_cfg, w, b);
  EmbeddingCollection hbm(w.comm, w.communicator.get(), w.dev, hbm_cfg, plan);
  EmbeddingCollection full(w.comm, w.communicator.get(), w.dev, config(kKeys), plan);
  EmbeddingCollection half(w.comm, w.communicator.get(), w.dev, config(kKeys / 2), plan);
  CollectionConfig mixed_cfg = config(kKeys / 2);
  mixed_cfg.tables[0].tier.cache_rows = kKeys;  // in HBM
  EmbeddingCollection mixed(w.comm, w.communicator.get(), w.dev, mixed_cfg, plan);
  BOOST_CHECK_EQUAL(hbm.groups(), 1);
  BOOST_CHECK_EQUAL(full.groups(), 1);
  BOOST_CHECK_EQUAL(half.groups(), 1);
  BOOST_CHECK_EQUAL(mixed.groups(), 2);
  const std::vector<float> want = forward(hbm, w, b, LookupMode::train);
  BOOST_CHECK(testing::all_ranks(testing::same_bits(want, forward(full, w, b, LookupMode::train))));
  BOOST_CHECK(testing::all_ranks(testing::same_bits(want, forward(half, w, b, LookupMode::train))));
  BOOST_CHECK(testing::all_ranks(testing::same_bits(want, forward(mixed, w, b, LookupMode::train))));
}

// A batch with more distinct keys than a rank's cache: the same clear error on every rank, no hang.
void batch_beyond_the_cache(Backend backend) {
  World w(backend);
  const uint64_t seed = shared_seed(w);
  std::mt19937_64 g(seed);
  const Batch b = make_batch(g, 40 * w.size, w);
  const CollectionConfig cfg = make_config(seed, "replicated", 4);
  EmbeddingCollection c(w.comm, w.communicator.get(), w.dev, cfg, plan_of(cfg, w, b));
  std::string msg;
  try {
    forward(c, w, b, LookupMode::train);
  } catch (const Error& e) {
    msg = e.what();
  }
  BOOST_CHECK_MESSAGE(testing::all_ranks(msg.find("GPU cache of 4 rows") != std::string::npos), msg);
}

// embedding.tier auto under a memory budget that holds the hashed table in HBM but not the direct one after it:
// the planner puts the direct table's rows in host memory under the cache the budget leaves, the collection runs
// it so, and its outputs and tables are HBM's, bit for bit.
void auto_tier_takes_host_memory_where_hbm_is_short(Backend backend) {
  World w(backend);
  const uint64_t seed = shared_seed(w);
  auto config = [&](TableTier tier) {
    CollectionConfig c = make_config(seed, "dispatch", 0);
    for (CollectionTableConfig& t : c.tables) {
      t.dim = 64;  // rows wide enough that a cache of part of them takes less than the table
      // twice the rows of the keys drawn: on 4 ranks a shard's cache (what the budget leaves beside the tier's
      // arrays and staging) still holds a batch's distinct keys with room
      t.rows = 2 * kKeys;
      if (t.direct_index) t.key_bound = 2 * kKeys;
      t.tier = make_tier(tier, 0, 0, Eviction::lru, t.dim, optimizer_state_width(t.optimizer.kind, t.dim));
    }
    return c;
  };
  std::mt19937_64 g(seed);
  std::vector<Batch> batches;
  for (int s = 0; s < 6; ++s) batches.push_back(make_batch(g, 8 * w.size, w));
  const CollectionConfig hbm_cfg = config(TableTier::hbm), auto_cfg = config(TableTier::automatic);
  const Plan hbm_plan = plan_of(hbm_cfg, w, batches[0]);
  std::vector<TableKeyStats> stats = count_keys(w.comm, auto_cfg, batches[0].offsets, batches[0].keys,
                                                batches[0].samples, 64);
  PlannerOptions po;
  po.world = w.size;
  po.global_batch = 8 * w.size;
  size_t all = 0;
  for (const TablePlan& t : hbm_plan.tables) all += t.memory_bytes + t.work_bytes;
  po.memory_budget = all - hbm_plan.tables[1].memory_bytes / 4;  // the direct table (placed second) is short
  const Plan plan = make_plan(auto_cfg, po, stats);
  BOOST_REQUIRE(plan.tables[0].tier.tier == TableTier::hbm);
  BOOST_REQUIRE(plan.tables[1].tier.tier == TableTier::host);
  BOOST_TEST_MESSAGE("auto tier: the direct table under a cache of " << plan.tables[1].tier.cache_rows << " rows");
  BOOST_CHECK_GT(plan.tables[1].tier.cache_rows, 0);
  BOOST_CHECK_LT(plan.tables[1].tier.cache_rows, 2 * kKeys);
  EmbeddingCollection hbm(w.comm, w.communicator.get(), w.dev, hbm_cfg, hbm_plan);
  EmbeddingCollection tier(w.comm, w.communicator.get(), w.dev, auto_cfg, plan);
  BOOST_CHECK(tier.config().tables[1].tier.tier == TableTier::host);
  BOOST_CHECK_EQUAL(tier.config().tables[1].tier.cache_rows, plan.tables[1].tier.cache_rows);
  BOOST_CHECK(tier.config().tables[0].tier.tier == TableTier::hbm);
  BOOST_CHECK_MESSAGE(testing::all_ranks(train_alike(hbm, tier, w, batches, seed)), "auto tier: train outputs differ");
  BOOST_CHECK_MESSAGE(testing::all_ranks(same_tables(hbm, tier)), "auto tier: tables differ");
}

// The collection's trace (EmbeddingCollection::trace) reaches the tiered shards of every placement: a traced step
// holds each rank's tiered tables' parts ("tier NAME: keys", "looked up", "placed"), in that order on the compute
// stream; an untraced step holds none. A rank holds a shard of both tables except under localized:last, where
// only the last rank does (hybrid: its cold shard in host memory, its hot copy in HBM).
void tier_parts_on_the_timeline(Backend backend) {
  World w(backend);
  const uint64_t seed = shared_seed(w);
  for (const std::string& placement : every_placement(w)) {
    std::mt19937_64 g(seed);
    const int64_t samples = 8 * w.size;
    std::vector<Batch> batches;
    for (int s = 0; s < 4; ++s) batches.push_back(make_batch(g, samples, w));
    // tables of ten times the keys drawn, so that every shard of every placement (at most 4 ranks) has more rows
    // than its cache of about one global batch's distinct keys (what a replicated table's update makes resident),
    // and is in host memory
    auto sized = [&](int64_t cache) {
      CollectionConfig cfg = make_config(seed, placement, cache);
      for (CollectionTableConfig& t : cfg.tables) {
        t.rows = 10 * kKeys;
        if (t.direct_index) t.key_bound = 10 * kKeys;
      }
      return cfg;
    };
    EmbeddingCollection c(w.comm, w.communicator.get(), w.dev, sized(samples * 2 * 3 + 8),
                          plan_of(sized(0), w, batches[0]));
    auto step = [&](const Batch& b, int64_t s) {
      (void)forward(c, w, b, LookupMode::train);
      Buffer<float> gd(w.dev, std::vector<float>(size_t(std::max<int64_t>(1, b.samples * c.output_width())), 0.5f));
      c.backward(gd.data(), s);
    };
    for (int64_t s = 0; s < 3; ++s) step(batches[size_t(s)], s + 1);
    c.trace(true);
    (void)c.read_trace();
    step(batches[3], 4);
    const std::vector<StreamClock::Point> traced = c.read_trace();
    c.trace(false);
    step(batches[0], 5);
    const bool holds = placement.rfind("localized", 0) != 0 || w.rank == w.size - 1;
    bool ok = c.read_trace().empty();
    for (const char* table : {"hashed", "direct"}) {
      // the first point of each part of this table's calls (a shard's name is its table's with a suffix)
      std::map<std::string, double> first;
      for (const StreamClock::Point& p : traced) {
        const std::string pre = std::string("tier ") + table;
        if (p.label.rfind(pre, 0) != 0) continue;
        const std::string part = p.label.substr(p.label.find(": ") + 2);
        if (!first.count(part)) first[part] = p.ms;
      }
      if (!holds) {
        ok = ok && first.empty();
        continue;
      }
      ok = ok && first.count("keys") && first.count("looked up") && first.count("placed") &&
           first["keys"] <= first["looked up"] && first["looked up"] <= first["placed"];
      if (!ok) BOOST_TEST_MESSAGE(placement << " " << table << ": " << first.size() << " parts marked");
    }
    BOOST_CHECK_MESSAGE(testing::all_ranks(ok), placement << ": the tier's parts are not on the timeline as expected");
  }
}

}  // namespace

SPARTA_MPI_BACKEND_CASES(the_tiers_parts_are_on_the_collections_timeline, tier_parts_on_the_timeline)
SPARTA_MPI_BACKEND_CASES(tiered_collection_equals_hbm_under_every_placement, tiered_collection_equals_hbm)
SPARTA_MPI_BACKEND_CASES(auto_tier_takes_host_memory_where_hbm_is_short, auto_tier_takes_host_memory_where_hbm_is_short)
SPARTA_MPI_BACKEND_CASES(a_batch_beyond_the_cache_fails_on_every_rank, batch_beyond_the_cache)
SPARTA_MPI_BACKEND_CASES(tables_whose_caches_hold_every_row_group_as_hbm_tables, full_caches_group_as_hbm)
