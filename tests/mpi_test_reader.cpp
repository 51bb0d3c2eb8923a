// io/reader under MPI: every rank reads its slice of each global batch of a shared file; the samples each
// rank receives (ids read from the data) are the documented positions of the epoch's order, the slices of all
// ranks together are the epoch exactly once (shuffled or not, with or without drop_last), hold the file's
// samples, and the prefetching reader delivers what direct reads give. A bad sample is reported by
// the rank whose slice holds it, naming file, field and sample, and the ranks still agree on a verdict.
#include <mpi.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "src/base/check.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/reader.h"
#include "io/synthetic.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// Rank 0 writes a synthetic file with fresh random settings and each sample's id as its dense feature 0
// (exact in float); every rank returns its path and contents. The file is removed at the end of the scope.
struct SharedFile : testing::SharedTempPath {
  SampleBlock all;
  SyntheticConfig c;
  const int64_t chunk_rows = 128;
  explicit SharedFile(const std::string& name) : SharedTempPath("mpi_reader", name + ".h5") {
    SyntheticOptions o;
    o.samples = 1500 + static_cast<int64_t>(testing::seed() % 500);
    o.slots = 4;
    o.hotness = "1,0-3,2,1-2";
    o.max_rows = 2000;
    o.seed = testing::seed();
    c = make_synthetic_config(o);
    Teacher t(c);
    generate_samples(c, t, 0, c.num_samples, all);
    for (int64_t i = 0; i < all.size(); ++i) all.dense[i * all.num_dense] = static_cast<float>(i);
    if (testing::world_rank() == 0) {
      DatasetSchema s = synthetic_schema(c);
      WriteOptions w;
      w.chunk_rows = chunk_rows;
      DatasetWriter writer(path, s, w);
      writer.append(all);
      writer.finish();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
};

int64_t id_at(const Batch& b, int64_t k) { return static_cast<int64_t>(b.dense[k * b.num_dense]); }

bool sample_matches(const Batch& b, int64_t i, const SampleBlock& all, int64_t s) {
  const int64_t D = all.num_dense, S = all.num_slots;
  if (b.labels[i] != all.labels[s]) return false;
  if (!std::equal(b.dense.data() + i * D, b.dense.data() + (i + 1) * D, all.dense.data() + s * D)) return false;
  for (int64_t t = 0; t < S; ++t) {
    int64_t n = b.offsets[i * S + t + 1] - b.offsets[i * S + t];
    if (n != all.offsets[s * S + t + 1] - all.offsets[s * S + t]) return false;
    if (!std::equal(b.keys.data() + b.offsets[i * S + t], b.keys.data() + b.offsets[i * S + t] + n,
                    all.keys.data() + all.offsets[s * S + t]))
      return false;
  }
  return true;
}

}  // namespace

// What each rank receives, read from the data (dense feature 0 holds the sample id), against reader.h's
// contract: global batch b holds epoch positions [b*G, b*G + g), rank r of w the positions
// [b*G + r*g/w, b*G + (r+1)*g/w); without shuffling position p holds sample p; with shuffling the epoch's
// order is a permutation of whole file chunks, differs between epochs, and is the one a single rank reading
// the epoch as one batch sees (so the same for every rank count). Gathered, the epoch has every sample once.
BOOST_AUTO_TEST_CASE(slices_cover_each_global_batch_exactly_once) {
  SharedFile f("cover");
  const int world = testing::world_size(), rank = testing::world_rank();
  const int64_t N = f.c.num_samples;
  const uint64_t seed = testing::seed();
  // The shuffled order of epochs 1 and 2 as one rank alone sees it, and its properties.
  std::map<int64_t, std::vector<int64_t>> shuffled;
  for (int64_t epoch : {1, 2}) {
    ReaderOptions ro;
    ro.global_batch = N;
    ro.drop_last = false;
    ro.shuffle = true;
    ro.seed = seed;
    ro.prefetch = 0;
    DatasetReader one(f.path, ro);
    BOOST_CHECK_EQUAL(one.shuffle_block(), f.chunk_rows);  // default: the file's chunk
    Batch b = one.make_batch();
    one.read_batch(epoch, 0, b);
    for (int64_t k = 0; k < b.size; ++k) shuffled[epoch].push_back(id_at(b, k));
    const std::vector<int64_t>& order = shuffled[epoch];
    std::vector<int64_t> sorted = order, ids(N);
    std::sort(sorted.begin(), sorted.end());
    std::iota(ids.begin(), ids.end(), 0);
    BOOST_CHECK_MESSAGE(sorted == ids, "epoch " << epoch << ": not a permutation of the samples");
    int64_t split = 0;
    for (size_t p = 0; p < order.size(); ++p)
      if (order[p] % f.chunk_rows != 0) split += p == 0 || order[p - 1] != order[p] - 1;
    BOOST_CHECK_MESSAGE(split == 0, "epoch " << epoch << ": " << split << " chunks split by the shuffle");
  }
  BOOST_CHECK(shuffled[1] != shuffled[2]);
  for (bool shuffle : {false, true})
    for (bool drop_last : {true, false})
      for (int64_t G : {int64_t(4 * 64), int64_t(333)}) {
        ReaderOptions ro;
        ro.global_batch = G;
        ro.rank = rank;
        ro.world = world;
        ro.shuffle = shuffle;
        ro.seed = seed;
        ro.drop_last = drop_last;
        ro.prefetch = 2;
        DatasetReader reader(f.path, ro);
        std::vector<int64_t> mine;  // every sample id this rank received in the epoch
        int64_t misplaced = 0, mismatched = 0, batches = 0;
        reader.start_epoch(1);
        while (const Batch* b = reader.next()) {
          const int64_t g = std::min(G, N - b->index * G);
          const int64_t lo = b->index * G + rank * g / world, hi = b->index * G + (rank + 1) * g / world;
          BOOST_CHECK_EQUAL(b->index, batches);
          BOOST_CHECK_EQUAL(b->size, hi - lo);
          for (int64_t k = 0; k < std::min(b->size, hi - lo); ++k) {
            const int64_t id = id_at(*b, k);
            misplaced += id != (shuffle ? shuffled[1][lo + k] : lo + k);
            mismatched += id < 0 || id >= N || !sample_matches(*b, k, f.all, id);
            mine.push_back(id);
          }
          ++batches;
        }
        BOOST_CHECK_EQUAL(batches, drop_last ? N / G : (N + G - 1) / G);
        BOOST_CHECK_EQUAL(misplaced, 0);
        BOOST_CHECK_EQUAL(mismatched, 0);
        // Every rank's samples together: each sample of the epoch exactly once.
        int n = static_cast<int>(mine.size());
        std::vector<int> counts(world), displs(world);
        MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
        int total = 0;
        for (int r = 0; r < world; ++r) displs[r] = total, total += counts[r];
        std::vector<int64_t> all_ids(total);
        MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all_ids.data(), counts.data(), displs.data(), MPI_INT64_T,
                       MPI_COMM_WORLD);
        std::sort(all_ids.begin(), all_ids.end());
        std::vector<int64_t> want(drop_last ? (N / G) * G : N);
        for (size_t p = 0; p < want.size(); ++p) want[p] = shuffle ? shuffled[1][p] : int64_t(p);
        std::sort(want.begin(), want.end());
        BOOST_CHECK_MESSAGE(all_ids == want, "shuffle " << shuffle << " drop_last " << drop_last << " G " << G
                                                        << ": the ranks' samples are not the epoch's, once each");
      }
}

BOOST_AUTO_TEST_CASE(prefetch_matches_direct_reads) {
  SharedFile f("prefetch");
  ReaderOptions ro;
  ro.global_batch = 200;
  ro.rank = testing::world_rank();
  ro.world = testing::world_size();
  ro.shuffle = true;
  ro.shuffle_block = 50;
  ro.seed = testing::seed();
  ro.prefetch = 3;
  DatasetReader reader(f.path, ro);
  ro.prefetch = 0;
  DatasetReader direct(f.path, ro);
  Batch want = direct.make_batch();
  int64_t bad = 0, count = 0;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    reader.start_epoch(epoch);
    while (const Batch* b = reader.next()) {
      direct.read_batch(epoch, b->index, want);
      bad += b->size != want.size || b->num_keys != want.num_keys || b->segments != want.segments ||
             !std::equal(b->keys.data(), b->keys.data() + b->num_keys, want.keys.data()) ||
             !std::equal(b->dense.data(), b->dense.data() + b->size * b->num_dense, want.dense.data());
      ++count;
    }
  }
  BOOST_CHECK_EQUAL(count, 2 * reader.batches_per_epoch());
  BOOST_CHECK_EQUAL(bad, 0);
}

BOOST_AUTO_TEST_CASE(bad_sample_is_reported_by_its_rank_and_all_agree) {
  SharedFile f("bad");
  const int64_t G = 100, bad_sample = 3 * G + 57;  // batch 3
  if (testing::world_rank() == 0) {
    h5::File h = h5::open_file(f.path, true);
    std::vector<float> row(f.c.num_dense, 1.f);
    row[2] = std::nanf("");
    h5::write_rows(h, "/dense", row.data(), bad_sample, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ReaderOptions ro;
  ro.global_batch = G;
  ro.rank = testing::world_rank();
  ro.world = testing::world_size();
  ro.prefetch = 2;
  DatasetReader reader(f.path, ro);
  const int owner = static_cast<int>(57 * testing::world_size() / G);  // rank r holds [r*G/w, (r+1)*G/w)
  std::string m;
  int64_t delivered = 0;
  reader.start_epoch(0);
  try {
    while (reader.next()) ++delivered;
  } catch (const Error& e) {
    m = e.what();
  }
  const bool saw = !m.empty();
  BOOST_CHECK_EQUAL(saw, testing::world_rank() == owner);
  if (saw) {
    BOOST_CHECK_MESSAGE(m.find(f.path) != std::string::npos && m.find("/dense") != std::string::npos &&
                            m.find("sample " + std::to_string(bad_sample) + " feature 2") != std::string::npos,
                        m);
    BOOST_CHECK_EQUAL(delivered, 3);  // the batches before the bad one were delivered
  }
  // The verdict every rank agrees on: one rank saw the error.
  int mine = saw ? 1 : 0, total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  BOOST_CHECK_EQUAL(total, 1);
  BOOST_CHECK(!testing::all_ranks(!saw));  // "not every rank was fine", on every rank
}
