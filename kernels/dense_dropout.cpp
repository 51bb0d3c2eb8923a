// dense_dropout.cpp: CPU reference of dense_dropout.h, its host constants and the backend dispatch.
#include "kernels/dense_dropout.h"

#include <cmath>

#include "src/base/check.h"

namespace sparta {

uint64_t dropout_step_key(uint64_t seed, int64_t step) {
  return hash_mix(hash_mix(seed, 0x64726f70ull), uint64_t(step));  // 0x64726f70: "drop", apart from other seeds
}

uint32_t dropout_threshold(float p) {
  SPARTA_REQUIRE(p >= 0.f && p < 1.f, "dropout: expected a probability in [0, 1), found %g", double(p));
  return uint32_t(std::lround(double(p) * double(1u << 24)));
}

float dropout_scale(float p) { return 1.f / (1.f - p); }

void dropout_forward_cpu(uint64_t key, uint64_t layer, uint32_t threshold, float scale, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = dropout_keeps(key, layer, uint64_t(i), threshold) ? y[i] * scale : 0.f;
}

void dropout_forward(const Device& dev, const char* layer, const DropoutArgs& a, float* y, int64_t rows, int cols,
                     Stream stream) {
  SPARTA_REQUIRE(a.p >= 0.f && a.p < 1.f, "dense layer '%s': dropout must be in [0, 1), found %g", layer,
                 double(a.p));
  SPARTA_REQUIRE(rows >= 0 && cols >= 1, "dense layer '%s': dropout over rows >= 0 and cols >= 1, found %lld x %d",
                 layer, (long long)rows, cols);
  SPARTA_REQUIRE(a.key, "dense layer '%s': dropout without a step key", layer);
  const uint32_t threshold = dropout_threshold(a.p);
  const float scale = dropout_scale(a.p);
  const int64_t n = rows * cols;
  if (!dev.is_cuda()) return dropout_forward_cpu(*a.key, a.layer, threshold, scale, y, n);
#if SPARTA_CUDA
  dropout_forward_cuda(a.key, a.layer, threshold, scale, y, n, stream);
#else
  SPARTA_FATAL("dropout of '%s' on %s in a CUDA=0 build", layer, dev.name().c_str());
#endif
}

}  // namespace sparta
