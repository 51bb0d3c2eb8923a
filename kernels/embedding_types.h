// embedding_types.h: the plain types that the embedding kernels share: how a bag of keys is pooled, which
// sparse optimizer updates the rows, and how the optimizer's per-row state is laid out beside the values.
//
// Layout of a table's store (one allocation each, row-major):
//   values [capacity_rows, dim]          float32
//   state  [capacity_rows, state_width]  float32, state_width = optimizer_state_width(kind, dim):
//     sgd 0 | momentum, nesterov: velocity[dim] | adagrad: accumulator[dim] | rowwise_adagrad: accumulator[1]
//     | adam: m[dim], v[dim]
//     lazy_adam: m[dim], v[dim], then one float whose bits hold the int32 step of the row's last update
// values are float32, or 16-bit (RowStorage bf16 / fp16, kernels/row_storage.h): [capacity_rows, dim] uint16.
#pragma once

#include <cstdint>
#include <string>

#include "src/base/device.h"  // SPARTA_HD

namespace sparta {

enum class Combiner { sum, mean };

// How a table stores its values: float32, or 16 bits (bfloat16 / IEEE half) read into fp32 for arithmetic and
// written back rounded stochastically (kernels/row_storage.h). 16-bit tables take sgd and rowwise_adagrad only
// (whose one accumulator per row stays fp32, as FBGEMM keeps it), an even dim, and no atomic_update
// (check_row_storage).
enum class RowStorage { fp32, bf16, fp16 };

enum class OptimizerKind { sgd, momentum, nesterov, adagrad, adam, lazy_adam, rowwise_adagrad };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0.01f;
  float momentum = 0.9f;       // momentum, nesterov
  float beta1 = 0.9f;          // adam, lazy_adam
  float beta2 = 0.999f;        // adam, lazy_adam
  float epsilon = 1e-8f;       // adagrad, adam, lazy_adam
  float initial_accumulator = 0.0f;  // adagrad, rowwise_adagrad
  // L2 weight decay. The dense optimizer (optimizer.weight_decay): g + weight_decay * w on every parameter. Sparse
  // optimizers (embedding.weight_decay; HugeCTR's regularizer, FBGEMM's L2 weight decay): the same on the rows a
  // step touches only, before the optimizer takes the gradient; not with atomic_update (a row several keys touch
  // would decay once per key).
  float weight_decay = 0.0f;
  // sgd only: the backward and update applied key by key with float atomics (kernels/atomic_sgd.h, HugeCTR's
  // atomic_update): no sort, much faster with many keys per step, but a row several keys touch is not
  // reproducible bit for bit. false: the sorted, fixed-order backward (kernels/embedding_backward.h).
  bool atomic_update = false;
  // The values' storage and the seed of its stochastic rounding (kernels/row_storage.h). Set by the table from
  // its own config (EmbeddingTableConfig::storage and seed), not by the user.
  RowStorage storage = RowStorage::fp32;
  uint64_t rounding_seed = 0;
};

inline int optimizer_state_width(OptimizerKind kind, int dim) {
  switch (kind) {
    case OptimizerKind::sgd: return 0;
    case OptimizerKind::momentum:
    case OptimizerKind::nesterov:
    case OptimizerKind::adagrad: return dim;
    case OptimizerKind::adam: return 2 * dim;
    case OptimizerKind::lazy_adam: return 2 * dim + 1;
    case OptimizerKind::rowwise_adagrad: return 1;
  }
  return 0;
}

SPARTA_HD constexpr int row_storage_bytes(RowStorage s) { return s == RowStorage::fp32 ? 4 : 2; }
// Floats a row of dim values takes as stored: dim for fp32, dim / 2 for 16-bit rows (their bits in pairs; dim even).
SPARTA_HD constexpr int row_storage_floats(RowStorage s, int dim) { return dim * row_storage_bytes(s) / 4; }

// Where bag b's vector lies: in a [bags, dim] array (slots 0), or, laid out in a wider array, in rows of `row`
// values that hold the samples side by side, bag b = sample * slots + j from b / slots * row + cols[j] (a pooled
// output written in place into a collection's output, and its gradient read from there). cols: [slots] in the
// memory of the backend that reads it (device memory for cuda). by_four: row and every column are multiples of 4,
// so 16-byte rows stay 16-byte aligned (the kernels' vector loads and stores; without it they take one element at
// a time).
struct BagLayout {
  int64_t row = 0;
  const int32_t* cols = nullptr;
  int slots = 0;
  bool by_four = false;
  SPARTA_HD int64_t at(int64_t bag, int dim) const {
    return slots == 0 ? bag * dim : (bag / slots) * row + cols[bag % slots];
  }
  SPARTA_HD bool contiguous() const { return slots == 0; }
  // The layout the kernels' 16-byte paths may take: contiguous (the caller checks the dim) or by_four.
  bool four_aligned() const { return contiguous() || by_four; }
};
// sparta::Error "<what>: ..." unless the layout is the default or has its columns, slots and row.
void check_bag_layout(const BagLayout& l, const char* what);

// Names as written in options and files: "sum" "mean"; "sgd" "momentum" "nesterov" "adagrad" "adam" "lazy_adam"
// "rowwise_adagrad".
// The parsers throw sparta::Error naming the value found.
const char* combiner_name(Combiner c);
Combiner parse_combiner(const std::string& name);
const char* optimizer_name(OptimizerKind k);
OptimizerKind parse_optimizer(const std::string& name);
// "fp32" "bf16" "fp16".
const char* row_storage_name(RowStorage s);
RowStorage parse_row_storage(const std::string& name);
// sparta::Error "<what>: ..." naming the storage and what it does not take: a 16-bit storage with an optimizer
// other than sgd and rowwise_adagrad (their full-row states are not kept in 16 bits), with atomic_update, or
// with an odd dim (16-bit rows are read and written in pairs).
void check_row_storage(RowStorage s, const OptimizerConfig& opt, int dim, const char* what);

}  // namespace sparta
