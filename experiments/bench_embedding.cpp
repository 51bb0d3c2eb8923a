// bench_embedding: the fused lookup + pooled forward (kernels/pooled_forward.h) on a filled table, against
// the device-to-device copy bandwidth measured in the same run; and the train step on the table
// (EmbeddingTable: pooled_forward in train mode + backward_and_update with SGD).
//
//   bench_embedding [--rows 40000000] [--dims 128] [--batch 65536] [--slots 26] [--hot 1] [--alphas 0,1.1]
//                   [--hotness 3,2,1,...] [--modes eval,train,step,floor] [--out-types f32] [--lr 0.01]
//                   [--index hashed] [--update sorted] [--storage fp32] [--out f.jsonl]
//
// The table holds `rows` keys (a bijection of 0..rows-1); each bag takes `hot` keys (hot = 1: one-hot) drawn
// with P(rank) ~ rank^-alpha over a fixed random permutation of the held keys (alpha 0: uniform), the same
// shape as peers/peer_torch.py (--hotness: the keys of each slot instead, one number per slot, overriding
// --slots and --hot, e.g. MLPerf DLRM-DCNv2's 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1). Bytes moved: nnz * dim * 4 gathered + bags * dim * out_bytes written (hash
// buckets and keys not counted, as for the peer); GB/s and the fraction of the copy bandwidth. train runs
// the get_insert path on held keys (steady state: nothing new) and writes each key's row for the backward; eval
// writes no rows (since 2026-11-24: before, eval wrote them too, 8 bytes a key no evaluation needs). A sample of
// bags is checked against the CPU reference (the keys' initial values pooled on the host).
// step: after the forward modes of a point (the step changes the values the forward checks rely on), per alpha:
// one checked step (a sample of updated rows against w - lr * the summed gradient, computed on the host from
// the rows, the upstream gradient and the values before the step), then timed steps (forward train with its
// full-table check deferred, backward_and_update, then the check: one synchronization per step; the upstream
// gradient is a fixed random [bags, dim] array) and timed backward_and_update alone on the same rows.
// --index direct: the table has a direct index (EmbeddingTable direct_stride 1: row = key) and the keys are the
// ranks' permuted indices themselves, 0..rows-1, instead of their hashes; hashed (the default): hash slots.
// --update atomic: the step's SGD update key by key with float atomics (OptimizerConfig::atomic_update,
// kernels/atomic_sgd.h: no sort, not bitwise reproducible; rows_updated is then not counted and recorded null);
// sorted (the default): the fixed-order backward.
// --storage bf16|fp16: the table's rows in 16 bits (EmbeddingTableConfig::storage; kernels/row_storage.h): the
// rows gathered count 2 bytes an element, the checks take the keys' initial values rounded to nearest and allow an
// updated value one 16-bit step of its stochastic rounding; not with --update atomic or --modes floor.
// floor: the least traffic of a step on the same keys, by the simplest kernels that make it (experiments/lab/row_traffic.h),
// on the rows the train lookup gives the keys: `gather` (each bag's rows read and summed, [bags, dim] written),
// `read_write` (each key's row read and written back, + 0, with plain loads and stores) and `atomic` (each key's row
// + 0 by vector float atomics); step_floor_ms = gather + read_write: a step that reads each key's row for the
// forward and reads and writes it again for an in-place update takes at least that. Checked: a sample of bags
// against the keys' initial values pooled on the host, and a sample of rows unchanged bit for bit.
// With no axis options the default points run: 40M x 128 one-hot (alpha 0 and 1.1), 40M x 32 hot 8, 10M x 16.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "src/embedding_table.h"
#include "kernels/embedding_types.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "src/options.h"
#include "kernels/pooled_forward.h"
#include "experiments/lab/row_traffic.h"
#include "experiments/support_bench.h"

using namespace sparta;
using bench::median;

namespace {

// The i-th key of the benchmark's universe: distinct for distinct i (splitmix64 is a bijection).
int64_t key_of(uint64_t i, uint64_t salt) { return static_cast<int64_t>(splitmix64(i ^ salt)); }

struct Point {
  int64_t rows;
  int dim;
  int64_t batch;
  int slots;
  int hot;                   // keys per bag; 0 when hotness gives them per slot
  std::vector<int> hotness;  // keys of each slot (slots entries), or empty
  int bag_keys(int64_t bag) const { return hotness.empty() ? hot : hotness[size_t(bag % slots)]; }
  std::string hot_name() const {
    if (hotness.empty()) return std::to_string(hot);
    std::string h;
    for (int x : hotness) h += (h.empty() ? "" : ",") + std::to_string(x);
    return h;
  }
};

// Multiplier of a bijection of [0, rows): odd, coprime to rows.
uint64_t coprime_multiplier(uint64_t rows) {
  uint64_t a = 2654435761ull;
  while (std::__gcd(a, rows) != 1) a += 2;
  return a;
}

// nnz keys: rank from a continuous power law (inverse CDF, as the peer), then a fixed permutation of ranks.
std::vector<int64_t> draw_keys(const Point& p, int64_t nnz, double alpha, uint64_t salt, bool direct) {
  uint64_t mult = coprime_multiplier(uint64_t(p.rows));
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int64_t> hk(static_cast<size_t>(nnz));
  for (auto& k : hk) {
    double x = u(rng), rank;
    if (alpha == 0) {
      rank = x * double(p.rows);
    } else {
      double a = alpha != 1.0 ? 1.0 - alpha : 1e-9;
      rank = std::pow((std::pow(double(p.rows) + 1.0, a) - 1.0) * x + 1.0, 1.0 / a) - 1.0;
    }
    uint64_t r = std::min<uint64_t>(uint64_t(std::max(rank, 0.0)), uint64_t(p.rows) - 1);
    const uint64_t i = (r * mult) % uint64_t(p.rows);
    k = direct ? int64_t(i) : key_of(i, salt);
  }
  return hk;
}

// Element e of bag b's keys' initial values summed on the host, in key order: what a forward or a gather of
// untrained rows gives that bag (before a mean's division).
// The initial value of (key, e) as the table stores it (16-bit: rounded to nearest).
float stored_initial(const KeyInit& ki, int64_t key, int e) {
  const float v = initial_value(ki, uint64_t(key), e);
  if (ki.storage == RowStorage::fp32) return v;
  return ki.storage == RowStorage::bf16 ? bf16_to_float(float_to_bf16(v)) : f16_to_float(float_to_f16(v));
}

float initial_bag_sum(const KeyInit& ki, const std::vector<int64_t>& offsets, const std::vector<int64_t>& keys,
                      int64_t b, int e) {
  float acc = 0;
  for (int64_t i = offsets[size_t(b)]; i < offsets[size_t(b) + 1]; ++i) acc += stored_initial(ki, keys[size_t(i)], e);
  return acc;
}

// Row `row` of the table as fp32 (16-bit rows widened).
std::vector<float> read_row(const Device& dev, EmbeddingTable& table, int64_t row) {
  const int dim = table.dim();
  std::vector<float> v(static_cast<size_t>(dim));
  if (table.storage() == RowStorage::fp32) {
    copy_to_host(dev, v.data(), table.values() + size_t(row) * dim, sizeof(float) * dim);
    return v;
  }
  std::vector<uint16_t> h(static_cast<size_t>(dim));
  copy_to_host(dev, h.data(), static_cast<uint16_t*>(table.row_data()) + size_t(row) * dim, sizeof(uint16_t) * dim);
  for (int e = 0; e < dim; ++e)
    v[size_t(e)] = table.storage() == RowStorage::bf16 ? bf16_to_float(h[size_t(e)]) : f16_to_float(h[size_t(e)]);
  return v;
}

int64_t count_unique(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return std::unique(v.begin(), v.end()) - v.begin();
}

// A fixed upstream gradient, uniform in [-1, 1) (never zeros): [n].
std::vector<float> upstream_gradient(size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = float(int64_t(splitmix64(i ^ 0x5EEDull) >> 40) - (int64_t(1) << 23)) / float(1 << 23);
  return g;
}

// ---- the run's settings, from the options

struct Options {
  std::string rows, dims, batch, slots, hot, hotness, alphas, modes, types, combiner, index, update, storage;
  float lr = 0.01f;
};

// What every point of the run shares: the checked options, the device, the copy bandwidth.
struct Run {
  bench::Driver* d = nullptr;
  Device dev;
  bool gpu = false, root = false;
  int repeats = 0;
  Combiner comb = Combiner::sum;
  std::string index, update, devname;
  RowStorage storage = RowStorage::fp32;
  bool direct = false, atomic = false, step_mode = false, floor_mode = false;
  std::vector<std::string> forward_modes;  // eval, train
  std::vector<OutputType> out_types;
  std::vector<double> alphas;
  float lr = 0.01f;
  double copy_gbps = 0;
};

Run make_run(bench::Driver& d, const Options& o) {
  Run r;
  r.d = &d;
  r.dev = d.device();
  r.gpu = r.dev.is_cuda();
  r.root = d.is_root();
  r.repeats = d.repeats();
  r.comb = parse_combiner(o.combiner);
  SPARTA_REQUIRE(o.index == "hashed" || o.index == "direct", "--index: hashed or direct, found '%s'", o.index.c_str());
  SPARTA_REQUIRE(o.update == "sorted" || o.update == "atomic", "--update: sorted or atomic, found '%s'",
                 o.update.c_str());
  r.index = o.index;
  r.update = o.update;
  r.direct = o.index == "direct";
  r.atomic = o.update == "atomic";
  r.storage = parse_row_storage(o.storage);
  for (const std::string& m : bench::split_list(o.modes)) {
    SPARTA_REQUIRE(m == "eval" || m == "train" || m == "step" || m == "floor",
                   "--modes: eval, train, step or floor, found '%s'", m.c_str());
    if (m == "step") r.step_mode = true;
    else if (m == "floor") r.floor_mode = true;
    else r.forward_modes.push_back(m);
  }
  SPARTA_REQUIRE(r.storage == RowStorage::fp32 || (!r.atomic && !r.floor_mode),
                 "--storage %s: not with --update atomic or --modes floor (fp32 rows only)", o.storage.c_str());
  for (const std::string& t : bench::split_list(o.types)) {
    SPARTA_REQUIRE(t == "f32" || t == "bf16" || t == "f16", "--out-types: f32, bf16 or f16, found '%s'", t.c_str());
    r.out_types.push_back(t == "f32" ? OutputType::f32 : t == "bf16" ? OutputType::bf16 : OutputType::f16);
  }
  r.alphas = bench::parse_list(o.alphas, "alphas");
  r.lr = o.lr;
  r.devname = r.gpu ? gpu_name(r.dev.gpu) : "cpu";
  return r;
}

// The points: the axes' product (each axis's default where not given), or the default points.
std::vector<Point> make_points(const Options& o, bool gpu) {
  std::vector<Point> points;
  auto list = [](const std::string& given, const char* fallback, const char* name) {
    return bench::parse_list(given.empty() ? fallback : given, name);
  };
  const char* rows = gpu ? "40000000" : "100000";
  const char* batch = gpu ? "65536" : "256";
  if (!o.hotness.empty()) {
    std::vector<int> hl;
    for (double h : bench::parse_list(o.hotness, "hotness")) {
      SPARTA_REQUIRE(h >= 1 && h == std::floor(h), "--hotness: whole numbers >= 1 expected, found %g", h);
      hl.push_back(int(h));
    }
    for (double r : list(o.rows, rows, "rows"))
      for (double dd : list(o.dims, "128", "dims"))
        for (double b : list(o.batch, batch, "batch"))
          points.push_back(Point{int64_t(r), int(dd), int64_t(b), int(hl.size()), 0, hl});
  } else if (!o.rows.empty() || !o.dims.empty() || !o.batch.empty() || !o.slots.empty() || !o.hot.empty()) {
    for (double r : list(o.rows, rows, "rows"))
      for (double dd : list(o.dims, "128", "dims"))
        for (double b : list(o.batch, batch, "batch"))
          for (double s : list(o.slots, "26", "slots"))
            for (double h : list(o.hot, "1", "hot"))
              points.push_back(Point{int64_t(r), int(dd), int64_t(b), int(s), int(h), {}});
  } else if (gpu) {
    points.push_back(Point{40000000, 128, 65536, 26, 1, {}});
    points.push_back(Point{40000000, 32, 65536, 26, 8, {}});
    points.push_back(Point{10000000, 16, 65536, 26, 1, {}});
  } else {
    points.push_back(Point{100000, 128, 256, 26, 1, {}});
    points.push_back(Point{100000, 32, 256, 26, 8, {}});
  }
  for (const Point& p : points)
    SPARTA_REQUIRE(p.rows > 0 && p.dim > 0 && p.batch > 0 && p.slots > 0 && (p.hot > 0 || !p.hotness.empty()),
                   "bench_embedding: --rows, --dims, --batch, --slots and --hot must be > 0");
  return points;
}

// ---- one point: its table, filled, and its batch's shape

constexpr uint64_t kSalt = 0xABCDEFull;

struct PointTable {
  Point p;
  std::unique_ptr<EmbeddingTable> table;
  KeyInit ki;
  RowInit init;
  std::vector<int64_t> offsets;  // [bags + 1]
  int64_t bags = 0, nnz = 0;
  std::string hot_s;             // the point's hot (or hotness list) as recorded
  const char* hot_col = "";      // as printed
  Buffer<int64_t> off, keys, rows;
};

// A table of p.rows rows (SGD at lr), hashed tables holding every key of the universe, and the batch's offsets.
std::unique_ptr<PointTable> make_point_table(const Run& r, const Point& p) {
  auto t = std::make_unique<PointTable>();
  t->p = p;
  EmbeddingTableConfig tc;
  tc.name = "bench";
  tc.dim = p.dim;
  tc.capacity_rows = p.rows;
  tc.max_load_factor = 0.5;
  tc.seed = 7;
  tc.table_id = 0;
  tc.init_scale = 0.5f;
  tc.optimizer.kind = OptimizerKind::sgd;
  tc.optimizer.lr = r.lr;
  tc.optimizer.atomic_update = r.atomic;
  tc.direct_stride = r.direct ? 1 : 0;
  tc.storage = r.storage;
  t->table = std::make_unique<EmbeddingTable>(r.dev, tc);
  EmbeddingTable& table = *t->table;
  t->ki = table.key_init();
  t->init = RowInit{static_cast<float*>(table.row_data()), p.dim, t->ki};  // rows of t->ki.storage
  if (!r.direct) {  // a direct index holds every row from the start
    const int64_t chunk = int64_t(1) << 22;
    Buffer<int64_t> kb(r.dev, size_t(std::min(chunk, p.rows))), rb(r.dev, size_t(std::min(chunk, p.rows)));
    std::vector<int64_t> k;
    for (int64_t s = 0; s < p.rows; s += chunk) {
      int64_t m = std::min(chunk, p.rows - s);
      k.resize(size_t(m));
      for (int64_t i = 0; i < m; ++i) k[size_t(i)] = key_of(uint64_t(s + i), kSalt);
      kb.upload(k.data(), size_t(m));
      table.hash().get_insert(kb.data(), m, rb.data(), t->init, r.dev.stream);
      table.hash().check_errors(false, r.dev.stream);  // a full table throws
    }
  }
  t->bags = p.batch * p.slots;
  t->offsets.assign(size_t(t->bags) + 1, 0);
  for (int64_t b = 0; b < t->bags; ++b) t->offsets[size_t(b) + 1] = t->offsets[size_t(b)] + p.bag_keys(b);
  t->nnz = t->offsets.back();
  t->hot_s = p.hot_name();
  t->hot_col = p.hotness.empty() ? t->hot_s.c_str() : "var";
  t->off = Buffer<int64_t>(r.dev, t->offsets);
  t->keys = Buffer<int64_t>(r.dev, size_t(t->nnz));
  t->rows = Buffer<int64_t>(r.dev, size_t(t->nnz));
  return t;
}

// ---- the modes

// eval and train forwards, every alpha and output type: timed, a sample of bags checked against the host.
void time_forwards(Run& r, PointTable& t) {
  bench::Driver& d = *r.d;
  const Point& p = t.p;
  const Device& dev = r.dev;
  EmbeddingTable& table = *t.table;
  if (r.root)
    std::printf("# %9s %4s %6s %5s %3s %5s %5s %4s %8s %10s %8s %7s %6s %9s %6s\n", "rows", "dim", "batch", "slots",
                "hot", "alpha", "mode", "out", "unique", "ms", "GB/s", "%copy", "floor", "nnz", "#wrong");
  for (double alpha : r.alphas) {
    std::vector<int64_t> hk = draw_keys(p, t.nnz, alpha, kSalt, r.direct);
    int64_t unique = count_unique(hk);
    t.keys.upload(hk);
    for (const std::string& mode_s : r.forward_modes) {
      LookupMode mode = mode_s == "eval" ? LookupMode::eval : LookupMode::train;
      for (OutputType ot : r.out_types) {
        Buffer<uint8_t> pooled(dev, size_t(t.bags) * p.dim * output_type_bytes(ot));
        ForwardArgs a;
        a.table = table.hash().view();
        a.rows_init = t.init;
        a.mode = mode;
        a.offsets = t.off.data();
        a.keys = t.keys.data();
        a.bags = t.bags;
        a.combiner = r.comb;
        a.out = pooled.data();
        a.out_type = ot;
        a.rows = mode == LookupMode::train ? t.rows.data() : nullptr;  // an eval forward needs no rows
        pooled.fill_bytes(0xFF);
        std::vector<double> ms = d.time([&] { pooled_forward(dev, a, dev.stream); });
        HashTableMeta m = table.hash().read_meta(dev.stream);
        size_t wrong = size_t(m.missing + m.refused);
        table.hash().check_errors(false, dev.stream);
        // Sample of bags against the host reference.
        size_t ob = output_type_bytes(ot);
        std::vector<uint8_t> got(size_t(p.dim) * ob);
        for (int64_t b = 0; b < t.bags; b += std::max<int64_t>(1, t.bags / 256)) {
          copy_to_host(dev, got.data(), pooled.data() + size_t(b) * p.dim * ob, got.size());
          for (int e = 0; e < p.dim; ++e) {
            float acc = initial_bag_sum(t.ki, t.offsets, hk, b, e);
            if (r.comb == Combiner::mean) acc /= float(p.bag_keys(b));
            float g;
            if (ot == OutputType::f32) {
              std::memcpy(&g, &got[size_t(e) * 4], 4);
            } else {
              uint16_t h;
              std::memcpy(&h, &got[size_t(e) * 2], 2);
              g = ot == OutputType::bf16 ? bf16_to_float(h) : f16_to_float(h);
              acc = ot == OutputType::bf16 ? bf16_to_float(float_to_bf16(acc)) : f16_to_float(float_to_f16(acc));
            }
            wrong += !(std::fabs(g - acc) <= 1e-6f + 1e-6f * std::fabs(acc));
          }
        }
        d.add_wrong((long long)wrong);
        if (!r.root) continue;
        double med = median(ms);
        double bytes = double(t.nnz) * p.dim * row_storage_bytes(r.storage) + double(t.bags) * p.dim * double(ob);
        double gbps = bytes / med / 1e6, floor_ms = bytes / r.copy_gbps / 1e6;
        const char* type_s = output_type_name(ot);
        std::printf("  %9lld %4d %6lld %5d %3s %5.2f %5s %4s %8lld %10.4f %8.0f %6.1f%% %6.3f %9lld %6zu\n",
                    (long long)p.rows, p.dim, (long long)p.batch, p.slots, t.hot_col, alpha, mode_s.c_str(), type_s,
                    (long long)unique, med, gbps, 100 * gbps / r.copy_gbps, floor_ms, (long long)t.nnz, wrong);
        std::fflush(stdout);
        d.record(strprintf("\"bench\":\"embedding\",\"rows\":%lld,\"dim\":%d,\"batch\":%lld,\"slots\":%d,\"hot\":%d,\"hotness\":\"%s\","
                           "\"alpha\":%g,\"mode\":\"%s\",\"out_type\":\"%s\",\"combiner\":\"%s\",\"unique_keys\":%lld,"
                           "\"nnz\":%lld,\"ms\":%.5f,\"GBps\":%.2f,\"copy_GBps\":%.2f,"
                           "\"fraction_of_copy\":%.4f,\"floor_ms\":%.5f,\"wrong\":%zu,\"index\":\"%s\",\"device\":\"%s\","
                           "\"storage\":\"%s\"",
                           (long long)p.rows, p.dim, (long long)p.batch, p.slots, p.hot, t.hot_s.c_str(), alpha,
                           mode_s.c_str(), type_s, combiner_name(r.comb), (long long)unique, (long long)t.nnz, med,
                           gbps, r.copy_gbps, gbps / r.copy_gbps, floor_ms, wrong, r.index.c_str(),
                           r.devname.c_str(), row_storage_name(r.storage)));
      }
    }
  }
}

// floor: the lab's row-traffic kernels on the rows the train lookup gives the keys; a sample of bags and of rows
// (unchanged) checked. Before the step, which changes the values the checks rely on.
void time_floor(Run& r, PointTable& t) {
  bench::Driver& d = *r.d;
  const Point& p = t.p;
  const Device& dev = r.dev;
  EmbeddingTable& table = *t.table;
  if (r.root)
    std::printf("# floor: the row traffic of a step by the simplest kernels, median of %d\n"
                "# %9s %4s %6s %5s %3s %5s %8s %10s %10s %10s %10s %9s %6s\n",
                r.repeats, "rows", "dim", "batch", "slots", "hot", "alpha", "unique", "gather_ms", "rw_ms",
                "atomic_ms", "step_floor", "nnz", "#wrong");
  Buffer<float> gathered(dev, size_t(t.bags) * p.dim);
  for (double alpha : r.alphas) {
    std::vector<int64_t> hk = draw_keys(p, t.nnz, alpha, kSalt, r.direct);
    const int64_t unique = count_unique(hk);
    t.keys.upload(hk);
    t.rows.fill_bytes(0xFF);
    table.pooled_forward(t.off.data(), t.keys.data(), t.bags, r.comb, LookupMode::train, gathered.data(),
                         OutputType::f32, t.rows.data(), MissingKey::zeros, Check::deferred, dev.stream);
    table.check_lookups(MissingKey::zeros, dev.stream);  // every key held: its row given
    gathered.fill_bytes(0xFF);
    const int64_t cap = table.capacity_rows(), nnz = t.nnz;
    float* values = table.values();
    std::vector<double> gather_ms = d.time([&] {
      row_traffic_gather(dev, t.off.data(), t.rows.data(), t.bags, values, cap, p.dim, gathered.data(), dev.stream);
    });
    std::vector<double> rw_ms =
        d.time([&] { row_traffic_read_write(dev, t.rows.data(), nnz, values, cap, p.dim, 0.f, dev.stream); });
    std::vector<double> atomic_ms =
        d.time([&] { row_traffic_atomic(dev, t.rows.data(), nnz, values, cap, p.dim, 0.f, dev.stream); });
    // A sample of bags (sums of the keys' initial values) and of the keys' rows (still their initial values).
    const std::vector<int64_t> hrows = t.rows.download();
    size_t wrong = 0;
    std::vector<float> got(size_t(p.dim));
    for (int64_t b = 0; b < t.bags; b += std::max<int64_t>(1, t.bags / 256)) {
      copy_to_host(dev, got.data(), gathered.data() + size_t(b) * p.dim, sizeof(float) * p.dim);
      for (int e = 0; e < p.dim; ++e) {
        const float acc = initial_bag_sum(t.ki, t.offsets, hk, b, e);
        wrong += !(std::fabs(got[size_t(e)] - acc) <= 1e-6f + 1e-6f * std::fabs(acc));
      }
    }
    for (int64_t i = 0; i < nnz; i += std::max<int64_t>(1, nnz / 256)) {
      const int64_t row = hrows[size_t(i)];
      if (row < 0 || row >= cap) {
        ++wrong;
        continue;
      }
      copy_to_host(dev, got.data(), values + size_t(row) * p.dim, sizeof(float) * p.dim);
      for (int e = 0; e < p.dim; ++e) wrong += got[size_t(e)] != initial_value(t.ki, uint64_t(hk[size_t(i)]), e);
    }
    d.add_wrong((long long)wrong);
    if (!r.root) continue;
    const double g = median(gather_ms), rw = median(rw_ms), at = median(atomic_ms);
    const double gather_bytes = (double(nnz) + double(t.bags)) * p.dim * 4, row_bytes = 2.0 * double(nnz) * p.dim * 4;
    std::printf("  %9lld %4d %6lld %5d %3s %5.2f %8lld %10.4f %10.4f %10.4f %10.4f %9lld %6zu\n",
                (long long)p.rows, p.dim, (long long)p.batch, p.slots, t.hot_col, alpha, (long long)unique, g, rw, at,
                g + rw, (long long)nnz, wrong);
    std::fflush(stdout);
    d.record(strprintf("\"bench\":\"embedding_floor\",\"rows\":%lld,\"dim\":%d,\"batch\":%lld,\"slots\":%d,"
                       "\"hot\":%d,\"hotness\":\"%s\",\"alpha\":%g,\"unique_keys\":%lld,\"nnz\":%lld,"
                       "\"gather_ms\":%.5f,\"read_write_ms\":%.5f,\"atomic_ms\":%.5f,\"step_floor_ms\":%.5f,"
                       "\"gather_GBps\":%.2f,\"read_write_GBps\":%.2f,\"atomic_GBps\":%.2f,\"copy_GBps\":%.2f,"
                       "\"wrong\":%zu,\"index\":\"%s\",\"device\":\"%s\"",
                       (long long)p.rows, p.dim, (long long)p.batch, p.slots, p.hot, t.hot_s.c_str(), alpha,
                       (long long)unique, (long long)nnz, g, rw, at, g + rw, gather_bytes / g / 1e6,
                       row_bytes / rw / 1e6, row_bytes / at / 1e6, r.copy_gbps, wrong, r.index.c_str(),
                       r.devname.c_str()));
  }
}

// step: per alpha, one checked step (a sample of rows against w - lr * their summed gradient, computed on the
// host), then timed steps and timed backward_and_update alone.
void time_steps(Run& r, PointTable& t) {
  bench::Driver& d = *r.d;
  const Point& p = t.p;
  const Device& dev = r.dev;
  EmbeddingTable& table = *t.table;
  const float lr = r.lr;
  const int64_t bags = t.bags, nnz = t.nnz;
  const std::vector<int64_t>& offsets = t.offsets;
  if (r.root) {
    std::printf("# step (SGD lr %g, %s): forward train + backward_and_update, median of %d\n", double(lr),
                combiner_name(r.comb), r.repeats);
    std::printf("# %9s %4s %6s %5s %3s %5s %8s %10s %10s %10s %9s %6s\n", "rows", "dim", "batch", "slots", "hot",
                "alpha", "unique", "step_ms", "bwd_upd_ms", "updated", "nnz", "#wrong");
  }
  std::vector<float> hgrad = upstream_gradient(size_t(bags) * p.dim);  // [bags, dim]
  Buffer<float> grad(dev, hgrad), pooled(dev, size_t(bags) * p.dim);
  int64_t step = 1;
  for (double alpha : r.alphas) {
    std::vector<int64_t> hk = draw_keys(p, nnz, alpha, kSalt, r.direct);
    int64_t unique = count_unique(hk);
    t.keys.upload(hk);
    auto forward = [&] {
      table.pooled_forward(t.off.data(), t.keys.data(), bags, r.comb, LookupMode::train, pooled.data(),
                           OutputType::f32, t.rows.data(), MissingKey::zeros, Check::deferred, dev.stream);
    };
    auto backward = [&] {
      table.backward_and_update(t.off.data(), t.rows.data(), bags, nnz, grad.data(), r.comb, step++, dev.stream);
    };
    auto train_step = [&] {  // as a trainer runs it: one synchronization, the full-table check at the end
      forward();
      backward();
      table.check_lookups(MissingKey::zeros, dev.stream);
    };
    // One checked step: a sample of rows, before and after, against w - lr * their summed gradient.
    t.rows.fill_bytes(0xFF);
    forward();
    std::vector<int64_t> hrows = t.rows.download();
    std::map<int64_t, std::vector<float>> before, sum, abs_sum;  // row → [dim]
    for (int64_t i = 0; i < nnz; i += std::max<int64_t>(1, nnz / 256)) before[hrows[size_t(i)]].resize(size_t(p.dim));
    size_t wrong = 0;
    for (auto& [row, v] : before) {
      if (row < 0 || row >= p.rows) {
        ++wrong;  // the forward gave no row to a held key
        continue;
      }
      v = read_row(dev, table, row);
      sum[row].assign(size_t(p.dim), 0.f);
      abs_sum[row].assign(size_t(p.dim), 0.f);
    }
    for (int64_t b = 0; b < bags; ++b) {
      int64_t n = offsets[size_t(b) + 1] - offsets[size_t(b)];
      float scale = r.comb == Combiner::mean && n > 0 ? 1.0f / float(n) : 1.0f;
      for (int64_t i = offsets[size_t(b)]; i < offsets[size_t(b) + 1]; ++i) {
        auto it = sum.find(hrows[size_t(i)]);
        if (it == sum.end()) continue;
        std::vector<float>& as = abs_sum[it->first];
        for (int e = 0; e < p.dim; ++e) {
          float g = hgrad[size_t(b) * p.dim + e] * scale;
          it->second[e] += g;
          as[e] += std::fabs(g);
        }
      }
    }
    backward();
    table.check_lookups(MissingKey::zeros, dev.stream);
    const int64_t updated = r.atomic ? -1 : table.rows_updated(dev.stream);  // -1: not counted
    wrong += !r.atomic && updated != unique;
    std::vector<float> after(size_t(p.dim));
    for (const auto& [row, s] : sum) {
      after = read_row(dev, table, row);
      const std::vector<float>& w0 = before[row];
      // 16-bit rows: one step of the stored type (2^-8 relative for bf16, 2^-11 for fp16) for the rounding
      const float step16 = r.storage == RowStorage::bf16 ? 0.0079f : r.storage == RowStorage::fp16 ? 0.001f : 0.f;
      for (int e = 0; e < p.dim; ++e) {
        float want = w0[e] - lr * s[e];
        // Summation order differs for rows over several blocks of the sorted keys, and for every row several
        // keys touch with --update atomic: float rounding only.
        float tol = 1e-6f + 1e-5f * (std::fabs(w0[e]) + lr * abs_sum[row][e]) + step16 * std::fabs(want);
        wrong += !(std::fabs(after[e] - want) <= tol);
      }
    }
    std::vector<double> step_ms = d.time(train_step);
    std::vector<double> bwd_ms = d.time(backward);
    d.add_wrong((long long)wrong);
    if (!r.root) continue;
    double med = median(step_ms), bmed = median(bwd_ms);
    std::printf("  %9lld %4d %6lld %5d %3s %5.2f %8lld %10.4f %10.4f %10lld %9lld %6zu\n", (long long)p.rows, p.dim,
                (long long)p.batch, p.slots, t.hot_col, alpha, (long long)unique, med, bmed, (long long)updated,
                (long long)nnz, wrong);
    std::fflush(stdout);
    d.record(strprintf("\"bench\":\"embedding_step\",\"rows\":%lld,\"dim\":%d,\"batch\":%lld,\"slots\":%d,"
                       "\"hot\":%d,\"hotness\":\"%s\",\"alpha\":%g,\"combiner\":\"%s\",\"optimizer\":\"sgd\",\"lr\":%g,"
                       "\"unique_keys\":%lld,\"nnz\":%lld,\"step_ms\":%.5f,"
                       "\"backward_update_ms\":%.5f,\"rows_updated\":%s,\"copy_GBps\":%.2f,\"wrong\":%zu,"
                       "\"index\":\"%s\",\"update\":\"%s\",\"device\":\"%s\",\"storage\":\"%s\"",
                       (long long)p.rows, p.dim, (long long)p.batch, p.slots, p.hot, t.hot_s.c_str(), alpha,
                       combiner_name(r.comb), double(lr), (long long)unique, (long long)nnz, med, bmed,
                       updated < 0 ? "null" : std::to_string(updated).c_str(), r.copy_gbps, wrong, r.index.c_str(),
                       r.update.c_str(), r.devname.c_str(), row_storage_name(r.storage)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bench::Driver d("bench_embedding", argc, argv, {/*warmup*/ 5, /*repeats*/ 20});
  d.options().add_options()("rows", po::value(&o.rows), "table rows (list)")(
      "dims", po::value(&o.dims), "dims (list)")("batch", po::value(&o.batch), "batch sizes (list)")(
      "slots", po::value(&o.slots), "slots per sample (list)")("hot", po::value(&o.hot), "keys per bag (list)")(
      "hotness", po::value(&o.hotness), "keys of each slot, one number per slot (overrides --slots and --hot)")(
      "alphas", po::value(&o.alphas)->default_value("0,1.1"), "power-law exponents (list; 0 uniform)")(
      "modes", po::value(&o.modes)->default_value("eval,train,step"), "eval | train | step | floor (list)")(
      "out-types", po::value(&o.types)->default_value("f32"), "f32 | bf16 | f16 (list)")(
      "combiner", po::value(&o.combiner)->default_value("sum"), "sum | mean")(
      "lr", po::value(&o.lr)->default_value(0.01f), "SGD learning rate of the step")(
      "index", po::value(&o.index)->default_value("hashed"), "hashed | direct (row = key)")(
      "update", po::value(&o.update)->default_value("sorted"), "sorted | atomic (the step's SGD update)")(
      "storage", po::value(&o.storage)->default_value("fp32"),
      "fp32 | bf16 | fp16: the table's rows (16-bit: updates rounded stochastically; not with atomic or floor)");
  // Each rank measures its own device; rank 0's measurements are recorded, every rank's results checked.
  return d.run("usage: [mpiexec -n N] bench_embedding [options]", [&] {
    Run r = make_run(d, o);
    const std::vector<Point> points = make_points(o, r.gpu);
    // Copy bandwidth, bytes read + written, in this run.
    r.copy_gbps = bench::copy_bandwidth_gbps(r.dev, r.gpu ? (size_t(1) << 31) : (size_t(1) << 27), d.warmup(),
                                             r.repeats);
    if (r.root)
      std::printf("# bench_embedding on %s: fused lookup + pooled forward (%s, %s index), median of %d; copy bandwidth "
                  "%.0f GB/s\n",
                  r.devname.c_str(), combiner_name(r.comb), r.index.c_str(), r.repeats, r.copy_gbps);
    for (const Point& p : points) {
      std::unique_ptr<PointTable> t = make_point_table(r, p);
      if (!r.forward_modes.empty()) time_forwards(r, *t);
      if (r.floor_mode) time_floor(r, *t);
      if (r.step_mode) time_steps(r, *t);
    }
  });
}
