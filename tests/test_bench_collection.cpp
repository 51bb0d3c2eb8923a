// bench_collection (experiments/bench_collection.cpp) as the lead runs it, on tiny shapes on the cpu backend
// under mpiexec with 1 and 2 ranks: exit status 0, one table row and one JSON line per (placement, batch), every
// parameter and the provenance in the JSON, the figures consistent with each other (samples/s = global batch /
// step time, the check's value count from the shapes), 0 wrong; bad options end every rank with a message that
// names them. A fresh --seed each run: new keys, gradients and initial values for the benchmark's own check.
// Needs SPARTA_TOOLS and SPARTA_MPIEXEC (tests/run_all.sh sets them).
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "src/planner.h"
#include "tests/testing.h"

namespace {

testing::CommandResult bench(int ranks, const std::string& args) {
  return testing::run_command(testing::tool_command("../bin/bench_collection", ranks, "--device cpu " + args, 120));
}

// The raw text of a top-level field of a one-line JSON object ("" when absent): a number, a quoted string
// (quotes kept), an array or null. Enough for the lines bench_collection writes (no nested objects).
std::string field(const std::string& line, const std::string& name) {
  const std::string tag = "\"" + name + "\":";
  size_t p = line.find(tag);
  if (p == std::string::npos) return "";
  p += tag.size();
  size_t e = p;
  if (line[p] == '"') {
    e = p + 1;
    while (e < line.size() && !(line[e] == '"' && line[e - 1] != '\\')) ++e;
    return line.substr(p, e + 1 - p);
  }
  if (line[p] == '[') return line.substr(p, line.find(']', p) + 1 - p);
  while (e < line.size() && line[e] != ',' && line[e] != '}') ++e;
  return line.substr(p, e - p);
}
double number(const std::string& line, const std::string& name) {
  std::string v = field(line, name);
  BOOST_REQUIRE_MESSAGE(!v.empty() && v != "null", "field " << name << " missing or null in " << line.substr(0, 200));
  return std::strtod(v.c_str(), nullptr);
}
std::string text(const std::string& line, const std::string& name) {
  std::string v = field(line, name);
  BOOST_REQUIRE_MESSAGE(v.size() >= 2 && v.front() == '"', "field " << name << " not a string in " << line.substr(0, 200));
  return v.substr(1, v.size() - 2);
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

unsigned long long fresh_seed() { return testing::rng()() >> 1; }

struct Expect {
  int ranks;
  std::string tables;
  std::vector<std::string> placements;
  std::vector<long long> batches;
  long long width;          // floats per sample of the output: the sum of the tables' dims
  int keys_per_sample;
  int check_samples;
};

// Runs bench_collection and checks its table and JSON lines against what the arguments imply.
void run_and_check(const Expect& x, const std::string& extra) {
  testing::ScopedPath out("bench_collection", "out.jsonl");
  std::string placements, batches;
  for (const std::string& p : x.placements) placements += (placements.empty() ? "" : ",") + p;
  for (long long b : x.batches) batches += (batches.empty() ? "" : ",") + std::to_string(b);
  const unsigned long long seed = fresh_seed();
  std::string args = "--tables " + x.tables + " --placements " + placements + " --batch " + batches +
                     " --check-samples " + std::to_string(x.check_samples) + " --warmup 1 --iters 2 --seed " +
                     std::to_string(seed) + " --out " + out.path + " " + extra;
  testing::CommandResult r = bench(x.ranks, args);
  BOOST_TEST_MESSAGE(r.output);
  BOOST_REQUIRE_MESSAGE(r.status == 0, "bench_collection " << args << " exited " << r.status << ":\n" << r.output);
  BOOST_CHECK(r.output.find("#wrong") != std::string::npos);
  BOOST_CHECK(r.output.find("# checked: 0 wrong value(s)") != std::string::npos);

  std::vector<std::string> lines = lines_of(out.path);
  BOOST_REQUIRE_EQUAL(lines.size(), x.placements.size() * x.batches.size());
  std::map<std::string, double> mem;  // placement → mem_GB (first batch)
  size_t i = 0;
  for (long long batch : x.batches)
    for (const std::string& p : x.placements) {
      const std::string& l = lines[i++];
      BOOST_TEST_CONTEXT(l.substr(0, 300)) {
        BOOST_CHECK_EQUAL(text(l, "bench"), "collection");
        BOOST_CHECK_EQUAL(text(l, "placement"), p);
        BOOST_CHECK_EQUAL(text(l, "exchange"), extra.find("--exchange bf16") != std::string::npos ? "bf16" : "fp32");
        BOOST_CHECK_EQUAL(text(l, "output"), extra.find("--output bf16") != std::string::npos   ? "bf16"
                                             : extra.find("--output fp16") != std::string::npos ? "fp16"
                                                                                                : "fp32");
        BOOST_CHECK_EQUAL(text(l, "tables"), x.tables);
        BOOST_CHECK_EQUAL(number(l, "batch"), double(batch));
        BOOST_CHECK_EQUAL(number(l, "global_batch"), double(batch * x.ranks));
        BOOST_CHECK_EQUAL(number(l, "ranks"), double(x.ranks));
        BOOST_CHECK_EQUAL(number(l, "keys_per_sample"), double(x.keys_per_sample));
        BOOST_CHECK_EQUAL(number(l, "iters"), 2.0);
        BOOST_CHECK_EQUAL(number(l, "warmup"), 1.0);
        BOOST_CHECK_EQUAL(number(l, "seed"), double(seed));
        BOOST_CHECK_EQUAL(text(l, "backend"), "cpu");
        BOOST_CHECK_EQUAL(text(l, "comm_mode"), x.ranks > 1 ? "mpi" : "none");
        // every table under the placement asked for (plan: whatever the planner chose, one per table)
        const std::string plan = text(l, "plan");
        if (p != "plan") BOOST_CHECK(plan.find("t0:" + p) == 0);
        BOOST_CHECK_EQUAL(plan.find("t0:"), 0u);
        const double ms = number(l, "ms_step"), fwd = number(l, "ms_fwd"), bwd = number(l, "ms_bwd");
        BOOST_CHECK(ms > 0 && fwd > 0 && bwd > 0 && number(l, "ms_step_min") <= ms);
        BOOST_CHECK(number(l, "ms_step_back_to_back") > 0);
        const double sps = number(l, "samples_per_s");
        BOOST_CHECK_CLOSE(sps, double(batch * x.ranks) / (ms / 1e3), 0.01);
        // one rank moves nothing; two ranks move something under every placement
        const double moved = number(l, "MB_moved_planned");
        if (x.ranks == 1) BOOST_CHECK_EQUAL(moved, 0.0);
        else BOOST_CHECK(moved > 0);
        BOOST_CHECK_EQUAL(field(l, "MB_moved_measured"), "null");
        // the planner's estimate: every table adds local work at least (with the default rates recorded)
        BOOST_CHECK(number(l, "ms_step_planned") > 0);
        BOOST_CHECK_EQUAL(number(l, "planner_link_GBps"), sparta::PlannerRates().link_GBps);
        BOOST_CHECK_EQUAL(number(l, "planner_group_us"), sparta::PlannerRates().group_us);
        // its terms give it back at the recorded rates: a group
        // opened by at least one table and at most by each, every group's collectives (3 to 6) with more than one rank
        const sparta::PlannerRates rates;
        const double groups = number(l, "planned_groups"), collectives = number(l, "planned_collectives");
        const double terms = moved / rates.link_GBps + number(l, "planned_local_MB") / rates.hbm_GBps +
                             (collectives * rates.collective_us + groups * rates.group_us) / 1e3;
        BOOST_CHECK_CLOSE(terms, number(l, "ms_step_planned"), 1e-3);
        BOOST_CHECK(number(l, "planned_local_MB") > 0);
        BOOST_CHECK(groups >= 1 && groups <= number(l, "num_tables"));
        if (x.ranks == 1) BOOST_CHECK_EQUAL(collectives, 0.0);
        else BOOST_CHECK(collectives >= 3 * groups && collectives <= 6 * groups);
        BOOST_CHECK(number(l, "mem_GB") > 0);
        BOOST_CHECK_EQUAL(field(l, "device_used_GB"), "null");  // cpu
        // two forwards (fresh keys, then after the update) of every rank's check samples, every column
        BOOST_CHECK_EQUAL(number(l, "checked_values"), double(2LL * x.ranks * x.check_samples * x.width));
        BOOST_CHECK_EQUAL(number(l, "wrong"), 0.0);
        // rows held after the timed steps: with the prefill every key of [0, cardinality) once per owner (every
        // rank for a replicated table, hot keys too under hybrid), and nothing new while timed; without it the
        // tables fill during the steps
        const bool prefill = extra.find("--prefill 0") == std::string::npos;
        BOOST_CHECK_EQUAL(number(l, "prefill"), prefill ? 1.0 : 0.0);
        const std::string rows = field(l, "rows");
        double keys = 0;
        for (size_t q = 1; q < rows.size(); q = rows.find(',', q) + 1) {
          keys += std::strtod(rows.c_str() + q, nullptr);
          if (rows.find(',', q) == std::string::npos) break;
        }
        const double held = number(l, "rows_in_use"), fresh = number(l, "new_rows_per_step");
        if (prefill) {
          BOOST_CHECK_GE(number(l, "prefill_forwards"), 1.0);
          BOOST_CHECK_EQUAL(fresh, 0.0);
          if (p == "dispatch" || p == "localized" || p == "distributed") BOOST_CHECK_EQUAL(held, keys);
          if (p == "replicated") BOOST_CHECK_EQUAL(held, keys * x.ranks);
          BOOST_CHECK(held >= keys && held <= keys * x.ranks);
        } else {
          BOOST_CHECK_EQUAL(number(l, "prefill_forwards"), 0.0);
          BOOST_CHECK(fresh > 0 && held < keys * x.ranks);
        }
        // provenance
        BOOST_CHECK(!text(l, "git").empty());
        BOOST_CHECK(text(l, "command").find("bench_collection") != std::string::npos);
        BOOST_CHECK(!text(l, "host").empty());
        BOOST_CHECK(!text(l, "date").empty());
        const std::string devices = field(l, "devices");
        BOOST_CHECK_EQUAL(std::count(devices.begin(), devices.end(), '"'), 2 * x.ranks);
        if (batch == x.batches.front()) mem[p] = number(l, "mem_GB");
      }
    }
  // A replicated table is whole on every rank; a key % world shard holds about 1.25 / world of it.
  if (x.ranks > 1 && mem.count("replicated") && mem.count("dispatch"))
    BOOST_CHECK_GT(mem["replicated"], mem["dispatch"]);
}

const std::vector<std::string> kAll = {"dispatch", "localized", "replicated", "distributed", "hybrid", "plan"};

}  // namespace

BOOST_AUTO_TEST_CASE(mlperf_one_hot_every_placement_one_and_two_ranks) {
  for (int ranks : {1, 2})
    run_and_check(Expect{ranks, "mlperf-v1", kAll, {256}, 26 * 16, 26, 16}, "--row-cap 10000 --dim 16");
}

BOOST_AUTO_TEST_CASE(dcnv2_multi_hot_skewed_adagrad_two_ranks_batch_sweep) {
  // 214 keys a sample (PERF.md's DCNv2 hotness), power-law keys, Adagrad, two local batches
  run_and_check(Expect{2, "dcnv2", kAll, {128, 64}, 26 * 8, 214, 8},
                "--row-cap 10000 --dim 8 --alpha 1.1 --optimizer adagrad --lr 0.05");
}

BOOST_AUTO_TEST_CASE(without_the_prefill_the_steps_insert_keys) {
  // 10000-row tables, 2 x 256 uniform keys a step: most keys of the timed steps are new
  run_and_check(Expect{2, "mlperf-v1", {"dispatch", "replicated", "plan"}, {256}, 26 * 8, 26, 8},
                "--row-cap 10000 --dim 8 --prefill 0");
}

BOOST_AUTO_TEST_CASE(custom_tables_two_ranks) {
  // tables of different dims and hotness, one smaller than the world, one capped
  run_and_check(Expect{2, "custom", {"dispatch", "localized", "distributed", "hybrid", "plan"}, {100}, 8 + 4 + 16, 2 + 1 + 5, 8},
                "--rows-list 1,5000,300 --dims 8,4,16 --hotness-list 2,1,5 --row-cap 2000");
}

BOOST_AUTO_TEST_CASE(bf16_exchange_every_placement_two_ranks) {
  // the check (within the bf16 tolerance) must still find no wrong value, and the JSON says bf16
  run_and_check(Expect{2, "mlperf-v1", kAll, {256}, 26 * 16, 26, 16}, "--row-cap 10000 --dim 16 --exchange bf16");
}

BOOST_AUTO_TEST_CASE(bf16_and_fp16_output_two_ranks) {
  // a 16-bit output and gradient: the check (the output widened, within its rounding) finds no wrong value, and
  // the JSON says which type; bf16 together with the bf16 exchange once
  run_and_check(Expect{2, "mlperf-v1", {"dispatch", "distributed", "hybrid"}, {64}, 26 * 8, 26, 16},
                "--row-cap 10000 --dim 8 --output bf16 --exchange bf16");
  run_and_check(Expect{2, "custom", {"localized", "replicated", "plan"}, {64}, 8 + 4 + 16, 2 + 1 + 5, 8},
                "--rows-list 1,5000,300 --dims 8,4,16 --hotness-list 2,1,5 --row-cap 2000 --output fp16");
}

BOOST_AUTO_TEST_CASE(bad_options_end_every_rank_with_a_message) {
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"--batch 8 --placements dispatch,sideways", "sideways"},
      {"--batch 8 --tables custom", "--rows-list"},
      {"--batch 8 --tables custom --rows-list 10,20 --dims 8,8,8", "--dims"},
      {"--batch 8 --tables dcnv2 --rows-list 10", "--tables custom"},
      {"--batch 8 --optimizer adam", "--optimizer"},
      {"--batch 8,0", "--batch"},
      {"--batch 8 --comm-mode pigeon", "pigeon"},
      {"--batch 8 --exchange fp16", "--exchange"},
      {"--batch 8 --output f64", "--output: fp32, bf16 or fp16, found 'f64'"},
      {"--batch 8 --planner-link-gbps 0", "--planner-link-gbps must be > 0"},
      {"--batch 8 --planner-group-us -2", "--planner-group-us must be > 0"},
  };
  for (const Case& c : cases) {
    testing::CommandResult r = bench(2, c.args + " --row-cap 100 --dim 4 --iters 1 --warmup 0");
    BOOST_TEST_CONTEXT(c.args) {
      BOOST_CHECK_EQUAL(r.status, 1);
      BOOST_CHECK_MESSAGE(r.output.find(c.says) != std::string::npos, r.output);
    }
  }
}
