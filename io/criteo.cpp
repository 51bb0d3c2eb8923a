// criteo.cpp: see criteo.h.
#include "io/criteo.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "src/base/check.h"

namespace sparta {
namespace {

constexpr int kFields = 1 + kCriteoDense + kCriteoSlots;

std::string field_name(int f) {
  if (f == 0) return "label";
  if (f <= kCriteoDense) return "I" + std::to_string(f);
  return "C" + std::to_string(f - kCriteoDense);
}

std::string shown(const char* b, const char* e) {
  std::string s(b, std::min<size_t>(e - b, 40));
  if (e - b > 40) s += "...";
  return s;
}

std::string bad_field(int f, const char* what, const char* b, const char* e) {
  return "field " + field_name(f) + " (column " + std::to_string(f + 1) + "): expected " + what + ", found '" +
         shown(b, e) + "'";
}

}  // namespace

std::string parse_criteo_line(const char* begin, const char* end, int64_t max_index, CriteoSample& out) {
  if (end > begin && end[-1] == '\r') --end;
  const char* f[kFields + 1];
  int n = 0;
  f[n++] = begin;
  for (const char* p = begin; p < end; ++p)
    if (*p == '\t') {
      if (n == kFields) return strprintf("expected %d tab-separated fields (label, 13 integer, 26 categorical), found more", kFields);
      f[n++] = p + 1;
    }
  if (n != kFields)
    return strprintf("expected %d tab-separated fields (label, 13 integer, 26 categorical), found %d", kFields, n);
  f[kFields] = end + 1;  // so that field i ends at f[i+1]-1
  const char* lb = f[0];
  const char* le = f[1] - 1;
  if (le - lb != 1 || (*lb != '0' && *lb != '1')) return bad_field(0, "0 or 1", lb, le);
  out.label = *lb == '1' ? 1.f : 0.f;
  for (int i = 0; i < kCriteoDense; ++i) {
    const char* b = f[1 + i];
    const char* e = f[2 + i] - 1;
    int64_t v = 0;
    if (b < e) {
      const char* p = b;
      bool neg = *p == '-';
      if (neg || *p == '+') ++p;
      if (p == e || e - p > 18) return bad_field(1 + i, "an integer", b, e);
      for (; p < e; ++p) {
        if (*p < '0' || *p > '9') return bad_field(1 + i, "an integer", b, e);
        v = v * 10 + (*p - '0');
      }
      if (neg) v = 0;  // MLPerf: negative counts become 0
    }
    out.dense[i] = static_cast<float>(std::log1p(static_cast<double>(v)));
  }
  for (int s = 0; s < kCriteoSlots; ++s) {
    const int fi = 1 + kCriteoDense + s;
    const char* b = f[fi];
    const char* e = f[fi + 1] - 1;
    uint64_t v = 0;
    if (e - b > 16) return bad_field(fi, "at most 16 hexadecimal digits", b, e);
    for (const char* p = b; p < e; ++p) {
      char ch = *p;
      int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
      if (d < 0) return bad_field(fi, "hexadecimal digits", b, e);
      v = v << 4 | static_cast<uint64_t>(d);
    }
    if (v >> 63) return bad_field(fi, "a key below 2^63", b, e);
    int64_t key = static_cast<int64_t>(v);
    out.keys[s] = max_index > 0 ? key % max_index : key;
  }
  return "";
}

DatasetSchema criteo_schema(int64_t max_index) {
  DatasetSchema s;
  s.num_dense = kCriteoDense;
  s.num_slots = kCriteoSlots;
  s.cardinality.assign(kCriteoSlots, max_index > 0 ? max_index : 0);
  s.hotness.assign(kCriteoSlots, 1);
  s.preprocessing =
      "criteo-tsv (sparta-convert, MLPerf DLRM): integer features: empty -> 0, negative -> 0, then log(x + 1); "
      "categorical features: hexadecimal -> int64 key, empty -> 0" +
      (max_index > 0 ? ", then key % " + std::to_string(max_index) : std::string(", no modulo (unbounded keys)"));
  return s;
}

ConvertStats convert_criteo(const std::vector<std::string>& inputs, const std::string& out, const CriteoOptions& o) {
  SPARTA_REQUIRE(!inputs.empty(), "sparta-convert: no input files");
  SPARTA_REQUIRE(o.max_index >= 0, "--max-index: expected >= 0 (0: no modulo), found %lld", (long long)o.max_index);
  SPARTA_REQUIRE(o.block_rows >= 1, "block rows: expected >= 1, found %lld", (long long)o.block_rows);
  auto t0 = std::chrono::steady_clock::now();
  double total = 0;
  for (const std::string& in : inputs) {
    struct stat st;
    if (in != "-" && stat(in.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += double(st.st_size);
    else if (in == "-") total = -1e300;  // unknown size: no ETA
  }
  ConvertStats stats;
  try {
    DatasetWriter writer(out, criteo_schema(o.max_index), o.write);
    SampleBlock block;
    block.reset(kCriteoDense, kCriteoSlots);
    CriteoSample smp;
    ProgressBar bar("sparta-convert " + out, total > 0 ? total : 0, "B", o.progress);
    auto flush_block = [&] {
      writer.append(block);
      stats.samples += block.size();
      block.reset(kCriteoDense, kCriteoSlots);
    };
    const size_t cap = size_t(16) << 20;
    std::vector<char> buf(cap);
    for (const std::string& in : inputs) {
      const std::string name = in == "-" ? std::string("<stdin>") : in;
      std::unique_ptr<FILE, int (*)(FILE*)> fp(in == "-" ? stdin : std::fopen(in.c_str(), "rb"),
                                               in == "-" ? [](FILE*) { return 0; } : &std::fclose);
      SPARTA_REQUIRE(fp, "%s: cannot open for reading (%s)", name.c_str(), std::strerror(errno));
      size_t have = 0;
      int64_t line = 0;
      bool eof = false;
      while (!eof || have > 0) {
        if (!eof) {
          size_t got = std::fread(buf.data() + have, 1, cap - have, fp.get());
          SPARTA_REQUIRE(!std::ferror(fp.get()), "%s: read error (%s)", name.c_str(), std::strerror(errno));
          if (got == 0) eof = true;
          have += got;
          stats.bytes += static_cast<int64_t>(got);
        }
        const char* p = buf.data();
        const char* end = buf.data() + have;
        while (p < end) {
          const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
          if (!nl) {
            if (!eof) break;  // an incomplete line: read more first
            nl = end;         // the last line has no newline
          }
          ++line;
          ++stats.lines;
          std::string err = parse_criteo_line(p, nl, o.max_index, smp);
          if (err.empty()) {
            block.labels.push_back(smp.label);
            block.dense.insert(block.dense.end(), smp.dense, smp.dense + kCriteoDense);
            for (int s = 0; s < kCriteoSlots; ++s) {
              block.keys.push_back(smp.keys[s]);
              block.offsets.push_back(static_cast<int64_t>(block.keys.size()));
            }
            if (block.size() >= o.block_rows) flush_block();
          } else if (o.skip_bad) {
            if (stats.skipped < 5) std::fprintf(stderr, "sparta-convert: skipped %s:%lld: %s\n", name.c_str(), (long long)line, err.c_str());
            ++stats.skipped;
          } else {
            throw Error(name + ":" + std::to_string(line) + ": " + err + " (use --skip-bad to skip malformed lines)");
          }
          p = nl + 1;
        }
        size_t used = std::min<size_t>(p - buf.data(), have);
        SPARTA_REQUIRE(used > 0 || eof || have < cap, "%s:%lld: line longer than %zu bytes", name.c_str(),
                       (long long)(line + 1), cap);
        std::memmove(buf.data(), buf.data() + used, have - used);
        have -= used;
        bar.update(double(stats.bytes));
      }
    }
    if (block.size() > 0) flush_block();
    writer.finish();
    bar.finish();
  } catch (...) {
    std::remove(out.c_str());
    throw;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace sparta
