// reader.h: each rank's slice of every global batch of a dataset file, read ahead by a background thread
// into pinned host buffers, checked sample by sample.
//
// Global batch b of an epoch holds the samples at positions [b*G, (b+1)*G) of the epoch's order, and rank r
// of world ranks takes positions [b*G + r*G/world, b*G + (r+1)*G/world) of it (integer division, so the
// slices cover the global batch exactly once even when world does not divide G). The epoch's order is the
// file order, or with shuffling a permutation of blocks of shuffle_block samples drawn from (seed, epoch):
// the same on every rank, so the slices still partition every global batch. With drop_last, an epoch has
// floor(N/G) batches; without, a last smaller global batch holds the rest (split the same way).
//
// Every batch is checked before it is delivered (offsets monotone and within nnz, hotness, keys against
// cardinality, NaN/Inf in dense, labels in [0, 1]); a bad batch throws sparta::Error from next() naming
// the file, field and sample. The reader uses no MPI: the caller passes rank and world, and decides how to
// end the job on an error (every rank checks its own slice, so agree on the verdict or MPI_Abort).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/base/buffer.h"
#include "io/dataset.h"

namespace sparta {

struct ReaderOptions {
  int64_t global_batch = 65536;  // G: samples per step over all ranks
  int rank = 0;                  // this rank's slice
  int world = 1;
  bool drop_last = true;         // false: a last, smaller global batch holds the remaining samples (eval)
  bool shuffle = false;          // permute blocks of shuffle_block samples, anew each epoch
  int64_t shuffle_block = 0;     // 0: the file's chunk size along N
  uint64_t seed = 0;             // shuffling order: a function of (seed, epoch) only
  int prefetch = 2;              // batches read ahead by a background thread; 0: read in next()
  Backend backend = Backend::cpu;  // where batches go next: cuda gets page-locked batch memory
};

// One rank's slice of one global batch, in pinned host memory sized for the largest slice.
struct Batch {
  int64_t epoch = 0;
  int64_t index = 0;               // global batch number within the epoch
  int64_t size = 0;                // B: samples in this rank's slice
  int64_t num_keys = 0;            // nnz of the slice
  int64_t num_dense = 0, num_slots = 0;
  PinnedBuffer<float> labels;      // [B]
  PinnedBuffer<float> dense;       // [B, num_dense]
  PinnedBuffer<int64_t> offsets;   // [B*num_slots + 1], offsets[0] == 0
  PinnedBuffer<int64_t> keys;      // [num_keys] (capacity: the most keys a slice can hold)
  // Where the samples came from: (first sample in the file, count), in batch order.
  std::vector<std::pair<int64_t, int64_t>> segments;

  BlockView view() const;
};

class DatasetReader {
 public:
  // Opens and checks the file's schema; starts no thread until start_epoch.
  DatasetReader(const std::string& path, const ReaderOptions& opt);
  ~DatasetReader();
  DatasetReader(const DatasetReader&) = delete;
  DatasetReader& operator=(const DatasetReader&) = delete;

  const DatasetSchema& schema() const { return schema_; }
  const std::string& path() const { return path_; }
  const ReaderOptions& options() const { return opt_; }
  int64_t batches_per_epoch() const;
  // Samples of global batch b (G, or fewer for the last one without drop_last), and this rank's share.
  int64_t global_batch_size(int64_t b) const;
  int64_t local_batch_size(int64_t b) const;
  int64_t max_local_batch() const;
  int64_t shuffle_block() const { return block_; }

  // Starts delivering the batches of an epoch from batch `first` on (a resumed run passes its position);
  // the background thread begins reading ahead at once.
  void start_epoch(int64_t epoch, int64_t first = 0);
  // The next batch of the current epoch, or nullptr at its end. The batch stays valid until the next call
  // of next() or start_epoch(). Throws the Error of a bad batch.
  const Batch* next();

  // Dense features delivered as (x - shift[j]) * scale[j] for feature j (checked before, as the file holds them):
  // sparta-train's data.normalize. Empty vectors: as they are. Call while no epoch is being read ahead.
  void set_dense_transform(const std::vector<float>& shift, const std::vector<float>& scale);

  // Reads one batch on the caller's thread, without the prefetch queue (tests, evaluation, debugging).
  void read_batch(int64_t epoch, int64_t index, Batch& out);
  Batch make_batch() const;  // a batch with buffers of the right capacity

  // The file samples at positions [pos, pos+count) of an epoch's order, as (first sample, count) segments.
  std::vector<std::pair<int64_t, int64_t>> epoch_segments(int64_t epoch, int64_t pos, int64_t count) const;

 private:
  struct Source;
  void stop_thread();
  void producer(int64_t epoch, int64_t first, uint64_t generation);
  void read_segment(int64_t s0, int64_t n, Batch& out, int64_t at, int64_t key_at);
  // The epoch's order of blocks and where each starts in it; cached for the last epoch asked for.
  void order_of(int64_t epoch, std::vector<int64_t>& order, std::vector<int64_t>& start) const;

  std::string path_;
  ReaderOptions opt_;
  DatasetSchema schema_;
  int64_t block_ = 0;
  int64_t key_capacity_ = 0;
  std::vector<float> shift_, scale_;  // set_dense_transform
  std::unique_ptr<Source> src_;
  std::mutex read_mu_;  // one reader of the file at a time (prefetch thread or read_batch)
  mutable std::mutex order_mu_;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<int64_t> order_, order_start_;

  // Prefetch ring: slots_[i] is free, queued (ready_), or held by the caller (held_).
  std::vector<Batch> slots_;
  std::deque<int> free_, ready_;
  int held_ = -1;
  bool ended_ = false;           // the producer delivered the epoch's last batch
  std::exception_ptr error_;
  uint64_t generation_ = 0;      // bumped by start_epoch so a stale producer stops
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  // Synchronous mode (prefetch = 0).
  int64_t epoch_ = 0, cursor_ = 0;
  bool started_ = false;
};

}  // namespace sparta
