// embedding_backward.h: the backward of a pooled embedding lookup: the gradient of each table row the batch
// touched, summed over every key that maps to it in a fixed order (no floating-point atomics: two runs give
// the same bits, and the cpu and cuda backends give the same bits too); and backward_and_update, which
// applies a sparse optimizer (sparse_optimizer.h) to those rows without writing the gradients out.
//
// Input: CSR over bags b = sample * slots + slot: offsets [bags + 1] int64, rows [nnz] int64 (the table row of
// each key, from the forward), grad [bags, dim] float32 (the gradient of the pooled output, i.e. [batch, slots,
// dim]), and the combiner: key k of bag b contributes grad[b] (sum) or grad[b] / (offsets[b+1] - offsets[b])
// (mean, the scale computed as 1.0f / n and then multiplied in).
//
// The fixed order. The (row, key position) pairs are sorted by row, stably, so that position j of the sorted
// sequence holds a row's contributions in key order. Each row's run is cut into items of kBackwardChunk
// positions counted from the row's first position (item t of a row whose run is [s, e): positions
// [s + t*C, min(s + (t+1)*C, e))). A row of at most kBackwardChunk contributions (one item) sums them one after
// the other from 0.0f. A row over m >= 2 items sums each item so (its partial), then splits its m partials into
// kCombineGroups ranges of ceil(m / kCombineGroups) consecutive partials, sums each nonempty range from 0.0f,
// and adds the range sums from 0.0f in order. Hot rows (a power-law key seen 100K times in a batch) are thus
// spread over many warps instead of one. A row's gradient is so a function of its own contributions in key
// order alone: neither its row id nor the other rows (how many positions precede it) change its bits, so a
// table whose rows were inserted in another order (a loaded checkpoint, concurrent GPU inserts) gives the same
// gradient bits, and so does a replica that holds the row under another id.
//
// Keys whose row is outside [0, capacity_rows) are dropped (they contribute nothing) and counted:
// BackwardWorkspace::read_dropped_keys. The offsets must be a CSR of the nnz keys (the reader checks them; the
// cpu backend also checks and throws sparta::Error); with bad offsets the cuda kernels still never read or
// write outside their arrays.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "kernels/embedding_types.h"
#include "kernels/sparse_optimizer.h"

namespace sparta {

constexpr int kBackwardChunk = 128;  // positions of a row's run per item (the unit one group of lanes sums)
constexpr int kCombineGroups = 16;   // ranges the partials of a row over several items are summed in

// Limits of one backward call, checked by BackwardWorkspace (and by EmbeddingTable when it is built):
//   capacity_rows <= kBackwardMaxRows (2^32 - 2): rows are sorted as uint32 sort keys (bag_pairs_kernel, the
//     cpu reference's packed row << 32 | bag), and capacity_rows itself is the sort key of dropped keys;
//   nnz, bags <= kBackwardMaxKeys (2^31 - 2): positions, items and counts are int32 (ReduceView::nnz, the
//     segments_kernel index, the item tables that end with nnz, CUB's int item count), bag ids uint32 beside
//     an int32 bag count.
constexpr int64_t kBackwardMaxRows = int64_t(UINT32_MAX) - 1;
constexpr int64_t kBackwardMaxKeys = int64_t(INT32_MAX) - 1;

// One batch of the backward. Pointers are device memory of the workspace's device.
struct BackwardBatch {
  const int64_t* offsets = nullptr;  // [bags + 1] CSR offsets over bags b = sample * slots + slot
  const int64_t* rows = nullptr;     // [nnz] table row of each key
  const float* grad = nullptr;       // [bags, dim] gradient of the pooled output (laid out as grad_layout says)
  int64_t bags = 0;
  int64_t nnz = 0;
  Combiner combiner = Combiner::sum;
  BagLayout grad_layout;             // where each bag's gradient lies in grad (default [bags, dim])
};

// Scratch of the backward for batches of up to max_nnz keys into a table of capacity_rows rows of dim floats:
// created once, reused every step (no allocation on the hot path). The cuda backend's holds the sort buffers
// and CUB's temporary storage. Freeing it (the destructor) does not wait for the device: the owner synchronizes
// the stream of the last backward first.
class BackwardWorkspace {
 public:
  // Allocates, then zeroes the counts on stream (asynchronous). Throws sparta::Error, before allocating, on
  // sizes outside the limits above.
  BackwardWorkspace(const Device& dev, int64_t max_nnz, int64_t capacity_rows, int dim, Stream stream);
  BackwardWorkspace(const BackwardWorkspace&) = delete;
  BackwardWorkspace& operator=(const BackwardWorkspace&) = delete;

  // Bytes such a workspace allocates on a device of that backend (throws sparta::Error on bad sizes).
  static size_t bytes(Backend backend, int64_t max_nnz, int64_t capacity_rows, int dim);

  const Device& device() const { return dev_; }
  int64_t max_nnz() const { return max_nnz_; }
  int64_t capacity_rows() const { return capacity_rows_; }
  int dim() const { return dim_; }
  // Bits of a row id the sort looks at: enough for capacity_rows (the row given to dropped keys).
  int end_bit() const { return end_bit_; }

  // [1] device memory: rows updated by the last backward_and_update.
  const int32_t* num_unique() const { return counts() + kCountUnique; }
  // Keys of the last call whose row was outside [0, capacity_rows). Synchronizes stream (that of the call).
  int64_t read_dropped_keys(Stream stream) const;

  // The arrays inside (for embedding_backward.cu/.cpp). n = max_nnz, nb = ceil(n / kBackwardChunk). Bounds, with
  // C = kBackwardChunk: a row of L positions has ceil(L / C) items, so the items (the dropped keys' run counted as
  // a row) number at most n (an item holds a position) and less than n / C + rows; a row over m >= 2 items holds
  // L > C positions, so such rows number at most n / (C + 1) < nb, and their items ceil(L / C) < L / C + 1 <
  // 2L / C add up to less than 2n / C <= 2 nb (the cuda partials: C positions of item t < m - 1 hold one multiple
  // of C each, slots below nb; the last item of each such row gets a slot in [nb, 2 nb); the cpu reference keeps
  // one row's at most nb partials).
  enum Count { kCountItems = 0, kCountDropped = 1, kCountUnique = 2, kCountMultiRows = 3, kCounts = 4 };
  struct Layout {
    size_t keys_a, keys_b, bags_a, bags_b;  // uint32 [n] each: sort keys (rows) and values (bags), double-buffered
    size_t scan;                            // int64 [n]: (unique row << 32 | item) of each position
    size_t item_start;                      // int32 [n + 1]: first position of each item, then nnz
    size_t item_u;                          // int32 [n]: unique row of each item (before: the row starts of step 3)
    size_t row_item_start;                  // int32 [n + 1]: first item of each unique row, then the item count
    size_t multi_rows;                      // int32 [nb]: unique row of each row over several items
    size_t partials;                        // float [2 * nb, dim]: partial sums of items of rows over several items
    size_t counts;                          // int32 [kCounts]
    size_t temp;                            // CUB temporary storage (cuda) or a row's scratch (cpu)
    size_t temp_bytes;
    size_t total;
  };
  static Layout layout(Backend backend, int64_t max_nnz, int64_t capacity_rows, int dim);
  template <class T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  const Layout& arrays() const { return layout_; }
  int32_t* counts() const { return at<int32_t>(layout_.counts); }

  // The batch the last embedding_backward_prepare sorted into this workspace, which embedding_backward_finish
  // reduces (valid until then). Any other call given the workspace replaces it (valid = false), even one that
  // throws: embedding_backward, backward_and_update, another prepare; and a finish uses it up (a finish refused
  // for a batch that differs leaves it).
  struct Prepared {
    bool valid = false;
    const int64_t* offsets = nullptr;  // the prepared batch's pointers and sizes (the finish must name the same)
    const int64_t* rows = nullptr;
    int64_t bags = 0, nnz = 0;
    Combiner combiner = Combiner::sum;
    int keys_half = 0, bags_half = 0;  // cuda: the half (0: keys_a / bags_a, 1: keys_b / bags_b) the sort left
                                       // the sorted rows / bags in
    int64_t pairs = 0;                 // cpu: kept keys, sorted as (row << 32 | bag) in `scan`
  };
  const Prepared& prepared() const { return prepared_; }
  Prepared& prepared() { return prepared_; }

 private:
  Device dev_;
  int64_t max_nnz_ = 0, capacity_rows_ = 0;
  int dim_ = 0, end_bit_ = 0;
  Layout layout_{};
  Buffer<unsigned char> mem_;
  unsigned char* base_ = nullptr;  // mem_.data()
  Prepared prepared_;
};

// The summed gradient of every row the batch touched:
//   unique_rows [ws.max_nnz()]        int64, ascending; the first *num_unique are written
//   row_grads   [ws.max_nnz(), dim]   row_grads[u] = sum over the keys of row unique_rows[u] (fixed order above)
//   num_unique  [1] int32, device memory (read it with read_count when the host needs it)
// Asynchronous on stream (cuda): no host synchronization. Throws sparta::Error on sizes outside the
// workspace or the limits above. It is embedding_backward_prepare followed by embedding_backward_finish (below).
void embedding_backward(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                        float* row_grads, int32_t* num_unique, Stream stream);
// The same, and the key of every touched row: keys [nnz] are the batch's keys (rows[i] is the row of keys[i], so
// the keys of one row are equal), unique_keys [ws.max_nnz()] receives the key of unique_rows[u] for the first
// *num_unique u. (A caller that must name the rows to another table, e.g. a replica whose row ids differ.)
void embedding_backward(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                        float* row_grads, int32_t* num_unique, const int64_t* keys, int64_t* unique_keys,
                        Stream stream);

// The same backward in two parts, so that the part that does not need the gradient (the sort of the batch's
// rows and the tables of unique rows, steps 1-4 of embedding_backward.cu) can run right after the forward, while
// other work (the model's backward) produces the gradient, and only the reduction (steps 5-6) waits for it.
//
// embedding_backward_prepare: reads batch.offsets, rows, bags, nnz and combiner (batch.grad is not read and may
// be null) and writes unique_rows, *num_unique and unique_keys (keys / unique_keys may be null, as for
// embedding_backward; unique_rows may be null) as embedding_backward writes them, and the dropped-key count. The
// sorted batch stays in ws (ws.prepared()). Asynchronous on stream (cuda): no host synchronization. Throws
// sparta::Error on sizes outside the workspace or the limits above (cpu: on bad offsets too).
void embedding_backward_prepare(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                                int64_t* unique_rows, int32_t* num_unique, const int64_t* keys, int64_t* unique_keys,
                                Stream stream);
// embedding_backward_finish: row_grads [ws.max_nnz(), dim] of the prepared batch from batch.grad, with the same
// bits as embedding_backward. batch must name the same offsets and rows pointers, bags, nnz and combiner as the
// prepare (the caller keeps offsets and rows alive and unchanged in between), and ws must still hold that
// prepare (see BackwardWorkspace::Prepared): otherwise sparta::Error, naming what differs, before anything runs.
// Asynchronous on stream (cuda): queue it on the prepare's stream or on a stream ordered after the prepare (an
// event); nothing else may use ws in between. The finish uses the prepare up: a second finish is an error.
void embedding_backward_finish(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                               float* row_grads, Stream stream);

// The backward, then the optimizer step `step` on the touched rows of values [capacity_rows, dim] and state
// [capacity_rows, optimizer_state_width(cfg.kind, dim)]: the same result as embedding_backward followed by
// sparse_optimizer_update, but the cuda version applies the optimizer in the reduction, so the row gradients
// never go through memory. ws.num_unique() holds the number of rows updated. Asynchronous on stream.
// values are of cfg.storage: 16-bit rows (sgd, rowwise_adagrad; embedding_types.h check_row_storage) are read into
// fp32 and written back rounded stochastically (kernels/row_storage.h, update_row16_cpu).
void backward_and_update(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                         const OptimizerConfig& cfg, int64_t step, void* values, float* state, Stream stream);
// The same in two parts, as embedding_backward's: backward_and_update_prepare needs neither the gradient nor the
// optimizer (the sort, steps 1-4: it can run while the gradient is still being made or moved);
// backward_and_update_finish reduces batch.grad and applies the step, with backward_and_update's bits. The finish
// checks its batch against the prepare as embedding_backward_finish does, and uses it up.
void backward_and_update_prepare(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws, Stream stream);
void backward_and_update_finish(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                                const OptimizerConfig& cfg, int64_t step, void* values, float* state, Stream stream);

// The cpu backends' check of a batch's offsets (host memory) as a CSR of its nnz keys: sparta::Error beginning
// with `what` otherwise.
void check_backward_offsets(const BackwardBatch& batch, const char* what);

// Copies a count from device memory to the host. Synchronizes stream (cuda).
int64_t read_count(const Device& dev, const int32_t* count, Stream stream);

// The backends, called by the launchers above once the batch is checked. A prepare records its backend's part
// of ws.prepared() (the launcher the rest); a finish reads it.
void embedding_backward_prepare_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                                    int32_t* num_unique, const int64_t* keys, int64_t* unique_keys);
void embedding_backward_finish_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, float* row_grads);
void backward_and_update_finish_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, const OptimizerStep& c,
                                    void* values, float* state);
void embedding_backward_prepare_cuda(const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                                     int32_t* num_unique, const int64_t* keys, int64_t* unique_keys, Stream stream);
void embedding_backward_finish_cuda(const BackwardBatch& batch, BackwardWorkspace& ws, float* row_grads,
                                    Stream stream);
void backward_and_update_finish_cuda(const BackwardBatch& batch, BackwardWorkspace& ws, const OptimizerStep& c,
                                     void* values, float* state, Stream stream);
// CUB temporary storage for the sort and the scan of up to max_nnz pairs (cuda builds only).
size_t backward_cub_temp_bytes(int64_t max_nnz, int end_bit);

}  // namespace sparta
