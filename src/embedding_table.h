// embedding_table.h: one embedding table of a rank: a GPU hash table (keys → rows) or a direct index (row by
// arithmetic, for bounded keys: direct_stride below), the values [capacity_rows, dim] and the optimizer state
// [capacity_rows, optimizer_state_width] (layout in kernels/embedding_types.h), with the lookups the placements
// call and the export/load that checkpoints use.
//
// Hashed, rows are handed out densely (0, 1, 2, ...) and never freed, so values[0:size) and state[0:size) are
// the live rows, in the order export_rows() lists their keys (a direct index: every row, from the start). A new
// row's values come from (seed, table_id, key) (kernels/key_init.h); its state starts at the optimizer's initial
// state (set for all rows up front, and again by clear(): zeros, adagrad's initial_accumulator, lazy_adam's last
// step 0), which is what kernels/sparse_optimizer.h requires of a row it has never updated.
//
// A train step: pooled_forward (train, rows out) → the model's gradient of the pooled output →
// backward_and_update (kernels/embedding_backward.h), which sums each touched row's gradient in a fixed order
// and applies the table's optimizer to it; or, with sgd's atomic_update, adds each key's step to its row
// with float atomics (kernels/atomic_sgd.h: no sort, not bitwise reproducible). row_gradients and its two
// parts always take the fixed order.
//
// Streams: every operation takes the stream it runs on as its last parameter (the cpu backend ignores it), and
// says whether it synchronizes the host. Operations on different streams are not ordered by the table: the
// caller orders them (an event, or a synchronization), as for any CUDA work. A step on one stream
// (forward with Check::deferred, backward, check_lookups) synchronizes the host once, in check_lookups.
// Destroying a table frees its memory at once: synchronize the streams that used it first.
//
// Limits, checked when the table is built (before anything is allocated) and at the entry of every call whose
// counts reach a backward (backward_and_update, and train lookups: their rows feed one): the backward sorts row
// ids as uint32 and counts keys in int32 (kernels/embedding_backward.h), so capacity_rows <= kBackwardMaxRows,
// and max_batch_keys and the keys and bags of one call <= kBackwardMaxKeys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "io/table_rows.h"
#include "src/base/device.h"
#include "kernels/embedding_backward.h"
#include "kernels/embedding_types.h"
#include "kernels/hash_table.h"
#include "kernels/key_init.h"
#include "kernels/pooled_forward.h"
#include "src/host_tier.h"

namespace sparta {

struct EmbeddingTableConfig {
  std::string name = "table";
  int table_id = 0;
  int dim = 16;                  // 1..256
  int64_t capacity_rows = 0;     // rows the table may hold; one more is a "full" error
  double max_load_factor = 0.5;  // of the hash slots, (0, 1]
  uint64_t seed = 0;
  float init_scale = 0.05f;      // initial values uniform in [-init_scale, init_scale)
  // Tagged keys (several tables in one, kernels/key_init.h): a new row's values come from (seed, key >> 56,
  // key & (2^56 - 1)), so table_id is not used.
  bool tagged_keys = false;
  OptimizerConfig optimizer;
  // A direct index instead of hash slots (kernels/hash_table.h, DirectIndex), for keys known to be bounded:
  // direct_stride > 0 holds the keys direct_offset + row * direct_stride for row < capacity_rows (stride 1:
  // keys 0 .. capacity_rows - 1; the shard of the keys with key % world == rank: stride world, offset rank).
  // A lookup then loads the row and nothing else. Every row exists from the start with its initial values: an
  // eval lookup of a key never trained gives them (not zeros), size() is capacity_rows, export_rows lists every
  // row, and load_rows writes rows by key (a key outside the index is an error). Keys outside the index are
  // refused in train (an error at the check) and give zeros in eval. max_load_factor is not used; tagged_keys
  // cannot be set.
  int64_t direct_stride = 0;
  int64_t direct_offset = 0;
  // Several tables' keys end to end (kernels/key_init.h KeySegment; a group of direct-index tables, hashed for
  // hybrid's hot copy): key_begin ascending from 0. A row's initial values then come from (seed, table_id,
  // key - key_begin) of its key's segment. Empty: (seed, table_id, key). Not with tagged_keys.
  std::vector<KeySegment> key_segments;
  // Keys per batch the backward workspace is sized for at construction; 0: sized by the first
  // backward_and_update. A larger batch later grows it (one reallocation, then reused every step).
  // At most kBackwardMaxKeys.
  int64_t max_batch_keys = 0;
  // The values' storage (kernels/embedding_types.h RowStorage): fp32, or bf16 / fp16 (half the bytes of every
  // lookup and update; arithmetic in fp32, new rows rounded to nearest, updates rounded stochastically from
  // seed: kernels/row_storage.h). 16-bit storage takes sgd or rowwise_adagrad (its accumulator stays fp32), an
  // even dim and no atomic_update (check_row_storage).
  RowStorage storage = RowStorage::fp32;
  // Where the rows live (src/host_tier.h): hbm, or host memory under a GPU cache of tier.cache_rows rows. A
  // tiered table's device part (values(), state(), hash(), memory_bytes) is the cache, a direct index over
  // slots; its rows are cache slots, its lookups synchronize the stream (the keys are made resident first: the
  // misses through the host), and the kBackwardMaxRows limit applies to the cache, not to capacity_rows. Beside
  // the cache the tier keeps a slot index on the device: 4 bytes per row of capacity_rows, and for a hashed table
  // a device hash table of its keys (kernels/hash_table.h at load factor 0.5), not counted in memory_bytes.
  TierConfig tier;
};

// What an eval lookup does with a key the table does not hold.
enum class MissingKey { zeros, error };
// When a lookup's errors (full table in train, missing keys with MissingKey::error) are checked: at once (the
// call synchronizes), or later by check_lookups(), so that a train step (forward, the model, backward) runs
// without a host synchronization in the middle. Deferring loses nothing: a refused key has row -1, which the
// backward skips, and the table's counters keep every error until a check reads them.
enum class Check { now, deferred };

class EmbeddingTable {
 public:
  // Checks the config (sparta::Error naming the table, the setting, its limit and the value found) before
  // allocating anything, then allocates everything up front (memory_bytes tells how much; plus the backward
  // workspace when cfg.max_batch_keys > 0, and with sgd's atomic_update at dims >= 32 on cuda two bits of row marks
  // per row, capacity_rows / 4 bytes) and initializes it on dev.stream, which is then synchronized: the
  // table is ready for work on any stream when the constructor returns.
  EmbeddingTable(const Device& dev, const EmbeddingTableConfig& cfg);

  // Device bytes a table of these settings takes: hash slots (none with a direct index), values and optimizer
  // state.
  static size_t memory_bytes(int64_t capacity_rows, int dim, OptimizerKind optimizer, double max_load_factor,
                             bool direct_index = false, RowStorage storage = RowStorage::fp32);

  const EmbeddingTableConfig& config() const { return cfg_; }
  const std::string& name() const { return cfg_.name; }
  const Device& device() const { return dev_; }
  int dim() const { return cfg_.dim; }
  int state_width() const { return state_width_; }
  int64_t capacity_rows() const { return cfg_.capacity_rows; }
  KeyInit key_init() const;
  // Live rows. Synchronizes stream.
  int64_t size(Stream stream) { return tier_ ? tier_->size(stream) : hash_.size(stream); }

  // The row layout, for code that moves rows without reading them (e.g. a tier below the device): values are
  // [capacity_rows, dim] elements of storage(), row_bytes() bytes a row, at row_data().
  RowStorage storage() const { return cfg_.storage; }
  size_t row_bytes() const { return size_t(cfg_.dim) * row_storage_bytes(cfg_.storage); }
  void* row_data() { return values_.data(); }
  float* values() { return cfg_.storage == RowStorage::fp32 ? values_.data() : nullptr; }  // [capacity_rows, dim] fp32
  float* state() { return state_.data(); }    // [capacity_rows, state_width] (nullptr for sgd)
  HashTable& hash() { return hash_; }

  // Fused lookup and pooling; device pointers. offsets [bags + 1], keys [nnz] → out [bags, dim] of out_type,
  // rows [nnz] (may be null). train inserts unseen keys; eval gives zeros for them or, with
  // MissingKey::error, throws. The lookup is asynchronous on stream. Check::now: train, and eval with
  // MissingKey::error, then synchronize stream to check (a full table throws sparta::Error naming the table,
  // its capacity and the rows asked for); eval with MissingKey::zeros never synchronizes. Check::deferred:
  // never synchronizes; check_lookups reports the errors later. (A tiered table synchronizes in every lookup,
  // and with Check::now checks its evaluations too: keys its cache had no room for.) In train mode bags must be within the
  // backward's limit (kBackwardMaxKeys; sparta::Error naming the table otherwise). out_layout: where each bag
  // goes in out (kernels/embedding_types.h BagLayout; default [bags, dim]). nnz: the keys' count (offsets[bags])
  // where the caller knows it, else -1 (a tiered table then reads it from the device).
  void pooled_forward(const int64_t* offsets, const int64_t* keys, int64_t bags, Combiner combiner, LookupMode mode,
                      void* out, OutputType out_type, int64_t* rows, MissingKey missing, Check check, Stream stream,
                      const BagLayout& out_layout = {}, int64_t nnz = -1);
  // One vector per key: keys [nnz] → out [nnz, dim]; otherwise as pooled_forward. In train mode nnz must be
  // within the backward's limit (kBackwardMaxKeys; sparta::Error naming the table otherwise), since its rows
  // feed a backward.
  void unpooled_forward(const int64_t* keys, int64_t nnz, LookupMode mode, void* out, OutputType out_type,
                        int64_t* rows, MissingKey missing, Check check, Stream stream);
  // The check of lookups made with Check::deferred (synchronizes stream): throws sparta::Error when keys were
  // refused (full table) or, with MissingKey::error, when eval keys were missing, since the last check.
  void check_lookups(MissingKey missing, Stream stream);
  // rows[i] = row of keys[i] or -1. Asynchronous on stream.
  void find(const int64_t* keys, int64_t n, int64_t* rows, Stream stream);

  // The backward of a pooled train forward and optimizer step `step` (the global step, from 1) on the rows the
  // batch touched. offsets [bags + 1] and rows [nnz] are those of the pooled_forward (rows < 0 — refused or
  // missing keys — contribute nothing), grad [bags, dim] is the gradient of its output, combiner its combiner.
  // Device pointers; asynchronous on stream: no synchronization and no allocation once the workspace holds
  // nnz keys (growing it synchronizes the stream of the previous backward, then frees the old workspace).
  // Throws sparta::Error naming the table, before anything runs, on bad sizes, on nnz or bags above
  // kBackwardMaxKeys, or on a bad step.
  void backward_and_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz, const float* grad,
                           Combiner combiner, int64_t step, Stream stream);
  // The same with the optimizer's learning rate scaled by lr_scale (>= 0, finite) for this step: a learning-rate
  // schedule (lr_scale 1 is the call above). grad_layout: where each bag's gradient lies in grad (default [bags,
  // dim]), here and in finish_update and finish_row_gradients.
  void backward_and_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz, const float* grad,
                           Combiner combiner, int64_t step, float lr_scale, Stream stream,
                           const BagLayout& grad_layout = {});
  // backward_and_update in two parts (kernels/embedding_backward.h backward_and_update_prepare / _finish), so that
  // the part that needs no gradient (the sort of the rows) runs before the gradient is there (e.g. while it travels
  // to the rows' owner): prepare_update takes the batch but the gradient, finish_update the same batch with it and
  // applies the step, with backward_and_update's bits. With atomic_update nothing is sorted: the prepare does
  // nothing, the finish is the update. The caller keeps offsets and rows alive and unchanged in between; any other
  // backward of the table in between replaces the prepared batch, and a finish with none prepared throws
  // sparta::Error naming the table.
  void prepare_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz, Combiner combiner,
                      Stream stream);
  void finish_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz, const float* grad,
                     Combiner combiner, int64_t step, float lr_scale, Stream stream, const BagLayout& grad_layout = {});
  // The gradient of every row the batch touched, summed in kernels/embedding_backward.h's fixed order, without
  // applying it (a replica's share of an update that every copy applies), and the row's key: offsets, rows, bags,
  // nnz, grad and combiner as for backward_and_update, keys [nnz] the lookup's keys; unique_keys [nnz] and
  // row_grads [nnz, dim] are written for the first *num_unique ([1] int32, device memory) rows, in ascending row
  // order. Asynchronous on stream; the same errors as backward_and_update.
  void row_gradients(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags, int64_t nnz,
                     const float* grad, Combiner combiner, int64_t* unique_keys, float* row_grads,
                     int32_t* num_unique, Stream stream);
  // row_gradients in two parts (kernels/embedding_backward.h: embedding_backward_prepare / _finish), so that the
  // part that needs no gradient (the sort of the rows) runs right after the forward and only the reduction waits
  // for grad. prepare_row_gradients takes offsets, keys, rows, bags, nnz and combiner as row_gradients does and
  // writes unique_keys and *num_unique (readable once it is done; row_gradients writes the same). Asynchronous on
  // stream; the same errors as row_gradients (grad aside).
  void prepare_row_gradients(const int64_t* offsets, const int64_t* keys, const int64_t* rows, int64_t bags,
                             int64_t nnz, Combiner combiner, int64_t* unique_keys, int32_t* num_unique,
                             Stream stream);
  // finish_row_gradients writes row_grads [nnz, dim] of the prepared batch from grad [bags, dim], with the bits of
  // row_gradients. It reads the prepared batch's offsets (mean) and its sorted rows: the caller keeps offsets and
  // rows alive and unchanged in between. Asynchronous on stream: the prepare's stream or one ordered after it.
  // Any other backward of the table in between (backward_and_update, row_gradients, another prepare) replaces the
  // prepared batch, and a finish uses it up: a finish with none prepared throws sparta::Error naming the table.
  void finish_row_gradients(const float* grad, float* row_grads, Stream stream, const BagLayout& grad_layout = {});
  // rows[i] = row of keys[i], inserting absent keys with their initial values (a train lookup that writes no
  // vectors). Refused keys (full table) get -1 and are reported by the next check_lookups. Asynchronous on stream.
  void insert_rows(const int64_t* keys, int64_t n, int64_t* rows, Stream stream);
  // Rows the last backward_and_update changed. Synchronizes stream (give the stream of that backward). Not
  // counted with the optimizer's atomic_update (sparta::Error).
  int64_t rows_updated(Stream stream);
  // Keys the backward workspace holds now (0 before the first backward unless cfg.max_batch_keys was set).
  int64_t backward_capacity() const { return workspace_ ? workspace_->max_nnz() : 0; }

  // Every live row with its key, values and state, ordered by row. Synchronizes stream. name, dim, optimizer,
  // state_width and storage are the table's, as io/checkpoint.h's TableRows carries them; 16-bit values are
  // widened to fp32 exactly.
  TableRows export_rows(Stream stream);
  // Appends rows (keys absent from the table, e.g. a fresh table being restored from a checkpoint) with their
  // values and state, whatever their storage (values go into a 16-bit table rounded to nearest: exact when they
  // came from one of the same storage). Synchronizes stream (the host vectors are the caller's). Throws sparta::Error, changing
  // nothing, when a key is present, the sizes disagree, the rows' dim, optimizer or state_width are not the
  // table's, or the rows do not fit.
  void load_rows(const TableRows& rows, Stream stream);
  // Empties the table and resets the optimizer state. Asynchronous on stream (a tiered table synchronizes it).
  void clear(Stream stream);
  // The host tier of a tiered table (null for hbm, and for a host tier whose cache holds every row).
  HostTier* host_tier() { return tier_.get(); }
  // Rows on the device: capacity_rows, or a tiered table's cache_rows.
  static int64_t device_rows(const EmbeddingTableConfig& cfg);

 private:
  // A tiered table's keys [n] turned into cache slots (resident first); the keys themselves for hbm.
  const int64_t* tier_keys(const int64_t* keys, int64_t n, LookupMode mode, Stream stream);
  // The pins of a tiered table's pending batch, released once its update is queued.
  void updated();
  ForwardArgs forward_args(LookupMode mode, void* out, OutputType out_type, int64_t* rows);
  void check(LookupMode mode, MissingKey missing, Check when, Stream stream);
  void reset_state(Stream stream);
  OptimizerConfig step_config(float lr_scale) const;  // the optimizer of one step: lr scaled, storage, rounding seed
  void init_direct_rows(Stream stream);  // every row's initial values (a direct index)
  BackwardWorkspace& workspace(int64_t nnz, Stream stream);
  // unique_rows_, grown to hold nnz rows.
  int64_t* unique_rows(int64_t nnz, Stream stream);
  // The checked batch of a backward (sparta::Error naming the table on bad sizes).
  BackwardBatch backward_batch(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz,
                               const float* grad, Combiner combiner, const BagLayout& grad_layout = {}) const;

  Device dev_;
  EmbeddingTableConfig cfg_;
  int state_width_;
  int64_t device_rows_;  // capacity_rows, or the cache's rows
  std::unique_ptr<HostTier> tier_;  // a tiered table's host store and cache bookkeeping (built first: it checks
                                    // the host's memory before anything is allocated)
  HashTable hash_;
  Buffer<float> values_;  // [capacity_rows, dim] of cfg_.storage (16-bit: uint16 pairs in the floats)
  Buffer<float> state_;   // [capacity_rows, state_width]
  Buffer<KeySegment> segments_;  // cfg.key_segments on the device (key_init() points at them)
  Buffer<uint32_t> marks_;       // the atomic update's row marks (kernels/atomic_sgd.h; cuda, dims >= 32)
  std::unique_ptr<BackwardWorkspace> workspace_;  // sort buffers of the backward, reused every step
  Buffer<int64_t> unique_rows_;                   // row_gradients' rows (grown)
  Stream workspace_stream_ = nullptr;             // the stream of the last backward, which last used workspace_
};

}  // namespace sparta
