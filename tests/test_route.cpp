// Routing kernels (kernels/route.h) on every backend against expectations computed here from the inputs alone:
// owners and stable buckets, permutations there and back, pooling and its reverse (bit for bit: the pooling
// must equal a bag summed in key order from 0.0f), and cutting a table's slots out of a batch and back (in float,
// and into a 16-bit output and from a 16-bit gradient).
// Fresh random inputs, outputs poisoned before every call.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cstring>

#include "kernels/fill.h"
#include "kernels/route.h"
#include "src/base/half.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

template <class T>
Buffer<T> poisoned(const Device& dev, size_t n) {
  Buffer<T> b(dev, std::max<size_t>(n, 1));
  b.fill_bytes(0xFF);
  return b;
}

// Random CSR over `bags` bags of 0..max_len keys (some bags empty).
std::vector<int64_t> random_offsets(int64_t bags, int max_len) {
  std::vector<int64_t> o{0};
  std::uniform_int_distribution<int> len(0, max_len);
  for (int64_t b = 0; b < bags; ++b) o.push_back(o.back() + (b % 5 == 2 ? 0 : len(testing::rng())));
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
}

void check_buckets(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  for (int world : {1, 2, 3, 4, 7}) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(1000)}) {
      std::vector<int64_t> keys = testing::random_ints(size_t(n), INT64_MIN, INT64_MAX);
      Buffer<int64_t> k(dev, keys);
      auto part = poisoned<int32_t>(dev, size_t(n));
      route_owner_by_key(dev, k.data(), n, world, part.data(), dev.stream);
      auto perm = poisoned<int64_t>(dev, size_t(n));
      auto counts = poisoned<int64_t>(dev, size_t(world));
      RouteScratch scratch;
      route_bucket(dev, part.data(), n, world, perm.data(), counts.data(), scratch, dev.stream);
      std::vector<int32_t> p = part.download();
      std::vector<int64_t> pm = perm.download(), c = counts.download();
      // expected: for each owner in order, the indices of its keys in order
      std::vector<int64_t> want_perm, want_counts(size_t(world), 0);
      for (int o = 0; o < world; ++o)
        for (int64_t i = 0; i < n; ++i)
          if (int(uint64_t(keys[size_t(i)]) % uint64_t(world)) == o) want_perm.push_back(i), ++want_counts[size_t(o)];
      for (int64_t i = 0; i < n; ++i)
        BOOST_CHECK_EQUAL(p[size_t(i)], int(uint64_t(keys[size_t(i)]) % uint64_t(world)));
      BOOST_CHECK(std::equal(want_perm.begin(), want_perm.end(), pm.begin()));
      BOOST_CHECK(std::equal(want_counts.begin(), want_counts.end(), c.begin()));
    }
  }
  // membership: part 0 for keys of the set, 1 otherwise; buckets of 2
  std::vector<int64_t> set = testing::random_ints(50, -1000, 1000);
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  std::vector<int64_t> keys = testing::random_ints(777, -1100, 1100);
  Buffer<int64_t> k(dev, keys), s(dev, set);
  auto part = poisoned<int32_t>(dev, keys.size());
  route_part_by_membership(dev, k.data(), int64_t(keys.size()), s.data(), int64_t(set.size()), part.data(), dev.stream);
  std::vector<int32_t> p = part.download();
  size_t wrong = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    wrong += p[i] != (std::find(set.begin(), set.end(), keys[i]) != set.end() ? 0 : 1);
  BOOST_CHECK_EQUAL(wrong, 0u);
  // the position in the set, -1 outside it
  auto idx = poisoned<int32_t>(dev, keys.size());
  route_index_in_set(dev, k.data(), int64_t(keys.size()), s.data(), int64_t(set.size()), idx.data(), dev.stream);
  std::vector<int32_t> ih = idx.download();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto at = std::find(set.begin(), set.end(), keys[i]);
    wrong += ih[i] != (at == set.end() ? -1 : int32_t(at - set.begin()));
  }
  // touched (count > 0) first
  std::vector<int64_t> counts = testing::random_ints(300, 0, 2);
  Buffer<int64_t> c(dev, counts);
  auto nz = poisoned<int32_t>(dev, counts.size());
  route_part_nonzero(dev, c.data(), int64_t(counts.size()), nz.data(), dev.stream);
  std::vector<int32_t> nzh = nz.download();
  for (size_t i = 0; i < counts.size(); ++i) wrong += nzh[i] != (counts[i] > 0 ? 0 : 1);
  BOOST_CHECK_EQUAL(wrong, 0u);
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(owners_and_stable_buckets, check_buckets)

void check_permutations(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  const int64_t n = 513, m = 600;
  std::vector<int64_t> idx(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) idx[size_t(i)] = i;
  std::shuffle(idx.begin(), idx.end(), testing::rng());
  idx.resize(size_t(n));  // distinct indices into [0, m)
  Buffer<int64_t> ix(dev, idx);
  size_t wrong = 0;
  for (int dim : {7, 8}) {  // one element at a time; four at a time (cuda)
    std::vector<float> src = testing::random_floats(size_t(m) * dim);
    Buffer<float> s(dev, src);
    auto g = poisoned<float>(dev, size_t(n) * dim);
    route_gather_rows(dev, s.data(), ix.data(), n, dim, g.data(), dev.stream);
    std::vector<float> got = g.download(), want(size_t(n) * dim);
    for (int64_t i = 0; i < n; ++i)
      for (int e = 0; e < dim; ++e) want[size_t(i * dim + e)] = src[size_t(idx[size_t(i)] * dim + e)];
    BOOST_CHECK_MESSAGE(same_bits(got, want, want.size()), "gather rows, dim " << dim);
    // scatter back into a poisoned [m, dim]: the rows named by idx hold src's first n rows
    auto sc = poisoned<float>(dev, size_t(m) * dim);
    route_scatter_rows(dev, s.data(), ix.data(), n, dim, sc.data(), dev.stream);
    std::vector<float> back = sc.download();
    size_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int e = 0; e < dim; ++e)
        bad += std::memcmp(&back[size_t(idx[size_t(i)] * dim + e)], &src[size_t(i * dim + e)], 4) != 0;
    BOOST_CHECK_MESSAGE(bad == 0, "scatter rows, dim " << dim << ": " << bad << " wrong");
  }
  std::vector<int64_t> keys = testing::random_ints(size_t(m), INT64_MIN, INT64_MAX);
  Buffer<int64_t> k(dev, keys);
  auto gk = poisoned<int64_t>(dev, size_t(n));
  route_gather_keys(dev, k.data(), ix.data(), n, gk.data(), dev.stream);
  std::vector<int64_t> gkh = gk.download();
  for (int64_t i = 0; i < n; ++i) wrong += gkh[size_t(i)] != keys[size_t(idx[size_t(i)])];
  // scatter the first n keys into a poisoned [m]: the places named by idx hold them, the others keep the poison
  auto sk = poisoned<int64_t>(dev, size_t(m));
  const std::vector<int64_t> poison = sk.download();
  route_scatter_keys(dev, k.data(), ix.data(), n, sk.data(), dev.stream);
  std::vector<int64_t> skh = sk.download(), want_sk = poison;
  for (int64_t i = 0; i < n; ++i) want_sk[size_t(idx[size_t(i)])] = keys[size_t(i)];
  for (int64_t x = 0; x < m; ++x) wrong += skh[size_t(x)] != want_sk[size_t(x)];
  auto io = poisoned<int64_t>(dev, size_t(n));
  route_iota(dev, n, io.data(), dev.stream);
  std::vector<int64_t> ioh = io.download();
  for (int64_t i = 0; i < n; ++i) wrong += ioh[size_t(i)] != i;
  // int32 values (negative and large ones too) widened into a poisoned int64 array; the place past n keeps the poison
  std::vector<int32_t> narrow(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) narrow[size_t(i)] = int32_t(keys[size_t(i)] % 2000000000) * (i % 2 ? -1 : 1);
  Buffer<int32_t> nw(dev, narrow);
  auto wide = poisoned<int64_t>(dev, size_t(n) + 1);
  const int64_t past = wide.download()[size_t(n)];
  route_widen(dev, nw.data(), n, wide.data(), dev.stream);
  std::vector<int64_t> wh = wide.download();
  for (int64_t i = 0; i < n; ++i) wrong += wh[size_t(i)] != int64_t(narrow[size_t(i)]);
  wrong += wh[size_t(n)] != past;
  BOOST_CHECK_EQUAL(wrong, 0u);
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(gather_scatter_iota, check_permutations)

void check_unique(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  // key_bits 64: any keys; 20: keys mostly in [0, 2^20), a few outside (sorted by their low 20 bits)
  for (int key_bits : {64, 20}) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(2000)}) {
      // a few distinct keys, many repeats
      std::vector<int64_t> pool = key_bits == 64 ? testing::random_ints(97, INT64_MIN, INT64_MAX)
                                                 : testing::random_ints(97, 0, (int64_t(1) << key_bits) - 1);
      if (key_bits < 64) {  // outside the range: one with another key's low bits, a negative one, a large one
        pool[0] = pool[1] + (int64_t(1) << key_bits);
        pool[2] = -pool[3] - 1;
        pool[4] = INT64_MAX;
      }
      std::vector<int64_t> keys;
      for (int64_t i = 0; i < n; ++i) keys.push_back(pool[size_t(testing::random_ints(1, 0, 96)[0])]);
      Buffer<int64_t> k(dev, keys);
      auto sorted = poisoned<int64_t>(dev, size_t(n)), perm = poisoned<int64_t>(dev, size_t(n));
      RouteScratch scratch;
      route_sort_keys(dev, k.data(), n, key_bits, sorted.data(), perm.data(), scratch, dev.stream);
      auto uniq = poisoned<int64_t>(dev, size_t(n)), runs = poisoned<int64_t>(dev, size_t(n) + 1);
      auto uid = poisoned<int64_t>(dev, size_t(n)), count = poisoned<int64_t>(dev, 1);
      route_unique_sorted(dev, sorted.data(), n, uniq.data(), runs.data(), uid.data(), count.data(), scratch,
                          dev.stream);
      // expected: keys ascending by their low key_bits bits as uint64, positions of equal low bits in index
      // order; a run per stretch of equal keys in that order
      const uint64_t mask = key_bits == 64 ? ~uint64_t(0) : (uint64_t(1) << key_bits) - 1;
      std::vector<int64_t> want_perm(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want_perm[size_t(i)] = i;
      std::stable_sort(want_perm.begin(), want_perm.end(), [&](int64_t a, int64_t b) {
        return (uint64_t(keys[size_t(a)]) & mask) < (uint64_t(keys[size_t(b)]) & mask);
      });
      std::vector<int64_t> want_unique, want_runs, want_uid;
      for (int64_t j = 0; j < n; ++j) {
        int64_t key = keys[size_t(want_perm[size_t(j)])];
        if (want_unique.empty() || want_unique.back() != key) want_unique.push_back(key), want_runs.push_back(j);
        want_uid.push_back(int64_t(want_unique.size()) - 1);
      }
      want_runs.push_back(n);
      std::vector<int64_t> ph = perm.download(), sh = sorted.download(), uh = uniq.download(),
                           rh = runs.download(), ih = uid.download();
      const int64_t u = count.download()[0];
      BOOST_CHECK_EQUAL(u, int64_t(want_unique.size()));
      size_t wrong = 0;
      for (int64_t j = 0; j < n; ++j)
        wrong += ph[size_t(j)] != want_perm[size_t(j)] || sh[size_t(j)] != keys[size_t(want_perm[size_t(j)])] ||
                 ih[size_t(j)] != want_uid[size_t(j)];
      for (size_t x = 0; x < want_unique.size() && int64_t(x) < u; ++x) wrong += uh[x] != want_unique[x];
      for (size_t x = 0; x < want_runs.size() && int64_t(x) <= u; ++x) wrong += rh[x] != want_runs[x];
      BOOST_CHECK_EQUAL(wrong, 0u);
    }
  }
  BOOST_CHECK_EQUAL(route_key_bits(0), 64);
  BOOST_CHECK_EQUAL(route_key_bits(1), 1);
  BOOST_CHECK_EQUAL(route_key_bits(2), 1);
  BOOST_CHECK_EQUAL(route_key_bits(3), 2);
  BOOST_CHECK_EQUAL(route_key_bits(int64_t(1) << 20), 20);
  BOOST_CHECK_EQUAL(route_key_bits((int64_t(1) << 20) + 1), 21);
  BOOST_CHECK_EQUAL(route_key_bits(INT64_MAX), 63);
  RouteScratch scratch;
  BOOST_CHECK_THROW(route_sort_keys(dev, nullptr, 0, 0, nullptr, nullptr, scratch, dev.stream), Error);
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(sort_and_distinct_keys, check_unique)

void check_bags(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  for (int dim : {1, 4, 13}) {
    const int64_t bags = 97;
    std::vector<int64_t> off = random_offsets(bags, 6);
    const int64_t nnz = off.back();
    std::vector<float> vecs = testing::random_floats(size_t(nnz) * dim);
    std::vector<float> grad = testing::random_floats(size_t(bags) * dim);
    Buffer<int64_t> o(dev, off);
    Buffer<float> v(dev, vecs), gr(dev, grad);
    for (Combiner c : {Combiner::sum, Combiner::mean}) {
      auto out = poisoned<float>(dev, size_t(bags) * dim);
      route_pool_bags(dev, o.data(), v.data(), nullptr, bags, dim, c, out.data(), dev.stream);
      // each bag's keys' vectors (src [nnz, dim]) added in key order, divided by the length for mean
      auto pooled = [&](const std::vector<float>& src) {
        std::vector<float> p(size_t(bags) * dim);
        for (int64_t b = 0; b < bags; ++b) {
          int64_t len = off[size_t(b) + 1] - off[size_t(b)];
          for (int e = 0; e < dim; ++e) {
            float acc = 0.f;
            for (int64_t i = off[size_t(b)]; i < off[size_t(b) + 1]; ++i) acc += src[size_t(i * dim + e)];
            if (c == Combiner::mean && len > 0) acc /= float(len);
            p[size_t(b * dim + e)] = acc;
          }
        }
        return p;
      };
      const std::vector<float> want = pooled(vecs);
      std::vector<float> scaled(size_t(bags) * dim);
      for (int64_t b = 0; b < bags; ++b) {
        int64_t len = off[size_t(b) + 1] - off[size_t(b)];
        for (int e = 0; e < dim; ++e) {
          float g = grad[size_t(b * dim + e)];
          float kg = c == Combiner::mean && len > 0 ? g * (1.0f / float(len)) : g;
          scaled[size_t(b * dim + e)] = c == Combiner::mean && len == 0 ? 0.f : kg;
        }
      }
      BOOST_CHECK_MESSAGE(same_bits(out.download(), want, want.size()), "pool dim " << dim);
      // the keys' vectors read through an index (repeats and rows no key names included): the same as the
      // vectors copied out first and pooled
      const int64_t m = 40;
      std::vector<int64_t> idx = testing::random_ints(size_t(nnz), 0, m - 1);
      std::vector<float> rows = testing::random_floats(size_t(m) * dim), copied(size_t(nnz) * dim);
      for (int64_t i = 0; i < nnz; ++i)
        for (int e = 0; e < dim; ++e) copied[size_t(i * dim + e)] = rows[size_t(idx[size_t(i)] * dim + e)];
      const std::vector<float> want_idx = pooled(copied);
      Buffer<int64_t> ix(dev, idx);
      Buffer<float> r(dev, rows);
      auto out_idx = poisoned<float>(dev, size_t(bags) * dim);
      route_pool_bags(dev, o.data(), r.data(), ix.data(), bags, dim, c, out_idx.data(), dev.stream);
      BOOST_CHECK_MESSAGE(same_bits(out_idx.download(), want_idx, want_idx.size()),
                          "pool through an index, dim " << dim);
      // into a wider output (BagLayout: bag b of sample b / 3, slot b % 3, at sample * row + cols[slot]): each bag
      // at its place, bit for bit, and nothing else of the poisoned output written (by fours where dim is 4)
      {
        const int slots = 3;
        const int64_t row = 3 * dim + 4, samples = (bags + slots - 1) / slots;
        const std::vector<int32_t> cols_h = {2 * dim + 4, 0, dim};
        Buffer<int32_t> cols(dev, cols_h);
        const BagLayout layout{row, cols.data(), slots, dim % 4 == 0};
        auto wide = poisoned<float>(dev, size_t(samples * row));
        route_pool_bags(dev, o.data(), r.data(), ix.data(), bags, dim, c, wide.data(), dev.stream, layout);
        const std::vector<float> w = wide.download(), poison = poisoned<float>(Device(), 1).download();
        std::vector<float> want_wide(w.size(), poison[0]);
        for (int64_t x = 0; x < bags; ++x)
          for (int e = 0; e < dim; ++e)
            want_wide[size_t((x / slots) * row + cols_h[size_t(x % slots)] + e)] = want_idx[size_t(x * dim + e)];
        BOOST_CHECK_MESSAGE(same_bits(w, want_wide, want_wide.size()), "pool into a wider output, dim " << dim);
      }
      auto sc = poisoned<float>(dev, size_t(bags) * dim);
      route_scale_bag_grads(dev, o.data(), gr.data(), bags, dim, c, sc.data(), dev.stream);
      BOOST_CHECK_MESSAGE(same_bits(sc.download(), scaled, scaled.size()), "scale dim " << dim);
    }
    // divide the sums by the lengths: the mean of sums pooled elsewhere
    Buffer<float> x(dev, grad);
    route_divide_by_lengths(dev, o.data(), bags, dim, x.data(), dev.stream);
    std::vector<float> want = grad;
    for (int64_t b = 0; b < bags; ++b) {
      int64_t len = off[size_t(b) + 1] - off[size_t(b)];
      if (len > 0)
        for (int e = 0; e < dim; ++e) want[size_t(b * dim + e)] /= float(len);
    }
    BOOST_CHECK(same_bits(x.download(), want, want.size()));
    // lengths, offsets from lengths, key bags, offsets from sorted bag ids
    auto len = poisoned<int64_t>(dev, size_t(bags));
    route_lengths(dev, o.data(), bags, len.data(), dev.stream);
    std::vector<int64_t> lh = len.download();
    size_t wrong = 0;
    for (int64_t b = 0; b < bags; ++b) wrong += lh[size_t(b)] != off[size_t(b) + 1] - off[size_t(b)];
    auto off2 = poisoned<int64_t>(dev, size_t(bags) + 1);
    RouteScratch scratch;
    route_offsets_from_lengths(dev, len.data(), bags, off2.data(), scratch, dev.stream);
    wrong += off2.download() != off;
    auto kb = poisoned<int64_t>(dev, size_t(nnz));
    route_key_bags(dev, o.data(), bags, 1000, kb.data(), dev.stream);
    std::vector<int64_t> kbh = kb.download();
    for (int64_t b = 0; b < bags; ++b)
      for (int64_t i = off[size_t(b)]; i < off[size_t(b) + 1]; ++i) wrong += kbh[size_t(i)] != 1000 + b;
    // sorted bag ids with gaps → the CSR they describe, over more bags than appear
    std::vector<int64_t> ids;
    for (int64_t b = 0; b < bags; ++b)
      for (int64_t i = off[size_t(b)]; i < off[size_t(b) + 1]; ++i) ids.push_back(2 * b);
    Buffer<int64_t> idb(dev, ids);
    auto off3 = poisoned<int64_t>(dev, size_t(2 * bags) + 1);
    route_offsets_from_sorted_bags(dev, idb.data(), int64_t(ids.size()), 2 * bags, off3.data(), dev.stream);
    std::vector<int64_t> o3 = off3.download();
    for (int64_t b = 0; b <= 2 * bags; ++b) {
      int64_t want_b = int64_t(std::lower_bound(ids.begin(), ids.end(), b) - ids.begin());
      wrong += o3[size_t(b)] != want_b;
    }
    BOOST_CHECK_EQUAL(wrong, 0u);
  }
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(pool_scale_and_offsets, check_bags)

void check_slots(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  const int S = 5;
  for (int64_t batch : {int64_t(0), int64_t(1), int64_t(33)}) {
    std::vector<int64_t> off = random_offsets(batch * S, 4);
    std::vector<int64_t> keys = testing::random_ints(size_t(off.back()), INT64_MIN, INT64_MAX);
    std::vector<int32_t> slots{3, 1}, cols{2, 9};  // a table serving slots 3 and 1 (in that order), dim 2
    const int dim = 2, ts = 2;
    const int64_t row_floats = 12;
    Buffer<int64_t> o(dev, off), k(dev, keys);
    Buffer<int32_t> sl(dev, slots), cl(dev, cols);
    auto to = poisoned<int64_t>(dev, size_t(batch * ts) + 1);
    RouteScratch scratch;
    route_select_slot_offsets(dev, o.data(), batch, S, sl.data(), ts, to.data(), scratch, dev.stream);
    std::vector<int64_t> toh = to.download();
    std::vector<int64_t> want_off{0}, want_keys;
    for (int64_t s = 0; s < batch; ++s)
      for (int j = 0; j < ts; ++j) {
        int64_t r = s * S + slots[size_t(j)];
        for (int64_t i = off[size_t(r)]; i < off[size_t(r) + 1]; ++i) want_keys.push_back(keys[size_t(i)]);
        want_off.push_back(int64_t(want_keys.size()));
      }
    BOOST_CHECK(std::equal(want_off.begin(), want_off.end(), toh.begin()));
    auto tk = poisoned<int64_t>(dev, want_keys.size());
    route_select_slot_keys(dev, o.data(), k.data(), batch, S, sl.data(), ts, to.data(), tk.data(), dev.stream);
    std::vector<int64_t> tkh = tk.download();
    BOOST_CHECK(std::equal(want_keys.begin(), want_keys.end(), tkh.begin()));
    // put pooled bags into their columns (the rest of the output untouched), and take them back: dim 2 at columns
    // 2 and 9 of rows of 12 (one element at a time), dim 4 at 0 and 8 of 12 (four at a time, 16-byte loads and
    // stores), dim 8 at 2 and 10 of 20 (four at a time, output positions not multiples of 4: element by element)
    struct Shape {
      int dim;
      std::vector<int32_t> cols;
      int64_t row;
    };
    for (const Shape& shape : {Shape{dim, cols, row_floats}, Shape{4, {0, 8}, 12}, Shape{8, {2, 10}, 20}}) {
      const int d = shape.dim;
      const int64_t row = shape.row;
      std::vector<float> pooled = testing::random_floats(size_t(batch * ts * d));
      std::vector<float> base = testing::random_floats(size_t(batch * row));
      Buffer<float> p(dev, pooled), out(dev, base);
      Buffer<int32_t> sc(dev, shape.cols);
      route_put_slots(dev, p.data(), batch, ts, d, sc.data(), row, out.data(), dev.stream);
      std::vector<float> want = base;
      for (int64_t s = 0; s < batch; ++s)
        for (int j = 0; j < ts; ++j)
          for (int e = 0; e < d; ++e)
            want[size_t(s * row + shape.cols[size_t(j)] + e)] = pooled[size_t((s * ts + j) * d + e)];
      BOOST_CHECK_MESSAGE(same_bits(out.download(), want, want.size()), "put, dim " << d << ", batch " << batch);
      auto back = poisoned<float>(dev, pooled.size());
      route_take_slots(dev, out.data(), batch, ts, d, sc.data(), row, back.data(), dev.stream);
      BOOST_CHECK_MESSAGE(same_bits(back.download(), pooled, pooled.size()), "take, dim " << d << ", batch " << batch);
    }
  }
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(select_put_take_slots, check_slots)

// The slot cut of bags of every length: empty, one key, a few, hundreds (the cuda kernel copies a block's bags'
// keys together, each key finding its bag), over more bags than one block takes; plain and grouped (keys offset by
// their table's base, keys outside the bound reported by their first index).
void check_select_long_bags(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  const int S = 4, ts = 3;
  const int64_t batch = 700;
  std::vector<int64_t> off{0};
  std::uniform_int_distribution<int> len(0, 12);
  for (int64_t r = 0; r < batch * S; ++r) {
    int n = r % 7 == 3 ? 0 : len(testing::rng());
    if (r % S == 1 && r / S % 50 == 9) n = 300 + int(r % 97);  // hundreds of keys in some of slot 1's bags
    off.push_back(off.back() + n);
  }
  std::vector<int64_t> keys = testing::random_ints(size_t(off.back()), 0, 999);
  const std::vector<int32_t> slots{1, 3, 0};
  const std::vector<int64_t> bases{5000, 0, 123456}, bounds{1000, 1000, 990};
  std::vector<int64_t> want_off{0}, want_keys, want_group;
  int64_t want_bad = INT64_MAX;
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < ts; ++j) {
      const int64_t r = s * S + slots[size_t(j)];
      for (int64_t i = off[size_t(r)]; i < off[size_t(r) + 1]; ++i) {
        want_keys.push_back(keys[size_t(i)]);
        want_group.push_back(bases[size_t(j)] + keys[size_t(i)]);
        if (keys[size_t(i)] >= bounds[size_t(j)]) want_bad = std::min(want_bad, i);
      }
      want_off.push_back(int64_t(want_keys.size()));
    }
  BOOST_REQUIRE_NE(want_bad, INT64_MAX);  // slot 0's keys 990-999 are outside its bound
  Buffer<int64_t> o(dev, off), k(dev, keys), bb(dev, bases), bd(dev, bounds);
  Buffer<int32_t> sl(dev, slots);
  auto to = poisoned<int64_t>(dev, size_t(batch * ts) + 1);
  RouteScratch scratch;
  route_select_slot_offsets(dev, o.data(), batch, S, sl.data(), ts, to.data(), scratch, dev.stream);
  BOOST_CHECK(to.download() == want_off);
  auto tk = poisoned<int64_t>(dev, want_keys.size());
  route_select_slot_keys(dev, o.data(), k.data(), batch, S, sl.data(), ts, to.data(), tk.data(), dev.stream);
  BOOST_CHECK(tk.download() == want_keys);
  auto tg = poisoned<int64_t>(dev, want_keys.size());
  Buffer<int64_t> bad(dev, std::vector<int64_t>{INT64_MAX});
  route_select_group_keys(dev, o.data(), k.data(), batch, S, sl.data(), ts, to.data(), bb.data(), bd.data(),
                          tg.data(), bad.data(), dev.stream);
  BOOST_CHECK(tg.download() == want_group);
  BOOST_CHECK_EQUAL(bad.download()[0], want_bad);
}
SPARTA_BACKEND_CASES(select_keys_of_long_bags, check_select_long_bags)

// A group's selection: keys of slot slots[j] moved by bases[j] (tags << 56 as tagged groups use, or key offsets
// as direct-index groups do); the first key outside its slot's bound is reported by its index in the batch's
// keys (and only lowers the value it finds). The offsets check finds the first bad row.
void check_tagged_slots_and_offsets(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  const int S = 4;
  for (int64_t batch : {int64_t(1), int64_t(40)}) {
    std::vector<int64_t> off = random_offsets(batch * S, 3);
    std::vector<int64_t> bounds{50, 1000, int64_t(1) << 56};  // per table slot
    std::vector<int32_t> slots{2, 0, 3}, tags{7, 0, 126};
    const bool offsets_as_bases = batch > 1;  // tags the first time, key offsets the second
    std::vector<int64_t> bases;
    for (int j = 0; j < 3; ++j)
      bases.push_back(offsets_as_bases ? std::vector<int64_t>{1000, 0, 1050}[size_t(j)]
                                       : int64_t(uint64_t(tags[size_t(j)]) << 56));
    const int ts = 3;
    std::vector<int64_t> keys(size_t(off.back()));
    for (int64_t r = 0; r < batch * S; ++r) {
      const int slot = int(r % S);
      const int64_t bound = slot == 2 ? 50 : slot == 0 ? 1000 : slot == 3 ? (int64_t(1) << 56) : 5;
      for (int64_t i = off[size_t(r)]; i < off[size_t(r) + 1]; ++i)
        keys[size_t(i)] = testing::random_ints(1, 0, bound - 1)[0];
    }
    for (bool plant : {false, true}) {
      std::vector<int64_t> k = keys;
      int64_t want_bad = INT64_MAX;
      if (plant) {  // two bad keys in slot 2's rows: the first by index is reported
        std::vector<int64_t> idx;
        for (int64_t r = 0; r < batch * S; ++r)
          if (r % S == 2)
            for (int64_t i = off[size_t(r)]; i < off[size_t(r) + 1]; ++i) idx.push_back(i);
        if (idx.size() < 2) continue;
        k[size_t(idx[1])] = 50;
        k[size_t(idx.back())] = -1;
        want_bad = idx[1];
      }
      Buffer<int64_t> o(dev, off), kb(dev, k), bb(dev, bounds);
      Buffer<int32_t> sl(dev, slots);
      Buffer<int64_t> tg(dev, bases);
      auto to = poisoned<int64_t>(dev, size_t(batch * ts) + 1);
      RouteScratch scratch;
      route_select_slot_offsets(dev, o.data(), batch, S, sl.data(), ts, to.data(), scratch, dev.stream);
      std::vector<int64_t> want_keys;
      for (int64_t s = 0; s < batch; ++s)
        for (int j = 0; j < ts; ++j) {
          int64_t r = s * S + slots[size_t(j)];
          for (int64_t i = off[size_t(r)]; i < off[size_t(r) + 1]; ++i)
            want_keys.push_back(offsets_as_bases ? bases[size_t(j)] + k[size_t(i)]
                                                 : int64_t((uint64_t(tags[size_t(j)]) << 56) | uint64_t(k[size_t(i)])));
        }
      auto tk = poisoned<int64_t>(dev, want_keys.size());
      Buffer<int64_t> bad(dev, std::vector<int64_t>{123});
      fill(dev, bad.data(), 1, INT64_MAX, dev.stream);
      route_select_group_keys(dev, o.data(), kb.data(), batch, S, sl.data(), ts, to.data(), tg.data(),
                                    bb.data(), tk.data(), bad.data(), dev.stream);
      std::vector<int64_t> tkh = tk.download();
      BOOST_CHECK(std::equal(want_keys.begin(), want_keys.end(), tkh.begin()));
      BOOST_CHECK_EQUAL(bad.download()[0], want_bad);
    }
    // offsets: fine, then a decrease at row r, then offsets[0] != 0
    Buffer<int64_t> first(dev, std::vector<int64_t>{0});
    auto check = [&](const std::vector<int64_t>& o) {
      Buffer<int64_t> ob(dev, o);
      fill(dev, first.data(), 1, INT64_MAX, dev.stream);
      route_check_offsets(dev, ob.data(), int64_t(o.size()) - 1, first.data(), dev.stream);
      return first.download()[0];
    };
    BOOST_CHECK_EQUAL(check(off), INT64_MAX);
    std::vector<int64_t> dec = off;
    const int64_t r = int64_t(dec.size()) / 2 + 1;
    dec[size_t(r)] = dec[size_t(r) - 1] - 1;
    if (r + 5 < int64_t(dec.size())) dec[size_t(r + 5)] = -7;  // a later one too
    BOOST_CHECK_EQUAL(check(dec), r);
    dec[0] = 1;
    BOOST_CHECK_EQUAL(check(dec), 0);
  }
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(tagged_slot_keys_and_offsets_check, check_tagged_slots_and_offsets)

// The bf16 wire format: every 16-bit pattern widened, and floats rounded, against bits computed here: the upper
// half, plus one when the lower half is above 0x8000 or exactly 0x8000 with the upper half odd (ties to even; a
// carry into the exponent is the right answer, up to infinity); a NaN keeps its upper half with the quiet bit
// (0x40) set, as src/base/half.h defines.
uint16_t expected_bf16(uint32_t x) {
  const uint32_t hi = x >> 16, lo = x & 0xffffu;
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0) return uint16_t(hi | 0x40u);
  return uint16_t(hi + ((lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) ? 1u : 0u));
}

void check_bf16(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u,                            // zeros
      0x3f800000u, 0xbf800000u,                            // +-1
      0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u,  // ties: down to even, up to even, negatives too
      0x3f808001u, 0x3f807fffu, 0xbf808001u,               // just above and below a tie
      0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7e8000u,  // the largest finite: rounds to infinity; ties there
      0x7f800000u, 0xff800000u,                            // infinities
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu,  // NaNs, signaling ones too
      0x00000001u, 0x00008000u, 0x00018000u, 0x00008001u, 0x007fffffu, 0x807fffffu, 0x80008000u,  // subnormals
      0x007f8000u, 0x007fc000u,                            // subnormal rounding up to the smallest normal
  };
  for (uint32_t x : testing::random_ints(5000, 0, 0xffffffffLL)) bits.push_back(uint32_t(x));
  // n a multiple of 4 or not (the cuda launcher converts four at a time and the tail one by one); at = 1: input
  // and output one element past an aligned start (element by element)
  const int64_t nb = int64_t(bits.size());
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), nb - nb % 4, nb - nb % 4 - 3})
  for (int64_t at : {int64_t(0), int64_t(1)}) {
    std::vector<float> in(static_cast<size_t>(n + at));
    std::memcpy(in.data() + at, bits.data(), size_t(n) * 4);
    Buffer<float> ib(dev, std::max<size_t>(size_t(n + at), 1));
    if (n + at > 0) ib.upload(in);
    auto out = poisoned<uint16_t>(dev, size_t(n + at) + 1);
    route_to_bf16(dev, ib.data() + at, n, out.data() + at, dev.stream);
    std::vector<uint16_t> got = out.download();
    size_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[size_t(i + at)] != expected_bf16(bits[size_t(i)]);
    if (at == 1) BOOST_CHECK_EQUAL(got[0], 0xffffu);  // untouched, before and after
    BOOST_CHECK_EQUAL(got[size_t(n + at)], 0xffffu);
    BOOST_CHECK_MESSAGE(wrong == 0, "to bf16, n " << n << ", at " << at << ": " << wrong << " wrong");
  }
  // widening: every pattern, exactly its bits in the upper half
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  Buffer<uint16_t> ab(dev, all);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(65535), int64_t(65532)})
  for (int64_t at : {int64_t(0), int64_t(1)}) {
    auto out = poisoned<uint32_t>(dev, size_t(n + at) + 1);
    route_from_bf16(dev, ab.data() + at, n, reinterpret_cast<float*>(out.data()) + at, dev.stream);
    std::vector<uint32_t> got = out.download();
    size_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[size_t(i + at)] != (uint32_t(i + at) << 16);
    if (at == 1) BOOST_CHECK_EQUAL(got[0], 0xffffffffu);  // untouched, before and after
    BOOST_CHECK_EQUAL(got[size_t(n + at)], 0xffffffffu);
    BOOST_CHECK_MESSAGE(wrong == 0, "from bf16, n " << n << ", at " << at << ": " << wrong << " wrong");
  }
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(bf16_wire_conversions, check_bf16)

// Slots put into a 16-bit output (bf16: the bits expected_bf16 computes here; f16: src/base/half.h's
// float_to_f16, nearest even, overflow to infinity, subnormals) with the other elements untouched, and a 16-bit
// gradient's slots taken back widened (bf16: the upper half; f16: f16_to_float, exact). Ties, values that round
// up across a binade, f16 overflow and f16 subnormals among random floats.
void check_half_slots(Backend backend) {
  Device dev = backend == Backend::cuda ? open_device(Backend::cuda, 0) : Device();
  const std::vector<uint32_t> special = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f808001u, 0x7f7fffffu, 0x3f801000u,
                                         0x3f803000u, 0x477fe000u, 0x477ff000u, 0x47800000u, 0xc7800000u, 0x33800000u,
                                         0x33000000u, 0x33000001u, 0x387fc000u, 0x00000001u, 0x80000000u, 0x7f800000u};
  for (OutputType type : {OutputType::bf16, OutputType::f16}) {
    // A table serving two slots: dim 3 at columns 2 and 9 of rows of 12 elements (one element at a time); dim 4
    // at 0 and 8 of 12 (four at a time, 8-byte stores); dim 8 at 2 and 10 of 20 (four at a time, the output
    // positions not multiples of 4: element stores).
    struct Shape {
      int dim;
      std::vector<int32_t> cols;
      int64_t row;
    };
    for (const Shape& shape : {Shape{3, {2, 9}, 12}, Shape{4, {0, 8}, 12}, Shape{8, {2, 10}, 20}})
    for (int64_t batch : {int64_t(0), int64_t(1), int64_t(33)}) {
      const std::vector<int32_t>& cols = shape.cols;
      const int dim = shape.dim, ts = 2;
      const int64_t row = shape.row;
      std::vector<float> pooled = testing::random_floats(size_t(batch * ts * dim));
      for (size_t i = 0; i < pooled.size() && i < special.size(); ++i) std::memcpy(&pooled[i], &special[i], 4);
      std::vector<uint16_t> base(size_t(std::max<int64_t>(1, batch * row)));
      for (uint16_t& x : base) x = uint16_t(testing::rng()());
      Buffer<float> p(dev, std::max<size_t>(pooled.size(), 1));
      if (!pooled.empty()) p.upload(pooled);
      Buffer<int32_t> cl(dev, cols);
      Buffer<uint16_t> out(dev, base);
      route_put_slots_half(dev, p.data(), batch, ts, dim, cl.data(), row, type, out.data(), dev.stream);
      std::vector<uint16_t> want = base;
      for (int64_t s = 0; s < batch; ++s)
        for (int j = 0; j < ts; ++j)
          for (int e = 0; e < dim; ++e) {
            const float v = pooled[size_t((s * ts + j) * dim + e)];
            uint32_t x;
            std::memcpy(&x, &v, 4);
            want[size_t(s * row + cols[size_t(j)] + e)] =
                type == OutputType::bf16 ? expected_bf16(x) : float_to_f16(v);
          }
      std::vector<uint16_t> got = out.download();
      size_t wrong = 0;
      for (size_t i = 0; i < want.size(); ++i) wrong += got[i] != want[i];
      BOOST_CHECK_MESSAGE(wrong == 0, output_type_name(type) << " batch " << batch << ": " << wrong << " of "
                                                             << want.size() << " elements wrong");
      // the gradient's slots back, from random 16-bit patterns (NaNs left out: their payload is not compared)
      std::vector<uint16_t> grad(base.size());
      for (uint16_t& x : grad) {
        do x = uint16_t(testing::rng()());
        while (type == OutputType::bf16 ? (x & 0x7f80u) == 0x7f80u && (x & 0x7fu) : (x & 0x7c00u) == 0x7c00u && (x & 0x3ffu));
      }
      Buffer<uint16_t> gb(dev, grad);
      auto back = poisoned<float>(dev, pooled.size());
      route_take_slots_half(dev, gb.data(), batch, ts, dim, cl.data(), row, type, back.data(), dev.stream);
      std::vector<float> wb(pooled.size());
      for (int64_t s = 0; s < batch; ++s)
        for (int j = 0; j < ts; ++j)
          for (int e = 0; e < dim; ++e) {
            const uint16_t h = grad[size_t(s * row + cols[size_t(j)] + e)];
            wb[size_t((s * ts + j) * dim + e)] = type == OutputType::bf16 ? bf16_to_float(h) : f16_to_float(h);
          }
      BOOST_CHECK_MESSAGE(same_bits(back.download(), wb, wb.size()),
                          output_type_name(type) << " batch " << batch << ": gradient not widened exactly");
    }
  }
  if (dev.is_cuda()) close_device(dev);
}
SPARTA_BACKEND_CASES(put_and_take_slots_in_16_bits, check_half_slots)

}  // namespace
