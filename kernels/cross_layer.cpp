// cross_layer.cpp: CPU reference of cross_layer.h's elementwise steps, their dispatch, and the cross network
// (launchers only, so it drives both backends).
#include "kernels/cross_layer.h"

#include <cmath>
#include <utility>

#include "src/base/check.h"
#include "src/base/half.h"
#include "src/base/random.h"

namespace sparta {

namespace {
void check_square(const LinearDims& d) {
  check_linear_dims(d);
  SPARTA_REQUIRE(d.in == d.out, "cross layer '%s': the elementwise step needs in == out (D), found in %d, out %d",
                 d.layer, d.in, d.out);
}
}  // namespace

namespace {

// Element (r, c) of x0 given as two column blocks, and of its gradient.
inline float x0_at(const CrossInput& x, int cols, int64_t r, int c) {
  if (!x.b) return x.a[r * cols + c];
  return c < x.a_cols ? x.a[r * x.a_cols + c] : x.b[r * (cols - x.a_cols) + (c - x.a_cols)];
}
inline float& dx0_at(const CrossInputGrad& x, int cols, int64_t r, int c) {
  if (!x.b) return x.a[r * cols + c];
  return c < x.a_cols ? x.a[r * x.a_cols + c] : x.b[r * (cols - x.a_cols) + (c - x.a_cols)];
}
// z + bias at element i of column c: fp32 z, or the 16-bit z16 widened (exact).
inline float z_plus_bias(const CrossElementwise& a, HalfToFloat widen, size_t i, int c) {
  return (a.z16 ? widen(a.z16[i]) : a.z[i]) + a.bias[c];
}

}  // namespace

void cross_input_to_half_cpu(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16) {
  const HalfFromFloat round16 = half_from_float(t);
  for (int64_t r = 0; r < d.batch; ++r)
    for (int c = 0; c < d.out; ++c) x16[r * d.out + c] = round16(x0_at(x0, d.out, r, c));
}

void cross_forward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a) {
  const HalfFromFloat round16 = a.out16 ? half_from_float(a.half) : nullptr;
  const HalfToFloat widen = a.z16 ? half_to_float(a.half) : nullptr;
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float x0 = x0_at(a.x0, d.out, r, c);
      const float v = x0 * z_plus_bias(a, widen, i, c) + (a.xl ? a.xl[i] : x0);
      if (a.out) a.out[i] = v;
      if (a.out16) a.out16[i] = round16(v);
    }
  }
}

void cross_backward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a) {
  const HalfFromFloat round16 = a.dz16 ? half_from_float(a.half) : nullptr;
  const HalfToFloat widen = a.z16 ? half_to_float(a.half) : nullptr;
  std::vector<double> sum(a.db ? d.out : 0, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float g = a.g[i];
      const float dz = g * x0_at(a.x0, d.out, r, c);
      float& dx0 = dx0_at(a.dx0, d.out, r, c);
      const float gz = g * z_plus_bias(a, widen, i, c);
      float v = a.accumulate ? dx0 + gz : gz;
      if (a.identity) v += g;
      if (a.dz) a.dz[i] = dz;
      if (a.dz16) a.dz16[i] = round16(dz);
      dx0 = v;
      if (a.db) sum[c] += dz;
    }
  }
  for (int c = 0; a.db && c < d.out; ++c) a.db[c] = static_cast<float>(sum[c]);
}

static void check_half(const LinearDims& d, GemmType t, const uint16_t* copy16) {
  SPARTA_REQUIRE(!copy16 || is_half(t), "cross layer '%s': a 16-bit array needs bf16 or f16, found %s", d.layer,
                 gemm_type_name(t));
}

namespace {
void check_input(const LinearDims& d, const float* a, const void* b, int a_cols) {
  SPARTA_REQUIRE(d.batch == 0 || a, "cross layer '%s': x0 (or its gradient) is missing", d.layer);
  SPARTA_REQUIRE(!b || (a_cols >= 1 && a_cols < d.out),
                 "cross layer '%s': x0 in two blocks needs 1 <= a_cols < D (%d), found a_cols %d", d.layer, d.out,
                 a_cols);
}
}  // namespace

void cross_input_to_half(const Device& dev, const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16,
                         Stream stream) {
  check_square(d);
  check_input(d, x0.a, x0.b, x0.a_cols);
  SPARTA_REQUIRE(is_half(t), "cross layer '%s': a 16-bit copy needs bf16 or f16, found %s", d.layer,
                 gemm_type_name(t));
  if (!dev.is_cuda()) return cross_input_to_half_cpu(d, t, x0, x16);
#if SPARTA_CUDA
  cross_input_to_half_cuda(d, t, x0, x16, stream);
#else
  SPARTA_FATAL("cross layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

void cross_forward_elementwise(const Device& dev, const LinearDims& d, GemmType t, const CrossInput& x0,
                               const float* z, const uint16_t* z16, const float* bias, const float* xl, float* out,
                               uint16_t* out16, Stream stream) {
  check_square(d);
  check_input(d, x0.a, x0.b, x0.a_cols);
  check_half(d, t, out16);
  check_half(d, t, z16);
  SPARTA_REQUIRE(out || out16, "cross layer '%s': the forward step needs an output", d.layer);
  SPARTA_REQUIRE(d.batch == 0 || ((z != nullptr) != (z16 != nullptr) && bias),
                 "cross layer '%s': the forward step needs z (fp32 or 16-bit, one of them) and the bias", d.layer);
  CrossElementwise a{};
  a.half = t, a.x0 = x0, a.z = z, a.z16 = z16, a.bias = bias, a.xl = xl, a.out = out, a.out16 = out16;
  if (!dev.is_cuda()) return cross_forward_elementwise_cpu(d, a);
#if SPARTA_CUDA
  cross_forward_elementwise_cuda(d, a, stream);
#else
  SPARTA_FATAL("cross layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

void cross_backward_elementwise(const Device& dev, const LinearDims& d, GemmType t, const float* g,
                                const CrossInput& x0, const float* z, const uint16_t* z16, const float* bias,
                                float* dz, uint16_t* dz16, float* db, const CrossInputGrad& dx0, bool accumulate,
                                bool identity, Stream stream) {
  check_square(d);
  check_input(d, x0.a, x0.b, x0.a_cols);
  check_input(d, dx0.a, dx0.b, dx0.a_cols);
  check_half(d, t, dz16);
  check_half(d, t, z16);
  SPARTA_REQUIRE(d.batch == 0 || ((z != nullptr) != (z16 != nullptr) && bias && (dz || dz16)),
                 "cross layer '%s': the backward step needs z (fp32 or 16-bit, one of them), the bias and dz", d.layer);
  CrossElementwise a{};
  a.half = t, a.g = g, a.x0 = x0, a.z = z, a.z16 = z16, a.bias = bias;
  a.dz = dz, a.dz16 = dz16, a.db = db, a.dx0 = dx0, a.accumulate = accumulate, a.identity = identity;
  if (!dev.is_cuda()) return cross_backward_elementwise_cpu(d, a);
#if SPARTA_CUDA
  cross_backward_elementwise_cuda(d, a, stream);
#else
  SPARTA_FATAL("cross layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
}

void copy_columns_cpu(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] = src[r * src_ld + c];
}

namespace {
void check_columns(const char* layer, int64_t batch, int a_cols, int b_cols) {
  SPARTA_REQUIRE(batch >= 0 && a_cols >= 1 && b_cols >= 1,
                 "cross input '%s': expected batch >= 0 and both widths >= 1, found batch %lld, widths %d and %d",
                 layer, (long long)batch, a_cols, b_cols);
}
void copy_columns(const Device& dev, const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                  int64_t cols, Stream stream) {
  if (!dev.is_cuda()) return copy_columns_cpu(src, src_ld, dst, dst_ld, rows, cols);
#if SPARTA_CUDA
  copy_columns_cuda(src, src_ld, dst, dst_ld, rows, cols, stream);
#else
  SPARTA_FATAL("copy_columns on %s in a CUDA=0 build", dev.name().c_str());
#endif
}
}  // namespace

void concat_columns(const Device& dev, const char* layer, int64_t batch, const float* a, int a_cols, const float* b,
                    int b_cols, float* out, Stream stream) {
  check_columns(layer, batch, a_cols, b_cols);
  const int64_t width = int64_t(a_cols) + b_cols;
  copy_columns(dev, a, a_cols, out, width, batch, a_cols, stream);
  copy_columns(dev, b, b_cols, out + a_cols, width, batch, b_cols, stream);
}

// ---------------------------------------------------------------------------------------------------------
// CrossNet

size_t CrossNet::param_count(int dim, int rank, int layers) {
  return size_t(layers) * (size_t(2) * rank * dim + dim);
}

CrossNet::CrossNet(const Device& dev, CrossConfig cfg, int64_t max_batch)
    : dev_(dev), cfg_(std::move(cfg)), max_batch_(max_batch) {
  const char* name = cfg_.name.c_str();
  SPARTA_REQUIRE(cfg_.dim >= 1 && cfg_.rank >= 1 && cfg_.layers >= 1,
                 "cross network '%s': dim, rank and layers must be >= 1, found dim %d, rank %d, layers %d", name,
                 cfg_.dim, cfg_.rank, cfg_.layers);
  SPARTA_REQUIRE(max_batch_ >= 1, "cross network '%s': max_batch must be >= 1, found %lld", name,
                 (long long)max_batch_);
  for (int l = 0; l < cfg_.layers; ++l) {
    names_.push_back(cfg_.name + "." + std::to_string(l) + ".V");
    names_.push_back(cfg_.name + "." + std::to_string(l) + ".U");
    names_.push_back(cfg_.name + "." + std::to_string(l) + ".x");
  }
  {
    const int64_t keep = batch_;
    batch_ = max_batch_;  // every matrix at the largest batch must be indexable
    check_linear_dims(v_dims(0));
    check_linear_dims(u_dims(0));
    batch_ = keep;
  }
  const size_t bd = size_t(max_batch_) * cfg_.dim, br = size_t(max_batch_) * cfg_.rank;
  const bool half = is_half(cfg_.precision);
  for (int l = 0; l < cfg_.layers; ++l) {
    xs_.emplace_back(dev_, bd);
    hs_.emplace_back(dev_, half ? 0 : br);  // 16-bit: the V GEMM writes hs16_ alone
    zs_.emplace_back(dev_, half ? 0 : bd);  // 16-bit: the U GEMM writes zs16_ alone
    if (half) {
      xs16_.emplace_back(dev_, bd), hs16_.emplace_back(dev_, br), zs16_.emplace_back(dev_, bd);
      v16_.emplace_back(dev_, size_t(cfg_.rank) * cfg_.dim), u16_.emplace_back(dev_, size_t(cfg_.rank) * cfg_.dim);
    }
  }
  if (!half) dz_ = Buffer<float>(dev_, bd);  // 16-bit: the GEMMs read dz16_ alone
  if (!half) x0_whole_ = Buffer<float>(dev_, bd);
  g_ = Buffer<float>(dev_, bd);
  if (!half) dh_ = Buffer<float>(dev_, br);  // 16-bit: the U data GEMM writes dh16_ alone
  if (half) {
    dz16_ = Buffer<uint16_t>(dev_, bd);
    dh16_ = Buffer<uint16_t>(dev_, br);
  }
}

LinearDims CrossNet::v_dims(int l) const {
  return LinearDims{names_[3 * l].c_str(), batch_ < 0 ? 0 : batch_, cfg_.dim, cfg_.rank};
}
LinearDims CrossNet::u_dims(int l) const {
  return LinearDims{names_[3 * l + 1].c_str(), batch_ < 0 ? 0 : batch_, cfg_.rank, cfg_.dim};
}
LinearDims CrossNet::x_dims() const {
  return LinearDims{names_[2].c_str(), batch_ < 0 ? 0 : batch_, cfg_.dim, cfg_.dim};
}

const void* CrossNet::v_gemm(const float* params, int l) const {
  if (is_half(cfg_.precision)) return v16_[l].data();
  return params + v_offset(l);
}
const void* CrossNet::u_gemm(const float* params, int l) const {
  if (is_half(cfg_.precision)) return u16_[l].data();
  return params + u_offset(l);
}

const float* CrossNet::forward(const float* params, const CrossInput& x0, int64_t batch, Stream stream,
                               uint16_t* out16) {
  SPARTA_REQUIRE(batch >= 0 && batch <= max_batch_,
                 "cross network '%s': batch must be in [0, %lld] (max_batch), found %lld", cfg_.name.c_str(),
                 (long long)max_batch_, (long long)batch);
  SPARTA_REQUIRE(!x0.b || (x0.a_cols >= 1 && x0.a_cols < cfg_.dim),
                 "cross network '%s': x0 in two blocks needs 1 <= a_cols < dim (%d), found a_cols %d",
                 cfg_.name.c_str(), cfg_.dim, x0.a_cols);
  batch_ = batch;
  x0_ = x0;
  const bool half = is_half(cfg_.precision);
  SPARTA_REQUIRE(!out16 || half, "cross network '%s': a 16-bit output needs bf16 or fp16 precision, found %s",
                 cfg_.name.c_str(), gemm_type_name(cfg_.precision));
  if (half) {
    const size_t rd = size_t(cfg_.rank) * cfg_.dim;
    for (int l = 0; l < cfg_.layers; ++l) {
      to_half(dev_, cfg_.precision, params + v_offset(l), v16_[l].data(), rd, stream);
      to_half(dev_, cfg_.precision, params + u_offset(l), u16_[l].data(), rd, stream);
    }
    cross_input_to_half(dev_, x_dims(), cfg_.precision, x0, xs16_[0].data(), stream);
  } else if (x0.b) {  // the fp32 V GEMM reads x0 as one array
    concat_columns(dev_, names_[2].c_str(), batch, x0.a, x0.a_cols, x0.b, cfg_.dim - x0.a_cols, x0_whole_.data(),
                   stream);
    x0_ = CrossInput(x0_whole_.data());
  }
  for (int l = 0; l < cfg_.layers; ++l) {
    const void* xl = half ? static_cast<const void*>(xs16_[l].data()) : static_cast<const void*>(x_in(l));
    const void* v = v_gemm(params, l);
    const void* u = u_gemm(params, l);
    // h and z (without the bias) straight into their 16-bit copies in 16-bit training: the only forms read
    if (half) {
      linear_forward_half(dev_, v_dims(l), cfg_.precision, xl, v, hs16_[l].data(), stream);
      linear_forward_half(dev_, u_dims(l), cfg_.precision, hs16_[l].data(), u, zs16_[l].data(), stream);
    } else {
      linear_forward(dev_, v_dims(l), cfg_.precision, Activation::none, xl, v, nullptr, hs_[l].data(), stream);
      linear_forward(dev_, u_dims(l), cfg_.precision, Activation::none, hs_[l].data(), u, nullptr, zs_[l].data(),
                     stream);
    }
    const bool last = l + 1 == cfg_.layers;
    uint16_t* next16 = half ? (last ? out16 : xs16_[l + 1].data()) : nullptr;
    // the last layer's fp32 output only where the caller reads it (no out16); the backward never does
    float* out = last && out16 ? nullptr : xs_[l].data();
    cross_forward_elementwise(dev_, x_dims(), cfg_.precision, x0_, half ? nullptr : zs_[l].data(),
                              half ? zs16_[l].data() : nullptr, params + b_offset(l),
                              l == 0 ? nullptr : xs_[l - 1].data(), out, next16, stream);
  }
  return out16 ? nullptr : xs_[cfg_.layers - 1].data();
}

void CrossNet::backward(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                        Stream stream) {
  SPARTA_REQUIRE(batch_ >= 0, "cross network '%s': backward before any forward", cfg_.name.c_str());
  SPARTA_REQUIRE(!dx0.b || (dx0.a_cols >= 1 && dx0.a_cols < cfg_.dim),
                 "cross network '%s': dx0 in two blocks needs 1 <= a_cols < dim (%d), found a_cols %d",
                 cfg_.name.c_str(), cfg_.dim, dx0.a_cols);
  const bool half = is_half(cfg_.precision);
  const int L = cfg_.layers;
  const float* g = dxL;  // dL/dx_{l+1}
  for (int l = L - 1; l >= 0; --l) {
    // at l == 0, x_l is x0: its gradient g + dh V_0 goes to dx0 directly; above, to g_
    const bool top = l == L - 1, bottom = l == 0;
    cross_backward_elementwise(dev_, x_dims(), cfg_.precision, g, x0_, half ? nullptr : zs_[l].data(),
                               half ? zs16_[l].data() : nullptr, params + b_offset(l), half ? nullptr : dz_.data(),
                               half ? dz16_.data() : nullptr, grads + b_offset(l), dx0, !top, bottom, stream);
    const void* dz = half ? static_cast<const void*>(dz16_.data()) : static_cast<const void*>(dz_.data());
    const void* h = half ? static_cast<const void*>(hs16_[l].data()) : static_cast<const void*>(hs_[l].data());
    const void* xl = half ? static_cast<const void*>(xs16_[l].data()) : static_cast<const void*>(x_in(l));
    const void* u = u_gemm(params, l);
    const void* v = v_gemm(params, l);
    linear_backward_weight(dev_, u_dims(l), cfg_.precision, dz, h, grads + u_offset(l), stream);
    const void* dh = nullptr;
    if (half) {  // dh straight into its 16-bit copy: the only form the V GEMMs read
      linear_backward_data_half(dev_, u_dims(l), cfg_.precision, dz, u, dh16_.data(), stream);
      dh = dh16_.data();
    } else {
      linear_backward_data(dev_, u_dims(l), cfg_.precision, dz, u, dh_.data(), false, stream);
      dh = dh_.data();
    }
    linear_backward_weight(dev_, v_dims(l), cfg_.precision, dh, xl, grads + v_offset(l), stream);
    // dx_l = g + dh V_l: onto dx0 at the bottom (which holds its other terms; block by block when it is in two),
    // into g_ from the top layer's g (the caller's array, added as the GEMM's C), in place in g_ between
    if (bottom && dx0.b) {
      linear_backward_data_columns(dev_, v_dims(l), cfg_.precision, dh, v, 0, dx0.a_cols, dx0.a, true, stream);
      linear_backward_data_columns(dev_, v_dims(l), cfg_.precision, dh, v, dx0.a_cols, cfg_.dim - dx0.a_cols, dx0.b,
                                   true, stream);
    } else if (bottom) {
      linear_backward_data(dev_, v_dims(l), cfg_.precision, dh, v, dx0.a, true, stream);
    } else if (top) {
      linear_backward_data_plus(dev_, v_dims(l), cfg_.precision, dh, v, g, g_.data(), stream);
    } else {
      linear_backward_data(dev_, v_dims(l), cfg_.precision, dh, v, g_.data(), true, stream);
    }
    g = g_.data();
  }
}

std::vector<float> CrossNet::initial_params(int dim, int rank, int layers, uint64_t seed) {
  std::vector<float> p(param_count(dim, rank, layers), 0.f);
  const float limit = static_cast<float>(std::sqrt(6.0 / (double(dim) + rank)));
  const size_t mats = size_t(2) * rank * dim, per_layer = mats + dim;
  for (int l = 0; l < layers; ++l)
    for (size_t k = 0; k < mats; ++k) {
      const size_t i = l * per_layer + k;
      p[i] = static_cast<float>((2.0 * unit_double(hash_mix(seed, i)) - 1.0) * limit);
    }
  return p;
}

}  // namespace sparta
