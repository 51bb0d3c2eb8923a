// bench_embedding: the fused lookup + pooled forward (kernels/pooled_forward.h) on a filled table, against
// the device-to-device copy bandwidth measured in the same run.
//
//   bench_embedding [--rows 40000000] [--dims 128] [--batch 65536] [--slots 26] [--hot 1] [--alphas 0,1.1]
//                   [--modes eval,train] [--out-types f32] [--cases default] [--out f.jsonl]
//
// The table holds `rows` keys (a bijection of 0..rows-1); each bag takes `hot` keys (hot = 1: one-hot) drawn
// with P(rank) ~ rank^-alpha over a fixed random permutation of the held keys (alpha 0: uniform), the same
// shape as peers/peer_torch.py. Bytes moved: nnz * dim * 4 gathered + bags * dim * out_bytes written (hash
// buckets and keys not counted, as for the peer); GB/s and the fraction of the copy bandwidth. train runs
// the get_insert path on held keys (steady state: nothing new). A sample of bags is checked against the CPU
// reference (the keys' initial values pooled on the host).
// With no axis options, --cases default runs: 40M x 128 one-hot (alpha 0 and 1.1), 40M x 32 hot 8, 10M x 16.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "buffer.h"
#include "check.h"
#include "embedding_types.h"
#include "hash_table.h"
#include "key_init.h"
#include "options.h"
#include "pooled_forward.h"
#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace sparta;

namespace {

// Times one call: CUDA events on the device's stream, or the wall clock around a synchronized call on cpu.
template <class F>
double time_ms(const Device& dev, F&& f) {
#if SPARTA_CUDA
  if (dev.is_cuda()) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaEventRecord(a, dev.stream));
    f();
    CUDA_CHECK(cudaEventRecord(b, dev.stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return ms;
  }
#endif
  auto t0 = std::chrono::steady_clock::now();
  f();
  synchronize(dev);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string provenance(int argc, char** argv, const Device& dev) {
  std::string rev = "unknown", cmd;
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64] = {0};
    if (fgets(buf, sizeof buf, p)) rev = std::string(buf, strcspn(buf, "\n"));
    pclose(p);
  }
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string devname = dev.is_cuda() ? gpu_name(dev.gpu) : "cpu";
  return strprintf("\"git\":\"%s\",\"command\":\"%s\",\"host\":\"%s\",\"device\":\"%s\",\"ranks\":1", rev.c_str(),
                   cmd.c_str(), host, devname.c_str());
}

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stod(item));
  SPARTA_REQUIRE(!v.empty(), "bench_embedding: empty list '%s'", s.c_str());
  return v;
}

// The i-th key of the benchmark's universe: distinct for distinct i (splitmix64 is a bijection).
int64_t key_of(uint64_t i, uint64_t salt) { return static_cast<int64_t>(splitmix64(i ^ salt)); }

}  // namespace

namespace {

struct Point {
  int64_t rows;
  int dim;
  int64_t batch;
  int slots;
  int hot;
};

// Multiplier of a bijection of [0, rows): odd, coprime to rows.
uint64_t coprime_multiplier(uint64_t rows) {
  uint64_t a = 2654435761ull;
  while (std::__gcd(a, rows) != 1) a += 2;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  std::string rows_s, dims_s, batch_s, slots_s, hot_s, alphas_s, modes_s, types_s, out_path, device = "auto";
  int repeats = 20, warmup = 5;
  po::options_description desc("bench_embedding options");
  desc.add_options()("help,h", "print this help")("rows", po::value(&rows_s), "table rows (list)")(
      "dims", po::value(&dims_s), "dims (list)")("batch", po::value(&batch_s), "batch sizes (list)")(
      "slots", po::value(&slots_s), "slots per sample (list)")("hot", po::value(&hot_s), "keys per bag (list)")(
      "alphas", po::value(&alphas_s)->default_value("0,1.1"), "power-law exponents (list; 0 uniform)")(
      "modes", po::value(&modes_s)->default_value("eval,train"), "eval | train (list)")(
      "out-types", po::value(&types_s)->default_value("f32"), "f32 | bf16 | f16 (list)")(
      "combiner", po::value<std::string>()->default_value("sum"), "sum | mean")(
      "repeats", po::value(&repeats)->default_value(20), "timed calls per point (median)")(
      "warmup", po::value(&warmup)->default_value(5), "untimed calls first")(
      "device", po::value(&device)->default_value("auto"), "cpu | cuda | auto")(
      "out", po::value(&out_path), "append JSON lines here");
  po::variables_map vm;
  try {
    if (!parse_options(argc, argv, desc, vm, "usage: bench_embedding [options]")) return 0;
    SPARTA_REQUIRE(device == "cpu" || device == "cuda" || device == "auto", "--device: cpu, cuda or auto, found '%s'",
                   device.c_str());
    bool gpu = device == "cuda" || (device == "auto" && visible_gpu_count() > 0);
    Combiner comb = parse_combiner(vm["combiner"].as<std::string>());
    Device dev = open_device(gpu ? Backend::cuda : Backend::cpu, gpu ? 0 : -1);
    std::vector<Point> points;
    bool axes = !rows_s.empty() || !dims_s.empty() || !batch_s.empty() || !slots_s.empty() || !hot_s.empty();
    if (axes) {
      for (double r : parse_list(rows_s.empty() ? (gpu ? "40000000" : "100000") : rows_s))
        for (double d : parse_list(dims_s.empty() ? "128" : dims_s))
          for (double b : parse_list(batch_s.empty() ? (gpu ? "65536" : "256") : batch_s))
            for (double s : parse_list(slots_s.empty() ? "26" : slots_s))
              for (double h : parse_list(hot_s.empty() ? "1" : hot_s))
                points.push_back(Point{int64_t(r), int(d), int64_t(b), int(s), int(h)});
    } else if (gpu) {
      points.push_back(Point{40000000, 128, 65536, 26, 1});
      points.push_back(Point{40000000, 32, 65536, 26, 8});
      points.push_back(Point{10000000, 16, 65536, 26, 1});
    } else {
      points.push_back(Point{100000, 128, 256, 26, 1});
      points.push_back(Point{100000, 32, 256, 26, 8});
    }
    std::string prov = provenance(argc, argv, dev);
    std::ofstream out;
    if (!out_path.empty()) out.open(out_path, std::ios::app);

    // Copy bandwidth, bytes read + written, in this run.
    double copy_gbps = 0;
    {
      size_t bytes = gpu ? (size_t(1) << 31) : (size_t(1) << 27);
      Buffer<uint8_t> a(dev, bytes), b(dev, bytes);
      a.fill_bytes(0x3C);
      std::vector<double> ms;
      for (int r = 0; r < warmup + repeats; ++r) {
        double t = time_ms(dev, [&] { copy_on_device(dev, b.data(), a.data(), bytes); });
        if (r >= warmup) ms.push_back(t);
      }
      copy_gbps = 2.0 * double(bytes) / median(ms) / 1e6;
    }
    std::printf("# bench_embedding on %s: fused lookup + pooled forward (%s), median of %d; copy bandwidth %.0f GB/s\n",
                dev.is_cuda() ? gpu_name(dev.gpu).c_str() : "cpu", combiner_name(comb), repeats, copy_gbps);
    std::printf("# %9s %4s %6s %5s %3s %5s %5s %4s %8s %10s %8s %7s %6s %9s %6s\n", "rows", "dim", "batch", "slots", "hot",
                "alpha", "mode", "out", "unique", "ms", "GB/s", "%copy", "floor", "nnz", "#wrong");
    size_t wrong_total = 0;
    const uint64_t salt = 0xABCDEFull;
    KeyInit ki{7, 0, 0.5f};
    for (const Point& p : points) {
      HashTable table(dev, "bench", p.rows, 0.5);
      Buffer<float> values(dev, size_t(p.rows) * p.dim);
      RowInit init{values.data(), p.dim, ki};
      {
        const int64_t chunk = int64_t(1) << 22;
        Buffer<int64_t> kb(dev, size_t(std::min(chunk, p.rows))), rb(dev, size_t(std::min(chunk, p.rows)));
        std::vector<int64_t> k;
        for (int64_t s = 0; s < p.rows; s += chunk) {
          int64_t m = std::min(chunk, p.rows - s);
          k.resize(size_t(m));
          for (int64_t i = 0; i < m; ++i) k[size_t(i)] = key_of(uint64_t(s + i), salt);
          kb.upload(k.data(), size_t(m));
          hash_get_insert(dev, table.view(), kb.data(), m, rb.data(), init);
          synchronize(dev);
        }
        table.check_errors();
      }
      int64_t bags = p.batch * p.slots, nnz = bags * p.hot;
      std::vector<int64_t> offsets(size_t(bags) + 1);
      for (int64_t b = 0; b <= bags; ++b) offsets[size_t(b)] = b * p.hot;
      Buffer<int64_t> off(dev, offsets), keys(dev, size_t(nnz)), rows(dev, size_t(nnz));
      uint64_t mult = coprime_multiplier(uint64_t(p.rows));
      for (double alpha : parse_list(alphas_s)) {
        // Keys: rank from a continuous power law (inverse CDF, as the peer), then a fixed permutation of ranks.
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
          k = key_of((r * mult) % uint64_t(p.rows), salt);
        }
        std::vector<int64_t> sorted = hk;
        std::sort(sorted.begin(), sorted.end());
        int64_t unique = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
        keys.upload(hk);
        for (const std::string& mode_s : [&] {
               std::vector<std::string> v;
               std::stringstream ss(modes_s);
               for (std::string m; std::getline(ss, m, ',');) v.push_back(m);
               return v;
             }()) {
          SPARTA_REQUIRE(mode_s == "eval" || mode_s == "train", "--modes: eval or train, found '%s'", mode_s.c_str());
          LookupMode mode = mode_s == "eval" ? LookupMode::eval : LookupMode::train;
          std::stringstream ts(types_s);
          for (std::string type_s; std::getline(ts, type_s, ',');) {
            SPARTA_REQUIRE(type_s == "f32" || type_s == "bf16" || type_s == "f16",
                           "--out-types: f32, bf16 or f16, found '%s'", type_s.c_str());
            OutputType ot = type_s == "f32" ? OutputType::f32 : type_s == "bf16" ? OutputType::bf16 : OutputType::f16;
            Buffer<uint8_t> pooled(dev, size_t(bags) * p.dim * output_type_bytes(ot));
            ForwardArgs a;
            a.table = table.view();
            a.rows_init = init;
            a.mode = mode;
            a.offsets = off.data();
            a.keys = keys.data();
            a.bags = bags;
            a.combiner = comb;
            a.out = pooled.data();
            a.out_type = ot;
            a.rows = rows.data();
            pooled.fill_bytes(0xFF);
            std::vector<double> ms;
            for (int r = 0; r < warmup + repeats; ++r) {
              double t = time_ms(dev, [&] { pooled_forward(dev, a); });
              if (r >= warmup) ms.push_back(t);
            }
            HashTableMeta m = table.read_meta();
            size_t wrong = size_t(m.missing + m.refused);
            table.check_errors();
            // Sample of bags against the host reference.
            size_t ob = output_type_bytes(ot);
            std::vector<uint8_t> got(size_t(p.dim) * ob);
            for (int64_t b = 0; b < bags; b += std::max<int64_t>(1, bags / 256)) {
              copy_to_host(dev, got.data(), pooled.data() + size_t(b) * p.dim * ob, got.size());
              for (int e = 0; e < p.dim; ++e) {
                float acc = 0;
                for (int64_t i = offsets[size_t(b)]; i < offsets[size_t(b) + 1]; ++i)
                  acc += initial_value(ki, uint64_t(hk[size_t(i)]), e);
                if (comb == Combiner::mean && p.hot > 0) acc /= float(p.hot);
                float g;
                if (ot == OutputType::f32) {
                  std::memcpy(&g, &got[size_t(e) * 4], 4);
                } else {
                  uint16_t h;
                  std::memcpy(&h, &got[size_t(e) * 2], 2);
                  g = ot == OutputType::bf16 ? bf16_bits_to_float(h) : f16_bits_to_float(h);
                  acc = ot == OutputType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(acc))
                                               : f16_bits_to_float(float_to_f16_bits(acc));
                }
                wrong += !(std::fabs(g - acc) <= 1e-6f + 1e-6f * std::fabs(acc));
              }
            }
            wrong_total += wrong;
            double med = median(ms);
            double bytes = double(nnz) * p.dim * 4 + double(bags) * p.dim * double(ob);
            double gbps = bytes / med / 1e6, floor_ms = bytes / copy_gbps / 1e6;
            std::printf("  %9lld %4d %6lld %5d %3d %5.2f %5s %4s %8lld %10.4f %8.0f %6.1f%% %6.3f %9lld %6zu\n",
                        (long long)p.rows, p.dim, (long long)p.batch, p.slots, p.hot, alpha, mode_s.c_str(),
                        type_s.c_str(), (long long)unique, med, gbps, 100 * gbps / copy_gbps, floor_ms, (long long)nnz,
                        wrong);
            std::fflush(stdout);
            if (out.is_open())
              out << strprintf("{\"bench\":\"embedding\",\"rows\":%lld,\"dim\":%d,\"batch\":%lld,\"slots\":%d,\"hot\":%d,"
                               "\"alpha\":%g,\"mode\":\"%s\",\"out_type\":\"%s\",\"combiner\":\"%s\",\"unique_keys\":%lld,"
                               "\"nnz\":%lld,\"repeats\":%d,\"ms\":%.5f,\"GBps\":%.2f,\"copy_GBps\":%.2f,"
                               "\"fraction_of_copy\":%.4f,\"floor_ms\":%.5f,\"wrong\":%zu,%s}\n",
                               (long long)p.rows, p.dim, (long long)p.batch, p.slots, p.hot, alpha, mode_s.c_str(),
                               type_s.c_str(), combiner_name(comb), (long long)unique, (long long)nnz, repeats, med,
                               gbps, copy_gbps, gbps / copy_gbps, floor_ms, wrong, prov.c_str());
          }
        }
      }
    }
    close_device(dev);
    if (wrong_total) {
      std::fprintf(stderr, "bench_embedding: %zu wrong values\n", wrong_total);
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_embedding: %s\n", e.what());
    return 1;
  }
  return 0;
}
