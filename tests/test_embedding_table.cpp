// EmbeddingTable (src/embedding_table.h): sizes, lookups, full and missing-key errors, optimizer state
// initialisation, and the export/load round trip that checkpoints use, across backends.
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <unordered_map>

#include "buffer.h"
#include "embedding_table.h"
#include "testing.h"

using namespace sparta;

namespace {

EmbeddingTableConfig config(int dim, int64_t cap, OptimizerKind opt) {
  EmbeddingTableConfig c;
  c.name = "ads";
  c.table_id = 5;
  c.dim = dim;
  c.capacity_rows = cap;
  c.max_load_factor = 0.5;
  c.seed = testing::seed();
  c.init_scale = 0.1f;
  c.optimizer.kind = opt;
  c.optimizer.initial_accumulator = 0.125f;
  return c;
}

Device open(Backend b) { return open_device(b, b == Backend::cuda ? 0 : -1); }

// Pooled train forward of one-hot bags over keys; returns out [n, dim].
std::vector<float> train(EmbeddingTable& t, const std::vector<int64_t>& keys) {
  const Device& dev = t.device();
  std::vector<int64_t> offsets(keys.size() + 1);
  for (size_t i = 0; i <= keys.size(); ++i) offsets[i] = int64_t(i);
  Buffer<int64_t> o(dev, offsets), k(dev, keys), rows(dev, keys.size());
  Buffer<float> out(dev, keys.size() * t.dim());
  out.fill_bytes(0xFF);
  t.pooled_forward(o.data(), k.data(), int64_t(keys.size()), Combiner::sum, LookupMode::train, out.data(),
                   OutputType::f32, rows.data());
  return out.download();
}

}  // namespace

BOOST_AUTO_TEST_CASE(memory_bytes_counts_slots_values_and_state) {
  BOOST_CHECK_EQUAL(EmbeddingTable::memory_bytes(1000, 16, OptimizerKind::sgd, 0.5), 2048 * 16 + 64 + 1000 * 16 * 4);
  BOOST_CHECK_EQUAL(EmbeddingTable::memory_bytes(1000, 16, OptimizerKind::lazy_adam, 0.5),
                    2048 * 16 + 64 + 1000 * (16 + 33) * 4);
  BOOST_CHECK_THROW(EmbeddingTable(Device(), config(0, 10, OptimizerKind::sgd)), Error);
  BOOST_CHECK_THROW(EmbeddingTable(Device(), config(257, 10, OptimizerKind::sgd)), Error);
  BOOST_CHECK_THROW(EmbeddingTable(Device(), config(4, 0, OptimizerKind::sgd)), Error);
}

// Export from each backend, load into a fresh table on every backend: the same keys, values and state,
// and eval lookups through the loaded table give what the original gives.
BOOST_AUTO_TEST_CASE(export_load_round_trip_across_backends) {
  const int dim = 12;
  std::vector<int64_t> keys = testing::random_ints(600, -5, 400);  // duplicates, the marker key -1
  for (Backend src : testing::available_backends()) {
    Device sdev = open(src);
    {
      EmbeddingTable a(sdev, config(dim, 1000, OptimizerKind::adagrad));
      std::vector<float> out_a = train(a, keys);
      TableRows rows = a.export_rows();
      BOOST_CHECK_EQUAL(rows.size(), a.size());
      BOOST_CHECK_EQUAL(rows.state.size(), size_t(rows.size()) * dim);
      size_t bad = 0;
      for (size_t r = 0; r < size_t(rows.size()); ++r) {
        for (int e = 0; e < dim; ++e) {
          bad += rows.values[r * dim + e] != initial_value(a.key_init(), uint64_t(rows.keys[r]), e);
          bad += rows.state[r * dim + e] != 0.125f;  // adagrad's initial accumulator
        }
      }
      BOOST_CHECK_EQUAL(bad, 0u);
      // Changed values survive the trip: scale them, reload them.
      for (auto& v : rows.values) v *= 3.f;
      for (size_t i = 0; i < rows.state.size(); ++i) rows.state[i] = float(i);
      for (Backend dst : testing::available_backends()) {
        Device ddev = open(dst);
        {
          EmbeddingTable b(ddev, config(dim, 1000, OptimizerKind::adagrad));
          b.load_rows(rows);
          TableRows back = b.export_rows();
          BOOST_CHECK(back.keys == rows.keys);
          BOOST_CHECK(back.values == rows.values);
          BOOST_CHECK(back.state == rows.state);
          BOOST_CHECK_THROW(b.load_rows(rows), Error);  // keys present
          BOOST_CHECK_EQUAL(b.size(), rows.size());
          // eval lookup: values of each key are 3x the original's output
          Buffer<int64_t> k(ddev, keys), r(ddev, keys.size());
          Buffer<float> out(ddev, keys.size() * dim);
          out.fill_bytes(0xFF);
          b.unpooled_forward(k.data(), int64_t(keys.size()), LookupMode::eval, out.data(), OutputType::f32, r.data(),
                             MissingKey::error);
          std::vector<float> want(out_a);
          for (auto& v : want) v *= 3.f;
          BOOST_CHECK_EQUAL(testing::count_mismatches(out.download(), want, 0, 0, "loaded lookup"), 0u);
          TableRows bad_rows = rows;
          bad_rows.values.pop_back();
          EmbeddingTable c(ddev, config(dim, 1000, OptimizerKind::adagrad));
          BOOST_CHECK_THROW(c.load_rows(bad_rows), Error);
          BOOST_CHECK_EQUAL(c.size(), 0);
        }
        close_device(ddev);
      }
    }
    close_device(sdev);
  }
}

BOOST_AUTO_TEST_CASE(full_and_missing_are_errors_naming_the_table) {
  for (Backend b : testing::available_backends()) {
    Device dev = open(b);
    {
      EmbeddingTable t(dev, config(4, 20, OptimizerKind::sgd));
      BOOST_CHECK(t.state() == nullptr);
      train(t, testing::random_ints(15, 0, 14));
      try {
        train(t, testing::random_ints(40, 100, 139));
        BOOST_ERROR("no full error");
      } catch (const Error& e) {
        std::string m = e.what();
        BOOST_CHECK(m.find("'ads'") != std::string::npos && m.find("capacity 20 rows") != std::string::npos);
      }
      Buffer<int64_t> k(dev, std::vector<int64_t>{1000, 1001}), r(dev, 2);
      Buffer<float> out(dev, 8);
      t.unpooled_forward(k.data(), 2, LookupMode::eval, out.data(), OutputType::f32, r.data());  // zeros: fine
      BOOST_CHECK_EQUAL(testing::count_mismatches(out.download(), std::vector<float>(8, 0.f), 0, 0, "zeros"), 0u);
      BOOST_CHECK_THROW(
          t.unpooled_forward(k.data(), 2, LookupMode::eval, out.data(), OutputType::f32, r.data(), MissingKey::error),
          Error);
      t.clear();
      BOOST_CHECK_EQUAL(t.size(), 0);
      train(t, testing::random_ints(15, 0, 14));
    }
    close_device(dev);
  }
}
