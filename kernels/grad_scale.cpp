// grad_scale.cpp: CPU reference of grad_scale.h, and the backend dispatch.
#include "kernels/grad_scale.h"

#include <cmath>

#include "src/base/check.h"

namespace sparta {

void scale_values_cpu(float* x, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

void unscale_and_check_cpu(float* a, size_t na, float* b, size_t nb, float s, int* nonfinite) {
  int bad = 0;
  for (size_t i = 0; i < na; ++i) {
    bad |= !std::isfinite(a[i]);
    a[i] *= s;
  }
  for (size_t i = 0; i < nb; ++i) {
    bad |= !std::isfinite(b[i]);
    b[i] *= s;
  }
  nonfinite[0] = bad;
}

void scale_values(const Device& dev, float* x, size_t n, float s, Stream stream) {
  if (!dev.is_cuda()) return scale_values_cpu(x, n, s);
#if SPARTA_CUDA
  scale_values_cuda(x, n, s, stream);
#else
  (void)stream;
  SPARTA_FATAL("scale_values on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void unscale_and_check(const Device& dev, float* a, size_t na, float* b, size_t nb, float s, int* nonfinite,
                       Stream stream) {
  if (!dev.is_cuda()) return unscale_and_check_cpu(a, na, b, nb, s, nonfinite);
#if SPARTA_CUDA
  unscale_and_check_cuda(a, na, b, nb, s, nonfinite, stream);
#else
  (void)stream;
  SPARTA_FATAL("unscale_and_check on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
