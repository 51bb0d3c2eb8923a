// atomic_sgd.h: the backward of a pooled lookup and an SGD step in one pass over the keys (HugeCTR's SGD
// `atomic_update`): every key k of bag b adds -(lr * g) to its row, where g is grad[b] (sum) or grad[b] * (1.0f / n)
// (mean over the bag's n keys). No sort and no per-row sum: one read of the bag's gradient and one vector float
// atomic per key, so the update costs about what the forward does.
//
// Rows of 32 floats or more, given `marks` (cuda): a marking pass first sets two bits per row, "seen" and
// "repeated" (atomicOr on a bitmap of atomic_sgd_mark_words words, cleared by the call), then a row that one key
// of the batch touches is read, added to and written with plain loads and stores, and only rows that several keys
// touch take the atomics. The L2 applies vector atomics at a rate that rows of 128 bytes and more exceed: on one
// H200, 13.6M uniform keys over 40M rows, the atomics alone take 1.51 / 5.17 ms at dims 32 / 128 against 1.11 /
// 3.65 ms for a plain read and write of the same rows (experiments/NOTES_embedding.md run 19). The marking pass
// costs about 0.28 ms; at dim 16 it costs more than the plain stores save, so narrower rows take the atomics
// alone. Same bits either way: a row one key touches gets w + (-(lr * g)), one rounded add.
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

// The narrowest rows that take the marking pass.
constexpr int kAtomicSgdMarkedDim = 32;

// Words of marks the cuda update uses for a table of these rows: two bits per row at dims of at least
// kAtomicSgdMarkedDim, none below.
int64_t atomic_sgd_mark_words(int64_t capacity_rows, int dim);

// values [capacity_rows, dim] -= lr * (each key's gradient), as above. marks: device memory of
// atomic_sgd_mark_words(capacity_rows, dim) uint32 words (contents need not be anything; overwritten), or nullptr
// for the atomics alone at every dim; the cpu backend ignores it. Asynchronous on stream (cuda). Throws
// sparta::Error, before anything changes, on bad sizes, a learning rate that is not finite or a missing pointer;
// the cpu backend also on offsets that are not a CSR of the nnz keys (the cuda kernels never read or write
// outside their arrays with such offsets).
void atomic_sgd_update(const Device& dev, const BackwardBatch& batch, float lr, float* values,
                       int64_t capacity_rows, int dim, uint32_t* marks, Stream stream);

void atomic_sgd_update_cpu(const BackwardBatch& batch, float lr, float* values, int64_t capacity_rows, int dim);
void atomic_sgd_update_cuda(const BackwardBatch& batch, float lr, float* values, int64_t capacity_rows, int dim,
                            uint32_t* marks, Stream stream);

}  // namespace sparta
