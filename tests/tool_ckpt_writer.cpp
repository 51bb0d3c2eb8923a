// tool_ckpt_writer: writes checkpoint after checkpoint of sizable tables whose every value is a function of
// (seed, step, table, key, column), and checks a checkpoint against that function. test_ckpt_crash kills it
// in the middle of a save and proves that `latest` still names a whole checkpoint; test_checkpoint uses it to
// make checkpoints for the single-process tools.
//   mpiexec -n W tool_ckpt_writer write ROOT [--first-step S] [--steps K | --loop] [--rows N] [--seed X]
//                                 [--pause-step S --pause-at STAGE --signal FILE] [--progress FILE]
//                                 [--write-budget BYTES [--budget-rank R]] [--count-bytes]
//   mpiexec -n V tool_ckpt_writer check PATH [--rows N] [--seed X]
// write: rank r of W holds rows of global index g = i*W + r (i < N), key = 4g + 1, in tables "user" (dim 32,
// adam: state 64) and "item" (dim 8, sgd: no state), and one dense tensor "mlp.w" [3, 5]. --pause-at makes rank 0
// write FILE and sleep forever at that save stage (see SaveOptions) of step --pause-step; --loop never stops;
// --progress gets a line "saved <step>" after each save; --write-budget makes rank R's (default 0) disk full after
// BYTES bytes of each save (SaveOptions::write_budget); --count-bytes prints "rank R wrote N bytes" per save.
// check: loads PATH (a root or a step directory) onto V ranks with a hash placement and checks every row, the
// dense tensor and the metadata exactly; exit 0 when all agree, 1 otherwise. A failed save exits with 2.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "src/base/check.h"
#include "src/base/half.h"
#include "io/checkpoint.h"
#include "io/h5.h"
#include "src/context.h"

namespace {

using sparta::TableRows;

struct Args {
  std::string mode, path, pause_at, signal, progress;
  int64_t first_step = 1, steps = 1, rows = 20000, pause_step = -1, write_budget = -1;
  int budget_rank = 0;
  bool count_bytes = false;
  uint64_t seed = 12345;
  bool loop = false;
};

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The value of (step, table, key, column) in [-1, 1); salt tells values from state.
float value_of(const Args& a, int64_t step, int table, int64_t key, int column, int salt) {
  uint64_t h = mix(a.seed ^ mix(uint64_t(step) * 31 + table) ^ mix(uint64_t(key) * 131 + uint64_t(column) * 7 + salt));
  return float(h >> 40) / float(1 << 23) - 1.0f;
}

struct TableDef {
  const char* name;
  int dim;
  const char* optimizer;
  int state_width;
  const char* storage;  // TableRows::storage: item's values are bf16 (stored as uint16 bits)
};
const TableDef kTables[] = {{"user", 32, "adam", 64, "fp32"}, {"item", 8, "sgd", 0, "bf16"}};

sparta::ModelSpec spec() {
  sparta::ModelSpec s;
  for (const TableDef& t : kTables) s.tables.push_back({t.name, t.dim, t.optimizer, t.state_width});
  s.dense.push_back({"mlp.w", {3, 5}});
  return s;
}

void fill_row(const Args& a, int64_t step, int table, int64_t key, TableRows& t) {
  t.keys.push_back(key);
  for (int j = 0; j < t.dim; ++j) {
    const float v = value_of(a, step, table, key, j, 0);
    t.values.push_back(t.storage == "bf16" ? sparta::bf16_to_float(sparta::float_to_bf16(v)) : v);
  }
  for (int j = 0; j < t.state_width; ++j) t.state.push_back(value_of(a, step, table, key, j, 1));
}

sparta::CheckpointMeta meta_of(const Args& a, int64_t step) {
  sparta::CheckpointMeta m;
  m.step = step;
  m.plan = "user:dispatch item:dispatch";
  m.config = "tool_ckpt_writer seed " + std::to_string(a.seed);
  m.rng_state = {int64_t(a.seed), step};
  m.reader_position = {step * 100, 7};
  return m;
}

void write_one(const Args& a, int64_t step, int rank, int world) {
  std::vector<TableRows> tables;
  for (int ti = 0; ti < 2; ++ti) {
    TableRows t;
    t.name = kTables[ti].name;
    t.dim = kTables[ti].dim;
    t.optimizer = kTables[ti].optimizer;
    t.state_width = kTables[ti].state_width;
    t.storage = kTables[ti].storage;
    for (int64_t i = 0; i < a.rows; ++i) fill_row(a, step, ti, 4 * (i * world + rank) + 1, t);
    tables.push_back(std::move(t));
  }
  std::vector<sparta::DenseTensor> dense;
  if (rank == 0) {
    sparta::DenseTensor d{"mlp.w", {3, 5}, {}};
    for (int j = 0; j < 15; ++j) d.data.push_back(value_of(a, step, 99, 0, j, 2));
    dense.push_back(d);
  }
  sparta::SaveOptions opt;
  const int64_t plenty = int64_t(1) << 40;
  if (rank == a.budget_rank) opt.write_budget = a.count_bytes ? plenty : a.write_budget;
  opt.on_stage = [&](const std::string& stage) {
    if (a.count_bytes && rank == a.budget_rank && stage == "latest_written")
      std::printf("rank %d wrote %lld bytes\n", rank, static_cast<long long>(plenty - sparta::h5::write_budget()));
    if (step != a.pause_step || stage != a.pause_at || rank != 0) return;
    std::ofstream(a.signal) << stage << "\n";
    while (true) sleep(1);  // the test kills us here, mid-save
  };
  sparta::save_checkpoint(MPI_COMM_WORLD, a.path, meta_of(a, step), dense, tables, opt);
  if (rank == 0 && !a.progress.empty()) std::ofstream(a.progress, std::ios::app) << "saved " << step << "\n";
}

int64_t owner_hash(int64_t key, int table, int world) { return int64_t(mix(uint64_t(key) ^ (uint64_t(table) << 56)) % uint64_t(world)); }

// Every check on every rank; returns the number of problems seen on this rank (first few printed).
int check(const Args& a, int rank, int world) {
  sparta::LoadedCheckpoint c = sparta::load_checkpoint(
      MPI_COMM_WORLD, a.path, spec(), [&](int table, int64_t key) { return int(owner_hash(key, table, world)); });
  const sparta::CheckpointMeta& m = c.manifest.meta;
  const int64_t step = m.step, old_world = m.world_size;
  int bad = 0;
  auto problem = [&](const std::string& what) {
    if (bad++ < 5) std::fprintf(stderr, "check: rank %d: %s\n", rank, what.c_str());
  };
  sparta::CheckpointMeta want = meta_of(a, step);
  if (m.plan != want.plan || m.config != want.config || m.rng_state != want.rng_state ||
      m.reader_position != want.reader_position)
    problem("metadata differs");
  for (int j = 0; j < 15; ++j)
    if (c.dense.size() != 1 || c.dense[0].data.size() != 15 || c.dense[0].data[j] != value_of(a, step, 99, 0, j, 2))
      problem("dense value " + std::to_string(j) + " differs");
  for (int ti = 0; ti < 2; ++ti) {
    const TableRows& t = c.tables[ti];
    TableRows expect;
    expect.dim = t.dim;
    expect.state_width = t.state_width;
    expect.storage = kTables[ti].storage;  // the loaded rows carry no storage: values are fp32 either way
    for (size_t i = 0; i < t.rows(); ++i) {
      int64_t key = t.keys[i];
      if (key % 4 != 1 || (key - 1) / 4 >= old_world * a.rows) problem("unexpected key " + std::to_string(key));
      if (owner_hash(key, ti, world) != rank) problem("key " + std::to_string(key) + " on the wrong rank");
      fill_row(a, step, ti, key, expect);
    }
    if (expect.values != t.values || expect.state != t.state) problem(std::string("table ") + t.name + ": rows differ");
    int64_t mine = int64_t(t.rows()), total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (total != old_world * a.rows)
      problem(std::string("table ") + t.name + ": " + std::to_string(total) + " rows, expected " +
              std::to_string(old_world * a.rows));
  }
  if (rank == 0)
    std::printf("check: step %lld written by %lld ranks, loaded on %d\n", static_cast<long long>(step),
                static_cast<long long>(old_world), world);
  return bad;
}

Args parse(int argc, char** argv) {
  Args a;
  SPARTA_REQUIRE(argc >= 3, "usage: tool_ckpt_writer write|check PATH [options]");
  a.mode = argv[1];
  a.path = argv[2];
  for (int i = 3; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--loop" || k == "--count-bytes") {
      (k == "--loop" ? a.loop : a.count_bytes) = true;
      continue;
    }
    SPARTA_REQUIRE(i + 1 < argc, "option %s: missing value", k.c_str());
    std::string v = argv[++i];
    if (k == "--first-step") a.first_step = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--rows") a.rows = std::stoll(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--pause-step") a.pause_step = std::stoll(v);
    else if (k == "--pause-at") a.pause_at = v;
    else if (k == "--signal") a.signal = v;
    else if (k == "--progress") a.progress = v;
    else if (k == "--write-budget") a.write_budget = std::stoll(v);
    else if (k == "--budget-rank") a.budget_rank = std::stoi(v);
    else throw sparta::Error("unknown option " + k);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  try {
    Args a = parse(argc, argv);
    if (a.mode == "write") {
      for (int64_t s = a.first_step; a.loop || s < a.first_step + a.steps; ++s) write_one(a, s, rank, world);
      return 0;
    }
    SPARTA_REQUIRE(a.mode == "check", "mode: expected write or check, found '%s'", a.mode.c_str());
    int bad = check(a, rank, world), all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) std::printf("check: %s (%d problems)\n", all ? "FAILED" : "ok", all);
    return all ? 1 : 0;
  } catch (const sparta::Error& e) {
    std::fprintf(stderr, "tool_ckpt_writer: rank %d: %s\n", rank, e.what());
    return 2;
  }
}
