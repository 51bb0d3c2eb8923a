// io/csv (sparta-convert --format csv): random tables written as CSV (quoted fields holding the delimiter and
// quotes, empty fields, multi-valued fields, CRLF lines, columns in any order and some unused) are converted and
// read back; the expected labels, dense values and keys are computed here from the table itself (vocabulary:
// numbered in order of first appearance; hash: XXH64 of the text), not by the converter. Errors name file:line
// and the column; the program converts several files in parallel under mpiexec.
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/checksum.h"
#include "io/csv.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "src/base/check.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// A table: per row a label, 2 dense values (NaN: empty), a city, a device and tags.
struct Row {
  int label;
  std::vector<std::string> dense;  // as written ("" empty)
  std::string city, device;
  std::vector<std::string> tags;
};

std::vector<Row> random_rows(size_t n) {
  const std::vector<std::string> cities = {"Paris", "New York, NY", "say \"hi\"", "", "Zürich", "Lyon"};
  const std::vector<std::string> tags = {"a", "b", "c d", "e", "f"};
  std::vector<Row> rows;
  for (size_t i = 0; i < n; ++i) {
    Row r;
    r.label = int(testing::random_ints(1, 0, 1)[0]);
    for (float v : testing::random_floats(2, -100, 100))
      r.dense.push_back(testing::random_ints(1, 0, 9)[0] == 0 ? std::string() : std::to_string(v));
    r.city = cities[size_t(testing::random_ints(1, 0, int64_t(cities.size()) - 1)[0])];
    r.device = "dev" + std::to_string(testing::random_ints(1, 0, 30)[0]);
    for (int64_t t : testing::random_ints(size_t(testing::random_ints(1, 0, 4)[0]), 0, int64_t(tags.size()) - 1))
      r.tags.push_back(tags[size_t(t)]);
    rows.push_back(r);
  }
  return rows;
}

std::string quoted(const std::string& s) {
  if (s.find_first_of(",\"") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// Columns: id, device, x1, city, label, tags, x0 (id unused), CRLF on odd lines.
void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  f << "id,device,x1,city,label,tags,x0\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::string tags;
    for (size_t t = 0; t < r.tags.size(); ++t) tags += (t ? "|" : "") + r.tags[t];
    f << i << "," << r.device << "," << r.dense[1] << "," << quoted(r.city) << "," << r.label << "," << quoted(tags)
      << "," << r.dense[0] << (i % 2 ? "\r\n" : "\n");
  }
}

CsvOptions options() {
  CsvOptions o;
  o.label = "label";
  o.dense = {"x0", "x1"};
  o.categorical = {"city", "device"};
  o.multi = {"tags"};
  o.missing_dense = -7;
  o.block_rows = 37;  // several blocks
  return o;
}

struct FileData {
  std::vector<float> label, dense;
  std::vector<int64_t> offsets, keys;
  DatasetSchema schema;
};
FileData read_file(const std::string& path) {
  FileData d;
  h5::File f = h5::open_file(path);
  d.schema = read_schema(f);
  d.label = h5::read_all<float>(f, "/label");
  d.dense = h5::read_all<float>(f, "/dense");
  d.offsets = h5::read_all<int64_t>(f, "/sparse/offsets");
  d.keys = h5::read_all<int64_t>(f, "/sparse/keys");
  return d;
}

// What the file must hold, with key(slot, value) for the keys.
template <class KeyFn>
void expect_file(const FileData& d, const std::vector<Row>& rows, float missing, KeyFn key) {
  std::vector<float> label, dense;
  std::vector<int64_t> offsets{0}, keys;
  for (const Row& r : rows) {
    label.push_back(float(r.label));
    for (const std::string& v : r.dense) dense.push_back(v.empty() ? missing : float(std::stod(v)));
    if (!r.city.empty()) keys.push_back(key(0, r.city));
    offsets.push_back(int64_t(keys.size()));
    keys.push_back(key(1, r.device));
    offsets.push_back(int64_t(keys.size()));
    for (const std::string& t : r.tags) keys.push_back(key(2, t));
    offsets.push_back(int64_t(keys.size()));
  }
  BOOST_TEST(d.label == label);
  BOOST_TEST(d.dense == dense);
  BOOST_TEST(d.offsets == offsets);
  BOOST_TEST(d.keys == keys);
  BOOST_TEST(d.schema.num_dense == 2);
  BOOST_TEST(d.schema.num_slots == 3);
  size_t most_tags = 0;
  for (const Row& r : rows) most_tags = std::max(most_tags, r.tags.size());
  BOOST_TEST(d.schema.hotness == std::vector<int64_t>({1, 1, int64_t(std::max<size_t>(1, most_tags))}));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

BOOST_AUTO_TEST_CASE(vocabulary_keys_in_order_of_appearance) {
  testing::ScopedPath dir("csv", "vocab");
  testing::run_command("mkdir -p " + dir.path);
  const std::vector<Row> rows = random_rows(300), eval_rows = random_rows(100);
  write_csv(dir.path + "/train.csv", rows);
  write_csv(dir.path + "/eval.csv", eval_rows);
  CsvOptions o = options();
  o.keys = "vocabulary";
  o.vocabulary_out = dir.path + "/vocab.txt";
  const ConvertStats s = convert_csv({dir.path + "/train.csv"}, dir.path + "/train.h5", o);
  BOOST_TEST(s.samples == 300);
  std::vector<std::map<std::string, int64_t>> vocab(3);
  auto grow = [&](int slot, const std::string& v) { return vocab[slot].emplace(v, vocab[slot].size()).first->second; };
  const FileData train = read_file(dir.path + "/train.h5");
  expect_file(train, rows, -7.f, grow);
  for (int t = 0; t < 3; ++t) BOOST_TEST(train.schema.cardinality[t] == int64_t(vocab[t].size()) + 1);
  // the eval split with the train split's vocabulary: its numbers, values it lacks on the last key
  o.vocabulary_in = o.vocabulary_out;
  o.vocabulary_out.clear();
  convert_csv({dir.path + "/eval.csv"}, dir.path + "/eval.h5", o);
  auto frozen = [&](int slot, const std::string& v) {
    auto it = vocab[slot].find(v);
    return it == vocab[slot].end() ? int64_t(vocab[slot].size()) : it->second;
  };
  const FileData eval = read_file(dir.path + "/eval.h5");
  expect_file(eval, eval_rows, -7.f, frozen);
  BOOST_TEST(eval.schema.cardinality == train.schema.cardinality);
}

BOOST_AUTO_TEST_CASE(hashed_keys_are_the_texts_xxh64) {
  testing::ScopedPath dir("csv", "hash");
  testing::run_command("mkdir -p " + dir.path);
  const std::vector<Row> rows = random_rows(250);
  write_csv(dir.path + "/a.csv", rows);
  for (int64_t max_index : {int64_t(0), int64_t(1000)}) {
    CsvOptions o = options();
    o.max_index = max_index;
    convert_csv({dir.path + "/a.csv"}, dir.path + "/a.h5", o);
    const FileData d = read_file(dir.path + "/a.h5");
    expect_file(d, rows, -7.f, [&](int, const std::string& v) {
      const int64_t k = int64_t(checksum64(v.data(), v.size()) >> 1);
      return max_index > 0 ? k % max_index : k;
    });
    BOOST_TEST(d.schema.cardinality == std::vector<int64_t>(3, max_index));
  }
}

BOOST_AUTO_TEST_CASE(bad_lines_name_file_line_and_column) {
  testing::ScopedPath dir("csv", "bad");
  testing::run_command("mkdir -p " + dir.path);
  const std::string path = dir.path + "/bad.csv", out = dir.path + "/bad.h5";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  const std::string head = "id,device,x1,city,label,tags,x0\n";
  write(head + "1,d,2,c,1,t,3\n2,d,2,c,maybe,t,3\n");
  std::string m = error_of([&] { convert_csv({path}, out, options()); });
  BOOST_TEST(m.find(path + ":3: column 'label' (--label): expected a number in [0, 1], found 'maybe'") !=
             std::string::npos, m);
  write(head + "1,d,2,c,1,t,3\n2,d,2,c,1,t\n");
  m = error_of([&] { convert_csv({path}, out, options()); });
  BOOST_TEST(m.find(path + ":3: expected 7 fields (the header's), found 6") != std::string::npos, m);
  write(head + "1,d,2x,c,1,t,3\n");
  m = error_of([&] { convert_csv({path}, out, options()); });
  BOOST_TEST(m.find(path + ":2: column 'x1' (--dense): expected a finite number, found '2x'") != std::string::npos, m);
  write(head + "1,d,2,\"c,1,t,3\n");
  m = error_of([&] { convert_csv({path}, out, options()); });
  BOOST_TEST(m.find(path + ":2: a quoted field has no closing quote") != std::string::npos, m);
  write("id,device,x1,city,label,tags\n");
  m = error_of([&] { convert_csv({path}, out, options()); });
  BOOST_TEST(m.find(path + ":1: --dense column 'x0' is not in the header (its columns: id, device, x1, city, label, "
                    "tags)") != std::string::npos, m);
  BOOST_TEST(!std::ifstream(out).good());  // no partial output left behind
  // skip_bad: the bad line counted, the rest written
  write(head + "1,d,2,c,1,t,3\n2,d,2,c,7,t,3\n3,d,2,c,0,t,3\n");
  CsvOptions o = options();
  o.skip_bad = true;
  const ConvertStats s = convert_csv({path}, out, o);
  BOOST_TEST(s.samples == 2);
  BOOST_TEST(s.skipped == 1);
}

// sparta-convert --format csv --out-dir under mpiexec: each rank converts its share of the files; every output
// is what one process makes of its file.
BOOST_AUTO_TEST_CASE(program_converts_files_in_parallel) {
  testing::ScopedPath dir("csv", "program");
  testing::run_command("mkdir -p " + dir.path + "/out");
  std::vector<std::vector<Row>> parts;
  std::string inputs;
  for (int i = 0; i < 3; ++i) {
    parts.push_back(random_rows(size_t(50 + 10 * i)));
    write_csv(dir.path + "/part" + std::to_string(i) + ".csv", parts.back());
    inputs += " " + dir.path + "/part" + std::to_string(i) + ".csv";
  }
  const std::string args = "--format csv --label label --dense x0,x1 --categorical city,device --multi tags "
                           "--missing-dense -7 --max-index 5000 --log-level info --out-dir " + dir.path + "/out" + inputs;
  const testing::CommandResult r = testing::run_command(testing::tool_command("../bin/sparta-convert", 2, args));
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_TEST(r.output.find("180 samples from 183 lines") != std::string::npos, r.output);
  for (int i = 0; i < 3; ++i)
    expect_file(read_file(dir.path + "/out/part" + std::to_string(i) + ".h5"), parts[size_t(i)], -7.f,
                [](int, const std::string& v) { return int64_t(checksum64(v.data(), v.size()) >> 1) % 5000; });
  const testing::CommandResult bad =
      testing::run_command(testing::tool_command("../bin/sparta-convert", 2, args + " " + dir.path + "/absent.csv"));
  BOOST_TEST(bad.status == 1, bad.output);
  BOOST_TEST(bad.output.find(dir.path + "/absent.csv: cannot open for reading") != std::string::npos, bad.output);
}
