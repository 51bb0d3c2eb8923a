// EmbeddingTable (src/embedding_table.h): sizes, lookups, full and missing-key errors, optimizer state
// initialisation, the export/load round trip that checkpoints use, across backends, and train steps
// (forward → upstream gradient → backward_and_update) for every optimizer against an independent host model.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "src/base/buffer.h"
#include "src/embedding_table.h"
#include "tests/testing.h"

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
                   OutputType::f32, rows.data(), MissingKey::zeros, Check::now, dev.stream);
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

namespace {

// Export from a table on src, load into fresh tables on dst: the same keys, values and state, and eval lookups
// through the loaded table give what the original gives.
void export_load_round_trip(Backend src, Backend dst) {
  const int dim = 12;
  std::vector<int64_t> keys = testing::random_ints(600, -5, 400);  // duplicates, the marker key -1
  const size_t distinct = std::set<int64_t>(keys.begin(), keys.end()).size();
  Device sdev = open(src), ddev = open(dst);
  {
    EmbeddingTable a(sdev, config(dim, 1000, OptimizerKind::adagrad));
    std::vector<float> out_a = train(a, keys);
    TableRows rows = a.export_rows(sdev.stream);
    BOOST_CHECK_EQUAL(rows.rows(), distinct);
    BOOST_CHECK(std::set<int64_t>(rows.keys.begin(), rows.keys.end()) == std::set<int64_t>(keys.begin(), keys.end()));
    BOOST_CHECK_EQUAL(rows.state.size(), rows.rows() * dim);
    BOOST_CHECK(rows.name == "ads" && rows.dim == dim && rows.optimizer == "adagrad" && rows.state_width == dim);
    size_t bad = 0;
    for (size_t r = 0; r < rows.rows(); ++r) {
      for (int e = 0; e < dim; ++e) {
        bad += rows.values[r * dim + e] != initial_value(a.key_init(), uint64_t(rows.keys[r]), e);
        bad += rows.state[r * dim + e] != 0.125f;  // adagrad's initial accumulator
      }
    }
    BOOST_CHECK_EQUAL(bad, 0u);
    // Changed values survive the trip: scale them, reload them.
    for (auto& v : rows.values) v *= 3.f;
    for (size_t i = 0; i < rows.state.size(); ++i) rows.state[i] = float(i);
    EmbeddingTable b(ddev, config(dim, 1000, OptimizerKind::adagrad));
    b.load_rows(rows, ddev.stream);
    TableRows back = b.export_rows(ddev.stream);
    BOOST_CHECK(back.keys == rows.keys);
    BOOST_CHECK(back.values == rows.values);
    BOOST_CHECK(back.state == rows.state);
    BOOST_CHECK_THROW(b.load_rows(rows, ddev.stream), Error);  // keys present
    BOOST_CHECK_EQUAL(b.size(ddev.stream), int64_t(rows.rows()));
    // eval lookup: values of each key are 3x the original's output
    Buffer<int64_t> k(ddev, keys), r(ddev, keys.size());
    Buffer<float> out(ddev, keys.size() * dim);
    out.fill_bytes(0xFF);
    b.unpooled_forward(k.data(), int64_t(keys.size()), LookupMode::eval, out.data(), OutputType::f32, r.data(),
                       MissingKey::error, Check::now, ddev.stream);
    std::vector<float> want(out_a);
    for (auto& v : want) v *= 3.f;
    BOOST_CHECK_EQUAL(testing::count_mismatches(out.download(), want, 0, 0, "loaded lookup"), 0u);
    TableRows bad_rows = rows;
    bad_rows.values.pop_back();
    EmbeddingTable c(ddev, config(dim, 1000, OptimizerKind::adagrad));
    BOOST_CHECK_THROW(c.load_rows(bad_rows, ddev.stream), Error);
    bad_rows = rows;
    bad_rows.optimizer = "adam";  // another optimizer's state: refused, naming both
    try {
      c.load_rows(bad_rows, ddev.stream);
      BOOST_ERROR("rows of another optimizer loaded");
    } catch (const Error& e) {
      BOOST_CHECK(std::string(e.what()).find("'adagrad'") != std::string::npos);
    }
    BOOST_CHECK_EQUAL(c.size(ddev.stream), 0);
  }
  close_device(ddev);
  close_device(sdev);
}

void export_load_round_trip_on(Backend b) { export_load_round_trip(b, b); }

}  // namespace

SPARTA_BACKEND_CASES(export_load_round_trip, export_load_round_trip_on)

// Rows exported on one backend load on the other, both ways.
BOOST_AUTO_TEST_CASE(export_load_round_trip_across_backends, *testing::needs_gpu()) {
  export_load_round_trip(Backend::cpu, Backend::cuda);
  export_load_round_trip(Backend::cuda, Backend::cpu);
}

namespace {

void full_and_missing_errors(Backend b) {
  {
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
      out.fill_bytes(0xFF);
      t.unpooled_forward(k.data(), 2, LookupMode::eval, out.data(), OutputType::f32, r.data(), MissingKey::zeros,
                         Check::now, dev.stream);  // zeros: fine
      BOOST_CHECK_EQUAL(testing::count_mismatches(out.download(), std::vector<float>(8, 0.f), 0, 0, "zeros"), 0u);
      BOOST_CHECK_THROW(t.unpooled_forward(k.data(), 2, LookupMode::eval, out.data(), OutputType::f32, r.data(),
                                           MissingKey::error, Check::now, dev.stream),
                        Error);
      t.clear(dev.stream);
      BOOST_CHECK_EQUAL(t.size(dev.stream), 0);
      std::vector<int64_t> keys = testing::random_ints(15, 0, 14);
      train(t, keys);
      BOOST_CHECK_EQUAL(t.size(dev.stream), int64_t(std::set<int64_t>(keys.begin(), keys.end()).size()));
    }
    close_device(dev);
  }
}

void deferred_check(Backend b) {
  Device dev = open(b);
  {
    EmbeddingTable t(dev, config(4, 20, OptimizerKind::sgd));
    const int64_t salt = testing::random_ints(1, 0, int64_t(1) << 40)[0];
    std::vector<int64_t> keys(40);  // 40 distinct keys (one salt for all) into 20 rows
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = int64_t(1000003 * (i + 1)) ^ salt;
    std::vector<int64_t> offsets(keys.size() + 1);
    for (size_t i = 0; i <= keys.size(); ++i) offsets[i] = int64_t(i);
    const int64_t n = int64_t(keys.size());
    Buffer<int64_t> o(dev, offsets), k(dev, keys), rows(dev, keys.size());
    Buffer<float> out(dev, keys.size() * 4), grad(dev, std::vector<float>(keys.size() * 4, 1.0f));
    out.fill_bytes(0xFF);
    rows.fill_bytes(0x7F);
    t.pooled_forward(o.data(), k.data(), n, Combiner::sum, LookupMode::train, out.data(), OutputType::f32, rows.data(),
                     MissingKey::zeros, Check::deferred, dev.stream);  // no throw yet
    std::vector<int64_t> r = rows.download();
    BOOST_CHECK_EQUAL(std::count_if(r.begin(), r.end(), [](int64_t x) { return x >= 0 && x < 20; }), 20);
    BOOST_CHECK_EQUAL(std::count(r.begin(), r.end(), int64_t(-1)), 20);
    std::vector<float> before = t.export_rows(dev.stream).values;
    t.backward_and_update(o.data(), rows.data(), n, n, grad.data(), Combiner::sum, 1, dev.stream);  // refused: skipped
    BOOST_CHECK_EQUAL(t.rows_updated(dev.stream), 20);
    std::vector<float> after = t.export_rows(dev.stream).values;
    BOOST_REQUIRE_EQUAL(after.size(), before.size());
    size_t wrong = 0;
    for (size_t i = 0; i < after.size(); ++i) wrong += !(std::fabs(after[i] - (before[i] - 0.01f)) <= 1e-6f);
    BOOST_CHECK_EQUAL(wrong, 0u);  // every held row moved by -lr * 1 (lr 0.01 by default), nothing else
    try {
      t.check_lookups(MissingKey::zeros, dev.stream);
      BOOST_ERROR("no full error from the deferred check");
    } catch (const Error& e) {
      std::string m = e.what();
      BOOST_CHECK(m.find("'ads'") != std::string::npos && m.find("capacity 20 rows") != std::string::npos);
    }
    BOOST_CHECK_NO_THROW(t.check_lookups(MissingKey::zeros, dev.stream));  // the counters start afresh
    Buffer<int64_t> missing(dev, std::vector<int64_t>{-5}), mr(dev, 1);  // never inserted
    t.unpooled_forward(missing.data(), 1, LookupMode::eval, out.data(), OutputType::f32, mr.data(), MissingKey::error,
                       Check::deferred, dev.stream);
    // missing keys are errors only when the check says so ...
    BOOST_CHECK_NO_THROW(t.check_lookups(MissingKey::zeros, dev.stream));
    t.unpooled_forward(missing.data(), 1, LookupMode::eval, out.data(), OutputType::f32, mr.data(), MissingKey::error,
                       Check::deferred, dev.stream);
    BOOST_CHECK_THROW(t.check_lookups(MissingKey::error, dev.stream), Error);  // ... as here
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(full_and_missing_are_errors_naming_the_table, full_and_missing_errors)
SPARTA_BACKEND_CASES(deferred_check_reports_after_the_backward_and_loses_nothing, deferred_check)

// ---- train steps ----

namespace {

const OptimizerKind kAllOptimizers[] = {OptimizerKind::sgd,     OptimizerKind::momentum, OptimizerKind::nesterov,
                                        OptimizerKind::adagrad, OptimizerKind::adam,     OptimizerKind::lazy_adam,
                                        OptimizerKind::rowwise_adagrad};

EmbeddingTableConfig step_config(int dim, int64_t cap, OptimizerKind opt) {
  EmbeddingTableConfig c = config(dim, cap, opt);
  c.optimizer.lr = 0.05f;
  c.optimizer.momentum = 0.8f;
  c.optimizer.beta1 = 0.85f;
  c.optimizer.beta2 = 0.95f;
  c.optimizer.epsilon = 1e-6f;
  return c;
}

// One batch on the host: CSR bags of keys, the upstream gradient, the combiner and the global step.
struct StepBatch {
  std::vector<int64_t> offsets, keys;
  std::vector<float> grad;  // [bags, dim]
  Combiner combiner = Combiner::sum;
  int64_t step = 1;
  int64_t bags() const { return int64_t(offsets.size()) - 1; }
};

// bags bags of 0..max_hot keys from [0, universe) (squared uniform: low keys are hot, so rows repeat a lot).
StepBatch random_batch(int64_t bags, int max_hot, int64_t universe, int dim, Combiner comb, int64_t step) {
  StepBatch b;
  b.combiner = comb;
  b.step = step;
  b.offsets.push_back(0);
  std::vector<int64_t> hot = testing::random_ints(size_t(bags), 0, max_hot);
  for (int64_t h : hot) {
    for (int64_t i = 0; i < h; ++i) {
      double u = testing::random_floats(1, 0.f, 1.f)[0];
      b.keys.push_back(int64_t(u * u * double(universe)) % universe);
    }
    b.offsets.push_back(int64_t(b.keys.size()));
  }
  b.grad = testing::random_floats(size_t(bags) * dim);
  return b;
}

// The documented formulas (kernels/sparse_optimizer.h) on a map from key to row, written independently of the
// kernels: float arithmetic, bias corrections and lazy decay through std::pow.
struct HostModel {
  OptimizerConfig cfg;
  int dim = 0, width = 0;
  KeyInit init;
  std::map<int64_t, std::vector<float>> w, s;  // key → values [dim], state [width]
  std::map<int64_t, int32_t> last;             // lazy_adam: step of the last update

  HostModel(const EmbeddingTableConfig& c, const KeyInit& k)
      : cfg(c.optimizer), dim(c.dim), width(optimizer_state_width(c.optimizer.kind, c.dim)), init(k) {}

  void touch(int64_t key) {
    if (w.count(key)) return;
    std::vector<float>& v = w[key];
    for (int e = 0; e < dim; ++e) v.push_back(initial_value(init, uint64_t(key), e));
    const bool accumulator = cfg.kind == OptimizerKind::adagrad || cfg.kind == OptimizerKind::rowwise_adagrad;
    s[key].assign(size_t(width), accumulator ? cfg.initial_accumulator : 0.f);
    last[key] = 0;
  }

  // The pooled forward of the batch (train: inserts), [bags, dim].
  std::vector<float> forward(const StepBatch& b) {
    std::vector<float> out(size_t(b.bags()) * dim, 0.f);
    for (int64_t g = 0; g < b.bags(); ++g) {
      int64_t n = b.offsets[g + 1] - b.offsets[g];
      for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i) {
        touch(b.keys[i]);
        for (int e = 0; e < dim; ++e) out[g * dim + e] += w[b.keys[i]][e];
      }
      if (b.combiner == Combiner::mean && n > 0)
        for (int e = 0; e < dim; ++e) out[g * dim + e] /= float(n);
    }
    return out;
  }

  void update(const StepBatch& b) {
    std::map<int64_t, std::vector<float>> grad;  // summed in key order
    for (int64_t g = 0; g < b.bags(); ++g) {
      int64_t n = b.offsets[g + 1] - b.offsets[g];
      float scale = b.combiner == Combiner::mean && n > 0 ? 1.0f / float(n) : 1.0f;
      for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i) {
        std::vector<float>& acc = grad[b.keys[i]];
        acc.resize(size_t(dim), 0.f);
        for (int e = 0; e < dim; ++e) acc[e] += b.combiner == Combiner::mean ? b.grad[g * dim + e] * scale : b.grad[g * dim + e];
      }
    }
    const int t = int(b.step);
    const float bias1 = float(1.0 - std::pow(double(cfg.beta1), t)), bias2 = float(1.0 - std::pow(double(cfg.beta2), t));
    for (auto& [key, gk] : grad) {
      std::vector<float>& v = w[key];
      std::vector<float>& st = s[key];
      int missed = std::max(0, t - 1 - last[key]);
      for (int e = 0; e < dim; ++e) gk[e] += cfg.weight_decay * v[e];  // L2 on the rows the step touches
      float row_lr = 0;  // rowwise_adagrad
      if (cfg.kind == OptimizerKind::rowwise_adagrad) {
        double square_sum = 0;
        for (int e = 0; e < dim; ++e) square_sum += double(gk[e]) * gk[e];
        st[0] += float(square_sum / dim);
        row_lr = cfg.lr / (std::sqrt(st[0]) + cfg.epsilon);
      }
      for (int e = 0; e < dim; ++e) {
        float g = gk[e];
        switch (cfg.kind) {
          case OptimizerKind::rowwise_adagrad: v[e] -= row_lr * g; break;
          case OptimizerKind::sgd: v[e] -= cfg.lr * g; break;
          case OptimizerKind::momentum:
            st[e] = cfg.momentum * st[e] + g;
            v[e] -= cfg.lr * st[e];
            break;
          case OptimizerKind::nesterov:
            st[e] = cfg.momentum * st[e] + g;
            v[e] -= cfg.lr * (g + cfg.momentum * st[e]);
            break;
          case OptimizerKind::adagrad:
            st[e] += g * g;
            v[e] -= cfg.lr * g / (std::sqrt(st[e]) + cfg.epsilon);
            break;
          case OptimizerKind::adam:
          case OptimizerKind::lazy_adam: {
            float& m = st[e];
            float& vv = st[dim + e];
            if (cfg.kind == OptimizerKind::lazy_adam) {
              m *= float(std::pow(double(cfg.beta1), missed));
              vv *= float(std::pow(double(cfg.beta2), missed));
            }
            m = cfg.beta1 * m + (1 - cfg.beta1) * g;
            vv = cfg.beta2 * vv + (1 - cfg.beta2) * g * g;
            v[e] -= cfg.lr * (m / bias1) / (std::sqrt(vv / bias2) + cfg.epsilon);
            break;
          }
        }
      }
      last[key] = t;
    }
  }
};

// A forward (train) and backward_and_update of the batch on the table; returns the forward's output.
std::vector<float> table_step(EmbeddingTable& t, const StepBatch& b) {
  const Device& dev = t.device();
  int64_t nnz = int64_t(b.keys.size());
  Buffer<int64_t> o(dev, b.offsets), k(dev, std::max<size_t>(b.keys.size(), 1)), rows(dev, std::max<int64_t>(nnz, 1));
  if (nnz) k.upload(b.keys);
  Buffer<float> out(dev, size_t(b.bags()) * t.dim()), grad(dev, b.grad);
  out.fill_bytes(0xFF);
  rows.fill_bytes(0xFF);
  t.pooled_forward(o.data(), k.data(), b.bags(), b.combiner, LookupMode::train, out.data(), OutputType::f32,
                   rows.data(), MissingKey::zeros, Check::deferred, dev.stream);
  t.backward_and_update(o.data(), rows.data(), b.bags(), nnz, grad.data(), b.combiner, b.step, dev.stream);
  t.check_lookups(MissingKey::zeros, dev.stream);
  return out.download();
}

// The table's rows by key: values and state (lazy_adam's last step as its float bits).
std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> rows_by_key(EmbeddingTable& t) {
  TableRows r = t.export_rows(t.device().stream);
  std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> m;
  for (size_t i = 0; i < r.rows(); ++i)
    m[r.keys[i]] = {std::vector<float>(r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim),
                    std::vector<float>(r.state.begin() + i * r.state_width, r.state.begin() + (i + 1) * r.state_width)};
  return m;
}

// Mismatches between the table and the model: keys, values, state (lazy_adam's last step exactly).
size_t compare_with_model(EmbeddingTable& t, const HostModel& h, const std::string& what) {
  auto got = rows_by_key(t);
  size_t bad = 0;
  if (got.size() != h.w.size()) {
    BOOST_ERROR(what << ": table holds " << got.size() << " keys, model " << h.w.size());
    return 1;
  }
  std::vector<float> gv, wv, gs, ws;
  for (const auto& [key, vs] : got) {
    auto it = h.w.find(key);
    if (it == h.w.end()) {
      BOOST_ERROR(what << ": key " << key << " not in the model");
      return 1;
    }
    gv.insert(gv.end(), vs.first.begin(), vs.first.end());
    wv.insert(wv.end(), it->second.begin(), it->second.end());
    const std::vector<float>& st = h.s.at(key);
    for (int e = 0; e < h.width; ++e) {
      if (h.cfg.kind == OptimizerKind::lazy_adam && e == 2 * h.dim) {
        int32_t step;
        std::memcpy(&step, &vs.second[e], 4);
        bad += step != h.last.at(key);
      } else {
        gs.push_back(vs.second[e]);
        ws.push_back(st[e]);
      }
    }
  }
  bad += testing::count_mismatches(gv, wv, 1e-6, 1e-5, what + " values");
  bad += testing::count_mismatches(gs, ws, 1e-6, 1e-5, what + " state");
  return bad;
}

}  // namespace

namespace {

// Several train steps per optimizer against the host model: the forward's output, every row's values and
// state, the rows updated; steps 1, 2, 3, 5, 6 (a gap: lazy_adam's missed decay).
void train_steps_match_host_model(Backend backend) {
  const int dim = 6;
  Device dev = open(backend);
  for (OptimizerKind opt : kAllOptimizers)
  for (float decay : {0.0f, 0.2f}) {
    EmbeddingTableConfig c = step_config(dim, 200, opt);
    c.optimizer.weight_decay = decay;
    EmbeddingTable t(dev, c);
    HostModel h(c, t.key_init());
    BOOST_CHECK_EQUAL(t.backward_capacity(), 0);
    int i = 0;
    for (int64_t step : {1, 2, 3, 5, 6}) {
      std::string what = strprintf("%s weight_decay %g step %lld", optimizer_name(opt), double(decay), (long long)step);
      StepBatch b = random_batch(24, 4, 40, dim, i++ % 2 ? Combiner::mean : Combiner::sum, step);
      std::vector<float> want = h.forward(b);
      BOOST_CHECK_EQUAL(testing::count_mismatches(table_step(t, b), want, 1e-6, 1e-5, what + " forward"), 0u);
      h.update(b);
      std::vector<int64_t> distinct(b.keys);
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      BOOST_CHECK_EQUAL(t.rows_updated(dev.stream), int64_t(distinct.size()));
      BOOST_CHECK_EQUAL(compare_with_model(t, h, what), 0u);
    }
    BOOST_CHECK_GE(t.backward_capacity(), 1);
    BOOST_CHECK_THROW(t.backward_and_update(nullptr, nullptr, 0, 0, nullptr, Combiner::sum, 0, dev.stream),
                      Error);  // step 0
  }
  close_device(dev);
}

// A workspace sized up front is used as is; a larger batch grows it (after the stream of the last backward is
// done with the old one); a clear() resets the optimizer state.
void workspace_sized_up_front_and_grown(Backend backend) {
  Device dev = open(backend);
  {
  EmbeddingTableConfig c = step_config(4, 100, OptimizerKind::adagrad);
  c.max_batch_keys = 16;
  EmbeddingTable t(dev, c);
  BOOST_CHECK_EQUAL(t.backward_capacity(), 16);
  HostModel h(c, t.key_init());
  StepBatch b = random_batch(10, 3, 30, 4, Combiner::sum, 1);
  b.keys.resize(std::min<size_t>(b.keys.size(), 16));
  for (auto& o : b.offsets) o = std::min<int64_t>(o, int64_t(b.keys.size()));
  h.forward(b);
  table_step(t, b);
  h.update(b);
  BOOST_CHECK_EQUAL(t.backward_capacity(), 16);
  StepBatch big = random_batch(40, 3, 30, 4, Combiner::mean, 2);
  h.forward(big);
  table_step(t, big);
  h.update(big);
  BOOST_CHECK_EQUAL(t.backward_capacity(), std::max<int64_t>(16, int64_t(big.keys.size())));
  BOOST_CHECK_EQUAL(compare_with_model(t, h, "grown workspace"), 0u);
  t.clear(dev.stream);
  HostModel fresh(c, t.key_init());
  StepBatch again = random_batch(10, 3, 30, 4, Combiner::sum, 3);
  fresh.forward(again);
  table_step(t, again);
  fresh.update(again);
  BOOST_CHECK_EQUAL(compare_with_model(t, fresh, "after clear"), 0u);
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(train_steps_match_host_model_for_every_optimizer, train_steps_match_host_model)
SPARTA_BACKEND_CASES(workspace_sized_up_front_and_grown, workspace_sized_up_front_and_grown)

// GPU and cpu tables after the same steps, per optimizer. Preloaded (both tables hold the keys in the same
// rows): the kernels promise the same bits, so values and state must be identical. Fresh (keys inserted by the
// forward, so row ids differ and a hot row's contributions may be cut into items differently): float rounding.
BOOST_AUTO_TEST_CASE(cuda_train_steps_match_cpu_table, *testing::needs_gpu()) {
  const int dim = 20;  // 20: the float4 path; 7: the scalar one
  for (int d : {dim, 7}) {
    for (OptimizerKind opt : kAllOptimizers) {
      for (bool preload : {true, false}) {
        std::string what = strprintf("%s dim %d %s", optimizer_name(opt), d, preload ? "preloaded" : "fresh");
        Device cdev = open(Backend::cpu), gdev = open(Backend::cuda);
        {
          EmbeddingTableConfig c = step_config(d, 5000, opt);
          EmbeddingTable ct(cdev, c), gt(gdev, c);
          const int64_t universe = 3000;
          if (preload) {
            TableRows r;
            r.name = c.name;
            r.dim = d;
            r.optimizer = optimizer_name(opt);
            r.state_width = optimizer_state_width(opt, d);
            for (int64_t k = 0; k < universe; ++k) r.keys.push_back(k);
            r.values = testing::random_floats(size_t(universe) * d);
            r.state = testing::random_floats(size_t(universe) * r.state_width, 0.f, 1.f);  // v, accumulators >= 0
            if (opt == OptimizerKind::lazy_adam)
              for (int64_t k = 0; k < universe; ++k) std::memset(&r.state[k * r.state_width + 2 * d], 0, 4);
            ct.load_rows(r, cdev.stream);
            gt.load_rows(r, gdev.stream);
          }
          const double tol = preload ? 0 : 1e-5;
          int i = 0;
          for (int64_t step : {1, 2, 4, 5}) {
            // 2048 bags of up to 6 keys over 3000 keys, squared: key 0 alone comes ~500 times (many items).
            StepBatch b = random_batch(2048, 6, universe, d, i++ % 2 ? Combiner::mean : Combiner::sum, step);
            std::vector<float> co = table_step(ct, b), go = table_step(gt, b);
            BOOST_CHECK_EQUAL(testing::count_mismatches(go, co, tol, tol, what + " forward"), 0u);
            BOOST_CHECK_EQUAL(gt.rows_updated(gdev.stream), ct.rows_updated(cdev.stream));
          }
          auto cr = rows_by_key(ct), gr = rows_by_key(gt);
          BOOST_CHECK_EQUAL(cr.size(), gr.size());
          std::vector<float> cv, gv, cs, gs;
          for (const auto& [key, vs] : cr) {
            auto it = gr.find(key);
            if (it == gr.end()) {
              BOOST_ERROR(what << ": key " << key << " missing on the GPU");
              continue;
            }
            cv.insert(cv.end(), vs.first.begin(), vs.first.end());
            gv.insert(gv.end(), it->second.first.begin(), it->second.first.end());
            cs.insert(cs.end(), vs.second.begin(), vs.second.end());
            gs.insert(gs.end(), it->second.second.begin(), it->second.second.end());
          }
          BOOST_CHECK_EQUAL(testing::count_mismatches(gv, cv, tol, tol, what + " values"), 0u);
          BOOST_CHECK_EQUAL(testing::count_mismatches(gs, cs, tol, tol, what + " state"), 0u);
        }
        close_device(gdev);
        close_device(cdev);
      }
    }
  }
}

// ---- row gradients in two parts ----

namespace {

// prepare_row_gradients then finish_row_gradients (the gradient uploaded between them) gives row_gradients'
// bits; a finish with no prepare before it is refused, naming the table.
void row_gradients_in_two_parts(Backend backend) {
  Device dev = open(backend);
  for (int dim : {1, 20, 128}) {
    for (Combiner comb : {Combiner::sum, Combiner::mean}) {
      BOOST_TEST_CONTEXT("dim " << dim << " " << combiner_name(comb)) {
        EmbeddingTable t(dev, step_config(dim, 5000, OptimizerKind::adam));
        // 2048 bags of up to 6 keys over 3000 keys, squared: key 0 alone comes ~500 times (many items).
        StepBatch b = random_batch(2048, 6, 3000, dim, comb, 1);
        const int64_t nnz = int64_t(b.keys.size());
        Buffer<int64_t> o(dev, b.offsets), k(dev, b.keys), rows(dev, size_t(nnz));
        Buffer<float> out(dev, size_t(b.bags()) * dim), grad(dev, b.grad);
        t.pooled_forward(o.data(), k.data(), b.bags(), comb, LookupMode::train, out.data(), OutputType::f32,
                         rows.data(), MissingKey::zeros, Check::now, dev.stream);
        Buffer<int64_t> want_keys(dev, size_t(nnz)), got_keys(dev, size_t(nnz));
        Buffer<float> want_grads(dev, size_t(nnz) * dim), got_grads(dev, size_t(nnz) * dim);
        Buffer<int32_t> want_n(dev, 1), got_n(dev, 1);
        for (auto* p : {&want_keys, &got_keys}) p->fill_bytes(0xFF);
        for (auto* p : {&want_grads, &got_grads}) p->fill_bytes(0xFF);
        for (auto* p : {&want_n, &got_n}) p->fill_bytes(0xFF);
        t.row_gradients(o.data(), k.data(), rows.data(), b.bags(), nnz, grad.data(), comb, want_keys.data(),
                        want_grads.data(), want_n.data(), dev.stream);
        const int64_t n = read_count(dev, want_n.data(), dev.stream);
        BOOST_CHECK_GT(n, 0);

        grad.fill_bytes(0xFF);  // the gradient arrives after the prepare
        t.prepare_row_gradients(o.data(), k.data(), rows.data(), b.bags(), nnz, comb, got_keys.data(), got_n.data(),
                                dev.stream);
        BOOST_CHECK_EQUAL(read_count(dev, got_n.data(), dev.stream), n);
        BOOST_CHECK(got_keys.download() == want_keys.download());
        grad.upload(b.grad);
        t.finish_row_gradients(grad.data(), got_grads.data(), dev.stream);
        BOOST_CHECK_EQUAL(read_count(dev, got_n.data(), dev.stream), n);
        BOOST_CHECK(got_keys.download() == want_keys.download());
        const std::vector<float> g = got_grads.download(), w = want_grads.download();
        BOOST_REQUIRE_EQUAL(g.size(), w.size());
        size_t differ = 0, unwritten = 0;
        for (size_t i = 0; i < g.size(); ++i) differ += std::memcmp(&g[i], &w[i], sizeof(float)) != 0;
        for (size_t i = 0; i < size_t(n) * dim; ++i) unwritten += std::isnan(g[i]);
        BOOST_CHECK_EQUAL(differ, 0u);
        BOOST_CHECK_EQUAL(unwritten, 0u);

        // used up; replaced by row_gradients and by backward_and_update
        auto refused = [&](const char* what) {
          try {
            t.finish_row_gradients(grad.data(), got_grads.data(), dev.stream);
            BOOST_ERROR("finish_row_gradients " << what << " ran");
          } catch (const Error& e) {
            const std::string m = e.what();
            BOOST_CHECK_MESSAGE(m.find("'ads'") != std::string::npos && m.find("no prepared batch") != std::string::npos,
                                m);
          }
        };
        refused("after its finish");
        t.prepare_row_gradients(o.data(), k.data(), rows.data(), b.bags(), nnz, comb, got_keys.data(), got_n.data(),
                                dev.stream);
        t.row_gradients(o.data(), k.data(), rows.data(), b.bags(), nnz, grad.data(), comb, want_keys.data(),
                        want_grads.data(), want_n.data(), dev.stream);
        refused("after a row_gradients");
        t.prepare_row_gradients(o.data(), k.data(), rows.data(), b.bags(), nnz, comb, got_keys.data(), got_n.data(),
                                dev.stream);
        t.backward_and_update(o.data(), rows.data(), b.bags(), nnz, grad.data(), comb, 1, dev.stream);
        refused("after a backward_and_update");
        synchronize(dev);
      }
    }
  }
  {
    EmbeddingTable fresh(dev, config(4, 100, OptimizerKind::sgd));
    Buffer<float> g(dev, 4);
    BOOST_CHECK_THROW(fresh.finish_row_gradients(g.data(), g.data(), dev.stream), Error);  // no workspace yet
  }
  close_device(dev);
}

// A table whose bags are laid out in a wider output (BagLayout: a collection's group of some of its slots): the
// pooled forward writes each bag at its place and nothing else of the output (NaN-poisoned), and the backward
// reads each bag's gradient there (the rest NaN, which would spread into the rows): the same bits as a twin table
// fed [bags, dim], for the sorted update, the two-part row gradients and sgd's atomic update (the same values; its
// order of adds differs between runs on the GPU, so within rounding there). Columns multiples of 4 or not.
void bags_laid_out_in_a_wider_output(Backend backend) {
  Device dev = open(backend);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int dim : {4, 6, 128}) {
    for (Combiner comb : {Combiner::sum, Combiner::mean}) {
      for (bool atomic : {false, true}) {
        BOOST_TEST_CONTEXT("dim " << dim << " " << combiner_name(comb) << (atomic ? " atomic sgd" : " adam")) {
          const int slots = 3;
          const int64_t batch = 700, bags = batch * slots;
          const int64_t row = 4 * dim + 8;
          const std::vector<int32_t> cols_h = {2 * dim + 8, 0, dim + 4};  // slot j's column in a row
          Buffer<int32_t> cols(dev, cols_h);
          const BagLayout layout{row, cols.data(), slots, dim % 4 == 0};
          auto at = [&](int64_t b) { return (b / slots) * row + cols_h[size_t(b % slots)]; };
          EmbeddingTableConfig c = step_config(dim, 5000, atomic ? OptimizerKind::sgd : OptimizerKind::adam);
          c.optimizer.atomic_update = atomic;
          EmbeddingTable plain(dev, c), laid(dev, c);
          StepBatch b = random_batch(bags, 5, 3000, dim, comb, 1);
          const int64_t nnz = int64_t(b.keys.size());
          Buffer<int64_t> o(dev, b.offsets), k(dev, b.keys), rows_p(dev, size_t(nnz)), rows_l(dev, size_t(nnz));
          Buffer<float> out_p(dev, size_t(bags) * dim), out_l(dev, size_t(batch * row));
          out_l.upload(std::vector<float>(size_t(batch * row), nan));
          plain.pooled_forward(o.data(), k.data(), bags, comb, LookupMode::train, out_p.data(), OutputType::f32,
                               rows_p.data(), MissingKey::zeros, Check::now, dev.stream);
          laid.pooled_forward(o.data(), k.data(), bags, comb, LookupMode::train, out_l.data(), OutputType::f32,
                              rows_l.data(), MissingKey::zeros, Check::now, dev.stream, layout);
          const std::vector<float> p = out_p.download(), l = out_l.download();
          std::vector<float> grad_l(size_t(batch * row), nan);
          std::vector<bool> placed(grad_l.size(), false);
          size_t differ = 0;
          for (int64_t x = 0; x < bags; ++x)
            for (int e = 0; e < dim; ++e) {
              const size_t i = size_t(at(x) + e), j = size_t(x * dim + e);
              differ += std::memcmp(&l[i], &p[j], sizeof(float)) != 0;
              grad_l[i] = b.grad[j];
              placed[i] = true;
            }
          size_t touched = 0;
          for (size_t i = 0; i < l.size(); ++i) touched += !placed[i] && !std::isnan(l[i]);
          BOOST_CHECK_EQUAL(differ, 0u);
          BOOST_CHECK_EQUAL(touched, 0u);
          Buffer<float> g_p(dev, b.grad), g_l(dev, grad_l);
          if (!atomic) {  // the row gradients in two parts
            Buffer<int64_t> keys_p(dev, size_t(nnz)), keys_l(dev, size_t(nnz));
            Buffer<float> rg_p(dev, size_t(nnz) * dim), rg_l(dev, size_t(nnz) * dim);
            Buffer<int32_t> n_p(dev, 1), n_l(dev, 1);
            plain.prepare_row_gradients(o.data(), k.data(), rows_p.data(), bags, nnz, comb, keys_p.data(), n_p.data(),
                                        dev.stream);
            laid.prepare_row_gradients(o.data(), k.data(), rows_l.data(), bags, nnz, comb, keys_l.data(), n_l.data(),
                                       dev.stream);
            plain.finish_row_gradients(g_p.data(), rg_p.data(), dev.stream);
            laid.finish_row_gradients(g_l.data(), rg_l.data(), dev.stream, layout);
            const int64_t n = read_count(dev, n_p.data(), dev.stream);
            BOOST_REQUIRE_EQUAL(read_count(dev, n_l.data(), dev.stream), n);
            // by key: the twins' rows (the order of the sums) differ where the GPU inserted keys in another order
            const std::vector<float> a = rg_p.download(), z = rg_l.download();
            const std::vector<int64_t> ka = keys_p.download(), kz = keys_l.download();
            std::map<int64_t, size_t> where;
            for (int64_t u = 0; u < n; ++u) where[kz[size_t(u)]] = size_t(u);
            size_t sums_differ = 0;
            for (int64_t u = 0; u < n; ++u) {
              const auto it = where.find(ka[size_t(u)]);
              sums_differ += it == where.end() ||
                             std::memcmp(&a[size_t(u) * dim], &z[it->second * dim], sizeof(float) * dim) != 0;
            }
            BOOST_CHECK_EQUAL(sums_differ, 0u);
          }
          plain.backward_and_update(o.data(), rows_p.data(), bags, nnz, g_p.data(), comb, 1, 1.0f, dev.stream);
          laid.backward_and_update(o.data(), rows_l.data(), bags, nnz, g_l.data(), comb, 1, 1.0f, dev.stream, layout);
          const auto rp = rows_by_key(plain), rl = rows_by_key(laid);
          BOOST_REQUIRE_EQUAL(rp.size(), rl.size());
          size_t bad = 0;
          for (const auto& kv : rp) {
            const auto it = rl.find(kv.first);
            if (it == rl.end()) {
              ++bad;
              continue;
            }
            const std::vector<float>& v = kv.second.first;
            const std::vector<float>& w = it->second.first;
            for (size_t e = 0; e < v.size(); ++e) {
              const bool exact = !atomic || backend == Backend::cpu;
              bad += exact ? std::memcmp(&v[e], &w[e], sizeof(float)) != 0
                           : !(std::fabs(v[e] - w[e]) <= 1e-5f * (1 + std::fabs(v[e])));
            }
            bad += kv.second.second != it->second.second;
          }
          BOOST_CHECK_EQUAL(bad, 0u);
        }
      }
    }
  }
  // a layout without its columns is an error naming it, before anything runs
  EmbeddingTable t(dev, step_config(4, 100, OptimizerKind::sgd));
  Buffer<int64_t> o(dev, std::vector<int64_t>{0, 1}), k(dev, std::vector<int64_t>{7}), r(dev, 1);
  Buffer<float> out(dev, 8);
  BOOST_CHECK_EXCEPTION(t.pooled_forward(o.data(), k.data(), 1, Combiner::sum, LookupMode::train, out.data(),
                                         OutputType::f32, r.data(), MissingKey::zeros, Check::now, dev.stream,
                                         BagLayout{8, nullptr, 1, true}),
                        Error,
                        [](const Error& e) { return std::string(e.what()).find("bag layout") != std::string::npos; });
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(row_gradients_in_two_parts_equal_row_gradients, row_gradients_in_two_parts)
SPARTA_BACKEND_CASES(bags_laid_out_in_a_wider_output_are_read_and_written_in_place, bags_laid_out_in_a_wider_output)

// ---- limits ----

namespace {

// e.what() names the table, the setting, the limit and the value found.
void check_limit_error(const std::function<void()>& f, const std::string& setting, int64_t limit, int64_t found) {
  try {
    f();
    BOOST_ERROR("no error for " << setting << " = " << found);
  } catch (const Error& e) {
    std::string m = e.what();
    BOOST_TEST_MESSAGE(m);
    BOOST_CHECK_MESSAGE(m.find("'ads'") != std::string::npos, m);
    BOOST_CHECK_MESSAGE(m.find(setting) != std::string::npos, m);
    BOOST_CHECK_MESSAGE(m.find(std::to_string(limit)) != std::string::npos, m);
    BOOST_CHECK_MESSAGE(m.find(std::to_string(found)) != std::string::npos, m);
  }
}

}  // namespace

// The backward's limits (kernels/embedding_backward.h: rows sorted as uint32, keys counted in int32) are
// checked when the table is built, before anything is allocated: the first table below would take 4 TiB of
// values (and 64 GiB of hash slots), so an allocation before the check would end the test.
BOOST_AUTO_TEST_CASE(limits_are_checked_when_the_table_is_built) {
  BOOST_CHECK_EQUAL(kBackwardMaxRows, 4294967294LL);  // 2^32 - 2: capacity_rows itself is a sort key
  BOOST_CHECK_EQUAL(kBackwardMaxKeys, 2147483646LL);  // 2^31 - 2
  Device dev;
  EmbeddingTableConfig c = config(256, kBackwardMaxRows + 1, OptimizerKind::sgd);
  c.max_load_factor = 1.0;
  check_limit_error([&] { EmbeddingTable t(dev, c); }, "capacity_rows", kBackwardMaxRows, kBackwardMaxRows + 1);
  c = config(4, 100, OptimizerKind::sgd);
  c.max_batch_keys = kBackwardMaxKeys + 1;
  check_limit_error([&] { EmbeddingTable t(dev, c); }, "max_batch_keys", kBackwardMaxKeys, kBackwardMaxKeys + 1);
  c.max_batch_keys = -1;
  BOOST_CHECK_THROW(EmbeddingTable(dev, c), Error);
}

// Every call that takes a key count checks it against the backward's limit at its entry, before it grows the
// workspace or inserts anything.
void keys_per_call_limits(Backend b) {
  Device dev = open(b);
  {
    EmbeddingTable t(dev, config(4, 100, OptimizerKind::sgd));
    const int64_t over = kBackwardMaxKeys + 1;
    check_limit_error([&] { t.backward_and_update(nullptr, nullptr, 1, over, nullptr, Combiner::sum, 1, dev.stream); },
                      "keys", kBackwardMaxKeys, over);
    check_limit_error([&] { t.backward_and_update(nullptr, nullptr, over, 0, nullptr, Combiner::sum, 1, dev.stream); },
                      "bags", kBackwardMaxKeys, over);
    BOOST_CHECK_EQUAL(t.backward_capacity(), 0);  // nothing grew
    check_limit_error(
        [&] {
          t.unpooled_forward(nullptr, over, LookupMode::train, nullptr, OutputType::f32, nullptr, MissingKey::zeros,
                             Check::now, dev.stream);
        },
        "keys", kBackwardMaxKeys, over);
    check_limit_error(
        [&] {
          t.pooled_forward(nullptr, nullptr, over, Combiner::sum, LookupMode::train, nullptr, OutputType::f32, nullptr,
                           MissingKey::zeros, Check::now, dev.stream);
        },
        "bags", kBackwardMaxKeys, over);
    BOOST_CHECK_EQUAL(t.size(dev.stream), 0);  // nothing inserted
  }
  close_device(dev);
}
SPARTA_BACKEND_CASES(keys_per_call_limits_are_checked_at_entry, keys_per_call_limits)
