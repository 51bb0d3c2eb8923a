// fill.cpp: CPU reference of fill.h, and the backend dispatch.
#include "kernels/fill.h"

#include "src/base/check.h"

namespace sparta {

namespace {
template <typename T>
void fill_on(const Device& dev, T* out, size_t n, T value, Stream stream) {
  if (!dev.is_cuda()) return fill_cpu(out, n, value);
#if SPARTA_CUDA
  fill_cuda(out, n, value, stream);
#else
  (void)stream;
  SPARTA_FATAL("fill on %s in a CUDA=0 build", dev.name().c_str());
#endif
}
}  // namespace

void fill_cpu(float* out, size_t n, float value) {
  for (size_t i = 0; i < n; ++i) out[i] = value;
}

void fill_cpu(int64_t* out, size_t n, int64_t value) {
  for (size_t i = 0; i < n; ++i) out[i] = value;
}

void fill(const Device& dev, float* out, size_t n, float value, Stream stream) { fill_on(dev, out, n, value, stream); }

void fill(const Device& dev, int64_t* out, size_t n, int64_t value, Stream stream) {
  fill_on(dev, out, n, value, stream);
}

}  // namespace sparta
