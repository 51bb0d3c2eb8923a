// row_traffic.h: the memory traffic a pooled lookup and an in-place row update cannot avoid, made by the simplest
// kernels that make it. bench_embedding --modes floor times them on the same rows as its lookup and step, so a
// step's figure (and its ratio to a peer) can be set against the least any step that reads each key's row for the
// forward and reads and writes it again for the update could take on that GPU: gather + read_write.
//
// rows: [nnz] int64 row indices into values [capacity_rows, dim] fp32 (rows outside [0, capacity_rows) are
// skipped, as the backward skips them). Every launcher throws sparta::Error, before anything is read or written,
// on dim outside [1, 256], negative sizes or a missing pointer; the cpu backend also on offsets that do not start
// at 0 or that decrease. Asynchronous on stream (cuda). The cuda kernels move a row as float4s where dim is a multiple
// of 4 and values is 16-byte aligned, else as floats.
#pragma once

#include <cstdint>

#include "src/base/device.h"

namespace sparta {

// out [bags, dim] = for bag b the sum of values[rows[i]] over i in [offsets[b], offsets[b + 1]), in key order
// (the cpu backend and the cuda one add in the same order: the same bits). offsets [bags + 1].
void row_traffic_gather(const Device& dev, const int64_t* offsets, const int64_t* rows, int64_t bags,
                        const float* values, int64_t capacity_rows, int dim, float* out, Stream stream);

// For every key i: values[rows[i]] = values[rows[i]] + add, one plain load and one plain store per value. On the
// cuda backend keys that share a row race (the last store wins; the cpu backend applies the keys one by one); with
// add = 0, as the benchmark runs it, every row keeps its bits either way.
void row_traffic_read_write(const Device& dev, const int64_t* rows, int64_t nnz, float* values,
                            int64_t capacity_rows, int dim, float add, Stream stream);

// For every key i: values[rows[i]] += add with float atomics (red.global.add.v4.f32 per 4 values on sm_90): a row
// that k keys share gets k adds, in any order.
void row_traffic_atomic(const Device& dev, const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows,
                        int dim, float add, Stream stream);

void row_traffic_gather_cpu(const int64_t* offsets, const int64_t* rows, int64_t bags, const float* values,
                            int64_t capacity_rows, int dim, float* out);
void row_traffic_add_cpu(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim, float add);
void row_traffic_gather_cuda(const int64_t* offsets, const int64_t* rows, int64_t bags, const float* values,
                             int64_t capacity_rows, int dim, float* out, Stream stream);
void row_traffic_read_write_cuda(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim,
                                 float add, Stream stream);
void row_traffic_atomic_cuda(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim,
                             float add, Stream stream);

}  // namespace sparta
