// embedding_backward.cpp: the workspace, the CPU reference of embedding_backward.h (the same fixed order as
// the CUDA version, so the same bits), and the backend dispatch.
#include "kernels/embedding_backward.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "src/base/check.h"

namespace sparta {

// ----------------------------------------------------------------------------
// workspace

namespace {

int bits_for(int64_t value) {  // bits to write value in binary
  int b = 0;
  while (b < 63 && (int64_t(1) << b) <= value) ++b;
  return b;
}

void check_sizes(int64_t max_nnz, int64_t capacity_rows, int dim) {
  SPARTA_REQUIRE(max_nnz >= 0 && max_nnz <= kBackwardMaxKeys,
                 "embedding backward: max_nnz (keys per call) must be in [0, %lld], found %lld",
                 static_cast<long long>(kBackwardMaxKeys), static_cast<long long>(max_nnz));
  SPARTA_REQUIRE(capacity_rows >= 1 && capacity_rows <= kBackwardMaxRows,
                 "embedding backward: capacity_rows must be in [1, %lld], found %lld",
                 static_cast<long long>(kBackwardMaxRows), static_cast<long long>(capacity_rows));
  SPARTA_REQUIRE(dim >= 1 && dim <= 256, "embedding backward: dim must be in [1, 256], found %d", dim);
}

size_t place(size_t& cursor, size_t bytes) {
  size_t at = cursor;
  cursor += (bytes + 255) / 256 * 256;
  return at;
}

}  // namespace

BackwardWorkspace::Layout BackwardWorkspace::layout(Backend backend, int64_t max_nnz, int64_t capacity_rows,
                                                    int dim) {
  check_sizes(max_nnz, capacity_rows, dim);
  const size_t n = static_cast<size_t>(max_nnz);
  const size_t nb = (n + kBackwardChunk - 1) / kBackwardChunk;
  const bool cuda = backend == Backend::cuda;
  Layout l{};
  size_t c = 0;
  // The cpu reference sorts packed (row << 32 | bag) in `scan` and needs no item arrays.
  const size_t n_gpu = cuda ? n : 0;
  l.keys_a = place(c, n_gpu * sizeof(uint32_t));
  l.keys_b = place(c, n_gpu * sizeof(uint32_t));
  l.bags_a = place(c, n_gpu * sizeof(uint32_t));
  l.bags_b = place(c, n_gpu * sizeof(uint32_t));
  l.scan = place(c, n * sizeof(int64_t));
  l.item_start = place(c, cuda ? (n + 1) * sizeof(int32_t) : 0);
  l.item_u = place(c, n_gpu * sizeof(int32_t));
  l.row_item_start = place(c, cuda ? (n + 1) * sizeof(int32_t) : 0);
  l.multi_rows = place(c, cuda ? nb * sizeof(int32_t) : 0);
  l.partials = place(c, 2 * nb * size_t(dim) * sizeof(float));
  l.counts = place(c, kCounts * sizeof(int32_t));
  if (cuda) {
#if SPARTA_CUDA
    l.temp_bytes = backward_cub_temp_bytes(max_nnz, bits_for(capacity_rows));
#else
    SPARTA_REQUIRE(false, "embedding backward: a cuda workspace in a CUDA=0 build");
#endif
  } else {
    l.temp_bytes = size_t(kCombineGroups + 1) * dim * sizeof(float);  // range sums and the row's sum
  }
  l.temp = place(c, l.temp_bytes);
  l.total = c;
  return l;
}

size_t BackwardWorkspace::bytes(Backend backend, int64_t max_nnz, int64_t capacity_rows, int dim) {
  return layout(backend, max_nnz, capacity_rows, dim).total;
}

BackwardWorkspace::BackwardWorkspace(const Device& dev, int64_t max_nnz, int64_t capacity_rows, int dim,
                                     Stream stream)
    : dev_(dev),
      max_nnz_(max_nnz),
      capacity_rows_(capacity_rows),
      dim_(dim),
      end_bit_(bits_for(capacity_rows)),
      layout_(layout(dev.backend, max_nnz, capacity_rows, dim)),
      mem_(dev, layout_.total),
      base_(mem_.data()) {
  memset_device(dev_, counts(), 0, kCounts * sizeof(int32_t), stream);
}

int64_t BackwardWorkspace::read_dropped_keys(Stream stream) const {
  return read_count(dev_, counts() + kCountDropped, stream);
}

int64_t read_count(const Device& dev, const int32_t* count, Stream stream) {
  int32_t host = 0;
  copy_to_host(dev, &host, count, sizeof(host), stream);
  return host;
}

// ----------------------------------------------------------------------------
// cpu reference

namespace {

void check_batch(const Device& dev, const BackwardBatch& b, const BackwardWorkspace& ws, bool needs_grad) {
  SPARTA_REQUIRE(dev.backend == ws.device().backend, "embedding backward on %s with a workspace made for %s",
                 dev.name().c_str(), ws.device().name().c_str());
  SPARTA_REQUIRE(b.nnz >= 0 && b.nnz <= ws.max_nnz(), "embedding backward: %lld keys, the workspace holds at most %lld",
                 static_cast<long long>(b.nnz), static_cast<long long>(ws.max_nnz()));
  SPARTA_REQUIRE(b.bags >= 0 && b.bags <= kBackwardMaxKeys, "embedding backward: bags must be in [0, %lld], found %lld",
                 static_cast<long long>(kBackwardMaxKeys), static_cast<long long>(b.bags));
  SPARTA_REQUIRE(b.offsets != nullptr, "embedding backward: no offsets given");
  SPARTA_REQUIRE(b.nnz == 0 || b.rows != nullptr, "embedding backward: %lld keys but no rows given",
                 static_cast<long long>(b.nnz));
  SPARTA_REQUIRE(!needs_grad || b.bags == 0 || b.grad != nullptr, "embedding backward: %lld bags but no gradient given",
                 static_cast<long long>(b.bags));
  check_bag_layout(b.grad_layout, "embedding backward: the gradient");
}

// The finish's batch against the prepare the workspace holds: sparta::Error naming what differs.
void check_prepared(const Device& dev, const BackwardBatch& b, const BackwardWorkspace& ws) {
  SPARTA_REQUIRE(dev.backend == ws.device().backend, "embedding backward finish on %s with a workspace made for %s",
                 dev.name().c_str(), ws.device().name().c_str());
  const BackwardWorkspace::Prepared& p = ws.prepared();
  SPARTA_REQUIRE(p.valid,
                 "embedding backward finish: the workspace holds no prepared batch (no embedding_backward_prepare "
                 "since its last finish, or the workspace was used for another backward in between)");
  SPARTA_REQUIRE(b.nnz == p.nnz, "embedding backward finish: nnz is %lld, the prepared batch's is %lld",
                 static_cast<long long>(b.nnz), static_cast<long long>(p.nnz));
  SPARTA_REQUIRE(b.bags == p.bags, "embedding backward finish: bags is %lld, the prepared batch's is %lld",
                 static_cast<long long>(b.bags), static_cast<long long>(p.bags));
  SPARTA_REQUIRE(b.combiner == p.combiner, "embedding backward finish: combiner is %s, the prepared batch's is %s",
                 combiner_name(b.combiner), combiner_name(p.combiner));
  SPARTA_REQUIRE(b.offsets == p.offsets,
                 "embedding backward finish: offsets pointer %p is not the prepared batch's (%p)",
                 static_cast<const void*>(b.offsets), static_cast<const void*>(p.offsets));
  SPARTA_REQUIRE(b.rows == p.rows, "embedding backward finish: rows pointer %p is not the prepared batch's (%p)",
                 static_cast<const void*>(b.rows), static_cast<const void*>(p.rows));
  SPARTA_REQUIRE(b.bags == 0 || b.grad != nullptr, "embedding backward finish: %lld bags but no gradient given",
                 static_cast<long long>(b.bags));
  check_bag_layout(b.grad_layout, "embedding backward finish: the gradient");
}

// Sums the contributions of every unique row of the batch embedding_backward_prepare_cpu sorted into ws, in the
// fixed order of embedding_backward.h, and hands each sum to sink(u, row, sum[dim]) in ascending row order.
template <class Sink>
void reduce_rows_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, Sink&& sink) {
  const int dim = ws.dim();
  const int64_t* offsets = batch.offsets;
  const BackwardWorkspace::Layout& l = ws.arrays();
  const uint64_t* pairs = ws.at<uint64_t>(l.scan);  // [n] row << 32 | bag, sorted
  const int64_t n = ws.prepared().pairs;
  const bool mean = batch.combiner == Combiner::mean;
  float* partials = ws.at<float>(l.partials);  // [items of one row, dim]
  float* range_sum = ws.at<float>(l.temp);      // [dim]
  float* sum = range_sum + size_t(kCombineGroups) * dim;  // [dim]
  auto sum_positions = [&](int64_t from, int64_t to, float* out) {
    std::fill(out, out + dim, 0.0f);
    for (int64_t j = from; j < to; ++j) {
      const int64_t b = int64_t(pairs[j] & 0xffffffffu);
      const float* g = batch.grad + batch.grad_layout.at(b, dim);
      if (mean) {
        const float scale = 1.0f / float(offsets[b + 1] - offsets[b]);
        for (int e = 0; e < dim; ++e) out[e] = rn::add(out[e], rn::mul(g[e], scale));
      } else {
        for (int e = 0; e < dim; ++e) out[e] = rn::add(out[e], g[e]);
      }
    }
  };
  auto add_row = [&](float* acc, const float* x) {
    for (int e = 0; e < dim; ++e) acc[e] = rn::add(acc[e], x[e]);
  };

  constexpr int64_t C = kBackwardChunk;
  int32_t u = 0;
  for (int64_t a = 0; a < n;) {
    const uint32_t row = uint32_t(pairs[a] >> 32);
    int64_t e = a + 1;
    while (e < n && uint32_t(pairs[e] >> 32) == row) ++e;
    if (e - a <= C) {
      sum_positions(a, e, sum);  // one item
    } else {
      int64_t m = 0;  // items: C positions each from the row's first one, the last one the rest
      for (int64_t s = a; s < e; s += C, ++m) sum_positions(s, std::min(e, s + C), partials + m * dim);
      const int64_t per_range = (m + kCombineGroups - 1) / kCombineGroups;
      std::fill(sum, sum + dim, 0.0f);
      for (int64_t lo = 0; lo < m; lo += per_range) {
        std::fill(range_sum, range_sum + dim, 0.0f);
        for (int64_t k = lo; k < std::min(m, lo + per_range); ++k) add_row(range_sum, partials + k * dim);
        add_row(sum, range_sum);
      }
    }
    sink(u, row, static_cast<const float*>(sum));
    ++u;
    a = e;
  }
}

}  // namespace

void check_backward_offsets(const BackwardBatch& batch, const char* what) {
  const int64_t* offsets = batch.offsets;
  for (int64_t b = 0; b < batch.bags; ++b)
    SPARTA_REQUIRE(offsets[b] <= offsets[b + 1], "%s: offsets decrease at bag %lld: %lld then %lld", what,
                   static_cast<long long>(b), static_cast<long long>(offsets[b]),
                   static_cast<long long>(offsets[b + 1]));
  SPARTA_REQUIRE(offsets[0] == 0 && offsets[batch.bags] == batch.nnz,
                 "%s: offsets must run from 0 to nnz = %lld, found %lld to %lld", what,
                 static_cast<long long>(batch.nnz), static_cast<long long>(offsets[0]),
                 static_cast<long long>(offsets[batch.bags]));
}

// Sorts the (row, bag) pairs of the kept keys into `scan` and lists the unique rows (and their keys) from them.
void embedding_backward_prepare_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                                    int32_t* num_unique, const int64_t* keys, int64_t* unique_keys) {
  check_backward_offsets(batch, "embedding backward");
  const int64_t* offsets = batch.offsets;
  uint64_t* pairs = ws.at<uint64_t>(ws.arrays().scan);  // [nnz] row << 32 | bag
  int64_t n = 0, dropped = 0;
  for (int64_t b = 0; b < batch.bags; ++b) {
    for (int64_t k = offsets[b]; k < offsets[b + 1]; ++k) {
      int64_t row = batch.rows[k];
      if (row < 0 || row >= ws.capacity_rows()) {
        ++dropped;
        continue;
      }
      pairs[n++] = (uint64_t(row) << 32) | uint64_t(b);
    }
  }
  // (row, bag) order is (row, key position) order: bags ascend with the key position, and equal pairs (one
  // row twice in a bag) contribute equal values
  std::sort(pairs, pairs + n);

  int32_t u = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = int64_t(pairs[j] >> 32);
    if (j > 0 && int64_t(pairs[j - 1] >> 32) == row) continue;
    if (unique_rows) unique_rows[u] = row;
    if (unique_keys) {  // a key of the row's first bag (every key of a row is the same key)
      const int64_t b = int64_t(pairs[j] & 0xffffffffu);
      for (int64_t k = offsets[b]; k < offsets[b + 1]; ++k) {
        if (batch.rows[k] == row) {
          unique_keys[u] = keys[k];
          break;
        }
      }
    }
    ++u;
  }
  *num_unique = u;
  ws.counts()[BackwardWorkspace::kCountDropped] = static_cast<int32_t>(dropped);
  ws.prepared().pairs = n;
}

void embedding_backward_finish_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, float* row_grads) {
  const int dim = ws.dim();
  reduce_rows_cpu(batch, ws, [&](int32_t u, uint32_t, const float* sum) {
    std::memcpy(row_grads + int64_t(u) * dim, sum, dim * sizeof(float));
  });
}

void backward_and_update_finish_cpu(const BackwardBatch& batch, BackwardWorkspace& ws, const OptimizerStep& c,
                                    void* values, float* state) {
  const int dim = ws.dim();
  const int width = optimizer_state_width(c.kind, dim);
  dispatch_optimizer(c.kind, [&](auto kind) {
    constexpr OptimizerKind K = decltype(kind)::value;
    reduce_rows_cpu(batch, ws, [&](int32_t, uint32_t row, const float* sum) {
      if (c.storage == RowStorage::fp32)
        update_row_cpu<K>(c, sum, static_cast<float*>(values) + int64_t(row) * dim, state + int64_t(row) * width, dim);
      else
        update_row16_cpu<K>(c, sum, static_cast<uint16_t*>(values) + int64_t(row) * dim, state + int64_t(row) * width,
                            dim);
    });
  });
}

// ----------------------------------------------------------------------------
// dispatch

void embedding_backward(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                        float* row_grads, int32_t* num_unique, Stream stream) {
  embedding_backward(dev, batch, ws, unique_rows, row_grads, num_unique, nullptr, nullptr, stream);
}

void embedding_backward(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws, int64_t* unique_rows,
                        float* row_grads, int32_t* num_unique, const int64_t* keys, int64_t* unique_keys,
                        Stream stream) {
  ws.prepared() = BackwardWorkspace::Prepared{};
  check_batch(dev, batch, ws, true);  // the gradient too, before the prepare runs
  embedding_backward_prepare(dev, batch, ws, unique_rows, num_unique, keys, unique_keys, stream);
  embedding_backward_finish(dev, batch, ws, row_grads, stream);
}

void embedding_backward_prepare(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                                int64_t* unique_rows, int32_t* num_unique, const int64_t* keys, int64_t* unique_keys,
                                Stream stream) {
  ws.prepared() = BackwardWorkspace::Prepared{};  // a prepare that throws leaves none
  check_batch(dev, batch, ws, false);
  SPARTA_REQUIRE(!unique_keys || keys, "embedding backward: unique_keys asked for without the batch's keys");
  SPARTA_REQUIRE(num_unique != nullptr, "embedding backward: no num_unique given");
  if (!dev.is_cuda()) {
    embedding_backward_prepare_cpu(batch, ws, unique_rows, num_unique, keys, unique_keys);
  } else {
#if SPARTA_CUDA
    embedding_backward_prepare_cuda(batch, ws, unique_rows, num_unique, keys, unique_keys, stream);
#else
    (void)stream;
    SPARTA_FATAL("embedding_backward on %s in a CUDA=0 build", dev.name().c_str());
#endif
  }
  BackwardWorkspace::Prepared& p = ws.prepared();
  p.offsets = batch.offsets;
  p.rows = batch.rows;
  p.bags = batch.bags;
  p.nnz = batch.nnz;
  p.combiner = batch.combiner;
  p.valid = true;
}

void embedding_backward_finish(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                               float* row_grads, Stream stream) {
  check_prepared(dev, batch, ws);
  SPARTA_REQUIRE(batch.nnz == 0 || row_grads != nullptr, "embedding backward finish: no row_grads given");
  ws.prepared().valid = false;  // used up
  if (!dev.is_cuda()) return embedding_backward_finish_cpu(batch, ws, row_grads);
#if SPARTA_CUDA
  embedding_backward_finish_cuda(batch, ws, row_grads, stream);
#else
  (void)stream;
  SPARTA_FATAL("embedding_backward on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void backward_and_update(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                         const OptimizerConfig& cfg, int64_t step, void* values, float* state, Stream stream) {
  ws.prepared() = BackwardWorkspace::Prepared{};  // the workspace now holds this batch, not a prepared one
  check_batch(dev, batch, ws, true);
  optimizer_step(cfg, step);  // its errors before anything runs
  backward_and_update_prepare(dev, batch, ws, stream);
  backward_and_update_finish(dev, batch, ws, cfg, step, values, state, stream);
}

void backward_and_update_prepare(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws, Stream stream) {
  embedding_backward_prepare(dev, batch, ws, nullptr, ws.counts() + BackwardWorkspace::kCountUnique, nullptr, nullptr,
                             stream);
}

void backward_and_update_finish(const Device& dev, const BackwardBatch& batch, BackwardWorkspace& ws,
                                const OptimizerConfig& cfg, int64_t step, void* values, float* state, Stream stream) {
  check_prepared(dev, batch, ws);
  OptimizerStep c = optimizer_step(cfg, step);
  check_row_storage(c.storage, cfg, ws.dim(), "backward_and_update");
  ws.prepared().valid = false;  // used up
  if (!dev.is_cuda()) return backward_and_update_finish_cpu(batch, ws, c, values, state);
#if SPARTA_CUDA
  backward_and_update_finish_cuda(batch, ws, c, values, state, stream);
#else
  (void)stream;
  SPARTA_FATAL("backward_and_update on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
