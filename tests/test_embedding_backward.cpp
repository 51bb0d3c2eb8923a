// kernels/embedding_backward: the cpu reference against a naive double-precision sum, bad input, and the
// cuda version against the cpu reference (same bits: the same fixed order), its determinism and the fused
// optimizer path, the backward in two parts (prepare, then finish) against the whole one, and a row's gradient
// bits independent of the row ids, on fresh random batches: empty bags, duplicates in a bag and across the
// batch, power-law rows with hot rows spread over many items, rows outside the table.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "kernels/embedding_backward.h"
#include "kernels/sparse_optimizer.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct HostBatch {
  int64_t bags = 0;
  std::vector<int64_t> offsets;  // [bags + 1]
  std::vector<int64_t> rows;     // [nnz]
  std::vector<float> grad;       // [bags, dim]
  int64_t nnz() const { return int64_t(rows.size()); }
};

struct Shape {
  int64_t batch = 1;
  int slots = 1;
  int min_hot = 1, max_hot = 1;  // keys per bag, uniform in [min_hot, max_hot]
  int dim = 16;
  int64_t capacity = 1000;
  bool power_law = false;  // log-uniform ranks: row 0 takes ~1/ln(capacity) of the keys
  double dup = 0.0;        // chance that a key repeats the previous row of its bag
  double bad = 0.0;        // chance that a key's row is outside [0, capacity)
};

HostBatch make_batch(const Shape& s) {
  auto& g = testing::rng();
  std::uniform_int_distribution<int> hot(s.min_hot, s.max_hot);
  std::uniform_int_distribution<int64_t> uniform_row(0, s.capacity - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  HostBatch b;
  b.bags = s.batch * s.slots;
  b.offsets.push_back(0);
  for (int64_t bag = 0; bag < b.bags; ++bag) {
    const int n = hot(g);
    for (int k = 0; k < n; ++k) {
      int64_t row;
      if (k > 0 && unit(g) < s.dup) {
        row = b.rows.back();
      } else if (unit(g) < s.bad) {
        row = unit(g) < 0.5 ? -1 - int64_t(unit(g) * 10) : s.capacity + int64_t(unit(g) * 10);
      } else if (s.power_law) {
        const int64_t rank = std::min<int64_t>(s.capacity - 1, int64_t(std::exp(unit(g) * std::log(double(s.capacity) + 1))) - 1);
        row = (rank * 2654435761LL) % s.capacity;  // hot rows spread over the table
      } else {
        row = uniform_row(g);
      }
      b.rows.push_back(row);
    }
    b.offsets.push_back(int64_t(b.rows.size()));
  }
  b.grad = testing::random_floats(size_t(b.bags) * s.dim);
  return b;
}

struct Result {
  int64_t num_unique = 0, dropped = 0;
  std::vector<int64_t> unique_rows;  // [num_unique]
  std::vector<float> row_grads;      // [num_unique, dim]
};

// The device copies of a batch.
struct DeviceBatch {
  Buffer<int64_t> offsets, rows;
  Buffer<float> grad;
  BackwardBatch view;
  DeviceBatch(const Device& dev, const HostBatch& b, Combiner combiner)
      : offsets(dev, b.offsets), rows(dev, b.rows.size()), grad(dev, b.grad) {
    if (!b.rows.empty()) rows.upload(b.rows);
    view.offsets = offsets.data();
    view.rows = rows.data();
    view.grad = grad.data();
    view.bags = b.bags;
    view.nnz = b.nnz();
    view.combiner = combiner;
  }
};

Result run_backward(const Device& dev, const HostBatch& b, const Shape& s, Combiner combiner,
                    int64_t max_nnz = -1) {
  if (max_nnz < 0) max_nnz = std::max<int64_t>(b.nnz(), 1);
  BackwardWorkspace ws(dev, max_nnz, s.capacity, s.dim, dev.stream);
  DeviceBatch d(dev, b, combiner);
  Buffer<int64_t> unique_rows(dev, size_t(max_nnz));
  Buffer<float> row_grads(dev, size_t(max_nnz) * s.dim);
  Buffer<int32_t> num_unique(dev, 1);
  // every row's key: a function of the row (any key of a row names it), arbitrary for rows outside the table
  auto key_of = [](int64_t row) { return int64_t(uint64_t(row) * 0x9E3779B97F4A7C15ull ^ 0x5bd1e995ull); };
  std::vector<int64_t> keys(b.rows.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = key_of(b.rows[i]);
  Buffer<int64_t> dkeys(dev, std::max<size_t>(1, keys.size())), unique_keys(dev, size_t(max_nnz));
  if (!keys.empty()) dkeys.upload(keys);
  unique_rows.fill_bytes(0xFF);  // poison: -1 and NaN where nothing is written
  row_grads.fill_bytes(0xFF);
  num_unique.fill_bytes(0xFF);
  unique_keys.fill_bytes(0xFF);
  embedding_backward(dev, d.view, ws, unique_rows.data(), row_grads.data(), num_unique.data(), dkeys.data(),
                     unique_keys.data(), dev.stream);
  Result r;
  r.num_unique = read_count(dev, num_unique.data(), dev.stream);
  r.dropped = ws.read_dropped_keys(dev.stream);
  BOOST_REQUIRE(r.num_unique >= 0 && r.num_unique <= max_nnz);
  r.unique_rows = unique_rows.download();
  r.unique_rows.resize(size_t(r.num_unique));
  const std::vector<int64_t> uk = unique_keys.download();
  size_t wrong_keys = 0;
  for (int64_t u = 0; u < r.num_unique; ++u) wrong_keys += uk[size_t(u)] != key_of(r.unique_rows[size_t(u)]);
  BOOST_CHECK_EQUAL(wrong_keys, 0u);
  r.row_grads = row_grads.download();
  r.row_grads.resize(size_t(r.num_unique) * s.dim);
  return r;
}

// Naive double-precision sums per row, with the bound on a float sum's rounding error: n * eps * sum |terms|.
struct NaiveRow {
  std::vector<double> sum, abs_sum;
  int64_t terms = 0;
};
std::map<int64_t, NaiveRow> naive_backward(const HostBatch& b, const Shape& s, Combiner combiner,
                                           int64_t* dropped) {
  std::map<int64_t, NaiveRow> rows;
  *dropped = 0;
  for (int64_t bag = 0; bag < b.bags; ++bag) {
    const int64_t n = b.offsets[bag + 1] - b.offsets[bag];
    for (int64_t k = b.offsets[bag]; k < b.offsets[bag + 1]; ++k) {
      const int64_t row = b.rows[k];
      if (row < 0 || row >= s.capacity) {
        ++*dropped;
        continue;
      }
      NaiveRow& r = rows[row];
      if (r.sum.empty()) r.sum.assign(s.dim, 0.0), r.abs_sum.assign(s.dim, 0.0);
      for (int e = 0; e < s.dim; ++e) {
        double x = double(b.grad[bag * s.dim + e]) / (combiner == Combiner::mean ? double(n) : 1.0);
        r.sum[e] += x;
        r.abs_sum[e] += std::fabs(x);
      }
      ++r.terms;
    }
  }
  return rows;
}

void check_against_naive(const HostBatch& b, const Shape& s, Combiner combiner, const Result& got) {
  int64_t dropped = 0;
  std::map<int64_t, NaiveRow> want = naive_backward(b, s, combiner, &dropped);
  BOOST_CHECK_EQUAL(got.dropped, dropped);
  BOOST_REQUIRE_EQUAL(got.num_unique, int64_t(want.size()));
  size_t u = 0, bad = 0;
  for (const auto& [row, r] : want) {
    BOOST_CHECK_EQUAL(got.unique_rows[u], row);
    for (int e = 0; e < s.dim; ++e) {
      const double g = got.row_grads[u * s.dim + e];
      const double bound = 1e-6 + double(r.terms + 2) * 1.2e-7 * r.abs_sum[e];
      if (!(std::fabs(g - r.sum[e]) <= bound)) {
        if (bad < 5)
          BOOST_TEST_MESSAGE("row " << row << " [" << e << "] = " << g << ", expected " << r.sum[e] << " +- " << bound);
        ++bad;
      }
    }
    ++u;
  }
  BOOST_CHECK_EQUAL(bad, 0u);
}

size_t bitwise_differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

const char* name(Combiner c) { return combiner_name(c); }

Device cpu() { return open_device(Backend::cpu, -1); }

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// cpu reference

BOOST_AUTO_TEST_CASE(cpu_backward_matches_naive_double_sum) {
  Device dev = cpu();
  for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
    for (int dim : {1, 3, 16}) {
      for (const Shape& base : {Shape{1, 1, 1, 1}, Shape{1, 26, 0, 4}, Shape{64, 26, 0, 3}, Shape{200, 1, 1, 1}}) {
        Shape s = base;
        s.dim = dim;
        s.capacity = 300;  // duplicates across the batch
        s.dup = 0.2;
        BOOST_TEST_CONTEXT(name(combiner) << " dim " << dim << " batch " << s.batch << " slots " << s.slots
                                          << " hotness " << s.min_hot << ".." << s.max_hot) {
          HostBatch b = make_batch(s);
          check_against_naive(b, s, combiner, run_backward(dev, b, s, combiner));
        }
      }
    }
  }
}

// Rows over many items: the hottest row covers more than kCombineGroups items, so its partials are summed
// in ranges of several.
BOOST_AUTO_TEST_CASE(cpu_backward_hot_rows_match_naive_double_sum) {
  Device dev = cpu();
  Shape s{5000, 26, 1, 1};
  s.dim = 3;
  s.capacity = 1000000;
  s.power_law = true;
  HostBatch b = make_batch(s);
  for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
    BOOST_TEST_CONTEXT(name(combiner)) {
      Result r = run_backward(dev, b, s, combiner);
      check_against_naive(b, s, combiner, r);
    }
  }
  std::map<int64_t, int64_t> count;
  for (int64_t row : b.rows) ++count[row];
  int64_t hottest = 0;
  for (const auto& kv : count) hottest = std::max(hottest, kv.second);
  BOOST_TEST_MESSAGE("hottest row: " << hottest << " of " << b.nnz() << " keys");
  BOOST_CHECK_GT(hottest, int64_t(kCombineGroups) * kBackwardChunk);
}

BOOST_AUTO_TEST_CASE(cpu_backward_drops_rows_outside_the_table) {
  Device dev = cpu();
  Shape s{100, 26, 0, 3};
  s.dim = 4;
  s.capacity = 500;
  s.bad = 0.1;
  HostBatch b = make_batch(s);
  Result r = run_backward(dev, b, s, Combiner::sum);
  BOOST_CHECK_GT(r.dropped, 0);
  check_against_naive(b, s, Combiner::sum, r);
}

BOOST_AUTO_TEST_CASE(cpu_backward_rejects_bad_input) {
  Device dev = cpu();
  Shape s{4, 2, 1, 2};
  s.dim = 2;
  HostBatch b = make_batch(s);
  auto run = [&](const HostBatch& x, int64_t max_nnz) { run_backward(dev, x, s, Combiner::sum, max_nnz); };
  BOOST_CHECK_THROW(run(b, b.nnz() - 1), Error);  // more keys than the workspace holds
  HostBatch decreasing = b;
  std::swap(decreasing.offsets[2], decreasing.offsets[5]);
  if (decreasing.offsets[2] != decreasing.offsets[5]) BOOST_CHECK_THROW(run(decreasing, -1), Error);
  HostBatch short_offsets = b;
  short_offsets.offsets.back() -= 1;
  BOOST_CHECK_THROW(run(short_offsets, -1), Error);
  BOOST_CHECK_THROW(BackwardWorkspace(dev, 10, 0, 4, dev.stream), Error);
  BOOST_CHECK_THROW(BackwardWorkspace(dev, 10, 100, 0, dev.stream), Error);
  BOOST_CHECK_THROW(BackwardWorkspace(dev, 10, 100, 257, dev.stream), Error);
  BOOST_CHECK_THROW(BackwardWorkspace(dev, 10, int64_t(1) << 33, 4, dev.stream), Error);
  BOOST_CHECK_THROW(BackwardWorkspace(dev, -1, 100, 4, dev.stream), Error);
}

BOOST_AUTO_TEST_CASE(cpu_backward_of_an_empty_batch_has_no_rows) {
  Device dev = cpu();
  Shape s{8, 3, 0, 0};
  HostBatch b = make_batch(s);
  BOOST_REQUIRE_EQUAL(b.nnz(), 0);
  Result r = run_backward(dev, b, s, Combiner::mean);
  BOOST_CHECK_EQUAL(r.num_unique, 0);
  BOOST_CHECK_EQUAL(r.dropped, 0);
}

// The arrays each backend's workspace documents (embedding_backward.h, Layout), with their sizes computed here
// from max_nnz and dim: each lies inside the allocation and no two overlap. A batch of more keys than the
// workspace holds is refused.
void workspace_covers_the_arrays(Backend backend) {
  const bool cuda = backend == Backend::cuda;
  for (int64_t n : {int64_t(1), int64_t(127), int64_t(1000), int64_t(100000)}) {
    for (int dim : {1, 16, 129}) {
      BOOST_TEST_CONTEXT("max_nnz " << n << " dim " << dim) {
        const int64_t capacity = 5000;
        const size_t blocks = size_t((n + 127) / 128);  // ceil(n / 128)
        const BackwardWorkspace::Layout l = BackwardWorkspace::layout(backend, n, capacity, dim);
        struct Array {
          const char* name;
          size_t offset, bytes;
        };
        std::vector<Array> arrays{{"scan", l.scan, size_t(n) * 8},
                                  {"partials", l.partials, 2 * blocks * size_t(dim) * 4},
                                  {"counts", l.counts, 4 * 4},
                                  {"temp", l.temp, l.temp_bytes}};
        if (cuda) {
          for (auto [name, offset] : {std::pair<const char*, size_t>{"keys_a", l.keys_a}, {"keys_b", l.keys_b},
                                      {"bags_a", l.bags_a}, {"bags_b", l.bags_b}, {"item_u", l.item_u}})
            arrays.push_back({name, offset, size_t(n) * 4});
          arrays.push_back({"item_start", l.item_start, size_t(n + 1) * 4});
          arrays.push_back({"row_item_start", l.row_item_start, size_t(n + 1) * 4});
          arrays.push_back({"multi_rows", l.multi_rows, blocks * 4});  // rows of more than 128 positions
          BOOST_CHECK_GT(l.temp_bytes, 0u);  // CUB's storage
        } else {
          BOOST_CHECK_GE(l.temp_bytes, size_t(17) * dim * 4);  // 16 range sums and the row's sum
        }
        size_t need = 0;
        for (const Array& a : arrays) need += a.bytes;
        BOOST_CHECK_GE(l.total, need);
        BOOST_CHECK_EQUAL(BackwardWorkspace::bytes(backend, n, capacity, dim), l.total);
        for (size_t i = 0; i < arrays.size(); ++i) {
          BOOST_CHECK_MESSAGE(arrays[i].offset + arrays[i].bytes <= l.total, arrays[i].name << " ends past the total");
          BOOST_CHECK_MESSAGE(arrays[i].offset % 16 == 0, arrays[i].name << " is not 16-byte aligned");
          for (size_t j = 0; j < i; ++j) {
            const Array &a = arrays[i], &b = arrays[j];
            const bool overlap = a.bytes && b.bytes && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            BOOST_CHECK_MESSAGE(!overlap, a.name << " overlaps " << b.name);
          }
        }
      }
    }
  }
  // Too small for the batch: refused before anything runs.
  Device dev = open_device(backend, cuda ? 0 : -1);
  {
    Shape s{4, 2, 2, 2};
    s.dim = 3;
    HostBatch b = make_batch(s);
    BOOST_REQUIRE_EQUAL(b.nnz(), 16);
    BackwardWorkspace ws(dev, b.nnz() - 1, s.capacity, s.dim, dev.stream);
    DeviceBatch d(dev, b, Combiner::sum);
    Buffer<int64_t> unique_rows(dev, 16);
    Buffer<float> row_grads(dev, 16 * 3), values(dev, size_t(s.capacity) * 3);
    Buffer<int32_t> num_unique(dev, 1);
    BOOST_CHECK_THROW(
        embedding_backward(dev, d.view, ws, unique_rows.data(), row_grads.data(), num_unique.data(), dev.stream),
        Error);
    BOOST_CHECK_THROW(backward_and_update(dev, d.view, ws, OptimizerConfig(), 1, values.data(), nullptr, dev.stream),
                      Error);
    synchronize(dev);
  }
  close_device(dev);
}

SPARTA_BACKEND_CASES(workspace_bytes_cover_the_arrays, workspace_covers_the_arrays)

// The fused cpu path gives the same bits as the backward followed by the optimizer.
BOOST_AUTO_TEST_CASE(cpu_backward_and_update_equals_the_two_steps) {
  Device dev = cpu();
  Shape s{50, 26, 0, 3};
  s.dim = 5;
  s.capacity = 400;
  s.dup = 0.1;
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::nesterov,
                             OptimizerKind::adagrad, OptimizerKind::adam, OptimizerKind::lazy_adam,
                             OptimizerKind::rowwise_adagrad}) {
    BOOST_TEST_CONTEXT(optimizer_name(kind)) {
      OptimizerConfig cfg;
      cfg.kind = kind;
      cfg.weight_decay = 0.1f;  // both paths decay the rows they update
      const int width = optimizer_state_width(kind, s.dim);
      std::vector<float> values0 = testing::random_floats(s.capacity * s.dim);
      std::vector<float> state0(size_t(s.capacity) * width, kind == OptimizerKind::adagrad || kind == OptimizerKind::rowwise_adagrad ? 0.1f : 0.0f);
      Buffer<float> v_fused(dev, values0), s_fused(dev, state0), v_two(dev, values0), s_two(dev, state0);
      HostBatch b = make_batch(s);
      DeviceBatch d(dev, b, Combiner::mean);
      BackwardWorkspace ws(dev, b.nnz(), s.capacity, s.dim, dev.stream);
      Buffer<int64_t> unique_rows(dev, b.nnz());
      Buffer<float> row_grads(dev, b.nnz() * s.dim);
      Buffer<int32_t> num_unique(dev, 1);
      for (int64_t step = 1; step <= 3; ++step) {
        backward_and_update(dev, d.view, ws, cfg, step, v_fused.data(), s_fused.data(), dev.stream);
        embedding_backward(dev, d.view, ws, unique_rows.data(), row_grads.data(), num_unique.data(), dev.stream);
        sparse_optimizer_update(dev, cfg, step, unique_rows.data(), row_grads.data(), num_unique.data(), b.nnz(),
                                v_two.data(), s_two.data(), s.capacity, s.dim, dev.stream);
        BOOST_CHECK_EQUAL(read_count(dev, ws.num_unique(), dev.stream), read_count(dev, num_unique.data(), dev.stream));
      }
      BOOST_CHECK_EQUAL(bitwise_differences(v_fused.download(), v_two.download()), 0u);
      BOOST_CHECK_EQUAL(bitwise_differences(s_fused.download(), s_two.download()), 0u);
      BOOST_CHECK_GT(bitwise_differences(v_fused.download(), values0), 0u);  // it did update
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// cuda against the cpu reference

namespace {

// Runs both backends on one batch; the cuda result must have the cpu's bits.
void compare_backends(const Shape& s, Combiner combiner) {
  Device gpu = open_device(Backend::cuda, 0);
  Device host = cpu();
  HostBatch b = make_batch(s);
  BOOST_TEST_CONTEXT(name(combiner) << " batch " << s.batch << " slots " << s.slots << " hotness " << s.min_hot
                                    << ".." << s.max_hot << " dim " << s.dim << " rows " << s.capacity
                                    << (s.power_law ? " power-law" : " uniform") << " nnz " << b.nnz()) {
    Result want = run_backward(host, b, s, combiner);
    Result got = run_backward(gpu, b, s, combiner);
    BOOST_CHECK_EQUAL(got.num_unique, want.num_unique);
    BOOST_CHECK_EQUAL(got.dropped, want.dropped);
    BOOST_CHECK(got.unique_rows == want.unique_rows);
    // the same fixed order and IEEE operations: the same bits
    BOOST_CHECK_EQUAL(testing::count_mismatches(got.row_grads, want.row_grads, 0, 0, "row_grads"), 0u);
    BOOST_CHECK_EQUAL(bitwise_differences(got.row_grads, want.row_grads), 0u);
  }
  close_device(gpu);
}

}  // namespace

BOOST_AUTO_TEST_CASE(cuda_backward_matches_cpu_small_shapes, *testing::needs_gpu()) {
  for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
    for (int dim : {1, 3, 16, 128, 256}) {
      for (const Shape& base : {Shape{1, 1, 1, 1}, Shape{1, 26, 0, 5}, Shape{512, 26, 0, 4}, Shape{3000, 1, 1, 1}}) {
        Shape s = base;
        s.dim = dim;
        s.capacity = 5000;
        s.dup = 0.2;
        compare_backends(s, combiner);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(cuda_backward_matches_cpu_large_and_power_law, *testing::needs_gpu()) {
  for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
    Shape one_hot{65536, 26, 1, 1};  // the benchmark's shape, narrow rows
    one_hot.dim = 16;
    one_hot.capacity = 40000000;
    compare_backends(one_hot, combiner);
    for (int dim : {3, 128}) {
      Shape hot{8192, 26, 0, 3};  // hot rows over many items
      hot.dim = dim;
      hot.capacity = 4000000;
      hot.power_law = true;
      hot.dup = 0.05;
      compare_backends(hot, combiner);
    }
    Shape wide{4096, 26, 1, 2};
    wide.dim = 256;
    wide.capacity = 1000000;
    wide.power_law = true;
    wide.bad = 0.01;  // dropped keys
    compare_backends(wide, combiner);
  }
}

BOOST_AUTO_TEST_CASE(cuda_backward_is_deterministic, *testing::needs_gpu()) {
  Device gpu = open_device(Backend::cuda, 0);
  for (int dim : {3, 128}) {
    Shape s{8192, 26, 0, 4};
    s.dim = dim;
    s.capacity = 2000000;
    s.power_law = true;
    s.dup = 0.1;
    HostBatch b = make_batch(s);
    Result first = run_backward(gpu, b, s, Combiner::mean);
    Result second = run_backward(gpu, b, s, Combiner::mean);
    BOOST_CHECK_EQUAL(first.num_unique, second.num_unique);
    BOOST_CHECK(first.unique_rows == second.unique_rows);
    BOOST_CHECK_EQUAL(bitwise_differences(first.row_grads, second.row_grads), 0u);
  }
  close_device(gpu);
}

BOOST_AUTO_TEST_CASE(cuda_backward_of_an_empty_batch_has_no_rows, *testing::needs_gpu()) {
  Device gpu = open_device(Backend::cuda, 0);
  Shape s{8, 3, 0, 0};
  HostBatch b = make_batch(s);
  Result r = run_backward(gpu, b, s, Combiner::sum, 16);
  BOOST_CHECK_EQUAL(r.num_unique, 0);
  BOOST_CHECK_EQUAL(r.dropped, 0);
  close_device(gpu);
}

// ---------------------------------------------------------------------------------------------------------
// row ids: a row's gradient bits are a function of its own contributions in key order, not of its row id nor of
// the other rows' ids (which depend on the order keys were inserted: a table loaded from a checkpoint inserts
// in key order, concurrent GPU inserts in no fixed order)

namespace {

// Keys seen exactly so often: one item full or one position over, 16 and 17 items (ranges of one and of two).
const std::vector<int64_t> kEdgeCounts{127, 128, 129, 256, 257, 2048, 2049};

// A batch over keys 0..keys-1 (HostBatch::rows holds key ids): a hot key 0 seen some 2500 times (over more than
// kCombineGroups items), warm keys 1..4 some 190 times each (two items), keys 5.. kEdgeCounts times each (in
// bags of one key at the end), the rest a few times each; 0..5 keys per bag, so a key can repeat in a bag.
HostBatch batch_of_keys(int64_t keys, int dim) {
  auto& g = testing::rng();
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> hot(0, 5);
  const int64_t edge = 5, cold0 = edge + int64_t(kEdgeCounts.size());
  std::uniform_int_distribution<int64_t> warm(1, edge - 1), cold(cold0, keys - 1);
  HostBatch b;
  b.offsets.push_back(0);
  for (int bag = 0; bag < 2000; ++bag) {
    for (int k = hot(g); k > 0; --k) {
      const double x = unit(g);
      b.rows.push_back(x < 0.5 ? 0 : x < 0.65 ? warm(g) : cold(g));
    }
    b.offsets.push_back(int64_t(b.rows.size()));
  }
  for (size_t i = 0; i < kEdgeCounts.size(); ++i) {
    for (int64_t k = 0; k < kEdgeCounts[i]; ++k) {
      b.rows.push_back(edge + int64_t(i));
      b.offsets.push_back(int64_t(b.rows.size()));
    }
  }
  b.bags = int64_t(b.offsets.size()) - 1;
  b.grad = testing::random_floats(size_t(b.bags) * dim);
  return b;
}

// Distinct random table rows for keys 0..keys-1.
std::vector<int64_t> random_rows(int64_t keys, int64_t capacity) {
  std::uniform_int_distribution<int64_t> row(0, capacity - 1);
  std::map<int64_t, bool> taken;
  std::vector<int64_t> row_of;
  while (int64_t(row_of.size()) < keys) {
    const int64_t r = row(testing::rng());
    if (!taken[r]) taken[r] = true, row_of.push_back(r);
  }
  return row_of;
}

// The backward of `by_key` with key k at table row row_of[k]: each key's gradient, [keys, dim] in key order (NaN
// for a key the batch does not hold).
std::vector<float> gradients_by_key(const Device& dev, const HostBatch& by_key, const std::vector<int64_t>& row_of,
                                    const Shape& s, Combiner combiner) {
  HostBatch b = by_key;
  for (int64_t& r : b.rows) r = row_of[size_t(r)];
  const Result r = run_backward(dev, b, s, combiner);
  check_against_naive(b, s, combiner, r);
  std::map<int64_t, size_t> key_of_row;
  for (size_t k = 0; k < row_of.size(); ++k) key_of_row[row_of[k]] = k;
  std::vector<float> out(row_of.size() * s.dim, std::nanf(""));
  for (int64_t u = 0; u < r.num_unique; ++u) {
    const auto it = key_of_row.find(r.unique_rows[size_t(u)]);
    BOOST_REQUIRE(it != key_of_row.end());
    std::copy_n(r.row_grads.begin() + u * s.dim, s.dim, out.begin() + it->second * s.dim);
  }
  return out;
}

// The same keys and contributions under several row-id assignments give the same bits per key, on `backend`,
// and the cpu's bits (the first assignment on the cpu is the reference).
void row_gradients_do_not_depend_on_row_ids(Backend backend) {
  Device dev = open_device(backend, backend == Backend::cuda ? 0 : -1);
  Device host = cpu();
  const int64_t keys = 1000;
  for (int dim : {5, 32}) {
    for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
      Shape s;
      s.dim = dim;
      s.capacity = 1 << 20;
      const HostBatch b = batch_of_keys(keys, dim);
      int64_t hot = 0;
      for (int64_t k : b.rows) hot += k == 0;
      BOOST_TEST_CONTEXT(name(combiner) << " dim " << dim << " nnz " << b.nnz() << ", the hot key " << hot
                                        << " times") {
        BOOST_CHECK_GT(hot, int64_t(kCombineGroups) * kBackwardChunk);  // its partials are summed in ranges
        std::vector<int64_t> row_of = random_rows(keys, s.capacity);
        const std::vector<float> want = gradients_by_key(host, b, row_of, s, combiner);
        std::map<int64_t, int> hot_offsets;  // positions before the hot row in row order, modulo the chunk
        for (int t = 0; t < 6; ++t) {
          if (t > 0) row_of = random_rows(keys, s.capacity);
          int64_t before = 0;
          for (int64_t k : b.rows) before += row_of[size_t(k)] < row_of[0];
          ++hot_offsets[before % kBackwardChunk];
          BOOST_TEST_CONTEXT("assignment " << t << ": " << before << " positions before the hot row") {
            BOOST_CHECK_EQUAL(bitwise_differences(gradients_by_key(dev, b, row_of, s, combiner), want), 0u);
          }
        }
        BOOST_CHECK_GT(hot_offsets.size(), 1u);  // the hot row's items did start at other offsets
      }
    }
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(row_gradients_do_not_depend_on_row_ids, row_gradients_do_not_depend_on_row_ids)

// The fused update on the GPU against the cpu reference, every optimizer over several steps (values and state
// compared after each), and against the GPU's own two-step path.
BOOST_AUTO_TEST_CASE(cuda_backward_and_update_matches_cpu, *testing::needs_gpu()) {
  Device gpu = open_device(Backend::cuda, 0);
  Device host = cpu();
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::nesterov,
                             OptimizerKind::adagrad, OptimizerKind::adam, OptimizerKind::lazy_adam,
                             OptimizerKind::rowwise_adagrad}) {
    for (int dim : {3, 16, 128}) {
      for (bool power_law : {false, true}) {
        BOOST_TEST_CONTEXT(optimizer_name(kind) << " dim " << dim << (power_law ? " power-law" : " uniform")) {
          Shape s{2048, 26, 0, 2};
          s.dim = dim;
          s.capacity = power_law ? 100000 : 20000;  // uniform: many rows skip steps and come back
          s.power_law = power_law;
          s.dup = 0.1;
          OptimizerConfig cfg;
          cfg.kind = kind;
          cfg.lr = 0.05f;
          cfg.initial_accumulator = 0.1f;
          cfg.weight_decay = power_law ? 0.05f : 0.0f;
          const int width = optimizer_state_width(kind, dim);
          std::vector<float> values0 = testing::random_floats(size_t(s.capacity) * dim);
          std::vector<float> state0(size_t(s.capacity) * width, kind == OptimizerKind::adagrad || kind == OptimizerKind::rowwise_adagrad ? 0.1f : 0.0f);
          Buffer<float> v_cpu(host, values0), s_cpu(host, state0);
          Buffer<float> v_gpu(gpu, values0), s_gpu(gpu, state0), v_two(gpu, values0), s_two(gpu, state0);
          const int64_t max_nnz = s.batch * s.slots * s.max_hot;
          BackwardWorkspace ws_cpu(host, max_nnz, s.capacity, dim, host.stream),
              ws_gpu(gpu, max_nnz, s.capacity, dim, gpu.stream);
          Buffer<int64_t> unique_rows(gpu, max_nnz);
          Buffer<float> row_grads(gpu, max_nnz * dim);
          Buffer<int32_t> num_unique(gpu, 1);
          for (int64_t step = 1; step <= 4; ++step) {
            HostBatch b = make_batch(s);  // a fresh batch each step: rows come and go
            Combiner combiner = step % 2 ? Combiner::sum : Combiner::mean;
            DeviceBatch d_cpu(host, b, combiner), d_gpu(gpu, b, combiner);
            backward_and_update(host, d_cpu.view, ws_cpu, cfg, step, v_cpu.data(), s_cpu.data(), host.stream);
            backward_and_update(gpu, d_gpu.view, ws_gpu, cfg, step, v_gpu.data(), s_gpu.data(), gpu.stream);
            row_grads.fill_bytes(0xFF);
            embedding_backward(gpu, d_gpu.view, ws_gpu, unique_rows.data(), row_grads.data(), num_unique.data(),
                               gpu.stream);
            sparse_optimizer_update(gpu, cfg, step, unique_rows.data(), row_grads.data(), num_unique.data(), max_nnz,
                                    v_two.data(), s_two.data(), s.capacity, dim, gpu.stream);
            BOOST_TEST_CONTEXT("step " << step) {
              BOOST_CHECK_EQUAL(read_count(gpu, ws_gpu.num_unique(), gpu.stream),
                                read_count(host, ws_cpu.num_unique(), host.stream));
              std::vector<float> vc = v_cpu.download(), sc = s_cpu.download();
              std::vector<float> vg = v_gpu.download(), sg = s_gpu.download();
              BOOST_CHECK_EQUAL(testing::count_mismatches(vg, vc, 1e-6, 1e-5, "values"), 0u);
              BOOST_CHECK_EQUAL(testing::count_mismatches(sg, sc, 1e-6, 1e-5, "state"), 0u);
              BOOST_CHECK_EQUAL(bitwise_differences(vg, vc), 0u);  // IEEE operations only: the same bits
              BOOST_CHECK_EQUAL(bitwise_differences(sg, sc), 0u);
              BOOST_CHECK_EQUAL(bitwise_differences(v_two.download(), vg), 0u);
              BOOST_CHECK_EQUAL(bitwise_differences(s_two.download(), sg), 0u);
            }
          }
        }
      }
    }
  }
  close_device(gpu);
}

// ---------------------------------------------------------------------------------------------------------
// prepare and finish: the backward in two parts gives embedding_backward's bits, and refuses a finish that
// does not follow its prepare

namespace {

// The outputs of one backward, poisoned, and what they hold after it (whole buffers: the unwritten tails too).
struct Outputs {
  Buffer<int64_t> unique_rows, unique_keys;
  Buffer<float> row_grads;
  Buffer<int32_t> num_unique;
  Outputs(const Device& dev, int64_t max_nnz, int dim)
      : unique_rows(dev, size_t(max_nnz)),
        unique_keys(dev, size_t(max_nnz)),
        row_grads(dev, size_t(max_nnz) * dim),
        num_unique(dev, 1) {
    unique_rows.fill_bytes(0xFF);
    unique_keys.fill_bytes(0xFF);
    row_grads.fill_bytes(0xFF);
    num_unique.fill_bytes(0xFF);
  }
};

// Keys of rows: a function of the row, as a lookup's keys are.
std::vector<int64_t> keys_of(const HostBatch& b) {
  std::vector<int64_t> keys(b.rows.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = int64_t(uint64_t(b.rows[i]) * 0xff51afd7ed558ccdull + 7);
  return keys;
}

void prepare_then_finish_equals_backward(Backend backend) {
  Device dev = open_device(backend, backend == Backend::cuda ? 0 : -1);
  {
    std::vector<Shape> shapes;
    for (int dim : {1, 5, 32, 128}) {
      Shape small{64, 26, 0, 3};  // empty bags, duplicates in a bag and across the batch
      small.dim = dim;
      small.capacity = 2000;
      small.dup = 0.2;
      shapes.push_back(small);
      Shape hot{3000, 26, 1, 1};  // power-law: the hottest rows over more than kCombineGroups items
      hot.dim = dim;
      hot.capacity = 1000000;
      hot.power_law = true;
      shapes.push_back(hot);
      Shape dropped{200, 26, 0, 4};  // rows outside the table
      dropped.dim = dim;
      dropped.capacity = 5000;
      dropped.bad = 0.05;
      shapes.push_back(dropped);
      Shape empty{8, 3, 0, 0};  // no keys
      empty.dim = dim;
      shapes.push_back(empty);
    }
    for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
      for (const Shape& s : shapes) {
        HostBatch b = make_batch(s);
        BOOST_TEST_CONTEXT(name(combiner) << " dim " << s.dim << " batch " << s.batch << " slots " << s.slots
                                          << " hotness " << s.min_hot << ".." << s.max_hot << " nnz " << b.nnz()
                                          << (s.power_law ? " power-law" : "") << (s.bad > 0 ? " dropped" : "")) {
          const int64_t max_nnz = std::max<int64_t>(b.nnz(), 1);
          BackwardWorkspace ws(dev, max_nnz, s.capacity, s.dim, dev.stream);
          DeviceBatch d(dev, b, combiner);
          const std::vector<int64_t> keys = keys_of(b);
          Buffer<int64_t> dkeys(dev, std::max<size_t>(1, keys.size()));
          if (!keys.empty()) dkeys.upload(keys);

          Outputs want(dev, max_nnz, s.dim);
          embedding_backward(dev, d.view, ws, want.unique_rows.data(), want.row_grads.data(), want.num_unique.data(),
                             dkeys.data(), want.unique_keys.data(), dev.stream);
          const int64_t want_dropped = ws.read_dropped_keys(dev.stream);

          // The prepare without a gradient, while the gradient's buffer holds garbage; the gradient arrives after it.
          Outputs got(dev, max_nnz, s.dim);
          d.grad.fill_bytes(0xFF);
          BackwardBatch early = d.view;
          early.grad = nullptr;
          embedding_backward_prepare(dev, early, ws, got.unique_rows.data(), got.num_unique.data(), dkeys.data(),
                                     got.unique_keys.data(), dev.stream);
          // its outputs are complete before the finish
          BOOST_CHECK_EQUAL(read_count(dev, got.num_unique.data(), dev.stream),
                            read_count(dev, want.num_unique.data(), dev.stream));
          BOOST_CHECK(got.unique_rows.download() == want.unique_rows.download());
          BOOST_CHECK(got.unique_keys.download() == want.unique_keys.download());
          BOOST_CHECK_EQUAL(ws.read_dropped_keys(dev.stream), want_dropped);
          if (!b.grad.empty()) d.grad.upload(b.grad);
          embedding_backward_finish(dev, d.view, ws, got.row_grads.data(), dev.stream);

          const int64_t num_unique = read_count(dev, got.num_unique.data(), dev.stream);
          BOOST_CHECK_EQUAL(num_unique, read_count(dev, want.num_unique.data(), dev.stream));
          if (b.nnz() == 0) BOOST_CHECK_EQUAL(num_unique, 0);
          if (s.bad > 0) BOOST_CHECK_GT(want_dropped, 0);
          if (s.power_law) {  // the shape covers a row over many items
            std::map<int64_t, int64_t> count;
            int64_t hottest = 0;
            for (int64_t row : b.rows) hottest = std::max(hottest, ++count[row]);
            BOOST_CHECK_GT(hottest, int64_t(kCombineGroups) * kBackwardChunk);
          }
          BOOST_CHECK(got.unique_rows.download() == want.unique_rows.download());
          BOOST_CHECK(got.unique_keys.download() == want.unique_keys.download());
          const std::vector<float> g = got.row_grads.download(), w = want.row_grads.download();
          BOOST_CHECK_EQUAL(bitwise_differences(g, w), 0u);
          // the rows were written (not left poisoned): every float of the first num_unique rows is a number
          size_t unwritten = 0;
          for (size_t i = 0; i < size_t(num_unique) * s.dim; ++i) unwritten += std::isnan(g[i]);
          BOOST_CHECK_EQUAL(unwritten, 0u);
          BOOST_CHECK_EQUAL(ws.read_dropped_keys(dev.stream), want_dropped);
        }
      }
    }
  }
  close_device(dev);
}

// The update in two parts (backward_and_update_prepare before the gradient is there, then _finish) gives
// backward_and_update's bits, values and state, every optimizer, over several steps; a finish without its prepare
// is refused before anything changes.
void update_in_two_parts_equals_the_whole(Backend backend) {
  Device dev = open_device(backend, backend == Backend::cuda ? 0 : -1);
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::adam,
                             OptimizerKind::rowwise_adagrad}) {
    for (int dim : {3, 32}) {
      BOOST_TEST_CONTEXT(optimizer_name(kind) << " dim " << dim) {
        Shape s{500, 26, 0, 3};
        s.dim = dim;
        s.capacity = 4000;
        s.dup = 0.2;
        s.power_law = dim == 32;
        OptimizerConfig cfg;
        cfg.kind = kind;
        cfg.lr = 0.05f;
        const int width = optimizer_state_width(kind, dim);
        std::vector<float> values0 = testing::random_floats(size_t(s.capacity) * dim);
        std::vector<float> state0(std::max<size_t>(1, size_t(s.capacity) * width), 0.0f);
        Buffer<float> v_one(dev, values0), s_one(dev, state0), v_two(dev, values0), s_two(dev, state0);
        const int64_t max_nnz = s.batch * s.slots * s.max_hot;
        BackwardWorkspace ws_one(dev, max_nnz, s.capacity, dim, dev.stream), ws_two(dev, max_nnz, s.capacity, dim,
                                                                                    dev.stream);
        for (int64_t step = 1; step <= 3; ++step) {
          HostBatch b = make_batch(s);
          DeviceBatch d(dev, b, step % 2 ? Combiner::sum : Combiner::mean);
          backward_and_update(dev, d.view, ws_one, cfg, step, v_one.data(), s_one.data(), dev.stream);
          d.grad.fill_bytes(0xFF);  // the gradient arrives after the prepare
          BackwardBatch early = d.view;
          early.grad = nullptr;
          backward_and_update_prepare(dev, early, ws_two, dev.stream);
          if (!b.grad.empty()) d.grad.upload(b.grad);
          backward_and_update_finish(dev, d.view, ws_two, cfg, step, v_two.data(), s_two.data(), dev.stream);
          BOOST_TEST_CONTEXT("step " << step) {
            BOOST_CHECK_EQUAL(bitwise_differences(v_two.download(), v_one.download()), 0u);
            BOOST_CHECK_EQUAL(bitwise_differences(s_two.download(), s_one.download()), 0u);
            BOOST_CHECK_EQUAL(read_count(dev, ws_two.num_unique(), dev.stream),
                              read_count(dev, ws_one.num_unique(), dev.stream));
          }
          // used up: a second finish is refused and changes nothing
          const std::vector<float> before = v_two.download();
          BOOST_CHECK_THROW(backward_and_update_finish(dev, d.view, ws_two, cfg, step, v_two.data(), s_two.data(),
                                                       dev.stream),
                            Error);
          BOOST_CHECK_EQUAL(bitwise_differences(v_two.download(), before), 0u);
        }
      }
    }
  }
  close_device(dev);
}

// sparta::Error whose message holds `what`.
void check_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    BOOST_ERROR("no error; expected one naming '" << what << "'");
  } catch (const Error& e) {
    const std::string m = e.what();
    BOOST_CHECK_MESSAGE(m.find(what) != std::string::npos, "'" << m << "' does not name '" << what << "'");
  }
}

void finish_refuses_what_was_not_prepared(Backend backend) {
  Device dev = open_device(backend, backend == Backend::cuda ? 0 : -1);
  {
    Shape s{100, 26, 0, 3};
    s.dim = 5;
    s.capacity = 3000;
    s.dup = 0.1;
    HostBatch b = make_batch(s);
    HostBatch other = make_batch(s);
    const int64_t max_nnz = std::max(b.nnz(), other.nnz());
    BackwardWorkspace ws(dev, max_nnz, s.capacity, s.dim, dev.stream);
    DeviceBatch d(dev, b, Combiner::mean), d2(dev, other, Combiner::mean);
    Outputs out(dev, max_nnz, s.dim), ref(dev, max_nnz, s.dim);
    Buffer<float> values(dev, testing::random_floats(size_t(s.capacity) * s.dim));
    auto prepare = [&](const BackwardBatch& x) {
      embedding_backward_prepare(dev, x, ws, out.unique_rows.data(), out.num_unique.data(), nullptr, nullptr,
                                 dev.stream);
    };
    auto finish = [&](const BackwardBatch& x) { embedding_backward_finish(dev, x, ws, out.row_grads.data(), dev.stream); };
    const std::string none = "holds no prepared batch";

    check_error([&] { finish(d.view); }, none);  // a fresh workspace
    prepare(d.view);
    embedding_backward(dev, d.view, ws, ref.unique_rows.data(), ref.row_grads.data(), ref.num_unique.data(),
                       dev.stream);
    check_error([&] { finish(d.view); }, none);  // after an embedding_backward
    prepare(d.view);
    backward_and_update(dev, d.view, ws, OptimizerConfig(), 1, values.data(), nullptr, dev.stream);
    check_error([&] { finish(d.view); }, none);  // after a backward_and_update
    prepare(d.view);
    BackwardBatch too_many = d.view;
    too_many.nnz = max_nnz + 1;
    BOOST_CHECK_THROW(prepare(too_many), Error);
    check_error([&] { finish(d.view); }, none);  // after a prepare that was refused

    // A batch that differs from the prepared one, each way; the prepare stays for the right finish.
    prepare(d.view);
    BackwardBatch x = d.view;
    x.nnz -= 1;
    check_error([&] { finish(x); }, "nnz");
    x = d.view;
    x.combiner = Combiner::sum;
    check_error([&] { finish(x); }, "combiner");
    x = d.view;
    x.bags -= 1;
    check_error([&] { finish(x); }, "bags");
    Buffer<int64_t> same_offsets(dev, b.offsets);  // the same values elsewhere
    x = d.view;
    x.offsets = same_offsets.data();
    check_error([&] { finish(x); }, "offsets");
    x = d.view;
    x.rows = d2.view.rows;
    check_error([&] { finish(x); }, "rows");
    x = d.view;
    x.grad = nullptr;
    check_error([&] { finish(x); }, "gradient");
    finish(d.view);
    BOOST_CHECK_EQUAL(read_count(dev, out.num_unique.data(), dev.stream),
                      read_count(dev, ref.num_unique.data(), dev.stream));
    BOOST_CHECK_EQUAL(bitwise_differences(out.row_grads.download(), ref.row_grads.download()), 0u);
    check_error([&] { finish(d.view); }, none);  // used up

    // Another prepare replaces the first: a finish of the first batch is refused, of the second one runs.
    prepare(d.view);
    prepare(d2.view);
    check_error([&] { finish(d.view); }, "the prepared batch's");  // names what differs (nnz, bags or offsets)
    finish(d2.view);
    embedding_backward(dev, d2.view, ws, ref.unique_rows.data(), ref.row_grads.data(), ref.num_unique.data(),
                       dev.stream);
    BOOST_CHECK_EQUAL(read_count(dev, out.num_unique.data(), dev.stream),
                      read_count(dev, ref.num_unique.data(), dev.stream));
    BOOST_CHECK_EQUAL(bitwise_differences(out.row_grads.download(), ref.row_grads.download()), 0u);
    synchronize(dev);
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(prepare_then_finish_equals_backward, prepare_then_finish_equals_backward)
SPARTA_BACKEND_CASES(finish_refuses_what_was_not_prepared, finish_refuses_what_was_not_prepared)
SPARTA_BACKEND_CASES(update_in_two_parts_equals_the_whole, update_in_two_parts_equals_the_whole)
