// kernels/atomic_sgd.h and the table's atomic_update: every key's step added to its row, against a reference
// written here (the keys applied one by one in key order, float arithmetic): bit for bit on the cpu backend;
// on the cuda backend bit for bit for rows one key touches and within float rounding for rows several keys
// touch (their adds land in any order); untouched rows and rows outside the table never change. An
// EmbeddingTable with atomic_update against one with the sorted backward; the settings' and inputs' errors.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <map>
#include <string>

#include "src/base/buffer.h"
#include "src/embedding_table.h"
#include "kernels/atomic_sgd.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

Device open(Backend b) { return open_device(b, b == Backend::cuda ? 0 : -1); }

struct Batch {
  std::vector<int64_t> offsets{0}, rows;
  std::vector<float> grad;
  int64_t bags() const { return int64_t(offsets.size()) - 1; }
};

// Bags of 0..max_hot rows in [-1, capacity + 1] (squared uniform: low rows hot, so rows repeat), -1 and capacity
// and capacity + 1 being outside the table.
Batch random_batch(int64_t bags, int max_hot, int64_t capacity, int dim) {
  Batch b;
  for (int64_t h : testing::random_ints(size_t(bags), 0, max_hot)) {
    for (float u : testing::random_floats(size_t(h), 0.f, 1.f)) b.rows.push_back(int64_t(double(u) * u * (capacity + 3)) - 1);
    b.offsets.push_back(int64_t(b.rows.size()));
  }
  b.grad = testing::random_floats(size_t(bags) * dim);
  return b;
}

// The expectation: keys in key order, w = w + -(lr * g), g = grad (sum) or grad * (1 / n) (mean). Also counts
// each row's keys and sums |lr * g| for the tolerance of rows several keys touch.
struct Want {
  std::vector<float> values, abs_steps;
  std::vector<int> touches;
};
Want expected(const Batch& b, std::vector<float> values, int64_t capacity, int dim, float lr, Combiner comb) {
  Want w{std::move(values), std::vector<float>(size_t(capacity) * dim, 0.f), std::vector<int>(size_t(capacity), 0)};
  for (int64_t bag = 0; bag < b.bags(); ++bag) {
    const int64_t s = b.offsets[size_t(bag)], e = b.offsets[size_t(bag) + 1];
    const float inv = 1.0f / float(e - s);
    for (int64_t k = s; k < e; ++k) {
      const int64_t r = b.rows[size_t(k)];
      if (r < 0 || r >= capacity) continue;
      ++w.touches[size_t(r)];
      for (int d = 0; d < dim; ++d) {
        float g = b.grad[size_t(bag) * dim + d];
        if (comb == Combiner::mean) g = g * inv;
        const volatile float step = lr * g;  // rounded to float before the add (no fused multiply-add)
        w.values[size_t(r) * dim + d] = w.values[size_t(r) * dim + d] + -step;
        w.abs_steps[size_t(r) * dim + d] += std::fabs(step);
      }
    }
  }
  return w;
}

void matches_key_order_reference(Backend backend) {
  Device dev = open(backend);
  const int64_t capacity = 97;
  Buffer<uint32_t> marks(dev, size_t(atomic_sgd_mark_words(capacity, 256)));
  int marked_runs = 0;
  for (int dim : {1, 3, 4, 8, 12, 16, 20, 32, 64, 128, 256})
    for (Combiner comb : {Combiner::sum, Combiner::mean})
      for (int shift : {0, 1})  // values at a 16-byte boundary (vector atomics) or 4 bytes past it (scalar)
        for (bool marked : {false, true}) {  // the marking pass (dims >= 32; poisoned marks) or atomics alone
          if (marked && atomic_sgd_mark_words(capacity, dim) == 0) continue;
          Batch b = random_batch(53, 11, capacity, dim);
          const float lr = 0.37f;
          std::vector<float> v0 = testing::random_floats(size_t(capacity) * dim);
          Buffer<float> values(dev, size_t(capacity) * dim + 1);
          Buffer<int64_t> o(dev, b.offsets), r(dev, std::max<size_t>(b.rows.size(), 1));
          if (!b.rows.empty()) r.upload(b.rows);
          Buffer<float> g(dev, b.grad);
          copy_to_device(dev, values.data() + shift, v0.data(), v0.size() * sizeof(float), dev.stream);
          BackwardBatch bb;
          bb.offsets = o.data();
          bb.rows = r.data();
          bb.grad = g.data();
          bb.bags = b.bags();
          bb.nnz = int64_t(b.rows.size());
          bb.combiner = comb;
          marks.fill_bytes(0xA5);
          atomic_sgd_update(dev, bb, lr, values.data() + shift, capacity, dim, marked ? marks.data() : nullptr,
                            dev.stream);
          std::vector<float> got(v0.size());
          copy_to_host(dev, got.data(), values.data() + shift, got.size() * sizeof(float), dev.stream);
          const Want want = expected(b, v0, capacity, dim, lr, comb);
          size_t bad = 0, several = 0;
          for (int64_t row = 0; row < capacity; ++row)
            for (int d = 0; d < dim; ++d) {
              const size_t i = size_t(row) * dim + d;
              const bool exact = backend == Backend::cpu || want.touches[size_t(row)] <= 1;
              several += !exact;
              const float tol = exact ? 0.f : 1e-6f * (std::fabs(v0[i]) + want.abs_steps[i]);
              if (!(std::fabs(got[i] - want.values[i]) <= tol)) {
                if (bad++ < 5)
                  BOOST_ERROR("dim " << dim << " " << combiner_name(comb) << " shift " << shift << ": row " << row
                                     << " [" << d << "] " << got[i] << " want " << want.values[i] << " (touched "
                                     << want.touches[size_t(row)] << " times)");
              }
            }
          BOOST_TEST(bad == 0u, "dim " << dim << (marked ? ", marked" : ""));
          marked_runs += marked;
          if (backend == Backend::cuda) BOOST_TEST(several > 0u, "no row touched twice: the batch tests nothing");
        }
  BOOST_TEST(marked_runs == 16);  // dims 32, 64, 128, 256: two combiners, two shifts
  close_device(dev);
}

// A table with atomic_update against one with the sorted backward, over several steps of the same batches: rows
// one key touched per step stay bit for bit equal; all rows stay within float rounding.
void table_matches_sorted_table(Backend backend) {
  Device dev = open(backend);
  for (int64_t stride : {0, 1})  // hashed, direct
    for (int dim : {16, 32}) {  // atomics alone; the marking pass first (cuda)
      EmbeddingTableConfig c;
      c.name = "views";
      c.dim = dim;
      c.capacity_rows = 400;
      c.seed = testing::seed();
      c.optimizer.kind = OptimizerKind::sgd;
      c.optimizer.lr = 0.2f;
      c.direct_stride = stride;
      EmbeddingTable sorted(dev, c);
      c.optimizer.atomic_update = true;
      EmbeddingTable atomic(dev, c);
      for (int64_t step = 1; step <= 4; ++step) {
        Batch b = random_batch(64, 9, 398, c.dim);  // rows -1 .. 400 used as keys; -1 and 398+ are skipped below
        std::vector<int64_t> keys;
        std::vector<int64_t> offsets{0};
        for (int64_t bag = 0; bag < b.bags(); ++bag) {
          for (int64_t k = b.offsets[size_t(bag)]; k < b.offsets[size_t(bag) + 1]; ++k)
            if (b.rows[size_t(k)] >= 0 && b.rows[size_t(k)] < 398) keys.push_back(b.rows[size_t(k)]);
          offsets.push_back(int64_t(keys.size()));
        }
        const size_t n = std::max<size_t>(keys.size(), 1);
        Buffer<int64_t> o(dev, offsets), k(dev, n), rs(dev, n), ra(dev, n);
        if (!keys.empty()) k.upload(keys);
        Buffer<float> out(dev, size_t(b.bags()) * c.dim), g(dev, b.grad);
        for (auto* t : {&sorted, &atomic}) {
          Buffer<int64_t>& rows = t == &sorted ? rs : ra;
          t->pooled_forward(o.data(), k.data(), b.bags(), Combiner::mean, LookupMode::train, out.data(),
                            OutputType::f32, rows.data(), MissingKey::zeros, Check::deferred, dev.stream);
          t->backward_and_update(o.data(), rows.data(), b.bags(), int64_t(keys.size()), g.data(), Combiner::mean, step,
                                 dev.stream);
          t->check_lookups(MissingKey::zeros, dev.stream);
        }
      }
      std::map<int64_t, std::vector<float>> want;
      TableRows s = sorted.export_rows(dev.stream), a = atomic.export_rows(dev.stream);
      for (size_t i = 0; i < s.keys.size(); ++i)
        want[s.keys[i]].assign(s.values.begin() + i * c.dim, s.values.begin() + (i + 1) * c.dim);
      BOOST_TEST(a.keys.size() == s.keys.size());
      size_t bad = 0, equal = 0;
      for (size_t i = 0; i < a.keys.size(); ++i) {
        const std::vector<float>& w = want[a.keys[i]];
        for (int d = 0; d < c.dim; ++d) {
          const float got = a.values[i * c.dim + d];
          bad += !(std::fabs(got - w[size_t(d)]) <= 1e-5f * (1.f + std::fabs(w[size_t(d)])));
          equal += got == w[size_t(d)];
        }
      }
      BOOST_TEST(bad == 0u, "stride " << stride << " dim " << dim);
      BOOST_TEST(equal > 0u);
      BOOST_CHECK_THROW(atomic.rows_updated(dev.stream), Error);
    }
  close_device(dev);
}

// Bad settings and inputs: an error naming what was wrong, and nothing changed.
void errors_change_nothing(Backend backend) {
  Device dev = open(backend);
  EmbeddingTableConfig c;
  c.name = "ads";
  c.dim = 4;
  c.capacity_rows = 8;
  c.optimizer.kind = OptimizerKind::adagrad;
  c.optimizer.atomic_update = true;
  try {
    EmbeddingTable t(dev, c);
    BOOST_ERROR("atomic_update with adagrad: no error");
  } catch (const Error& e) {
    const std::string m = e.what();
    BOOST_TEST((m.find("ads") != std::string::npos && m.find("atomic_update") != std::string::npos &&
                m.find("adagrad") != std::string::npos), m);
  }
  std::vector<float> v0 = testing::random_floats(8 * 4);
  Buffer<float> values(dev, v0), g(dev, testing::random_floats(2 * 4));
  Buffer<int64_t> rows(dev, std::vector<int64_t>{1, 2, 3});
  for (int which = 0; which < (backend == Backend::cpu ? 3 : 2); ++which) {
    std::vector<int64_t> offs = which == 2 ? std::vector<int64_t>{0, 3, 2} : std::vector<int64_t>{0, 1, 3};
    Buffer<int64_t> o(dev, offs);
    BackwardBatch bb;
    bb.offsets = o.data();
    bb.rows = rows.data();
    bb.grad = g.data();
    bb.bags = 2;
    bb.nnz = 3;
    const float lr = which == 0 ? std::nanf("") : 0.1f;
    if (which == 1) bb.grad = nullptr;
    try {
      atomic_sgd_update(dev, bb, lr, values.data(), 8, 4, nullptr, dev.stream);
      BOOST_ERROR("case " << which << ": no error");
    } catch (const Error& e) {
      const std::string m = e.what();
      const char* want = which == 0 ? "learning rate" : which == 1 ? "no gradient" : "offsets decrease";
      BOOST_TEST(m.find(want) != std::string::npos, m);
    }
    BOOST_TEST(values.download() == v0);
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(atomic_sgd_matches_the_key_order_reference, matches_key_order_reference)
SPARTA_BACKEND_CASES(atomic_update_table_matches_the_sorted_table, table_matches_sorted_table)
SPARTA_BACKEND_CASES(atomic_update_errors_change_nothing, errors_change_nothing)
