// key_init.cpp: CPU reference of key_init.h, and the backend dispatch.
#include "kernels/key_init.h"

#include "src/base/check.h"

namespace sparta {

void init_rows_by_key_cpu(const int64_t* keys, const int64_t* rows, int64_t n, float* values, int dim,
                          const KeyInit& init) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) continue;
    uint64_t stream = key_stream(init, static_cast<uint64_t>(keys[i]));
    float* v = values + rows[i] * dim;
    for (int e = 0; e < dim; ++e) v[e] = initial_value_at(stream, init.scale, e);
  }
}

void init_rows_by_key(const Device& dev, const int64_t* keys, const int64_t* rows, int64_t n, float* values,
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
