// atomic_sgd.cpp: CPU version of atomic_sgd.h (the keys in key order), the checks and the backend dispatch.
#include "kernels/atomic_sgd.h"

#include <algorithm>
#include <cmath>

#include "src/base/check.h"
#include "kernels/sparse_optimizer.h"

namespace sparta {

void atomic_sgd_update_cpu(const BackwardBatch& b, float lr, float* values, int64_t capacity_rows, int dim) {
  check_backward_offsets(b, "atomic sgd update");
  for (int64_t bag = 0; bag < b.bags; ++bag) {
    const int64_t s = b.offsets[bag], e = b.offsets[bag + 1];
    const float scale = 1.0f / static_cast<float>(e - s);
    const float* g = b.grad + b.grad_layout.at(bag, dim);
    for (int64_t k = s; k < e; ++k) {
      const int64_t row = b.rows[k];
      if (row < 0 || row >= capacity_rows) continue;
      float* w = values + row * dim;
      for (int d = 0; d < dim; ++d) {
        const float gd = b.combiner == Combiner::mean ? rn::mul(g[d], scale) : g[d];
        w[d] = rn::add(w[d], -rn::mul(lr, gd));
      }
    }
  }
}

int64_t atomic_sgd_mark_words(int64_t capacity_rows, int dim) {
  return dim >= kAtomicSgdMarkedDim ? 2 * ((std::max<int64_t>(capacity_rows, 0) + 31) / 32) : 0;
}

void atomic_sgd_update(const Device& dev, const BackwardBatch& batch, float lr, float* values, int64_t capacity_rows,
                       int dim, uint32_t* marks, Stream stream) {
  SPARTA_REQUIRE(dim >= 1 && dim <= 256, "atomic sgd update: dim must be in [1, 256], found %d", dim);
  check_bag_layout(batch.grad_layout, "atomic sgd update: the gradient");
  SPARTA_REQUIRE(std::isfinite(lr), "atomic sgd update: the learning rate must be finite, found %g", double(lr));
  SPARTA_REQUIRE(capacity_rows >= 0, "atomic sgd update: capacity_rows must be >= 0, found %lld",
                 static_cast<long long>(capacity_rows));
  SPARTA_REQUIRE(batch.nnz >= 0 && batch.nnz <= kBackwardMaxKeys,
                 "atomic sgd update: keys must be in [0, %lld], found %lld", static_cast<long long>(kBackwardMaxKeys),
                 static_cast<long long>(batch.nnz));
  SPARTA_REQUIRE(batch.bags >= 0 && batch.bags <= kBackwardMaxKeys,
                 "atomic sgd update: bags must be in [0, %lld], found %lld", static_cast<long long>(kBackwardMaxKeys),
                 static_cast<long long>(batch.bags));
  SPARTA_REQUIRE(batch.offsets != nullptr, "atomic sgd update: no offsets given");
  SPARTA_REQUIRE(batch.nnz == 0 || batch.rows != nullptr, "atomic sgd update: %lld keys but no rows given",
                 static_cast<long long>(batch.nnz));
  SPARTA_REQUIRE(batch.bags == 0 || batch.grad != nullptr, "atomic sgd update: %lld bags but no gradient given",
                 static_cast<long long>(batch.bags));
  SPARTA_REQUIRE(batch.nnz == 0 || values != nullptr, "atomic sgd update: no values given");
  if (!dev.is_cuda()) return atomic_sgd_update_cpu(batch, lr, values, capacity_rows, dim);
#if SPARTA_CUDA
  atomic_sgd_update_cuda(batch, lr, values, capacity_rows, dim, marks, stream);
#else
  (void)marks, (void)stream;
  SPARTA_FATAL("atomic_sgd_update on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
