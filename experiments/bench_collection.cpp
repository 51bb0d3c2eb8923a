// bench_collection: the model-parallel embedding collection (src/embedding_collection.h) training on synthetic
// keys, one row per (placement, local batch): every table under one placement, or the planner's own plan.
//   placement tables batch ranks | ms_step ms_fwd ms_bwd | Msamples/s | MB_moved mem_GB | #wrong
//
//   mpiexec -n 2 bench_collection --tables dcnv2 --placements dispatch,localized,replicated,distributed,hybrid,plan
//                                 --batch 65536 --out results/collection.jsonl
//
// Tables: mlperf-v1 (the 26 MLPerf DLRM cardinalities of /work/shared/PERF.md capped at --row-cap, one key per
// slot), dcnv2 (the same tables, the MLPerf DCNv2 keys per slot), or custom (--rows-list, --dims, --hotness-list).
// One table per slot, sum combiner, --dim wide unless --dims says otherwise.
//
// Keys: counter-based (src/base/random.h): key j of global sample g at step i is a pure function of (seed, i,
// g, j), so each rank makes its own samples with no communication, every placement sees the same batches, and
// a table's keys lie in [0, cardinality): power law P(rank) ~ rank^-alpha (alpha 0: uniform) over a fixed
// permutation of the table's keys, so the frequent keys spread over the owners. The planner's key statistics
// come from a sample batch of the same generator.
//
// A point: a fresh collection; with --prefill 1 (the default) and hashed tables, train-mode forwards over every key
// of every table (no backward: the keys inserted with their initial values, JSON prefill_forwards), so that the
// steps time full tables as late in a long run, not their filling (uniform keys on a 4M-row table insert most of a
// step's keys for hundreds of steps); then warm-up steps and timed steps of forward (train) and backward with the
// optimizer's update. JSON rows_in_use: the rows the ranks' shards hold after the timed steps
// (EmbeddingCollection::rows_in_use, summed over ranks); new_rows_per_step: the rows the timed steps inserted, per
// step (0 with --prefill 1 and uniform or power-law keys in [0, cardinality)). Each part is timed with support_bench's DeviceTimer (CUDA events on
// the compute stream; the steady clock on cpu) after an MPI_Barrier, the backward until every stream of the device
// is idle (so a step's work beside the compute stream, a host tier's write-back, counts in its step and cannot
// finish in the untimed gap before the next); per step the slowest rank's times count, and the medians over steps
// are reported. JSON ms_step_back_to_back: --iters more steps enqueued back to back, their keys on the device
// beforehand, over one timer (the slowest rank's mean): a step's work beside the compute stream may overlap the
// next step's, as in training. Samples/s: the global batch over the (median) step time. MB_moved: what the
// planner's cost model predicts (experiments/PLANNER.md): the bytes the busiest rank sends
// plus receives per step (Plan::estimate); the communicator does not count the bytes it moves, so
// there is no measured figure (JSON "MB_moved_measured": null). mem_GB: the shards of the fullest rank
// (EmbeddingCollection::memory_bytes, which is what the planner estimated); on GPUs the JSON also has the
// device memory in use (cudaMemGetInfo) on the fullest rank, step buffers and the CUDA context included.
// JSON ms_step_planned: the planner's time estimate of the step (Plan::estimate, the plan's total est. ms/step),
// with its terms (planned_local_MB, planned_collectives, planned_groups) and the rates it used
// (--planner-link-gbps, --planner-hbm-gbps, --planner-collective-us, --planner-group-us: src/planner.h).
// A placement that does not fit --memory-budget (GiB per rank; 0: no limit) is skipped with the planner's message.
//
// Options, MPI and device set-up, the check's verdict and the JSON lines (every parameter and the provenance)
// are bench::Driver's (experiments/support_bench.h), as in every bench; its timed repeats are the --iters steps.
//
// Output (--output fp32 | bf16 | fp16, CollectionConfig::output): the type of the pooled output the forward writes
// and of the gradient the backward takes (the timed steps' gradient and the check's are rounded to it on the host).
//
// Check (#wrong; any wrong value fails the run, exit 1): after the timed steps, one more step on --check-samples
// samples per rank whose keys lie outside every table's cardinality (each table's rows bound has room for them):
// no step touched them, so the forward must equal their initial values (kernels/key_init.h) pooled on the host.
// Then a backward with a known gradient and an eval forward of the same samples, against the host's update of
// those initial values by the gradient summed over every rank's check samples: a key routed to the wrong rank, a
// gradient summed into the wrong row or a vector returned to the wrong bag fails. The check keys are shared by
// the ranks (a small pool per table), so the distinct-key and cross-rank paths are exercised. Under hybrid, half
// of a table's pool is added to its hot set, so both the hot and the cold path are checked. Under a 16-bit --output
// the host's gradient is the rounded one the collection was given, and the output is widened to float to compare.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "experiments/support_bench.h"
#include "io/synthetic.h"
#include "kernels/key_init.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/half.h"
#include "src/base/random.h"
#include "src/context.h"
#include "src/embedding_collection.h"
#include "src/options.h"
#include "src/planner.h"
#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace sparta;

namespace {

struct Args {
  std::string tables = "mlperf-v1", rows_list, dims, hotness_list, batch = "65536",
              placements = "dispatch,localized,replicated,distributed,hybrid,plan", optimizer = "rowwise_adagrad",
              comm_mode,
              exchange = "fp32", output = "fp32", index = "hashed", table_placements, storage = "fp32";
  int64_t row_cap = 4000000;
  int dim = 128, warmup = 5, iters = 20, check_samples = 64;  // warmup, iters: the driver's --warmup, --iters
  int prefill = 1, trace = 0, plan_only = 0;
  double alpha = 0, memory_budget_gib = 0, timeout = 300;
  std::string tier = "hbm", eviction = "lru";  // --tier, --eviction
  double cache_gb = 0;                         // --cache-gb
  int64_t cache_rows = 0;                      // --cache-rows
  PlannerRates rates;  // --planner-link-gbps, --planner-hbm-gbps, --planner-collective-us, --planner-group-us
  float lr = 0.01f;
  unsigned long long seed = 1;
};

struct Table {
  int64_t card = 0;  // keys of the timed steps lie in [0, card)
  int64_t pool = 1;  // check keys: card + [0, pool)
  int dim = 0, hot = 1;
};

// ---- the key generator

// Key u in [0, 1) of table t: rank from the power law's inverse CDF (continuous, as bench_embedding), then a
// fixed permutation of [0, card) (multiplication by a number coprime with card).
struct KeyGen {
  std::vector<Table> tables;
  std::vector<int> first;  // position of a table's first key in a sample
  int keys_per_sample = 0;
  double alpha = 0;
  uint64_t seed = 0;
  std::vector<uint64_t> mult;
  std::vector<double> top;  // (card + 1)^(1 - alpha) - 1, or log(card + 1) for alpha 1

  KeyGen(const std::vector<Table>& t, double a, uint64_t s) : tables(t), alpha(a), seed(s) {
    for (const Table& x : tables) {
      first.push_back(keys_per_sample);
      keys_per_sample += x.hot;
      uint64_t m = 2654435761ull % uint64_t(x.card) | 1;
      while (std::__gcd(m, uint64_t(x.card)) != 1) m += 2;
      mult.push_back(m);
      const double n1 = double(x.card) + 1.0;
      top.push_back(alpha == 1.0 ? std::log(n1) : std::pow(n1, 1.0 - alpha) - 1.0);
    }
  }
  int64_t key(size_t t, double u) const {
    const uint64_t n = uint64_t(tables[t].card);
    double r;
    if (alpha == 0) r = u * double(n);
    else if (alpha == 1.0) r = std::exp(u * top[t]) - 1.0;
    else r = std::pow(top[t] * u + 1.0, 1.0 / (1.0 - alpha)) - 1.0;
    const uint64_t rank = std::min<uint64_t>(uint64_t(std::max(r, 0.0)), n - 1);
    return int64_t((unsigned __int128)rank * mult[t] % n);
  }
  // The stream of one step (step < 0: the planner's sample, -2: the check).
  uint64_t stream(int64_t step) const { return hash_mix(seed, uint64_t(step)); }
};

// Runs f(lo, hi) over [0, n) in `threads` contiguous parts.
template <class F>
void parallel_for(int64_t n, int threads, F&& f) {
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, n / 4096)));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&, i] { f(n * i / threads, n * (i + 1) / threads); });
  f(0, n / threads);
  for (std::thread& t : pool) t.join();
}

// Keys of `samples` samples, the first being global sample first_g: [samples, keys_per_sample].
void timed_keys(const KeyGen& kg, int64_t step, int64_t first_g, int64_t samples, int threads, std::vector<int64_t>& keys) {
  const int K = kg.keys_per_sample;
  keys.resize(size_t(samples * K));
  const uint64_t st = kg.stream(step);
  parallel_for(samples, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      const uint64_t base = uint64_t(first_g + s) * uint64_t(K);
      for (size_t t = 0; t < kg.tables.size(); ++t)
        for (int i = 0; i < kg.tables[t].hot; ++i) {
          const int j = kg.first[t] + i;
          keys[size_t(s * K + j)] = kg.key(t, unit_double(hash_mix(st, base + uint64_t(j))));
        }
    }
  });
}

// Keys of prefill forward `round`: sample g's j-th key of table t is key ((round * samples + g) * hot + j) mod card, so
// rounds 0 .. prefill_rounds() - 1 look up every key of [0, card) of every table. Every rank takes the same keys
// (each replicated copy then holds them all).
void prefill_keys(const KeyGen& kg, int64_t round, int64_t samples, int threads, std::vector<int64_t>& keys) {
  const int K = kg.keys_per_sample;
  keys.resize(size_t(samples * K));
  parallel_for(samples, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g)
      for (size_t t = 0; t < kg.tables.size(); ++t) {
        const int64_t hot = kg.tables[t].hot;
        for (int64_t j = 0; j < hot; ++j)
          keys[size_t(g * K + kg.first[t] + j)] = ((round * samples + g) * hot + j) % kg.tables[t].card;
      }
  });
}
int64_t prefill_rounds(const KeyGen& kg, int64_t samples) {
  int64_t n = 0;
  for (const Table& t : kg.tables) n = std::max(n, (t.card + samples * t.hot - 1) / (samples * t.hot));
  return n;
}

// A check key: outside [0, card), from a pool the ranks share.
int64_t check_key(const KeyGen& kg, size_t t, int64_t g, int j) {
  const uint64_t h = hash_mix(kg.stream(-2), uint64_t(g) * uint64_t(kg.keys_per_sample) + uint64_t(j));
  return kg.tables[t].card + int64_t(h % uint64_t(kg.tables[t].pool));
}

// Upstream gradient element (sample g, column c): uniform in [-1, 1), never all zeros.
float grad_value(uint64_t salt, int64_t g, int64_t width, int64_t c) {
  return float(unit_double(hash_mix(salt, uint64_t(g * width + c))) * 2.0 - 1.0);
}

std::vector<float> gradient(uint64_t salt, int64_t first_g, int64_t samples, int64_t width, int threads) {
  std::vector<float> g(size_t(samples * width));
  parallel_for(samples, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s)
      for (int64_t c = 0; c < width; ++c) g[size_t(s * width + c)] = grad_value(salt, first_g + s, width, c);
  });
  return g;
}

// ---- the output type

OutputType output_type_of(const std::string& name) {
  SPARTA_REQUIRE(name == "fp32" || name == "bf16" || name == "fp16", "--output: fp32, bf16 or fp16, found '%s'",
                 name.c_str());
  return name == "bf16" ? OutputType::bf16 : name == "fp16" ? OutputType::f16 : OutputType::f32;
}

// A float rounded to the output type and widened back (itself for f32): the value the collection sees.
float in_type(OutputType t, float v) {
  if (t == OutputType::bf16) return bf16_to_float(float_to_bf16(v));
  if (t == OutputType::f16) return f16_to_float(float_to_f16(v));
  return v;
}

// Device values of the output type: floats, or the 16-bit values' bits.
struct Values {
  OutputType type;
  Buffer<float> f;
  Buffer<uint16_t> h;
  Values(const Device& dev, OutputType t, size_t n) : type(t) {
    if (t == OutputType::f32) f = Buffer<float>(dev, n);
    else h = Buffer<uint16_t>(dev, n);
  }
  // v rounded to the type (nearest even).
  Values(const Device& dev, OutputType t, const std::vector<float>& v) : type(t) {
    if (t == OutputType::f32) {
      f = Buffer<float>(dev, v);
      return;
    }
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = t == OutputType::bf16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
    h = Buffer<uint16_t>(dev, b);
  }
  void* data() { return type == OutputType::f32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  void poison() {  // NaN in every type
    if (type == OutputType::f32) f.fill_bytes(0xFF);
    else h.fill_bytes(0xFF);
  }
  std::vector<float> download() const {  // widened to float (exact)
    if (type == OutputType::f32) return f.download();
    std::vector<uint16_t> b = h.download();
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); ++i) v[i] = type == OutputType::bf16 ? bf16_to_float(b[i]) : f16_to_float(b[i]);
    return v;
  }
};

// ---- small helpers

double max_over_ranks(double x) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return x;
}

// Device memory in use on this rank (total - free), or -1 on cpu.
double device_used_bytes(const Device& dev) {
#if SPARTA_CUDA
  if (dev.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return double(total_b - free_b);
  }
#endif
  (void)dev;
  return -1;
}

template <class T>
std::string json_array(const std::vector<T>& v) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
  return o.str() + "]";
}

std::vector<Table> make_tables(const Args& a) {
  std::vector<int64_t> rows;
  std::vector<int> dims, hot;
  if (a.tables == "mlperf-v1" || a.tables == "dcnv2") {
    SPARTA_REQUIRE(a.rows_list.empty() && a.dims.empty() && a.hotness_list.empty(),
                   "--rows-list, --dims and --hotness-list go with --tables custom, found --tables %s", a.tables.c_str());
    rows = preset_cardinality("mlperf");
    if (a.tables == "dcnv2") hot = mlperf_dcnv2_hotness();
  } else {
    SPARTA_REQUIRE(a.tables == "custom", "--tables: mlperf-v1, dcnv2 or custom, found '%s'", a.tables.c_str());
    SPARTA_REQUIRE(!a.rows_list.empty(), "--tables custom needs --rows-list (one cardinality per table)");
    for (double r : bench::parse_list(a.rows_list, "rows-list")) rows.push_back(int64_t(r));
    if (!a.dims.empty())
      for (double d : bench::parse_list(a.dims, "dims")) dims.push_back(int(d));
    if (!a.hotness_list.empty())
      for (double h : bench::parse_list(a.hotness_list, "hotness-list")) hot.push_back(int(h));
  }
  const size_t T = rows.size();
  auto per_table = [&](std::vector<int>& v, int dflt, const char* option) {
    if (v.empty()) v.assign(T, dflt);
    if (v.size() == 1) v.assign(T, v[0]);
    SPARTA_REQUIRE(v.size() == T, "--%s: one value, or one per table (%zu), found %zu", option, T, v.size());
  };
  per_table(dims, a.dim, "dims");
  per_table(hot, 1, "hotness-list");
  SPARTA_REQUIRE(a.row_cap >= 1, "--row-cap must be >= 1, found %lld", (long long)a.row_cap);
  std::vector<Table> tables(T);
  for (size_t t = 0; t < T; ++t) {
    SPARTA_REQUIRE(rows[t] >= 1 && dims[t] >= 1 && hot[t] >= 1,
                   "table %zu: rows, dim and hotness must be >= 1, found %lld, %d, %d", t, (long long)rows[t], dims[t],
                   hot[t]);
    tables[t].card = std::min(rows[t], a.row_cap);
    tables[t].dim = dims[t];
    tables[t].hot = hot[t];
    tables[t].pool = std::max<int64_t>(1, int64_t(a.check_samples) * hot[t]);
  }
  return tables;
}

// --table-placements: one entry per table (auto, a placement, localized:<owner>), for the plan's point.
std::vector<std::string> table_placement_list(const Args& a, size_t tables) {
  std::vector<std::string> v = bench::split_list(a.table_placements);
  SPARTA_REQUIRE(v.size() == tables, "--table-placements: one entry per table (%zu), found %zu", tables, v.size());
  for (size_t t = 0; t < v.size(); ++t) {
    const std::string name = v[t].substr(0, v[t].find(':'));
    if (name == "auto") continue;
    parse_placement(name);
    SPARTA_REQUIRE(name == "localized" || v[t].find(':') == std::string::npos,
                   "--table-placements: table %zu: only localized names an owner, found '%s'", t, v[t].c_str());
  }
  return v;
}

CollectionConfig make_config(const Args& a, const std::vector<Table>& tables, const std::string& placement) {
  CollectionConfig c;
  c.num_slots = int(tables.size());
  c.seed = a.seed;
  c.exchange = a.exchange == "bf16" ? DataType::bf16 : DataType::f32;
  c.output = output_type_of(a.output);
  // The plan: --table-placements' entries (explicit ones honoured, `auto` ones the planner's), or every table auto.
  const std::vector<std::string> chosen = placement == "plan" && !a.table_placements.empty()
                                              ? table_placement_list(a, tables.size())
                                              : std::vector<std::string>(tables.size(), "auto");
  for (size_t t = 0; t < tables.size(); ++t) {
    CollectionTableConfig tc;
    tc.name = "t" + std::to_string(t);
    tc.rows = tables[t].card + tables[t].pool;  // room for the check keys
    tc.key_bound = tc.rows;  // keys (timed and check) lie in [0, rows): the tables can share one grouped lookup
    tc.direct_index = a.index == "direct";  // then every table indexes its keys directly
    tc.dim = tables[t].dim;
    tc.combiner = Combiner::sum;
    tc.optimizer.kind = parse_optimizer(a.optimizer);
    tc.optimizer.lr = a.lr;
    tc.storage = parse_row_storage(a.storage);
    // Adagrad from a zero accumulator moves a row by +-lr whatever its gradient: the check could not tell a
    // gradient's sign rounding from a wrong one. A positive start keeps the update smooth in the gradient.
    tc.optimizer.initial_accumulator = 0.1f;
    tc.optimizer.epsilon = 1e-7f;
    tc.slots = {int(t)};
    tc.placement = placement == "plan" ? chosen[t] : placement;
    tc.init_scale = 0.05f;
    tc.tier = make_tier(parse_tier(a.tier, "--tier"), a.cache_rows, a.cache_gb * 1e9 / 1048576.0,
                        parse_eviction(a.eviction, "--eviction"), row_storage_floats(tc.storage, tc.dim),
                        optimizer_state_width(tc.optimizer.kind, tc.dim));
    c.tables.push_back(tc);
  }
  return c;
}

// CSR offsets of samples with the same keys per slot: [samples * slots + 1].
std::vector<int64_t> fixed_offsets(const KeyGen& kg, int64_t samples) {
  const size_t S = kg.tables.size();
  std::vector<int64_t> off(size_t(samples) * S + 1);
  for (int64_t s = 0; s < samples; ++s)
    for (size_t t = 0; t < S; ++t) off[size_t(s) * S + t] = s * kg.keys_per_sample + kg.first[t];
  off.back() = samples * kg.keys_per_sample;
  return off;
}

// ---- the check

struct Check {
  int64_t wrong = 0, values = 0;
};

// Compares got with want element by element within 1e-6 + rel * mag (mag: the sum of the magnitudes that went
// into want, so a different summation order passes and a missing or foreign term does not). rel: 1e-5, or 1e-2
// under --exchange bf16 (each vector and gradient is rounded to bf16, relative error <= 2^-9, once or twice on its
// way; a missing or foreign term still moves a value by far more); plus, under a 16-bit --output, the output's
// one rounding to nearest (relative error <= 2^-8 for bf16, 2^-11 for fp16; counted as 4e-3 and 5e-4).
void compare(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& mag, double rel,
             Check& c) {
  for (size_t i = 0; i < want.size(); ++i) {
    ++c.values;
    c.wrong += !(std::fabs(double(got[i]) - double(want[i])) <= 1e-6 + rel * double(mag[i]));
  }
}

Check run_check(EmbeddingCollection& coll, const KeyGen& kg, const Args& a, const CollectionConfig& cfg, int rank,
                int world, const Device& dev) {
  const int64_t cs = a.check_samples, width = coll.output_width(), G = cs * world, first_g = int64_t(rank) * cs;
  const int K = kg.keys_per_sample;
  const size_t T = kg.tables.size();
  // The global check batch's keys (every rank makes all of them: the reference needs every rank's gradients).
  std::vector<int64_t> all(size_t(G * K));
  for (int64_t g = 0; g < G; ++g)
    for (size_t t = 0; t < T; ++t)
      for (int i = 0; i < kg.tables[t].hot; ++i)
        all[size_t(g * K + kg.first[t] + i)] = check_key(kg, t, g, kg.first[t] + i);
  std::vector<int64_t> mine(all.begin() + first_g * K, all.begin() + (first_g + cs) * K);
  const uint64_t salt = hash_mix(a.seed, 0xC4ECull);
  const OutputType ot = cfg.output;
  std::vector<float> grad = gradient(salt, first_g, cs, width, 1);
  Buffer<int64_t> off(dev, fixed_offsets(kg, cs)), keys(dev, mine);
  Values out(dev, ot, size_t(cs * width)), g(dev, ot, grad);  // g: rounded to the output type

  // Initial values of a key, and the sum of its gradients over the global batch with their magnitudes.
  std::vector<KeyInit> ki(T);
  for (size_t t = 0; t < T; ++t) ki[t] = KeyInit{cfg.seed, uint32_t(t), cfg.tables[t].init_scale};
  auto init = [&](size_t t, int64_t key, int e) { return initial_value(ki[t], uint64_t(key), uint32_t(e)); };
  // Per table, per pool key: [dim] sums.
  std::vector<std::vector<float>> gsum(T), gabs(T);
  for (size_t t = 0; t < T; ++t) {
    gsum[t].assign(size_t(kg.tables[t].pool * kg.tables[t].dim), 0.f);
    gabs[t].assign(gsum[t].size(), 0.f);
  }
  for (int64_t gi = 0; gi < G; ++gi)
    for (size_t t = 0; t < T; ++t) {
      const int dim = kg.tables[t].dim;
      const int64_t col = coll.slot_column(int(t));
      for (int i = 0; i < kg.tables[t].hot; ++i) {
        const int64_t p = all[size_t(gi * K + kg.first[t] + i)] - kg.tables[t].card;
        for (int e = 0; e < dim; ++e) {
          const float x = in_type(ot, grad_value(salt, gi, width, col + e));
          gsum[t][size_t(p * dim + e)] += x;
          gabs[t][size_t(p * dim + e)] += std::fabs(x);
        }
      }
    }
  const OptimizerConfig& oc = cfg.tables[0].optimizer;
  auto updated = [&](size_t t, int64_t key, int e, float* mag) {
    const int dim = kg.tables[t].dim;
    const size_t p = size_t((key - kg.tables[t].card) * dim + e);
    const float w = init(t, key, e), gs = gsum[t][p];
    float step = oc.lr * gs;
    if (oc.kind == OptimizerKind::adagrad) step = step / (std::sqrt(oc.initial_accumulator + gs * gs) + oc.epsilon);
    if (oc.kind == OptimizerKind::rowwise_adagrad) {  // the row's mean square gradient
      const float* row = gsum[t].data() + size_t((key - kg.tables[t].card) * dim);
      float ms = 0;
      for (int j = 0; j < dim; ++j) ms += row[j] * row[j];
      step = step / (std::sqrt(oc.initial_accumulator + ms / float(dim)) + oc.epsilon);
    }
    // a gradient's rounding moves the update by at most its derivative (lr / sqrt(initial accumulator)) times it
    const float scale = oc.kind == OptimizerKind::sgd ? oc.lr : oc.lr / std::sqrt(oc.initial_accumulator);
    *mag = std::fabs(w) + scale * gabs[t][p];
    return w - step;
  };
  // want[s, col + e] and its magnitude, pooled in key order.
  auto expect = [&](bool after, std::vector<float>& want, std::vector<float>& mag) {
    want.assign(size_t(cs * width), 0.f);
    mag.assign(want.size(), 0.f);
    for (int64_t s = 0; s < cs; ++s)
      for (size_t t = 0; t < T; ++t) {
        const int64_t col = coll.slot_column(int(t));
        for (int e = 0; e < kg.tables[t].dim; ++e) {
          float acc = 0, m = 0;
          for (int i = 0; i < kg.tables[t].hot; ++i) {
            const int64_t key = mine[size_t(s * K + kg.first[t] + i)];
            float km = std::fabs(init(t, key, e));
            acc += after ? updated(t, key, e, &km) : init(t, key, e);
            m += km;
          }
          want[size_t(s * width + col + e)] = acc;
          mag[size_t(s * width + col + e)] = m;
        }
      }
  };
  Check c;
  std::vector<float> want, mag;
  out.poison();  // NaN: an element no route wrote fails
  coll.forward(off.data(), keys.data(), cs, out.data(), LookupMode::train);
  // 16-bit storage: the initial value rounded to nearest (half a 16-bit step: 2^-8 relative for bf16, 2^-11 for
  // fp16), the updated one stochastically (a whole step: 2^-7, 2^-10).
  const RowStorage st = cfg.tables[0].storage;
  const double rel = (cfg.exchange == DataType::bf16 && world > 1 ? 1e-2 : 1e-5) +
                     (ot == OutputType::bf16 ? 4e-3 : ot == OutputType::f16 ? 5e-4 : 0.0) +
                     (st == RowStorage::bf16 ? 1.2e-2 : st == RowStorage::fp16 ? 1.5e-3 : 0.0);
  expect(false, want, mag);
  compare(out.download(), want, mag, rel, c);
  coll.backward(g.data(), int64_t(a.warmup + 2 * a.iters) + 2);  // after the timed and the traced steps
  out.poison();
  coll.forward(off.data(), keys.data(), cs, out.data(), LookupMode::eval);
  expect(true, want, mag);
  compare(out.download(), want, mag, rel, c);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &c.wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &c.values, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  return c;
}

// ---- one point

struct Result {
  double ms_step = 0, ms_fwd = 0, ms_bwd = 0, ms_step_min = 0, ms_step_back_to_back = 0, mb_planned = 0,
         mem_bytes = 0, dev_used = -1;
  int64_t prefill_forwards = 0;  // train forwards over every key before the steps (--prefill 1, hashed tables)
  int64_t rows_timed_start = 0, rows_timed_end = 0;  // rows the ranks' shards hold (summed) before / after the timed steps
  Check check;
  std::string plan;
};

Result run_point(Context& ctx, Communicator* comm, const Args& a, const KeyGen& kg, const CollectionConfig& cfg,
                 const Plan& plan, int64_t batch, int threads) {
  const Device& dev = ctx.device();
  const int rank = ctx.rank(), world = ctx.world();
  Result r;
  r.mb_planned = plan.estimate.link_bytes / 1e6;
  r.plan = plan_summary(cfg, plan);
  EmbeddingCollection coll(MPI_COMM_WORLD, comm, dev, cfg, plan);
  const int64_t width = coll.output_width();
  Buffer<int64_t> off(dev, fixed_offsets(kg, batch)), keys(dev, size_t(batch * kg.keys_per_sample));
  Values out(dev, cfg.output, size_t(batch * width));
  Values grad(dev, cfg.output, gradient(hash_mix(a.seed, 0x6EADull), int64_t(rank) * batch, batch, width, threads));
  std::vector<int64_t> hk;
  auto rows_held = [&] {  // summed over the ranks (waits for each rank's stream)
    int64_t n = coll.rows_in_use();
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    return n;
  };
  if (a.prefill && a.index == "hashed") {  // a direct index holds every row from the start
    r.prefill_forwards = prefill_rounds(kg, batch);
    for (int64_t round = 0; round < r.prefill_forwards; ++round) {
      prefill_keys(kg, round, batch, threads, hk);
      keys.upload(hk);
      coll.forward(off.data(), keys.data(), batch, out.data(), LookupMode::train);
    }
  }
  bench::DeviceTimer timer(dev);
  std::vector<double> fwd, bwd, step;
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    if (i == a.warmup) r.rows_timed_start = rows_held();
    timed_keys(kg, i, int64_t(rank) * batch, batch, threads, hk);
    keys.upload(hk);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    timer.start();
    coll.forward(off.data(), keys.data(), batch, out.data(), LookupMode::train);
    double t[3];
    t[0] = timer.stop_ms();
    timer.start();
    coll.backward(grad.data(), i + 1);
    t[1] = timer.stop_all_ms();  // the step's work beside the compute stream (a host tier's write-back) counts
    t[2] = t[0] + t[1];
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    if (i < a.warmup) continue;
    fwd.push_back(t[0]), bwd.push_back(t[1]), step.push_back(t[2]);
  }
  r.rows_timed_end = rows_held();
  {  // --iters more steps back to back, their keys on the device beforehand: no gap between steps in which the
     // work one leaves beside the compute stream could finish untimed, and none of the per-step waits above
    std::vector<Buffer<int64_t>> ahead;
    for (int i = 0; i < a.iters; ++i) {
      timed_keys(kg, a.warmup + a.iters + i, int64_t(rank) * batch, batch, threads, hk);
      ahead.emplace_back(dev, hk);
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    timer.start();
    for (int i = 0; i < a.iters; ++i) {
      coll.forward(off.data(), ahead[size_t(i)].data(), batch, out.data(), LookupMode::train);
      coll.backward(grad.data(), a.warmup + a.iters + i + 1);
    }
    double t = timer.stop_all_ms() / a.iters;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    r.ms_step_back_to_back = t;
  }
  if (a.trace) {  // one more step, its timeline marked (not timed), every rank's points printed by rank 0
    timed_keys(kg, a.warmup + 2 * a.iters, int64_t(rank) * batch, batch, threads, hk);
    keys.upload(hk);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    coll.trace(true);
    coll.forward(off.data(), keys.data(), batch, out.data(), LookupMode::train);
    coll.backward(grad.data(), a.warmup + 2 * a.iters + 1);
    const std::vector<StreamClock::Point> points = coll.read_trace();
    coll.trace(false);
    bench::print_traces(points, MPI_COMM_WORLD);
  }
  r.ms_fwd = bench::median(fwd);
  r.ms_bwd = bench::median(bwd);
  r.ms_step = bench::median(step);
  r.ms_step_min = *std::min_element(step.begin(), step.end());
  r.mem_bytes = max_over_ranks(double(coll.memory_bytes()));
  r.dev_used = max_over_ranks(device_used_bytes(dev));
  r.check = run_check(coll, kg, a, cfg, rank, world, dev);
  return r;
}

// ---- the run: options, their checks, the table the points print, and each point's plan and record

void add_options(bench::Driver& d, Args& a) {
  d.options().add_options()("tables", po::value(&a.tables)->default_value(a.tables), "mlperf-v1 | dcnv2 | custom")(
      "rows-list", po::value(&a.rows_list), "custom: cardinality of each table (comma list)")(
      "dims", po::value(&a.dims), "custom: dim of each table, or one for all (default --dim)")(
      "hotness-list", po::value(&a.hotness_list), "custom: keys per sample of each table, or one for all (default 1)")(
      "row-cap", po::value(&a.row_cap)->default_value(a.row_cap), "cap on every table's cardinality")(
      "dim", po::value(&a.dim)->default_value(a.dim), "embedding dim of mlperf-v1 and dcnv2 tables")(
      "batch", po::value(&a.batch)->default_value(a.batch), "local batch per rank (comma list: a sweep)")(
      "placements", po::value(&a.placements)->default_value(a.placements),
      "comma list of dispatch, localized, replicated, distributed, hybrid, plan (the planner's own plan)")(
      "index", po::value(&a.index)->default_value(a.index),
      "hashed | direct: every table indexes its keys directly (hybrid: its cold shard)")(
      "alpha", po::value(&a.alpha)->default_value(a.alpha), "power-law exponent of key frequencies (0: uniform)")(
      "optimizer", po::value(&a.optimizer)->default_value(a.optimizer), "rowwise_adagrad | adagrad | sgd")(
      "lr", po::value(&a.lr)->default_value(a.lr), "learning rate")(
      "memory-budget", po::value(&a.memory_budget_gib)->default_value(0),
      "device GiB per rank the planner may fill with tables and their workspaces (0: this device's free memory, "
      "shared among the ranks that drive it, less 1 GiB for the rest)")(
      "planner-link-gbps", po::value(&a.rates.link_GBps)->default_value(a.rates.link_GBps),
      "the planner's link rate: GB/s one rank sends plus receives in an all-to-all")(
      "planner-hbm-gbps", po::value(&a.rates.hbm_GBps)->default_value(a.rates.hbm_GBps),
      "the planner's effective GB/s of local device passes")(
      "planner-collective-us", po::value(&a.rates.collective_us)->default_value(a.rates.collective_us),
      "the planner's fixed cost of one collective, microseconds")(
      "planner-group-us", po::value(&a.rates.group_us)->default_value(a.rates.group_us),
      "the planner's fixed cost per step of one group of tables, microseconds")(
      "exchange", po::value(&a.exchange)->default_value(a.exchange),
      "fp32 | bf16: the wire type of vectors and gradients between ranks (CollectionConfig::exchange)")(
      "storage", po::value(&a.storage)->default_value(a.storage),
      "fp32 | bf16 | fp16: how the tables store their rows (CollectionTableConfig::storage; 16-bit: sgd or "
      "rowwise_adagrad, even dims, stochastic rounding of updates)")(
      "output", po::value(&a.output)->default_value(a.output),
      "fp32 | bf16 | fp16: the type of the pooled output and its gradient (CollectionConfig::output)")(
      "comm-mode", po::value(&a.comm_mode), "nccl | mpi | hier (default: nccl on GPUs, mpi on cpu)")(
      "timeout", po::value(&a.timeout)->default_value(a.timeout), "seconds without progress before the job ends")(
      "prefill", po::value(&a.prefill)->default_value(a.prefill),
      "1: before a point's steps, train-mode forwards over every key of every hashed table (the steps then time full "
      "tables, as late in a long run); 0: the tables fill during the steps (uniform keys on large tables: mostly new "
      "keys, each inserted with its initial values)")(
      "trace", po::value(&a.trace)->default_value(a.trace),
      "1: after a point's timed steps, one more step with its timeline marked (EmbeddingCollection::trace): every "
      "rank's points on the compute and the communication stream, ms since the step's start, printed as # lines")(
      "check-samples", po::value(&a.check_samples)->default_value(a.check_samples), "samples per rank of the check")(
      "seed", po::value(&a.seed)->default_value(a.seed), "seed of keys, gradients and initial values")(
      "table-placements", po::value(&a.table_placements),
      "the plan's point: comma list, one per table, of auto | dispatch | localized[:owner] | replicated | distributed "
      "| hybrid (explicit entries honoured, auto ones the planner's)")(
      "tier", po::value(&a.tier)->default_value(a.tier),
      "hbm | host | auto: host keeps every table's rows in host memory under a GPU cache per rank (src/host_tier.h); "
      "auto, where the planner finds no room in HBM")(
      "cache-gb", po::value(&a.cache_gb)->default_value(a.cache_gb),
      "tier host or auto: each table's GPU cache per rank, GB of rows (values and optimizer state)")(
      "cache-rows", po::value(&a.cache_rows)->default_value(a.cache_rows), "tier host: the cache in rows instead")(
      "eviction", po::value(&a.eviction)->default_value(a.eviction), "tier host: the cache's policy, lru | lfu")(
      "plan-only", po::value(&a.plan_only)->default_value(a.plan_only),
      "1: print the plan of every point (the planner's table and estimate) and time no step");
}

// The options' tables, batches and placements; every rank checks the same options, and agreeing on the verdict
// lets a bad one end the job with status 1.
struct Sweep {
  std::vector<Table> tables;
  std::vector<int64_t> batches;
  std::vector<std::string> placements;
};

Sweep check_options(Args& a) {
  Sweep w;
  std::vector<Table>& tables = w.tables;
  std::vector<int64_t>& batches = w.batches;
  std::vector<std::string>& placements = w.placements;
  agree_on_error(MPI_COMM_WORLD, guarded([&] {
    SPARTA_REQUIRE(a.check_samples >= 1, "--check-samples must be >= 1, found %d", a.check_samples);
    SPARTA_REQUIRE(a.prefill == 0 || a.prefill == 1, "--prefill: 0 or 1, found %d", a.prefill);
    SPARTA_REQUIRE(a.alpha >= 0, "--alpha must be >= 0, found %g", a.alpha);
    const TableTier tier = parse_tier(a.tier, "--tier");
    const bool host = tier == TableTier::host, automatic = tier == TableTier::automatic;
    SPARTA_REQUIRE(parse_eviction(a.eviction, "--eviction") != Eviction::error, "--eviction: lru or lfu, found error");
    SPARTA_REQUIRE(!host || (a.cache_gb > 0) != (a.cache_rows > 0),
                   "--tier host: give the cache as --cache-gb or --cache-rows (one of them), found %g and %lld",
                   a.cache_gb, (long long)a.cache_rows);
    SPARTA_REQUIRE(!automatic || a.cache_gb == 0 || a.cache_rows == 0,
                   "--tier auto: give the cache as --cache-gb or --cache-rows, or neither (the planner sizes it), "
                   "found %g and %lld", a.cache_gb, (long long)a.cache_rows);
    SPARTA_REQUIRE(host || automatic || (a.cache_gb == 0 && a.cache_rows == 0),
                   "--cache-gb, --cache-rows: with --tier host or auto only");
    // a prefill forward has no backward: its rows stay pinned in the cache, so the next one could not evict them
    SPARTA_REQUIRE(!(host || automatic) || a.prefill == 0 || a.index == "direct",
                   "--tier %s: give --prefill 0 (prefill forwards have no update, so the cache could not evict "
                   "their rows)", a.tier.c_str());
    SPARTA_REQUIRE(a.memory_budget_gib >= 0, "--memory-budget must be >= 0 GiB, found %g", a.memory_budget_gib);
    for (const auto& r : {std::make_pair("--planner-link-gbps", a.rates.link_GBps),
                          std::make_pair("--planner-hbm-gbps", a.rates.hbm_GBps),
                          std::make_pair("--planner-collective-us", a.rates.collective_us),
                          std::make_pair("--planner-group-us", a.rates.group_us)})
      SPARTA_REQUIRE(r.second > 0 && std::isfinite(r.second), "%s must be > 0, found %g", r.first, r.second);
    SPARTA_REQUIRE(a.optimizer == "sgd" || a.optimizer == "adagrad" || a.optimizer == "rowwise_adagrad",
                   "--optimizer: sgd, adagrad or rowwise_adagrad, found '%s'", a.optimizer.c_str());
    if (!a.comm_mode.empty()) parse_comm_mode(a.comm_mode);
    SPARTA_REQUIRE(a.exchange == "fp32" || a.exchange == "bf16", "--exchange: fp32 or bf16, found '%s'",
                   a.exchange.c_str());
    output_type_of(a.output);
    try {
      OptimizerConfig oc;
      oc.kind = parse_optimizer(a.optimizer);
      for (const Table& t : make_tables(a)) check_row_storage(parse_row_storage(a.storage), oc, t.dim, "--storage");
    } catch (const Error& e) {
      const std::string m = e.what();
      throw Error(m.rfind("--storage", 0) == 0 ? m : "--storage: " + m);
    }
    tables = make_tables(a);
    if (!a.table_placements.empty()) table_placement_list(a, tables.size());
    SPARTA_REQUIRE(a.plan_only == 0 || a.plan_only == 1, "--plan-only: 0 or 1, found %d", a.plan_only);
    for (double b : bench::parse_list(a.batch, "batch")) {
      SPARTA_REQUIRE(b >= 1, "--batch: local batches must be >= 1, found %g", b);
      batches.push_back(int64_t(b));
    }
    SPARTA_REQUIRE(a.index == "hashed" || a.index == "direct", "--index: hashed or direct, found '%s'",
                   a.index.c_str());
    placements = bench::split_list(a.placements);
    SPARTA_REQUIRE(!placements.empty(), "--placements: no placement given");
    for (const std::string& p : placements)
      if (p != "plan") parse_placement(p);
  }));
  return w;
}

void print_header(const Args& a, const KeyGen& kg, const std::vector<Table>& tables, Communicator* comm, int world) {
  int64_t total_rows = 0;
  for (const Table& t : tables) total_rows += t.card;
  std::printf("# bench_collection: comm %s; tables %s: %zu tables, %d keys a sample, %.2fM rows (cap %lld), dim %s\n",
              world > 1 ? comm->describe().c_str() : "none (one rank)", a.tables.c_str(), tables.size(),
              kg.keys_per_sample, double(total_rows) / 1e6, (long long)a.row_cap,
              a.dims.empty() ? std::to_string(a.dim).c_str() : a.dims.c_str());
  std::printf("# alpha %g, %s lr %g, warmup %d, timed steps %d, check %d samples per rank, memory budget %g GiB, "
              "exchange %s, output %s, storage %s\n",
              a.alpha, a.optimizer.c_str(), double(a.lr), a.warmup, a.iters, a.check_samples, a.memory_budget_gib,
              a.exchange.c_str(), a.output.c_str(), a.storage.c_str());
  std::printf("# ms: median over timed steps of the slowest rank; MB_moved: the planner's cost model (the busiest "
              "rank's bytes sent + received per step); mem_GB: shards on the fullest rank\n");
  std::printf("#\n# %-11s %-9s %7s %5s | %9s %9s %9s | %10s | %10s %7s | %6s\n", "placement", "tables", "batch",
              "ranks", "ms_step", "ms_fwd", "ms_bwd", "Msamples/s", "MB_moved", "mem_GB", "#wrong");
  std::fflush(stdout);
}

// The point's plan (the same on every rank), with half of each hybrid table's check pool in its hot set so the
// check takes both of hybrid's paths; printed for `plan` and --plan-only. false (printed) when it does not fit.
bool plan_point(const Args& a, const KeyGen& kg, const CollectionConfig& cfg, const std::string& placement,
                int64_t batch, int rank, int world, Backend backend, size_t budget,
                const std::vector<TableKeyStats>& stats, Plan& plan) {
  PlannerOptions po;
  po.world = world;
  po.global_batch = batch * world;
  po.backend = backend;
  po.memory_budget = budget;
  po.rates = a.rates;
  try {  // the same statistics everywhere: every rank gets the same plan, or the same error
    agree_on_error(MPI_COMM_WORLD, guarded([&] { plan = make_plan(cfg, po, stats); }));
  } catch (const Error& e) {
    if (rank == 0)
      std::printf("  %-11s %-9s %7lld %5d | skipped: %s\n", placement.c_str(), a.tables.c_str(), (long long)batch,
                  world, e.what());
    return false;
  }
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    TablePlan& tp = plan.tables[t];
    if (tp.placement != Placement::hybrid) continue;
    for (int64_t i = 0; i < kg.tables[t].pool; i += 2) tp.hot_keys.push_back(kg.tables[t].card + i);
    std::sort(tp.hot_keys.begin(), tp.hot_keys.end());
    tp.hot_keys.erase(std::unique(tp.hot_keys.begin(), tp.hot_keys.end()), tp.hot_keys.end());
  }
  if (rank == 0 && (placement == "plan" || a.plan_only)) {
    std::printf("# %s, local batch %lld:\n", placement == "plan" ? "the planner's plan" : placement.c_str(),
                (long long)batch);
    std::istringstream lines(format_plan(cfg, plan));
    for (std::string l; std::getline(lines, l);) std::printf("#   %s\n", l.c_str());
  }
  return true;
}

// Rank 0: the point's row of the table and its JSON record (the driver adds program, tag, backend, warmup,
// iters and the provenance).
void report_point(bench::Driver& d, const Args& a, const KeyGen& kg, const std::vector<Table>& tables,
                  const std::string& placement, int64_t batch, int world, const Plan& plan, const Result& r,
                  bool cuda) {
  std::vector<int64_t> rows_capped, hot;
  std::vector<int> dims;
  for (const Table& t : tables) rows_capped.push_back(t.card), dims.push_back(t.dim), hot.push_back(t.hot);
  const double msps = double(batch * world) / r.ms_step / 1e3;
  // The planner's estimate of the step, and its terms: ms = MB_moved_planned / link_GBps + planned_local_MB /
  // hbm_GBps + (planned_collectives x collective_us + planned_groups x group_us) / 1000.
  const double ms_planned = plan.estimate.seconds * 1e3, local_mb = plan.estimate.local_bytes / 1e6;
  const int collectives = plan.estimate.collectives, groups = plan.estimate.groups;
  std::printf("  %-11s %-9s %7lld %5d | %9.3f %9.3f %9.3f | %10.3f | %10.1f %7.3f | %6lld\n", placement.c_str(),
              a.tables.c_str(), (long long)batch, world, r.ms_step, r.ms_fwd, r.ms_bwd, msps, r.mb_planned,
              r.mem_bytes / 1e9, (long long)r.check.wrong);
  std::fflush(stdout);
  std::ostringstream f;
  f << "\"bench\":\"collection\",\"index\":\"" << a.index << "\",\"placement\":\"" << placement << "\",\"plan\":\""
    << bench::json_escape(r.plan) << "\",\"table_placements\":\""
    << (placement == "plan" ? a.table_placements : std::string()) << "\",\"exchange\":\"" << a.exchange
    << "\",\"output\":\"" << a.output << "\",\"storage\":\"" << a.storage << "\",\"tables\":\"" << a.tables << "\",\"num_tables\":" << tables.size()
    << ",\"rows\":" << json_array(rows_capped) << ",\"dims\":" << json_array(dims)
    << ",\"hotness\":" << json_array(hot) << ",\"keys_per_sample\":" << kg.keys_per_sample
    << ",\"row_cap\":" << a.row_cap << ",\"dim\":" << a.dim << ",\"batch\":" << batch
    << ",\"global_batch\":" << batch * world << ",\"alpha\":" << a.alpha << ",\"tier\":\"" << a.tier
    << "\",\"cache_gb\":" << a.cache_gb << ",\"cache_rows\":" << a.cache_rows << ",\"eviction\":\"" << a.eviction
    << "\",\"optimizer\":\"" << a.optimizer << "\",\"lr\":" << a.lr << ",\"combiner\":\"sum\""
    << ",\"memory_budget_GiB\":" << a.memory_budget_gib << ",\"comm_mode\":\"" << (world > 1 ? a.comm_mode : "none")
    << "\",\"prefill\":" << a.prefill << ",\"prefill_forwards\":" << r.prefill_forwards
    << ",\"rows_in_use\":" << r.rows_timed_end
    << ",\"new_rows_per_step\":" << double(r.rows_timed_end - r.rows_timed_start) / std::max(1, a.iters)
    << ",\"check_samples\":" << a.check_samples
    << ",\"seed\":" << a.seed << ",\"ms_step\":" << r.ms_step << ",\"ms_step_min\":" << r.ms_step_min
    << ",\"ms_step_back_to_back\":" << r.ms_step_back_to_back
    << ",\"ms_fwd\":" << r.ms_fwd << ",\"ms_bwd\":" << r.ms_bwd << ",\"samples_per_s\":" << msps * 1e6
    << ",\"MB_moved_planned\":" << r.mb_planned << ",\"MB_moved_measured\":null"
    << ",\"ms_step_planned\":" << ms_planned << ",\"planned_local_MB\":" << local_mb
    << ",\"planned_collectives\":" << collectives << ",\"planned_groups\":" << groups
    << ",\"planner_link_GBps\":" << a.rates.link_GBps
    << ",\"planner_hbm_GBps\":" << a.rates.hbm_GBps << ",\"planner_collective_us\":" << a.rates.collective_us
    << ",\"planner_group_us\":" << a.rates.group_us
    << ",\"mem_GB\":" << r.mem_bytes / 1e9 << ",\"device_used_GB\":";
  if (r.dev_used >= 0) f << r.dev_used / 1e9;
  else f << "null";
  f << ",\"checked_values\":" << r.check.values << ",\"wrong\":" << r.check.wrong << ",\"timing\":\""
    << (cuda ? "cuda events on the compute stream" : "steady clock, device synchronized")
    << ", median over steps of the slowest rank\"";
  d.record(f.str());
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bench::DriverDefaults dd;
  dd.warmup = a.warmup;  // untimed steps first (they insert the keys)
  dd.repeats = a.iters;  // timed steps: --iters, as this bench has always called them
  dd.repeats_option = "iters";
  dd.repeats_help = "timed steps (the median is reported)";
  bench::Driver d("bench_collection", argc, argv, dd);
  add_options(d, a);
  return d.run("usage: mpiexec -n N bench_collection [options]", [&] {
    a.warmup = d.warmup();
    a.iters = d.repeats();
    const Sweep sweep = check_options(a);
    const std::vector<Table>& tables = sweep.tables;
    Context& ctx = d.ctx();
    const Device& dev = ctx.device();
    const int rank = ctx.rank(), world = ctx.world();
    const bool cuda = dev.is_cuda();
    if (a.comm_mode.empty()) a.comm_mode = cuda ? "nccl" : "mpi";
    std::unique_ptr<Communicator> comm;
    if (world > 1) {  // one rank: the collection moves nothing
      CommOptions co;
      co.mode = parse_comm_mode(a.comm_mode);
      co.timeout_s = a.timeout;
      comm = std::make_unique<Communicator>(ctx.topo(), dev, co);
    }
    const int threads = std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, ctx.topo().host_size));
    const KeyGen kg(tables, a.alpha, a.seed);
    if (rank == 0) print_header(a, kg, tables, comm.get(), world);  // the driver printed the provenance

    // The planner's key statistics: a sample batch of the same generator.
    std::vector<TableKeyStats> stats;
    {
      const int64_t n = std::min<int64_t>(*std::max_element(sweep.batches.begin(), sweep.batches.end()), 16384);
      std::vector<int64_t> sk;
      timed_keys(kg, -1, int64_t(rank) * n, n, threads, sk);
      CollectionConfig probe = make_config(a, tables, "auto");
      stats = count_keys(MPI_COMM_WORLD, probe, fixed_offsets(kg, n), sk, n, 1024);
    }

    int skipped = 0;
    // --memory-budget 0: this device's free memory less a reserve for the batches, the check and the
    // communicator (1 GiB on a GPU, 64 MiB on the cpu backend)
    const size_t reserve = dev.is_cuda() ? size_t(1) << 30 : size_t(64) << 20;
    const size_t budget = a.memory_budget_gib > 0 ? size_t(a.memory_budget_gib * 1073741824.0)
                                                  : device_memory_budget(MPI_COMM_WORLD, dev, reserve);
    for (int64_t batch : sweep.batches)
      for (const std::string& placement : sweep.placements) {
        CollectionConfig cfg = make_config(a, tables, placement);
        Plan plan;
        if (!plan_point(a, kg, cfg, placement, batch, rank, world, dev.backend, budget, stats, plan)) {
          ++skipped;
          continue;
        }
        if (a.plan_only) continue;
        Result r = run_point(ctx, comm.get(), a, kg, cfg, plan, batch, threads);
        if (rank == 0) d.add_wrong(r.check.wrong);  // already the sum over the ranks
        if (rank == 0) report_point(d, a, kg, tables, placement, batch, world, plan, r, cuda);
      }
    // A point that does not fit is no failure of the code (the planner said so before allocating), but a run
    // with one is not the run asked for: the table says so (the driver's last line gives the wrong values).
    if (rank == 0 && skipped)
      std::printf("# %d point(s) skipped: they do not fit\n", skipped);
  });
}
