// dataset.cpp: see dataset.h.
#include "io/dataset.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>

#include "src/base/check.h"

namespace sparta {
namespace {

std::string dims_str(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

void expect_shape(const h5::File& f, const std::string& path, const std::vector<hsize_t>& want) {
  std::vector<hsize_t> got = h5::shape(f, path);
  if (got != want)
    throw Error(f.path + ": dataset '" + path + "': expected shape " + dims_str(want) + ", found " + dims_str(got));
}

bool finite_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b & 0x7f800000u) != 0x7f800000u;
}

// The scans below accumulate with OR into an integer whose sign bit flags a problem: plain integer adds, ands
// and ors the compiler vectorizes (a bool per element would not be, nor 64-bit compares on SSE2). A flag
// only starts the exact (slow) search that names the culprit.
inline int64_t out_of_range(int64_t x, int64_t hi) { return x | (hi - x); }  // < 0 iff x < 0 or x > hi

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int64_t DatasetSchema::max_keys_per_sample() const {
  int64_t s = 0;
  for (int64_t h : hotness) s += h;
  return s;
}

void DatasetSchema::check(const std::string& where) const {
  SPARTA_REQUIRE(num_dense >= 1, "%s: num_dense: expected >= 1, found %lld", where.c_str(), (long long)num_dense);
  SPARTA_REQUIRE(num_slots >= 1, "%s: num_slots: expected >= 1, found %lld", where.c_str(), (long long)num_slots);
  SPARTA_REQUIRE(static_cast<int64_t>(cardinality.size()) == num_slots,
                 "%s: cardinality: expected %lld values (num_slots), found %zu", where.c_str(),
                 (long long)num_slots, cardinality.size());
  SPARTA_REQUIRE(static_cast<int64_t>(hotness.size()) == num_slots,
                 "%s: hotness: expected %lld values (num_slots), found %zu", where.c_str(), (long long)num_slots,
                 hotness.size());
  for (int64_t s = 0; s < num_slots; ++s) {
    SPARTA_REQUIRE(cardinality[s] >= 0, "%s: cardinality[%lld]: expected >= 0 (0: unbounded), found %lld",
                   where.c_str(), (long long)s, (long long)cardinality[s]);
    SPARTA_REQUIRE(hotness[s] >= 1, "%s: hotness[%lld]: expected >= 1, found %lld", where.c_str(), (long long)s,
                   (long long)hotness[s]);
  }
}

void SampleBlock::reset(int64_t dense_features, int64_t slots) {
  num_dense = dense_features;
  num_slots = slots;
  labels.clear();
  dense.clear();
  offsets.assign(1, 0);
  keys.clear();
}

BlockView view_of(const SampleBlock& b) {
  BlockView v;
  v.num_samples = b.size();
  v.labels = b.labels.data();
  v.dense = b.dense.data();
  v.offsets = b.offsets.data();
  v.keys = b.keys.data();
  return v;
}

void check_offsets(const DatasetSchema& s, const std::string& path, int64_t first_sample, int64_t n,
                   const int64_t* offsets, int64_t total_keys) {
  const int64_t S = s.num_slots;
  const int64_t rows = n * S;
  SPARTA_REQUIRE(offsets[0] >= 0 && offsets[0] <= total_keys,
                 "%s: /sparse/offsets: sample %lld starts at key %lld, expected 0 <= offset <= nnz %lld",
                 path.c_str(), (long long)first_sample, (long long)offsets[0], (long long)total_keys);
  // One branch-free pass; the slow search for the culprit only runs when something is wrong.
  // Unsigned comparison: a negative count (offsets going back) fails it too.
  int64_t acc = 0;
  const int64_t h0 = s.hotness[0];
  if (std::all_of(s.hotness.begin(), s.hotness.end(), [&](int64_t h) { return h == h0; })) {
    for (int64_t r = 0; r < rows; ++r) acc |= out_of_range(offsets[r + 1] - offsets[r], h0);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* o = offsets + i * S;
      for (int64_t t = 0; t < S; ++t) acc |= out_of_range(o[t + 1] - o[t], s.hotness[t]);
    }
  }
  if (acc < 0) {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t count = offsets[r + 1] - offsets[r];
      long long sample = first_sample + r / S, slot = r % S;
      SPARTA_REQUIRE(count >= 0,
                     "%s: /sparse/offsets: not monotone at sample %lld slot %lld: offset %lld follows %lld "
                     "(expected non-decreasing offsets)",
                     path.c_str(), sample, slot, (long long)offsets[r + 1], (long long)offsets[r]);
      SPARTA_REQUIRE(count <= s.hotness[slot],
                     "%s: /sparse/offsets: sample %lld slot %lld has %lld keys, expected at most hotness[%lld] = %lld",
                     path.c_str(), sample, slot, (long long)count, slot, (long long)s.hotness[slot]);
    }
  }
  SPARTA_REQUIRE(offsets[rows] <= total_keys,
                 "%s: /sparse/offsets: sample %lld ends at key %lld, beyond the nnz %lld of /sparse/keys",
                 path.c_str(), (long long)(first_sample + n - 1), (long long)offsets[rows], (long long)total_keys);
}

void check_values(const DatasetSchema& s, const std::string& path, int64_t first_sample, const BlockView& b) {
  const int64_t n = b.num_samples, S = s.num_slots, D = s.num_dense;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= !(b.labels[i] >= 0.f && b.labels[i] <= 1.f);
  if (bad)
    for (int64_t i = 0; i < n; ++i)
      SPARTA_REQUIRE(b.labels[i] >= 0.f && b.labels[i] <= 1.f,
                     "%s: /label: sample %lld is %g, expected a value in [0, 1]", path.c_str(),
                     (long long)(first_sample + i), b.labels[i]);
  const int64_t nd = n * D;
  uint32_t exp_acc = 0;  // bit 31 set iff some exponent is all ones (NaN or Inf)
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(b.dense);
  for (int64_t i = 0; i < nd; ++i) exp_acc |= (bits[i] & 0x7f800000u) + 0x00800000u;
  if (exp_acc & 0x80000000u)
    for (int64_t i = 0; i < nd; ++i)
      SPARTA_REQUIRE(finite_bits(b.dense[i]), "%s: /dense: sample %lld feature %lld is %g, expected a finite value",
                     path.c_str(), (long long)(first_sample + i / D), (long long)(i % D), b.dense[i]);
  // Largest key allowed per slot; 0 (unbounded) allows any key >= 0.
  std::vector<int64_t> top(S);
  for (int64_t t = 0; t < S; ++t) top[t] = s.cardinality[t] > 0 ? s.cardinality[t] - 1 : INT64_MAX;
  const int64_t base = b.offsets[0], nnz = b.offsets[n * S] - base;
  const bool unbounded = std::all_of(s.cardinality.begin(), s.cardinality.end(), [](int64_t c) { return c == 0; });
  const bool one_hot = nnz == n * S && *std::max_element(s.hotness.begin(), s.hotness.end()) == 1;
  int64_t acc = 0;
  if (unbounded) {  // only the sign to check: one flat loop
    for (int64_t k = 0; k < nnz; ++k) acc |= b.keys[k];
  } else if (one_hot) {  // every (sample, slot) has exactly one key: key i*S+t belongs to slot t
    const int64_t* tp = top.data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* k = b.keys + i * S;
      for (int64_t t = 0; t < S; ++t) acc |= out_of_range(k[t], tp[t]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* o = b.offsets + i * S;
      for (int64_t t = 0; t < S; ++t) {
        const int64_t hi = top[t];
        for (int64_t k = o[t] - base; k < o[t + 1] - base; ++k) acc |= out_of_range(b.keys[k], hi);
      }
    }
  }
  if (acc < 0) {
    for (int64_t r = 0; r < n * S; ++r) {
      int64_t slot = r % S;
      for (int64_t k = b.offsets[r] - base; k < b.offsets[r + 1] - base; ++k) {
        int64_t key = b.keys[k];
        SPARTA_REQUIRE(key >= 0, "%s: /sparse/keys: sample %lld slot %lld has key %lld, expected keys >= 0",
                       path.c_str(), (long long)(first_sample + r / S), (long long)slot, (long long)key);
        SPARTA_REQUIRE(s.cardinality[slot] == 0 || key < s.cardinality[slot],
                       "%s: /sparse/keys: sample %lld slot %lld has key %lld, expected key < cardinality[%lld] = %lld",
                       path.c_str(), (long long)(first_sample + r / S), (long long)slot, (long long)key,
                       (long long)slot, (long long)s.cardinality[slot]);
      }
    }
  }
}

DatasetSchema read_schema(const h5::File& f) {
  const std::string& p = f.path;
  std::string format = h5::read_attr_string(f, "/", "format");
  SPARTA_REQUIRE(format == kDatasetFormat, "%s: attribute 'format': expected \"%s\", found \"%s\"", p.c_str(),
                 kDatasetFormat, format.c_str());
  int64_t version = h5::read_attr_int(f, "/", "version");
  SPARTA_REQUIRE(version == kDatasetVersion,
                 "%s: attribute 'version': unknown format version %lld, expected %lld (written by a newer sparta?)",
                 p.c_str(), (long long)version, (long long)kDatasetVersion);
  DatasetSchema s;
  s.num_samples = h5::read_attr_int(f, "/", "num_samples");
  SPARTA_REQUIRE(s.num_samples >= 0,
                 "%s: attribute 'num_samples' is %lld: the writer did not finish (incomplete file), expected >= 0",
                 p.c_str(), (long long)s.num_samples);
  s.num_dense = h5::read_attr_int(f, "/", "num_dense");
  s.num_slots = h5::read_attr_int(f, "/", "num_slots");
  s.cardinality = h5::read_attr_ints(f, "/", "cardinality");
  s.hotness = h5::read_attr_ints(f, "/", "hotness");
  s.preprocessing = h5::read_attr_string(f, "/", "preprocessing");
  if (h5::has_attr(f, "/", "generator")) s.generator = h5::read_attr_string(f, "/", "generator");
  if (h5::has_attr(f, "/", "teacher_auc")) s.teacher_auc = h5::read_attr_double(f, "/", "teacher_auc");
  if (h5::has_attr(f, "/", "seed")) s.seed = static_cast<uint64_t>(h5::read_attr_int(f, "/", "seed"));
  if (h5::has_attr(f, "/", "teacher_seed"))
    s.teacher_seed = static_cast<uint64_t>(h5::read_attr_int(f, "/", "teacher_seed"));
  s.check(p + ": attributes");

  const hsize_t N = s.num_samples;
  h5::expect_numeric<float>(f, "/label");
  expect_shape(f, "/label", {N});
  h5::expect_numeric<float>(f, "/dense");
  expect_shape(f, "/dense", {N, static_cast<hsize_t>(s.num_dense)});
  h5::expect_numeric<int64_t>(f, "/sparse/offsets");
  expect_shape(f, "/sparse/offsets", {N * s.num_slots + 1});
  h5::expect_numeric<int64_t>(f, "/sparse/keys");
  std::vector<hsize_t> kd = h5::shape(f, "/sparse/keys");
  SPARTA_REQUIRE(kd.size() == 1, "%s: dataset '/sparse/keys': expected one dimension [nnz], found %s", p.c_str(),
                 dims_str(kd).c_str());
  s.num_keys = static_cast<int64_t>(kd[0]);
  std::vector<int64_t> first, last;
  h5::read_rows(f, "/sparse/offsets", 0, 1, first);
  h5::read_rows(f, "/sparse/offsets", N * s.num_slots, 1, last);
  SPARTA_REQUIRE(first[0] == 0, "%s: /sparse/offsets[0]: expected 0, found %lld", p.c_str(), (long long)first[0]);
  SPARTA_REQUIRE(last[0] == s.num_keys,
                 "%s: /sparse/offsets[%llu] (the last): expected nnz = %lld (length of /sparse/keys), found %lld",
                 p.c_str(), (unsigned long long)(N * s.num_slots), (long long)s.num_keys, (long long)last[0]);
  return s;
}

DatasetSchema read_schema(const std::string& path) { return read_schema(h5::open_file(path)); }

void check_compatible(const DatasetSchema& a, const std::string& path_a, const DatasetSchema& b,
                      const std::string& path_b) {
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  SPARTA_REQUIRE(a.num_dense == b.num_dense && a.num_slots == b.num_slots && a.cardinality == b.cardinality,
                 "%s does not match %s: num_dense %lld vs %lld, num_slots %lld vs %lld, cardinality [%s] vs [%s]",
                 path_b.c_str(), path_a.c_str(), (long long)b.num_dense, (long long)a.num_dense,
                 (long long)b.num_slots, (long long)a.num_slots, list(b.cardinality).c_str(),
                 list(a.cardinality).c_str());
}

DenseSums dense_sums(const std::string& path, int64_t samples, int rank, int world) {
  h5::File f = h5::open_file(path);
  const DatasetSchema s = read_schema(f);
  const int64_t n = samples > 0 ? std::min(samples, s.num_samples) : s.num_samples, D = s.num_dense;
  DenseSums out;
  out.sum.assign(size_t(D), 0.0);
  out.sum_squares.assign(size_t(D), 0.0);
  const int64_t block = 65536;
  std::vector<float> rows;
  for (int64_t b = rank; b * block < n; b += world) {
    const int64_t first = b * block, count = std::min(block, n - first);
    h5::read_rows<float>(f, "/dense", hsize_t(first), hsize_t(count), rows);
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < D; ++j) {
        const double x = rows[size_t(i * D + j)];
        SPARTA_REQUIRE(std::isfinite(x), "%s: /dense: sample %lld feature %lld is %g, expected a finite value",
                       path.c_str(), (long long)(first + i), (long long)j, x);
        out.sum[size_t(j)] += x;
        out.sum_squares[size_t(j)] += x * x;
      }
    out.count += count;
  }
  return out;
}

DatasetWriter::DatasetWriter(const std::string& path, const DatasetSchema& schema, const WriteOptions& opt)
    : schema_(schema) {
  schema_.check(path);
  SPARTA_REQUIRE(opt.chunk_rows >= 1, "%s: chunk rows: expected >= 1, found %lld", path.c_str(),
                 (long long)opt.chunk_rows);
  SPARTA_REQUIRE(opt.gzip >= 0 && opt.gzip <= 9, "%s: gzip level: expected 0..9, found %d", path.c_str(), opt.gzip);
  file_ = h5::create_file(path);
  schema_.num_samples = -1;
  write_attributes();
  const hsize_t S = schema_.num_slots;
  h5::DatasetOptions o;
  o.gzip = opt.gzip;
  o.fletcher32 = opt.fletcher32;
  o.chunk_rows = opt.chunk_rows;
  h5::create_dataset<float>(file_, "/label", {0}, o, true);
  h5::create_dataset<float>(file_, "/dense", {0, static_cast<hsize_t>(schema_.num_dense)}, o, true);
  h5::create_group(file_, "/sparse");
  o.chunk_rows = opt.chunk_rows * S;
  h5::create_dataset<int64_t>(file_, "/sparse/offsets", {0}, o, true);
  h5::create_dataset<int64_t>(file_, "/sparse/keys", {0}, o, true);
  int64_t zero = 0;
  h5::write_rows(file_, "/sparse/offsets", &zero, 0, 1);
}

void DatasetWriter::write_attributes() {
  h5::write_attr(file_, "/", "format", std::string(kDatasetFormat));
  h5::write_attr(file_, "/", "version", kDatasetVersion);
  h5::write_attr(file_, "/", "num_samples", schema_.num_samples);
  h5::write_attr(file_, "/", "num_dense", schema_.num_dense);
  h5::write_attr(file_, "/", "num_slots", schema_.num_slots);
  h5::write_attr(file_, "/", "cardinality", schema_.cardinality);
  h5::write_attr(file_, "/", "hotness", schema_.hotness);
  h5::write_attr(file_, "/", "preprocessing", schema_.preprocessing);
  if (!schema_.generator.empty()) h5::write_attr(file_, "/", "generator", schema_.generator);
  if (schema_.teacher_auc >= 0) h5::write_attr(file_, "/", "teacher_auc", schema_.teacher_auc);
  if (schema_.seed) h5::write_attr(file_, "/", "seed", static_cast<int64_t>(*schema_.seed));
  if (schema_.teacher_seed) h5::write_attr(file_, "/", "teacher_seed", static_cast<int64_t>(*schema_.teacher_seed));
}

void DatasetWriter::append(const SampleBlock& block) {
  SPARTA_REQUIRE(block.num_dense == schema_.num_dense && block.num_slots == schema_.num_slots,
                 "%s: appended block has %lld dense and %lld slots, expected %lld and %lld", file_.path.c_str(),
                 (long long)block.num_dense, (long long)block.num_slots, (long long)schema_.num_dense,
                 (long long)schema_.num_slots);
  const size_t n = block.labels.size();
  SPARTA_REQUIRE(block.dense.size() == n * schema_.num_dense && block.offsets.size() == n * schema_.num_slots + 1 &&
                     static_cast<int64_t>(block.keys.size()) == block.offsets.back() - block.offsets.front(),
                 "%s: appended block of %zu samples has %zu dense values, %zu offsets and %zu keys (inconsistent)",
                 file_.path.c_str(), n, block.dense.size(), block.offsets.size(), block.keys.size());
  append(view_of(block));
}

void DatasetWriter::append(const BlockView& b) {
  SPARTA_REQUIRE(file_.handle.valid(), "%s: append after finish()", file_.path.c_str());
  const int64_t n = b.num_samples, S = schema_.num_slots;
  if (n == 0) return;
  const int64_t nnz = b.offsets[n * S] - b.offsets[0];
  check_offsets(schema_, file_.path, samples_, n, b.offsets, b.offsets[0] + nnz);
  check_values(schema_, file_.path, samples_, b);
  // Offsets in the file continue from the keys already written; entry 0 of the block is already there.
  shifted_.resize(n * S);
  const int64_t shift = keys_ - b.offsets[0];
  for (int64_t r = 0; r < n * S; ++r) shifted_[r] = b.offsets[r + 1] + shift;
  h5::write_rows(file_, "/label", b.labels, samples_, n);
  h5::write_rows(file_, "/dense", b.dense, samples_, n);
  h5::write_rows(file_, "/sparse/offsets", shifted_.data(), samples_ * S + 1, n * S);
  h5::write_rows(file_, "/sparse/keys", b.keys, keys_, nnz);
  samples_ += n;
  keys_ += nnz;
}

void DatasetWriter::finish() {
  SPARTA_REQUIRE(file_.handle.valid(), "%s: finish() called twice", file_.path.c_str());
  schema_.num_samples = samples_;
  schema_.num_keys = keys_;
  write_attributes();
  h5::flush(file_);
  file_.handle.reset();
}

ProgressBar::ProgressBar(const std::string& label, double total, const std::string& unit, bool enabled)
    : label_(label), unit_(unit), total_(total), start_(now_seconds()), enabled_(enabled) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && !finished_ && last_draw_ >= 0) std::fputc('\n', stderr);
}

bool ProgressBar::stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }

void ProgressBar::update(double done, bool force) {
  done_ = done;
  if (!enabled_) return;
  double t = now_seconds();
  if (!force && last_draw_ >= 0 && t - last_draw_ < 0.25) return;
  last_draw_ = t;
  double elapsed = std::max(t - start_, 1e-9);
  double rate = done / elapsed;
  auto human = [](double x) {
    const char* suffix[] = {"", " k", " M", " G", " T"};
    int i = 0;
    while (x >= 1000 && i < 4) x /= 1000, ++i;
    return strprintf("%.1f%s", x, suffix[i]);
  };
  auto clock = [](double s) {
    long long v = static_cast<long long>(s + 0.5);
    return strprintf("%lld:%02lld:%02lld", v / 3600, (v / 60) % 60, v % 60);
  };
  std::string line = "\r" + label_ + "  ";
  if (total_ > 0) {
    double frac = std::min(1.0, done / total_);
    const int width = 30;
    int fill = static_cast<int>(frac * width);
    line += "[" + std::string(fill, '=') + (fill < width ? ">" : "") + std::string(width - std::min(width, fill + 1), ' ') +
            "] " + strprintf("%5.1f%%  ", 100 * frac);
  }
  line += human(done) + " " + unit_ + "  " + human(rate) + " " + unit_ + "/s  elapsed " + clock(elapsed);
  if (total_ > 0 && rate > 0) line += "  ETA " + clock(std::max(0.0, (total_ - done) / rate));
  line += "   ";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (finished_) return;
  update(done_, true);
  if (enabled_) std::fputc('\n', stderr);
  finished_ = true;
}

}  // namespace sparta
