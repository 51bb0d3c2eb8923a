// embedding_types.h: the plain types that the embedding kernels share: how a bag of keys is pooled, which
// sparse optimizer updates the rows, and how the optimizer's per-row state is laid out beside the values.
//
// Layout of a table's store (one allocation each, row-major):
//   values [capacity_rows, dim]          float32
//   state  [capacity_rows, state_width]  float32, state_width = optimizer_state_width(kind, dim):
//     sgd 0 | momentum, nesterov: velocity[dim] | adagrad: accumulator[dim] | adam: m[dim], v[dim]
//     lazy_adam: m[dim], v[dim], then one float whose bits hold the int32 step of the row's last update
#pragma once

#include <cstdint>
#include <string>

namespace sparta {

enum class Combiner { sum, mean };

enum class OptimizerKind { sgd, momentum, nesterov, adagrad, adam, lazy_adam };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0.01f;
  float momentum = 0.9f;       // momentum, nesterov
  float beta1 = 0.9f;          // adam, lazy_adam
  float beta2 = 0.999f;        // adam, lazy_adam
  float epsilon = 1e-8f;       // adagrad, adam, lazy_adam
  float initial_accumulator = 0.0f;  // adagrad
  // sgd only: the backward and update applied key by key with float atomics (kernels/atomic_sgd.h, HugeCTR's
  // atomic_update): no sort, much faster with many keys per step, but a row several keys touch is not
  // reproducible bit for bit. false: the sorted, fixed-order backward (kernels/embedding_backward.h).
  bool atomic_update = false;
};

inline int optimizer_state_width(OptimizerKind kind, int dim) {
  switch (kind) {
    case OptimizerKind::sgd: return 0;
    case OptimizerKind::momentum:
    case OptimizerKind::nesterov:
    case OptimizerKind::adagrad: return dim;
    case OptimizerKind::adam: return 2 * dim;
    case OptimizerKind::lazy_adam: return 2 * dim + 1;
  }
  return 0;
}

// Names as written in options and files: "sum" "mean"; "sgd" "momentum" "nesterov" "adagrad" "adam" "lazy_adam".
// The parsers throw sparta::Error naming the value found.
const char* combiner_name(Combiner c);
Combiner parse_combiner(const std::string& name);
const char* optimizer_name(OptimizerKind k);
OptimizerKind parse_optimizer(const std::string& name);

}  // namespace sparta
