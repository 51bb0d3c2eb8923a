// io/dataset + io/reader: write/read round trips (plain, chunked, gzip, Fletcher32), reader slices and
// shuffling, prefetch against direct reads, every kind of bad file (each crafted here), and that h5py and
// h5dump read the files.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include "src/base/check.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/reader.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// <name>.h5 in a fresh temp path, removed at the end of the scope.
struct Removed : testing::ScopedPath {
  explicit Removed(const std::string& name) : ScopedPath("dataset", name + ".h5") {}
};

// A random schema and block of n samples obeying it.
DatasetSchema random_schema(int64_t slots, int64_t dense) {
  DatasetSchema s;
  s.num_dense = dense;
  s.num_slots = slots;
  for (int64_t t = 0; t < slots; ++t) {
    s.cardinality.push_back(testing::random_ints(1, 0, 3)[0] == 0 ? 0 : testing::random_ints(1, 1, 5000)[0]);
    s.hotness.push_back(testing::random_ints(1, 1, 4)[0]);
  }
  s.preprocessing = "test: random values";
  return s;
}

SampleBlock random_block(const DatasetSchema& s, int64_t n) {
  SampleBlock b;
  b.reset(s.num_dense, s.num_slots);
  for (float l : testing::random_floats(n, 0, 1)) b.labels.push_back(l < 0.3f ? 1.f : 0.f);
  b.dense = testing::random_floats(n * s.num_dense, -3, 3);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < s.num_slots; ++t) {
      int64_t count = testing::random_ints(1, 0, s.hotness[t])[0];
      int64_t hi = s.cardinality[t] > 0 ? s.cardinality[t] - 1 : (int64_t(1) << 62);
      for (int64_t k : testing::random_ints(count, 0, hi)) b.keys.push_back(k);
      b.offsets.push_back(static_cast<int64_t>(b.keys.size()));
    }
  return b;
}

// Writes block in appends of random sizes.
void write_file(const std::string& path, DatasetSchema s, const SampleBlock& all, const WriteOptions& w) {
  DatasetWriter writer(path, s, w);
  const int64_t n = all.size(), S = s.num_slots, D = s.num_dense;
  int64_t at = 0;
  while (at < n) {
    int64_t m = std::min<int64_t>(n - at, testing::random_ints(1, 1, 300)[0]);
    BlockView v;
    v.num_samples = m;
    v.labels = all.labels.data() + at;
    v.dense = all.dense.data() + at * D;
    v.offsets = all.offsets.data() + at * S;
    v.keys = all.keys.data() + all.offsets[at * S];
    writer.append(v);
    at += m;
  }
  writer.finish();
}

// Sample ids written into the data: dense feature 0 of sample i is i (exact in float below 2^24), so what a
// reader delivers can be checked without asking it where the samples came from.
void stamp_ids(SampleBlock& b) {
  for (int64_t i = 0; i < b.size(); ++i) b.dense[i * b.num_dense] = static_cast<float>(i);
}
int64_t id_at(const Batch& b, int64_t k) { return static_cast<int64_t>(b.dense[k * b.num_dense]); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  std::string m = error_of(fn);
  for (const std::string& n : needles)
    BOOST_CHECK_MESSAGE(m.find(n) != std::string::npos, "'" << n << "' missing in: " << m);
}

// Reads every batch of an epoch of a reader and returns the concatenation, one sample at a time.
struct Sample {
  float label;
  std::vector<float> dense;
  std::vector<std::vector<int64_t>> keys;
  bool operator==(const Sample& o) const { return label == o.label && dense == o.dense && keys == o.keys; }
};

Sample sample_of(const BlockView& v, int64_t i, int64_t D, int64_t S) {
  Sample s;
  s.label = v.labels[i];
  s.dense.assign(v.dense + i * D, v.dense + (i + 1) * D);
  for (int64_t t = 0; t < S; ++t)
    s.keys.emplace_back(v.keys + v.offsets[i * S + t] - v.offsets[0], v.keys + v.offsets[i * S + t + 1] - v.offsets[0]);
  return s;
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.size == b.size && a.num_keys == b.num_keys && a.segments == b.segments &&
         std::equal(a.labels.data(), a.labels.data() + a.size, b.labels.data()) &&
         std::equal(a.dense.data(), a.dense.data() + a.size * a.num_dense, b.dense.data()) &&
         std::equal(a.offsets.data(), a.offsets.data() + a.size * a.num_slots + 1, b.offsets.data()) &&
         std::equal(a.keys.data(), a.keys.data() + a.num_keys, b.keys.data());
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_plain_chunked_gzip_fletcher32) {
  for (int variant = 0; variant < 3; ++variant) {
    Removed f("rt" + std::to_string(variant));
    DatasetSchema s = random_schema(testing::random_ints(1, 1, 6)[0], testing::random_ints(1, 1, 5)[0]);
    const int64_t n = testing::random_ints(1, 500, 2500)[0];
    SampleBlock all = random_block(s, n);
    WriteOptions w;
    w.chunk_rows = variant == 0 ? 65536 : testing::random_ints(1, 16, 400)[0];
    w.gzip = variant == 2 ? 4 : 0;
    w.fletcher32 = variant >= 1;
    write_file(f.path, s, all, w);

    DatasetSchema r = read_schema(f.path);
    BOOST_CHECK_EQUAL(r.num_samples, n);
    BOOST_CHECK_EQUAL(r.num_dense, s.num_dense);
    BOOST_CHECK_EQUAL(r.num_slots, s.num_slots);
    BOOST_CHECK(r.cardinality == s.cardinality);
    BOOST_CHECK(r.hotness == s.hotness);
    BOOST_CHECK_EQUAL(r.preprocessing, s.preprocessing);
    BOOST_CHECK_EQUAL(r.num_keys, static_cast<int64_t>(all.keys.size()));
    BOOST_CHECK_LT(r.teacher_auc, 0);

    h5::File h = h5::open_file(f.path);
    BOOST_CHECK(h5::read_all<float>(h, "/label") == all.labels);
    BOOST_CHECK(h5::read_all<float>(h, "/dense") == all.dense);
    BOOST_CHECK(h5::read_all<int64_t>(h, "/sparse/offsets") == all.offsets);
    BOOST_CHECK(h5::read_all<int64_t>(h, "/sparse/keys") == all.keys);

    // The reader, one batch over the whole file, gives the same samples with offsets rebased to 0.
    ReaderOptions ro;
    ro.global_batch = n;
    ro.drop_last = false;
    ro.prefetch = 0;
    DatasetReader reader(f.path, ro);
    Batch b = reader.make_batch();
    reader.read_batch(0, 0, b);
    BOOST_CHECK_EQUAL(b.size, n);
    BOOST_CHECK(std::equal(all.labels.begin(), all.labels.end(), b.labels.data()));
    BOOST_CHECK(std::equal(all.dense.begin(), all.dense.end(), b.dense.data()));
    BOOST_CHECK(std::equal(all.offsets.begin(), all.offsets.end(), b.offsets.data()));
    BOOST_CHECK(std::equal(all.keys.begin(), all.keys.end(), b.keys.data()));
  }
}

// The ids each rank receives, read from the data itself (stamp_ids), against reader.h's contract: global
// batch b holds epoch positions [b*G, b*G + g), rank r of w the positions [b*G + r*g/w, b*G + (r+1)*g/w);
// without shuffling position p holds sample p; with shuffling the epoch's order is a permutation of whole
// blocks of shuffle_block samples, differs between epochs, and is the same for any rank count and batch size.
BOOST_AUTO_TEST_CASE(reader_slices_cover_every_global_batch_once) {
  Removed f("slices");
  DatasetSchema s = random_schema(3, 2);
  const int64_t n = testing::random_ints(1, 700, 1300)[0];
  SampleBlock all = random_block(s, n);
  stamp_ids(all);
  WriteOptions w;
  w.chunk_rows = 50;
  write_file(f.path, s, all, w);
  BlockView whole = view_of(all);
  const int64_t block = 37;
  // The order of each epoch with shuffling, as one rank reading the epoch as one batch sees it.
  std::map<int64_t, std::vector<int64_t>> shuffled;
  for (int64_t epoch : {0, 1}) {
    ReaderOptions ro;
    ro.global_batch = n;
    ro.drop_last = false;
    ro.shuffle = true;
    ro.shuffle_block = block;
    ro.seed = 99;
    ro.prefetch = 0;
    DatasetReader one(f.path, ro);
    Batch b = one.make_batch();
    one.read_batch(epoch, 0, b);
    std::vector<int64_t>& order = shuffled[epoch];
    for (int64_t k = 0; k < b.size; ++k) order.push_back(id_at(b, k));
    std::vector<int64_t> sorted = order, ids(n);
    std::sort(sorted.begin(), sorted.end());
    std::iota(ids.begin(), ids.end(), 0);
    BOOST_CHECK_MESSAGE(sorted == ids, "epoch " << epoch << ": the shuffled order is not a permutation of the samples");
    int64_t broken = 0;
    for (int64_t p = 0; p < n && p < static_cast<int64_t>(order.size()); ++p)
      if (order[p] % block != 0) broken += p == 0 || order[p - 1] != order[p] - 1;
    BOOST_CHECK_MESSAGE(broken == 0, "epoch " << epoch << ": " << broken << " blocks of " << block << " were split");
  }
  BOOST_CHECK_MESSAGE(shuffled[0] != shuffled[1], "epochs 0 and 1 in the same order");
  std::vector<int64_t> file_order(n);
  std::iota(file_order.begin(), file_order.end(), 0);
  BOOST_CHECK_MESSAGE(shuffled[0] != file_order, "epoch 0 in file order");

  for (bool shuffle : {false, true})
    for (int world : {1, 2, 3, 4})
      for (int64_t G : {int64_t(7), int64_t(64), int64_t(301)})
        for (bool drop_last : {true, false}) {
          std::vector<std::unique_ptr<DatasetReader>> readers;
          for (int r = 0; r < world; ++r) {
            ReaderOptions ro;
            ro.global_batch = G;
            ro.rank = r;
            ro.world = world;
            ro.shuffle = shuffle;
            ro.shuffle_block = shuffle ? block : 0;
            ro.seed = 99;
            ro.drop_last = drop_last;
            ro.prefetch = 0;
            readers.push_back(std::make_unique<DatasetReader>(f.path, ro));
          }
          const int64_t nb = readers[0]->batches_per_epoch();
          BOOST_CHECK_EQUAL(nb, drop_last ? n / G : (n + G - 1) / G);
          const std::string where = "shuffle " + std::to_string(shuffle) + " world " + std::to_string(world) + " G " +
                                    std::to_string(G) + " drop_last " + std::to_string(drop_last);
          for (int64_t epoch : {0, 1}) {
            std::vector<int64_t> seen;
            int64_t wrong_ids = 0, wrong_samples = 0;
            for (int64_t b = 0; b < nb; ++b) {
              const int64_t g = std::min(G, n - b * G);
              for (int r = 0; r < world; ++r) {
                Batch batch = readers[r]->make_batch();
                readers[r]->read_batch(epoch, b, batch);
                const int64_t lo = b * G + r * g / world, hi = b * G + (r + 1) * g / world;
                BOOST_CHECK_EQUAL(batch.size, hi - lo);
                BOOST_CHECK_EQUAL(batch.offsets[0], 0);
                std::vector<int64_t> from_segments;
                for (auto seg : batch.segments)
                  for (int64_t k = 0; k < seg.second; ++k) from_segments.push_back(seg.first + k);
                for (int64_t k = 0; k < std::min(batch.size, hi - lo); ++k) {
                  const int64_t id = id_at(batch, k);
                  const int64_t want = shuffle ? shuffled[epoch][lo + k] : lo + k;
                  wrong_ids += id != want || k >= static_cast<int64_t>(from_segments.size()) || from_segments[k] != id;
                  wrong_samples += id < 0 || id >= n ||
                                   !(sample_of(batch.view(), k, s.num_dense, s.num_slots) ==
                                     sample_of(whole, id, s.num_dense, s.num_slots));
                  seen.push_back(id);
                }
              }
            }
            BOOST_CHECK_MESSAGE(wrong_ids == 0, where << " epoch " << epoch << ": " << wrong_ids << " samples at the wrong place");
            BOOST_CHECK_MESSAGE(wrong_samples == 0, where << " epoch " << epoch << ": " << wrong_samples << " samples altered");
            // Exactly once: every sample without drop_last, the first nb*G positions with it.
            std::sort(seen.begin(), seen.end());
            std::vector<int64_t> want(drop_last ? nb * G : n);
            for (size_t p = 0; p < want.size(); ++p) want[p] = shuffle ? shuffled[epoch][p] : int64_t(p);
            std::sort(want.begin(), want.end());
            BOOST_CHECK_MESSAGE(seen == want, where << " epoch " << epoch << ": not every sample exactly once");
          }
        }
}

BOOST_AUTO_TEST_CASE(prefetch_gives_the_batches_of_direct_reads) {
  Removed f("prefetch");
  DatasetSchema s = random_schema(4, 3);
  const int64_t n = testing::random_ints(1, 900, 1500)[0];
  SampleBlock all = random_block(s, n);
  WriteOptions w;
  w.chunk_rows = 64;
  w.fletcher32 = true;
  write_file(f.path, s, all, w);
  for (int prefetch : {0, 1, 3}) {
    ReaderOptions ro;
    ro.global_batch = 90;
    ro.rank = 1;
    ro.world = 3;
    ro.shuffle = true;
    ro.seed = testing::seed();
    ro.drop_last = false;
    ro.prefetch = prefetch;
    DatasetReader reader(f.path, ro);
    DatasetReader direct(f.path, ro);
    Batch want = direct.make_batch();
    for (int64_t epoch : {3, 4}) {
      int64_t first = epoch == 4 ? 2 : 0;  // a resumed epoch starts mid-way
      reader.start_epoch(epoch, first);
      int64_t b = first;
      while (const Batch* got = reader.next()) {
        direct.read_batch(epoch, b, want);
        BOOST_CHECK_MESSAGE(got->epoch == epoch && got->index == b && same_batch(*got, want),
                            "prefetch " << prefetch << " epoch " << epoch << " batch " << b << " differs");
        ++b;
      }
      BOOST_CHECK_EQUAL(b, reader.batches_per_epoch());
      BOOST_CHECK(reader.next() == nullptr);
    }
    // Restarting mid-epoch while batches are queued is fine.
    reader.start_epoch(7);
    BOOST_CHECK(reader.next() != nullptr);
    reader.start_epoch(8);
    const Batch* b0 = reader.next();
    direct.read_batch(8, 0, want);
    BOOST_CHECK(b0 && same_batch(*b0, want));
  }
}

BOOST_AUTO_TEST_CASE(eval_file_must_match_the_training_file) {
  DatasetSchema a = random_schema(3, 2), b = a;
  check_compatible(a, "train.h5", b, "eval.h5");
  b.cardinality[1] += 1;
  expect_error([&] { check_compatible(a, "train.h5", b, "eval.h5"); }, {"eval.h5", "train.h5", "cardinality"});
  b = a;
  b.num_dense += 1;
  expect_error([&] { check_compatible(a, "train.h5", b, "eval.h5"); }, {"num_dense"});
}

// ---- bad input: each file is crafted from a good one

namespace {

struct BadFile {
  Removed f;
  DatasetSchema s;
  SampleBlock all;
  explicit BadFile(const std::string& name) : f(name) {
    s.num_dense = 3;
    s.num_slots = 2;
    s.cardinality = {100, 0};
    s.hotness = {1, 3};
    s.preprocessing = "crafted";
    all.reset(3, 2);
    for (int64_t i = 0; i < 40; ++i) {
      all.labels.push_back(i % 3 == 0 ? 1.f : 0.f);
      for (int j = 0; j < 3; ++j) all.dense.push_back(0.5f * j + i);
      all.keys.push_back(i * 2);
      all.offsets.push_back(all.keys.size());
      for (int k = 0; k < i % 4; ++k) all.keys.push_back(1000 + i * 10 + k);
      all.offsets.push_back(all.keys.size());
    }
    WriteOptions w;
    w.chunk_rows = 16;
    write_file(f.path, s, all, w);
  }
  h5::File open() { return h5::open_file(f.path, true); }
  // Reads every batch of every rank of 2 (the checks run per batch).
  void read_all_batches() {
    for (int r = 0; r < 2; ++r) {
      ReaderOptions ro;
      ro.global_batch = 10;
      ro.rank = r;
      ro.world = 2;
      ro.prefetch = 1;
      DatasetReader reader(f.path, ro);
      reader.start_epoch(0);
      while (reader.next()) {
      }
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(good_crafted_file_reads) {
  BadFile b("good");
  b.read_all_batches();
  BOOST_CHECK_EQUAL(read_schema(b.f.path).num_samples, 40);
}

BOOST_AUTO_TEST_CASE(truncated_file_is_rejected) {
  BadFile b("trunc");
  std::ifstream in(b.f.path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t keep : {bytes.size() / 2, bytes.size() - 100, size_t(300)}) {
    std::ofstream(b.f.path, std::ios::binary | std::ios::trunc).write(bytes.data(), keep);
    expect_error([&] { b.read_all_batches(); }, {b.f.path});
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "truncated"});
  }
  std::ofstream(b.f.path, std::ios::binary | std::ios::trunc).write(bytes.data(), 0);
  expect_error([&] { read_schema(b.f.path); }, {b.f.path, "not an HDF5 file"});
}

BOOST_AUTO_TEST_CASE(missing_dataset_or_attribute_is_rejected) {
  {
    BadFile b("nodense");
    H5Ldelete(b.open().id(), "/dense", H5P_DEFAULT);
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "missing dataset '/dense'"});
  }
  {
    BadFile b("nokeys");
    H5Ldelete(b.open().id(), "/sparse/keys", H5P_DEFAULT);
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "missing dataset '/sparse/keys'"});
  }
  for (const char* attr : {"hotness", "cardinality", "num_samples", "format", "version"}) {
    BadFile b(std::string("noattr_") + attr);
    H5Adelete(b.open().id(), attr);
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, std::string("missing attribute '") + attr + "'"});
  }
}

BOOST_AUTO_TEST_CASE(wrong_shapes_or_types_are_rejected) {
  {
    BadFile b("shape_dense");
    h5::write_attr(b.open(), "/", "num_dense", int64_t(4));
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "'/dense'", "expected shape [40, 4], found [40, 3]"});
  }
  {
    BadFile b("shape_samples");
    h5::write_attr(b.open(), "/", "num_samples", int64_t(41));
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "'/label'", "expected shape [41], found [40]"});
  }
  {
    BadFile b("card_len");
    h5::write_attr(b.open(), "/", "cardinality", std::vector<int64_t>{100, 0, 5});
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "cardinality", "expected 2 values", "found 3"});
  }
  {
    BadFile b("type_keys");
    {
      h5::File h = b.open();
      H5Ldelete(h.id(), "/sparse/keys", H5P_DEFAULT);
      std::vector<float> k(b.all.keys.size(), 1.f);
      h5::write_dataset(h, "/sparse/keys", k.data(), {k.size()});
    }
    expect_error([&] { read_schema(b.f.path); },
                 {b.f.path, "'/sparse/keys'", "expected integers to read as int64, found float32"});
  }
  {
    BadFile b("last_offset");
    int64_t wrong = static_cast<int64_t>(b.all.keys.size()) - 1;
    h5::write_rows(b.open(), "/sparse/offsets", &wrong, 80, 1);
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "/sparse/offsets", "expected nnz"});
  }
}

namespace {

// Replaces a dataset of a crafted file by the same values in another element type.
template <class T, class S>
void retype(const h5::File& h, const std::string& path, const std::vector<S>& values, std::vector<hsize_t> dims) {
  H5Ldelete(h.id(), path.c_str(), H5P_DEFAULT);
  std::vector<T> v(values.begin(), values.end());
  h5::write_dataset<T>(h, path, v.data(), dims);
}

// Reads every batch of one rank (global batch 7, shuffled) and puts the samples back in file order.
SampleBlock read_back(const std::string& path, const DatasetSchema& s) {
  ReaderOptions ro;
  ro.global_batch = 7;
  ro.drop_last = false;
  ro.shuffle = true;
  ro.shuffle_block = 3;
  ro.prefetch = 1;
  DatasetReader reader(path, ro);
  std::map<int64_t, std::tuple<float, std::vector<float>, std::vector<std::vector<int64_t>>>> by_sample;
  reader.start_epoch(0);
  while (const Batch* b = reader.next()) {
    int64_t i = 0;
    for (const auto& seg : b->segments)
      for (int64_t k = 0; k < seg.second; ++k, ++i) {
        std::vector<float> d(b->dense.data() + i * s.num_dense, b->dense.data() + (i + 1) * s.num_dense);
        std::vector<std::vector<int64_t>> keys;
        for (int64_t t = 0; t < s.num_slots; ++t)
          keys.emplace_back(b->keys.data() + b->offsets[i * s.num_slots + t],
                            b->keys.data() + b->offsets[i * s.num_slots + t + 1]);
        by_sample[seg.first + k] = {b->labels[i], d, keys};
      }
  }
  SampleBlock out;
  out.reset(s.num_dense, s.num_slots);
  for (auto& [sample, v] : by_sample) {
    out.labels.push_back(std::get<0>(v));
    out.dense.insert(out.dense.end(), std::get<1>(v).begin(), std::get<1>(v).end());
    for (const auto& k : std::get<2>(v)) {
      out.keys.insert(out.keys.end(), k.begin(), k.end());
      out.offsets.push_back(static_cast<int64_t>(out.keys.size()));
    }
  }
  return out;
}

}  // namespace

// numpy's and pandas' default types (float64 labels and dense features, int32 keys, an int64 label column) are
// read as float32 and int64: the values the reader delivers are the file's, converted by static_cast here.
BOOST_AUTO_TEST_CASE(numpy_default_types_are_read) {
  BadFile b("numpy_types");
  std::vector<double> dense64(b.all.dense.size()), labels64(b.all.labels.size());
  const std::vector<float> noise = testing::random_floats(dense64.size(), -1000, 1000);
  for (size_t i = 0; i < dense64.size(); ++i) dense64[i] = double(noise[i]) / 3.0;  // not exact in float32
  for (size_t i = 0; i < labels64.size(); ++i) labels64[i] = b.all.labels[i];
  {
    h5::File h = b.open();
    retype<double>(h, "/dense", dense64, {40, 3});
    retype<double>(h, "/label", labels64, {40});
    retype<int32_t>(h, "/sparse/keys", b.all.keys, {b.all.keys.size()});
    retype<int32_t>(h, "/sparse/offsets", b.all.offsets, {b.all.offsets.size()});
  }
  SampleBlock got = read_back(b.f.path, read_schema(b.f.path));
  BOOST_REQUIRE_EQUAL(got.size(), 40);
  for (size_t i = 0; i < dense64.size(); ++i) BOOST_REQUIRE_EQUAL(got.dense[i], static_cast<float>(dense64[i]));
  BOOST_CHECK(got.labels == b.all.labels);
  BOOST_CHECK(got.keys == b.all.keys);
  BOOST_CHECK(got.offsets == b.all.offsets);
  {
    h5::File h = b.open();
    retype<int64_t>(h, "/label", b.all.labels, {40});  // pandas: an int64 column of 0 and 1
    retype<uint8_t>(h, "/sparse/keys", std::vector<int64_t>(b.all.keys.size(), 7), {b.all.keys.size()});
  }
  got = read_back(b.f.path, read_schema(b.f.path));
  BOOST_CHECK(got.labels == b.all.labels);
  BOOST_CHECK(got.keys == std::vector<int64_t>(b.all.keys.size(), 7));
}

// Values their reading type cannot hold are errors naming the file, the dataset, the element and the value.
BOOST_AUTO_TEST_CASE(values_that_do_not_fit_are_rejected) {
  {
    BadFile b("dense_beyond_float32");
    std::vector<double> dense64(b.all.dense.begin(), b.all.dense.end());
    dense64[5 * 3 + 1] = 1e300;
    dense64[9 * 3 + 2] = std::numeric_limits<double>::infinity();  // infinite, not out of range: named as such
    retype<double>(b.open(), "/dense", dense64, {40, 3});
    expect_error([&] { b.read_all_batches(); },
                 {b.f.path, "dataset '/dense', row 5, column 1", "1.0000000000000001e+300 does not fit float32",
                  "the file stores float64"});
    dense64[5 * 3 + 1] = 0;
    retype<double>(b.open(), "/dense", dense64, {40, 3});
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "/dense: sample 9 feature 2 is inf"});
  }
  {
    BadFile b("key_beyond_int64");
    std::vector<uint64_t> keys(b.all.keys.begin(), b.all.keys.end());
    keys[3] = (uint64_t(1) << 63) + 5;
    retype<uint64_t>(b.open(), "/sparse/keys", keys, {keys.size()});
    expect_error([&] { b.read_all_batches(); },
                 {b.f.path, "dataset '/sparse/keys', row 3", "9223372036854775813 does not fit int64", "uint64"});
  }
}

BOOST_AUTO_TEST_CASE(bad_offsets_are_rejected) {
  {
    BadFile b("monotone");
    int64_t v = 1;  // sample 12, slot 1 ends before it starts
    h5::write_rows(b.open(), "/sparse/offsets", &v, 12 * 2 + 2, 1);
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "/sparse/offsets", "not monotone", "sample 12 slot 1"});
  }
  {
    BadFile b("hotness");
    h5::write_attr(b.open(), "/", "hotness", std::vector<int64_t>{1, 2});
    expect_error([&] { b.read_all_batches(); },
                 {b.f.path, "/sparse/offsets", "sample 3 slot 1 has 3 keys", "expected at most hotness[1] = 2"});
  }
  {
    // Large hotness, then offsets of samples 15..19 pointing past nnz while staying monotone.
    BadFile b("beyond");
    const int64_t nnz = static_cast<int64_t>(b.all.keys.size());
    {
      h5::File h = b.open();
      h5::write_attr(h, "/", "hotness", std::vector<int64_t>{1000, 1000});
      std::vector<int64_t> far(10, nnz + 5);
      h5::write_rows(h, "/sparse/offsets", far.data(), 30, 10);
    }
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "/sparse/offsets", "beyond the nnz"});
  }
}

BOOST_AUTO_TEST_CASE(bad_values_are_rejected) {
  {
    BadFile b("card");
    int64_t key = 100;  // slot 0 has cardinality 100
    h5::write_rows(b.open(), "/sparse/keys", &key, b.all.offsets[7 * 2], 1);
    expect_error([&] { b.read_all_batches(); },
                 {b.f.path, "/sparse/keys", "sample 7 slot 0 has key 100", "expected key < cardinality[0] = 100"});
  }
  {
    BadFile b("negkey");
    int64_t key = -3;
    h5::write_rows(b.open(), "/sparse/keys", &key, b.all.offsets[9 * 2 + 1], 1);
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "sample 9 slot 1 has key -3", "expected keys >= 0"});
  }
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    BadFile b("nan");
    float row[3] = {1.f, bad, 2.f};
    h5::write_rows(b.open(), "/dense", row, 33, 1);
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "/dense", "sample 33 feature 1", "expected a finite value"});
  }
  {
    BadFile b("label");
    float l = 2.f;
    h5::write_rows(b.open(), "/label", &l, 5, 1);
    expect_error([&] { b.read_all_batches(); }, {b.f.path, "/label", "sample 5 is 2", "expected a value in [0, 1]"});
  }
}

BOOST_AUTO_TEST_CASE(unknown_format_version_or_incomplete_file_is_rejected) {
  {
    BadFile b("version");
    h5::write_attr(b.open(), "/", "version", int64_t(2));
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "'version'", "unknown format version 2, expected 1"});
  }
  {
    BadFile b("format");
    h5::write_attr(b.open(), "/", "format", std::string("hugectr-raw"));
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "'format'", "expected \"sparta-dataset\"", "\"hugectr-raw\""});
  }
  {
    BadFile b("vtype");
    h5::write_attr(b.open(), "/", "version", std::string("1"));
    expect_error([&] { read_schema(b.f.path); }, {b.f.path, "'version'", "expected an integer"});
  }
  {
    // A writer that never finished leaves num_samples = -1.
    Removed f("incomplete");
    {
      BadFile b("incomplete_src");
      DatasetWriter w(f.path, b.s);
      w.append(b.all);
    }
    expect_error([&] { read_schema(f.path); }, {f.path, "num_samples", "incomplete"});
  }
}

BOOST_AUTO_TEST_CASE(writer_rejects_bad_samples) {
  BadFile b("writer_src");
  Removed f("writer");
  DatasetWriter w(f.path, b.s);
  SampleBlock bad = b.all;
  bad.keys[bad.offsets[11 * 2]] = 500;
  expect_error([&] { w.append(bad); }, {f.path, "sample 11 slot 0 has key 500"});
  bad = b.all;
  bad.dense[4] = std::nanf("");
  expect_error([&] { w.append(bad); }, {f.path, "/dense", "sample 1 feature 1"});
  DatasetSchema s = b.s;
  s.hotness[0] = 0;
  expect_error([&] { DatasetWriter(f.path, s); }, {f.path, "hotness[0]", "expected >= 1"});
  w.append(b.all);
  w.finish();
  BOOST_CHECK_EQUAL(read_schema(f.path).num_samples, 40);
}

BOOST_AUTO_TEST_CASE(h5py_reads_the_files) {
  BadFile b("h5py");
  double label_sum = 0, dense_sum = 0;
  long long key_sum = 0;
  for (float x : b.all.labels) label_sum += x;
  for (float x : b.all.dense) dense_sum += x;
  for (int64_t k : b.all.keys) key_sum += k;
  // make test installs h5py (make deps): a missing one is a failure, not a silent pass.
  const std::string py = testing::python();
  BOOST_REQUIRE_MESSAGE(std::system((py + " -c 'import h5py' >/dev/null 2>&1").c_str()) == 0,
                        py << " cannot import h5py: install python3-h5py (make deps)");
  std::string cmd = py + " -c \"import h5py; f = h5py.File('" + b.f.path +
                    "', 'r'); a = f.attrs; print(a['format'].decode() if isinstance(a['format'], bytes) else "
                    "a['format'], int(a['num_samples']), float(f['label'][:].sum()), float(f['dense'][:].sum()), "
                    "int(f['sparse/keys'][:].sum()), int(f['sparse/offsets'][-1]), [int(x) for x in a['hotness']])\"";
  testing::CommandResult r = testing::run_command(cmd, false);  // stdout only: stderr stays out of the value
  BOOST_CHECK_EQUAL(r.status, 0);
  std::string want = strprintf("sparta-dataset 40 %.1f %.1f %lld %zu [1, 3]\n", label_sum, dense_sum, key_sum,
                               b.all.keys.size());
  BOOST_CHECK_EQUAL(r.output, want);
}

BOOST_AUTO_TEST_CASE(h5dump_reads_the_files, *testing::needs_hdf5_tools()) {
  BadFile b("h5dump");
  // make test installs h5dump (make deps): a missing one is a failure, not a silent pass.
  BOOST_REQUIRE_MESSAGE(std::system("command -v h5dump >/dev/null 2>&1") == 0,
                        "h5dump not found: install hdf5-tools (make deps)");
  // h5dump shows the datasets with their shapes, and the format attribute's value.
  testing::CommandResult d = testing::run_command("h5dump -H " + b.f.path + " && h5dump -a /format " + b.f.path, false);
  BOOST_CHECK_EQUAL(d.status, 0);
  for (const char* part : {"DATASET \"label\"", "( 40 )", "DATASET \"dense\"", "( 40, 3 )", "DATASET \"keys\"",
                           "\"sparta-dataset\""})
    BOOST_CHECK_MESSAGE(d.output.find(part) != std::string::npos, "h5dump: '" << part << "' missing in:\n" << d.output);
}

// A user's bad dataset is not a crash: bench_reader on one rank prints the message naming the file, the
// field and the sample, and exits with status 1 with MPI finalized (no MPI_Abort banner).
BOOST_AUTO_TEST_CASE(bench_reader_on_a_bad_file_exits_with_the_message) {
  BadFile b("bench_nan");
  float row[3] = {1.f, std::nanf(""), 2.f};
  h5::write_rows(b.open(), "/dense", row, 21, 1);
  Removed text("bench_text");
  std::ofstream(text.path) << "not a dataset\n";
  const std::string nan_args = "--file " + b.f.path + " --batch 8 --repeats 1";
  for (const std::string& args : {nan_args, "--file " + text.path, std::string("--bogus")}) {
    testing::CommandResult r = testing::run_command(testing::tool_command("../bin/bench_reader", 1, args, 120));
    BOOST_TEST_MESSAGE(r.output);
    BOOST_CHECK_MESSAGE(r.status == 1, args << ": exit status " << r.status << ", expected 1");
    BOOST_CHECK_MESSAGE(r.output.find("bench_reader: ") != std::string::npos, args << ": no message in:\n" << r.output);
    BOOST_CHECK_MESSAGE(r.output.find("MPI_Abort") == std::string::npos && r.output.find("Abort(") == std::string::npos,
                        args << ": the job was aborted:\n" << r.output);
    const std::vector<std::string> parts =
        args == nan_args ? std::vector<std::string>{b.f.path, "/dense", "sample 21 feature 1"}
                         : args == "--bogus" ? std::vector<std::string>{"bogus"}
                                             : std::vector<std::string>{text.path, "not an HDF5 file"};
    for (const std::string& part : parts)
      BOOST_CHECK_MESSAGE(r.output.find(part) != std::string::npos, args << ": '" << part << "' missing in:\n" << r.output);
  }
}
