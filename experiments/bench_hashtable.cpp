// bench_hashtable: GPU hash table throughput in G keys/s, as HierarchicalKV measures it (find and get_insert
// both copy the value vectors out, so they are lookup + gather), swept over table rows, load factor, dim and
// keys per call.
//
//   bench_hashtable [--rows 67108864] [--load-factors 0.5] [--dims 8,32,64] [--keys 1048576]
//                   [--hit-fractions 0,0.6] [--insert-op table|fused] [--out f.jsonl]
//
// A table of capacity `rows` at max load factor lf (slots = rows / lf, a power of two) is filled with distinct
// keys up to rows - reserve; then
//   find        n keys drawn uniformly from the held ones → rows and values [n, dim] (unpooled eval lookup);
//   get_insert  n keys, the first hit_fraction * n drawn uniformly from the held keys, the rest never seen
//               (inserted with their initial values), values copied out; one point per --hit-fractions entry.
//               0: every key new; 0.6: HierarchicalKV's find_or_insert benchmark (its create_keys_for_hitrate:
//               60% held keys first, then 40% new). The new keys take the `reserve` rows, so the load rises
//               from load_start to load_end (both in the record);
//   get_insert_hit  n held keys through the insert path.
// --insert-op: which insert path the get_insert points time: `table` = hash_get_insert_copy (the bulk kernel
// of hash_table.cu, HKV's find_or_insert), `fused` = unpooled_forward in train mode (the fused lookup kernel
// of pooled_forward.cu). find is unpooled_forward in eval mode either way.
// Slots are a power of two, so the load a table reaches is rows / slots: --rows 117440512 --load-factors 1.0
// ends at 0.875 of 128M slots, while 64M rows at 0.5 or 0.75 both end at 0.5.
// Every call's output is checked on a sample of keys against the CPU reference (initial_value by key).
//
// --evict lru|lfu: a hashed table in host memory under a GPU cache of `rows` rows (src/host_tier.h), run at load
// factor 1.0 (the cache full) under a stream of new keys, --stream times the cache over the run (10: HierarchicalKV's
// eviction benchmark shape): each call's keys, the first hit_fraction of them held keys (uniform over every key
// inserted so far, in the cache or evicted), the rest new. get_insert_evict (a train lookup: the keys made resident,
// evicting by the policy, new ones created with their initial values, the vectors copied out) and find_evict (an
// eval lookup of held keys) are timed per call, until every stream of the device is idle (the victims'
// write-back to host memory included); after the run every key ever inserted must be found again in
// the table (export: the host store merged with the cache) with its initial values, or it counts as wrong.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "src/embedding_table.h"
#include "kernels/embedding_types.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "src/options.h"
#include "kernels/pooled_forward.h"
#include "experiments/support_bench.h"

using namespace sparta;
using bench::median;
using bench::time_ms;

namespace {

// The i-th key of the benchmark's universe: distinct for distinct i (splitmix64 is a bijection).
int64_t key_of(uint64_t i, uint64_t salt) { return static_cast<int64_t>(splitmix64(i ^ salt)); }

// --evict: the tiered table under a stream of new keys (see the head of this file). Returns the wrong count.
size_t run_eviction(bench::Driver& d, Eviction policy, int64_t rows, int dim, int64_t n, double hit, double stream,
                    int warmup) {
  const Device& dev = d.device();
  const uint64_t salt = 0x7654321ull;
  const int64_t fresh = std::max<int64_t>(1, n - int64_t(hit * double(n)));
  const int64_t calls = std::max<int64_t>(warmup + 1, int64_t(stream * double(rows) / double(fresh)) + 1);
  SPARTA_REQUIRE(n <= rows, "--evict: --keys %lld must fit the cache of --rows %lld", (long long)n, (long long)rows);
  EmbeddingTableConfig c;
  c.name = "bench";
  c.dim = dim;
  c.capacity_rows = rows + calls * fresh;  // the host store: every key of the run
  c.seed = 42;
  c.init_scale = 0.5f;
  c.tier = make_tier(TableTier::host, rows, 0, policy, dim, 0);
  EmbeddingTable table(dev, c);
  // fill the cache: load factor 1.0 before the timed calls
  int64_t next_new = 0;
  Buffer<int64_t> keys(dev, size_t(n)), out_rows(dev, size_t(n));
  Buffer<float> vout(dev, size_t(n) * dim);
  std::vector<int64_t> hk(static_cast<size_t>(n));
  auto lookup = [&](LookupMode mode) {
    keys.upload(hk);
    table.unpooled_forward(keys.data(), n, mode, vout.data(), OutputType::f32,
                           mode == LookupMode::train ? out_rows.data() : nullptr, MissingKey::zeros, Check::deferred,
                           dev.stream);
    if (mode == LookupMode::train) table.host_tier()->release_pins();  // no update follows
  };
  while (next_new < rows) {
    const int64_t m = std::min(n, rows - next_new);
    hk.assign(size_t(n), 0);
    for (int64_t i = 0; i < n; ++i) hk[size_t(i)] = key_of(uint64_t(next_new + std::min(i, m - 1)), salt);
    next_new += m;
    lookup(LookupMode::train);
  }
  std::mt19937_64 rng(7);
  std::vector<double> ms_insert, ms_find;
  size_t wrong = 0;
  const KeyInit ki = table.key_init();
  KeyInit host_ki = ki;
  host_ki.segments = nullptr;
  std::vector<float> got;
  auto check_sample = [&] {
    got = vout.download();
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 64))
      for (int e = 0; e < dim; ++e)
        wrong += got[size_t(i * dim + e)] != initial_value(host_ki, uint64_t(hk[size_t(i)]), uint32_t(e));
  };
  const int64_t evicted0 = table.host_tier()->rows_out();
  for (int64_t r = 0; r < calls; ++r) {
    const int64_t held = next_new;
    for (int64_t i = 0; i < n; ++i)
      hk[size_t(i)] = i < n - fresh ? key_of(rng() % uint64_t(held), salt) : key_of(uint64_t(next_new++), salt);
    // until every stream is idle: the victims' write-back to host memory runs beside the compute stream
    double t = time_ms(dev, [&] { lookup(LookupMode::train); }, /*every_stream=*/true);
    if (r >= warmup) ms_insert.push_back(t);
    check_sample();
    for (int64_t i = 0; i < n; ++i) hk[size_t(i)] = key_of(rng() % uint64_t(next_new), salt);
    t = time_ms(dev, [&] { lookup(LookupMode::eval); }, /*every_stream=*/true);
    if (r >= warmup) ms_find.push_back(t);
    check_sample();
  }
  table.check_lookups(MissingKey::zeros, dev.stream);
  // nothing lost: every key of the run, with its initial values
  const TableRows all = table.export_rows(dev.stream);
  wrong += size_t(std::llabs(int64_t(all.rows()) - next_new));
  std::vector<int64_t> want(static_cast<size_t>(next_new)), have = all.keys;
  for (int64_t i = 0; i < next_new; ++i) want[size_t(i)] = key_of(uint64_t(i), salt);
  std::sort(want.begin(), want.end());
  std::sort(have.begin(), have.end());
  if (want != have) ++wrong;
  for (size_t i = 0; i < all.rows(); i += std::max<size_t>(1, all.rows() / 4096))
    for (int e = 0; e < dim; ++e) wrong += all.values[i * dim + e] != initial_value(host_ki, uint64_t(all.keys[i]), uint32_t(e));
  const int64_t evicted = table.host_tier()->rows_out() - evicted0;
  const double mi = median(ms_insert), mf = median(ms_find);
  if (d.is_root()) {
    std::printf("# evict %s: cache %lld rows (load 1.0), dim %d, %lld keys a call (hit %.2f), %lld calls, %lld keys "
                "inserted (%.1fx the cache), %lld rows evicted\n",
                eviction_name(policy), (long long)rows, dim, (long long)n, hit, (long long)calls, (long long)next_new,
                double(next_new) / double(rows), (long long)evicted);
    std::printf("  %11lld %5.2f %4d %9lld %-15s %5.2f %10.4f %10.5f %7s %7s %6zu\n", (long long)rows, 1.0, dim,
                (long long)n, "get_insert_evict", hit, mi, double(n) / mi / 1e6, "-", "-", wrong);
    std::printf("  %11lld %5.2f %4d %9lld %-15s %5.2f %10.4f %10.5f %7s %7s %6zu\n", (long long)rows, 1.0, dim,
                (long long)n, "find_evict", 1.0, mf, double(n) / mf / 1e6, "-", "-", wrong);
    std::fflush(stdout);
  }
  for (int k = 0; k < 2; ++k)
    d.record(strprintf("\"bench\":\"hashtable\",\"op\":\"%s\",\"eviction\":\"%s\",\"rows\":%lld,\"dim\":%d,"
                       "\"keys\":%lld,\"hit_fraction\":%g,\"calls\":%lld,\"inserted\":%lld,\"evicted\":%lld,"
                       "\"ms\":%.5f,\"Gkeys_per_s\":%.4f,\"wrong\":%zu",
                       k == 0 ? "get_insert_evict" : "find_evict", eviction_name(policy), (long long)rows, dim,
                       (long long)n, k == 0 ? hit : 1.0, (long long)calls, (long long)next_new, (long long)evicted,
                       k == 0 ? mi : mf, double(n) / (k == 0 ? mi : mf) / 1e6, wrong));
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::string rows_s, lfs_s, dims_s, keys_s, hits_s, insert_op, evict;
  double stream = 10;
  bench::Driver d("bench_hashtable", argc, argv, {/*warmup*/ 3, /*repeats*/ 20});
  d.options().add_options()("rows", po::value(&rows_s), "table capacities in rows (list; "
                                                        "default 67108864 on a GPU, 1048576 on cpu)")(
      "load-factors", po::value(&lfs_s)->default_value("0.5"), "max load factors (list)")(
      "dims", po::value(&dims_s)->default_value("8,32,64"), "value dims (list)")(
      "keys", po::value(&keys_s), "keys per call (list; default 1048576 on a GPU, 65536 on cpu)")(
      "hit-fractions", po::value(&hits_s)->default_value("0,0.6"), "get_insert: fraction of held keys per call (list)")(
      "insert-op", po::value(&insert_op)->default_value("table"), "get_insert path: table | fused")(
      "evict", po::value(&evict), "lru | lfu: a table in host memory under a GPU cache of --rows rows, under a "
      "stream of new keys (see the file's head)")(
      "stream", po::value(&stream)->default_value(stream), "--evict: new keys over the run, in caches");
  // Each rank measures its own device; rank 0's measurements are recorded, every rank's results checked.
  return d.run("usage: [mpiexec -n N] bench_hashtable [options]", [&] {
    const int repeats = d.repeats(), warmup = d.warmup();
    const Device& dev = d.device();
    const bool gpu = dev.is_cuda();
    SPARTA_REQUIRE(insert_op == "table" || insert_op == "fused", "--insert-op: table or fused, found '%s'",
                   insert_op.c_str());
    std::vector<double> hit_fractions = bench::parse_list(hits_s, "hit-fractions");
    for (double h : hit_fractions) SPARTA_REQUIRE(h >= 0 && h <= 1, "--hit-fractions: in [0, 1], found %g", h);
    if (rows_s.empty()) rows_s = gpu ? "67108864" : "1048576";
    if (keys_s.empty()) keys_s = gpu ? "1048576" : "65536";
    const std::string devname = dev.is_cuda() ? gpu_name(dev.gpu) : "cpu";
    const bool root = d.is_root();
    if (!evict.empty()) {  // the eviction benchmark instead of the sweep
      const Eviction policy = parse_eviction(evict, "--evict");
      SPARTA_REQUIRE(policy != Eviction::error, "--evict: lru or lfu, found error");
      SPARTA_REQUIRE(stream > 0, "--stream: expected > 0, found %g", stream);
      for (double rows_d : bench::parse_list(rows_s, "rows"))
        for (double dim_d : bench::parse_list(dims_s, "dims"))
          for (double n_d : bench::parse_list(keys_s, "keys"))
            for (double h : hit_fractions)
              d.add_wrong((long long)run_eviction(d, policy, int64_t(rows_d), int(dim_d), int64_t(n_d), h, stream,
                                                  warmup));
      return;
    }
    if (root) {
      std::printf("# bench_hashtable on %s: G keys/s (median of %d calls); find and get_insert copy values out\n",
                  devname.c_str(), repeats);
      std::printf("# get_insert path: %s\n", insert_op.c_str());
      std::printf("# %11s %5s %4s %9s %-15s %5s %10s %10s %7s %7s %6s\n", "rows", "lf", "dim", "keys", "op", "hit",
                  "ms", "Gkeys/s", "load0", "load1", "#wrong");
    }
    uint64_t salt = 0x1234567ull;
    for (double rows_d : bench::parse_list(rows_s, "rows"))
      for (double lf : bench::parse_list(lfs_s, "load-factors"))
        for (double dim_d : bench::parse_list(dims_s, "dims"))
          for (double n_d : bench::parse_list(keys_s, "keys")) {
            int64_t rows = int64_t(rows_d), n = int64_t(n_d);
            int dim = int(dim_d);
            int64_t reserve = 0;  // the new keys of every get_insert call
            for (double h : hit_fractions) reserve += (n - int64_t(h * double(n))) * (repeats + warmup);
            SPARTA_REQUIRE(rows >= reserve + 2 * n, "bench_hashtable: --rows %lld too small for %lld keys x %d calls",
                           (long long)rows, (long long)n, repeats + warmup);
            int64_t held = rows - reserve;
            HashTable table(dev, "bench", rows, lf);
            Buffer<float> values(dev, size_t(rows) * dim);
            KeyInit ki{42, 0, 0.5f};
            RowInit init{values.data(), dim, ki};
            // Fill in chunks: keys 0 .. held-1 of the universe.
            const int64_t chunk = int64_t(1) << 22;
            {
              Buffer<int64_t> kb(dev, size_t(std::min(chunk, held))), rb(dev, size_t(std::min(chunk, held)));
              std::vector<int64_t> k;
              for (int64_t s = 0; s < held; s += chunk) {
                int64_t m = std::min(chunk, held - s);
                k.resize(size_t(m));
                for (int64_t i = 0; i < m; ++i) k[size_t(i)] = key_of(uint64_t(s + i), salt);
                kb.upload(k.data(), size_t(m));
                hash_get_insert(dev, table.view(), kb.data(), m, rb.data(), init, dev.stream);
                synchronize(dev);
              }
              table.check_errors(false, dev.stream);
            }
            double slots = double(table.num_slots());
            Buffer<int64_t> keys(dev, size_t(n)), rows_out(dev, size_t(n));
            Buffer<float> vout(dev, size_t(n) * dim);
            std::vector<int64_t> hk(static_cast<size_t>(n));
            std::mt19937_64 rng(7);
            int64_t next_new = held;
            // get_insert first: it takes the reserve rows, so find and get_insert_hit then run at the full load.
            struct Point {
              std::string op;
              double hit;  // fraction of held keys
            };
            std::vector<Point> points;
            for (double h : hit_fractions) points.push_back({"get_insert", h});
            points.push_back({"find", 1.0});
            points.push_back({"get_insert_hit", 1.0});
            for (const Point& pt : points) {
              const char* op = pt.op.c_str();
              LookupMode mode = pt.op == "find" ? LookupMode::eval : LookupMode::train;
              const int64_t hits = int64_t(pt.hit * double(n));
              double load0 = double(table.size(dev.stream)) / slots;
              std::vector<double> ms;
              size_t wrong = 0;
              for (int r = 0; r < warmup + repeats; ++r) {
                const int64_t held_now = next_new;
                for (int64_t i = 0; i < n; ++i)
                  hk[size_t(i)] = i < hits ? key_of(rng() % uint64_t(held_now), salt) : key_of(uint64_t(next_new++), salt);
                keys.upload(hk);
                vout.fill_bytes(0xFF);
                ForwardArgs a;
                a.table = table.view();
                a.rows_init = init;
                a.mode = mode;
                a.keys = keys.data();
                a.bags = n;
                a.out = vout.data();
                a.rows = rows_out.data();
                synchronize(dev);
                double t = mode == LookupMode::train && insert_op == "table"
                               ? time_ms(dev, [&] {
                                   hash_get_insert_copy(dev, a.table, a.keys, n, a.rows, a.rows_init, vout.data(), dev.stream);
                                 })
                               : time_ms(dev, [&] { unpooled_forward(dev, a, dev.stream); });
                if (r >= warmup) ms.push_back(t);
                // Check a sample of the copied-out vectors against the reference.
                std::vector<float> got(static_cast<size_t>(dim));
                for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 64)) {
                  copy_to_host(dev, got.data(), vout.data() + i * dim, sizeof(float) * dim);
                  for (int e = 0; e < dim; ++e) wrong += got[size_t(e)] != initial_value(ki, uint64_t(hk[size_t(i)]), e);
                }
              }
              HashTableMeta m = table.read_meta(dev.stream);
              wrong += size_t(m.missing + m.refused);
              table.check_errors(false, dev.stream);
              double load1 = double(table.size(dev.stream)) / slots, med = median(ms);
              d.add_wrong((long long)wrong);
              if (!root) continue;
              std::printf("  %11lld %5.2f %4d %9lld %-15s %5.2f %10.4f %10.3f %7.3f %7.3f %6zu\n", (long long)rows, lf,
                          dim, (long long)n, op, pt.hit, med, double(n) / med / 1e6, load0, load1, wrong);
              std::fflush(stdout);
              d.record(strprintf("\"bench\":\"hashtable\",\"op\":\"%s\",\"rows\":%lld,\"max_load_factor\":%g,"
                                 "\"slots\":%lld,\"dim\":%d,\"keys\":%lld,\"ms\":%.5f,\"Gkeys_per_s\":%.4f,"
                                 "\"load_start\":%.4f,\"load_end\":%.4f,\"wrong\":%zu,\"hit_fraction\":%g,"
                                 "\"insert_op\":\"%s\",\"device\":\"%s\"",
                                 op, (long long)rows, lf, (long long)table.num_slots(), dim, (long long)n, med,
                                 double(n) / med / 1e6, load0, load1, wrong, pt.hit,
                                 mode == LookupMode::train ? insert_op.c_str() : "fused", devname.c_str()));
            }
          }
  });
}
