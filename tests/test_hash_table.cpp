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

std::vector<int64_t> get_insert(HashTable& t, const std::vector<int64_t>& keys, const RowInit& init = RowInit()) {
  Buffer<int64_t> k(t.device(), keys), rows(t.device(), keys.size());
  rows.fill_bytes(0x5A);  // poison
  t.get_insert(k.data(), int64_t(keys.size()), rows.data(), init);
  return rows.download();
}

std::vector<int64_t> find(HashTable& t, const std::vector<int64_t>& keys) {
  Buffer<int64_t> k(t.device(), keys), rows(t.device(), keys.size());
  rows.fill_bytes(0x5A);
  t.find(k.data(), int64_t(keys.size()), rows.data());
  return rows.download();
}

// Rows must be a consistent, dense, injective map of the distinct keys.
void check_rows(const std::vector<int64_t>& keys, const std::vector<int64_t>& rows, int64_t size) {
  std::unordered_map<int64_t, int64_t> row_of;
  std::set<int64_t> used;
  size_t bad = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = row_of.find(keys[i]);
    if (it == row_of.end()) {
      bad += rows[i] < 0 || rows[i] >= size || !used.insert(rows[i]).second;
      row_of[keys[i]] = rows[i];
    } else {
      bad += it->second != rows[i];
    }
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  BOOST_CHECK_EQUAL(int64_t(row_of.size()), size);
}

void insert_find_contains(Backend b, size_t n, size_t distinct) {
  Device dev = open(b);
  {
    HashTable t(dev, "t", int64_t(distinct) + 7, 0.5);
    std::vector<int64_t> keys = power_law_keys(n, distinct, 1.1, true);
    std::vector<int64_t> rows = get_insert(t, keys);
    int64_t size = t.size();
    check_rows(keys, rows, size);
    // A second get_insert of the same keys (another order) finds the same rows and adds none.
    std::vector<int64_t> rev(keys.rbegin(), keys.rend());
    std::vector<int64_t> rows2 = get_insert(t, rev);
    BOOST_CHECK_EQUAL(t.size(), size);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += rows2[n - 1 - i] != rows[i];
    BOOST_CHECK_EQUAL(bad, 0u);
    // find: the same rows; absent keys -1; contains agrees.
    std::vector<int64_t> probe = keys;
    std::vector<int64_t> absent = testing::random_ints(n / 4 + 1, INT64_MIN, INT64_MAX);
    std::set<int64_t> present(keys.begin(), keys.end());
    for (int64_t k : absent)
      if (!present.count(k)) probe.push_back(k);
    std::vector<int64_t> f = find(t, probe);
    Buffer<int64_t> pk(dev, probe);
    Buffer<uint8_t> found(dev, probe.size());
    found.fill_bytes(0x77);
    t.contains(pk.data(), int64_t(probe.size()), found.data());
    std::vector<uint8_t> c = found.download();
    bad = 0;
    for (size_t i = 0; i < probe.size(); ++i) {
      int64_t want = i < n ? rows[i] : -1;
      bad += f[i] != want || c[i] != (want >= 0 ? 1 : 0);
    }
    BOOST_CHECK_EQUAL(bad, 0u);
    t.check_errors();  // find counted misses; only an error when asked
    BOOST_CHECK_THROW(
        {
          find(t, absent);
          t.check_errors(true);
        },
        Error);
  }
  close_device(dev);
}

// Fills a table past its capacity: an Error naming the table, its capacity and the rows asked for; the rows
// handed out before stay intact.
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
    try {
      get_insert(t, more);
      BOOST_ERROR("no error on a full table");
    } catch (const Error& e) {
      std::string m = e.what();
      BOOST_TEST_MESSAGE(m);
      BOOST_CHECK(m.find("'clicks'") != std::string::npos);
      BOOST_CHECK(m.find("capacity 100 rows") != std::string::npos);
      BOOST_CHECK(m.find(std::to_string(asked) + " rows asked for") != std::string::npos);
    }
    BOOST_CHECK_EQUAL(t.size(), 100);
    BOOST_CHECK(find(t, first) == rows);
    // Exactly capacity keys have rows, the rest are absent; export lists the held ones once each.
    std::vector<int64_t> f = find(t, more);
    int64_t held = std::count_if(f.begin(), f.end(), [](int64_t r) { return r >= 0; });
    BOOST_CHECK_EQUAL(held + int64_t(first.size()), 100);
    t.check_errors();
    Buffer<int64_t> exported;
    BOOST_CHECK_EQUAL(t.export_keys(exported), 100);
    std::vector<int64_t> ek = exported.download();
    BOOST_CHECK_EQUAL(std::set<int64_t>(ek.begin(), ek.end()).size(), 100u);
    t.clear();
    BOOST_CHECK_EQUAL(t.size(), 0);
    BOOST_CHECK(get_insert(t, first).size() == first.size());
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
    int64_t n = t.export_keys(ex);
    std::vector<int64_t> by_row = ex.download();
    BOOST_CHECK_EQUAL(n, t.size());
    size_t bad = 0;
    for (size_t i = 0; i < keys.size(); ++i) bad += by_row[size_t(rows[i])] != keys[i];
    BOOST_CHECK_EQUAL(bad, 0u);

    HashTable u(dev, "dst", 500, 0.5);
    BOOST_CHECK_EQUAL(u.load(ex.data(), n), 0);
    std::vector<int64_t> r = find(u, by_row);
    bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += r[size_t(i)] != i;
    BOOST_CHECK_EQUAL(bad, 0u);
    BOOST_CHECK_EQUAL(u.size(), n);
    BOOST_CHECK_THROW(u.load(ex.data(), 1), Error);  // present: refused, nothing changes
    BOOST_CHECK_EQUAL(u.size(), n);
    HashTable small(dev, "small", 10, 0.5);
    BOOST_CHECK_THROW(small.load(ex.data(), n), Error);
    BOOST_CHECK_EQUAL(small.size(), 0);
  }
  close_device(dev);
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
      hash_get_insert_copy(dev, t.view(), k.data(), int64_t(keys.size()), rows.data(), init, out.data());
      t.check_errors();
      rows_out = rows.download();
      return out.download();
    };
    std::vector<int64_t> first = power_law_keys(n, distinct / 2, 0.9, true), rows1;
    std::vector<float> out1 = call(first, rows1);
    size_t bad = 0;
    for (size_t i = 0; i < first.size(); ++i)
      for (int e = 0; e < dim; ++e) bad += out1[i * dim + e] != initial_value(init.key_init, uint64_t(first[i]), e);
    BOOST_CHECK_EQUAL(bad, 0u);
    // Overwrite every held row with a pattern of its row number, then mix held and new keys.
    std::vector<float> pattern(size_t(capacity) * dim);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = float(i / dim) + 0.001f * float(i % dim);
    values.upload(pattern);
    std::vector<int64_t> second = power_law_keys(n, distinct, 0.5, false), rows2;
    second.insert(second.end(), first.begin(), first.begin() + std::min<size_t>(first.size(), 100));
    std::set<int64_t> held(first.begin(), first.end());
    std::vector<float> out2 = call(second, rows2);
    bad = std::count_if(rows2.begin(), rows2.end(), [&](int64_t r) { return r < 0 || r >= t.size(); });
    BOOST_CHECK_EQUAL(bad, 0u);
    bad = 0;
    for (size_t i = 0; i < second.size(); ++i)
      for (int e = 0; e < dim; ++e) {
        float want = held.count(second[i]) ? pattern[size_t(rows2[i]) * dim + e]
                                           : initial_value(init.key_init, uint64_t(second[i]), e);
        bad += out2[i * dim + e] != want;
      }
    BOOST_CHECK_EQUAL(bad, 0u);
  }
  close_device(dev);
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_get_insert_find_contains) {
  insert_find_contains(Backend::cpu, 1, 1);
  insert_find_contains(Backend::cpu, 3000, 500);
}

BOOST_AUTO_TEST_CASE(cuda_get_insert_find_contains, *testing::needs_gpu()) {
  insert_find_contains(Backend::cuda, 1, 1);
  insert_find_contains(Backend::cuda, 3000, 500);
  insert_find_contains(Backend::cuda, 1 << 20, 1000);     // power law: a few keys everywhere
  insert_find_contains(Backend::cuda, 1 << 20, 400000);
}

BOOST_AUTO_TEST_CASE(cpu_get_insert_copy_gives_values) { get_insert_copy(Backend::cpu, 2000, 400, 3); }

BOOST_AUTO_TEST_CASE(cuda_get_insert_copy_gives_values, *testing::needs_gpu()) {
  for (int dim : {1, 8, 32, 64}) get_insert_copy(Backend::cuda, 1 << 16, 20000, dim);
  get_insert_copy(Backend::cuda, 1000, 900, 17);
}

BOOST_AUTO_TEST_CASE(cpu_full_table_is_an_error) { full_table(Backend::cpu); }
BOOST_AUTO_TEST_CASE(cuda_full_table_is_an_error, *testing::needs_gpu()) { full_table(Backend::cuda); }

BOOST_AUTO_TEST_CASE(cpu_export_load_round_trip) { export_load(Backend::cpu); }
BOOST_AUTO_TEST_CASE(cuda_export_load_round_trip, *testing::needs_gpu()) { export_load(Backend::cuda); }

BOOST_AUTO_TEST_CASE(marker_key_is_a_key_like_any_other) {
  for (Backend b : testing::available_backends()) {
    Device dev = open(b);
    {
      HashTable t(dev, "m", 8, 0.5);
      BOOST_CHECK(find(t, {-1}) == std::vector<int64_t>{-1});
      std::vector<int64_t> rows = get_insert(t, {5, -1, 0, -1, 5});
      BOOST_CHECK(rows[1] == rows[3] && rows[0] == rows[4] && rows[1] >= 0 && rows[2] >= 0);
      BOOST_CHECK_EQUAL(t.size(), 3);
      BOOST_CHECK(find(t, {-1, 0, 5, 7}) == (std::vector<int64_t>{rows[1], rows[2], rows[0], -1}));
      Buffer<int64_t> ex;
      t.export_keys(ex);
      std::vector<int64_t> e = ex.download();
      BOOST_CHECK_EQUAL(e[size_t(rows[1])], -1);
      t.check_errors();
    }
    close_device(dev);
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

// Initial values are a function of (seed, table, key): bit-identical between backends and insertion orders,
// different between tables and seeds, uniform in [-scale, scale).
BOOST_AUTO_TEST_CASE(initial_values_depend_on_the_key_only) {
  const int dim = 13;
  std::vector<int64_t> keys = power_law_keys(4000, 1500, 0.5, true);
  KeyInit ki{testing::seed(), 3, 0.25f};
  std::map<std::pair<Backend, int>, std::map<int64_t, std::vector<float>>> got;
  for (Backend b : testing::available_backends()) {
    for (int order = 0; order < 2; ++order) {
      Device dev = open(b);
      {
        HashTable t(dev, "init", 2000, 0.5);
        Buffer<float> values(dev, 2000 * dim);
        values.fill_bytes(0xFF);
        std::vector<int64_t> k = keys;
        if (order) std::shuffle(k.begin(), k.end(), testing::rng());
        std::vector<int64_t> rows = get_insert(t, k, RowInit{values.data(), dim, ki});
        std::vector<float> v = values.download();
        auto& m = got[{b, order}];
        for (size_t i = 0; i < k.size(); ++i) m[k[i]].assign(v.begin() + rows[i] * dim, v.begin() + (rows[i] + 1) * dim);
        // init_rows_by_key writes the same values.
        Buffer<float> again(dev, 2000 * dim);
        again.fill_bytes(0xFF);
        Buffer<int64_t> kb(dev, k), rb(dev, rows);
        init_rows_by_key(dev, kb.data(), rb.data(), int64_t(k.size()), again.data(), dim, ki);
        std::vector<float> a = again.download();
        size_t bad = 0;
        for (size_t i = 0; i < k.size(); ++i)
          bad += std::memcmp(&a[rows[i] * dim], &v[rows[i] * dim], dim * sizeof(float)) != 0;
        BOOST_CHECK_EQUAL(bad, 0u);
      }
      close_device(dev);
    }
  }
  const auto& ref = got.begin()->second;
  for (const auto& [which, m] : got) BOOST_CHECK(m == ref);  // bitwise, every backend and order
  size_t out_of_range = 0, differ = 0;
  double sum = 0;
  for (const auto& [key, v] : ref)
    for (int e = 0; e < dim; ++e) {
      out_of_range += !(v[e] >= -0.25f && v[e] < 0.25f);
      sum += v[e];
      KeyInit other = ki;
      other.table_id = 4;
      differ += initial_value(other, uint64_t(key), e) != v[e];
      BOOST_CHECK_EQUAL(initial_value(ki, uint64_t(key), e), v[e]);
    }
  BOOST_CHECK_EQUAL(out_of_range, 0u);
  BOOST_CHECK_GT(differ, ref.size() * dim * 99 / 100);
  BOOST_CHECK_LT(std::fabs(sum / double(ref.size() * dim)), 0.02);
}
