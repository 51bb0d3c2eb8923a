// The planner (src/planner.h): configuration checks, explicit plans honoured, the cost model against values
// computed by hand, auto picking the cheapest placement that fits, localized owners spread over ranks, hybrid hot
// sets from key counts, and a plan that does not fit: a sparta::Error naming the table and the shortfall.
#include <boost/test/unit_test.hpp>
#include <cmath>

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

BOOST_AUTO_TEST_CASE(auto_picks_the_cheapest_placement_that_fits) {
  CollectionConfig c;
  c.num_slots = 2;
  c.tables = {table("big", 100000, 32, {0}), table("small", 1000, 32, {1})};
  PlannerOptions o;
  o.world = 4;
  o.global_batch = 4096;
  // no limit: each table's placement is the cheapest of all
  Plan p = make_plan(c, o, {});
  for (size_t i = 0; i < 2; ++i)
    for (Placement q : {Placement::dispatch, Placement::localized, Placement::replicated, Placement::distributed})
      BOOST_CHECK_LE(p.tables[i].bytes_per_step, placement_cost(c.tables[i], q, o, {}, 0, 1.25).bytes_per_step);
  // a budget below the whole big table: it must be sharded, and every rank stays within the budget
  o.memory_budget = bytes(100000, 32) / 2;
  p = make_plan(c, o, {});
  BOOST_CHECK(p.tables[0].placement == Placement::dispatch || p.tables[0].placement == Placement::distributed);
  BOOST_CHECK_LE(p.tables[0].memory_bytes + p.tables[1].memory_bytes, o.memory_budget);
  // one rank: nothing moves, so the simplest placement
  o.world = 1;
  o.memory_budget = 0;
  p = make_plan(c, o, {});
  for (const TablePlan& t : p.tables) BOOST_CHECK(t.placement == Placement::replicated);
}

BOOST_AUTO_TEST_CASE(localized_owners_spread_over_ranks) {
  CollectionConfig c;
  c.num_slots = 3;
  c.tables = {table("a", 5000, 16, {0}, "localized"), table("b", 4000, 16, {1}, "localized"),
              table("c", 3000, 16, {2}, "localized")};
  PlannerOptions o;
  o.world = 3;
  o.memory_budget = bytes(5000, 16);  // one table per rank
  Plan p = make_plan(c, o, {});
  std::vector<int> owners;
  for (const TablePlan& t : p.tables) owners.push_back(t.owner);
  std::sort(owners.begin(), owners.end());
  BOOST_CHECK(owners == std::vector<int>({0, 1, 2}));
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
  // the shortfall of the placement that comes closest: a key % world shard, less the budget
  const size_t shard = bytes(modulo_shard_rows(10000000, 2, 1.25), 64);
  const double short_mib = double(shard - o.memory_budget) / (1024.0 * 1024.0);
  std::string e = error_of([&] { make_plan(c, o, {}); });
  BOOST_CHECK_MESSAGE(has(e, "'huge'") && has(e, "does not fit") && has(e, strprintf("%.2f MiB", short_mib)), e);
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
  for (const char* col : {"table", "rows", "dim", "placement", "owner", "memory/rank", "bytes/step"})
    BOOST_CHECK_MESSAGE(has(s, col), "column " << col << " missing in\n" << s);
  BOOST_CHECK(has(s, "users") && has(s, "100000") && has(s, "dispatch") && has(s, "key%W"));
  BOOST_CHECK(has(s, "items") && has(s, "localized") && has(s, " 1 "));
  BOOST_CHECK_EQUAL(std::count(s.begin(), s.end(), '\n'), 3);
}

}  // namespace
