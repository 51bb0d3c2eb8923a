// key_init.cpp: CPU reference of key_init.h, and the backend dispatch.
#include "kernels/key_init.h"
#include "kernels/row_storage.h"

#include "src/base/check.h"

namespace sparta {

void init_rows_by_key_cpu(const int64_t* keys, const int64_t* rows, int64_t n, void* values, int dim,
                          const KeyInit& init) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) continue;
    uint64_t stream = key_stream(init, static_cast<uint64_t>(keys[i]));
    for (int e = 0; e < dim; ++e)
      rowstore::store_nearest(values, init.storage, rows[i] * dim + e, initial_value_at(stream, init.scale, e));
  }
}

void init_rows_strided_cpu(int64_t n, int64_t stride, int64_t offset, void* values, int dim, const KeyInit& init) {
  for (int64_t r = 0; r < n; ++r) {
    uint64_t stream = key_stream(init, static_cast<uint64_t>(offset + r * stride));
    for (int e = 0; e < dim; ++e)
      rowstore::store_nearest(values, init.storage, r * dim + e, initial_value_at(stream, init.scale, e));
  }
}

void init_rows_strided(const Device& dev, int64_t n, int64_t stride, int64_t offset, void* values, int dim,
                       const KeyInit& init, Stream stream) {
  if (!dev.is_cuda()) return init_rows_strided_cpu(n, stride, offset, values, dim, init);
#if SPARTA_CUDA
  init_rows_strided_cuda(n, stride, offset, values, dim, init, stream);
#else
  (void)stream;
  SPARTA_FATAL("init_rows_strided on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void init_rows_by_key(const Device& dev, const int64_t* keys, const int64_t* rows, int64_t n, void* values,
                      int dim, const KeyInit& init, Stream stream) {
  if (!dev.is_cuda()) return init_rows_by_key_cpu(keys, rows, n, values, dim, init);
#if SPARTA_CUDA
  init_rows_by_key_cuda(keys, rows, n, values, dim, init, stream);
#else
  (void)stream;
  SPARTA_FATAL("init_rows_by_key on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
