// The planner (src/planner.h): configuration checks, explicit plans honoured, the cost model (bytes on the link,
// local bytes, collectives, seconds) against values computed by hand from experiments/PLANNER.md's formulas, auto picking the
// fastest placement that fits (and how the pick follows the rates), a group's fixed cost charged once, localized
// owners spread over ranks and sharing the work, the plan never behind a placement for all tables by its own
// estimate, hybrid hot sets from key counts, bad rates, and a plan that does not fit: a sparta::Error naming the
// table and the shortfall.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "src/base/check.h"
#include "src/embedding_table.h"
#include "src/planner.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

CollectionTableConfig table(const std::string& name, int64_t rows, int dim, std::vector<int> slots,
                            const std::string& placement = "auto") {
  CollectionTableConfig t;
  t.name = name;
  t.rows = rows;
  t.dim = dim;
  t.slots = slots;
  t.placement = placement;
  return t;
}

size_t bytes(int64_t rows, int dim) {  // sgd, load factor 0.5: what EmbeddingTable allocates
  return EmbeddingTable::memory_bytes(rows, dim, OptimizerKind::sgd, 0.5);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

BOOST_AUTO_TEST_CASE(bad_configurations_name_the_table) {
  CollectionConfig c;
  c.num_slots = 3;
  c.tables = {table("a", 10, 4, {0, 1}), table("b", 10, 4, {1})};
  std::string e = error_of([&] { check_collection_config(c); });
  BOOST_CHECK_MESSAGE(has(e, "'b'") && has(e, "slot 1") && has(e, "'a'"), e);
  c.tables = {table("a", 10, 4, {0, 1})};
  e = error_of([&] { check_collection_config(c); });
  BOOST_CHECK_MESSAGE(has(e, "slot 2") && has(e, "no table"), e);
  c.tables = {table("a", 10, 4, {0, 1, 2}), table("z", 10, 4, {7})};
  e = error_of([&] { check_collection_config(c); });
  BOOST_CHECK_MESSAGE(has(e, "'z'") && has(e, "slot 7"), e);
  c.tables = {table("a", 10, 0, {0, 1, 2})};
  e = error_of([&] { check_collection_config(c); });
  BOOST_CHECK_MESSAGE(has(e, "'a'") && has(e, "dim"), e);
  c.tables = {table("a", 10, 4, {0, 1, 2}, "scattered")};
  PlannerOptions o;
  e = error_of([&] { make_plan(c, o, {}); });
  BOOST_CHECK_MESSAGE(has(e, "'a'") && has(e, "scattered"), e);
  c.tables = {table("a", 10, 4, {0, 1, 2}, "localized:5")};
  o.world = 4;
  e = error_of([&] { make_plan(c, o, {}); });
  BOOST_CHECK_MESSAGE(has(e, "'a'") && has(e, "owner") && has(e, "'5'"), e);
}

// A direct index: key_bound > 0 and rows == key_bound; its memory has no hash slots, a key % world shard holds
// ceil(key_bound / world) rows, and hybrid's hot copy stays hashed.
BOOST_AUTO_TEST_CASE(direct_index_tables) {
  CollectionConfig c;
  c.num_slots = 1;
  CollectionTableConfig t = table("d", 1000, 8, {0}, "dispatch");
  t.direct_index = true;
  c.tables = {t};
  std::string e = error_of([&] { check_collection_config(c); });
  BOOST_CHECK_MESSAGE(has(e, "'d'") && has(e, "key_bound 0"), e);
  c.tables[0].key_bound = 999;
  e = error_of([&] { check_collection_config(c); });
  BOOST_CHECK_MESSAGE(has(e, "'d'") && has(e, "rows 1000"), e);
  c.tables[0].key_bound = 1000;
  c.tables[0].placement = "dispatch";
  PlannerOptions o;
  o.world = 3;
  o.global_batch = 96;
  Plan p = make_plan(c, o, {});
  BOOST_CHECK_EQUAL(p.tables[0].memory_bytes, EmbeddingTable::memory_bytes(334, 8, OptimizerKind::sgd, 0.5, true));
  c.tables[0].placement = "hybrid";
  c.tables[0].hot_rows = 5;
  TableKeyStats st;
  st.samples = 10;
  st.keys = 50;
  for (int64_t k = 0; k < 5; ++k) st.top.push_back({k, 10});
  p = make_plan(c, o, {st});
  BOOST_CHECK_EQUAL(p.tables[0].memory_bytes, EmbeddingTable::memory_bytes(5, 8, OptimizerKind::sgd, 0.5) +
                                                  EmbeddingTable::memory_bytes(334, 8, OptimizerKind::sgd, 0.5, true));
}

BOOST_AUTO_TEST_CASE(explicit_plans_are_honoured) {
  CollectionConfig c;
  c.num_slots = 5;
  c.tables = {table("a", 100, 4, {0}, "dispatch"), table("b", 100, 4, {1}, "localized:2"),
              table("c", 100, 4, {2}, "replicated"), table("d", 100, 4, {3}, "distributed"),
              table("e", 100, 4, {4}, "hybrid")};
  PlannerOptions o;
  o.world = 3;
  o.global_batch = 30;
  Plan p = make_plan(c, o, {});
  const Placement want[] = {Placement::dispatch, Placement::localized, Placement::replicated, Placement::distributed,
                            Placement::hybrid};
  for (int i = 0; i < 5; ++i) BOOST_CHECK(p.tables[size_t(i)].placement == want[i]);
  BOOST_CHECK_EQUAL(p.tables[1].owner, 2);
  BOOST_CHECK(p.tables[4].hot_keys.empty());  // no key counts: nothing known to be frequent
  BOOST_CHECK_EQUAL(plan_summary(c, p), "a:dispatch b:localized:2 c:replicated d:distributed e:hybrid");
}

BOOST_AUTO_TEST_CASE(cost_model_by_hand) {
  // W = 4, global batch 400 (100 per rank), one slot, one key per sample, dim 16: K = 100 local keys,
  // f = 3/4 of them remote, a vector is 64 bytes.
  CollectionTableConfig t = table("t", 1000, 16, {0});
  PlannerOptions o;
  o.world = 4;
  o.global_batch = 400;
  TableKeyStats none;
  auto cost = [&](Placement p) { return placement_cost(t, p, o, none, 0, 1.25).bytes_per_step; };
  BOOST_CHECK_CLOSE(cost(Placement::dispatch), 2 * 0.75 * 100 * (8 + 2 * 64), 1e-9);          // 20400
  BOOST_CHECK_CLOSE(cost(Placement::replicated), 2 * 3 * 100 * (8 + 64), 1e-9);              // 43200
  BOOST_CHECK_CLOSE(cost(Placement::localized), 3 * (100 * 8 + 100 * 8 + 2 * 100 * 64), 1e-9);  // 43200
  BOOST_CHECK_CLOSE(cost(Placement::distributed), 2 * 0.75 * 100 * 16 + 4 * 3 * 100 * 64, 1e-9);
  // memory: a key % world shard holds ceil(1000 * 1.25 / 4) + 64 = 377 rows
  BOOST_CHECK_EQUAL(placement_cost(t, Placement::dispatch, o, none, 0, 1.25).memory_busiest, bytes(377, 16));
  BOOST_CHECK_EQUAL(placement_cost(t, Placement::replicated, o, none, 0, 1.25).memory_every, bytes(1000, 16));
  PlacementCost loc = placement_cost(t, Placement::localized, o, none, 0, 1.25);
  BOOST_CHECK_EQUAL(loc.memory_busiest, bytes(1000, 16));
  BOOST_CHECK_EQUAL(loc.memory_every, 0u);
  // dispatch sends each distinct key once: with one key counted, 100 lookups are one key
  TableKeyStats one;
  one.samples = 10, one.keys = 10, one.top = {{7, 10}};
  BOOST_CHECK_CLOSE(placement_cost(t, Placement::dispatch, o, one, 0, 1.25).bytes_per_step, 2 * 0.75 * 1 * 136, 1e-9);
  // hybrid: 2 hot keys (keys 5 and 9, 5 of 10 lookups): an all-reduce of [2, 16] floats and 2 counts (ring:
  // 2 (W-1)/W of them sent and as many received); the rest dispatched: key 1 (p = 0.1) is among 100 lookups
  // with probability 1 - 0.9^100, and the 0.4 of lookups no counted key covers are 40 distinct keys
  TableKeyStats st;
  st.samples = 10, st.keys = 10, st.top = {{5, 3}, {9, 2}, {1, 1}};
  const double cold = 1 - std::pow(0.9, 100) + 0.4 * 100;
  BOOST_CHECK_CLOSE(placement_cost(t, Placement::hybrid, o, st, 2, 1.25).bytes_per_step,
                    4 * 0.75 * 2 * (64 + 8) + 2 * 0.75 * cold * (8 + 128), 1e-9);
  // one rank: nothing moves
  o.world = 1;
  for (Placement p : {Placement::dispatch, Placement::replicated, Placement::localized, Placement::distributed})
    BOOST_CHECK_EQUAL(cost(p), 0.0);
}

BOOST_AUTO_TEST_CASE(time_model_by_hand) {
  // experiments/PLANNER.md's per-placement sums (vectors moved through memory, key passes of 16 bytes, rows updated), written out
  // independently of the code's pass-by-pass count. W = 4, 100 samples per rank, one slot, one key per sample,
  // dim 16 (v = 64 bytes), sgd (no state), 1000 rows, no statistics: K = P = U = 100, Ug = 400.
  CollectionTableConfig t = table("t", 1000, 16, {0});
  PlannerOptions o;
  o.world = 4;
  o.global_batch = 400;
  o.rates = {660, 420, 20, 100};  // the rates the sums below are written with
  const double W = 4, K = 100, P = 100, U = 100, Ug = 400, v = 64, s = 0, row = 2 * v + 2 * s;
  struct Want {
    Placement p;
    double local;
    int collectives;
  };
  const Want want[] = {
      {Placement::replicated, v * (2 * K + P + U + W * U) + 16 * (5 * K + U + 5 * W * U) + row * Ug, 3},
      {Placement::localized, v * (2 * W * K + W * P + 4 * P) + 16 * (3 * P + K + W * P + 5 * W * K) + row * Ug, 5},
      {Placement::dispatch, v * (P + 2 * K + 4 * U) + 16 * (11 * K + 10 * U) + row * Ug / W, 4},
      {Placement::distributed, v * (2 * K + W * P) + 16 * (11 * K) + row * Ug / W, 5},
  };
  const TableKeyStats none;
  for (const Want& w : want) {
    PlacementCost c = placement_cost(t, w.p, o, none, 0, 1.25);
    BOOST_TEST_CONTEXT(placement_name(w.p)) {
      BOOST_CHECK_CLOSE(c.local_bytes, w.local, 1e-9);
      BOOST_CHECK_EQUAL(c.collectives, w.collectives);
      const double group = w.collectives * 20e-6 + 100e-6;  // the default rates
      BOOST_CHECK_CLOSE(c.seconds_group, group, 1e-9);
      BOOST_CHECK_CLOSE(c.seconds_per_step, c.bytes_per_step / 660e9 + w.local / 420e9 + group, 1e-9);
    }
  }
  BOOST_CHECK_CLOSE(placement_cost(t, Placement::replicated, o, none, 0, 1.25).local_bytes, 144000, 1e-9);
  // distributed with mean: the bag gradients scaled before they go (2P vectors more)
  CollectionTableConfig m = t;
  m.combiner = Combiner::mean;
  BOOST_CHECK_CLOSE(placement_cost(m, Placement::distributed, o, none, 0, 1.25).local_bytes,
                    v * (2 * K + W * P + 2 * P) + 16 * (11 * K) + row * Ug / W, 1e-9);
  // hybrid: 2 hot keys (keys 5 and 9: 5 of 10 lookups), key 1 (p = 0.1), and 0.4 of the lookups uncounted:
  // Kh = 50 hot lookups, Kc = 50 cold, Uc = 1 - 0.9^100 + 40 cold distinct keys, Ucg the same over 400 lookups
  TableKeyStats st;
  st.samples = 10, st.keys = 10, st.top = {{5, 3}, {9, 2}, {1, 1}};
  const double H = 2, Kh = 50, Kc = 50, Uc = 1 - std::pow(0.9, 100) + 0.4 * 100, Ucg = 1 - std::pow(0.9, 400) + 0.4 * 400;
  PlacementCost hy = placement_cost(t, Placement::hybrid, o, st, 2, 1.25);
  BOOST_CHECK_CLOSE(hy.local_bytes,
                    v * (P + K + 3 * Kh + 3 * Kc + 4 * Uc + 9 * H) +
                        16 * (2 * P + 7 * K + 9 * Kh + 11 * Kc + 10 * Uc + 8 * H) + row * (H + Ucg / W),
                    1e-9);
  BOOST_CHECK_EQUAL(hy.collectives, 6);
  // other rates: each term scales with its own rate
  o.rates = {1, 2, 3, 4};
  PlacementCost d = placement_cost(t, Placement::dispatch, o, none, 0, 1.25);
  BOOST_CHECK_CLOSE(d.seconds_per_step, d.bytes_per_step / 1e9 + d.local_bytes / 2e9 + 4 * 3e-6 + 4e-6, 1e-9);
  // adagrad: every updated row's accumulator is read and written too (dim floats)
  t.optimizer.kind = OptimizerKind::adagrad;
  BOOST_CHECK_CLOSE(placement_cost(t, Placement::dispatch, o, none, 0, 1.25).local_bytes - d.local_bytes,
                    2 * 64 * Ug / W, 1e-9);
  t.optimizer.kind = OptimizerKind::sgd;
  // one rank: no link, no collectives; the exchanges' buffers are copied locally (dispatch: U keys, U vectors
  // out, U gradients back, each read and written), and the global batch is the local one (Ug = U = 100)
  o.world = 1;
  o.global_batch = 100;
  o.rates = {660, 420, 20, 100};
  PlacementCost one = placement_cost(t, Placement::dispatch, o, none, 0, 1.25);
  BOOST_CHECK_EQUAL(one.bytes_per_step, 0.0);
  BOOST_CHECK_EQUAL(one.collectives, 0);
  BOOST_CHECK_CLOSE(one.local_bytes,
                    v * (P + 2 * K + 4 * U) + 16 * (11 * K + 10 * U) + row * U + 2 * (8 * U + 2 * U * v), 1e-9);
  BOOST_CHECK_CLOSE(one.seconds_per_step, one.local_bytes / 420e9 + 100e-6, 1e-9);
  // one rank, replicated: a pooled lookup of the bags in place (K key passes, K rows, P vectors out) and the update
  // from the bags: sorted (4 K key passes, K gradients, U rows read and written), sgd's atomic update (3 K
  // vectors) and, from dim 32, its marking pass (one more key pass)
  BOOST_CHECK_CLOSE(placement_cost(t, Placement::replicated, o, none, 0, 1.25).local_bytes,
                    16 * K + K * v + P * v + 16 * 4 * K + K * v + U * row, 1e-9);
  t.optimizer.atomic_update = true;
  BOOST_CHECK_CLOSE(placement_cost(t, Placement::replicated, o, none, 0, 1.25).local_bytes,
                    16 * K + K * v + P * v + 3 * K * v, 1e-9);
  CollectionTableConfig wide = table("wide", 1000, 32, {0});
  wide.optimizer.atomic_update = true;
  BOOST_CHECK_CLOSE(placement_cost(wide, Placement::replicated, o, none, 0, 1.25).local_bytes,
                    16 * K + K * 128 + P * 128 + 3 * K * 128 + 16 * K, 1e-9);
}

BOOST_AUTO_TEST_CASE(auto_picks_the_fastest_placement_that_fits) {
  CollectionConfig c;
  c.num_slots = 2;
  c.tables = {table("big", 100000, 32, {0}), table("small", 1000, 32, {1}, "dispatch")};
  PlannerOptions o;
  o.world = 4;
  o.global_batch = 4096;
  // no limit: the plan's estimate is the least of "big"'s placements (with "small" as told). Here that is
  // dispatch, though another placement adds less for big alone: small then joins big's group instead of opening
  // one. The estimate is big's cost as a group of its own plus small's without its group's fixed cost.
  Plan p = make_plan(c, o, {});
  BOOST_CHECK(p.tables[0].placement == Placement::dispatch);
  for (Placement q : {Placement::dispatch, Placement::localized, Placement::replicated, Placement::distributed}) {
    CollectionConfig e = c;
    e.tables[0].placement = placement_name(q);
    BOOST_CHECK_LE(p.estimate.seconds, make_plan(e, o, {}).estimate.seconds * (1 + 1e-12));
  }
  const PlacementCost big = placement_cost(c.tables[0], p.tables[0].placement, o, {}, 0, 1.25);
  const PlacementCost small = placement_cost(c.tables[1], Placement::dispatch, o, {}, 0, 1.25);
  BOOST_CHECK_CLOSE(p.tables[0].seconds_per_step, big.seconds_per_step, 1e-9);
  BOOST_CHECK_CLOSE(p.estimate.seconds, big.seconds_per_step + small.seconds_per_step - small.seconds_group, 1e-9);
  BOOST_CHECK_LT(placement_cost(c.tables[0], Placement::replicated, o, {}, 0, 1.25).seconds_per_step,
                 big.seconds_per_step);
  // a budget below the whole big table: it must be sharded, and every rank stays within the budget
  o.memory_budget = bytes(100000, 32) / 2;
  p = make_plan(c, o, {});
  BOOST_CHECK(p.tables[0].placement == Placement::dispatch || p.tables[0].placement == Placement::distributed);
  BOOST_CHECK_LE(p.tables[0].memory_bytes + p.tables[0].work_bytes + p.tables[1].memory_bytes +
                     p.tables[1].work_bytes,
                 o.memory_budget);
}

BOOST_AUTO_TEST_CASE(the_pick_follows_the_rates) {
  // W = 4, one key per sample, no statistics (so no hybrid): dispatch moves the fewest bytes (2 f U (8 + 2v)),
  // distributed the most, but distributed has the least local work (PLANNER.md's sums: 68800 bytes against dispatch's
  // 100800, see time_model_by_hand).
  CollectionConfig c;
  c.num_slots = 1;
  c.tables = {table("t", 1000, 16, {0})};
  PlannerOptions o;
  o.world = 4;
  o.global_batch = 400;
  // a slow link: the fewest bytes win
  o.rates.link_GBps = 1e-3;
  BOOST_CHECK(make_plan(c, o, {}).tables[0].placement == Placement::dispatch);
  // a link, collectives and groups that cost nothing: the least local work wins
  o.rates = {1e9, 420, 1e-9, 1e-9};
  BOOST_CHECK(make_plan(c, o, {}).tables[0].placement == Placement::distributed);
  // collectives that cost much: the placement with the fewest wins (replicated, 3: counts, keys, sums)
  o.rates = {1e9, 420, 1e6, 1e-9};
  BOOST_CHECK(make_plan(c, o, {}).tables[0].placement == Placement::replicated);
  // with collectives that cost nothing, replicated (43200 bytes on the link, 144000 locally) against dispatch
  // (20400 and 100800): dispatch on a fast link and on a slow one; with collectives that cost, replicated's 3
  // against dispatch's 4 turn it (above)
  auto secs = [&](Placement p) { return placement_cost(c.tables[0], p, o, {}, 0, 1.25).seconds_per_step; };
  for (double link : {2000.0, 500.0}) {
    o.rates = {link, 420, 1e-9, 1e-9};
    BOOST_CHECK_LT(secs(Placement::dispatch), secs(Placement::replicated));
  }
}

BOOST_AUTO_TEST_CASE(one_rank_picks_a_placement_without_routing) {
  // One rank: nothing moves, but dispatch, distributed and hybrid still sort, bucket and gather their keys and
  // vectors. replicated and localized look the bags up in place and update from the bags' gradients (one lookup,
  // one update of the local batch: the same cost), so the pick is replicated, the first of the two in the order
  // of preference, and both are cheaper than every placement that routes keys.
  CollectionConfig c;
  c.num_slots = 2;
  c.tables = {table("big", 100000, 32, {0}), table("small", 1000, 32, {1})};
  TableKeyStats st;
  st.samples = 100, st.keys = 100, st.top = {{3, 40}, {4, 30}};
  PlannerOptions o;
  o.world = 1;
  o.global_batch = 4096;
  Plan p = make_plan(c, o, {st, st});
  for (size_t i = 0; i < 2; ++i) {
    BOOST_CHECK(p.tables[i].placement == Placement::replicated);
    BOOST_CHECK_EQUAL(p.tables[i].bytes_per_step, 0.0);
    const double rep = placement_cost(c.tables[i], Placement::replicated, o, st, 2, 1.25).seconds_per_step;
    const double loc = placement_cost(c.tables[i], Placement::localized, o, st, 2, 1.25).seconds_per_step;
    BOOST_CHECK_CLOSE(rep, loc, 1e-9);
    for (Placement q : {Placement::dispatch, Placement::distributed, Placement::hybrid})
      BOOST_CHECK_LT(rep, placement_cost(c.tables[i], q, o, st, 2, 1.25).seconds_per_step);
  }
}

BOOST_AUTO_TEST_CASE(a_group_pays_its_fixed_cost_once) {
  // Tables of one placement, dim, combiner, optimizer, init_scale and load factor run one lookup: the first
  // placed pays the group's collectives and fixed cost, the next ones only their own traffic.
  CollectionConfig c;
  c.num_slots = 4;
  c.tables = {table("a", 1000, 16, {0}, "dispatch"), table("b", 1000, 16, {1}, "dispatch"),
              table("c", 1000, 8, {2}, "dispatch"), table("d", 1000, 16, {3}, "dispatch")};
  c.tables[3].init_scale = 0.1f;
  PlannerOptions o;
  o.world = 2;
  o.global_batch = 64;
  o.rates = {660, 420, 20, 100};
  Plan p = make_plan(c, o, {});
  std::vector<PlacementCost> cost;
  for (const CollectionTableConfig& t : c.tables) cost.push_back(placement_cost(t, Placement::dispatch, o, {}, 0, 1.25));
  // the largest first: a and b (dim 16, the same size: in their order), d (dim 16), then c (dim 8)
  BOOST_CHECK_CLOSE(p.tables[0].seconds_per_step, cost[0].seconds_per_step, 1e-9);
  BOOST_CHECK_CLOSE(p.tables[1].seconds_per_step, cost[1].seconds_per_step - cost[1].seconds_group, 1e-9);
  BOOST_CHECK_CLOSE(p.tables[2].seconds_per_step, cost[2].seconds_per_step, 1e-9);  // another dim
  BOOST_CHECK_CLOSE(p.tables[3].seconds_per_step, cost[3].seconds_per_step, 1e-9);  // another init_scale
  BOOST_CHECK_CLOSE(cost[1].seconds_group, 4 * 20e-6 + 100e-6, 1e-9);
  // auto tables follow an open group when the rest ties: a second table like one placed replicated joins it
  c.tables = {table("x", 1000, 16, {0}, "replicated"), table("y", 1000, 16, {1}), table("z", 1000, 16, {2}),
              table("w", 1000, 16, {3})};
  o.rates = {1e9, 1e9, 1, 1000};  // only the fixed costs count
  p = make_plan(c, o, {});
  for (const TablePlan& t : p.tables) BOOST_CHECK(t.placement == Placement::replicated);
}

// The 26 tables of the measurement below (the MLPerf v1 cardinalities capped at 4M rows, plus 64 rows for
// bench_collection's check keys, dim 128) with hot[i] keys per sample, and the statistics of uniform keys (a
// table of c <= 65536 rows: every key equally frequent; the larger ones: no counted key).
CollectionConfig mlperf_tables(const std::vector<int>& hot, std::vector<TableKeyStats>& stats, bool direct = false) {
  const int64_t card[] = {4000000, 39043, 17289, 7420, 20263, 3,       7120,    1543,    63,
                          4000000, 2953546, 403346, 10,  2208, 11938, 155,     4,       976,
                          14,      4000000, 4000000, 4000000, 585935, 12972, 108,     36};
  CollectionConfig c;
  c.num_slots = 26;
  for (int i = 0; i < 26; ++i) {
    c.tables.push_back(table("t" + std::to_string(i), card[i] + 64, 128, {i}));
    c.tables.back().key_bound = card[i] + 64;
    c.tables.back().direct_index = direct;
  }
  stats.assign(26, TableKeyStats());
  for (int i = 0; i < 26; ++i) {
    const int64_t rows = card[i] + 64;
    TableKeyStats& s = stats[size_t(i)];
    s.samples = 100 * rows;
    s.keys = int64_t(hot[size_t(i)]) * s.samples;
    if (rows > 65536) continue;
    for (int64_t k = 0; k < rows; ++k) s.top.push_back({k, 100 * int64_t(hot[size_t(i)])});
  }
  return c;
}

// The MLPerf DCNv2 keys per slot (PERF.md).
const std::vector<int> kDcnv2Hot = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};

// The MLPerf tables with DCNv2's keys per slot, planned for 2 ranks of 65536 samples each.
struct Dcnv2OnTwo {
  std::vector<TableKeyStats> st;
  CollectionConfig c = mlperf_tables(kDcnv2Hot, st);
  PlannerOptions o = [] {
    PlannerOptions x;
    x.world = 2;
    x.global_batch = 131072;
    return x;
  }();
};

// Part of the measurement the default rates are fitted to (src/planner.h; experiments/PLANNER.md):
// bench_collection on 1 and 2 H200s, 26 tables of dim 128 (the MLPerf v1 cardinalities capped at 4M
// rows, plus 64 rows for its check keys), uniform keys, direct index, 65536 samples per rank, sgd, every table in
// one group per placement (revision 6bb0b44, experiments/NOTES_embedding.md run 27). measured: ms per step of
// dispatch, localized, replicated, distributed, hybrid on 1 and 2 ranks. The statistics are those of uniform keys
// (a table of c <= 65536 rows: every key equally frequent; the larger ones: no counted key, hot[i] keys per
// sample). The model with the default rates must be within 35% of each 1-rank step (the routes of dispatch and
// hybrid take longer than their bytes on one GPU: with one key per slot both are estimated 21-31% under, as in the
// fit) and 20% of each 2-rank step, localized with the owners it was measured with (owners[i]: table i's, the
// owners bench_collection's planner gave them); and where picked[W - 1] is given, the planner must place every
// table there.
void check_default_rates(const std::vector<int>& hot, const double (&measured)[2][5], const std::string& owners,
                         const std::vector<Placement>& picked) {
  std::vector<TableKeyStats> stats;
  const CollectionConfig c = mlperf_tables(hot, stats, true);
  const Placement order[] = {Placement::dispatch, Placement::localized, Placement::replicated,
                             Placement::distributed, Placement::hybrid};
  for (int W : {1, 2}) {
    PlannerOptions o;
    o.world = W;
    o.global_batch = 65536 * int64_t(W);
    for (int i = 0; i < 5; ++i) {
      CollectionConfig e = c;
      for (size_t j = 0; j < 26; ++j) {
        e.tables[j].placement = placement_name(order[i]);
        if (order[i] == Placement::localized && W == 2) e.tables[j].placement += std::string(":") + owners[j];
      }
      const Plan p = make_plan(e, o, stats);
      double ms = 0;  // the tables' seconds add up to the estimate
      for (const TablePlan& t : p.tables) ms += t.seconds_per_step * 1e3;
      BOOST_CHECK_CLOSE(ms, p.estimate.seconds * 1e3, 1e-9);
      BOOST_TEST_MESSAGE(W << " rank(s), " << placement_name(order[i]) << ": estimated " << ms << " ms, measured "
                           << measured[W - 1][i]);
      BOOST_CHECK_LT(std::fabs(ms / measured[W - 1][i] - 1), W == 1 ? 0.35 : 0.2);
    }
    if (size_t(W) > picked.size()) continue;
    const Plan p = make_plan(c, o, stats);
    for (size_t i = 0; i < p.tables.size(); ++i)
      BOOST_CHECK_MESSAGE(p.tables[i].placement == picked[size_t(W) - 1],
                          W << " rank(s): table t" << i << " placed " << placement_name(p.tables[i].placement)
                            << ", want " << placement_name(picked[size_t(W) - 1]));
  }
}

BOOST_AUTO_TEST_CASE(mlperf_v1_default_rates_follow_their_measurement) {
  // One key per slot. Replicated: the fastest measured on 2 ranks, within 1.4% of localized on 1.
  const double measured[2][5] = {{2.740, 1.174, 1.190, 2.184, 3.892}, {3.588, 4.890, 3.115, 8.089, 4.435}};
  check_default_rates(std::vector<int>(26, 1), measured, "01010001100101010000111111",
                      {Placement::replicated, Placement::replicated});
}

BOOST_AUTO_TEST_CASE(dcnv2_default_rates_follow_their_measurement) {
  // The MLPerf DCNv2 keys per slot. Replicated on 1 rank (within 0.6% of localized, the fastest measured). On 2
  // ranks only the estimates of the fixed placements are checked: the plan mixes placements
  // (tables_move_together_where_one_alone_does_not_pay; measured 9.23-9.38 ms).
  const double measured[2][5] = {{19.102, 6.656, 6.697, 8.266, 24.040}, {26.421, 10.253, 24.062, 14.220, 33.278}};
  check_default_rates(kDcnv2Hot, measured,
                      "10001100011111101001011000", {Placement::replicated});
}

BOOST_AUTO_TEST_CASE(a_bf16_exchange_halves_the_vectors_on_the_link) {
  // W = 2, 100 samples per rank, one slot, one key each, dim 16, no statistics: K = P = U = 100. The vectors and
  // gradients that replicated, localized and dispatch move travel as 2 bytes per value under exchange = bf16;
  // the keys stay 8 bytes, and distributed's reduce-scatter and all-gather stay fp32. Local bytes do not change.
  CollectionTableConfig t = table("t", 1000, 16, {0});
  PlannerOptions o;
  o.world = 2;
  o.global_batch = 200;
  PlannerOptions h = o;
  h.wire_bytes = 2;
  const double K = 100, P = 100, U = 100, v = 64, vh = 32, f = 0.5;
  auto link = [&](Placement p, const PlannerOptions& x) {
    return placement_cost(t, p, x, {}, 0, 1.25).bytes_per_step;
  };
  BOOST_CHECK_CLOSE(link(Placement::replicated, o), 2 * K * (8 + v), 1e-9);
  BOOST_CHECK_CLOSE(link(Placement::replicated, h), 2 * K * (8 + vh), 1e-9);
  BOOST_CHECK_CLOSE(link(Placement::localized, h), P * 8 + K * 8 + 2 * P * vh, 1e-9);
  BOOST_CHECK_CLOSE(link(Placement::dispatch, h), 2 * f * U * (8 + 2 * vh), 1e-9);
  BOOST_CHECK_CLOSE(link(Placement::distributed, h), link(Placement::distributed, o), 1e-9);
  for (Placement p : {Placement::replicated, Placement::localized, Placement::dispatch})
    BOOST_CHECK_CLOSE(placement_cost(t, p, h, {}, 0, 1.25).local_bytes,
                      placement_cost(t, p, o, {}, 0, 1.25).local_bytes, 1e-9);
  // make_plan takes the wire type from the configuration
  CollectionConfig c;
  c.num_slots = 1;
  c.tables = {t};
  c.tables[0].placement = "replicated";
  c.exchange = DataType::bf16;
  BOOST_CHECK_CLOSE(make_plan(c, o, {}).tables[0].bytes_per_step, 2 * K * (8 + vh), 1e-9);
  h.wire_bytes = 0;
  BOOST_CHECK_THROW(placement_cost(t, Placement::replicated, h, {}, 0, 1.25), Error);
}

BOOST_AUTO_TEST_CASE(bad_rates_are_errors) {
  CollectionConfig c;
  c.num_slots = 1;
  c.tables = {table("t", 1000, 16, {0})};
  PlannerOptions o;
  o.world = 2;
  auto fails = [&](PlannerRates r, const char* name) {
    o.rates = r;
    std::string e = error_of([&] { make_plan(c, o, {}); });
    BOOST_CHECK_MESSAGE(has(e, name) && has(e, "> 0"), "'" << e << "' does not name " << name);
    e = error_of([&] { check_planner_rates(r); });
    BOOST_CHECK_MESSAGE(has(e, name), e);
  };
  fails({0, 420, 20, 100}, "link_GBps");
  fails({660, -1, 20, 100}, "hbm_GBps");
  fails({660, 420, std::nan(""), 100}, "collective_us");
  fails({660, 420, 20, 0}, "group_us");
  BOOST_CHECK_EQUAL(error_of([&] { check_planner_rates(PlannerRates()); }), "");
}

BOOST_AUTO_TEST_CASE(localized_owners_spread_over_ranks) {
  CollectionConfig c;
  c.num_slots = 3;
  c.tables = {table("a", 5000, 16, {0}, "localized"), table("b", 4000, 16, {1}, "localized"),
              table("c", 3000, 16, {2}, "localized")};
  PlannerOptions o;
  o.world = 3;
  o.memory_budget = bytes(5000, 16) + (size_t(64) << 10);  // one table per rank (and its working memory)
  Plan p = make_plan(c, o, {});
  std::vector<int> owners;
  for (const TablePlan& t : p.tables) owners.push_back(t.owner);
  std::sort(owners.begin(), owners.end());
  BOOST_CHECK(owners == std::vector<int>({0, 1, 2}));
}

BOOST_AUTO_TEST_CASE(localized_owners_balance_the_work) {
  // Two ranks, four localized tables of one size (placed in their order) with 3, 1, 1 and 1 keys per sample. A
  // localized table's lookup and update run on its owner, so the step's local time is the busier owner's. With only
  // local bytes counting, the owners balance the work: a on rank 0, the other three on rank 1 (3 keys a sample on
  // each), where spreading by memory alone would give rank 0 a and c (4) and rank 1 the rest (2).
  CollectionConfig c;
  c.num_slots = 4;
  for (int i = 0; i < 4; ++i) c.tables.push_back(table(std::string(1, char('a' + i)), 5000, 16, {i}, "localized"));
  std::vector<TableKeyStats> st(4);
  for (int i = 0; i < 4; ++i) st[size_t(i)].samples = 100, st[size_t(i)].keys = i == 0 ? 300 : 100;
  PlannerOptions o;
  o.world = 2;
  o.global_batch = 2000;
  o.rates = {1e9, 420, 1e-9, 1e-9};  // the link, the collectives and the groups cost (almost) nothing
  Plan p = make_plan(c, o, st);
  std::vector<int> owners;
  for (const TablePlan& t : p.tables) owners.push_back(t.owner);
  BOOST_CHECK(owners == std::vector<int>({0, 1, 1, 1}));
  // the estimate's local bytes: the busier rank's, from each table's cost on its owner and on the other rank
  std::vector<PlacementCost> cost;
  for (int i = 0; i < 4; ++i)
    cost.push_back(placement_cost(c.tables[size_t(i)], Placement::localized, o, st[size_t(i)], 0, 1.25));
  const double rank0 = cost[0].local_bytes + cost[1].local_other + cost[2].local_other + cost[3].local_other;
  const double rank1 = cost[0].local_other + cost[1].local_bytes + cost[2].local_bytes + cost[3].local_bytes;
  BOOST_CHECK_CLOSE(p.estimate.local_bytes, std::max(rank0, rank1), 1e-9);
  // another rank lays out its bags' lengths, cuts them into the owners' blocks (offsets twice, keys once) and puts
  // the pooled vectors back into place and takes the gradients out (read and written)
  const double P = 1000, K = 3000, v = 64;
  BOOST_CHECK_CLOSE(cost[0].local_other, 16 * P + 2 * 16 * P + 16 * K + 4 * P * v, 1e-9);
  BOOST_CHECK_LT(cost[0].local_other, cost[0].local_bytes / 4);
  // the link: every localized table's exchange runs on both ranks (on 2 ranks the owner's share is the other's),
  // and an exchange lasts as long as its larger direction. Forward, an owner receives the other rank's lengths and
  // keys (8 bytes a bag and a key) and sends back its pooled vectors (v bytes a bag); backward it receives their
  // gradients. Rank 0 (a) sends a's vectors and b, c, d's keys and receives a's keys and b, c, d's vectors; rank 1
  // the other way round; backward, rank 0 sends b, c, d's gradients and receives a's.
  BOOST_CHECK_CLOSE(cost[0].bytes_other, cost[0].bytes_per_step, 1e-9);
  const double keys_a = 8 * P + 8 * K, keys_1 = 8 * P + 8 * P, vectors = P * v;
  const double forward = std::max(vectors + 3 * keys_1, keys_a + 3 * vectors), backward = 3 * vectors;
  BOOST_CHECK_CLOSE(p.estimate.link_bytes, 2 * (forward + backward), 1e-9);
  double sent_plus_received = 0;  // the same bytes counted both ways: what each rank sends plus receives
  for (const PlacementCost& x : cost) sent_plus_received += x.bytes_per_step;
  BOOST_CHECK_GT(p.estimate.link_bytes, sent_plus_received);
  // the owners' tables are one group: however much a group costs, a second owner opens none
  o.rates = {1e9, 420, 1e-9, 1e6};
  const Plan costly = make_plan(c, o, st);
  owners.clear();
  for (const TablePlan& t : costly.tables) owners.push_back(t.owner);
  BOOST_CHECK(owners == std::vector<int>({0, 1, 1, 1}));
  BOOST_CHECK_EQUAL(costly.estimate.groups, 1);
  // three ranks: another rank carries a third of the owner's link bytes
  o.world = 3;
  o.global_batch = 3000;
  const PlacementCost three = placement_cost(c.tables[0], Placement::localized, o, st[0], 0, 1.25);
  BOOST_CHECK_CLOSE(three.bytes_other * 2, three.bytes_per_step, 1e-9);
}

BOOST_AUTO_TEST_CASE(the_plan_ties_or_beats_every_placement_for_all_tables) {
  // One pass that places one table at a time where it adds the least can trail a placement for all tables: at
  // each table localized adds more (its exchange, the blocks cut and put back, and its group's fixed cost for the
  // first), while as a whole it runs the two owners' lookups side by side. The plan starts from the best of that
  // pass and every placement for all tables, and only improves on it, so by its own estimate it never trails a
  // fixed placement (the MLPerf DCNv2 keys per slot on 2 ranks, default rates: all localized 10.9 ms, all
  // distributed 13.3, the plan 9.9).
  const Dcnv2OnTwo d;
  const CollectionConfig& c = d.c;
  const std::vector<TableKeyStats>& st = d.st;
  const PlannerOptions& o = d.o;
  const Plan p = make_plan(c, o, st);
  std::map<std::string, double> fixed;
  for (Placement q : {Placement::replicated, Placement::localized, Placement::dispatch, Placement::distributed,
                      Placement::hybrid}) {
    CollectionConfig e = c;
    for (CollectionTableConfig& t : e.tables) t.placement = placement_name(q);
    fixed[placement_name(q)] = make_plan(e, o, st).estimate.seconds;
    BOOST_TEST_MESSAGE(placement_name(q) << " for all: " << fixed[placement_name(q)] * 1e3 << " ms; the plan "
                                         << p.estimate.seconds * 1e3);
    BOOST_CHECK_LE(p.estimate.seconds, fixed[placement_name(q)] * (1 + 1e-12));
  }
  BOOST_CHECK_LT(fixed["localized"], fixed["distributed"]);
  BOOST_CHECK_LT(p.estimate.seconds, fixed["localized"]);  // a mix: small tables replicated (the next case)
  // the localized owners share the work: neither rank's local bytes exceed 60% of the two owners' together
  double owner_bytes[2] = {0, 0};
  for (const TablePlan& t : p.tables)
    if (t.placement == Placement::localized) owner_bytes[t.owner] += t.local_bytes;
  BOOST_CHECK_LT(std::max(owner_bytes[0], owner_bytes[1]), 0.6 * (owner_bytes[0] + owner_bytes[1]));
}

BOOST_AUTO_TEST_CASE(tables_move_together_where_one_alone_does_not_pay) {
  // The MLPerf DCNv2 keys per slot on 2 ranks. Every table localized is the best placement for all, and no single
  // table moved to replicated lowers its estimate: the first replicated table opens a group (its collectives and
  // fixed cost) that its own exchange saved does not repay. The 18 tables of at most 40k rows replicated together
  // do: the plan keeps the large tables localized and replicates small ones (with the keys bench_collection
  // samples, every one of the 18; measured on 2 H200s, run 27: 9.53 ms per step against 10.48 all localized).
  const Dcnv2OnTwo d;
  const CollectionConfig& c = d.c;
  const std::vector<TableKeyStats>& st = d.st;
  const PlannerOptions& o = d.o;
  const Plan p = make_plan(c, o, st);
  int replicated = 0;  // the large tables localized, only small ones replicated
  for (size_t i = 0; i < c.tables.size(); ++i) {
    const bool small = c.tables[i].rows <= 40000 + 64;
    replicated += p.tables[i].placement == Placement::replicated;
    BOOST_CHECK_MESSAGE(p.tables[i].placement == Placement::localized ||
                            (small && p.tables[i].placement == Placement::replicated),
                        "table " << i << ": " << placement_name(p.tables[i].placement));
  }
  BOOST_CHECK_GE(replicated, 12);
  CollectionConfig all = c;
  for (CollectionTableConfig& t : all.tables) t.placement = "localized";
  const double localized = make_plan(all, o, st).estimate.seconds;
  BOOST_TEST_MESSAGE("the plan " << p.estimate.seconds * 1e3 << " ms, every table localized " << localized * 1e3);
  BOOST_CHECK_LT(p.estimate.seconds, localized);
  for (size_t i = 0; i < c.tables.size(); ++i) {
    if (p.tables[i].placement != Placement::replicated) continue;
    CollectionConfig one = all;
    one.tables[i].placement = "replicated";
    BOOST_CHECK_GT(make_plan(one, o, st).estimate.seconds, localized);
  }
}

BOOST_AUTO_TEST_CASE(localized_owners_even_the_directions_and_no_move_or_swap_helps) {
  // The MLPerf DCNv2 keys per slot on 2 ranks, every table localized with the owners left to the planner. An
  // exchange lasts as long as its larger direction, so the owners hold 13 slots each (the pass alone, picking
  // owners where the sum of sent and received bytes rose least, gave 10 and 16: 537 MB of vectors one way
  // against 336 the other). And no table moved to the other rank, and no two tables of different owners swapped,
  // lowers the estimate (the pass picks in table order; without the owners' moves and swaps a swap lowers it).
  Dcnv2OnTwo d;
  CollectionConfig& c = d.c;
  const std::vector<TableKeyStats>& st = d.st;
  const PlannerOptions& o = d.o;
  for (CollectionTableConfig& t : c.tables) t.placement = "localized";
  const Plan p = make_plan(c, o, st);
  int slots[2] = {0, 0};
  std::vector<int> owner;
  for (const TablePlan& t : p.tables) {
    BOOST_REQUIRE(t.placement == Placement::localized);
    ++slots[t.owner];
    owner.push_back(t.owner);
  }
  BOOST_CHECK_EQUAL(slots[0], 13);
  BOOST_CHECK_EQUAL(slots[1], 13);
  auto estimate = [&](const std::vector<int>& owners) {  // every owner given explicitly
    CollectionConfig e = c;
    for (size_t i = 0; i < owners.size(); ++i) e.tables[i].placement = "localized:" + std::to_string(owners[i]);
    return make_plan(e, o, st).estimate.seconds;
  };
  BOOST_CHECK_CLOSE(estimate(owner), p.estimate.seconds, 1e-9);
  int lower = 0;
  for (size_t i = 0; i < owner.size(); ++i) {
    std::vector<int> moved = owner;
    moved[i] = 1 - moved[i];
    lower += estimate(moved) < p.estimate.seconds * (1 - 1e-9);
    for (size_t j = i + 1; j < owner.size(); ++j) {
      if (owner[i] == owner[j]) continue;
      std::vector<int> swapped = owner;
      std::swap(swapped[i], swapped[j]);
      lower += estimate(swapped) < p.estimate.seconds * (1 - 1e-9);
    }
  }
  BOOST_CHECK_MESSAGE(lower == 0, lower << " moves or swaps of owners lower the plan's estimate");
}

BOOST_AUTO_TEST_CASE(a_table_at_a_time_improves_the_plan) {
  // The MLPerf DCNv2 keys per slot on 4 ranks (the small tables' keys counted): the one-table pass gives a mix of
  // dispatch and distributed, every placement for all 16.2 ms or more (localized); moving tables to another
  // placement while the estimate falls ends at 12.3 ms, where no single table's move lowers it (without those
  // moves the pass's plan is the answer, and some move lowers it).
  std::vector<TableKeyStats> st;
  const std::vector<int>& hot = kDcnv2Hot;
  const CollectionConfig c = mlperf_tables(hot, st);
  PlannerOptions o;
  o.world = 4;
  o.global_batch = 4 * 65536;
  const Plan p = make_plan(c, o, st);
  double fixed = 1e30;
  for (Placement q : {Placement::replicated, Placement::localized, Placement::dispatch, Placement::distributed,
                      Placement::hybrid}) {
    CollectionConfig e = c;
    for (CollectionTableConfig& t : e.tables) t.placement = placement_name(q);
    fixed = std::min(fixed, make_plan(e, o, st).estimate.seconds);
  }
  BOOST_TEST_MESSAGE("the plan " << p.estimate.seconds * 1e3 << " ms, the best placement for all " << fixed * 1e3);
  BOOST_CHECK_LT(p.estimate.seconds, fixed * 0.9);
  std::set<Placement> used;
  for (const TablePlan& t : p.tables) used.insert(t.placement);
  BOOST_CHECK_GE(used.size(), 2u);
  // no single table's move lowers the estimate
  for (size_t i = 0; i < c.tables.size(); ++i)
    for (Placement q : {Placement::replicated, Placement::localized, Placement::dispatch, Placement::distributed,
                        Placement::hybrid}) {
      if (q == p.tables[i].placement || (q == Placement::hybrid && st[i].top.empty())) continue;
      CollectionConfig e = c;
      for (size_t j = 0; j < e.tables.size(); ++j) e.tables[j].placement = placement_name(p.tables[j].placement);
      e.tables[i].placement = placement_name(q);
      BOOST_CHECK_GE(make_plan(e, o, st).estimate.seconds, p.estimate.seconds * (1 - 1e-12));
    }
}

BOOST_AUTO_TEST_CASE(hybrid_hot_set_is_the_most_frequent_keys) {
  CollectionConfig c;
  c.num_slots = 1;
  c.tables = {table("h", 1000, 8, {0}, "hybrid")};
  c.tables[0].hot_rows = 3;
  TableKeyStats st;
  st.samples = 100, st.keys = 200;
  st.top = {{42, 50}, {-7, 40}, {9, 30}, {11, 20}};
  PlannerOptions o;
  o.world = 2;
  Plan p = make_plan(c, o, {st});
  BOOST_CHECK(p.tables[0].hot_keys == std::vector<int64_t>({-7, 9, 42}));
  BOOST_CHECK_EQUAL(p.tables[0].memory_bytes, bytes(3, 8) + bytes(std::min<int64_t>(1000, 625 + 64), 8));
}

BOOST_AUTO_TEST_CASE(a_plan_that_does_not_fit_names_the_table_and_the_shortfall) {
  CollectionConfig c;
  c.num_slots = 2;
  c.tables = {table("fits", 100, 8, {0}), table("huge", 10000000, 64, {1})};
  PlannerOptions o;
  o.world = 2;
  o.memory_budget = size_t(64) << 20;  // 64 MiB per rank; half of "huge" needs far more
  // the shortfall of the placement that comes closest: a key % world shard and its working memory, less the budget
  const size_t shard = bytes(modulo_shard_rows(10000000, 2, 1.25), 64);
  const PlacementCost dispatch = placement_cost(c.tables[1], Placement::dispatch, o, {}, 0, 1.25),
                      distributed = placement_cost(c.tables[1], Placement::distributed, o, {}, 0, 1.25);
  const PlacementCost& cost =
      dispatch.work_busiest <= distributed.work_busiest ? dispatch : distributed;  // both hold the shard
  BOOST_CHECK_EQUAL(cost.memory_busiest, shard);
  BOOST_CHECK_GT(cost.work_busiest, 0u);
  const size_t short_bytes = shard + cost.work_busiest - o.memory_budget;
  const double short_mib = double(short_bytes) / (1024.0 * 1024.0);
  std::string e = error_of([&] { make_plan(c, o, {}); });
  BOOST_CHECK_MESSAGE(has(e, "'huge'") && has(e, "does not fit") && has(e, strprintf("%.2f MiB", short_mib)) &&
                          has(e, strprintf("(%zu bytes) more than", short_bytes)),
                      e);
  BOOST_TEST_MESSAGE("error as reported: " << e);
  // an explicit placement that does not fit either
  c.tables[1].placement = "replicated";
  e = error_of([&] { make_plan(c, o, {}); });
  BOOST_CHECK_MESSAGE(has(e, "'huge'") && has(e, "replicated") && has(e, "64.00 MiB"), e);
}

BOOST_AUTO_TEST_CASE(format_plan_lists_every_table) {
  CollectionConfig c;
  c.num_slots = 3;
  c.tables = {table("users", 100000, 16, {0}, "dispatch"), table("items", 500, 8, {1, 2}, "localized:1")};
  PlannerOptions o;
  o.world = 2;
  o.global_batch = 64;
  Plan p = make_plan(c, o, {});
  std::string s = format_plan(c, p);
  BOOST_TEST_MESSAGE(s);
  for (const char* col : {"table", "rows", "dim", "placement", "owner", "memory/rank", "bytes/step", "est. ms/step"})
    BOOST_CHECK_MESSAGE(has(s, col), "column " << col << " missing in\n" << s);
  BOOST_CHECK(has(s, "users") && has(s, "100000") && has(s, "dispatch") && has(s, "key%W"));
  BOOST_CHECK(has(s, "items") && has(s, "localized") && has(s, " 1 "));
  // the header, a line per table, the totals: the fullest rank's memory (rank 1: users' shard and items), the
  // bytes and the estimated ms summed
  BOOST_CHECK_EQUAL(std::count(s.begin(), s.end(), '\n'), 4);
  const std::string last = s.substr(s.rfind('\n', s.size() - 2) + 1);
  const double ms = (p.tables[0].seconds_per_step + p.tables[1].seconds_per_step) * 1e3;
  BOOST_CHECK_MESSAGE(has(last, "total") && has(last, strprintf("%.3f", ms)), last);
  BOOST_CHECK(has(last, strprintf("%.2f KiB", double(p.tables[0].memory_bytes + p.tables[1].memory_bytes) / 1024)) ||
              has(last, strprintf("%.2f MiB", double(p.tables[0].memory_bytes + p.tables[1].memory_bytes) / 1048576)));
  BOOST_CHECK(has(s, strprintf("%.3f", p.tables[0].seconds_per_step * 1e3)));
}

}  // namespace

// A host-tier table (src/host_tier.h): its device memory is its cache's (what the cache allocates), the tier's
// own (HostTier::device_bytes: a slot per host row, the slots' bookkeeping, a hashed table's key index) and the
// staging area of a call's victims (HostTier::staging_bytes, at most the call's distinct keys), its host
// store and its host<->GPU bytes are counted (by hand: the rows a step touches times the share of the rows beyond
// the cache, in and out), the time grows by those bytes at host_GBps, and the plan table prints the tier. A cache
// of every row is an HBM table. A table too large for HBM gets a hint of the cache that fits beside the tier's
// index, or, where the index alone does not fit, says so.
BOOST_AUTO_TEST_CASE(host_tier_counts_the_cache_the_host_and_the_transfers) {
  CollectionConfig c;
  c.num_slots = 1;
  c.tables = {table("big", 100000, 16, {0}, "replicated")};
  c.tables[0].optimizer.kind = OptimizerKind::rowwise_adagrad;
  PlannerOptions o;
  o.global_batch = 1000;  // one key per sample: 1000 keys, at most 1000 distinct
  const Plan hbm = make_plan(c, o, {});
  const std::string hbm_text = format_plan(c, hbm);
  c.tables[0].tier = make_tier(TableTier::host, 25000, 0, Eviction::lru, 16, 1);
  const Plan host = make_plan(c, o, {});
  const TablePlan& p = host.tables[0];
  // beside the cache and the tier's arrays, the staging area of a call's victims: at most its distinct keys (here
  // about 1000), each row's record (16 values, 1 state float and its uses padded to 32 floats: 128 bytes), its
  // host row, and the store's sort of the host rows (sorted, their order, and the sort's space: an index,
  // alternate keys and values: 5 int64)
  const size_t fixed = EmbeddingTable::memory_bytes(25000, 16, OptimizerKind::rowwise_adagrad, 1.0, true) +
                       100000 * (sizeof(int32_t) + 1) + 25000 * HostTier::kSlotWords * sizeof(int64_t) +
                       HashTable::memory_bytes(100000, 0.5);
  BOOST_CHECK_GT(p.memory_bytes, fixed + 900 * (128 + 48));
  BOOST_CHECK_LE(p.memory_bytes, fixed + 1000 * (128 + 48));
  BOOST_CHECK_EQUAL(HostTier::staging_bytes(1000, 16, 1), 1000u * (128 + 48));
  BOOST_CHECK_EQUAL(HostTier::record_bytes(16, 1), 128u);
  BOOST_CHECK_EQUAL(HostTier::record_bytes(128, 1), 576u);  // fp32 rows of 128 with row-wise Adagrad: 9 lines
  BOOST_CHECK_EQUAL(HostTier::record_bytes(64, 1), 320u);   // bf16 rows of 128
  BOOST_CHECK_EQUAL(HostTier::host_bytes(10, 128, 1), 5760u);
  BOOST_CHECK_EQUAL(HostTier::device_bytes(100000, 25000, false),
                    100000 * (sizeof(int32_t) + 1) + 25000 * HostTier::kSlotWords * sizeof(int64_t));
  BOOST_CHECK_EQUAL(p.host_bytes, HostTier::host_bytes(100000, 16, 1));
  BOOST_CHECK_EQUAL(hbm.tables[0].host_bytes, 0u);
  BOOST_CHECK_EQUAL(hbm.tables[0].host_transfer_bytes, 0.0);
  // distinct keys of 1000 uniform draws... bounded by 1000; the planner's figure divided back out
  const double per_row = 2 * 0.75 * 128.0;  // in and out, 3/4 of the rows beyond the cache, a record each
  const double touched = p.host_transfer_bytes / per_row;
  BOOST_CHECK_GT(touched, 900);
  BOOST_CHECK_LE(touched, 1000.0 + 1e-9);
  BOOST_CHECK_CLOSE(host.estimate.seconds - hbm.estimate.seconds, p.host_transfer_bytes / (o.rates.host_GBps * 1e9),
                    1e-6);
  BOOST_CHECK_MESSAGE(has(format_plan(c, host), "host cache 25000 rows"), format_plan(c, host));
  BOOST_CHECK_MESSAGE(has(hbm_text, " hbm\n"), hbm_text);
  // a cache of the whole table is an HBM table: nothing moves, nothing in host memory, HBM's device memory
  c.tables[0].tier.cache_rows = 100000;
  const Plan whole = make_plan(c, o, {});
  BOOST_CHECK_EQUAL(whole.tables[0].host_transfer_bytes, 0.0);
  BOOST_CHECK_EQUAL(whole.tables[0].host_bytes, 0u);
  BOOST_CHECK_EQUAL(whole.tables[0].memory_bytes, hbm.tables[0].memory_bytes);
  o.rates.host_GBps = 0;
  BOOST_CHECK(has(error_of([&] { make_plan(c, o, {}); }), "host_GBps"));
  // a table that does not fit in HBM: the error points to the host tier, and a cache within the hint fits
  CollectionConfig h;
  h.num_slots = 1;
  h.tables = {table("huge", 10000000, 64, {0}, "dispatch")};
  h.tables[0].direct_index = true;
  h.tables[0].key_bound = 10000000;
  PlannerOptions small;
  small.memory_budget = size_t(96) << 20;
  const std::string e = error_of([&] { make_plan(h, small, {}); });
  BOOST_CHECK_MESSAGE(has(e, "'huge'") && has(e, "embedding.tier host") && has(e, "embedding.cache_mb below"), e);
  const size_t at = e.find("embedding.cache_mb below ");
  const double hint_mb = at == std::string::npos ? 0 : std::atof(e.c_str() + at + 25);
  BOOST_CHECK_GT(hint_mb, 1.0);
  h.tables[0].tier = make_tier(TableTier::host, 0, hint_mb * 0.95, Eviction::lru, 64, 0);
  const Plan fits = make_plan(h, small, {});
  BOOST_CHECK_LE(fits.tables[0].memory_bytes + fits.tables[0].work_bytes, small.memory_budget);
  BOOST_CHECK_EQUAL(fits.tables[0].host_bytes, HostTier::host_bytes(10000000, 64, 0));
  // hashed, its key index alone (10M rows at load factor 0.5) is beyond the budget: said, no cache hinted
  h.tables[0].direct_index = false;
  h.tables[0].key_bound = 0;
  h.tables[0].tier = TierConfig{};
  const std::string e2 = error_of([&] { make_plan(h, small, {}); });
  BOOST_CHECK_MESSAGE(has(e2, "'huge'") && has(e2, "its index alone would take") && !has(e2, "cache_mb below"), e2);
}

// embedding.tier auto: HBM where the table fits; else host memory under the cache asked for or, with none asked,
// under the largest cache the budget leaves (within 5% of it); a 16-bit table, and one whose index alone is beyond
// the budget, end with the HBM error. The plan entry carries the tier, and format_plan marks it.
BOOST_AUTO_TEST_CASE(tier_auto_goes_to_host_memory_only_where_hbm_does_not_suffice) {
  CollectionConfig h;
  h.num_slots = 2;
  h.tables = {table("huge", 10000000, 64, {0}, "dispatch"), table("small", 1000, 64, {1}, "auto")};
  for (CollectionTableConfig& t : h.tables) {
    t.direct_index = true;
    t.key_bound = t.rows;
    t.tier = make_tier(TableTier::automatic, 0, 0, Eviction::lru, 64, 0);
  }
  BOOST_CHECK_EQUAL(h.tables[0].tier.cache_rows, 0);
  PlannerOptions roomy;  // no budget: every table fits in HBM
  const Plan all_hbm = make_plan(h, roomy, {});
  for (const TablePlan& p : all_hbm.tables) BOOST_CHECK(p.tier.tier == TableTier::hbm);
  BOOST_CHECK_MESSAGE(has(format_plan(h, all_hbm), " hbm (auto)\n"), format_plan(h, all_hbm));

  PlannerOptions small;
  small.memory_budget = size_t(96) << 20;
  const Plan p = make_plan(h, small, {});
  const TablePlan& huge = p.tables[0];
  BOOST_CHECK(huge.tier.tier == TableTier::host);
  BOOST_CHECK(p.tables[1].tier.tier == TableTier::hbm);  // the small table keeps its rows in HBM
  BOOST_CHECK_EQUAL(huge.host_bytes, HostTier::host_bytes(10000000, 64, 0));
  size_t used = 0;
  for (const TablePlan& t : p.tables) used += t.memory_bytes + t.work_bytes;
  BOOST_CHECK_LE(used, small.memory_budget);
  // the cache takes most of what is left: more rows would not fit, the cache's 5% margin aside
  const double row = 64 * 4.0 + HostTier::kSlotWords * sizeof(int64_t);
  BOOST_CHECK_GT(double(used) + 0.08 * double(huge.tier.cache_rows) * row, double(small.memory_budget));
  BOOST_CHECK_MESSAGE(has(format_plan(h, p), strprintf("host cache %lld rows", (long long)huge.tier.cache_rows)) &&
                          has(format_plan(h, p), "(auto)"),
                      format_plan(h, p));
  // planned_tier: the plan's choice for an automatic table, the configuration's otherwise
  BOOST_CHECK(planned_tier(h.tables[0], huge).tier == TableTier::host);
  CollectionTableConfig fixed = h.tables[0];
  fixed.tier = TierConfig{};
  BOOST_CHECK(planned_tier(fixed, huge).tier == TableTier::hbm);

  // the cache asked for is the one taken
  h.tables[0].tier = make_tier(TableTier::automatic, 5000, 0, Eviction::lfu, 64, 0);
  const Plan asked = make_plan(h, small, {});
  BOOST_CHECK(asked.tables[0].tier.tier == TableTier::host);
  BOOST_CHECK_EQUAL(asked.tables[0].tier.cache_rows, 5000);
  BOOST_CHECK(asked.tables[0].tier.eviction == Eviction::lfu);

  // 16-bit rows go to host memory as well, as stored: half the bytes a row in the store, and a larger cache
  h.tables[0].tier = make_tier(TableTier::automatic, 0, 0, Eviction::lru, 64, 0);
  h.tables[0].storage = RowStorage::bf16;
  const Plan p16 = make_plan(h, small, {});
  BOOST_CHECK(p16.tables[0].tier.tier == TableTier::host);
  BOOST_CHECK_GT(p16.tables[0].tier.cache_rows, huge.tier.cache_rows);
  BOOST_CHECK_EQUAL(p16.tables[0].host_bytes, HostTier::host_bytes(10000000, 32, 0));
  h.tables[0].storage = RowStorage::fp32;
  // hashed: its key index alone is beyond the budget, so host memory cannot take it either
  h.tables[0].direct_index = false;
  h.tables[0].key_bound = 0;
  const std::string eh = error_of([&] { make_plan(h, small, {}); });
  BOOST_CHECK_MESSAGE(has(eh, "'huge'") && has(eh, "its index alone would take"), eh);
  BOOST_CHECK(has(error_of([] { parse_tier("cache", "embedding.tier"); }), "hbm, host or auto"));
  BOOST_CHECK(parse_tier("auto", "embedding.tier") == TableTier::automatic);
}
