// embedding_table.h: one embedding table of a rank: a GPU hash table (keys → rows), the values
// [capacity_rows, dim] and the optimizer state [capacity_rows, optimizer_state_width] (layout in
// kernels/embedding_types.h), with the lookups the placements call and the export/load that checkpoints use.
//
// Rows are handed out densely (0, 1, 2, ...) and never freed, so values[0:size) and state[0:size) are the
// live rows, in the order export_rows() lists their keys. A new row's values come from (seed, table_id, key)
// (kernels/key_init.h); its state starts at the optimizer's initial state (set for all rows up front, and again
// by clear(): zeros, adagrad's initial_accumulator, lazy_adam's last step 0), which is what
// kernels/sparse_optimizer.h requires of a row it has never updated.
//
// A train step: pooled_forward (train, rows out) → the model's gradient of the pooled output →
// backward_and_update (kernels/embedding_backward.h), which sums each touched row's gradient in a fixed order
// and applies the table's optimizer to it.
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
#include "kernels/pooled_forward.h"

namespace sparta {

struct EmbeddingTableConfig {
  std::string name = "table";
  int table_id = 0;
  int dim = 16;                  // 1..256
  int64_t capacity_rows = 0;     // rows the table may hold; one more is a "full" error
  double max_load_factor = 0.5;  // of the hash slots, (0, 1]
  uint64_t seed = 0;
  float init_scale = 0.05f;      // initial values uniform in [-init_scale, init_scale)
  OptimizerConfig optimizer;
  // Keys per batch the backward workspace is sized for at construction; 0: sized by the first
  // backward_and_update. A larger batch later grows it (one reallocation, then reused every step).
  int64_t max_batch_keys = 0;
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
  // Allocates everything up front (memory_bytes tells how much; plus the backward workspace when
  // cfg.max_batch_keys > 0). Bad config: sparta::Error naming the table.
  EmbeddingTable(const Device& dev, const EmbeddingTableConfig& cfg);

  // Device bytes a table of these settings takes: hash slots, values and optimizer state.
  static size_t memory_bytes(int64_t capacity_rows, int dim, OptimizerKind optimizer, double max_load_factor);

  const EmbeddingTableConfig& config() const { return cfg_; }
  const std::string& name() const { return cfg_.name; }
  const Device& device() const { return dev_; }
  int dim() const { return cfg_.dim; }
  int state_width() const { return state_width_; }
  int64_t capacity_rows() const { return cfg_.capacity_rows; }
  KeyInit key_init() const;
  // Live rows (synchronizes).
  int64_t size() { return hash_.size(); }

  float* values() { return values_.data(); }  // [capacity_rows, dim]
  float* state() { return state_.data(); }    // [capacity_rows, state_width] (nullptr for sgd)
  HashTable& hash() { return hash_; }

  // Fused lookup and pooling; device pointers. offsets [bags + 1], keys [nnz] → out [bags, dim] of out_type,
  // rows [nnz] (may be null). train inserts unseen keys; eval gives zeros for them or, with
  // MissingKey::error, throws. Train, and eval with MissingKey::error, synchronize to check (a full table
  // throws sparta::Error naming the table, its capacity and the rows asked for) unless check is deferred; eval
  // with zeros is asynchronous.
  void pooled_forward(const int64_t* offsets, const int64_t* keys, int64_t bags, Combiner combiner, LookupMode mode,
                      void* out, OutputType out_type, int64_t* rows, MissingKey missing = MissingKey::zeros,
                      Check check = Check::now);
  // One vector per key: keys [nnz] → out [nnz, dim]; otherwise as pooled_forward.
  void unpooled_forward(const int64_t* keys, int64_t nnz, LookupMode mode, void* out, OutputType out_type,
                        int64_t* rows, MissingKey missing = MissingKey::zeros, Check check = Check::now);
  // The check of lookups made with Check::deferred (synchronizes): throws sparta::Error when keys were refused
  // (full table) or, with MissingKey::error, when eval keys were missing, since the last check.
  void check_lookups(MissingKey missing = MissingKey::zeros);
  // rows[i] = row of keys[i] or -1; asynchronous.
  void find(const int64_t* keys, int64_t n, int64_t* rows);

  // The backward of a pooled train forward and optimizer step `step` (the global step, from 1) on the rows the
  // batch touched. offsets [bags + 1] and rows [nnz] are those of the pooled_forward (rows < 0 — refused or
  // missing keys — contribute nothing), grad [bags, dim] is the gradient of its output, combiner its combiner.
  // Device pointers; asynchronous on the device's stream (no synchronization, no allocation once the
  // workspace holds nnz keys). Throws sparta::Error naming the table on bad sizes or step.
  void backward_and_update(const int64_t* offsets, const int64_t* rows, int64_t bags, int64_t nnz, const float* grad,
                           Combiner combiner, int64_t step);
  // Rows the last backward_and_update changed (synchronizes).
  int64_t rows_updated();
  // Keys the backward workspace holds now (0 before the first backward unless cfg.max_batch_keys was set).
  int64_t backward_capacity() const { return workspace_ ? workspace_->max_nnz() : 0; }

  // Every live row with its key, values and state, ordered by row (synchronizes). name, dim, optimizer and
  // state_width are the table's, as io/checkpoint.h's TableRows carries them.
  TableRows export_rows();
  // Appends rows (keys absent from the table, e.g. a fresh table being restored from a checkpoint) with their
  // values and state. Throws sparta::Error, changing nothing, when a key is present, the sizes disagree, the
  // rows' dim, optimizer or state_width are not the table's, or the rows do not fit.
  void load_rows(const TableRows& rows);
  // Empties the table and resets the optimizer state (asynchronous).
  void clear();

 private:
  ForwardArgs forward_args(LookupMode mode, void* out, OutputType out_type, int64_t* rows);
  void check(LookupMode mode, MissingKey missing, Check when);
  void reset_state();
  BackwardWorkspace& workspace(int64_t nnz);

  Device dev_;
  EmbeddingTableConfig cfg_;
  int state_width_;
  HashTable hash_;
  Buffer<float> values_;  // [capacity_rows, dim]
  Buffer<float> state_;   // [capacity_rows, state_width]
  std::unique_ptr<BackwardWorkspace> workspace_;  // sort buffers of the backward, reused every step
};

}  // namespace sparta
