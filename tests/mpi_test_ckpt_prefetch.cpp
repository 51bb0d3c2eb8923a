// A checkpoint saved while the dataset reader prefetches. The HDF5 that sparta builds against may be serial and
// not thread-safe (a library built without --enable-threadsafe, as on the GPU machine), so the save (main thread)
// and the reader's background thread meet only through io/h5's process-wide lock. Over several rounds, a thread
// consumes a whole epoch of batches while the main thread saves a checkpoint; every batch must hold exactly the
// samples the file was written with, and every checkpoint must verify and load exactly. Because a thread-safe
// HDF5 (Debian's) would hide a missing lock, a second case holds the lock and checks that both the reader's
// thread and a save wait for it.
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "io/checkpoint.h"
#include "io/h5.h"
#include "io/reader.h"
#include "src/base/check.h"
#include "src/base/random.h"
#include "tests/testing.h"

using namespace sparta;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSamples = 24000, kDense = 4, kSlots = 3;
const int64_t kHotness[kSlots] = {1, 2, 3};

// Sample i, written by the test and expected back from the reader: label, dense features, keys per slot.
float label_of(uint64_t seed, int64_t i) { return static_cast<float>(hash_mix(seed, i) % 2); }
float dense_of(uint64_t seed, int64_t i, int64_t j) {
  return static_cast<float>(hash_mix(seed ^ 0xD, i * kDense + j) % 2001) / 1000.0f - 1.0f;
}
int64_t keys_in(uint64_t seed, int64_t i, int64_t s) {
  return static_cast<int64_t>(hash_mix(seed ^ 0xC, i * kSlots + s) % (kHotness[s] + 1));  // 0..hotness
}
int64_t key_of(uint64_t seed, int64_t i, int64_t s, int64_t k) {
  return static_cast<int64_t>(hash_mix(seed ^ 0xA, (i * kSlots + s) * 8 + k) >> 2);
}

// The dataset format of README.md, written through io/h5 (not io/dataset's writer: this test checks the lock).
void write_dataset_file(const std::string& path, uint64_t seed) {
  std::vector<float> labels(kSamples), dense(kSamples * kDense);
  std::vector<int64_t> offsets{0}, keys;
  for (int64_t i = 0; i < kSamples; ++i) {
    labels[i] = label_of(seed, i);
    for (int64_t j = 0; j < kDense; ++j) dense[i * kDense + j] = dense_of(seed, i, j);
    for (int64_t s = 0; s < kSlots; ++s) {
      for (int64_t k = 0; k < keys_in(seed, i, s); ++k) keys.push_back(key_of(seed, i, s, k));
      offsets.push_back(static_cast<int64_t>(keys.size()));
    }
  }
  h5::File f = h5::create_file(path);
  h5::write_attr(f, "/", "format", std::string("sparta-dataset"));
  h5::write_attr(f, "/", "version", int64_t(1));
  h5::write_attr(f, "/", "num_samples", kSamples);
  h5::write_attr(f, "/", "num_dense", kDense);
  h5::write_attr(f, "/", "num_slots", kSlots);
  h5::write_attr(f, "/", "cardinality", std::vector<int64_t>(kSlots, 0));
  h5::write_attr(f, "/", "hotness", std::vector<int64_t>(kHotness, kHotness + kSlots));
  h5::write_attr(f, "/", "preprocessing", std::string("mpi_test_ckpt_prefetch"));
  h5::DatasetOptions o;
  o.chunk_rows = 1024;
  h5::write_dataset(f, "/label", labels.data(), {hsize_t(kSamples)}, o);
  h5::write_dataset(f, "/dense", dense.data(), {hsize_t(kSamples), hsize_t(kDense)}, o);
  h5::create_group(f, "/sparse");
  h5::write_dataset(f, "/sparse/offsets", offsets.data(), {offsets.size()}, o);
  h5::write_dataset(f, "/sparse/keys", keys.data(), {keys.size()}, o);
  h5::close(f);
}

// Problems in one batch against the samples it says it holds ("" when exact).
std::string check_batch(const Batch& b, uint64_t seed) {
  int64_t at = 0;
  for (const auto& seg : b.segments) {
    for (int64_t n = 0; n < seg.second; ++n, ++at) {
      const int64_t i = seg.first + n;
      if (b.labels[at] != label_of(seed, i)) return strprintf("sample %lld: label differs", (long long)i);
      for (int64_t j = 0; j < kDense; ++j)
        if (b.dense[at * kDense + j] != dense_of(seed, i, j))
          return strprintf("sample %lld: dense %lld differs", (long long)i, (long long)j);
      for (int64_t s = 0; s < kSlots; ++s) {
        const int64_t o0 = b.offsets[at * kSlots + s], o1 = b.offsets[at * kSlots + s + 1];
        if (o1 - o0 != keys_in(seed, i, s)) return strprintf("sample %lld slot %lld: key count differs", (long long)i, (long long)s);
        for (int64_t k = 0; k < o1 - o0; ++k)
          if (b.keys[o0 + k] != key_of(seed, i, s, k))
            return strprintf("sample %lld slot %lld: key %lld differs", (long long)i, (long long)s, (long long)k);
      }
    }
  }
  if (at != b.size) return strprintf("batch %lld: segments cover %lld samples, size is %lld", (long long)b.index,
                                     (long long)at, (long long)b.size);
  return "";
}

// Rank 0 writes dir/train.h5 from a seed every rank shares; returns that seed once the file exists.
uint64_t shared_dataset(const std::string& dir) {
  uint64_t seed = testing::rng()();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (testing::world_rank() == 0) {
    fs::create_directories(dir);
    write_dataset_file(dir + "/train.h5", seed);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return seed;
}

// This rank's slice of 64 samples per rank, with `prefetch` batches read ahead on the reader's thread.
ReaderOptions reader_options(int prefetch) {
  ReaderOptions ro;
  ro.global_batch = 64 * testing::world_size();
  ro.rank = testing::world_rank();
  ro.world = testing::world_size();
  ro.prefetch = prefetch;
  return ro;
}

}  // namespace

BOOST_AUTO_TEST_CASE(checkpoint_saved_while_the_reader_prefetches) {
  const int w = testing::world_size(), r = testing::world_rank();
  testing::SharedTempPath dir("ckpt_prefetch", "data");
  const uint64_t seed = shared_dataset(dir.path);
  DatasetReader reader(dir.path + "/train.h5", reader_options(3));
  const std::string root = dir.path + "/ckpt";
  // This rank's rows: a table whose every value is a function of (seed, round, key).
  auto table_for = [&](int64_t round) {
    TableRows t;
    t.name = "t";
    t.dim = 16;
    t.optimizer = "adagrad";
    t.state_width = 16;
    for (int64_t i = 0; i < 3000; ++i) {
      int64_t key = i * w + r;
      t.keys.push_back(key);
      for (int j = 0; j < 32; ++j)
        (j < 16 ? t.values : t.state).push_back(static_cast<float>(hash_mix(seed + round, key * 32 + j) % 1000));
    }
    return t;
  };
  ModelSpec spec;
  spec.tables.push_back({"t", 16, "adagrad", 16});
  for (int64_t round = 1; round <= 6; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      // A thread takes the whole epoch (the reader's own thread reads ahead of it) while this one saves.
      std::string read_error;
      int64_t batches = 0;
      reader.start_epoch(round);
      std::thread consumer([&] {
        try {
          while (const Batch* b = reader.next()) {
            std::string e = check_batch(*b, seed);
            if (!e.empty() && read_error.empty()) read_error = e;
            ++batches;
          }
        } catch (const std::exception& e) {
          read_error = e.what();
        }
      });
      TableRows mine = table_for(round);
      CheckpointMeta meta;
      meta.step = round;
      meta.config = "prefetch test";
      std::string save_error;
      try {
        save_checkpoint(MPI_COMM_WORLD, root, meta, {}, {mine});
      } catch (const Error& e) {
        save_error = e.what();
      }
      consumer.join();
      BOOST_CHECK_MESSAGE(read_error.empty(), "rank " << r << ": " << read_error);
      BOOST_CHECK_MESSAGE(save_error.empty(), "rank " << r << ": " << save_error);
      BOOST_CHECK_EQUAL(batches, reader.batches_per_epoch());
      if (r == 0) {
        VerifyReport v = verify_checkpoint(root);
        BOOST_CHECK_MESSAGE(v.ok(), "verify: " << (v.problems.empty() ? "" : v.problems[0]));
        BOOST_CHECK_EQUAL(v.manifest.meta.step, round);
      }
      LoadedCheckpoint c = load_checkpoint(MPI_COMM_WORLD, root, spec, [w](int, int64_t key) { return int(key % w); });
      BOOST_CHECK_EQUAL(c.tables.size(), 1u);
      if (c.tables.size() == 1) {
        BOOST_CHECK(c.tables[0].keys == mine.keys);
        BOOST_CHECK(c.tables[0].values == mine.values);
        BOOST_CHECK(c.tables[0].state == mine.state);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_reader_thread_and_a_save_wait_for_the_hdf5_lock) {
  using Clock = std::chrono::steady_clock;
  const int r = testing::world_rank();
  testing::SharedTempPath dir("ckpt_prefetch", "lock");
  const uint64_t seed = shared_dataset(dir.path);
  DatasetReader reader(dir.path + "/train.h5", reader_options(2));

  // A thread takes the lock, says so, holds it for `hold`, and notes when it let go.
  const auto hold = std::chrono::milliseconds(400);
  auto holder = [&](std::atomic<bool>& taken, Clock::time_point& released) {
    h5::Lock lock;
    taken = true;
    std::this_thread::sleep_for(hold);
    released = Clock::now();
  };
  {
    std::atomic<bool> taken{false};
    Clock::time_point released;
    std::thread t(holder, std::ref(taken), std::ref(released));
    while (!taken) std::this_thread::yield();
    reader.start_epoch(0);  // the reader's thread starts reading at once
    const Batch* b = reader.next();
    Clock::time_point got = Clock::now();
    t.join();
    BOOST_CHECK(b != nullptr);
    BOOST_CHECK_MESSAGE(got >= released, "rank " << r << ": a batch arrived while another thread held the HDF5 lock");
    if (b) BOOST_CHECK_EQUAL(check_batch(*b, seed), "");
    reader.start_epoch(1);  // stops the reader's thread before the next part
  }
  {
    std::atomic<bool> taken{false};
    Clock::time_point released;
    std::thread t(holder, std::ref(taken), std::ref(released));
    while (!taken) std::this_thread::yield();
    TableRows mine;
    mine.name = "t";
    mine.dim = 2;
    mine.optimizer = "sgd";
    mine.keys = {int64_t(r)};
    mine.values = {1.0f, 2.0f};
    CheckpointMeta meta;
    meta.step = 1;
    save_checkpoint(MPI_COMM_WORLD, dir.path + "/ckpt", meta, {}, {mine});
    Clock::time_point saved = Clock::now();
    t.join();
    BOOST_CHECK_MESSAGE(saved >= released, "rank " << r << ": a save finished while another thread held the HDF5 lock");
  }
}
