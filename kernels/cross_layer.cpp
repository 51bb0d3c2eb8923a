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
}  // namespace

void cross_input_to_half_cpu(const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16) {
  const HalfFromFloat round16 = half_from_float(t);
  for (int64_t r = 0; r < d.batch; ++r)
    for (int c = 0; c < d.out; ++c) x16[r * d.out + c] = round16(x0_at(x0, d.out, r, c));
}

void cross_block_to_half_cpu(const LinearDims& d, GemmType t, const float* a, int a_cols, uint16_t* x16) {
  const HalfFromFloat round16 = half_from_float(t);
  for (int64_t r = 0; r < d.batch; ++r)
    for (int c = 0; c < a_cols; ++c) x16[r * d.out + c] = round16(a[r * a_cols + c]);
}

void cross_forward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a) {
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float x0 = x0_at(a.x0, d.out, r, c);
      a.out[i] = x0 * (a.z[i] + a.bias[c]) + (a.xl ? a.xl[i] : x0);
    }
  }
}

void cross_backward_elementwise_cpu(const LinearDims& d, const CrossElementwise& a) {
  std::vector<double> sum(a.db ? d.out : 0, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float g = a.g[i];
      const float dz = g * x0_at(a.x0, d.out, r, c);
      float& dx0 = dx0_at(a.dx0, d.out, r, c);
      const float gz = g * (a.z[i] + a.bias[c]);
      float v = a.accumulate ? dx0 + gz : gz;
      if (a.identity) v += g;
      a.dz[i] = dz;
      dx0 = v;
      if (a.db) sum[c] += dz;
    }
  }
  for (int c = 0; a.db && c < d.out; ++c) a.db[c] = static_cast<float>(sum[c]);
}

void cross_forward_half_cpu(const LinearDims& d, const CrossElementwise& a) {
  const HalfFromFloat round16 = half_from_float(a.half);
  const HalfToFloat widen = half_to_float(a.half);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float x0 = widen(a.x16[i]);
      const float v = x0 * (widen(a.z16[i]) + a.bias[c]) + (a.xl16 ? widen(a.xl16[i]) : x0);
      if (a.out16) a.out16[i] = round16(v);
      if (a.out) a.out[i] = v;
    }
  }
}

void cross_backward_half_cpu(const LinearDims& d, const CrossElementwise& a) {
  const HalfFromFloat round16 = half_from_float(a.half);
  const HalfToFloat widen = half_to_float(a.half);
  std::vector<double> sum(a.db ? d.out : 0, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      const float dz = widen(a.g16[i]) * widen(a.x16[i]);
      a.dz16[i] = round16(dz);
      if (a.db) sum[c] += dz;
    }
  }
  for (int c = 0; a.db && c < d.out; ++c) a.db[c] = static_cast<float>(sum[c]);
}

void cross_input_grad_half_cpu(const LinearDims& d, const CrossGradTerms& a) {
  const HalfToFloat widen = half_to_float(a.half);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int c = 0; c < d.out; ++c) {
      const size_t i = size_t(r) * d.out + c;
      float& dx0 = dx0_at(a.dx0, d.out, r, c);
      float v = a.accumulate ? dx0 : 0.f;
      for (int k = a.n - 1; k >= 0; --k) {
        const float gz = widen(a.g16[k][i]) * (widen(a.z16[k][i]) + a.bias[k][c]);
        v = (a.accumulate || k < a.n - 1) ? v + gz : gz;
      }
      if (a.identity) v += widen(a.identity[i]);
      dx0 = v;
    }
  }
}

static void check_half(const LinearDims& d, GemmType t) {
  SPARTA_REQUIRE(is_half(t), "cross layer '%s': a 16-bit step needs bf16 or f16, found %s", d.layer,
                 gemm_type_name(t));
}

namespace {
void check_input(const LinearDims& d, const float* a, const void* b, int a_cols) {
  SPARTA_REQUIRE(d.batch == 0 || a, "cross layer '%s': x0 (or its gradient) is missing", d.layer);
  SPARTA_REQUIRE(!b || (a_cols >= 1 && a_cols < d.out),
                 "cross layer '%s': x0 in two blocks needs 1 <= a_cols < D (%d), found a_cols %d", d.layer, d.out,
                 a_cols);
}
void require(const LinearDims& d, bool ok, const char* what) {
  SPARTA_REQUIRE(d.batch == 0 || ok, "cross layer '%s': the step needs %s", d.layer, what);
}
}  // namespace

#if SPARTA_CUDA
#define SPARTA_CROSS_DISPATCH(dev, d, cpu_call, cuda_call) \
  do {                                                     \
    if (!(dev).is_cuda()) return cpu_call;                 \
    cuda_call;                                             \
  } while (0)
#else
#define SPARTA_CROSS_DISPATCH(dev, d, cpu_call, cuda_call)                                         \
  do {                                                                                              \
    if (!(dev).is_cuda()) return cpu_call;                                                          \
    SPARTA_FATAL("cross layer '%s' on %s in a CUDA=0 build", (d).layer, (dev).name().c_str());      \
  } while (0)
#endif

void cross_input_to_half(const Device& dev, const LinearDims& d, GemmType t, const CrossInput& x0, uint16_t* x16,
                         Stream stream) {
  check_square(d);
  check_input(d, x0.a, x0.b, x0.a_cols);
  check_half(d, t);
  SPARTA_CROSS_DISPATCH(dev, d, cross_input_to_half_cpu(d, t, x0, x16),
                        cross_input_to_half_cuda(d, t, x0, x16, stream));
}

void cross_block_to_half(const Device& dev, const LinearDims& d, GemmType t, const float* a, int a_cols,
                         uint16_t* x16, Stream stream) {
  check_square(d);
  check_half(d, t);
  SPARTA_REQUIRE(a_cols >= 1 && a_cols <= d.out, "cross layer '%s': a first block of 1 .. D (%d) columns, found %d",
                 d.layer, d.out, a_cols);
  require(d, a && x16, "x0's first block and its 16-bit array");
  SPARTA_CROSS_DISPATCH(dev, d, cross_block_to_half_cpu(d, t, a, a_cols, x16),
                        cross_block_to_half_cuda(d, t, a, a_cols, x16, stream));
}

void cross_forward_elementwise(const Device& dev, const LinearDims& d, const CrossInput& x0, const float* z,
                               const float* bias, const float* xl, float* out, Stream stream) {
  check_square(d);
  check_input(d, x0.a, x0.b, x0.a_cols);
  require(d, z && bias && out, "z, the bias and an output");
  CrossElementwise a;
  a.x0 = x0, a.z = z, a.bias = bias, a.xl = xl, a.out = out;
  SPARTA_CROSS_DISPATCH(dev, d, cross_forward_elementwise_cpu(d, a), cross_forward_elementwise_cuda(d, a, stream));
}

void cross_backward_elementwise(const Device& dev, const LinearDims& d, const float* g, const CrossInput& x0,
                                const float* z, const float* bias, float* dz, float* db, const CrossInputGrad& dx0,
                                bool accumulate, bool identity, Stream stream) {
  check_square(d);
  check_input(d, x0.a, x0.b, x0.a_cols);
  check_input(d, dx0.a, dx0.b, dx0.a_cols);
  require(d, g && z && bias && dz, "g, z, the bias and dz");
  CrossElementwise a;
  a.g = g, a.x0 = x0, a.z = z, a.bias = bias, a.dz = dz, a.db = db, a.dx0 = dx0;
  a.accumulate = accumulate, a.identity = identity;
  SPARTA_CROSS_DISPATCH(dev, d, cross_backward_elementwise_cpu(d, a), cross_backward_elementwise_cuda(d, a, stream));
}

void cross_forward_half(const Device& dev, const LinearDims& d, GemmType t, const uint16_t* x16,
                        const uint16_t* z16, const float* bias, const uint16_t* xl16, uint16_t* out16, float* out,
                        Stream stream) {
  check_square(d);
  check_half(d, t);
  require(d, x16 && z16 && bias && (out16 || out), "x0's 16-bit copy, z, the bias and an output");
  CrossElementwise a;
  a.half = t, a.x16 = x16, a.z16 = z16, a.bias = bias, a.xl16 = xl16, a.out16 = out16, a.out = out;
  SPARTA_CROSS_DISPATCH(dev, d, cross_forward_half_cpu(d, a), cross_forward_half_cuda(d, a, stream));
}

void cross_backward_half(const Device& dev, const LinearDims& d, GemmType t, const uint16_t* g16,
                         const uint16_t* x16, uint16_t* dz16, float* db, Stream stream) {
  check_square(d);
  check_half(d, t);
  require(d, g16 && x16 && dz16, "g, x0's 16-bit copy and dz");
  CrossElementwise a;
  a.half = t, a.g16 = g16, a.x16 = x16, a.dz16 = dz16, a.db = db;
  SPARTA_CROSS_DISPATCH(dev, d, cross_backward_half_cpu(d, a), cross_backward_half_cuda(d, a, stream));
}

void cross_input_grad_half(const Device& dev, const LinearDims& d, GemmType t,
                           const std::vector<const uint16_t*>& g16, const std::vector<const uint16_t*>& z16,
                           const std::vector<const float*>& bias, const uint16_t* g0, const CrossInputGrad& dx0,
                           Stream stream) {
  check_square(d);
  check_half(d, t);
  check_input(d, dx0.a, dx0.b, dx0.a_cols);
  const int n = int(g16.size());
  SPARTA_REQUIRE(n >= 1 && z16.size() == g16.size() && bias.size() == g16.size(),
                 "cross layer '%s': x0's gradient needs g, z and the bias of every layer (%d, %d and %d given)",
                 d.layer, n, int(z16.size()), int(bias.size()));
  for (int k = 0; k < n; ++k) require(d, g16[k] && z16[k] && bias[k], "every layer's g, z and bias");
  require(d, g0, "g_0");
  // passes of at most kMaxCrossTerms layers, the top ones first, each adding to what the one before wrote
  for (int hi = n; hi > 0; hi -= kMaxCrossTerms) {
    const int lo = hi > kMaxCrossTerms ? hi - kMaxCrossTerms : 0;
    CrossGradTerms a;
    a.half = t, a.n = hi - lo, a.accumulate = hi < n, a.identity = lo == 0 ? g0 : nullptr, a.dx0 = dx0;
    for (int k = lo; k < hi; ++k) a.g16[k - lo] = g16[k], a.z16[k - lo] = z16[k], a.bias[k - lo] = bias[k];
    if (!dev.is_cuda()) {
      cross_input_grad_half_cpu(d, a);
      continue;
    }
#if SPARTA_CUDA
    cross_input_grad_half_cuda(d, a, stream);
#else
    SPARTA_FATAL("cross layer '%s' on %s in a CUDA=0 build", d.layer, dev.name().c_str());
#endif
  }
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
  if (is_half(cfg_.precision)) {
    for (int l = 0; l < cfg_.layers; ++l) {
      xs16_.emplace_back(dev_, bd), hs16_.emplace_back(dev_, br), zs16_.emplace_back(dev_, bd);
      v16_.emplace_back(dev_, size_t(cfg_.rank) * cfg_.dim), u16_.emplace_back(dev_, size_t(cfg_.rank) * cfg_.dim);
      gs16_.emplace_back(dev_, bd), dzs16_.emplace_back(dev_, bd), dhs16_.emplace_back(dev_, br);
    }
    gs16_.emplace_back(dev_, bd);  // g_0 .. g_L
  } else {
    for (int l = 0; l < cfg_.layers; ++l) {
      xs_.emplace_back(dev_, bd), hs_.emplace_back(dev_, br), zs_.emplace_back(dev_, bd);
      dzs_.emplace_back(dev_, bd), dhs_.emplace_back(dev_, br);
    }
    x0_whole_ = Buffer<float>(dev_, bd);
    g_ = Buffer<float>(dev_, bd);
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

const void* CrossNet::x_gemm(int l) const {
  if (is_half(cfg_.precision)) return xs16_[l].data();
  return l == 0 ? x0_.a : xs_[l - 1].data();
}
const void* CrossNet::v_gemm(const float* params, int l) const {
  if (is_half(cfg_.precision)) return v16_[l].data();
  return params + v_offset(l);
}
const void* CrossNet::u_gemm(const float* params, int l) const {
  if (is_half(cfg_.precision)) return u16_[l].data();
  return params + u_offset(l);
}

uint16_t* CrossNet::output_grad16() { return is_half(cfg_.precision) ? gs16_.back().data() : nullptr; }

void CrossNet::check_batch(int64_t batch) const {
  SPARTA_REQUIRE(batch >= 0 && batch <= max_batch_,
                 "cross network '%s': batch must be in [0, %lld] (max_batch), found %lld", cfg_.name.c_str(),
                 (long long)max_batch_, (long long)batch);
}

uint16_t* CrossNet::input16() { return is_half(cfg_.precision) ? xs16_[0].data() : nullptr; }

const float* CrossNet::forward(const float* params, const CrossInput& x0, int64_t batch, Stream stream,
                               uint16_t* out16) {
  check_batch(batch);
  SPARTA_REQUIRE(!x0.b || (x0.a_cols >= 1 && x0.a_cols < cfg_.dim),
                 "cross network '%s': x0 in two blocks needs 1 <= a_cols < dim (%d), found a_cols %d",
                 cfg_.name.c_str(), cfg_.dim, x0.a_cols);
  const bool half = is_half(cfg_.precision);
  SPARTA_REQUIRE(!out16 || half, "cross network '%s': a 16-bit output needs bf16 or fp16 precision, found %s",
                 cfg_.name.c_str(), gemm_type_name(cfg_.precision));
  batch_ = batch;
  x0_ = x0;
  have_grads_ = false;
  const int L = cfg_.layers;
  if (!half) {
    if (x0.b) {  // the fp32 V GEMM reads x0 as one array
      concat_columns(dev_, names_[2].c_str(), batch, x0.a, x0.a_cols, x0.b, cfg_.dim - x0.a_cols, x0_whole_.data(),
                     stream);
      x0_ = CrossInput(x0_whole_.data());
    }
    for (int l = 0; l < L; ++l) {
      linear_forward(dev_, v_dims(l), cfg_.precision, Activation::none, x_gemm(l), v_gemm(params, l), nullptr,
                     hs_[l].data(), stream);
      linear_forward(dev_, u_dims(l), cfg_.precision, Activation::none, hs_[l].data(), u_gemm(params, l), nullptr,
                     zs_[l].data(), stream);
      cross_forward_elementwise(dev_, x_dims(), x0_, zs_[l].data(), params + b_offset(l),
                                l == 0 ? nullptr : xs_[l - 1].data(), xs_[l].data(), stream);
    }
    return xs_[L - 1].data();
  }
  cross_input_to_half(dev_, x_dims(), cfg_.precision, x0, xs16_[0].data(), stream);
  return forward_half_layers(params, stream, out16);
}

const float* CrossNet::forward_from_input16(const float* params, const float* a, int a_cols, int64_t batch,
                                            Stream stream, uint16_t* out16) {
  check_batch(batch);
  SPARTA_REQUIRE(is_half(cfg_.precision), "cross network '%s': x0 in its 16-bit array needs bf16 or fp16 precision, "
                 "found %s", cfg_.name.c_str(), gemm_type_name(cfg_.precision));
  SPARTA_REQUIRE(a_cols >= 1 && a_cols < cfg_.dim,
                 "cross network '%s': x0's first block needs 1 <= a_cols < dim (%d), found a_cols %d",
                 cfg_.name.c_str(), cfg_.dim, a_cols);
  batch_ = batch;
  x0_ = CrossInput();
  have_grads_ = false;
  cross_block_to_half(dev_, x_dims(), cfg_.precision, a, a_cols, xs16_[0].data(), stream);
  return forward_half_layers(params, stream, out16);
}

const float* CrossNet::forward_half_layers(const float* params, Stream stream, uint16_t* out16) {
  const int L = cfg_.layers;
  const size_t rd = size_t(cfg_.rank) * cfg_.dim;
  for (int l = 0; l < L; ++l) {
    to_half(dev_, cfg_.precision, params + v_offset(l), v16_[l].data(), rd, stream);
    to_half(dev_, cfg_.precision, params + u_offset(l), u16_[l].data(), rd, stream);
  }
  if (!out16 && out_.size() == 0) out_ = Buffer<float>(dev_, size_t(max_batch_) * cfg_.dim);
  for (int l = 0; l < L; ++l) {
    // h and z (without the bias) straight in 16 bits; x_{l+1} from x0's copy, z and x_l, rounded once
    linear_forward_half(dev_, v_dims(l), cfg_.precision, xs16_[l].data(), v_gemm(params, l), hs16_[l].data(), stream);
    linear_forward_half(dev_, u_dims(l), cfg_.precision, hs16_[l].data(), u_gemm(params, l), zs16_[l].data(), stream);
    const bool last = l + 1 == L;
    cross_forward_half(dev_, x_dims(), cfg_.precision, xs16_[0].data(), zs16_[l].data(), params + b_offset(l),
                       l == 0 ? nullptr : xs16_[l].data(), last ? out16 : xs16_[l + 1].data(),
                       last && !out16 ? out_.data() : nullptr, stream);
  }
  return out16 ? nullptr : out_.data();
}

void CrossNet::backward(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                        Stream stream) {
  backward_data(params, dxL, grads, dx0, stream);
  backward_weights(grads, stream);
}

void CrossNet::backward_data(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                             Stream stream) {
  SPARTA_REQUIRE(batch_ >= 0, "cross network '%s': backward before any forward", cfg_.name.c_str());
  SPARTA_REQUIRE(!dx0.b || (dx0.a_cols >= 1 && dx0.a_cols < cfg_.dim),
                 "cross network '%s': dx0 in two blocks needs 1 <= a_cols < dim (%d), found a_cols %d",
                 cfg_.name.c_str(), cfg_.dim, dx0.a_cols);
  SPARTA_REQUIRE(dxL || is_half(cfg_.precision) || batch_ == 0,
                 "cross network '%s': fp32 backward needs the output's gradient, found none", cfg_.name.c_str());
  if (is_half(cfg_.precision))
    backward_data_half(params, dxL, grads, dx0, stream);
  else
    backward_data_f32(params, dxL, grads, dx0, stream);
  have_grads_ = true;
}

void CrossNet::add_bottom_data_grad(const float* params, const void* dh, const CrossInputGrad& dx0, Stream stream) {
  const void* v = v_gemm(params, 0);
  if (dx0.b) {
    linear_backward_data_columns(dev_, v_dims(0), cfg_.precision, dh, v, 0, dx0.a_cols, dx0.a, true, stream);
    linear_backward_data_columns(dev_, v_dims(0), cfg_.precision, dh, v, dx0.a_cols, cfg_.dim - dx0.a_cols, dx0.b,
                                 true, stream);
  } else {
    linear_backward_data(dev_, v_dims(0), cfg_.precision, dh, v, dx0.a, true, stream);
  }
}

void CrossNet::backward_data_f32(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                                 Stream stream) {
  const int L = cfg_.layers;
  const float* g = dxL;  // dL/dx_{l+1}
  for (int l = L - 1; l >= 0; --l) {
    // at l == 0, x_l is x0: its gradient g + dh V_0 goes to dx0 directly; above, to g_
    const bool top = l == L - 1, bottom = l == 0;
    cross_backward_elementwise(dev_, x_dims(), g, x0_, zs_[l].data(), params + b_offset(l), dzs_[l].data(),
                               grads + b_offset(l), dx0, !top, bottom, stream);
    linear_backward_data(dev_, u_dims(l), cfg_.precision, dzs_[l].data(), u_gemm(params, l), dhs_[l].data(), false,
                         stream);
    // dx_l = g + dh V_l: onto dx0 at the bottom (which holds its other terms), into g_ from the top layer's g (the
    // caller's array, added as the GEMM's C), in place in g_ between
    if (bottom)
      add_bottom_data_grad(params, dhs_[0].data(), dx0, stream);
    else if (top)
      linear_backward_data_plus(dev_, v_dims(l), cfg_.precision, dhs_[l].data(), v_gemm(params, l), g, g_.data(),
                                stream);
    else
      linear_backward_data(dev_, v_dims(l), cfg_.precision, dhs_[l].data(), v_gemm(params, l), g_.data(), true,
                           stream);
    g = g_.data();
  }
}

void CrossNet::backward_data_half(const float* params, const float* dxL, float* grads, const CrossInputGrad& dx0,
                                  Stream stream) {
  const int L = cfg_.layers;
  const size_t bd = size_t(batch_) * cfg_.dim;
  // gs16_[l + 1] = g_{l+1}, gs16_[0] = g_0 = x_0's gradient through the layers above it: the top one given in 16
  // bits (output_grad16()) or rounded from dxL
  if (dxL) to_half(dev_, cfg_.precision, dxL, gs16_[L].data(), bd, stream);
  for (int l = L - 1; l >= 0; --l) {
    cross_backward_half(dev_, x_dims(), cfg_.precision, gs16_[l + 1].data(), xs16_[0].data(), dzs16_[l].data(),
                        grads + b_offset(l), stream);
    linear_backward_data_half(dev_, u_dims(l), cfg_.precision, dzs16_[l].data(), u_gemm(params, l),
                              dhs16_[l].data(), stream);
    // g_l = g_{l+1} + dh V_l, rounded once
    linear_backward_data_half_plus(dev_, v_dims(l), cfg_.precision, dhs16_[l].data(), v_gemm(params, l),
                                   gs16_[l + 1].data(), gs16_[l].data(), stream);
  }
  // x0's gradient: every layer's g_{l+1} ⊙ (z_l + b_l), plus g_0 (x_0 is x0)
  std::vector<const uint16_t*> g16, z16;
  std::vector<const float*> bias;
  for (int l = 0; l < L; ++l) {
    g16.push_back(gs16_[l + 1].data()), z16.push_back(zs16_[l].data()), bias.push_back(params + b_offset(l));
  }
  cross_input_grad_half(dev_, x_dims(), cfg_.precision, g16, z16, bias, gs16_[0].data(), dx0, stream);
}

void CrossNet::backward_weights(float* grads, Stream stream) {
  SPARTA_REQUIRE(have_grads_, "cross network '%s': backward_weights before backward_data", cfg_.name.c_str());
  const bool half = is_half(cfg_.precision);
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const void* dz = half ? static_cast<const void*>(dzs16_[l].data()) : static_cast<const void*>(dzs_[l].data());
    const void* dh = half ? static_cast<const void*>(dhs16_[l].data()) : static_cast<const void*>(dhs_[l].data());
    const void* h = half ? static_cast<const void*>(hs16_[l].data()) : static_cast<const void*>(hs_[l].data());
    linear_backward_weight(dev_, u_dims(l), cfg_.precision, dz, h, grads + u_offset(l), stream);
    linear_backward_weight(dev_, v_dims(l), cfg_.precision, dh, x_gemm(l), grads + v_offset(l), stream);
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
