// sparse_optimizer.cpp: the step constants, the CPU reference of sparse_optimizer.h, and the backend dispatch.
#include "kernels/sparse_optimizer.h"

#include <climits>
#include <cmath>

#include "src/base/check.h"

namespace sparta {

OptimizerStep optimizer_step(const OptimizerConfig& cfg, int64_t step) {
  SPARTA_REQUIRE(step >= 1 && step <= INT32_MAX, "sparse optimizer %s: step must be in [1, %d], found %lld",
                 optimizer_name(cfg.kind), INT32_MAX, static_cast<long long>(step));
  OptimizerStep c;
  c.kind = cfg.kind;
  c.lr = cfg.lr;
  c.momentum = cfg.momentum;
  c.beta1 = cfg.beta1;
  c.beta2 = cfg.beta2;
  c.one_minus_beta1 = static_cast<float>(1.0 - double(cfg.beta1));
  c.one_minus_beta2 = static_cast<float>(1.0 - double(cfg.beta2));
  c.epsilon = cfg.epsilon;
  c.weight_decay = cfg.weight_decay;
  if (cfg.kind == OptimizerKind::adam || cfg.kind == OptimizerKind::lazy_adam) {
    // in double on the host, once per step: the kernels multiply by the float result
    double b1 = 1.0 - std::pow(double(cfg.beta1), double(step));
    double b2 = 1.0 - std::pow(double(cfg.beta2), double(step));
    SPARTA_REQUIRE(b1 > 0 && b2 > 0, "sparse optimizer %s: beta1 and beta2 must be in [0, 1), found %g and %g",
                   optimizer_name(cfg.kind), double(cfg.beta1), double(cfg.beta2));
    c.inv_bias1 = static_cast<float>(1.0 / b1);
    c.inv_bias2 = static_cast<float>(1.0 / b2);
  }
  c.step = static_cast<int32_t>(step);
  c.storage = cfg.storage;
  c.rounding_stream = rowstore::step_stream(cfg.rounding_seed, c.step);
  return c;
}

void sparse_optimizer_update_cpu(const OptimizerStep& c, const int64_t* unique_rows, const float* row_grads,
                                 int64_t num_unique, float* values, float* state, int64_t capacity_rows, int dim) {
  const int width = optimizer_state_width(c.kind, dim);
  dispatch_optimizer(c.kind, [&](auto kind) {
    constexpr OptimizerKind K = decltype(kind)::value;
    for (int64_t u = 0; u < num_unique; ++u) {
      int64_t row = unique_rows[u];
      if (row < 0 || row >= capacity_rows) continue;  // as the kernel does: never write outside the store
      update_row_cpu<K>(c, row_grads + u * dim, values + row * dim, state + row * width, dim);
    }
  });
}

void sparse_optimizer_update(const Device& dev, const OptimizerConfig& cfg, int64_t step,
                             const int64_t* unique_rows, const float* row_grads, const int32_t* num_unique,
                             int64_t max_unique, float* values, float* state, int64_t capacity_rows, int dim,
                             Stream stream) {
  SPARTA_REQUIRE(dim >= 1 && dim <= 256, "sparse optimizer: dim must be in [1, 256], found %d", dim);
  SPARTA_REQUIRE(cfg.storage == RowStorage::fp32,
                 "sparse optimizer: takes fp32 rows, found storage %s (16-bit rows are updated by backward_and_update)",
                 row_storage_name(cfg.storage));
  OptimizerStep c = optimizer_step(cfg, step);
  if (!dev.is_cuda()) {
    int64_t n = *num_unique;  // cpu "device" memory is host memory
    SPARTA_REQUIRE(n >= 0 && n <= max_unique, "sparse optimizer: %lld unique rows, expected at most %lld",
                   static_cast<long long>(n), static_cast<long long>(max_unique));
    return sparse_optimizer_update_cpu(c, unique_rows, row_grads, n, values, state, capacity_rows, dim);
  }
#if SPARTA_CUDA
  sparse_optimizer_update_cuda(c, unique_rows, row_grads, num_unique, max_unique, values, state, capacity_rows, dim,
                               stream);
#else
  (void)stream;
  SPARTA_FATAL("sparse_optimizer_update on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
