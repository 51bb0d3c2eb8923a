// bce_loss.h: binary cross-entropy on logits, the loss of DLRM and DCNv2, and the sigmoid predictions.
//
// For logit z and label y in [0, 1], in the form that never overflows nor takes the log of 0:
//   l(z, y) = max(z, 0) - z y + log1p(exp(-|z|))           dl/dz = sigmoid(z) - y
//   sigmoid(z) = 1 / (1 + exp(-z)) for z >= 0, exp(z) / (1 + exp(z)) below
// The loss is the mean over `mean_over` samples: the local batch, or the global batch in data-parallel
// training, where every rank passes the global count and the all-reduced sum of the ranks' losses is the mean.
// cuda: one block sums the batch in a fixed order (in double), so the loss has the same bits on every run.
// Every launcher takes the stream it runs on last (cuda: asynchronous on it, no host synchronization; cpu: runs
// on the calling thread, the stream unused).
#pragma once

#include <cstdint>

#include "src/base/device.h"

namespace sparta {

// loss[0] (device memory) = Σ_i l(logits[i], labels[i]) / mean_over;
// dlogits[i] = (sigmoid(logits[i]) - labels[i]) / mean_over when dlogits != nullptr. i < n.
// Throws sparta::Error naming the loss unless 0 <= n <= mean_over and mean_over >= 1.
void bce_with_logits(const Device& dev, const float* logits, const float* labels, float* loss, float* dlogits,
                     int64_t n, int64_t mean_over, Stream stream);

// probs[i] = sigmoid(logits[i]), i < n.
void sigmoid(const Device& dev, const float* logits, float* probs, int64_t n, Stream stream);

void bce_with_logits_cpu(const float* logits, const float* labels, float* loss, float* dlogits, int64_t n,
                         int64_t mean_over);
void bce_with_logits_cuda(const float* logits, const float* labels, float* loss, float* dlogits, int64_t n,
                          int64_t mean_over, Stream stream);
void sigmoid_cpu(const float* logits, float* probs, int64_t n);
void sigmoid_cuda(const float* logits, float* probs, int64_t n, Stream stream);

}  // namespace sparta
