// csv.cpp: see csv.h.
#include "io/csv.h"

#include <sys/stat.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <unordered_map>

#include "io/checksum.h"
#include "src/base/check.h"

namespace sparta {

std::string split_csv_line(const std::string& line, char delimiter, std::vector<std::string>& fields) {
  fields.clear();
  std::string field;
  size_t i = 0, n = line.size();
  if (n > 0 && line[n - 1] == '\r') --n;
  while (true) {
    field.clear();
    if (i < n && line[i] == '"') {  // quoted: up to the closing quote, "" is a quote
      ++i;
      while (true) {
        if (i >= n) return "a quoted field has no closing quote";
        if (line[i] == '"') {
          if (i + 1 < n && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        field += line[i++];
      }
      if (i < n && line[i] != delimiter)
        return strprintf("field %zu: text after a closing quote (expected the delimiter)", fields.size() + 1);
    } else {
      while (i < n && line[i] != delimiter) field += line[i++];
    }
    fields.push_back(field);
    if (i >= n) return "";
    ++i;  // the delimiter
  }
}

int64_t hash_key(const std::string& value, int64_t max_index) {
  const int64_t key = int64_t(checksum64(value.data(), value.size()) >> 1);
  return max_index > 0 ? key % max_index : key;
}

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// A number, the whole field; false when it is not one.
bool parse_number(const std::string& text, double& v) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && errno != ERANGE;
}

// The columns each role reads, resolved against the header (or as indices).
struct Layout {
  size_t fields = 0;  // the header's field count (0 without a header: taken from the first line)
  int label = -1;
  std::vector<int> dense, categorical, multi;
  std::vector<std::string> names;  // of every column, for messages
};

int find_column(const std::string& where, const std::vector<std::string>& header, const std::string& name,
                const char* role) {
  if (header.empty()) {  // no header: an index
    char* end = nullptr;
    long v = std::strtol(name.c_str(), &end, 10);
    SPARTA_REQUIRE(!name.empty() && *end == '\0' && v >= 0,
                   "%s: %s column '%s': without a header columns are 0-based indices", where.c_str(), role,
                   name.c_str());
    return int(v);
  }
  for (size_t i = 0; i < header.size(); ++i)
    if (trim(header[i]) == name) return int(i);
  std::string all;
  for (size_t i = 0; i < header.size(); ++i) all += (i ? ", " : "") + trim(header[i]);
  throw Error(strprintf("%s: %s column '%s' is not in the header (its columns: %s)", where.c_str(), role,
                        name.c_str(), all.c_str()));
}

Layout make_layout(const std::string& where, const std::vector<std::string>& header, const CsvOptions& o) {
  Layout l;
  l.fields = header.size();
  l.label = find_column(where, header, o.label, "--label");
  for (const auto& c : o.dense) l.dense.push_back(find_column(where, header, c, "--dense"));
  for (const auto& c : o.categorical) l.categorical.push_back(find_column(where, header, c, "--categorical"));
  for (const auto& c : o.multi) l.multi.push_back(find_column(where, header, c, "--multi"));
  for (size_t i = 0; i < header.size(); ++i) l.names.push_back(trim(header[i]));
  return l;
}

std::string column_name(const Layout& l, int c) {
  return c < int(l.names.size()) ? "'" + l.names[c] + "'" : std::to_string(c);
}

// One slot's vocabulary: value → key, numbered in order of first appearance.
using Vocabulary = std::unordered_map<std::string, int64_t>;

void read_vocabulary(const std::string& path, std::vector<Vocabulary>& vocab) {
  std::ifstream in(path);
  SPARTA_REQUIRE(in.good(), "--vocabulary-in %s: cannot be opened for reading", path.c_str());
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t a = line.find('\t'), b = a == std::string::npos ? a : line.find('\t', a + 1);
    char* end = nullptr;
    const long slot = a == std::string::npos ? -1 : std::strtol(line.c_str(), &end, 10);
    const long long key = b == std::string::npos ? -1 : std::strtoll(line.c_str() + a + 1, nullptr, 10);
    SPARTA_REQUIRE(slot >= 0 && slot < long(vocab.size()) && key >= 0,
                   "%s:%lld: expected '<slot>\\t<key>\\t<value>' with a slot below %zu, found '%s'", path.c_str(),
                   (long long)n, vocab.size(), line.c_str());
    const int64_t want = int64_t(vocab[slot].size());
    SPARTA_REQUIRE(key == want, "%s:%lld: slot %ld: expected key %lld (keys numbered in order), found %lld",
                   path.c_str(), (long long)n, slot, (long long)want, key);
    vocab[slot].emplace(line.substr(b + 1), key);
  }
}

void write_vocabulary(const std::string& path, const std::vector<Vocabulary>& vocab) {
  std::ofstream out(path, std::ios::trunc);
  SPARTA_REQUIRE(out.good(), "--vocabulary-out %s: cannot be opened for writing", path.c_str());
  for (size_t s = 0; s < vocab.size(); ++s) {
    std::vector<const std::string*> by_key(vocab[s].size());
    for (const auto& [value, key] : vocab[s]) by_key[size_t(key)] = &value;
    for (size_t k = 0; k < by_key.size(); ++k) out << s << '\t' << k << '\t' << *by_key[k] << '\n';
  }
  out.flush();
  SPARTA_REQUIRE(out.good(), "--vocabulary-out %s: write failed (disk full?)", path.c_str());
}

}  // namespace

ConvertStats convert_csv(const std::vector<std::string>& inputs, const std::string& out, const CsvOptions& o) {
  SPARTA_REQUIRE(!inputs.empty(), "sparta-convert: no input files");
  SPARTA_REQUIRE(!o.label.empty(), "--label: the label column is required");
  SPARTA_REQUIRE(!o.dense.empty(), "--dense: at least one dense column is required (the model's bottom MLP reads them)");
  SPARTA_REQUIRE(!o.categorical.empty() || !o.multi.empty(),
                 "--categorical, --multi: at least one categorical column is required");
  SPARTA_REQUIRE(o.keys == "hash" || o.keys == "vocabulary", "--keys: expected hash or vocabulary, found '%s'",
                 o.keys.c_str());
  SPARTA_REQUIRE(o.max_index >= 0, "--max-index: expected >= 0 (0: no modulo), found %lld", (long long)o.max_index);
  SPARTA_REQUIRE(o.keys == "hash" || o.max_index == 0, "--max-index: applies to --keys hash only");
  SPARTA_REQUIRE(o.keys == "vocabulary" || (o.vocabulary_in.empty() && o.vocabulary_out.empty()),
                 "--vocabulary-in, --vocabulary-out: apply to --keys vocabulary only");
  SPARTA_REQUIRE(o.block_rows >= 1, "block rows: expected >= 1, found %lld", (long long)o.block_rows);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t D = int64_t(o.dense.size()), C = int64_t(o.categorical.size()), S = C + int64_t(o.multi.size());
  const bool vocabulary = o.keys == "vocabulary";
  std::vector<Vocabulary> vocab(vocabulary ? size_t(S) : 0);
  if (vocabulary && !o.vocabulary_in.empty()) read_vocabulary(o.vocabulary_in, vocab);

  DatasetSchema schema;
  schema.num_dense = D;
  schema.num_slots = S;
  schema.cardinality.assign(size_t(S), vocabulary ? 0 : o.max_index);
  // the most values a line has in a multi slot is known at the end: written then (finish), unchecked until then
  schema.hotness.assign(size_t(S), 1);
  for (int64_t s = C; s < S; ++s) schema.hotness[size_t(s)] = std::numeric_limits<int32_t>::max();
  schema.preprocessing = strprintf(
      "csv (sparta-convert --format csv): label column '%s'; %lld dense columns as written (empty: %g); %lld "
      "categorical and %lld multi-valued ('%c'-separated) slots; keys: %s",
      o.label.c_str(), (long long)D, double(o.missing_dense), (long long)C, (long long)o.multi.size(),
      o.multi_separator,
      vocabulary ? "a vocabulary per slot, numbered in order of first appearance"
                 : (o.max_index > 0 ? strprintf("XXH64(value) >> 1, then %% %lld", (long long)o.max_index)
                                    : std::string("XXH64(value) >> 1 (unbounded)"))
                       .c_str());
  std::vector<int64_t> most(size_t(S), 0);

  double total = 0;
  for (const std::string& in : inputs) {
    struct stat st;
    if (in != "-" && stat(in.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += double(st.st_size);
  }
  ConvertStats stats;
  try {
    DatasetWriter writer(out, schema, o.write);
    SampleBlock block;
    block.reset(D, S);
    ProgressBar bar("sparta-convert " + out, total, "B", o.progress);
    std::vector<std::string> fields, header, values;
    std::string line;
    std::vector<int64_t> row_keys;
    const bool frozen = !o.vocabulary_in.empty();
    auto key_of = [&](int64_t slot, const std::string& value) {
      if (!vocabulary) return hash_key(value, o.max_index);
      Vocabulary& v = vocab[size_t(slot)];
      if (!frozen) return v.emplace(value, int64_t(v.size())).first->second;
      auto it = v.find(value);
      return it != v.end() ? it->second : int64_t(v.size());  // a value the vocabulary lacks
    };
    for (const std::string& in : inputs) {
      const std::string name = in == "-" ? std::string("<stdin>") : in;
      std::ifstream file;
      if (in != "-") {
        file.open(in);
        SPARTA_REQUIRE(file.is_open(), "%s: cannot open for reading (%s)", name.c_str(), std::strerror(errno));
      }
      std::istream& is = in == "-" ? std::cin : file;
      int64_t n = 0;
      Layout layout;
      bool have_layout = false;
      while (std::getline(is, line)) {
        ++n;
        ++stats.lines;
        stats.bytes += int64_t(line.size()) + 1;
        if (line.empty() || line == "\r") continue;
        const std::string where = name + ":" + std::to_string(n);
        std::string err = split_csv_line(line, o.delimiter, fields);
        if (!have_layout) {
          SPARTA_REQUIRE(err.empty(), "%s: %s", where.c_str(), err.c_str());
          if (o.header) {
            if (!header.empty() && fields != header)
              throw Error(where + ": the header differs from the first input's (every input needs the same columns)");
            header = fields;
          }
          layout = make_layout(where, o.header ? fields : std::vector<std::string>(), o);
          if (!o.header) layout.fields = fields.size();
          int top = layout.label;
          for (const auto* cols : {&layout.dense, &layout.categorical, &layout.multi})
            for (int c : *cols) top = std::max(top, c);
          SPARTA_REQUIRE(top < int(layout.fields), "%s: column %d asked for, the line has %zu fields", where.c_str(),
                         top, layout.fields);
          have_layout = true;
          if (o.header) continue;
        }
        if (err.empty() && fields.size() != layout.fields)
          err = strprintf("expected %zu fields (%s), found %zu", layout.fields,
                          o.header ? "the header's" : "the first line's", fields.size());
        float label = 0;
        const size_t dense_at = block.dense.size();
        if (err.empty()) {
          const std::string l = trim(fields[size_t(layout.label)]);
          double v = 0;
          if (l == "true" || l == "True" || l == "TRUE") v = 1;
          else if (l == "false" || l == "False" || l == "FALSE") v = 0;
          else if (!parse_number(l, v) || !(v >= 0 && v <= 1))
            err = "column " + column_name(layout, layout.label) + " (--label): expected a number in [0, 1], found '" +
                  fields[size_t(layout.label)] + "'";
          label = float(v);
        }
        for (size_t d = 0; err.empty() && d < layout.dense.size(); ++d) {
          const std::string& f = fields[size_t(layout.dense[d])];
          double v = o.missing_dense;
          if (!trim(f).empty() && (!parse_number(f, v) || !std::isfinite(v) ||
                                   std::fabs(v) > double(std::numeric_limits<float>::max())))
            err = "column " + column_name(layout, layout.dense[d]) + " (--dense): expected a finite number, found '" +
                  f + "'";
          block.dense.push_back(float(v));
        }
        if (!err.empty()) {
          block.dense.resize(dense_at);
          if (!o.skip_bad) throw Error(where + ": " + err + " (use --skip-bad to skip malformed lines)");
          if (stats.skipped < 5) std::fprintf(stderr, "sparta-convert: skipped %s: %s\n", where.c_str(), err.c_str());
          ++stats.skipped;
          continue;
        }
        block.labels.push_back(label);
        for (int64_t s = 0; s < S; ++s) {
          const int64_t before = int64_t(block.keys.size());
          if (s < C) {
            const std::string& f = fields[size_t(layout.categorical[size_t(s)])];
            if (!f.empty()) block.keys.push_back(key_of(s, f));
          } else {
            const std::string& f = fields[size_t(layout.multi[size_t(s - C)])];
            size_t b = 0;
            while (b <= f.size()) {
              size_t e = f.find(o.multi_separator, b);
              if (e == std::string::npos) e = f.size();
              if (e > b) block.keys.push_back(key_of(s, f.substr(b, e - b)));
              b = e + 1;
            }
          }
          most[size_t(s)] = std::max(most[size_t(s)], int64_t(block.keys.size()) - before);
          block.offsets.push_back(int64_t(block.keys.size()));
        }
        if (block.size() >= o.block_rows) {
          writer.append(block);
          stats.samples += block.size();
          block.reset(D, S);
        }
        if ((n & 4095) == 0) bar.update(double(stats.bytes));
      }
      SPARTA_REQUIRE(!is.bad(), "%s: read error (%s)", name.c_str(), std::strerror(errno));
      SPARTA_REQUIRE(have_layout || !o.header, "%s: empty (expected a header line)", name.c_str());
    }
    if (block.size() > 0) {
      writer.append(block);
      stats.samples += block.size();
    }
    for (int64_t s = 0; s < S; ++s) {
      writer.schema().hotness[size_t(s)] = std::max<int64_t>(1, most[size_t(s)]);
      if (vocabulary) writer.schema().cardinality[size_t(s)] = int64_t(vocab[size_t(s)].size()) + 1;
    }
    writer.finish();
    bar.finish();
    if (vocabulary && !o.vocabulary_out.empty()) write_vocabulary(o.vocabulary_out, vocab);
  } catch (...) {
    std::remove(out.c_str());
    throw;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace sparta
