// io/h5: round trips of attributes and datasets (whole and by rows), errors that name file and field, string
// attributes as h5py writes them, a disk that fills at every point of a file's writing (an Error, never a crash,
// no handle left open), and threads that use HDF5 at once (the layer's lock).
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <string>
#include <thread>

#include "src/base/check.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "tests/testing.h"

using namespace sparta;

BOOST_AUTO_TEST_CASE(attributes_and_datasets_round_trip) {
  std::string path = testing::temp_path("h5", "rt.h5");
  std::vector<float> x = testing::random_floats(1000 * 3);
  std::vector<int64_t> k = testing::random_ints(777, -5, 1LL << 60);
  {
    h5::File f = h5::create_file(path);
    h5::write_attr(f, "/", "format", std::string("sparta-test"));
    h5::write_attr(f, "/", "version", int64_t(3));
    h5::write_attr(f, "/", "auc", 0.75);
    h5::write_attr(f, "/", "card", std::vector<int64_t>{1, 2, 3});
    h5::write_attr(f, "/", "none", std::vector<int64_t>{});
    h5::create_group(f, "/sparse");
    h5::DatasetOptions o;
    o.chunk_rows = 128;
    o.gzip = 1;
    o.fletcher32 = true;
    h5::write_dataset(f, "/dense", x.data(), {1000, 3}, o);
    h5::create_dataset<int64_t>(f, "/sparse/keys", {0}, o, true);
    h5::write_rows(f, "/sparse/keys", k.data(), 0, 500);
    h5::write_rows(f, "/sparse/keys", k.data() + 500, 500, 277);
  }
  h5::File f = h5::open_file(path);
  BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "format"), "sparta-test");
  BOOST_CHECK_EQUAL(h5::read_attr_int(f, "/", "version"), 3);
  BOOST_CHECK_EQUAL(h5::read_attr_double(f, "/", "auc"), 0.75);
  BOOST_CHECK(h5::read_attr_ints(f, "/", "card") == (std::vector<int64_t>{1, 2, 3}));
  BOOST_CHECK(h5::read_attr_ints(f, "/", "none").empty());
  BOOST_CHECK(h5::read_all<float>(f, "/dense") == x);
  BOOST_CHECK(h5::read_all<int64_t>(f, "/sparse/keys") == k);
  std::vector<float> rows;
  h5::read_rows(f, "/dense", 10, 5, rows);
  BOOST_CHECK(std::vector<float>(x.begin() + 30, x.begin() + 45) == rows);
  BOOST_CHECK(h5::shape(f, "/dense") == (std::vector<hsize_t>{1000, 3}));
  BOOST_CHECK(h5::exists(f, "/sparse/keys"));
  BOOST_CHECK(!h5::exists(f, "/sparse/offsets"));
  BOOST_CHECK(!h5::exists(f, "/nothing/here"));
  testing::remove_tree(path);
}

BOOST_AUTO_TEST_CASE(errors_name_file_and_field) {
  std::string path = testing::temp_path("h5", "err.h5");
  {
    h5::File f = h5::create_file(path);
    std::vector<int64_t> v{1, 2};
    h5::write_dataset(f, "/label", v.data(), {2});
  }
  h5::File f = h5::open_file(path);
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { h5::read_attr_int(f, "/", "version"); });
  BOOST_CHECK_MESSAGE(m.find(path) != std::string::npos && m.find("'version'") != std::string::npos, m);
  m = message([&] { h5::expect_type<float>(f, "/label"); });
  BOOST_CHECK_MESSAGE(m.find("expected float32, found int64") != std::string::npos, m);
  m = message([&] { h5::read_all<float>(f, "/dense"); });
  BOOST_CHECK_MESSAGE(m.find("missing dataset '/dense'") != std::string::npos, m);
  m = message([&] { std::vector<int64_t> o; h5::read_rows(f, "/label", 1, 5, o); });
  BOOST_CHECK_MESSAGE(m.find("rows 1..6") != std::string::npos, m);
  m = message([&] { h5::open_file(path + ".missing"); });
  BOOST_CHECK_MESSAGE(m.find(".missing") != std::string::npos, m);
  testing::remove_tree(path);
}

namespace {

// HDF5 objects open anywhere in the process (files, groups, datasets, types, attributes).
ssize_t open_objects() {
  h5::Lock lock;
  return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A random printable string; with non-ASCII letters (UTF-8) when utf8.
std::string random_text(size_t n, bool utf8) {
  static const char* extra[] = {"\xc3\xa9", "\xc3\xbc", "\xce\xbb", "\xe2\x82\xac"};  // é ü λ €
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = testing::rng()();
    if (utf8 && r % 5 == 0)
      s += extra[(r >> 8) % 4];
    else
      s += static_cast<char>('a' + (r >> 8) % 26);
  }
  return s;
}

// Writes a file with h5py (python3 at $SPARTA_PYTHON, else /usr/bin/python3, as the Makefile installs it).
// A missing python3 or h5py fails the test: make test installs both.
void run_h5py(const std::string& script_path, const std::string& script) {
  std::string python = testing::python();
  std::ofstream(script_path) << script;
  auto r = testing::run_command(python + " " + script_path);
  BOOST_REQUIRE_MESSAGE(r.status == 0, "python3 with h5py (" << python << ") could not write the file; make test "
                                       "installs python3-h5py. Output:\n" << r.output);
}

}  // namespace

BOOST_AUTO_TEST_CASE(string_attributes_as_h5py_writes_them) {
  std::string dir = testing::temp_path("h5", "h5py");
  BOOST_REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
  const std::string path = dir + "/strings.h5";
  const std::string vlen_utf8 = random_text(20, true), vlen_ascii = random_text(13, false),
                    fixed_ascii = random_text(9, false), fixed_utf8 = random_text(6, true),
                    long_text = random_text(5000, true);
  const int64_t number = static_cast<int64_t>(testing::rng()() >> 4);
  // Python literals: bytes escaped by \x.. so any byte survives.
  auto py = [](const std::string& v) {
    std::string s = "b'";
    for (unsigned char c : v) s += strprintf("\\x%02x", c);
    return s + "'.decode('utf-8')";
  };
  run_h5py(dir + "/write.py",
           "import h5py, numpy as np\n"
           "with h5py.File('" + path + "', 'w') as f:\n"
           "    f.attrs['vlen_utf8'] = " + py(vlen_utf8) + "\n"   // h5py's default for str: variable-length UTF-8
           "    f.attrs.create('vlen_ascii', " + py(vlen_ascii) + ", dtype=h5py.string_dtype('ascii'))\n"
           "    f.attrs['fixed_ascii'] = np.bytes_(" + py(fixed_ascii) + ".encode())\n"
           "    f.attrs.create('fixed_utf8', " + py(fixed_utf8) + ".encode('utf-8'), "
           "dtype=h5py.string_dtype('utf-8', " + std::to_string(fixed_utf8.size()) + "))\n"
           "    f.attrs['empty'] = ''\n"
           "    f.attrs['long'] = " + py(long_text) + "\n"
           "    f.attrs['number'] = np.int64(" + std::to_string(number) + ")\n"
           "    g = f.create_group('g')\n"
           "    g.attrs['name'] = " + py(vlen_utf8) + "\n"
           "    f.attrs['pair'] = ['a', 'b']\n");
  const ssize_t before = open_objects();
  {
    h5::File f = h5::open_file(path);
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "vlen_utf8"), vlen_utf8);
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "vlen_ascii"), vlen_ascii);
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "fixed_ascii"), fixed_ascii);
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "fixed_utf8"), fixed_utf8);
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "empty"), "");
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "long"), long_text);
    BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/g", "name"), vlen_utf8);
    BOOST_CHECK_EQUAL(h5::read_attr_int(f, "/", "number"), number);
    std::string m = message_of([&] { h5::read_attr_string(f, "/", "pair"); });
    BOOST_CHECK_MESSAGE(m.find(path) != std::string::npos && m.find("expected one string, found 2") != std::string::npos, m);
    m = message_of([&] { h5::read_attr_string(f, "/", "number"); });
    BOOST_CHECK_MESSAGE(m.find("'number': expected a string, found int64") != std::string::npos, m);
    // Many reads of variable-length strings: each one's memory is given back (no handle is left open either).
    for (int i = 0; i < 2000; ++i) h5::read_attr_string(f, "/", "long");
  }
  BOOST_CHECK_EQUAL(open_objects(), before);
  testing::remove_tree(dir);
}

BOOST_AUTO_TEST_CASE(dataset_written_by_h5py_as_the_readme_says_is_accepted) {
  std::string dir = testing::temp_path("h5", "h5py_dataset");
  BOOST_REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
  const std::string path = dir + "/day0.h5";
  const int N = 3 + static_cast<int>(testing::rng()() % 20), D = 2, S = 2;
  const std::string pre = "h5py test " + random_text(8, true);
  // Sample i: label i%2, dense (i, -i), slot 0 has one key i, slot 1 has two keys 100+i and 200+i.
  run_h5py(dir + "/write.py",
           "import h5py, numpy as np\n"
           "N = " + std::to_string(N) + "\n"
           "with h5py.File('" + path + "', 'w') as f:\n"
           "    f.attrs['format'] = 'sparta-dataset'\n"
           "    f.attrs['version'] = 1\n"
           "    f.attrs['num_samples'] = N\n"
           "    f.attrs['num_dense'] = 2\n"
           "    f.attrs['num_slots'] = 2\n"
           "    f.attrs['cardinality'] = np.array([0, 0], dtype=np.int64)\n"
           "    f.attrs['hotness'] = np.array([1, 2], dtype=np.int64)\n"
           "    f.attrs['preprocessing'] = " + [&] {
             std::string s = "b'";
             for (unsigned char c : pre) s += strprintf("\\x%02x", c);
             return s + "'.decode('utf-8')";
           }() + "\n"
           "    f['label'] = np.array([i % 2 for i in range(N)], dtype=np.float32)\n"
           "    f['dense'] = np.array([[i, -i] for i in range(N)], dtype=np.float32)\n"
           "    f['sparse/offsets'] = np.array([0] + [x for i in range(N) for x in (3*i + 1, 3*i + 3)], dtype=np.int64)\n"
           "    f['sparse/keys'] = np.array([k for i in range(N) for k in (i, 100 + i, 200 + i)], dtype=np.int64)\n");
  DatasetSchema s = read_schema(path);
  BOOST_CHECK_EQUAL(s.num_samples, N);
  BOOST_CHECK_EQUAL(s.num_dense, D);
  BOOST_CHECK_EQUAL(s.num_slots, S);
  BOOST_CHECK_EQUAL(s.num_keys, 3 * N);
  BOOST_CHECK_EQUAL(s.preprocessing, pre);
  h5::File f = h5::open_file(path);
  std::vector<int64_t> keys = h5::read_all<int64_t>(f, "/sparse/keys");
  BOOST_REQUIRE_EQUAL(keys.size(), size_t(3 * N));
  for (int i = 0; i < N; ++i) {
    BOOST_CHECK_EQUAL(keys[3 * i], i);
    BOOST_CHECK_EQUAL(keys[3 * i + 2], 200 + i);
  }
  testing::remove_tree(dir);
}

namespace {

// What write_sample writes, for reading back.
struct Sample {
  std::vector<float> x = testing::random_floats(3000 * 4);
  std::vector<int64_t> k = testing::random_ints(2500, -7, 1LL << 50);
  std::string text = random_text(300, true);
};

void write_sample(const std::string& path, const Sample& s) {
  h5::File f = h5::create_file(path);
  h5::write_attr(f, "/", "format", s.text);
  h5::write_attr(f, "/", "ints", std::vector<int64_t>{1, 2, 3});
  h5::create_group(f, "/g");
  h5::write_dataset(f, "/g/x", s.x.data(), {3000, 4});
  h5::DatasetOptions o;
  o.chunk_rows = 500;
  h5::create_dataset<int64_t>(f, "/g/k", {0}, o, true);
  h5::write_rows(f, "/g/k", s.k.data(), 0, 1000);
  h5::write_rows(f, "/g/k", s.k.data() + 1000, 1000, 1500);
  h5::write_attr(f, "/g", "rows", int64_t(2500));
  h5::close(f);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_full_disk_is_an_error_naming_the_file_at_every_point) {
  std::string path = testing::temp_path("h5", "full.h5");
  Sample s;
  // The bytes a whole write takes.
  int64_t total = 0;
  {
    h5::ScopedWriteBudget b(int64_t(1) << 40);
    write_sample(path, s);
    total = (int64_t(1) << 40) - h5::write_budget();
  }
  BOOST_TEST_MESSAGE("a whole write takes " << total << " bytes");
  BOOST_REQUIRE_GT(total, int64_t(3000 * 4 * 4 + 2500 * 8));
  const ssize_t before = open_objects();
  int failures = 0;
  // Every budget in the first and last 600 bytes (headers, metadata written at close), then steps through the data.
  std::vector<int64_t> budgets;
  for (int64_t b = 0; b < total; b += (b < 600 || b > total - 600) ? 1 : 97) budgets.push_back(b);
  for (int64_t b : budgets) {
    std::string m;
    {
      h5::ScopedWriteBudget budget(b);
      m = message_of([&] { write_sample(path, s); });
    }
    ++failures;
    BOOST_CHECK_MESSAGE(m.find(path) != std::string::npos && m.find("No space left on device") != std::string::npos,
                        "budget " << b << " of " << total << ": " << (m.empty() ? "no error" : m));
    BOOST_CHECK_MESSAGE(open_objects() == before, "budget " << b << ": " << open_objects() - before
                                                            << " HDF5 objects left open");
  }
  BOOST_CHECK_EQUAL(failures, static_cast<int>(budgets.size()));
  // With the whole budget it works, and reads back exactly.
  {
    h5::ScopedWriteBudget budget(total);
    write_sample(path, s);
  }
  h5::File f = h5::open_file(path);
  BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "format"), s.text);
  BOOST_CHECK(h5::read_all<float>(f, "/g/x") == s.x);
  BOOST_CHECK(h5::read_all<int64_t>(f, "/g/k") == s.k);
  BOOST_CHECK_EQUAL(h5::read_attr_int(f, "/g", "rows"), 2500);
  testing::remove_tree(path);
}

BOOST_AUTO_TEST_CASE(every_call_waits_for_the_hdf5_lock) {
  // A thread-safe HDF5 (Debian's) would hide a call that skips the lock; a serial one would be corrupted by it.
  // So: while this thread holds the lock, each operation on another thread must not finish.
  std::string dir = testing::temp_path("h5", "lock");
  BOOST_REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
  Sample s;
  write_sample(dir + "/a.h5", s);
  std::vector<std::pair<const char*, std::function<void()>>> ops = {
      {"create and write", [&] { write_sample(dir + "/b.h5", s); }},
      {"open and read an attribute", [&] { h5::read_attr_string(h5::open_file(dir + "/a.h5"), "/", "format"); }},
      {"read rows", [&] { std::vector<float> v; h5::read_rows<float>(h5::open_file(dir + "/a.h5"), "/g/x", 7, 9, v); }},
      {"shape", [&] { h5::shape(h5::open_file(dir + "/a.h5"), "/g/k"); }},
  };
  for (auto& op : ops) {
    std::atomic<bool> finished{false};
    std::string error;
    std::thread t;
    {
      h5::Lock lock;
      t = std::thread([&] {
        error = message_of(op.second);
        finished = true;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      BOOST_CHECK_MESSAGE(!finished, op.first << ": finished while another thread held the HDF5 lock");
    }
    t.join();
    BOOST_CHECK(finished);
    BOOST_CHECK_MESSAGE(error.empty(), op.first << ": " << error);
  }
  testing::remove_tree(dir);
}

BOOST_AUTO_TEST_CASE(threads_using_hdf5_at_once_are_serialized) {
  // Without the layer's lock, a serial (not thread-safe) HDF5 has its state corrupted by two threads (or crashes).
  std::string dir = testing::temp_path("h5", "threads");
  BOOST_REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
  Sample s;
  write_sample(dir + "/shared.h5", s);
  std::vector<std::string> errors(3);
  auto writer = [&](int t) {
    errors[t] = message_of([&] {
      for (int i = 0; i < 40; ++i) {
        std::string p = dir + "/w" + std::to_string(t) + ".h5";
        write_sample(p, s);
        h5::File f = h5::open_file(p);
        if (h5::read_all<int64_t>(f, "/g/k") != s.k) throw Error("thread " + std::to_string(t) + ": keys differ");
      }
    });
  };
  auto reader = [&] {
    errors[2] = message_of([&] {
      h5::File f = h5::open_file(dir + "/shared.h5");
      std::vector<float> rows;
      for (int i = 0; i < 400; ++i) {
        hsize_t r0 = testing::rng()() % 2900;
        h5::read_rows<float>(f, "/g/x", r0, 100, rows);
        if (!std::equal(rows.begin(), rows.end(), s.x.begin() + r0 * 4)) throw Error("reader: rows differ");
        if (h5::read_attr_string(f, "/", "format") != s.text) throw Error("reader: attribute differs");
      }
    });
  };
  std::thread a(writer, 0), b(writer, 1), c(reader);
  a.join();
  b.join();
  c.join();
  for (const std::string& e : errors) BOOST_CHECK_MESSAGE(e.empty(), e);
  testing::remove_tree(dir);
}
