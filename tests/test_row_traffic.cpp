// experiments/lab/row_traffic.h, the benchmark's traffic floors: the gather against sums written here (key order, the same
// bits on both backends) with a poisoned output; the plain read and write and the atomic add against their
// expectations on fresh random rows (rows outside the table skipped, untouched rows unchanged); a read and write of
// zero leaves every row's bits, keys repeated; bad inputs: an error naming what was wrong, and nothing written.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <string>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "experiments/lab/row_traffic.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

Device open(Backend b) { return open_device(b, b == Backend::cuda ? 0 : -1); }

// Rows of bags of 0..max_hot keys in [-1, capacity + 1]: -1, capacity and capacity + 1 lie outside the table.
struct Bags {
  std::vector<int64_t> offsets{0}, rows;
};
Bags random_bags(int64_t bags, int max_hot, int64_t capacity) {
  Bags b;
  for (int64_t h : testing::random_ints(size_t(bags), 0, max_hot)) {
    for (int64_t r : testing::random_ints(size_t(h), -1, capacity + 1)) b.rows.push_back(r);
    b.offsets.push_back(int64_t(b.rows.size()));
  }
  return b;
}

void gather_sums_in_key_order(Backend backend) {
  Device dev = open(backend);
  const int64_t capacity = 61, bags = 97;
  for (int dim : {1, 3, 4, 16, 20, 32, 128, 256})
    for (int shift : {0, 1}) {  // 16-byte aligned values and output (float4s) or 4 bytes past (floats)
      Bags b = random_bags(bags, 19, capacity);  // up to 19 keys: more than one batch of 8 loads per thread
      std::vector<float> v = testing::random_floats(size_t(capacity) * dim);
      std::vector<float> want(size_t(bags) * dim, 0.f);
      for (int64_t bag = 0; bag < bags; ++bag)
        for (int64_t i = b.offsets[size_t(bag)]; i < b.offsets[size_t(bag) + 1]; ++i) {
          const int64_t r = b.rows[size_t(i)];
          if (r < 0 || r >= capacity) continue;
          for (int d = 0; d < dim; ++d) want[size_t(bag) * dim + d] += v[size_t(r) * dim + d];
        }
      Buffer<float> values(dev, v.size() + 1), out(dev, want.size() + 1);
      copy_to_device(dev, values.data() + shift, v.data(), v.size() * sizeof(float), dev.stream);
      out.fill_bytes(0xFF);  // NaN: a bag left unwritten shows
      Buffer<int64_t> o(dev, b.offsets), r(dev, b.rows);
      row_traffic_gather(dev, o.data(), r.data(), bags, values.data() + shift, capacity, dim, out.data() + shift,
                         dev.stream);
      std::vector<float> got(want.size());
      copy_to_host(dev, got.data(), out.data() + shift, got.size() * sizeof(float), dev.stream);
      BOOST_TEST(testing::same_bits(got, want), "dim " << dim << " shift " << shift << ": "
                                             << testing::count_mismatches(got, want, 0, 0, "gather") << " differ");
    }
  close_device(dev);
}

// Distinct rows (no race): each touched row gets + add once, every other row keeps its bits; both launchers.
void updates_add_to_each_row(Backend backend) {
  Device dev = open(backend);
  const int64_t capacity = 300;
  for (int dim : {1, 3, 4, 16, 32, 128})
    for (int shift : {0, 1})
      for (bool atomic : {false, true}) {
        std::vector<int64_t> rows;
        std::vector<bool> touched(size_t(capacity), false);
        for (int64_t r : testing::random_ints(200, -1, capacity + 1)) {
          if (r >= 0 && r < capacity) {
            if (touched[size_t(r)]) continue;
            touched[size_t(r)] = true;
          }
          rows.push_back(r);  // outside rows may repeat: they are skipped
        }
        std::vector<float> v = testing::random_floats(size_t(capacity) * dim), want = v;
        const float add = testing::random_floats(1, 0.5f, 2.f)[0];
        for (int64_t r = 0; r < capacity; ++r)
          if (touched[size_t(r)])
            for (int d = 0; d < dim; ++d) want[size_t(r) * dim + d] = v[size_t(r) * dim + d] + add;
        Buffer<float> values(dev, v.size() + 1);
        copy_to_device(dev, values.data() + shift, v.data(), v.size() * sizeof(float), dev.stream);
        Buffer<int64_t> r(dev, rows);
        if (atomic)
          row_traffic_atomic(dev, r.data(), int64_t(rows.size()), values.data() + shift, capacity, dim, add,
                             dev.stream);
        else
          row_traffic_read_write(dev, r.data(), int64_t(rows.size()), values.data() + shift, capacity, dim, add,
                                 dev.stream);
        std::vector<float> got(v.size());
        copy_to_host(dev, got.data(), values.data() + shift, got.size() * sizeof(float), dev.stream);
        BOOST_TEST(testing::same_bits(got, want), "dim " << dim << " shift " << shift << (atomic ? " atomic" : " read_write")
                                                << ": " << testing::count_mismatches(got, want, 0, 0, "rows")
                                                << " differ");
      }
  close_device(dev);
}

// Repeated rows: the atomic add applies every key (values and adds on a grid of 1/4 that float sums exactly in any
// order); a read and write of zero leaves every row's bits, as the benchmark runs it.
void repeated_rows(Backend backend) {
  Device dev = open(backend);
  const int64_t capacity = 40;
  for (int dim : {4, 16, 32}) {
    std::vector<int64_t> rows = testing::random_ints(500, 0, capacity - 1);  // about 12 keys a row
    std::vector<float> v(size_t(capacity) * dim);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(testing::random_ints(1, -400, 400)[0]) / 4;
    std::vector<float> want = v;
    for (int64_t r : rows)
      for (int d = 0; d < dim; ++d) want[size_t(r) * dim + d] += 0.25f;
    Buffer<float> values(dev, v);
    Buffer<int64_t> r(dev, rows);
    row_traffic_atomic(dev, r.data(), int64_t(rows.size()), values.data(), capacity, dim, 0.25f, dev.stream);
    BOOST_TEST(testing::same_bits(values.download(), want), "atomic, dim " << dim);
    values.upload(v);
    row_traffic_read_write(dev, r.data(), int64_t(rows.size()), values.data(), capacity, dim, 0.f, dev.stream);
    BOOST_TEST(testing::same_bits(values.download(), v), "read_write of zero, dim " << dim);
  }
  close_device(dev);
}

void errors_write_nothing(Backend backend) {
  Device dev = open(backend);
  std::vector<float> v0 = testing::random_floats(8 * 4);
  Buffer<float> values(dev, v0), out(dev, std::vector<float>(2 * 4, 5.f));
  Buffer<int64_t> rows(dev, std::vector<int64_t>{1, 2, 3}), offs(dev, std::vector<int64_t>{0, 1, 3}),
      bad_offs(dev, std::vector<int64_t>{0, 3, 2});
  auto expect = [&](const std::string& what, const std::string& want, auto&& fn) {
    try {
      fn();
      BOOST_ERROR(what << ": no error");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).find(want) != std::string::npos, what << ": " << e.what());
    }
    BOOST_TEST(values.download() == v0, what << ": values changed");
    BOOST_TEST(out.download() == std::vector<float>(2 * 4, 5.f), what << ": output written");
  };
  for (bool atomic : {false, true}) {
    auto update = [&](const int64_t* r, int64_t n, float* w, int dim) {
      if (atomic) row_traffic_atomic(dev, r, n, w, 8, dim, 1.f, dev.stream);
      else row_traffic_read_write(dev, r, n, w, 8, dim, 1.f, dev.stream);
    };
    expect("dim 0", "dim must be in [1, 256], found 0", [&] { update(rows.data(), 3, values.data(), 0); });
    expect("dim 257", "found 257", [&] { update(rows.data(), 3, values.data(), 257); });
    expect("negative keys", "must be >= 0, found -3", [&] { update(rows.data(), -3, values.data(), 4); });
    expect("no rows", "3 keys (bags) but no rows given", [&] { update(nullptr, 3, values.data(), 4); });
    expect("no values", "no values given", [&] { update(rows.data(), 3, nullptr, 4); });
  }
  expect("gather, no output", "2 bags but no output given", [&] {
    row_traffic_gather(dev, offs.data(), rows.data(), 2, values.data(), 8, 4, nullptr, dev.stream);
  });
  expect("gather, no offsets", "no offsets given", [&] {
    row_traffic_gather(dev, nullptr, rows.data(), 2, values.data(), 8, 4, out.data(), dev.stream);
  });
  expect("gather, capacity", "capacity_rows must be >= 0, found -1", [&] {
    row_traffic_gather(dev, offs.data(), rows.data(), 2, values.data(), -1, 4, out.data(), dev.stream);
  });
  if (backend == Backend::cpu)  // the cuda kernels take the offsets as given (the benchmark's own)
    expect("gather, offsets", "offsets decrease at bag 1: 3 then 2", [&] {
      row_traffic_gather(dev, bad_offs.data(), rows.data(), 2, values.data(), 8, 4, out.data(), dev.stream);
    });
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(row_traffic_gather_sums_in_key_order, gather_sums_in_key_order)
SPARTA_BACKEND_CASES(row_traffic_updates_add_to_each_row, updates_add_to_each_row)
SPARTA_BACKEND_CASES(row_traffic_repeated_rows, repeated_rows)
SPARTA_BACKEND_CASES(row_traffic_errors_write_nothing, errors_write_nothing)
