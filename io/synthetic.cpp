// synthetic.cpp: see synthetic.h.
#include "io/synthetic.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/deadline.h"

namespace sparta {
namespace {

// MLPerf DLRM v1 (Criteo 1TB, the reference's day-0..23 vocabulary sizes).
const std::vector<int64_t> kMlperfCardinality = {
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36};
// MLPerf DLRM-DCNv2's multi-hot keys per slot over the same 26 tables.
const std::vector<int> kDcnv2Hotness = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
const std::vector<int64_t> kSmallCardinality = {1000, 200, 50000, 10000, 30, 5000, 100000, 2000};

const double kSqrt3 = 1.7320508075688772;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SPARTA_REQUIRE(used == s.size() && !s.empty(), "%s: expected an integer, found '%s'", what.c_str(), s.c_str());
  return v;
}

uint64_t parse_uint(const std::string& s, const std::string& what) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SPARTA_REQUIRE(used == s.size() && !s.empty() && s[0] != '-', "%s: expected an unsigned integer, found '%s'",
                 what.c_str(), s.c_str());
  return v;
}

double parse_double(const std::string& s, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SPARTA_REQUIRE(used == s.size() && !s.empty(), "%s: expected a number, found '%s'", what.c_str(), s.c_str());
  return v;
}

// One entry, or one per slot.
std::vector<std::string> per_slot(const std::string& spec, int64_t slots, const std::string& what) {
  std::vector<std::string> parts = split(spec, ',');
  SPARTA_REQUIRE(parts.size() == 1 || static_cast<int64_t>(parts.size()) == slots,
                 "%s: expected one value or %lld (one per slot), found %zu in '%s'", what.c_str(), (long long)slots,
                 parts.size(), spec.c_str());
  if (parts.size() == 1) parts.assign(slots, parts[0]);
  return parts;
}

// "k" (fixed) or "a-b" (uniform per sample): the hotness of one slot.
void parse_hotness(const std::string& h, const std::string& what, int64_t& lo, int64_t& hi) {
  size_t dash = h.find('-');
  if (dash == std::string::npos) {
    lo = hi = parse_int(h, what);
  } else {
    lo = parse_int(h.substr(0, dash), what);
    hi = parse_int(h.substr(dash + 1), what);
  }
  SPARTA_REQUIRE(lo >= 0 && hi >= 1 && lo <= hi && hi <= 1 << 20,
                 "%s: expected k or a-b with 0 <= a <= b, 1 <= b <= 1048576, found '%s'", what.c_str(), h.c_str());
}

// The shortest decimal text that reads back as exactly v, so a recorded setting regenerates the same file.
std::string exact_text(double v) {
  for (int digits = 6; digits < 17; ++digits) {
    std::string t = strprintf("%.*g", digits, v);
    if (std::strtod(t.c_str(), nullptr) == v) return t;
  }
  return strprintf("%.17g", v);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Mean of the exponential behind dense feature j.
double dense_mean(uint64_t seed, int64_t j) { return std::exp(6.0 * unit_double(hash_mix(seed ^ 0xde45e0ull, j))); }

float dense_value(uint64_t sample_hash, int64_t j, double mean) {
  double u = unit_double(hash_mix(sample_hash, 16 + j));
  return static_cast<float>(std::log1p(-std::log1p(-u) * mean));
}

double gaussian(uint64_t h1, uint64_t h2) {
  double u1 = std::max(unit_double(h1), 1e-300), u2 = unit_double(h2);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Power-law sampler over [0, c): continuous inverse CDF of x^-alpha on [1, c+1), minus one.
struct KeySampler {
  int64_t card;
  double alpha, span, inv;
  KeySampler(int64_t c, double a) : card(c), alpha(a) {
    if (a != 0 && std::fabs(a - 1) > 1e-9) {
      span = std::pow(double(c) + 1, 1 - a) - 1;
      inv = 1 / (1 - a);
    } else {
      span = std::log(double(c) + 1);
      inv = 0;
    }
  }
  int64_t operator()(double u) const {
    double x;
    if (alpha == 0) return std::min<int64_t>(card - 1, static_cast<int64_t>(u * card));
    if (inv == 0) x = std::exp(u * span);
    else x = std::pow(1 + u * span, inv);
    return std::max<int64_t>(0, std::min<int64_t>(card - 1, static_cast<int64_t>(x) - 1));
  }
};

}  // namespace

std::string SyntheticConfig::describe() const {
  auto ints = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  std::string hot, al;
  for (size_t s = 0; s < cardinality.size(); ++s) {
    hot += (s ? "," : "") + (hotness_min[s] == hotness_max[s]
                                 ? std::to_string(hotness_max[s])
                                 : std::to_string(hotness_min[s]) + "-" + std::to_string(hotness_max[s]));
    al += (s ? "," : "") + exact_text(alpha[s]);
  }
  return strprintf("generator=sparta-datagen preset=%s seed=%llu teacher_seed=%llu samples=%lld num_dense=%lld slots=%lld ",
                   preset.c_str(), (unsigned long long)seed, (unsigned long long)teacher_seed, (long long)num_samples,
                   (long long)num_dense, (long long)num_slots()) +
         "cardinality=" + ints(cardinality) + " hotness=" + hot + " alpha=" + al +
         strprintf(" max_rows=%lld teacher=dlrm-dot teacher_dim=%d", (long long)max_rows, teacher_dim) +
         " teacher_scale=" + exact_text(teacher_scale) + " teacher_bias=" + exact_text(teacher_bias) +
         " teacher_noise=" + exact_text(teacher_noise);
}

std::vector<int> mlperf_dcnv2_hotness() { return kDcnv2Hotness; }

std::vector<int64_t> preset_cardinality(const std::string& preset) {
  if (preset == "mlperf") return kMlperfCardinality;
  if (preset == "small") return kSmallCardinality;
  throw Error("--preset: expected mlperf or small, found '" + preset + "'");
}

SyntheticConfig make_synthetic_config(const SyntheticOptions& o) {
  SyntheticConfig c;
  c.preset = o.preset;
  std::vector<int64_t> base = preset_cardinality(o.preset);
  SPARTA_REQUIRE(o.samples >= 0, "--samples: expected >= 0, found %lld", (long long)o.samples);
  c.num_samples = o.samples;
  c.num_dense = o.num_dense < 0 ? 13 : o.num_dense;
  SPARTA_REQUIRE(c.num_dense >= 1 && c.num_dense <= 4096, "--num-dense: expected 1..4096, found %lld",
                 (long long)c.num_dense);
  int64_t slots = o.slots < 0 ? static_cast<int64_t>(base.size()) : o.slots;
  SPARTA_REQUIRE(slots >= 1 && slots <= 4096, "--slots: expected 1..4096, found %lld", (long long)slots);
  SPARTA_REQUIRE(o.max_rows >= 0, "--max-rows: expected >= 0 (0: no cap), found %lld", (long long)o.max_rows);
  c.max_rows = o.max_rows;
  c.seed = o.seed;
  c.teacher_seed = o.teacher_seed;
  for (int64_t s = 0; s < slots; ++s) {
    int64_t card = base[s % base.size()];
    c.cardinality.push_back(o.max_rows > 0 ? std::min(card, o.max_rows) : card);
  }
  for (const std::string& h : per_slot(o.hotness, slots, "--hotness")) {
    int64_t lo, hi;
    parse_hotness(h, "--hotness", lo, hi);
    c.hotness_min.push_back(lo);
    c.hotness_max.push_back(hi);
  }
  for (const std::string& a : per_slot(o.alpha, slots, "--alpha")) {
    double v = parse_double(a, "--alpha");
    SPARTA_REQUIRE(v >= 0 && v <= 10, "--alpha: expected 0 <= alpha <= 10 (0: uniform), found %g", v);
    c.alpha.push_back(v);
  }
  return c;
}

DatasetSchema synthetic_schema(const SyntheticConfig& c) {
  DatasetSchema s;
  s.num_samples = c.num_samples;
  s.num_dense = c.num_dense;
  s.num_slots = c.num_slots();
  s.cardinality = c.cardinality;
  s.hotness = c.hotness_max;
  s.preprocessing =
      "synthetic (sparta-datagen): dense = log(1 + x), x exponential with a mean per feature; keys from a power "
      "law per slot; labels Bernoulli(sigmoid(teacher logit + noise)); see the generator attribute";
  s.generator = c.describe();
  s.seed = c.seed;
  s.teacher_seed = c.teacher_seed;
  return s;
}

SyntheticConfig recorded_config(const DatasetSchema& s, const std::string& path) {
  const std::string where = path + ": attribute 'generator'";
  SPARTA_REQUIRE(!s.generator.empty(),
                 "%s: no attribute 'generator': expected a synthetic file (sparta-datagen), found preprocessing \"%s\"",
                 path.c_str(), s.preprocessing.c_str());
  std::map<std::string, std::string> kv;
  for (const std::string& item : split(s.generator, ' ')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    SPARTA_REQUIRE(eq != std::string::npos && eq > 0, "%s: expected key=value items, found '%s'", where.c_str(),
                   item.c_str());
    kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = kv.find(key);
    SPARTA_REQUIRE(it != kv.end(), "%s: missing '%s=' in \"%s\"", where.c_str(), key.c_str(), s.generator.c_str());
    return it->second;
  };
  auto what = [&](const std::string& key) { return where + " " + key; };
  SPARTA_REQUIRE(get("generator") == "sparta-datagen" && get("teacher") == "dlrm-dot",
                 "%s: expected generator=sparta-datagen teacher=dlrm-dot, found generator=%s teacher=%s",
                 where.c_str(), get("generator").c_str(), get("teacher").c_str());
  SyntheticConfig c;
  c.preset = get("preset");
  c.num_samples = parse_int(get("samples"), what("samples"));
  c.num_dense = parse_int(get("num_dense"), what("num_dense"));
  const int64_t slots = parse_int(get("slots"), what("slots"));
  for (const std::string& v : split(get("cardinality"), ',')) c.cardinality.push_back(parse_int(v, what("cardinality")));
  for (const std::string& h : split(get("hotness"), ',')) {
    int64_t lo, hi;
    parse_hotness(h, what("hotness"), lo, hi);
    c.hotness_min.push_back(lo);
    c.hotness_max.push_back(hi);
  }
  for (const std::string& a : split(get("alpha"), ',')) c.alpha.push_back(parse_double(a, what("alpha")));
  SPARTA_REQUIRE(c.num_slots() == slots && static_cast<int64_t>(c.hotness_max.size()) == slots &&
                     static_cast<int64_t>(c.alpha.size()) == slots,
                 "%s: expected slots=%lld values in cardinality, hotness and alpha, found %zu, %zu and %zu",
                 where.c_str(), (long long)slots, c.cardinality.size(), c.hotness_max.size(), c.alpha.size());
  c.max_rows = parse_int(get("max_rows"), what("max_rows"));
  c.teacher_dim = static_cast<int>(parse_int(get("teacher_dim"), what("teacher_dim")));
  SPARTA_REQUIRE(c.teacher_dim >= 1 && c.teacher_dim <= 1024, "%s: teacher_dim: expected 1..1024, found %d",
                 where.c_str(), c.teacher_dim);
  c.teacher_scale = parse_double(get("teacher_scale"), what("teacher_scale"));
  c.teacher_bias = parse_double(get("teacher_bias"), what("teacher_bias"));
  c.teacher_noise = parse_double(get("teacher_noise"), what("teacher_noise"));
  c.seed = parse_uint(get("seed"), what("seed"));
  SPARTA_REQUIRE(!s.seed || *s.seed == c.seed, "%s: attribute 'seed' is %llu, but the generator attribute says seed=%llu",
                 path.c_str(), (unsigned long long)*s.seed, (unsigned long long)c.seed);
  // The attribute, else the generator's key; files from before teacher seeds had one seed for both.
  c.teacher_seed = kv.count("teacher_seed") ? parse_uint(kv["teacher_seed"], what("teacher_seed")) : c.seed;
  if (s.teacher_seed) {
    SPARTA_REQUIRE(!kv.count("teacher_seed") || *s.teacher_seed == c.teacher_seed,
                   "%s: attribute 'teacher_seed' is %llu, but the generator attribute says teacher_seed=%llu",
                   path.c_str(), (unsigned long long)*s.teacher_seed, (unsigned long long)c.teacher_seed);
    c.teacher_seed = *s.teacher_seed;
  }
  SPARTA_REQUIRE(c.num_samples == s.num_samples && c.num_dense == s.num_dense && slots == s.num_slots &&
                     c.cardinality == s.cardinality && c.hotness_max == s.hotness,
                 "%s: the generator's settings (samples=%lld num_dense=%lld slots=%lld cardinality, hotness) do not "
                 "match the file's attributes (num_samples %lld, num_dense %lld, num_slots %lld, cardinality, hotness)",
                 path.c_str(), (long long)c.num_samples, (long long)c.num_dense, (long long)slots,
                 (long long)s.num_samples, (long long)s.num_dense, (long long)s.num_slots);
  return c;
}

Teacher::Teacher(const SyntheticConfig& c) : c_(c), seed_(hash_mix(c.teacher_seed, 0x7eac4e5ull)) {
  const int64_t D = c.num_dense, S = c.num_slots(), d = c.teacher_dim;
  // Standardize dense features with moments estimated from a fixed stream of draws (the same on every rank).
  dense_mean_.assign(D, 0);
  dense_inv_std_.assign(D, 1);
  const int draws = 4096;
  for (int64_t j = 0; j < D; ++j) {
    double m = dense_mean(c.teacher_seed, j), sum = 0, sq = 0;
    for (int i = 0; i < draws; ++i) {
      double v = dense_value(hash_mix(seed_ ^ 0x5eedull, i), j, m);
      sum += v;
      sq += v * v;
    }
    double mean = sum / draws, var = std::max(sq / draws - mean * mean, 1e-12);
    dense_mean_[j] = mean;
    dense_inv_std_[j] = 1 / std::sqrt(var);
  }
  proj_.resize(d * D);
  for (int64_t i = 0; i < d * D; ++i)
    proj_[i] = (2 * unit_double(hash_mix(seed_ ^ 0x9a0cull, i)) - 1) * kSqrt3 / std::sqrt(double(D));
  pair_w_.resize((S + 1) * S / 2);
  for (size_t i = 0; i < pair_w_.size(); ++i) pair_w_[i] = (2 * unit_double(hash_mix(seed_ ^ 0x9a1full, i)) - 1) * kSqrt3;
  vec_.resize((S + 1) * d);
}

double Teacher::logit(const float* dense, const int64_t* offsets, const int64_t* keys) const {
  const int64_t D = c_.num_dense, S = c_.num_slots(), d = c_.teacher_dim;
  double* v0 = vec_.data();
  for (int64_t k = 0; k < d; ++k) {
    double acc = 0;
    for (int64_t j = 0; j < D; ++j) acc += proj_[k * D + j] * (dense[j] - dense_mean_[j]) * dense_inv_std_[j];
    v0[k] = acc;
  }
  double first = 0;
  for (int64_t s = 0; s < S; ++s) {
    double* v = vec_.data() + (s + 1) * d;
    std::fill(v, v + d, 0.0);
    const int64_t n = offsets[s + 1] - offsets[s];
    if (n == 0) continue;
    const uint64_t hs = hash_mix(seed_, s);
    double bias = 0;
    for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) {
      const uint64_t hk = hash_mix(hs, static_cast<uint64_t>(keys[t]));
      for (int64_t k = 0; k < d; ++k) v[k] += 2 * unit_double(splitmix64(hk + 0x1000 * (k + 1))) - 1;
      bias += 2 * unit_double(splitmix64(hk ^ 0xb1a5ull)) - 1;
    }
    const double norm = kSqrt3 / std::sqrt(double(n));
    for (int64_t k = 0; k < d; ++k) v[k] *= norm;
    first += bias * norm;
  }
  double inter = 0;
  size_t p = 0;
  for (int64_t a = 1; a <= S; ++a)
    for (int64_t b = 0; b < a; ++b, ++p) {
      const double* va = vec_.data() + a * d;
      const double* vb = vec_.data() + b * d;
      double dot = 0;
      for (int64_t k = 0; k < d; ++k) dot += va[k] * vb[k];
      inter += pair_w_[p] * dot;
    }
  inter /= std::sqrt(double(pair_w_.size()) * d);
  first /= std::sqrt(double(S));
  return c_.teacher_bias + c_.teacher_scale * (0.8 * inter + 0.6 * first);
}

AucHistogram::AucHistogram(int bins) : pos(bins, 0), neg(bins, 0) {}

void AucHistogram::add(double score, float label) {
  const int bins = static_cast<int>(pos.size());
  int b = static_cast<int>(std::min(std::max(score, 0.0), 1.0) * bins);
  b = std::min(b, bins - 1);
  (label > 0.5f ? pos : neg)[b] += 1;
}

double AucHistogram::auc() const {
  double below = 0, area = 0, P = 0, N = 0;
  for (size_t b = 0; b < pos.size(); ++b) {
    area += pos[b] * (below + 0.5 * neg[b]);
    below += neg[b];
    P += pos[b];
    N += neg[b];
  }
  return P > 0 && N > 0 ? area / (P * N) : 0.5;
}

void AucHistogram::reduce(int root, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int n = static_cast<int>(pos.size());
  timed_reduce(rank == root ? MPI_IN_PLACE : pos.data(), pos.data(), n, MPI_INT64_T, MPI_SUM, root, comm,
               "datagen (AUC histogram)");
  timed_reduce(rank == root ? MPI_IN_PLACE : neg.data(), neg.data(), n, MPI_INT64_T, MPI_SUM, root, comm,
               "datagen (AUC histogram)");
}

double exact_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  std::vector<size_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double rank_sum = 0, P = 0;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j < idx.size() && scores[idx[j]] == scores[idx[i]]) ++j;
    double mid = 0.5 * (i + 1 + j);  // average 1-based rank of the tie group
    for (size_t k = i; k < j; ++k)
      if (labels[idx[k]] > 0.5f) rank_sum += mid, P += 1;
    i = j;
  }
  double N = scores.size() - P;
  return P > 0 && N > 0 ? (rank_sum - P * (P + 1) / 2) / (P * N) : 0.5;
}

void generate_samples(const SyntheticConfig& c, const Teacher& t, int64_t first, int64_t n, SampleBlock& out,
                      std::vector<float>* probs) {
  const int64_t D = c.num_dense, S = c.num_slots();
  if (out.size() == 0) out.reset(D, S);
  std::vector<double> means(D);
  for (int64_t j = 0; j < D; ++j) means[j] = dense_mean(c.teacher_seed, j);
  std::vector<KeySampler> samplers;
  for (int64_t s = 0; s < S; ++s) samplers.emplace_back(c.cardinality[s], c.alpha[s]);
  std::vector<int64_t> local_off(S + 1);
  for (int64_t i = first; i < first + n; ++i) {
    const uint64_t h = hash_mix(c.seed, static_cast<uint64_t>(i));
    const size_t d0 = out.dense.size();
    for (int64_t j = 0; j < D; ++j) out.dense.push_back(dense_value(h, j, means[j]));
    const size_t k0 = out.keys.size();
    for (int64_t s = 0; s < S; ++s) {
      const uint64_t hs = hash_mix(h, (1u << 20) + s);
      const int64_t span = c.hotness_max[s] - c.hotness_min[s] + 1;
      const int64_t count = c.hotness_min[s] + std::min(span - 1, static_cast<int64_t>(unit_double(hs) * span));
      local_off[s] = static_cast<int64_t>(out.keys.size() - k0);
      for (int64_t k = 0; k < count; ++k) out.keys.push_back(samplers[s](unit_double(hash_mix(hs, k + 1))));
      out.offsets.push_back(static_cast<int64_t>(out.keys.size()));
    }
    local_off[S] = static_cast<int64_t>(out.keys.size() - k0);
    const double z = t.logit(out.dense.data() + d0, local_off.data(), out.keys.data() + k0);
    const double noisy = z + c.teacher_noise * gaussian(hash_mix(h, 1), hash_mix(h, 2));
    out.labels.push_back(unit_double(hash_mix(h, 3)) < sigmoid(noisy) ? 1.f : 0.f);
    if (probs) probs->push_back(static_cast<float>(sigmoid(z)));
  }
}

namespace {

template <class T>
void send_vec(const std::vector<T>& v, int tag, MPI_Comm comm) {
  timed_send(v.data(), static_cast<int>(v.size() * sizeof(T)), 0, tag, comm, "datagen (samples to rank 0)");
}
template <class T>
void recv_vec(std::vector<T>& v, size_t n, int src, int tag, MPI_Comm comm) {
  v.resize(n);
  timed_recv(v.data(), static_cast<int>(n * sizeof(T)), src, tag, comm, "datagen (samples from rank " + std::to_string(src) + ")");
}

}  // namespace

GenerateResult generate_dataset(const std::string& path, const SyntheticConfig& c, const WriteOptions& w,
                                MPI_Comm comm, bool progress) {
  auto t0 = std::chrono::steady_clock::now();
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  DatasetSchema schema;
  // Checked on every rank, and agreed, so that a bad option ends every rank with status 1.
  agree_on_error(comm, guarded([&] {
                   schema = synthetic_schema(c);
                   schema.check("synthetic dataset " + path);
                   SPARTA_REQUIRE(w.chunk_rows >= 1, "--chunk: expected >= 1, found %lld", (long long)w.chunk_rows);
                 }),
                 "datagen (options)");
  // A rank's share of a round, bounded so that each message stays below 2 GiB.
  const int64_t bytes_per_sample = 8 * std::max<int64_t>(schema.max_keys_per_sample() + schema.num_slots, c.num_dense);
  const int64_t share = std::max<int64_t>(1, std::min<int64_t>(w.chunk_rows, (INT_MAX / 2) / bytes_per_sample));
  const int64_t round = share * world;

  std::unique_ptr<DatasetWriter> writer;
  std::string error;
  if (rank == 0) {
    try {
      writer = std::make_unique<DatasetWriter>(path, schema, w);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree_on_error(comm, error, "datagen");

  Teacher teacher(c);
  AucHistogram hist;
  SampleBlock mine, other;
  std::vector<float> probs;
  std::vector<int64_t> sizes(2);
  int64_t positives = 0;
  ProgressBar bar("sparta-datagen " + path, double(c.num_samples), "samples", progress && rank == 0);
  for (int64_t r0 = 0; r0 < c.num_samples; r0 += round) {
    const int64_t len = std::min(round, c.num_samples - r0);
    const int64_t lo = r0 + rank * len / world, hi = r0 + (rank + 1) * len / world;
    mine.reset(c.num_dense, c.num_slots());
    probs.clear();
    // Agree before the exchange: a rank that failed here would never send, and rank 0 would wait for it.
    agree_on_error(comm, guarded([&] {
                     if (rank == c.fail_rank && r0 / round == c.fail_round)
                       throw Error(strprintf("planted failure while generating round %lld on rank %d (a test's "
                                             "SyntheticConfig::fail_rank)", (long long)(r0 / round), rank));
                     generate_samples(c, teacher, lo, hi - lo, mine, &probs);
                   }), "datagen");
    for (size_t i = 0; i < probs.size(); ++i) {
      hist.add(probs[i], mine.labels[i]);
      positives += mine.labels[i] > 0.5f;
    }
    if (rank != 0) {
      sizes = {mine.size(), static_cast<int64_t>(mine.keys.size())};
      send_vec(sizes, 1, comm);
      send_vec(mine.labels, 2, comm);
      send_vec(mine.dense, 3, comm);
      send_vec(mine.offsets, 4, comm);
      send_vec(mine.keys, 5, comm);
    } else {
      for (int src = 0; src < world; ++src) {
        SampleBlock* b = &mine;
        if (src > 0) {
          b = &other;
          recv_vec(sizes, 2, src, 1, comm);
          other.num_dense = c.num_dense;
          other.num_slots = c.num_slots();
          recv_vec(other.labels, sizes[0], src, 2, comm);
          recv_vec(other.dense, sizes[0] * c.num_dense, src, 3, comm);
          recv_vec(other.offsets, sizes[0] * c.num_slots() + 1, src, 4, comm);
          recv_vec(other.keys, sizes[1], src, 5, comm);
        }
        if (!error.empty()) continue;  // keep receiving so that no sender waits forever
        try {
          writer->append(*b);
        } catch (const Error& e) {
          error = e.what();
        }
      }
      bar.update(double(r0 + len));
    }
    agree_on_error(comm, error, "datagen");
  }
  hist.reduce(0, comm);
  timed_allreduce(MPI_IN_PLACE, &positives, 1, MPI_INT64_T, MPI_SUM, comm, "datagen (positives)");
  GenerateResult res;
  double auc = 0;
  int64_t nnz = 0;
  if (rank == 0) {
    res.teacher_auc = hist.auc();
    try {
      writer->schema().teacher_auc = res.teacher_auc;
      writer->finish();
      nnz = writer->keys_written();
    } catch (const Error& e) {
      error = e.what();
    }
    auc = res.teacher_auc;
    bar.finish();
  }
  agree_on_error(comm, error, "datagen");
  timed_bcast(&auc, 1, MPI_DOUBLE, 0, comm, "datagen (teacher AUC)");
  timed_bcast(&nnz, 1, MPI_INT64_T, 0, comm, "datagen (keys written)");
  res.teacher_auc = auc;
  res.num_keys = nnz;
  res.positive_rate = c.num_samples > 0 ? double(positives) / c.num_samples : 0;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace sparta
