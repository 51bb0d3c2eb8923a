// bce_loss.cpp: CPU reference of bce_loss.h and the backend dispatch.
#include "kernels/bce_loss.h"

#include <cmath>

#include "src/base/check.h"

namespace sparta {

namespace {
float sigmoid_of(float z) {
  if (z >= 0.f) return 1.f / (1.f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.f + e);
}
}  // namespace

void bce_with_logits_cpu(const float* logits, const float* labels, float* loss, float* dlogits, int64_t n,
                         int64_t mean_over) {
  const float inv = static_cast<float>(1.0 / double(mean_over));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float z = logits[i], y = labels[i];
    sum += double(std::fmax(z, 0.f) - z * y) + double(std::log1p(std::exp(-std::fabs(z))));
    if (dlogits) dlogits[i] = (sigmoid_of(z) - y) * inv;
  }
  loss[0] = static_cast<float>(sum / double(mean_over));
}

void sigmoid_cpu(const float* logits, float* probs, int64_t n) {
  for (int64_t i = 0; i < n; ++i) probs[i] = sigmoid_of(logits[i]);
}

void bce_with_logits(const Device& dev, const float* logits, const float* labels, float* loss, float* dlogits,
                     int64_t n, int64_t mean_over, Stream stream) {
  SPARTA_REQUIRE(mean_over >= 1 && n >= 0 && n <= mean_over,
                 "bce loss: expected 0 <= n <= mean_over and mean_over >= 1, found n %lld, mean_over %lld",
                 (long long)n, (long long)mean_over);
  if (!dev.is_cuda()) return bce_with_logits_cpu(logits, labels, loss, dlogits, n, mean_over);
#if SPARTA_CUDA
  bce_with_logits_cuda(logits, labels, loss, dlogits, n, mean_over, stream);
#else
  SPARTA_FATAL("bce loss on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void sigmoid(const Device& dev, const float* logits, float* probs, int64_t n, Stream stream) {
  SPARTA_REQUIRE(n >= 0, "sigmoid: n must be >= 0, found %lld", (long long)n);
  if (!dev.is_cuda()) return sigmoid_cpu(logits, probs, n);
#if SPARTA_CUDA
  sigmoid_cuda(logits, probs, n, stream);
#else
  SPARTA_FATAL("sigmoid on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
