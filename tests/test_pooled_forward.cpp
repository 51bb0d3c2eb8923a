// Fused lookup + pooled / unpooled forward (kernels/pooled_forward.h) on every backend against a reference
// computed from the keys alone (a fresh table's rows hold the keys' initial values, so the expected output
// needs no hash table), on fresh random CSR inputs with empty bags and power-law duplicates, outputs poisoned.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

#include "src/base/buffer.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "kernels/pooled_forward.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

struct Csr {
  int64_t bags = 0;
  std::vector<int64_t> offsets;  // [bags + 1]
  std::vector<int64_t> keys;     // [nnz]
};

// batch * slots bags with 0..hot keys each (hot == 1: exactly one), keys from `distinct` values with a power law.
Csr random_csr(int64_t batch, int slots, int hot, size_t distinct, double alpha) {
  Csr c;
  c.bags = batch * slots;
  std::vector<int64_t> pool = testing::random_ints(distinct, INT64_MIN, INT64_MAX);
  pool[0] = -1;  // the marker key among them
  std::vector<double> w(distinct);
  for (size_t r = 0; r < distinct; ++r) w[r] = 1.0 / std::pow(double(r + 1), alpha);
  std::discrete_distribution<size_t> d(w.begin(), w.end());
  std::uniform_int_distribution<int> h(0, hot);
  c.offsets.push_back(0);
  for (int64_t b = 0; b < c.bags; ++b) {
    int n = hot == 1 ? 1 : h(testing::rng());
    for (int i = 0; i < n; ++i) c.keys.push_back(pool[d(testing::rng())]);
    c.offsets.push_back(int64_t(c.keys.size()));
  }
  return c;
}

// Expected output from the keys: seen(key) says whether the key's row holds its initial values (else zeros).
template <class Seen>
std::vector<float> reference(const Csr& c, const int64_t* offsets, int64_t bags, int dim, Combiner comb,
                             OutputType ot, const KeyInit& ki, Seen seen) {
  std::vector<float> out(size_t(bags) * dim, 0.f), acc(static_cast<size_t>(dim));
  for (int64_t b = 0; b < bags; ++b) {
    int64_t begin = offsets ? offsets[b] : b, end = offsets ? offsets[b + 1] : b + 1;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t i = begin; i < end; ++i)
      if (seen(i))
        for (int e = 0; e < dim; ++e) acc[e] += initial_value(ki, uint64_t(c.keys[size_t(i)]), e);
    for (int e = 0; e < dim; ++e) {
      float v = comb == Combiner::mean && end > begin ? acc[e] / float(end - begin) : acc[e];
      if (ot == OutputType::bf16) v = bf16_to_float(float_to_bf16(v));
      if (ot == OutputType::f16) v = f16_to_float(float_to_f16(v));
      out[size_t(b) * dim + e] = v;
    }
  }
  return out;
}

std::vector<float> as_floats(const std::vector<uint8_t>& raw, OutputType ot) {
  size_t n = raw.size() / output_type_bytes(ot);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    if (ot == OutputType::f32) {
      std::memcpy(&f[i], &raw[4 * i], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &raw[2 * i], 2);
      f[i] = ot == OutputType::bf16 ? bf16_to_float(h) : f16_to_float(h);
    }
  }
  return f;
}

struct Run {
  std::vector<uint8_t> out_raw;
  std::vector<float> out;
  std::vector<int64_t> rows;
};

// One forward on a table (pooled when c.offsets are used, else unpooled over c.keys).
Run forward(const Device& dev, HashTable& t, Buffer<float>& values, int dim, const KeyInit& ki, const Csr& c,
            bool pooled, LookupMode mode, Combiner comb, OutputType ot) {
  Buffer<int64_t> off(dev, c.offsets), keys(dev, c.keys.empty() ? std::vector<int64_t>{0} : c.keys);
  int64_t bags = pooled ? c.bags : int64_t(c.keys.size());
  Buffer<uint8_t> out(dev, size_t(bags) * dim * output_type_bytes(ot));
  Buffer<int64_t> rows(dev, c.keys.size() + 1);
  out.fill_bytes(0xFF);  // NaN poison
  rows.fill_bytes(0x5A);
  ForwardArgs a;
  a.table = t.view();
  a.rows_init = RowInit{values.data(), dim, ki};
  a.mode = mode;
  a.offsets = off.data();
  a.keys = keys.data();
  a.bags = bags;
  a.combiner = comb;
  a.out = out.data();
  a.out_type = ot;
  a.rows = rows.data();
  if (pooled)
    pooled_forward(dev, a, dev.stream);
  else
    unpooled_forward(dev, a, dev.stream);
  Run r;
  r.out_raw = out.download();
  r.out = as_floats(r.out_raw, ot);
  r.rows = rows.download();
  r.rows.resize(c.keys.size());
  return r;
}

double tol(OutputType ot) { return ot == OutputType::f32 ? 1e-6 : ot == OutputType::bf16 ? 8e-3 : 1e-3; }

// Train on a fresh table (every key inserted: output from initial values), check rows against the values,
// then eval on a batch mixing seen and unseen keys (unseen: zeros, row -1, counted as missing).
void train_then_eval(Backend b, int64_t batch, int slots, int hot, int dim, Combiner comb, OutputType ot,
                     size_t distinct, double alpha, bool pooled, double load_factor = 0.5) {
  BOOST_TEST_CONTEXT("backend " << int(b) << " batch " << batch << " slots " << slots << " hot " << hot << " dim "
                                << dim << " " << combiner_name(comb) << " " << output_type_name(ot) << " alpha "
                                << alpha << (pooled ? " pooled" : " unpooled") << " load factor " << load_factor) {
    Device dev = open_device(b, b == Backend::cuda ? 0 : -1);
    {
      KeyInit ki{testing::seed() + 1, 2, 0.5f};
      Csr c = random_csr(batch, slots, hot, distinct, alpha);
      int64_t cap = int64_t(distinct) + 1;
      HashTable t(dev, "pf", cap, load_factor);
      Buffer<float> values(dev, size_t(cap) * dim);
      values.fill_bytes(0xFF);
      Run r = forward(dev, t, values, dim, ki, c, pooled, LookupMode::train, comb, ot);
      t.check_errors(false, dev.stream);
      const int64_t* offs = pooled ? c.offsets.data() : nullptr;
      int64_t bags = pooled ? c.bags : int64_t(c.keys.size());
      std::vector<float> want = reference(c, offs, bags, dim, comb, ot, ki, [](int64_t) { return true; });
      BOOST_CHECK_EQUAL(testing::count_mismatches(r.out, want, tol(ot), tol(ot), "train out"), 0u);
      // rows: consistent per key, and each row holds its key's initial values.
      std::vector<float> v = values.download();
      std::unordered_map<int64_t, int64_t> row_of;
      size_t bad = 0;
      for (size_t i = 0; i < c.keys.size(); ++i) {
        int64_t row = r.rows[i];
        auto [it, fresh] = row_of.emplace(c.keys[i], row);
        bad += row < 0 || row >= cap || (!fresh && it->second != row);
        if (row >= 0 && row < cap) bad += v[size_t(row) * dim] != initial_value(ki, uint64_t(c.keys[i]), 0);
      }
      BOOST_CHECK_EQUAL(bad, 0u);
      BOOST_CHECK_EQUAL(t.size(dev.stream), int64_t(row_of.size()));

      // Eval: half the keys replaced by keys never seen.
      Csr e = c;
      std::vector<int64_t> fresh_keys = testing::random_ints(e.keys.size(), INT64_MIN, INT64_MAX);
      std::vector<bool> seen(e.keys.size());
      int64_t unseen = 0;
      for (size_t i = 0; i < e.keys.size(); ++i) {
        if (i % 2 && !row_of.count(fresh_keys[i])) e.keys[i] = fresh_keys[i];
        seen[i] = row_of.count(e.keys[i]) > 0;
        unseen += !seen[i];
      }
      Run q = forward(dev, t, values, dim, ki, e, pooled, LookupMode::eval, comb, ot);
      std::vector<float> want_e = reference(e, offs, bags, dim, comb, ot, ki, [&](int64_t i) { return bool(seen[size_t(i)]); });
      BOOST_CHECK_EQUAL(testing::count_mismatches(q.out, want_e, tol(ot), tol(ot), "eval out"), 0u);
      bad = 0;
      for (size_t i = 0; i < e.keys.size(); ++i) bad += seen[i] ? q.rows[i] != row_of[e.keys[i]] : q.rows[i] != -1;
      BOOST_CHECK_EQUAL(bad, 0u);
      BOOST_CHECK_EQUAL(t.read_meta(dev.stream).missing, unseen);
      if (unseen) BOOST_CHECK_THROW(t.check_errors(true, dev.stream), Error);
      BOOST_CHECK_EQUAL(t.size(dev.stream), int64_t(row_of.size()));  // eval inserted nothing
    }
    close_device(dev);
  }
}

void sweep(Backend b, bool large) {
  for (int dim : {1, 3, 16, 128, 256}) {
    train_then_eval(b, 1, 1, 1, dim, Combiner::sum, OutputType::f32, 1, 0, true);
    train_then_eval(b, large ? 2048 : 16, 26, 4, dim, Combiner::mean, OutputType::f32, large ? 20000 : 200, 1.1, true);
  }
  train_then_eval(b, large ? 4096 : 8, 26, 1, 128, Combiner::sum, OutputType::f32, large ? 100000 : 150, 0, true);
  train_then_eval(b, large ? 1024 : 8, 3, 9, 36, Combiner::sum, OutputType::bf16, large ? 5000 : 100, 1.05, true);
  train_then_eval(b, large ? 1024 : 8, 3, 9, 20, Combiner::mean, OutputType::f16, large ? 5000 : 100, 1.05, true);
  train_then_eval(b, large ? 1024 : 8, 2, 5, 7, Combiner::sum, OutputType::bf16, 50, 1.2, true);
  for (int dim : {3, 32, 256}) train_then_eval(b, large ? 8192 : 20, 2, 3, dim, Combiner::sum, OutputType::f32, 300, 1.1, false);
  // Hot 8 at dim 32 (4 keys resolved per batch) into a table whose slots end up nearly all taken (load factor
  // 1): most keys miss their home sector, many their first bucket, in training (inserting) and in eval.
  train_then_eval(b, large ? 4096 : 64, 8, 8, 32, Combiner::sum, OutputType::f32, large ? 4000 : 120, 0, true, 1.0);
  train_then_eval(b, large ? 4096 : 64, 8, 8, 16, Combiner::mean, OutputType::bf16, large ? 2000 : 100, 0.5, true, 1.0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_forward_matches_key_reference) { sweep(Backend::cpu, false); }

BOOST_AUTO_TEST_CASE(cuda_forward_matches_key_reference, *testing::needs_gpu()) {
  sweep(Backend::cuda, false);
  sweep(Backend::cuda, true);
}

// Two fresh GPU tables, same inputs: outputs bitwise identical (row ids may differ) and equal to the CPU's.
BOOST_AUTO_TEST_CASE(cuda_forward_is_deterministic_and_matches_cpu, *testing::needs_gpu()) {
  const int dim = 64;
  KeyInit ki{testing::seed(), 0, 0.1f};
  Csr c = random_csr(4096, 26, 6, 30000, 1.1);
  std::vector<std::vector<uint8_t>> outs;
  for (Backend b : {Backend::cuda, Backend::cuda, Backend::cpu}) {
    Device dev = open_device(b, b == Backend::cuda ? 0 : -1);
    {
      HashTable t(dev, "det", 30000, 0.5);
      Buffer<float> values(dev, size_t(30000) * dim);
      outs.push_back(forward(dev, t, values, dim, ki, c, true, LookupMode::train, Combiner::sum, OutputType::f32).out_raw);
    }
    close_device(dev);
  }
  BOOST_CHECK(outs[0] == outs[1]);
  BOOST_CHECK(outs[0] == outs[2]);
}

namespace {
// A table too small for the batch: refused keys get row -1 and contribute nothing; the error names the table.
void full_table_in_training(Backend b) {
  {
    Device dev = open_device(b, b == Backend::cuda ? 0 : -1);
    {
      const int dim = 8;
      KeyInit ki{1, 1, 1.f};
      Csr c = random_csr(64, 4, 3, 1000, 0);
      HashTable t(dev, "tiny", 50, 0.5);
      Buffer<float> values(dev, 50 * dim);
      Run r = forward(dev, t, values, dim, ki, c, true, LookupMode::train, Combiner::sum, OutputType::f32);
      try {
        t.check_errors(false, dev.stream);
        BOOST_ERROR("no error from a full table");
      } catch (const Error& e) {
        BOOST_CHECK(std::string(e.what()).find("'tiny'") != std::string::npos);
      }
      BOOST_CHECK_EQUAL(t.size(dev.stream), 50);
      std::set<int64_t> rows;
      for (int64_t row : r.rows) rows.insert(row);
      BOOST_CHECK(rows.count(-1) == 1);
      BOOST_CHECK_EQUAL(rows.size(), 51u);  // all 50 rows and -1
      std::vector<float> want = reference(c, c.offsets.data(), c.bags, dim, Combiner::sum, OutputType::f32, ki,
                                          [&](int64_t i) { return r.rows[size_t(i)] >= 0; });
      BOOST_CHECK_EQUAL(testing::count_mismatches(r.out, want, 1e-6, 1e-6, "full out"), 0u);
    }
    close_device(dev);
  }
}
}  // namespace
SPARTA_BACKEND_CASES(full_table_in_training, full_table_in_training)

BOOST_AUTO_TEST_CASE(half_conversions_round_to_nearest_even) {
  BOOST_CHECK_EQUAL(float_to_bf16(1.0f), 0x3F80);
  BOOST_CHECK_EQUAL(float_to_bf16(1.00390625f), 0x3F80);   // halfway: to even
  BOOST_CHECK_EQUAL(float_to_bf16(1.01171875f), 0x3F82);   // halfway: to even (up)
  BOOST_CHECK_EQUAL(float_to_f16(1.0f), 0x3C00);
  BOOST_CHECK_EQUAL(float_to_f16(65504.f), 0x7BFF);
  BOOST_CHECK_EQUAL(float_to_f16(65520.f), 0x7C00);
  BOOST_CHECK_EQUAL(float_to_f16(-2.0f), 0xC000);
  BOOST_CHECK_EQUAL(float_to_f16(5.9604644775390625e-08f), 0x0001);  // smallest subnormal
  BOOST_CHECK_EQUAL(float_to_f16(2.98023223876953125e-08f), 0x0000);  // half of it: to even (0)
  for (float f : testing::random_floats(1000, -100.f, 100.f)) {
    BOOST_CHECK_LE(std::fabs(f16_to_float(float_to_f16(f)) - f), std::fabs(f) * 0.0005f);
    BOOST_CHECK_LE(std::fabs(bf16_to_float(float_to_bf16(f)) - f), std::fabs(f) * 0.004f);
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_errors) {
  Device dev;
  HashTable t(dev, "x", 10, 0.5);
  ForwardArgs a;
  a.table = t.view();
  a.bags = 1;
  a.rows_init.dim = 0;
  BOOST_CHECK_THROW(pooled_forward(dev, a, dev.stream), Error);
  a.rows_init.dim = 300;
  BOOST_CHECK_THROW(unpooled_forward(dev, a, dev.stream), Error);
  a.rows_init.dim = 4;
  BOOST_CHECK_THROW(pooled_forward(dev, a, dev.stream), Error);  // null offsets and output
}
