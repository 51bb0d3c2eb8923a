// dense_optimizer.cpp: CPU reference of dense_optimizer.h, the checks and the backend dispatch.
#include "kernels/dense_optimizer.h"

#include <cmath>

#include "src/base/check.h"
#include "kernels/fill.h"

namespace sparta {

size_t dense_optimizer_state_size(OptimizerKind kind, size_t n) {
  SPARTA_REQUIRE(kind != OptimizerKind::lazy_adam && kind != OptimizerKind::rowwise_adagrad,
                 "dense optimizer: expected sgd, momentum, nesterov, adagrad or adam, found %s (a sparse optimizer: "
                 "use adam or adagrad for dense parameters)", optimizer_name(kind));
  return size_t(optimizer_state_width(kind, 1)) * n;
}

void dense_optimizer_init_state(const Device& dev, const OptimizerConfig& cfg, float* state, size_t n, Stream stream) {
  const size_t size = dense_optimizer_state_size(cfg.kind, n);
  fill(dev, state, size, cfg.kind == OptimizerKind::adagrad ? cfg.initial_accumulator : 0.f, stream);
}

void dense_optimizer_update_cpu(const OptimizerStep& c, float weight_decay, float* params, const float* grads,
                                float* state, size_t n) {
  dispatch_optimizer(c.kind, [&](auto kind) {
    constexpr OptimizerKind K = decltype(kind)::value;
    const RowDecay none;
    float unused0 = 0, unused1 = 0;
    for (size_t i = 0; i < n; ++i) {
      float& s0 = optimizer_has_s0(K) ? state[i] : unused0;
      float& s1 = optimizer_has_s1(K) ? state[n + i] : unused1;
      update_element<K>(c, none, decayed_gradient(grads[i], params[i], weight_decay), params[i], s0, s1);
    }
  });
}

void dense_optimizer_update(const Device& dev, const OptimizerConfig& cfg, int64_t step, float lr, float* params,
                            const float* grads, float* state, size_t n, Stream stream) {
  dense_optimizer_state_size(cfg.kind, n);  // rejects lazy_adam
  SPARTA_REQUIRE(std::isfinite(cfg.weight_decay) && cfg.weight_decay >= 0.f,
                 "dense optimizer: weight_decay must be finite and >= 0, found %g", double(cfg.weight_decay));
  OptimizerStep c = optimizer_step(cfg, step);
  c.lr = lr;
  if (!dev.is_cuda()) return dense_optimizer_update_cpu(c, cfg.weight_decay, params, grads, state, n);
#if SPARTA_CUDA
  dense_optimizer_update_cuda(c, cfg.weight_decay, params, grads, state, n, stream);
#else
  SPARTA_FATAL("dense optimizer on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
