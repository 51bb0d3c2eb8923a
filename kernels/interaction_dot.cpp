// interaction_dot.cpp: CPU reference of interaction_dot.h, the shape checks and the backend dispatch.
#include "kernels/interaction_dot.h"

#include <algorithm>
#include <vector>

#include "src/base/check.h"

namespace sparta {

int64_t interaction_dot_width(int slots, int dim) { return dim + int64_t(slots + 1) * slots / 2; }

size_t interaction_dot_tiled_smem(int slots, int dim, bool backward) {
  const size_t n = size_t(slots) + 1;
  if (backward) {  // two buffers of T [n][dim rounded up to 4] and of dout's row [width], dZ^T [n][n rounded up to 8]
    return (2 * n * ((size_t(dim) + 3) / 4 * 4) + n * ((n + 7) / 8 * 8) + 2 * size_t(interaction_dot_width(slots, dim))) *
           sizeof(float);
  }
  // two buffers of T [4 nb][ld] with ld the smallest >= dim that is 1 mod 32, nb = ceil(n / 4); 17 floats per
  // tile and k lane
  const size_t nb = (n + 3) / 4, ld = size_t(dim) + size_t((33 - dim % 32) % 32);
  return (2 * 4 * nb * ld + nb * (nb + 1) / 2 * 4 * 17) * sizeof(float);
}

const char* interaction_dot_forward_path(int slots, int dim) {
  const size_t limit = 48 * 1024, n = size_t(slots) + 1;
  // streamed in chunks of columns, up to 1024 of them: on the GPU at dim 4000 a few dot products fell outside the
  // fp32 kernels' 1e-4 of the reference, so longer rows take those kernels
  if (n <= 32 && dim <= 1024) return "tensor";
  return interaction_dot_tiled_smem(slots, dim, false) <= limit ? "tiled" : "general";
}

void check_interaction_dims(const InteractionDims& d) {
  const char* layer = d.layer ? d.layer : "interaction";
  SPARTA_REQUIRE(d.batch >= 0, "interaction '%s': batch must be >= 0, found %lld", layer, (long long)d.batch);
  SPARTA_REQUIRE(d.slots >= 1 && d.slots <= 4096, "interaction '%s': slots must be in [1, 4096], found %d", layer,
                 d.slots);
  SPARTA_REQUIRE(d.dim >= 1 && d.dim <= 65536, "interaction '%s': dim must be in [1, 65536], found %d", layer, d.dim);
  const int64_t width = interaction_dot_width(d.slots, d.dim);
  SPARTA_REQUIRE(d.ld == 0 || (d.ld >= width && d.ld <= (int64_t(1) << 40)),
                 "interaction '%s': ld (the output's row pitch) must be 0 or in [%lld (the width), 2^40], found %lld",
                 layer, (long long)width, (long long)d.ld);
  const int64_t per_sample = std::max(width, d.ld) + int64_t(d.slots + 1) * d.dim;
  SPARTA_REQUIRE(d.batch <= (int64_t(1) << 62) / per_sample,
                 "interaction '%s': batch %lld x %lld floats per sample is too large", layer, (long long)d.batch,
                 (long long)per_sample);
}

int64_t interaction_dot_ld(const InteractionDims& d) {
  return d.ld > 0 ? d.ld : interaction_dot_width(d.slots, d.dim);
}

namespace {
// Row i of sample b's T: the bottom output for i == 0, else embedding i - 1.
const float* t_row(const InteractionDims& d, const float* bottom, const float* emb, int64_t b, int i) {
  return i == 0 ? bottom + b * d.dim : emb + (b * d.slots + (i - 1)) * int64_t(d.dim);
}
}  // namespace

void interaction_dot_forward_cpu(const InteractionDims& d, const float* bottom, const float* emb, float* out,
                                 GemmType t, uint16_t* out16) {
  const int64_t width = interaction_dot_width(d.slots, d.dim), ld = interaction_dot_ld(d);
  const HalfFromFloat round16 = out16 ? half_from_float(t) : nullptr;
  std::vector<float> row(out16 ? size_t(ld) : 0);
  for (int64_t b = 0; b < d.batch; ++b) {
    float* o = out16 ? row.data() : out + b * ld;
    for (int k = 0; k < d.dim; ++k) o[k] = bottom[b * d.dim + k];
    int64_t p = d.dim;
    for (int i = 1; i <= d.slots; ++i) {
      const float* ti = t_row(d, bottom, emb, b, i);
      for (int j = 0; j < i; ++j) {
        const float* tj = t_row(d, bottom, emb, b, j);
        float s = 0.f;
        for (int k = 0; k < d.dim; ++k) s += ti[k] * tj[k];
        o[p++] = s;
      }
    }
    for (int64_t c = width; c < ld; ++c) o[c] = 0.f;
    if (out16)
      for (int64_t c = 0; c < ld; ++c) out16[b * ld + c] = round16(o[c]);
  }
}

void interaction_dot_backward_cpu(const InteractionDims& d, const float* dout, const float* bottom,
                                  const float* emb, float* dbottom, float* demb) {
  const int64_t ld = interaction_dot_ld(d);  // dout's row pitch
  const int n = d.slots + 1;
  std::vector<float> acc(d.dim);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* dz = dout + b * ld + d.dim;  // pair (i, j), j < i, at i(i-1)/2 + j
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < d.dim; ++k) acc[k] = i == 0 ? dout[b * ld + k] : 0.f;
      for (int j = 0; j < n; ++j) {
        if (j == i) continue;
        const float g = j < i ? dz[int64_t(i) * (i - 1) / 2 + j] : dz[int64_t(j) * (j - 1) / 2 + i];
        const float* tj = t_row(d, bottom, emb, b, j);
        for (int k = 0; k < d.dim; ++k) acc[k] += g * tj[k];
      }
      float* dst = i == 0 ? dbottom + b * d.dim : demb + (b * d.slots + (i - 1)) * int64_t(d.dim);
      for (int k = 0; k < d.dim; ++k) dst[k] = acc[k];
    }
  }
}

void interaction_dot_forward(const Device& dev, const InteractionDims& d, const float* bottom, const float* emb,
                             float* out, Stream stream) {
  check_interaction_dims(d);
  if (!dev.is_cuda()) return interaction_dot_forward_cpu(d, bottom, emb, out);
#if SPARTA_CUDA
  interaction_dot_forward_cuda(d, bottom, emb, out, GemmType::f32, nullptr, stream);
#else
  SPARTA_FATAL("interaction '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

void interaction_dot_forward_half(const Device& dev, const InteractionDims& d, GemmType t, const float* bottom,
                                  const float* emb, uint16_t* out16, Stream stream) {
  check_interaction_dims(d);
  SPARTA_REQUIRE(is_half(t), "interaction '%s': a 16-bit output needs bf16 or fp16, found %s", d.layer,
                 gemm_type_name(t));
  if (!dev.is_cuda()) return interaction_dot_forward_cpu(d, bottom, emb, nullptr, t, out16);
#if SPARTA_CUDA
  interaction_dot_forward_cuda(d, bottom, emb, nullptr, t, out16, stream);
#else
  SPARTA_FATAL("interaction '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

void interaction_dot_backward(const Device& dev, const InteractionDims& d, const float* dout, const float* bottom,
                              const float* emb, float* dbottom, float* demb, Stream stream) {
  check_interaction_dims(d);
  if (!dev.is_cuda()) return interaction_dot_backward_cpu(d, dout, bottom, emb, dbottom, demb);
#if SPARTA_CUDA
  interaction_dot_backward_cuda(d, dout, bottom, emb, dbottom, demb, stream);
#else
  SPARTA_FATAL("interaction '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

}  // namespace sparta
