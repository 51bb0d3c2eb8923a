// The host tier (src/host_tier.h): a table in host memory under a GPU cache trains to the bits of the same table in
// HBM for every cache size (hashed and direct index, several optimizers, fp32 and 16-bit rows, evaluations between
// a forward and its update); its evictions follow an independent model of LRU and LFU written here; export and
// load round-trip against HBM tables; a batch larger than the cache, a full host store and a host store larger
// than the host's memory are clear errors.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "src/base/buffer.h"
#include "src/embedding_table.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

Device open(Backend b) { return open_device(b, b == Backend::cuda ? 0 : -1); }

EmbeddingTableConfig config(OptimizerKind opt, int64_t cap, bool direct, RowStorage storage = RowStorage::fp32,
                            int dim = 5) {
  EmbeddingTableConfig c;
  c.name = "clicks";
  c.table_id = 3;
  c.dim = dim;
  c.storage = storage;
  c.capacity_rows = cap;
  c.seed = testing::seed();
  c.init_scale = 0.1f;
  c.optimizer.kind = opt;
  c.optimizer.lr = 0.05f;
  c.optimizer.initial_accumulator = 0.125f;
  if (direct) c.direct_stride = 1;
  return c;
}

EmbeddingTableConfig tiered(EmbeddingTableConfig c, int64_t cache_rows, Eviction e = Eviction::lru) {
  c.tier.tier = TableTier::host;
  c.tier.cache_rows = cache_rows;
  c.tier.eviction = e;
  return c;
}

// One batch of bags: CSR offsets and keys.
struct Batch {
  std::vector<int64_t> offsets, keys;
  int64_t bags() const { return int64_t(offsets.size()) - 1; }
};

// bags of 1..3 keys, half from a small hot set (repeated across batches), half new keys of step s.
Batch make_batch(int64_t bags, int step, int64_t key_space) {
  Batch b;
  b.offsets.push_back(0);
  for (int64_t i = 0; i < bags; ++i) {
    const int64_t len = testing::random_ints(1, 1, 3)[0];
    for (int64_t j = 0; j < len; ++j) {
      const bool hot = testing::random_ints(1, 0, 1)[0] == 0;
      const int64_t k = hot ? testing::random_ints(1, 0, 15)[0]
                            : testing::random_ints(1, 16 + step * key_space / 16, 16 + (step + 1) * key_space / 16)[0];
      b.keys.push_back(std::min(k, key_space - 1));
    }
    b.offsets.push_back(int64_t(b.keys.size()));
  }
  return b;
}

bool same_rows(const TableRows& a, const TableRows& b) {
  auto x = testing::rows_by_key(a), y = testing::rows_by_key(b);
  if (x.size() != y.size()) return false;
  for (auto& e : x) {
    auto it = y.find(e.first);
    if (it == y.end() || !testing::same_bits(e.second, it->second)) return false;
  }
  return true;
}

// A train step on t: pooled forward (out returned), the given gradient, the update (in two parts when split); an
// eval lookup of other keys in between (its output returned in eval_out).
std::vector<float> step(EmbeddingTable& t, const Batch& b, const std::vector<float>& grad, int64_t s, bool split,
                        const std::vector<int64_t>& eval_keys, std::vector<float>& eval_out) {
  const Device& dev = t.device();
  Buffer<int64_t> o(dev, b.offsets), k(dev, b.keys), rows(dev, b.keys.size());
  Buffer<float> out(dev, size_t(b.bags()) * t.dim()), g(dev, grad);
  out.fill_bytes(0xFF);
  t.pooled_forward(o.data(), k.data(), b.bags(), Combiner::mean, LookupMode::train, out.data(), OutputType::f32,
                   rows.data(), MissingKey::zeros, Check::now, dev.stream);
  if (split) t.prepare_update(o.data(), rows.data(), b.bags(), int64_t(b.keys.size()), Combiner::mean, dev.stream);
  Buffer<int64_t> ek(dev, eval_keys);
  Buffer<float> eout(dev, eval_keys.size() * t.dim());
  eout.fill_bytes(0xFF);
  t.unpooled_forward(ek.data(), int64_t(eval_keys.size()), LookupMode::eval, eout.data(), OutputType::f32, nullptr,
                     MissingKey::zeros, Check::now, dev.stream);
  eval_out = eout.download();
  if (split)
    t.finish_update(o.data(), rows.data(), b.bags(), int64_t(b.keys.size()), g.data(), Combiner::mean, s, 1.0f,
                    dev.stream);
  else
    t.backward_and_update(o.data(), rows.data(), b.bags(), int64_t(b.keys.size()), g.data(), Combiner::mean, s,
                          dev.stream);
  synchronize(dev);
  return out.download();
}

// The tiered table against the HBM one, step by step, for caches of one batch, half the table and the whole:
// fp32 rows (dim 5: rows moved a float at a time) and 16-bit rows (bf16 at dim 8, fp16 at dim 6: their bits moved
// in pairs, 4 and 3 floats a row), with the optimizers each storage takes.
struct StorageCase {
  RowStorage storage;
  int dim;
  std::vector<OptimizerKind> optimizers;
};

void tiered_trains_to_the_bits_of_hbm(Backend backend) {
  Device dev = open(backend);
  const int64_t key_space = 400, bags = 24;
  const std::vector<StorageCase> storages = {
      {RowStorage::fp32, 5,
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad, OptimizerKind::lazy_adam}},
      {RowStorage::bf16, 8, {OptimizerKind::sgd, OptimizerKind::rowwise_adagrad}},
      {RowStorage::fp16, 6, {OptimizerKind::sgd, OptimizerKind::rowwise_adagrad}}};
  for (const StorageCase& sc : storages)
  for (bool direct : {false, true})
    for (OptimizerKind opt : sc.optimizers) {
      std::vector<Batch> batches;
      int64_t widest = 0;
      for (int s = 0; s < 8; ++s) {
        batches.push_back(make_batch(bags, s, key_space));
        widest = std::max<int64_t>(widest, int64_t(std::set<int64_t>(batches.back().keys.begin(),
                                                                        batches.back().keys.end()).size()));
      }
      // the eval keys (distinct from nothing in particular) are looked up while the batch's rows are pinned
      const int64_t eval_n = 6;
      for (int64_t cache : {widest + eval_n, key_space / 2, key_space}) {
        EmbeddingTable hbm(dev, config(opt, key_space, direct, sc.storage, sc.dim));
        EmbeddingTable tier(dev, tiered(config(opt, key_space, direct, sc.storage, sc.dim), cache,
                                        cache % 2 ? Eviction::lfu : Eviction::lru));
        bool ok = true;
        for (int s = 0; s < int(batches.size()); ++s) {
          const std::vector<float> grad = testing::random_floats(size_t(bags) * size_t(sc.dim));
          const std::vector<int64_t> eval_keys = testing::random_ints(size_t(eval_n), 0, key_space - 1);
          std::vector<float> e1, e2;
          const bool split = s % 2 == 1;
          const auto a = step(hbm, batches[size_t(s)], grad, s + 1, split, eval_keys, e1);
          const auto b = step(tier, batches[size_t(s)], grad, s + 1, split, eval_keys, e2);
          ok = ok && testing::same_bits(a, b) && testing::same_bits(e1, e2);
        }
        BOOST_CHECK_MESSAGE(ok, "outputs differ: " << row_storage_name(sc.storage) << " direct " << direct
                                                    << " optimizer " << optimizer_name(opt) << " cache " << cache);
        const TableRows x = hbm.export_rows(dev.stream), y = tier.export_rows(dev.stream);
        BOOST_CHECK_MESSAGE(same_rows(x, y), "rows differ: " << row_storage_name(sc.storage) << " direct " << direct
                                                             << " optimizer " << optimizer_name(opt) << " cache "
                                                             << cache);
        BOOST_CHECK_EQUAL(hbm.size(dev.stream), tier.size(dev.stream));
        if (cache < key_space / 2) BOOST_CHECK_GT(tier.host_tier()->rows_out(), 0);  // it did evict
        // a cache of every row holds the table on the device: no host tier
        BOOST_CHECK_EQUAL(tier.host_tier() == nullptr, cache >= key_space);
      }
    }
}

}  // namespace

SPARTA_BACKEND_CASES(tiered_trains_to_the_bits_of_hbm, tiered_trains_to_the_bits_of_hbm)

namespace {

// An independent model of the cache: every call's distinct keys; the victims are the cached keys not in the
// call, ordered by (last call used, key) for LRU or (calls used over the key's life, key) for LFU.
struct CacheModel {
  int64_t capacity;
  bool lfu;
  std::set<int64_t> cached;
  std::set<int64_t> pinned;  // keys of train calls whose update has not come yet
  std::map<int64_t, int64_t> last, uses;
  int64_t tick = 0;
  std::vector<int64_t> call(const std::vector<int64_t>& keys) {
    ++tick;
    std::vector<int64_t> distinct;
    std::set<int64_t> in_call;
    for (int64_t k : keys)
      if (in_call.insert(k).second) distinct.push_back(k);
    int64_t misses = 0;
    for (int64_t k : distinct) misses += cached.count(k) ? 0 : 1;
    std::vector<std::pair<int64_t, int64_t>> candidates;
    for (int64_t k : cached)
      if (!in_call.count(k) && !pinned.count(k)) candidates.push_back({lfu ? uses[k] : last[k], k});
    std::sort(candidates.begin(), candidates.end());
    const int64_t free_slots = capacity - int64_t(cached.size());
    std::vector<int64_t> victims;
    for (int64_t i = 0; i < misses - free_slots; ++i) victims.push_back(candidates[size_t(i)].second);
    for (int64_t v : victims) cached.erase(v);
    for (int64_t k : distinct) {
      cached.insert(k);
      last[k] = tick;
      ++uses[k];
    }
    return victims;
  }
};

// Calls of skewed keys (small ones often, up to the cache's size distinct) against the model. A direct index
// (every key exists: eval lookups, no pins, make keys resident), and a hashed table of signed keys, -1 (the hash
// table's empty marker) and negative ones among them, so that the ties are broken by the signed key (train
// lookups, whose pins are released after every second call, as an update would: the keys of a call stay pinned
// during the next one).
// calls: 4500 runs past 4096 calls, where the victims' select needs a second digit of the prio.
void eviction_follows_the_model(Backend backend, Eviction policy, bool direct, int calls = 200) {
  Device dev = open(backend);
  const int64_t cap = 300, cache = 20;
  EmbeddingTable t(dev, tiered(config(OptimizerKind::adagrad, cap, direct), cache, policy));
  CacheModel model{cache, policy == Eviction::lfu, {}, {}, {}, {}, 0};
  size_t evictions = 0;
  for (int call = 0; call < calls; ++call) {
    std::vector<int64_t> keys;
    const int64_t n = testing::random_ints(1, 1, direct ? 14 : 9)[0];  // two calls' keys fit the cache
    for (int64_t i = 0; i < n; ++i) {
      const int64_t a = testing::random_ints(1, 0, 60)[0];
      const int64_t k = a * a % cap;
      keys.push_back(direct ? k : (k % 3 == 0 ? -1 - k : k * 1000003));
    }
    Buffer<int64_t> k(dev, keys), rows(dev, keys.size());
    Buffer<float> out(dev, keys.size() * t.dim());
    const LookupMode mode = direct ? LookupMode::eval : LookupMode::train;
    t.unpooled_forward(k.data(), int64_t(keys.size()), mode, out.data(), OutputType::f32,
                       direct ? nullptr : rows.data(), MissingKey::zeros, Check::now, dev.stream);
    const std::vector<int64_t> want = model.call(keys);
    if (!direct && call % 2 == 1) {
      t.host_tier()->release_pins();
      model.pinned.clear();
    } else if (!direct) {
      model.pinned.insert(keys.begin(), keys.end());
    }
    const std::vector<int64_t>& got = t.host_tier()->last_evicted();
    evictions += want.size();
    if (got != want) {
      BOOST_ERROR("call " << call << ": " << got.size() << " evicted, the model evicts " << want.size()
                          << " (or others, or in another order)");
      return;
    }
  }
  const std::vector<int64_t> cached(model.cached.begin(), model.cached.end());
  BOOST_CHECK(t.host_tier()->cached_keys() == cached);
  BOOST_CHECK_GT(evictions, 100u);
}

// Rows pinned by a train call whose update has not come are passed over, and evicted in their turn once released:
// cache of 4, key 1 pinned (call 1), 2 3 4 cached (call 2), 5 evicts 2 (call 3: 1 is older but pinned), then after
// the release 6 evicts 1 and 7 evicts 3, as the model says.
void pinned_rows_are_passed_over(Backend backend) {
  Device dev = open(backend);
  for (Eviction policy : {Eviction::lru, Eviction::lfu}) {
    EmbeddingTable t(dev, tiered(config(OptimizerKind::adagrad, 100, true), 4, policy));
    CacheModel model{4, policy == Eviction::lfu, {}, {}, {}, {}, 0};
    const std::vector<std::vector<int64_t>> calls = {{1}, {2, 3, 4}, {5}, {6}, {7}, {2, 8}};
    for (size_t c = 0; c < calls.size(); ++c) {
      const std::vector<int64_t>& keys = calls[c];
      Buffer<int64_t> k(dev, keys), rows(dev, keys.size());
      Buffer<float> out(dev, keys.size() * t.dim());
      const bool train = c == 0;
      t.unpooled_forward(k.data(), int64_t(keys.size()), train ? LookupMode::train : LookupMode::eval, out.data(),
                         OutputType::f32, train ? rows.data() : nullptr, MissingKey::zeros, Check::now, dev.stream);
      const std::vector<int64_t> want = model.call(keys);
      if (train) model.pinned.insert(keys.begin(), keys.end());
      if (c == 2) {
        t.host_tier()->release_pins();
        model.pinned.clear();
      }
      BOOST_CHECK_MESSAGE(t.host_tier()->last_evicted() == want, "call " << c << " " << eviction_name(policy));
    }
    BOOST_CHECK(t.host_tier()->cached_keys() == std::vector<int64_t>(model.cached.begin(), model.cached.end()));
  }
}

void lru_follows_the_model(Backend b) {
  eviction_follows_the_model(b, Eviction::lru, true, 4500);
  eviction_follows_the_model(b, Eviction::lru, false);
}
void lfu_follows_the_model(Backend b) {
  eviction_follows_the_model(b, Eviction::lfu, true);
  eviction_follows_the_model(b, Eviction::lfu, false, 4500);
}

// A large cache whose slots mostly share one priority (all loaded by one call, used once): the victims' select
// then goes on into the ties (rows, or keys with their signs), digit by digit. The calls' victims against the model:
// a few from the shared priority, some after a part of the cache was used again, then most of the cache.
void a_large_cache_follows_the_model(Backend backend) {
  Device dev = open(backend);
  const int64_t cache = 80000, cap = 400000;
  for (Eviction policy : {Eviction::lru, Eviction::lfu}) {
    for (bool direct : {true, false}) {
      EmbeddingTable t(dev, tiered(config(OptimizerKind::sgd, cap, direct), cache, policy));
      CacheModel model{cache, policy == Eviction::lfu, {}, {}, {}, {}, 0};
      auto key = [&](int64_t i) { return direct ? i : (i % 3 == 0 ? -1 - i * 7919 : i * 7919); };
      std::vector<std::vector<int64_t>> calls(4);
      for (int64_t i = 0; i < cache; ++i) calls[0].push_back(key(i));
      for (int64_t i = 0; i < 50; ++i) calls[1].push_back(key(cache + i));
      for (int64_t k : testing::random_ints(5000, 0, cache - 1)) calls[2].push_back(key(k));
      for (int64_t i = 0; i < 3000; ++i) calls[2].push_back(key(cache + 100 + i));
      for (int64_t i = 0; i < 70000; ++i) calls[3].push_back(key(2 * cache + i));
      for (size_t c = 0; c < calls.size(); ++c) {
        const std::vector<int64_t>& keys = calls[c];
        Buffer<int64_t> k(dev, keys), rows(dev, keys.size());
        Buffer<float> out(dev, keys.size() * t.dim());
        t.unpooled_forward(k.data(), int64_t(keys.size()), direct ? LookupMode::eval : LookupMode::train, out.data(),
                           OutputType::f32, direct ? nullptr : rows.data(), MissingKey::zeros, Check::now, dev.stream);
        if (!direct) t.host_tier()->release_pins();
        const std::vector<int64_t> want = model.call(keys);
        BOOST_CHECK_MESSAGE(t.host_tier()->last_evicted() == want,
                            "call " << c << " " << eviction_name(policy) << (direct ? " direct" : " hashed") << ": "
                                    << t.host_tier()->last_evicted().size() << " evicted, the model evicts "
                                    << want.size() << " (or others, or in another order)");
      }
    }
  }
}

// Only the misses reach the host: a call whose keys are all cached lists none; a call with a few new keys among
// many cached ones lists those alone (however often each occurs), and still gives every key its row's values.
void only_misses_reach_the_host(Backend backend) {
  Device dev = open(backend);
  for (bool direct : {true, false}) {
    EmbeddingTable t(dev, tiered(config(OptimizerKind::sgd, 5000, direct), 1000));
    EmbeddingTable hbm(dev, config(OptimizerKind::sgd, 5000, direct));
    auto lookup = [&](EmbeddingTable& table, const std::vector<int64_t>& keys) {
      Buffer<int64_t> k(dev, keys), rows(dev, keys.size());
      Buffer<float> out(dev, keys.size() * table.dim());
      out.fill_bytes(0xFF);
      table.unpooled_forward(k.data(), int64_t(keys.size()), LookupMode::train, out.data(), OutputType::f32,
                             rows.data(), MissingKey::zeros, Check::now, dev.stream);
      if (table.host_tier()) table.host_tier()->release_pins();
      return out.download();
    };
    std::vector<int64_t> warm = testing::random_ints(4000, 0, 799);  // about 800 distinct keys, repeated
    lookup(t, warm);
    const int64_t before = t.host_tier()->misses();
    const std::set<int64_t> held(warm.begin(), warm.end());
    std::vector<int64_t> again = testing::random_ints(20000, 0, 799);
    for (int64_t& k : again)
      if (!held.count(k)) k = warm[size_t(k) % warm.size()];
    lookup(t, again);
    BOOST_CHECK_EQUAL(t.host_tier()->misses(), before);  // every key hit: none came to the host
    std::vector<int64_t> mixed = again;
    for (size_t i = 0; i < mixed.size(); i += 100) mixed[i] = 4000 + int64_t(i / 100) % 37;  // 37 new keys
    const std::vector<float> a = lookup(t, mixed), b = lookup(hbm, mixed);
    BOOST_CHECK_EQUAL(t.host_tier()->misses(), before + 37);
    BOOST_CHECK_MESSAGE(testing::same_bits(a, b), "direct " << direct);
  }
}

}  // namespace

SPARTA_BACKEND_CASES(lru_eviction_follows_a_model_of_the_policy, lru_follows_the_model)
SPARTA_BACKEND_CASES(lfu_eviction_follows_a_model_of_the_policy, lfu_follows_the_model)
SPARTA_BACKEND_CASES(a_large_cache_follows_the_model_of_its_policy, a_large_cache_follows_the_model)
SPARTA_BACKEND_CASES(only_the_misses_of_a_call_reach_the_host, only_misses_reach_the_host)
SPARTA_BACKEND_CASES(pinned_rows_are_passed_over_then_evicted_in_turn, pinned_rows_are_passed_over)

namespace {

// Train a tiered table, export, load into a tiered table of another cache size and into an HBM table: the same
// rows as the trained table's, and the same eval lookups. fp32 rows with Adagrad, and bf16 rows with row-wise
// Adagrad (exported widened, loaded rounded to nearest: the exported values are bf16 values, so they load exactly).
void export_load_round_trip(Backend backend) {
  Device dev = open(backend);
  struct Case {
    RowStorage storage;
    int dim;
    OptimizerKind opt;
  };
  for (const Case& sc : {Case{RowStorage::fp32, 5, OptimizerKind::adagrad},
                         Case{RowStorage::bf16, 8, OptimizerKind::rowwise_adagrad}})
  for (bool direct : {false, true}) {
    const int dim = sc.dim;
    EmbeddingTable a(dev, tiered(config(sc.opt, 200, direct, sc.storage, dim), 40));
    for (int s = 0; s < 5; ++s) {
      std::vector<float> e;
      const Batch b = make_batch(10, s, 200);
      step(a, b, testing::random_floats(10 * size_t(dim)), s + 1, false, {}, e);
    }
    const TableRows rows = a.export_rows(dev.stream);
    EmbeddingTable b(dev, tiered(config(sc.opt, 200, direct, sc.storage, dim), 25, Eviction::lfu));
    EmbeddingTable c(dev, config(sc.opt, 200, direct, sc.storage, dim));
    b.load_rows(rows, dev.stream);
    c.load_rows(rows, dev.stream);
    BOOST_CHECK(same_rows(b.export_rows(dev.stream), rows));
    BOOST_CHECK(same_rows(c.export_rows(dev.stream), rows));
    const std::vector<int64_t> keys = testing::random_ints(20, 0, 199);  // within the smaller cache (25 rows)
    std::vector<float> got[3];
    EmbeddingTable* tables[3] = {&a, &b, &c};
    for (int i = 0; i < 3; ++i) {
      Buffer<int64_t> k(dev, keys);
      Buffer<float> out(dev, keys.size() * size_t(dim));
      out.fill_bytes(0xFF);
      tables[i]->unpooled_forward(k.data(), int64_t(keys.size()), LookupMode::eval, out.data(), OutputType::f32,
                                  nullptr, MissingKey::zeros, Check::now, dev.stream);
      got[i] = out.download();
    }
    BOOST_CHECK_MESSAGE(testing::same_bits(got[0], got[2]), row_storage_name(sc.storage) << " direct " << direct);
    BOOST_CHECK_MESSAGE(testing::same_bits(got[1], got[2]), row_storage_name(sc.storage) << " direct " << direct);
    // hashed: a key already held is refused, changing nothing
    if (!direct) BOOST_CHECK_THROW(b.load_rows(rows, dev.stream), Error);
  }
}

}  // namespace

SPARTA_BACKEND_CASES(export_load_round_trip_with_hbm_tables, export_load_round_trip)

namespace {
void check_message(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    BOOST_ERROR("no error");
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) BOOST_CHECK_MESSAGE(m.find(p) != std::string::npos, m << " lacks " << p);
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_batch_larger_than_the_cache_is_a_clear_error) {
  Device dev = open(Backend::cpu);
  EmbeddingTable t(dev, tiered(config(OptimizerKind::sgd, 100, false), 8));
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 12; ++k) keys.push_back(k * 3);
  Batch b;
  b.keys = keys;
  for (int64_t i = 0; i <= 12; ++i) b.offsets.push_back(i);
  std::vector<float> e;
  check_message([&] { step(t, b, std::vector<float>(12 * 5, 0.f), 1, false, {}, e); },
                {"'clicks'", "12 distinct keys", "8 rows (cache_rows)"});
  // an evaluation of more keys than the cache holds is the same error, not zeros
  Buffer<int64_t> k(dev, keys);
  Buffer<float> out(dev, keys.size() * 5);
  check_message([&] {
    t.unpooled_forward(k.data(), 12, LookupMode::eval, out.data(), OutputType::f32, nullptr, MissingKey::zeros,
                       Check::now, dev.stream);
  }, {"'clicks'", "12 distinct keys", "8 rows (cache_rows)"});
  // a batch that fits trains afterwards
  b.keys.resize(8);
  b.offsets.resize(9);
  step(t, b, std::vector<float>(8 * 5, 0.f), 1, false, {}, e);
  BOOST_CHECK_EQUAL(t.size(dev.stream), 12);  // every row was created in the host store, the refused ones too
}

BOOST_AUTO_TEST_CASE(a_full_host_store_is_the_table_full_error) {
  Device dev = open(Backend::cpu);
  EmbeddingTable t(dev, tiered(config(OptimizerKind::sgd, 10, false), 4));
  std::vector<float> e;
  for (int s = 0; s < 2; ++s) {
    Batch b;
    b.offsets = {0};
    for (int64_t k = 0; k < 4; ++k) b.keys.push_back(s * 4 + k), b.offsets.push_back(k + 1);
    step(t, b, std::vector<float>(4 * 5, 0.f), s + 1, false, {}, e);
  }
  Batch b;
  b.offsets = {0};
  for (int64_t k = 0; k < 4; ++k) b.keys.push_back(100 + k), b.offsets.push_back(k + 1);
  check_message([&] { step(t, b, std::vector<float>(4 * 5, 0.f), 3, false, {}, e); },
                {"'clicks' is full", "10 rows", "2 new keys were refused"});
}

BOOST_AUTO_TEST_CASE(a_host_store_beyond_the_hosts_memory_is_refused_before_allocation) {
  Device dev = open(Backend::cpu);
  // 2^40 rows of dim 5: far beyond any host; the check comes before anything is allocated
  check_message([&] { EmbeddingTable t(dev, tiered(config(OptimizerKind::adam, int64_t(1) << 40, false), 64)); },
                {"'clicks'", "host memory", "MemAvailable", "1099511627776 rows"});
  check_message([&] { EmbeddingTable t(dev, tiered(config(OptimizerKind::sgd, 100, false), 0)); },
                {"'clicks'", "cache_rows >= 1"});
  check_message([&] { EmbeddingTable t(dev, tiered(config(OptimizerKind::sgd, 100, false), 10, Eviction::error)); },
                {"'clicks'", "lru or lfu"});
}

// A kill loses nothing (the kill tests' standard, tests/test_robust_fault.cpp): sparta-train on 2 cpu ranks with
// tiered tables (a cache of 300 of up to 2000 rows a table), rank 1 SIGKILLed during a cache write-back and, in
// another run, during a checkpoint save. The newest checkpoint left must verify and hold, table by table, the rows
// (bits) of the same step of an uninterrupted run with every table in HBM.
BOOST_AUTO_TEST_CASE(a_kill_during_a_write_back_or_a_checkpoint_loses_nothing) {
  testing::ScopedPath data("test_host_tier", "data");
  testing::run_command("mkdir -p " + data.path);
  testing::CommandResult r = testing::run_command(testing::tool_command(
      "../bin/sparta-datagen", 1,
      "--preset small --slots 4 --max-rows 2000 --samples 4096 --chunk 512 --log-level warn --out " + data.path +
          "/train.h5"));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  auto train = [&](const std::string& ckpt, const std::string& extra, const std::string& fault) {
    const std::string args = "--data.train " + data.path + "/train.h5 --data.global_batch 256 --model.embedding_dim 8 "
                             "--model.bottom_mlp 16,8 --model.top_mlp 16,1 --train.steps 12 --log-level warn "
                             "--device cpu --comm.mode mpi --comm.timeout 20 --model.seed 5 "
                             "--train.checkpoint_every 4 --train.checkpoint_dir " + ckpt + " " + extra;
    std::string cmd = testing::tool_command("../bin/sparta-train", 2, args, 120);
    if (!fault.empty()) cmd = "SPARTA_FAULT='1|kill|" + fault + "' " + cmd;
    return testing::run_command(cmd);
  };
  testing::ScopedPath whole("test_host_tier", "hbm");
  r = train(whole.path, "", "");
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  for (const std::string fault : {"host tier write-back|15", "checkpoint save (rows per rank)|3"}) {
    testing::ScopedPath killed("test_host_tier", "killed");
    r = train(killed.path, "--embedding.tier host --embedding.cache_rows 300", fault);
    BOOST_CHECK_MESSAGE(r.status != 0 && r.output.find("[fault] rank 1: kill") != std::string::npos,
                        fault << ": the kill did not happen:\n" << r.output);
    const VerifyReport v = verify_checkpoint(killed.path);
    BOOST_REQUIRE_MESSAGE(v.ok(), fault << ": the newest checkpoint does not verify");
    const int64_t step = v.manifest.meta.step;
    BOOST_CHECK_MESSAGE(step >= 8, fault << ": newest step " << step);
    const Manifest want = read_manifest(whole.path + "/step-" + std::to_string(step));
    bool same = true;
    for (const ManifestTable& t : want.tables)
      same = same_rows(read_table(v.manifest, t.spec.name), read_table(want, t.spec.name)) && same;
    BOOST_CHECK_MESSAGE(same, fault << ": step " << step << " differs from the uninterrupted HBM run's");
  }
}
