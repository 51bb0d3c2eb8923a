// The hash table (kernels/hash_table.h) and key-seeded initial values (kernels/key_init.h): CPU reference
// checked against std::unordered_map semantics, CUDA against the CPU reference (row ids may differ between
// backends and runs; keys and values by key may not).
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "src/base/buffer.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// n keys drawn from `distinct` random 64-bit keys with P(rank r) ~ 1/(r+1)^alpha (power law: many duplicates),
// plus the marker key (-1) and 0 when `specials`.
std::vector<int64_t> power_law_keys(size_t n, size_t distinct, double alpha, bool specials) {
  std::vector<int64_t> pool = testing::random_ints(distinct, INT64_MIN, INT64_MAX);
  if (specials && distinct >= 2) pool[0] = -1, pool[1] = 0;
  std::vector<double> w(distinct);
  for (size_t r = 0; r < distinct; ++r) w[r] = 1.0 / std::pow(double(r + 1), alpha);
  std::discrete_distribution<size_t> d(w.begin(), w.end());
  std::vector<int64_t> keys(n);
  for (auto& k : keys) k = pool[d(testing::rng())];
  return keys;
}

Device open(Backend b) { return open_device(b, b == Backend::cuda ? 0 : -1); }

// The table's operations on the device's own stream, where Buffer::upload/download run too (one stream: in
// order). get_insert is asynchronous: the check that turns a full table into an error is explicit.
std::vector<int64_t> get_insert(HashTable& t, const std::vector<int64_t>& keys, const RowInit& init = RowInit()) {
  Stream s = t.device().stream;
  Buffer<int64_t> k(t.device(), keys), rows(t.device(), keys.size());
  rows.fill_bytes(0x5A);  // poison
  t.get_insert(k.data(), int64_t(keys.size()), rows.data(), init, s);
  std::vector<int64_t> r = rows.download();
  t.check_errors(false, s);
  return r;
}

std::vector<int64_t> find(HashTable& t, const std::vector<int64_t>& keys) {
  Buffer<int64_t> k(t.device(), keys), rows(t.device(), keys.size());
  rows.fill_bytes(0x5A);
  t.find(k.data(), int64_t(keys.size()), rows.data(), t.device().stream);
  return rows.download();
}

int64_t size(HashTable& t) { return t.size(t.device().stream); }

// What the table must behave like: std::unordered_map from key to row. Rows are handed out densely, in an order
// the backend chooses, so a batch's new keys must get distinct rows in [size before, size after) and keys held
// before must keep theirs.
struct Model {
  std::unordered_map<int64_t, int64_t> row_of;

  // Checks the rows a get_insert gave keys against the model, then records the new keys. Returns mismatches.
  size_t get_insert(const std::vector<int64_t>& keys, const std::vector<int64_t>& rows) {
    const int64_t before = int64_t(row_of.size());
    std::set<int64_t> distinct_new;
    for (int64_t k : keys)
      if (!row_of.count(k)) distinct_new.insert(k);
    const int64_t after = before + int64_t(distinct_new.size());
    std::unordered_map<int64_t, int64_t> fresh;
    std::set<int64_t> fresh_rows;
    size_t bad = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto held = row_of.find(keys[i]);
      if (held != row_of.end()) {
        bad += rows[i] != held->second;
        continue;
      }
      auto [it, first] = fresh.emplace(keys[i], rows[i]);
      if (first) bad += rows[i] < before || rows[i] >= after || !fresh_rows.insert(rows[i]).second;
      else bad += it->second != rows[i];
    }
    for (const auto& [k, r] : fresh) row_of[k] = r;
    return bad;
  }
  int64_t find(int64_t key) const {
    auto it = row_of.find(key);
    return it == row_of.end() ? -1 : it->second;
  }
};

// Batches of get_insert (power law: duplicates within and across batches, the marker key and 0 among them),
// find and contains, against the model after every call; size and errors as the model says.
void insert_find_contains(Backend b, size_t n, size_t distinct) {
  Device dev = open(b);
  {
    HashTable t(dev, "t", 2 * int64_t(distinct) + 64, 0.5);  // both batches fit
    Model m;
    std::vector<int64_t> keys = power_law_keys(n, distinct, 1.1, true);
    BOOST_CHECK_EQUAL(m.get_insert(keys, get_insert(t, keys)), 0u);
    BOOST_CHECK_EQUAL(size(t), int64_t(std::set<int64_t>(keys.begin(), keys.end()).size()));
    // The same keys again, another order: the same rows, no new row.
    std::vector<int64_t> rev(keys.rbegin(), keys.rend());
    BOOST_CHECK_EQUAL(m.get_insert(rev, get_insert(t, rev)), 0u);
    BOOST_CHECK_EQUAL(size(t), int64_t(m.row_of.size()));
    // A second batch mixing held and new keys.
    std::vector<int64_t> more = power_law_keys(n / 2 + 1, distinct / 4 + 1, 0.7, false);
    more.insert(more.end(), keys.begin(), keys.begin() + std::min<size_t>(keys.size(), 50));
    std::shuffle(more.begin(), more.end(), testing::rng());
    BOOST_CHECK_EQUAL(m.get_insert(more, get_insert(t, more)), 0u);
    BOOST_CHECK_EQUAL(size(t), int64_t(m.row_of.size()));
    // find and contains: the model's rows; absent keys -1 / 0, counted as missing.
    std::vector<int64_t> probe = keys;
    probe.insert(probe.end(), more.begin(), more.end());
    size_t absent_count = 0;
    for (int64_t k : testing::random_ints(n / 4 + 1, INT64_MIN, INT64_MAX))
      if (!m.row_of.count(k)) probe.push_back(k), ++absent_count;
    std::vector<int64_t> f = find(t, probe);
    Buffer<int64_t> pk(dev, probe);
    Buffer<uint8_t> found(dev, probe.size());
    found.fill_bytes(0x77);
    t.contains(pk.data(), int64_t(probe.size()), found.data(), dev.stream);
    std::vector<uint8_t> c = found.download();
    size_t bad = 0;
    for (size_t i = 0; i < probe.size(); ++i) {
      int64_t want = m.find(probe[i]);
      bad += f[i] != want || c[i] != (want >= 0 ? 1 : 0);
    }
    BOOST_CHECK_EQUAL(bad, 0u);
    // find and contains each counted every absent key once.
    BOOST_CHECK_EQUAL(t.read_meta(dev.stream).missing, int64_t(2 * absent_count));
    t.check_errors(false, dev.stream);  // find counted misses; only an error when asked
    BOOST_CHECK_EQUAL(t.read_meta(dev.stream).missing, 0);
    if (absent_count > 0) {
      std::vector<int64_t> absent(probe.end() - absent_count, probe.end());
      find(t, absent);
      BOOST_CHECK_THROW(t.check_errors(true, dev.stream), Error);
    }
  }
  close_device(dev);
}

void insert_find_contains_cases(Backend b) {
  insert_find_contains(b, 1, 1);
  insert_find_contains(b, 3000, 500);
  if (b == Backend::cuda) {
    insert_find_contains(b, 1 << 20, 1000);  // power law: a few keys everywhere
    insert_find_contains(b, 1 << 20, 400000);
  }
}

// A table filled to 99% of its slots (max_load_factor 1): most keys are not in their home sector, many not in
// their first bucket, so every step of the probe (home sector, whole bucket, next buckets, wrapping at the
// end) is taken, by the bulk get_insert, find and contains, against the model.
void nearly_full_table(Backend b) {
  Device dev = open(b);
  {
    HashTable t(dev, "dense", 4096, 1.0);  // 4096 slots
    std::vector<int64_t> pool = testing::random_ints(4056, INT64_MIN, INT64_MAX);
    std::sort(pool.begin(), pool.end());
    pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
    pool.erase(std::remove(pool.begin(), pool.end(), int64_t(-1)), pool.end());
    Model m;
    for (size_t part = 0; part < 3; ++part) {  // three batches, each with its keys twice, shuffled
      std::vector<int64_t> batch(pool.begin() + part * pool.size() / 3, pool.begin() + (part + 1) * pool.size() / 3);
      batch.insert(batch.end(), batch.begin(), batch.end());
      std::shuffle(batch.begin(), batch.end(), testing::rng());
      BOOST_CHECK_EQUAL(m.get_insert(batch, get_insert(t, batch)), 0u);
    }
    BOOST_CHECK_EQUAL(size(t), int64_t(pool.size()));
    std::vector<int64_t> probe = pool;
    for (int64_t k : testing::random_ints(2000, INT64_MIN, INT64_MAX))
      if (!m.row_of.count(k)) probe.push_back(k);
    std::shuffle(probe.begin(), probe.end(), testing::rng());
    std::vector<int64_t> f = find(t, probe);
    size_t bad = 0;
    for (size_t i = 0; i < probe.size(); ++i) bad += f[i] != m.find(probe[i]);
    BOOST_CHECK_EQUAL(bad, 0u);
    t.check_errors(false, dev.stream);
    // Held keys again through get_insert: the same rows, nothing new.
    BOOST_CHECK_EQUAL(m.get_insert(pool, get_insert(t, pool)), 0u);
    BOOST_CHECK_EQUAL(size(t), int64_t(pool.size()));
  }
  close_device(dev);
}

// Fills a table past its capacity: get_insert itself does not throw (asynchronous); the check gives an Error
// naming the table, its capacity and the rows asked for; the rows handed out before stay intact.
void full_table(Backend b) {
  Device dev = open(b);
  {
    HashTable t(dev, "clicks", 100, 1.0);
    std::vector<int64_t> first = testing::random_ints(60, 0, INT64_MAX);
    std::sort(first.begin(), first.end());
    first.erase(std::unique(first.begin(), first.end()), first.end());
    std::vector<int64_t> rows = get_insert(t, first);
    std::vector<int64_t> more = testing::random_ints(90, INT64_MIN, -2);
    std::sort(more.begin(), more.end());
    more.erase(std::unique(more.begin(), more.end()), more.end());
    int64_t asked = int64_t(first.size() + more.size());
    Buffer<int64_t> mk(dev, more), mr(dev, more.size());
    BOOST_CHECK_NO_THROW(t.get_insert(mk.data(), int64_t(more.size()), mr.data(), RowInit(), dev.stream));
    try {
      t.check_errors(false, dev.stream);
      BOOST_ERROR("no error on a full table");
    } catch (const Error& e) {
      std::string m = e.what();
      BOOST_TEST_MESSAGE(m);
      BOOST_CHECK(m.find("'clicks'") != std::string::npos);
      BOOST_CHECK(m.find("capacity 100 rows") != std::string::npos);
      BOOST_CHECK(m.find(std::to_string(asked) + " rows asked for") != std::string::npos);
    }
    BOOST_CHECK_EQUAL(size(t), 100);
    BOOST_CHECK(find(t, first) == rows);
    // Exactly capacity keys have rows, the rest are absent; export lists the held ones once each.
    std::vector<int64_t> f = find(t, more);
    int64_t held = std::count_if(f.begin(), f.end(), [](int64_t r) { return r >= 0; });
    BOOST_CHECK_EQUAL(held + int64_t(first.size()), 100);
    t.check_errors(false, dev.stream);
    Buffer<int64_t> exported;
    BOOST_CHECK_EQUAL(t.export_keys(exported, dev.stream), 100);
    std::vector<int64_t> ek = exported.download();
    BOOST_CHECK_EQUAL(std::set<int64_t>(ek.begin(), ek.end()).size(), 100u);
    // clear empties it: the same keys come back with the dense rows 0 .. n-1 of a fresh table, and keys of
    // the earlier fill are gone.
    t.clear(dev.stream);
    BOOST_CHECK_EQUAL(size(t), 0);
    std::vector<int64_t> f2 = find(t, more);
    BOOST_CHECK(std::all_of(f2.begin(), f2.end(), [](int64_t r) { return r == -1; }));
    t.check_errors(false, dev.stream);
    std::vector<int64_t> again = get_insert(t, first);
    std::vector<int64_t> sorted(again);
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> dense(first.size());
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = int64_t(i);
    BOOST_CHECK(sorted == dense);
    BOOST_CHECK_EQUAL(size(t), int64_t(first.size()));
  }
  close_device(dev);
}

// Export by row, load into a fresh table: the same key → row map; loading a present key is refused.
void export_load(Backend b) {
  Device dev = open(b);
  {
    HashTable t(dev, "src", 500, 0.7);
    std::vector<int64_t> keys = power_law_keys(2000, 300, 0.8, true);
    std::vector<int64_t> rows = get_insert(t, keys);
    Buffer<int64_t> ex;
    int64_t n = t.export_keys(ex, dev.stream);
    std::vector<int64_t> by_row = ex.download();
    BOOST_CHECK_EQUAL(n, int64_t(std::set<int64_t>(keys.begin(), keys.end()).size()));
    size_t bad = 0;
    for (size_t i = 0; i < keys.size(); ++i) bad += by_row[size_t(rows[i])] != keys[i];
    BOOST_CHECK_EQUAL(bad, 0u);

    HashTable u(dev, "dst", 500, 0.5);
    BOOST_CHECK_EQUAL(u.load(ex.data(), n, dev.stream), 0);
    std::vector<int64_t> r = find(u, by_row);
    bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += r[size_t(i)] != i;
    BOOST_CHECK_EQUAL(bad, 0u);
    BOOST_CHECK_EQUAL(size(u), n);
    BOOST_CHECK_THROW(u.load(ex.data(), 1, dev.stream), Error);  // present: refused, nothing changes
    BOOST_CHECK_EQUAL(size(u), n);
    HashTable small(dev, "small", 10, 0.5);
    BOOST_CHECK_THROW(small.load(ex.data(), n, dev.stream), Error);
    BOOST_CHECK_EQUAL(size(small), 0);
  }
  close_device(dev);
}

// The documented initial value (kernels/key_init.h), written out here from its definition: splitmix64 (the
// published constants), the key's stream, then (2m - 2^24) * scale / 2^24 for the top 24 bits m, computed in
// double (exact: a 25-bit integer times a float) and rounded to float once.
uint64_t splitmix64_ref(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float initial_value_ref(uint64_t seed, uint32_t table, int64_t key, uint32_t elem, float scale) {
  uint64_t table_stream = splitmix64_ref(uint64_t(table) + 0x5851F42D4C957F2Dull);
  uint64_t stream = splitmix64_ref(splitmix64_ref(seed ^ table_stream) ^ uint64_t(key));
  uint64_t m = splitmix64_ref(stream + uint64_t(elem) * 0xD1B54A32D192ED03ull) >> 40;
  return float((2.0 * double(m) - 16777216.0) * double(scale) / 16777216.0);
}

// get_insert with the values copied out: new keys give their initial values by key, held keys the values
// their row holds now (overwritten with a pattern between the calls), refused keys zeros.
void get_insert_copy(Backend b, size_t n, size_t distinct, int dim) {
  Device dev = open(b);
  {
    const int64_t capacity = 2 * int64_t(distinct) + 64;  // both calls draw from their own key pools
    HashTable t(dev, "copy", capacity, 0.5);
    Buffer<float> values(dev, size_t(capacity) * dim);
    values.fill_bytes(0);
    RowInit init;
    init.values = values.data();
    init.dim = dim;
    init.key_init = KeyInit{testing::rng()(), 7, 0.05f};
    auto call = [&](const std::vector<int64_t>& keys, std::vector<int64_t>& rows_out) {
      Buffer<int64_t> k(dev, keys), rows(dev, keys.size());
      Buffer<float> out(dev, keys.size() * dim);
      rows.fill_bytes(0x5A);
      out.fill_bytes(0xFF);  // poison: NaN
      hash_get_insert_copy(dev, t.view(), k.data(), int64_t(keys.size()), rows.data(), init, out.data(), dev.stream);
      t.check_errors(false, dev.stream);
      rows_out = rows.download();
      return out.download();
    };
    auto want_init = [&](int64_t key, int e) {
      return initial_value_ref(init.key_init.seed, init.key_init.table_id, key, uint32_t(e), init.key_init.scale);
    };
    std::vector<int64_t> first = power_law_keys(n, distinct / 2, 0.9, true), rows1;
    std::vector<float> out1 = call(first, rows1);
    size_t bad = 0;
    for (size_t i = 0; i < first.size(); ++i)
      for (int e = 0; e < dim; ++e) bad += out1[i * dim + e] != want_init(first[i], e);
    BOOST_CHECK_EQUAL(bad, 0u);
    // Overwrite every held row with a pattern of its row number, then mix held and new keys.
    std::vector<float> pattern(size_t(capacity) * dim);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = float(i / dim) + 0.001f * float(i % dim);
    values.upload(pattern);
    std::vector<int64_t> second = power_law_keys(n, distinct, 0.5, false), rows2;
    second.insert(second.end(), first.begin(), first.begin() + std::min<size_t>(first.size(), 100));
    std::set<int64_t> held(first.begin(), first.end());
    std::vector<float> out2 = call(second, rows2);
    std::set<int64_t> all(held);
    all.insert(second.begin(), second.end());
    bad = std::count_if(rows2.begin(), rows2.end(), [&](int64_t r) { return r < 0 || r >= int64_t(all.size()); });
    BOOST_CHECK_EQUAL(bad, 0u);
    bad = 0;
    for (size_t i = 0; i < second.size(); ++i)
      for (int e = 0; e < dim; ++e) {
        float want = held.count(second[i]) ? pattern[size_t(rows2[i]) * dim + e] : want_init(second[i], e);
        bad += out2[i * dim + e] != want;
      }
    BOOST_CHECK_EQUAL(bad, 0u);
  }
  close_device(dev);
}

void get_insert_copy_cases(Backend b) {
  if (b == Backend::cpu) return get_insert_copy(b, 2000, 400, 3);
  for (int dim : {1, 8, 32, 64}) get_insert_copy(b, 1 << 16, 20000, dim);
  get_insert_copy(b, 1000, 900, 17);
}

void marker_key(Backend b) {
  Device dev = open(b);
  {
    HashTable t(dev, "m", 8, 0.5);
    BOOST_CHECK(find(t, {-1}) == std::vector<int64_t>{-1});
    std::vector<int64_t> rows = get_insert(t, {5, -1, 0, -1, 5});
    BOOST_CHECK(rows[1] == rows[3] && rows[0] == rows[4] && rows[1] >= 0 && rows[2] >= 0);
    BOOST_CHECK_EQUAL(size(t), 3);
    BOOST_CHECK(find(t, {-1, 0, 5, 7}) == (std::vector<int64_t>{rows[1], rows[2], rows[0], -1}));
    Buffer<int64_t> ex;
    t.export_keys(ex, dev.stream);
    std::vector<int64_t> e = ex.download();
    BOOST_CHECK_EQUAL(e[size_t(rows[1])], -1);
    t.check_errors(false, dev.stream);
  }
  close_device(dev);
}

// The initial values a get_insert writes for keys, by key (values [2000, dim] read back by row).
const int kInitDim = 13;
std::map<int64_t, std::vector<float>> inserted_values(Backend b, std::vector<int64_t> keys, const KeyInit& ki,
                                                      bool shuffle) {
  std::map<int64_t, std::vector<float>> m;
  Device dev = open(b);
  {
    HashTable t(dev, "init", 2000, 0.5);
    Buffer<float> values(dev, 2000 * kInitDim);
    values.fill_bytes(0xFF);
    if (shuffle) std::shuffle(keys.begin(), keys.end(), testing::rng());
    std::vector<int64_t> rows = get_insert(t, keys, RowInit{values.data(), kInitDim, ki});
    std::vector<float> v = values.download();
    for (size_t i = 0; i < keys.size(); ++i)
      m[keys[i]].assign(v.begin() + rows[i] * kInitDim, v.begin() + (rows[i] + 1) * kInitDim);
    // init_rows_by_key writes the same values.
    Buffer<float> again(dev, 2000 * kInitDim);
    again.fill_bytes(0xFF);
    Buffer<int64_t> kb(dev, keys), rb(dev, rows);
    init_rows_by_key(dev, kb.data(), rb.data(), int64_t(keys.size()), again.data(), kInitDim, ki, dev.stream);
    std::vector<float> a = again.download();
    size_t bad = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      bad += std::memcmp(&a[rows[i] * kInitDim], &v[rows[i] * kInitDim], kInitDim * sizeof(float)) != 0;
    BOOST_CHECK_EQUAL(bad, 0u);
  }
  close_device(dev);
  return m;
}

// Initial values are a function of (seed, table, key) as documented: the same whatever the insertion order,
// equal to the formula written out above, different between tables, uniform in [-scale, scale).
void initial_values(Backend b) {
  std::vector<int64_t> keys = power_law_keys(4000, 1500, 0.5, true);
  KeyInit ki{testing::seed(), 3, 0.25f};
  auto in_order = inserted_values(b, keys, ki, false), shuffled = inserted_values(b, keys, ki, true);
  BOOST_CHECK(in_order == shuffled);
  size_t out_of_range = 0, differ = 0, wrong = 0;
  double sum = 0, sum_sq = 0;
  for (const auto& [key, v] : in_order)
    for (int e = 0; e < kInitDim; ++e) {
      out_of_range += !(v[e] >= -0.25f && v[e] < 0.25f);
      sum += v[e];
      sum_sq += double(v[e]) * v[e];
      differ += initial_value_ref(ki.seed, 4, key, uint32_t(e), ki.scale) != v[e];  // another table
      wrong += initial_value_ref(ki.seed, ki.table_id, key, uint32_t(e), ki.scale) != v[e];
    }
  const double n = double(in_order.size() * kInitDim);
  BOOST_CHECK_EQUAL(wrong, 0u);
  BOOST_CHECK_EQUAL(out_of_range, 0u);
  BOOST_CHECK_GT(differ, in_order.size() * kInitDim * 99 / 100);
  // Uniform on [-0.25, 0.25): mean 0, variance 0.25^2 / 3; n is about 19500, 5 standard errors.
  BOOST_CHECK_LT(std::fabs(sum / n), 5 * 0.25 / std::sqrt(3 * n));
  BOOST_CHECK_CLOSE(sum_sq / n, 0.0625 / 3, 5.0);
}

// Tagged keys (several tables in one hash table): a tagged key's row gets the bits of the untagged key's row of
// its own table, whatever the KeyInit's table_id; keys of different tables differ.
void tagged_initial_values(Backend b) {
  std::vector<int64_t> plain = power_law_keys(600, 500, 0.5, false);
  for (int64_t& k : plain) k = int64_t(uint64_t(k) & kKeyTagMask);
  plain.push_back(int64_t(kKeyTagMask));  // the largest taggable key
  const int tables[] = {0, 5, 126};
  KeyInit tagged{testing::seed(), 99, 0.5f, true};
  std::vector<int64_t> keys;
  for (int t : tables)
    for (int64_t k : plain) keys.push_back(tag_key(t, k));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  auto got = inserted_values(b, keys, tagged, true);
  size_t wrong = 0, same_across = 0;
  for (int t : tables) {
    KeyInit untagged{tagged.seed, uint32_t(t), tagged.scale};
    auto want = inserted_values(b, plain, untagged, false);
    for (const auto& [key, v] : want) {
      wrong += got.at(tag_key(t, key)) != v;
      if (t != 0) same_across += got.at(tag_key(0, key)) == v;
    }
  }
  BOOST_CHECK_EQUAL(wrong, 0u);
  BOOST_CHECK_EQUAL(same_across, 0u);
  BOOST_CHECK_EQUAL(tag_key(3, 7), (int64_t(3) << 56) | 7);
}

}  // namespace

SPARTA_BACKEND_CASES(get_insert_find_contains_match_a_map, insert_find_contains_cases)
SPARTA_BACKEND_CASES(get_insert_copy_gives_values, get_insert_copy_cases)
SPARTA_BACKEND_CASES(full_table_is_an_error_at_the_check, full_table)
SPARTA_BACKEND_CASES(nearly_full_table_finds_every_key, nearly_full_table)
SPARTA_BACKEND_CASES(export_load_round_trip, export_load)
SPARTA_BACKEND_CASES(marker_key_is_a_key_like_any_other, marker_key)
SPARTA_BACKEND_CASES(initial_values_follow_the_documented_formula, initial_values)
SPARTA_BACKEND_CASES(tagged_keys_get_their_tables_initial_values, tagged_initial_values)

// The cpu and cuda backends write the same bits for every key.
BOOST_AUTO_TEST_CASE(initial_values_same_bits_on_cpu_and_cuda, *testing::needs_gpu()) {
  std::vector<int64_t> keys = power_law_keys(4000, 1500, 0.5, true);
  KeyInit ki{testing::seed(), 3, 0.25f};
  auto cpu = inserted_values(Backend::cpu, keys, ki, false), gpu = inserted_values(Backend::cuda, keys, ki, true);
  BOOST_CHECK_EQUAL(cpu.size(), std::set<int64_t>(keys.begin(), keys.end()).size());
  BOOST_CHECK(cpu == gpu);
}

// A few values of the formula computed once, independently, in Python (bits of the float32 results).
BOOST_AUTO_TEST_CASE(initial_values_match_values_computed_by_hand) {
  struct Known {
    uint64_t seed;
    uint32_t table;
    int64_t key;
    uint32_t elem;
    float scale;
    uint32_t bits;
  };
  const Known known[] = {{0, 0, 0, 0, 0.05f, 0x3cdea25du},
                         {0, 0, -1, 3, 0.05f, 0x3d05cc2fu},
                         {12345, 7, 42, 0, 0.25f, 0x3d95dbbcu},
                         {12345, 7, 42, 15, 0.25f, 0xbe7c863eu},
                         {9223372036854775813ull, 3, -987654321, 1, 1.0f, 0x3f0b1a54u}};
  for (const Known& k : known) {
    float want;
    std::memcpy(&want, &k.bits, 4);
    BOOST_CHECK_EQUAL(initial_value(KeyInit{k.seed, k.table, k.scale}, uint64_t(k.key), k.elem), want);
    BOOST_CHECK_EQUAL(initial_value_ref(k.seed, k.table, k.key, k.elem, k.scale), want);
  }
}

BOOST_AUTO_TEST_CASE(bad_settings_are_errors) {
  Device dev;
  BOOST_CHECK_THROW(HashTable(dev, "x", 0, 0.5), Error);
  BOOST_CHECK_THROW(HashTable(dev, "x", 10, 0.0), Error);
  BOOST_CHECK_THROW(HashTable(dev, "x", 10, 1.5), Error);
  BOOST_CHECK_EQUAL(HashTable::slot_count(1000, 0.5), 2048);
  BOOST_CHECK_EQUAL(HashTable::slot_count(1, 1.0), 8);
  BOOST_CHECK_EQUAL(HashTable::memory_bytes(1000, 0.5), 2048 * 16 + 64);
}
