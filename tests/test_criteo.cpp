// io/criteo: line parsing (empty fields, negative integers, CRLF, bad hexadecimal, short and long lines),
// conversion of TSV files written here against values computed independently, streaming in small blocks,
// errors naming file:line and field, --skip-bad, and the sparta-convert program's exit on a bad file.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "io/criteo.h"
#include "io/h5.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct Removed : testing::ScopedPath {
  explicit Removed(const std::string& name) : ScopedPath("criteo", name) {}
};

// A raw line's values, kept to compute the expected preprocessing independently of the parser.
struct RawLine {
  int label;
  std::vector<std::string> ints;  // [13], "" allowed
  std::vector<std::string> cats;  // [26], "" allowed
  std::string text(bool crlf) const {
    std::string s = std::to_string(label);
    for (auto& x : ints) s += "\t" + x;
    for (auto& x : cats) s += "\t" + x;
    return s + (crlf ? "\r\n" : "\n");
  }
};

RawLine random_line() {
  RawLine r;
  r.label = static_cast<int>(testing::random_ints(1, 0, 1)[0]);
  for (int i = 0; i < 13; ++i) {
    int64_t kind = testing::random_ints(1, 0, 9)[0];
    r.ints.push_back(kind == 0 ? "" : std::to_string(testing::random_ints(1, kind == 1 ? -3 : 0, 100000)[0]));
  }
  for (int i = 0; i < 26; ++i) {
    int64_t kind = testing::random_ints(1, 0, 9)[0];
    r.cats.push_back(kind == 0 ? "" : strprintf(kind == 1 ? "%08llX" : "%08llx", (unsigned long long)testing::random_ints(1, 0, 0xffffffffLL)[0]));
  }
  return r;
}

float want_dense(const std::string& s) {
  long long v = s.empty() ? 0 : std::stoll(s);
  return static_cast<float>(std::log(1.0 + static_cast<double>(v < 0 ? 0 : v)));
}

int64_t want_key(const std::string& s, int64_t max_index) {
  int64_t v = s.empty() ? 0 : static_cast<int64_t>(std::stoull(s, nullptr, 16));
  return max_index > 0 ? v % max_index : v;
}

std::string line_of(const std::vector<std::string>& fields) {
  std::string s;
  for (size_t i = 0; i < fields.size(); ++i) s += (i ? "\t" : "") + fields[i];
  return s;
}

std::vector<std::string> good_fields() {
  std::vector<std::string> f = {"1"};
  for (int i = 0; i < 13; ++i) f.push_back(std::to_string(i));
  for (int i = 0; i < 26; ++i) f.push_back(strprintf("%x", 0xabc0 + i));
  return f;
}

std::string parse(const std::string& line, CriteoSample& s, int64_t max_index = 0) {
  return parse_criteo_line(line.data(), line.data() + line.size(), max_index, s);
}

void check_has(const std::string& m, const std::vector<std::string>& needles) {
  for (auto& n : needles) BOOST_CHECK_MESSAGE(m.find(n) != std::string::npos, "'" << n << "' missing in: " << m);
}

}  // namespace

BOOST_AUTO_TEST_CASE(parses_good_lines_with_mlperf_preprocessing) {
  CriteoSample s;
  std::vector<std::string> f = good_fields();
  f[2] = "-2";        // I2 negative -> 0
  f[3] = "";          // I3 empty -> 0
  f[4] = "+7";        // an explicit sign
  f[14] = "";         // C1 empty -> key 0
  f[15] = "68fd1e64";
  f[16] = "FFFFFFFF";
  BOOST_CHECK_EQUAL(parse(line_of(f), s), "");
  BOOST_CHECK_EQUAL(s.label, 1.f);
  BOOST_CHECK_EQUAL(s.dense[0], 0.f);  // "0"
  BOOST_CHECK_EQUAL(s.dense[1], 0.f);
  BOOST_CHECK_EQUAL(s.dense[2], 0.f);
  BOOST_CHECK_CLOSE(s.dense[3], std::log(8.0), 1e-4);
  BOOST_CHECK_CLOSE(s.dense[12], std::log(13.0), 1e-4);
  BOOST_CHECK_EQUAL(s.keys[0], 0);
  BOOST_CHECK_EQUAL(s.keys[1], 0x68fd1e64);
  BOOST_CHECK_EQUAL(s.keys[2], 0xffffffffLL);
  BOOST_CHECK_EQUAL(s.keys[25], 0xabc0 + 25);
  // CRLF and the modulo.
  BOOST_CHECK_EQUAL(parse(line_of(f) + "\r", s, 1000), "");
  BOOST_CHECK_EQUAL(s.keys[1], 0x68fd1e64 % 1000);
  BOOST_CHECK_EQUAL(s.keys[25], (0xabc0 + 25) % 1000);
  // Every field empty but the label.
  std::vector<std::string> empty(40, "");
  empty[0] = "0";
  BOOST_CHECK_EQUAL(parse(line_of(empty), s), "");
  BOOST_CHECK_EQUAL(s.label, 0.f);
  BOOST_CHECK_EQUAL(s.dense[5], 0.f);
  BOOST_CHECK_EQUAL(s.keys[7], 0);
}

BOOST_AUTO_TEST_CASE(rejects_malformed_lines_naming_the_field) {
  CriteoSample s;
  std::vector<std::string> f = good_fields();
  std::vector<std::string> shorter(f.begin(), f.end() - 1), longer = f;
  longer.push_back("12");
  check_has(parse(line_of(shorter), s), {"expected 40 tab-separated fields", "found 39"});
  check_has(parse(line_of(longer), s), {"expected 40 tab-separated fields", "found more"});
  check_has(parse("", s), {"found 1"});
  auto with = [&](int i, const std::string& v) {
    std::vector<std::string> g = f;
    g[i] = v;
    return parse(line_of(g), s);
  };
  check_has(with(0, "2"), {"field label", "expected 0 or 1", "found '2'"});
  check_has(with(0, ""), {"field label"});
  check_has(with(5, "1.5"), {"field I5", "expected an integer", "found '1.5'"});
  check_has(with(5, "-"), {"field I5"});
  check_has(with(13, "12345678901234567890"), {"field I13"});
  check_has(with(14, "zz12"), {"field C1", "column 15", "expected hexadecimal digits", "found 'zz12'"});
  check_has(with(39, "0x12"), {"field C26"});
  check_has(with(20, "12345678901234567"), {"field C7", "at most 16 hexadecimal digits"});
  check_has(with(20, "F234567890123456"), {"field C7", "below 2^63"});
}

BOOST_AUTO_TEST_CASE(converts_files_in_small_blocks) {
  for (int64_t max_index : {int64_t(0), int64_t(40000000), int64_t(7)}) {
    Removed in1("a.tsv"), in2("b.tsv"), out("out.h5");
    std::vector<RawLine> lines;
    const int n1 = static_cast<int>(testing::random_ints(1, 1, 300)[0]), n2 = static_cast<int>(testing::random_ints(1, 1, 200)[0]);
    {
      std::ofstream a(in1.path, std::ios::binary), b(in2.path, std::ios::binary);
      for (int i = 0; i < n1 + n2; ++i) {
        lines.push_back(random_line());
        std::string t = lines.back().text(testing::random_ints(1, 0, 3)[0] == 0);
        if (i == n1 - 1 || i == n1 + n2 - 1) t.erase(t.find_last_not_of("\r\n") + 1);  // no newline at the end
        (i < n1 ? a : b) << t;
      }
    }
    CriteoOptions o;
    o.max_index = max_index;
    o.block_rows = testing::random_ints(1, 1, 50)[0];
    o.write.chunk_rows = 64;
    ConvertStats st = convert_criteo({in1.path, in2.path}, out.path, o);
    BOOST_CHECK_EQUAL(st.lines, n1 + n2);
    BOOST_CHECK_EQUAL(st.samples, n1 + n2);
    BOOST_CHECK_EQUAL(st.skipped, 0);
    DatasetSchema s = read_schema(out.path);
    BOOST_CHECK_EQUAL(s.num_samples, n1 + n2);
    BOOST_CHECK(s.cardinality == std::vector<int64_t>(26, max_index));
    BOOST_CHECK(s.hotness == std::vector<int64_t>(26, 1));
    h5::File f = h5::open_file(out.path);
    auto label = h5::read_all<float>(f, "/label");
    auto dense = h5::read_all<float>(f, "/dense");
    auto offsets = h5::read_all<int64_t>(f, "/sparse/offsets");
    auto keys = h5::read_all<int64_t>(f, "/sparse/keys");
    size_t wrong = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      wrong += label[i] != lines[i].label;
      for (int j = 0; j < 13; ++j) wrong += std::fabs(dense[i * 13 + j] - want_dense(lines[i].ints[j])) > 1e-5f;
      for (int t = 0; t < 26; ++t) {
        wrong += offsets[i * 26 + t] != static_cast<int64_t>(i * 26 + t);
        wrong += keys[i * 26 + t] != want_key(lines[i].cats[t], max_index);
      }
    }
    BOOST_CHECK_EQUAL(wrong, 0u);
  }
}

BOOST_AUTO_TEST_CASE(bad_line_names_file_and_line_or_is_skipped) {
  Removed in("bad.tsv"), out("bad.h5");
  std::vector<std::string> f = good_fields();
  std::vector<std::string> bad = f;
  bad[20] = "nothex";
  std::vector<std::string> shorter(f.begin(), f.begin() + 30);
  {
    std::ofstream o(in.path, std::ios::binary);
    o << line_of(f) << "\r\n" << line_of(f) << "\n" << line_of(bad) << "\n" << line_of(f) << "\n"
      << line_of(shorter) << "\n" << line_of(f) << "\n";
  }
  CriteoOptions o;
  std::string m = "no error";
  try {
    convert_criteo({in.path}, out.path, o);
  } catch (const Error& e) {
    m = e.what();
  }
  check_has(m, {in.path + ":3:", "field C7", "'nothex'"});
  BOOST_CHECK_MESSAGE(access(out.path.c_str(), F_OK) != 0, "the partial output was not removed");
  o.skip_bad = true;
  ConvertStats st = convert_criteo({in.path}, out.path, o);
  BOOST_CHECK_EQUAL(st.lines, 6);
  BOOST_CHECK_EQUAL(st.skipped, 2);
  BOOST_CHECK_EQUAL(st.samples, 4);
  BOOST_CHECK_EQUAL(read_schema(out.path).num_samples, 4);
  // A missing input.
  m = "no error";
  try {
    convert_criteo({in.path + ".missing"}, out.path, CriteoOptions());
  } catch (const Error& e) {
    m = e.what();
  }
  check_has(m, {".missing", "cannot open"});
}

BOOST_AUTO_TEST_CASE(sparta_convert_program_reports_and_exits) {
  Removed in("prog.tsv"), out("prog.h5");
  std::vector<std::string> f = good_fields();
  {
    std::ofstream o(in.path);
    o << line_of(f) << "\n" << line_of(f) << "\n" << line_of(f) << "\tEXTRA\n";
  }
  // A user's bad file is not a crash: the message and exit status 1, with MPI finalized (no MPI_Abort banner),
  // on one rank and on several (rank 0 converts, the others agree on its verdict); run directly too.
  for (int ranks : {1, 2, 0}) {
    testing::CommandResult r =
        testing::run_command(testing::tool_command("../bin/sparta-convert", ranks, "--out " + out.path + " " + in.path));
    BOOST_TEST_MESSAGE(r.output);
    BOOST_CHECK_MESSAGE(r.status == 1, ranks << " rank(s): exit status " << r.status << ", expected 1");
    check_has(r.output, {"sparta-convert: ", in.path + ":3:", "found more"});
    BOOST_CHECK_MESSAGE(r.output.find("MPI_Abort") == std::string::npos && r.output.find("Abort(") == std::string::npos,
                        ranks << " rank(s): the job was aborted:\n" << r.output);
    BOOST_CHECK_MESSAGE(access(out.path.c_str(), F_OK) != 0, "the partial output was not removed");
  }
  // Bad options end the same way.
  testing::CommandResult r = testing::run_command(testing::tool_command("../bin/sparta-convert", 1, "--bogus " + in.path));
  BOOST_CHECK_EQUAL(r.status, 1);
  check_has(r.output, {"bogus"});
  BOOST_CHECK(r.output.find("Abort(") == std::string::npos);
}
