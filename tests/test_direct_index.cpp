// EmbeddingTable with a direct index (kernels/hash_table.h DirectIndex): the same batches through a hashed table
// and a direct one give the same forward bits, the same rows updated and the same rows by key after every
// optimizer's steps (both sum a bag's keys in key order and a row's gradients in the backward's fixed order, and
// a row's initial values are a function of its key); the pooled forward of every dim and output type; keys
// outside the index (refused in train, zeros in eval, errors naming the index); every row exists from the start;
// export / load (by key, across index kinds); clear; the config's checks.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "src/base/buffer.h"
#include "src/embedding_table.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

Device open(Backend b) { return open_device(b, b == Backend::cuda ? 0 : -1); }

EmbeddingTableConfig config(int dim, int64_t rows, OptimizerKind opt, int64_t stride, int64_t offset) {
  EmbeddingTableConfig c;
  c.name = "clicks";
  c.table_id = 3;
  c.dim = dim;
  c.capacity_rows = rows;
  c.seed = testing::seed();
  c.init_scale = 0.1f;
  c.optimizer.kind = opt;
  c.optimizer.lr = 0.05f;
  c.optimizer.initial_accumulator = 0.125f;
  c.direct_stride = stride;
  c.direct_offset = offset;
  return c;
}

// CSR bags of 0..max_hot keys offset + stride * u, u < universe (squared uniform: low u are hot), and an upstream
// gradient.
struct Batch {
  std::vector<int64_t> offsets{0}, keys;
  std::vector<float> grad;
  int64_t bags() const { return int64_t(offsets.size()) - 1; }
};

Batch random_batch(int64_t bags, int max_hot, int64_t universe, int64_t stride, int64_t offset, int dim) {
  Batch b;
  for (int64_t h : testing::random_ints(size_t(bags), 0, max_hot)) {
    for (float u : testing::random_floats(size_t(h), 0.f, 1.f))
      b.keys.push_back(offset + stride * (int64_t(double(u) * u * double(universe)) % universe));
    b.offsets.push_back(int64_t(b.keys.size()));
  }
  b.grad = testing::random_floats(size_t(bags) * dim);
  return b;
}

struct Lookup {
  std::vector<float> out;
  std::vector<int64_t> rows;
};

// A pooled forward of the batch (out poisoned first), then in train mode a backward_and_update at `step`.
Lookup forward(EmbeddingTable& t, const Batch& b, LookupMode mode, Combiner comb, OutputType ot, int64_t step,
               MissingKey missing = MissingKey::zeros) {
  const Device& dev = t.device();
  const int64_t nnz = int64_t(b.keys.size());
  Buffer<int64_t> o(dev, b.offsets), k(dev, size_t(std::max<int64_t>(nnz, 1))), rows(dev, size_t(std::max<int64_t>(nnz, 1)));
  if (nnz) k.upload(b.keys);
  const size_t ob = output_type_bytes(ot);
  Buffer<uint8_t> out(dev, size_t(b.bags()) * t.dim() * ob);
  out.fill_bytes(0xFF);
  rows.fill_bytes(0xFF);
  t.pooled_forward(o.data(), k.data(), b.bags(), comb, mode, out.data(), ot, rows.data(), missing, Check::deferred,
                   dev.stream);
  if (mode == LookupMode::train) {
    Buffer<float> grad(dev, b.grad);
    t.backward_and_update(o.data(), rows.data(), b.bags(), nnz, grad.data(), comb, step, dev.stream);
    t.check_lookups(missing, dev.stream);
  } else {
    t.check_lookups(missing, dev.stream);
  }
  std::vector<uint8_t> bytes = out.download();
  Lookup l;
  if (ot == OutputType::f32) {
    l.out.resize(bytes.size() / 4);
    std::memcpy(l.out.data(), bytes.data(), bytes.size());
  } else {  // 16-bit outputs compared as their bits
    for (size_t i = 0; i < bytes.size(); i += 2) l.out.push_back(float(bytes[i] | (bytes[i + 1] << 8)));
  }
  l.rows = rows.download();
  l.rows.resize(size_t(nnz));
  return l;
}

using Rows = std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>;

Rows rows_by_key(EmbeddingTable& t) {
  TableRows r = t.export_rows(t.device().stream);
  Rows m;
  for (size_t i = 0; i < r.rows(); ++i)
    m[r.keys[i]] = {std::vector<float>(r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim),
                    std::vector<float>(r.state.begin() + i * r.state_width, r.state.begin() + (i + 1) * r.state_width)};
  return m;
}

std::vector<float> initial_row(const EmbeddingTable& t, int64_t key) {
  std::vector<float> v;
  for (int e = 0; e < t.dim(); ++e) v.push_back(initial_value(t.key_init(), uint64_t(key), e));
  return v;
}

// Every direct row is either a hashed row of the same key, bit for bit, or (a key the hashed table never saw)
// its initial values with the initial state; and the direct table lists exactly its keys.
size_t compare_tables(EmbeddingTable& hashed, EmbeddingTable& direct, int64_t stride, int64_t offset,
                      const std::string& what) {
  Rows h = rows_by_key(hashed), d = rows_by_key(direct);
  size_t bad = 0;
  if (int64_t(d.size()) != direct.capacity_rows()) {
    BOOST_ERROR(what << ": the direct table lists " << d.size() << " rows, not " << direct.capacity_rows());
    return 1;
  }
  const float state0 = direct.config().optimizer.kind == OptimizerKind::adagrad ? 0.125f : 0.f;
  for (int64_t r = 0; r < direct.capacity_rows(); ++r) {
    const int64_t key = offset + r * stride;
    auto it = d.find(key);
    if (it == d.end()) {
      BOOST_ERROR(what << ": key " << key << " of row " << r << " missing from the direct export");
      return bad + 1;
    }
    auto hit = h.find(key);
    if (hit != h.end()) {
      bad += it->second != hit->second;
    } else {
      bad += it->second.first != initial_row(direct, key);
      for (float s : it->second.second) bad += s != state0;
    }
  }
  for (const auto& kv : h) bad += d.count(kv.first) == 0;  // a hashed key the direct index cannot hold
  if (bad) BOOST_ERROR(what << ": " << bad << " rows differ");
  return bad;
}

// The same steps through both kinds of index, for several optimizers and index shapes.
void trains_like_the_hashed_table(Backend backend) {
  Device dev = open(backend);
  const int dim = 6;
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::lazy_adam})
    for (auto [stride, offset] : {std::pair<int64_t, int64_t>{1, 0}, {3, 2}, {4, 0}, {1, 37}, {2, 5}}) {
      const int64_t rows = 50;
      EmbeddingTable hashed(dev, config(dim, rows, opt, 0, 0)), direct(dev, config(dim, rows, opt, stride, offset));
      const std::string what = strprintf("%s, stride %lld, offset %lld", optimizer_name(opt), (long long)stride,
                                         (long long)offset);
      for (int64_t step = 1; step <= 4; ++step) {
        const Combiner comb = step % 2 ? Combiner::sum : Combiner::mean;
        Batch b = random_batch(30, 5, rows, stride, offset, dim);
        Lookup h = forward(hashed, b, LookupMode::train, comb, OutputType::f32, step);
        Lookup d = forward(direct, b, LookupMode::train, comb, OutputType::f32, step);
        BOOST_TEST(d.out == h.out, what << " step " << step << ": forward bits");
        for (size_t i = 0; i < b.keys.size(); ++i)
          BOOST_TEST(d.rows[i] == (b.keys[i] - offset) / stride, what << ": row of key " << b.keys[i]);
        BOOST_TEST(direct.rows_updated(dev.stream) == hashed.rows_updated(dev.stream));
        BOOST_TEST(compare_tables(hashed, direct, stride, offset, what) == 0u);
      }
      BOOST_TEST(direct.size(dev.stream) == rows);
    }
  close_device(dev);
}

// The fused forward of every dim class (scalar and float4 lanes, 1 to 8 chunks) and output type, train and eval,
// multi-hot: the direct table's bits are the hashed table's.
void forward_of_every_shape(Backend backend) {
  Device dev = open(backend);
  // dims 4-16 (multiples of 4) take the cuda backend's 4-lane kernel of direct tables, the others its 8-lane one
  for (int dim : {1, 4, 6, 8, 12, 16, 32, 64, 128, 256})
    for (OutputType ot : {OutputType::f32, OutputType::bf16, OutputType::f16})
      for (Combiner comb : {Combiner::sum, Combiner::mean}) {
        const int64_t rows = 300;
        EmbeddingTable hashed(dev, config(dim, rows, OptimizerKind::sgd, 0, 0)),
            direct(dev, config(dim, rows, OptimizerKind::sgd, 2, 1));
        Batch b = random_batch(41, 19, rows, 2, 1, dim);  // bags of 0-19 keys: batches of 8 keys cross bags
        for (LookupMode mode : {LookupMode::train, LookupMode::eval}) {
          Lookup h = forward(hashed, b, mode, comb, ot, 1), d = forward(direct, b, mode, comb, ot, 1);
          const std::string what = "dim " + std::to_string(dim) + " " + output_type_name(ot) + " " +
                                   combiner_name(comb) + " " + lookup_mode_name(mode);
          BOOST_TEST(d.out == h.out, what);
          std::vector<int64_t> want_rows;
          for (int64_t k : b.keys) want_rows.push_back((k - 1) / 2);
          BOOST_TEST(d.rows == want_rows, what);
        }
        if (ot != OutputType::f32) continue;
        // unpooled: one vector per key
        const size_t n = b.keys.size();
        Buffer<int64_t> k(dev, b.keys), rh(dev, n), rd(dev, n);
        Buffer<float> oh(dev, n * dim), od(dev, n * dim);
        oh.fill_bytes(0xFF);
        od.fill_bytes(0xFF);
        hashed.unpooled_forward(k.data(), int64_t(n), LookupMode::eval, oh.data(), ot, rh.data(), MissingKey::zeros,
                                Check::now, dev.stream);
        direct.unpooled_forward(k.data(), int64_t(n), LookupMode::eval, od.data(), ot, rd.data(), MissingKey::zeros,
                                Check::now, dev.stream);
        BOOST_TEST(od.download() == oh.download(), "unpooled dim " << dim);
      }
  close_device(dev);
}

// Every row exists from the start: an eval lookup of an untrained key gives its initial values. Keys outside the
// index: train refuses them (row -1, zeros, an error at the check naming the index, the other keys' rows kept),
// eval gives zeros (an error only with MissingKey::error).
void keys_outside_the_index(Backend backend) {
  Device dev = open(backend);
  const int dim = 4;
  EmbeddingTable t(dev, config(dim, 10, OptimizerKind::sgd, 3, 1));  // keys 1, 4, ..., 28
  Batch b;
  b.keys = {7, 28};
  b.offsets = {0, 1, 2};
  b.grad.assign(2 * dim, 0.f);
  Lookup e = forward(t, b, LookupMode::eval, Combiner::sum, OutputType::f32, 1, MissingKey::error);
  std::vector<float> want = initial_row(t, 7), w28 = initial_row(t, 28);
  want.insert(want.end(), w28.begin(), w28.end());
  BOOST_TEST(e.out == want);
  BOOST_TEST(e.rows == (std::vector<int64_t>{2, 9}));
  for (int64_t bad : std::vector<int64_t>{0, 2, 31, -2, int64_t(1) << 62}) {
    Batch x;
    x.keys = {4, bad};
    x.offsets = {0, 1, 2};
    x.grad = testing::random_floats(2 * dim);
    const std::vector<float> before = initial_row(t, 4);
    try {
      forward(t, x, LookupMode::train, Combiner::sum, OutputType::f32, 1);
      BOOST_ERROR("train lookup of key " << bad << " outside the index: no error");
    } catch (const Error& err) {
      const std::string m = err.what();
      BOOST_TEST((m.find("clicks") != std::string::npos && m.find("direct index") != std::string::npos &&
                  m.find("1 keys outside") != std::string::npos),
                 m);
    }
    Lookup z = forward(t, x, LookupMode::eval, Combiner::sum, OutputType::f32, 1);
    BOOST_TEST(z.rows[1] == -1);
    BOOST_TEST(std::vector<float>(z.out.begin() + dim, z.out.end()) == std::vector<float>(dim, 0.f));
    BOOST_CHECK_THROW(forward(t, x, LookupMode::eval, Combiner::sum, OutputType::f32, 1, MissingKey::error), Error);
    // the refused step still updated key 4 (the backward skips row -1 only)
    BOOST_TEST(rows_by_key(t)[4].first != before);
    t.clear(dev.stream);
    BOOST_TEST(rows_by_key(t)[4].first == before);
  }
  close_device(dev);
}

// Export lists every row; load writes rows by key (from a direct or a hashed table), and a key outside the index
// is an error that writes nothing.
void export_and_load_by_key(Backend backend) {
  Device dev = open(backend);
  const int dim = 5;
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adam}) {
    EmbeddingTable a(dev, config(dim, 40, opt, 2, 0)), hashed(dev, config(dim, 40, opt, 0, 0));
    for (int64_t step = 1; step <= 3; ++step) {
      Batch b = random_batch(20, 4, 40, 2, 0, dim);
      forward(a, b, LookupMode::train, Combiner::sum, OutputType::f32, step);
      forward(hashed, b, LookupMode::train, Combiner::sum, OutputType::f32, step);
    }
    TableRows all = a.export_rows(dev.stream);
    BOOST_TEST(all.rows() == 40u);
    for (size_t r = 0; r < all.rows(); ++r) BOOST_TEST(all.keys[r] == int64_t(2 * r));
    EmbeddingTable b(dev, config(dim, 40, opt, 2, 0));
    b.load_rows(all, dev.stream);
    BOOST_TEST(rows_by_key(b) == rows_by_key(a));
    // a hashed table's rows (its trained keys only) into a fresh direct table: the same model
    EmbeddingTable c(dev, config(dim, 40, opt, 2, 0));
    c.load_rows(hashed.export_rows(dev.stream), dev.stream);
    BOOST_TEST(compare_tables(hashed, c, 2, 0, "hashed rows loaded into a direct table") == 0u);
    BOOST_TEST(rows_by_key(c) == rows_by_key(a));
    // and the direct rows into a hashed table of the same capacity
    EmbeddingTable h2(dev, config(dim, 40, opt, 0, 0));
    h2.load_rows(all, dev.stream);
    BOOST_TEST(rows_by_key(h2) == rows_by_key(a));
    // a key outside the index: an error naming the index, nothing written
    TableRows odd = all;
    odd.keys[3] = 7;
    for (float& v : odd.values) v = 9.f;
    const Rows before = rows_by_key(b);
    try {
      b.load_rows(odd, dev.stream);
      BOOST_ERROR("load of key 7 into a direct index of even keys: no error");
    } catch (const Error& err) {
      BOOST_TEST(std::string(err.what()).find("direct index") != std::string::npos, err.what());
    }
    BOOST_TEST(rows_by_key(b) == before);
  }
  close_device(dev);
}

}  // namespace

SPARTA_BACKEND_CASES(direct_table_trains_like_the_hashed_table, trains_like_the_hashed_table)
SPARTA_BACKEND_CASES(direct_forward_of_every_dim_and_output_type, forward_of_every_shape)
SPARTA_BACKEND_CASES(keys_outside_the_index_are_refused_or_zeros, keys_outside_the_index)
SPARTA_BACKEND_CASES(export_lists_every_row_and_load_writes_by_key, export_and_load_by_key)

BOOST_AUTO_TEST_CASE(direct_index_settings_are_checked) {
  BOOST_CHECK_EQUAL(EmbeddingTable::memory_bytes(1000, 16, OptimizerKind::sgd, 0.5, true), 64 + 1000 * 16 * 4);
  auto throws_naming = [](EmbeddingTableConfig c, const std::string& part) {
    try {
      EmbeddingTable t(Device(), c);
      BOOST_ERROR("no error for " << part);
    } catch (const Error& e) {
      const std::string m = e.what();
      BOOST_TEST((m.find("clicks") != std::string::npos && m.find(part) != std::string::npos), m);
    }
  };
  throws_naming(config(4, 10, OptimizerKind::sgd, 3, -1), "offset");
  throws_naming(config(4, 10, OptimizerKind::sgd, -1, 0), "direct_stride");
  EmbeddingTableConfig tagged = config(4, 10, OptimizerKind::sgd, 1, 0);
  tagged.tagged_keys = true;
  throws_naming(tagged, "tagged");
  throws_naming(config(4, int64_t(1) << 31, OptimizerKind::sgd, int64_t(1) << 33, 0), "largest int64 key");
  EmbeddingTableConfig seg = config(4, 10, OptimizerKind::sgd, 1, 0);
  seg.key_segments = {{0, 1}, {5, 2}, {5, 3}};
  throws_naming(seg, "segment 2 begins at key 5");
  seg.key_segments = {{1, 1}};
  throws_naming(seg, "segment 0 begins at key 1");
  seg = config(4, 10, OptimizerKind::sgd, 0, 0);
  seg.key_segments = {{0, 1}};
  seg.tagged_keys = true;
  throws_naming(seg, "key_segments and tagged_keys");
}

// Several tables' keys end to end (key_segments), hashed and direct (stride 2, offset 1): a row's initial values
// are those of its segment's table at the key within the segment, computed here with that table's own KeyInit.
void segments_give_each_table_its_initial_values(Backend backend) {
  Device dev = open(backend);
  const std::vector<KeySegment> segs = {{0, 5}, {10, 9}, {11, 0}, {25, 2}};
  for (int64_t stride : {0, 2}) {
    EmbeddingTableConfig c = config(6, 30, OptimizerKind::adagrad, stride, stride ? 1 : 0);
    c.key_segments = segs;
    EmbeddingTable t(dev, c);
    std::vector<int64_t> keys;
    for (int64_t k = 1; k < 61; k += 2) keys.push_back(k);  // the direct table's keys; the hashed table inserts them
    Buffer<int64_t> k(dev, keys), rows(dev, keys.size());
    if (!stride) t.insert_rows(k.data(), int64_t(keys.size()), rows.data(), dev.stream);
    t.check_lookups(MissingKey::zeros, dev.stream);
    Rows got = rows_by_key(t);
    BOOST_TEST(got.size() == keys.size());
    size_t bad = 0;
    for (int64_t key : keys) {
      size_t i = segs.size() - 1;
      while (segs[i].key_begin > key) --i;
      KeyInit own{c.seed, uint32_t(segs[i].table_id), c.init_scale};
      std::vector<float> want;
      for (int e = 0; e < c.dim; ++e) want.push_back(initial_value(own, uint64_t(key - segs[i].key_begin), e));
      bad += got[key].first != want;
    }
    BOOST_TEST(bad == 0u, "stride " << stride);
  }
  close_device(dev);
}
SPARTA_BACKEND_CASES(key_segments_give_each_table_its_initial_values, segments_give_each_table_its_initial_values)
