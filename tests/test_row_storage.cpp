// 16-bit table storage (kernels/row_storage.h, EmbeddingTableConfig::storage): the stochastic rounding (each
// result one of the two neighbours, found here from round-to-nearest; the mean of many roundings is the value;
// the chance of rounding up is the distance over the gap), and 16-bit tables trained with sgd and rowwise_adagrad
// against a plain host model written here (rows as maps of 16-bit values, sums in key order, fp32 updates rounded
// with the documented bits, written out here), bitwise, at row widths that take each kernel shape; reruns from the seed bit for bit; export and load across storages; the
// settings 16-bit storage refuses.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "src/base/buffer.h"
#include "src/base/half.h"
#include "src/embedding_table.h"
#include "kernels/row_storage.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

float widen(RowStorage s, uint16_t h) { return s == RowStorage::bf16 ? bf16_to_float(h) : f16_to_float(h); }
uint16_t nearest(RowStorage s, float x) { return s == RowStorage::bf16 ? float_to_bf16(x) : float_to_f16(x); }

// The two 16-bit neighbours lo <= x <= hi in magnitude (equal when x is representable), from round-to-nearest:
// the nearest value and the one next to it on x's side.
std::pair<uint16_t, uint16_t> neighbours(RowStorage s, float x) {
  const uint16_t r = nearest(s, x);
  const float w = widen(s, r);
  if (w == x) return {r, r};
  return std::fabs(w) < std::fabs(x) ? std::make_pair(r, uint16_t(r + 1)) : std::make_pair(uint16_t(r - 1), r);
}

// The rounding's random bits as row_storage.h documents them, written out: the element's inputs folded into 32 bits
// with the step's stream, then the "lowbias32" mixer.
uint32_t documented_bits(uint64_t stream, uint32_t elem, float result, uint16_t old) {
  uint32_t f;
  std::memcpy(&f, &result, 4);
  uint32_t x = (f ^ uint32_t(stream & 0xffffffffu)) +
               (((uint32_t(old) << 16) | (elem & 0xffffu)) ^ uint32_t(stream >> 32)) * 0x9E3779B9u;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

void check_rounding(RowStorage s) {
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(s == RowStorage::fp16 ? -26 : -30, 14);  // fp16: subnormals too
  size_t outside = 0, biased = 0, odds = 0, exact_moved = 0;
  const int kDraws = 4000;
  for (int trial = 0; trial < 200; ++trial) {
    float x = std::ldexp(mant(testing::rng()), expo(testing::rng()));
    if (trial % 2) x = -x;
    if (trial % 17 == 0) x = widen(s, nearest(s, x));  // representable: never moves
    const auto [lo, hi] = neighbours(s, x);
    const double flo = widen(s, lo), fhi = widen(s, hi);
    double sum = 0;
    int up = 0;
    for (int d = 0; d < kDraws; ++d) {
      const uint32_t bits = rowstore::rounding_bits(rowstore::step_stream(testing::seed(), d + 1), uint32_t(trial),
                                                    x, uint16_t(trial));
      const uint16_t r = rowstore::round_stochastic(s, x, bits);
      if (r != lo && r != hi) ++outside;
      up += r == hi && hi != lo;
      sum += widen(s, r);
    }
    if (lo == hi) {
      exact_moved += sum != double(x) * kDraws;
      continue;
    }
    // Each draw is a Bernoulli on the gap: standard deviation at most gap / 2. 5 sigma of the mean of kDraws.
    const double gap = std::fabs(fhi - flo);
    if (std::fabs(sum / kDraws - x) > 5 * 0.5 * gap / std::sqrt(double(kDraws))) ++biased;
    const double p = std::fabs(x - flo) / gap;
    if (std::fabs(double(up) / kDraws - p) > 5 * std::sqrt(p * (1 - p) / kDraws) + 1.0 / kDraws) ++odds;
  }
  BOOST_CHECK_EQUAL(outside, 0u);
  BOOST_CHECK_EQUAL(biased, 0u);
  BOOST_CHECK_EQUAL(odds, 0u);
  BOOST_CHECK_EQUAL(exact_moved, 0u);
  // Infinity and NaN round to nearest; fp16 beyond its range is infinity.
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(s, INFINITY, ~0u), nearest(s, INFINITY));
  BOOST_CHECK(std::isnan(widen(s, rowstore::round_stochastic(s, NAN, 12345))));
  if (s == RowStorage::fp16) BOOST_CHECK_EQUAL(rowstore::round_stochastic(s, -1e6f, 0), 0xfc00);
}

}  // namespace

BOOST_AUTO_TEST_CASE(stochastic_rounding_bf16) { check_rounding(RowStorage::bf16); }
BOOST_AUTO_TEST_CASE(stochastic_rounding_fp16) { check_rounding(RowStorage::fp16); }

BOOST_AUTO_TEST_CASE(rounding_bits_are_the_documented_hash) {
  size_t bad = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t stream = rowstore::step_stream(testing::rng()(), int32_t(testing::rng()() & 0x7fffffff));
    const uint32_t elem = uint32_t(testing::rng()() % 256);
    const float x = testing::random_floats(1, -4.f, 4.f)[0];
    const uint16_t old = uint16_t(testing::rng()());
    bad += rowstore::rounding_bits(stream, elem, x, old) != documented_bits(stream, elem, x, old);
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  // Each input moves the bits: another element, result, old value or step.
  const uint64_t st = rowstore::step_stream(7, 3);
  const uint32_t b = rowstore::rounding_bits(st, 5, 0.25f, 0x3e80);
  BOOST_CHECK_NE(b, rowstore::rounding_bits(st, 6, 0.25f, 0x3e80));
  BOOST_CHECK_NE(b, rowstore::rounding_bits(st, 5, std::nextafter(0.25f, 1.f), 0x3e80));
  BOOST_CHECK_NE(b, rowstore::rounding_bits(st, 5, 0.25f, 0x3e81));
  BOOST_CHECK_NE(b, rowstore::rounding_bits(rowstore::step_stream(7, 4), 5, 0.25f, 0x3e80));
}

// fp16 subnormals whose rounding drops more than 32 bits take the 32 random bits as the top ones: 2^-40 is 2^-16 of
// the smallest subnormal (2^-24), so it rounds up exactly when the bits are below 2^16.
BOOST_AUTO_TEST_CASE(fp16_tiny_subnormals_round_on_the_top_bits) {
  const float x = std::ldexp(1.f, -40);
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(RowStorage::fp16, x, 0xffffu), 0x0001);
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(RowStorage::fp16, x, 0x10000u), 0x0000);
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(RowStorage::fp16, -x, 0u), 0x8001);
  // 3 * 2^-26 = 0.75 of the smallest subnormal: 24 dropped bits, up when the low 24 bits are below 0.75 * 2^24
  const float y = std::ldexp(3.f, -26);
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(RowStorage::fp16, y, (3u << 22) - 1), 0x0001);
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(RowStorage::fp16, y, 3u << 22), 0x0000);
  BOOST_CHECK_EQUAL(rowstore::round_stochastic(RowStorage::fp16, y, (1u << 24) | ((3u << 22) - 1)), 0x0001);
}

namespace {

EmbeddingTableConfig config(int dim, RowStorage s, OptimizerKind opt, uint64_t seed) {
  EmbeddingTableConfig c;
  c.name = "clicks";
  c.table_id = 3;
  c.dim = dim;
  c.capacity_rows = 4000;
  c.seed = seed;
  c.init_scale = 0.2f;
  c.optimizer.kind = opt;
  c.optimizer.lr = 0.05f;
  c.optimizer.initial_accumulator = 0.01f;
  c.optimizer.weight_decay = opt == OptimizerKind::sgd ? 0.f : 0.01f;
  c.storage = s;
  return c;
}

// The plain model: every key's row as 16-bit values (and its accumulator), made on first sight.
struct Model {
  RowStorage s;
  KeyInit ki;
  OptimizerConfig opt;
  uint64_t seed;
  int dim;
  std::map<int64_t, std::vector<uint16_t>> rows;
  std::map<int64_t, float> acc;
  std::vector<uint16_t>& row(int64_t key) {
    auto it = rows.find(key);
    if (it != rows.end()) return it->second;
    std::vector<uint16_t> r(static_cast<size_t>(dim));
    for (int e = 0; e < dim; ++e) r[e] = nearest(s, initial_value(ki, uint64_t(key), uint32_t(e)));
    acc[key] = opt.initial_accumulator;
    return rows[key] = r;
  }
  // Pooled forward of bags (offsets, keys), fp32 sums in key order.
  std::vector<float> forward(const std::vector<int64_t>& off, const std::vector<int64_t>& keys, bool mean) {
    const size_t bags = off.size() - 1;
    std::vector<float> out(bags * dim, 0.f);
    for (size_t b = 0; b < bags; ++b) {
      for (int64_t i = off[b]; i < off[b + 1]; ++i) {
        std::vector<uint16_t>& r = row(keys[i]);
        for (int e = 0; e < dim; ++e) out[b * dim + e] += widen(s, r[e]);
      }
      const int64_t n = off[b + 1] - off[b];
      if (mean && n > 0)
        for (int e = 0; e < dim; ++e) out[b * dim + e] /= float(n);
    }
    return out;
  }
  // The backward and update of step t: each row's gradient summed over its keys in key order (fewer than 128 a
  // row: one run from 0), the decayed gradient, the optimizer in fp32, each element rounded stochastically.
  void update(const std::vector<int64_t>& off, const std::vector<int64_t>& keys, const std::vector<float>& grad,
              bool mean, int32_t t) {
    std::map<int64_t, std::vector<float>> g;
    for (size_t b = 0; b + 1 < off.size(); ++b) {
      const int64_t n = off[b + 1] - off[b];
      const float scale = mean ? 1.0f / float(n) : 1.0f;
      for (int64_t i = off[b]; i < off[b + 1]; ++i) {
        std::vector<float>& x = g.try_emplace(keys[i], size_t(dim), 0.f).first->second;
        for (int e = 0; e < dim; ++e) x[e] += mean ? grad[b * dim + e] * scale : grad[b * dim + e];
      }
    }
    const uint64_t stream = rowstore::step_stream(seed, t);
    for (auto& [key, gk] : g) {
      std::vector<uint16_t>& r = rows.at(key);
      std::vector<float> w(static_cast<size_t>(dim)), d(static_cast<size_t>(dim));
      for (int e = 0; e < dim; ++e) w[e] = widen(s, r[e]);
      for (int e = 0; e < dim; ++e) d[e] = opt.weight_decay != 0 ? gk[e] + opt.weight_decay * w[e] : gk[e];
      float step = opt.lr;
      if (opt.kind == OptimizerKind::rowwise_adagrad) {
        // the sum of squares as a balanced tree over the element index, zero-padded to a power of two
        int m = 1;
        while (m < dim) m *= 2;
        std::vector<float> q(size_t(m), 0.f);
        for (int e = 0; e < dim; ++e) q[e] = d[e] * d[e];
        for (; m > 1; m /= 2)
          for (int i = 0; i < m / 2; ++i) q[i] = q[2 * i] + q[2 * i + 1];
        float& a = acc.at(key);
        a = a + q[0] / float(dim);
        step = opt.lr / (std::sqrt(a) + opt.epsilon);
      }
      for (int e = 0; e < dim; ++e) {
        const float res = w[e] - step * d[e];
        r[e] = rowstore::round_stochastic(s, res, documented_bits(stream, uint32_t(e), res, r[e]));
      }
    }
  }
};

struct Batch {
  std::vector<int64_t> off, keys;
};
Batch random_batch(int bags, int max_keys, int64_t key_range) {
  Batch b;
  b.off.push_back(0);
  for (int i = 0; i < bags; ++i) {
    const int n = int(testing::random_ints(1, 0, max_keys)[0]);
    for (int64_t k : testing::random_ints(size_t(n), 0, key_range)) b.keys.push_back(k * 7 + 3);
    b.off.push_back(int64_t(b.keys.size()));
  }
  return b;
}

// Trains a 16-bit table and the model on the same random batches; the forward outputs, the rows (exported) and
// the accumulators agree bit for bit. Returns the table's rows.
// dim 10 takes the kernels' one-element-a-lane shapes, 16 and 32 with a direct index the forward's quad kernel,
// 64 ... 256 the 8-elements-a-lane forward of 16-bit rows (16-byte loads; 4 keys a batch with a direct index) and
// the update's 4-element vectors over 16 or 32 lanes, 1 or 2 vectors a lane.
TableRows train_against_model(Backend backend, RowStorage s, OptimizerKind kind, bool mean, uint64_t seed, int steps,
                              int dim = 10, bool direct = false) {
  Device dev = open_device(backend, backend == Backend::cuda ? 0 : -1);
  TableRows out;
  {
    EmbeddingTableConfig tc = config(dim, s, kind, seed);
    if (direct) tc.direct_stride = 1;  // keys [0, capacity_rows): every row there from the start
    EmbeddingTable t(dev, tc);
    Model m{s, t.key_init(), t.config().optimizer, seed, dim, {}, {}};
    m.ki.segments = nullptr;
    size_t bad_out = 0;
    for (int step = 1; step <= steps; ++step) {
      Batch b = random_batch(64, 5, 150);
      const int64_t bags = int64_t(b.off.size()) - 1, nnz = int64_t(b.keys.size());
      Buffer<int64_t> o(dev, b.off), k(dev, b.keys), rows(dev, size_t(std::max<int64_t>(1, nnz)));
      Buffer<float> y(dev, size_t(bags) * dim);
      y.fill_bytes(0xFF);
      t.pooled_forward(o.data(), k.data(), bags, mean ? Combiner::mean : Combiner::sum, LookupMode::train, y.data(),
                       OutputType::f32, rows.data(), MissingKey::zeros, Check::now, dev.stream);
      std::vector<float> want = m.forward(b.off, b.keys, mean);
      bad_out += testing::count_mismatches(y.download(), want, 0, 0, "16-bit forward");
      std::vector<float> grad = testing::random_floats(size_t(bags) * dim, -2.f, 2.f);
      Buffer<float> g(dev, grad);
      t.backward_and_update(o.data(), rows.data(), bags, nnz, g.data(), mean ? Combiner::mean : Combiner::sum, step,
                            dev.stream);
      m.update(b.off, b.keys, grad, mean, step);
    }
    BOOST_CHECK_EQUAL(bad_out, 0u);
    out = t.export_rows(dev.stream);
    BOOST_CHECK_EQUAL(out.storage, row_storage_name(s));
    if (!direct) BOOST_CHECK_EQUAL(out.rows(), m.rows.size());
    size_t bad_rows = 0, bad_acc = 0, moved = 0;
    for (size_t i = 0; i < out.rows(); ++i) {
      const std::vector<uint16_t>& r = m.row(out.keys[i]);  // a direct index's untouched rows: initial values
      for (int e = 0; e < dim; ++e) {
        bad_rows += out.values[i * dim + e] != widen(s, r[e]);
        moved += r[e] != nearest(s, initial_value(m.ki, uint64_t(out.keys[i]), uint32_t(e)));
      }
      if (kind == OptimizerKind::rowwise_adagrad) bad_acc += out.state[i] != m.acc.at(out.keys[i]);
    }
    BOOST_CHECK_EQUAL(bad_rows, 0u);
    BOOST_CHECK_EQUAL(bad_acc, 0u);
    BOOST_CHECK_GT(moved, direct ? size_t(100) : out.rows());  // the updates changed the rows
  }
  close_device(dev);
  return out;
}

void trains_like_model(Backend b) {
  struct Shape {
    int dim;
    bool direct;
  };
  for (Shape sh : {Shape{10, false}, Shape{16, true}, Shape{32, true}, Shape{64, false}, Shape{64, true},
                   Shape{128, false}, Shape{128, true}, Shape{256, true}})
    for (RowStorage s : {RowStorage::bf16, RowStorage::fp16})
      for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::rowwise_adagrad})
        for (bool mean : {false, true}) {
          BOOST_TEST_CONTEXT(row_storage_name(s) << " " << optimizer_name(k) << (mean ? " mean" : " sum") << " dim "
                                                 << sh.dim << (sh.direct ? " direct" : " hashed")) {
            train_against_model(b, s, k, mean, testing::seed(), 6, sh.dim, sh.direct);
          }
        }
}

}  // namespace

SPARTA_BACKEND_CASES(table_16bit_trains_like_plain_model, trains_like_model)

BOOST_AUTO_TEST_CASE(rerun_from_seed_is_bitwise) {
  // Same seed and batches: the same bits. Another seed: other rows (the initial values and the roundings).
  const uint64_t state = testing::rng()();
  auto run = [&](uint64_t seed) {
    testing::rng().seed(state);
    return train_against_model(Backend::cpu, RowStorage::bf16, OptimizerKind::sgd, false, seed, 8);
  };
  TableRows a = run(11), b = run(11), c = run(12);
  BOOST_CHECK(a.keys == b.keys && a.values == b.values);
  BOOST_CHECK(a.keys != c.keys || a.values != c.values);
}

BOOST_AUTO_TEST_CASE(export_and_load_across_storages) {
  const int dim = 6;
  Device dev;
  std::vector<int64_t> keys = testing::random_ints(300, 0, 100000);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  TableRows r;
  r.name = "clicks";
  r.dim = dim;
  r.optimizer = "rowwise_adagrad";
  r.state_width = 1;
  r.keys = keys;
  r.values = testing::random_floats(keys.size() * dim, -3.f, 3.f);
  r.state = testing::random_floats(keys.size(), 0.f, 1.f);
  for (RowStorage s : {RowStorage::bf16, RowStorage::fp16}) {
    for (bool direct : {false, true}) {
      // fp32 rows into a 16-bit table: rounded to nearest; state as it is.
      EmbeddingTableConfig c = config(dim, s, OptimizerKind::rowwise_adagrad, 5);
      if (direct) {  // every key of [0, 100001) a row: the loaded ones and the rest at their initial values
        c.capacity_rows = 100001;
        c.direct_stride = 1;
      }
      EmbeddingTable t(dev, c);
      t.load_rows(r, dev.stream);
      TableRows back = t.export_rows(dev.stream);
      std::map<int64_t, size_t> at;
      for (size_t i = 0; i < back.rows(); ++i) at[back.keys[i]] = i;
      size_t bad = 0;
      for (size_t i = 0; i < r.rows(); ++i) {
        const size_t j = at.at(r.keys[i]);
        for (int e = 0; e < dim; ++e) bad += back.values[j * dim + e] != widen(s, nearest(s, r.values[i * dim + e]));
        bad += back.state[j] != r.state[i];
      }
      BOOST_CHECK_EQUAL(bad, 0u);
      // 16-bit rows into an fp32 table and back into a 16-bit one: exact.
      EmbeddingTableConfig cf = c;
      cf.storage = RowStorage::fp32;
      EmbeddingTable f(dev, cf);
      f.load_rows(back, dev.stream);
      TableRows wide = f.export_rows(dev.stream);
      BOOST_CHECK(wide.storage == "fp32" && wide.keys == back.keys && wide.values == back.values);
      EmbeddingTable h(dev, c);
      h.load_rows(wide, dev.stream);
      TableRows again = h.export_rows(dev.stream);
      BOOST_CHECK(again.keys == back.keys && again.values == back.values && again.state == back.state);
    }
  }
}

BOOST_AUTO_TEST_CASE(sixteen_bit_refusals_name_the_setting) {
  Device dev;
  auto refused = [&](EmbeddingTableConfig c, const std::string& want) {
    try {
      EmbeddingTable t(dev, c);
      BOOST_ERROR("accepted: " + want);
    } catch (const Error& e) {
      const std::string m = e.what();
      BOOST_CHECK_MESSAGE(m.find("'clicks'") != std::string::npos && m.find(want) != std::string::npos, m);
    }
  };
  refused(config(8, RowStorage::bf16, OptimizerKind::adagrad, 1), "found adagrad");
  refused(config(8, RowStorage::fp16, OptimizerKind::adam, 1), "found adam");
  EmbeddingTableConfig c = config(8, RowStorage::bf16, OptimizerKind::sgd, 1);
  c.optimizer.atomic_update = true;
  refused(c, "atomic_update");
  refused(config(7, RowStorage::fp16, OptimizerKind::sgd, 1), "even dim");
  BOOST_CHECK(parse_row_storage("bf16") == RowStorage::bf16);
  BOOST_CHECK_THROW(parse_row_storage("fp8"), Error);
  // 2 bytes an element in the memory model; the accumulator stays fp32.
  BOOST_CHECK_EQUAL(EmbeddingTable::memory_bytes(1000, 16, OptimizerKind::rowwise_adagrad, 0.5, false, RowStorage::bf16),
                    EmbeddingTable::memory_bytes(1000, 16, OptimizerKind::rowwise_adagrad, 0.5) - 1000 * 16 * 2);
}
