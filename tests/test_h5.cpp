// io/h5: round trips of attributes and datasets (whole and by rows), and errors that name file and field.
#include <boost/test/unit_test.hpp>
#include <string>

#include "src/base/check.h"
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
