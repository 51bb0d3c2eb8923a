// atomic_sgd.h: the backward of a pooled lookup and an SGD step in one pass, key by key, with float atomics
// (HugeCTR's SGD `atomic_update`): every key k of bag b adds -(lr * g) to its row, where g is grad[b] (sum) or
// grad[b] * (1.0f / n) (mean over the bag's n keys). No sort and no per-row sum: one read of the bag's gradient
// and one vector atomic per key, so the update costs about what the forward does.
//
// Not reproducible bit for bit: a row that several keys touch takes their adds in whatever order the device
// runs them (w - a - b, not w - (a + b) as embedding_backward.h's fixed order gives), so two runs may differ in
// the last bits of those rows. A row one key touches gets w - lr * g, the bits of backward_and_update with sgd.
// The cpu backend applies the keys in key order (its result is reproducible; the cuda one is not).
//
// Input as embedding_backward.h's BackwardBatch: offsets [bags + 1] int64, rows [nnz] int64, grad [bags, dim]
// float32, combiner. Rows outside [0, capacity_rows) (keys the forward refused, or missing) are skipped.
#pragma once

#include <cstdint>

#include "src/base/device.h"
#include "kernels/embedding_backward.h"

namespace sparta {

// values [capacity_rows, dim] -= lr * (each key's gradient), as above. Asynchronous on stream (cuda). Throws
// sparta::Error, before anything changes, on bad sizes, a learning rate that is not finite or a missing pointer;
// the cpu backend also on offsets that are not a CSR of the nnz keys (the cuda kernel never reads or writes
// outside its arrays with such offsets).
void atomic_sgd_update(const Device& dev, const BackwardBatch& batch, float lr, float* values,
                       int64_t capacity_rows, int dim, Stream stream);

void atomic_sgd_update_cpu(const BackwardBatch& batch, float lr, float* values, int64_t capacity_rows, int dim);
void atomic_sgd_update_cuda(const BackwardBatch& batch, float lr, float* values, int64_t capacity_rows, int dim,
                            Stream stream);

}  // namespace sparta
