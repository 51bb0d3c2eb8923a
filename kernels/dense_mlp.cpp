// dense_mlp.cpp: see dense_mlp.h. Only launchers of dense_linear.h: the same code drives both backends.
#include "kernels/dense_mlp.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "src/base/check.h"
#include "src/base/random.h"
#include "kernels/cross_layer.h"
#include "kernels/dense_dropout.h"

namespace sparta {

namespace {

// Copies rows x cols floats from src (row pitch src_ld) to dst (row pitch cols).
void copy_unpadded(const Device& dev, const float* src, int64_t src_ld, float* dst, int64_t rows, int64_t cols,
                   Stream stream) {
  if (!dev.is_cuda()) return copy_columns_cpu(src, src_ld, dst, cols, rows, cols);
#if SPARTA_CUDA
  copy_columns_cuda(src, src_ld, dst, cols, rows, cols, stream);
#else
  SPARTA_FATAL("MLP on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace

size_t Mlp::param_count(const std::vector<int>& sizes) {
  size_t n = 0;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) n += size_t(sizes[l]) * sizes[l + 1] + sizes[l + 1];
  return n;
}

Mlp::Mlp(const Device& dev, MlpConfig cfg, int64_t max_batch) : dev_(dev), cfg_(std::move(cfg)), max_batch_(max_batch) {
  const char* name = cfg_.name.c_str();
  SPARTA_REQUIRE(cfg_.sizes.size() >= 2, "MLP '%s': sizes must name an input width and at least one layer, found %zu "
                 "sizes", name, cfg_.sizes.size());
  for (size_t i = 0; i < cfg_.sizes.size(); ++i)
    SPARTA_REQUIRE(cfg_.sizes[i] >= 1, "MLP '%s': sizes[%zu] must be >= 1, found %d", name, i, cfg_.sizes[i]);
  SPARTA_REQUIRE(max_batch_ >= 1, "MLP '%s': max_batch must be >= 1, found %lld", name, (long long)max_batch_);
  SPARTA_REQUIRE(cfg_.dropout >= 0.f && cfg_.dropout < 1.f, "MLP '%s': dropout must be in [0, 1), found %g", name,
                 double(cfg_.dropout));
  const int L = layers();
  int widest = 0;
  size_t at = 0;
  for (int l = 0; l < L; ++l) {
    offsets_.push_back(at);
    at += size_t(cfg_.sizes[l]) * cfg_.sizes[l + 1] + cfg_.sizes[l + 1];
    layer_names_.push_back(cfg_.name + "." + std::to_string(l));
    widest = std::max(widest, cfg_.sizes[l + 1]);
    check_linear_dims(dims(l));  // with an empty batch until forward: the widths and max_batch
    LinearDims full = dims(l);
    full.batch = max_batch_;
    check_linear_dims(full);
    acts_.emplace_back(dev_, size_t(max_batch_) * cfg_.sizes[l + 1]);
  }
  const size_t rows = size_t(max_batch_) * widest;
  const bool half = is_half(cfg_.precision);
  for (int l = 0; l < L; ++l) {  // 16-bit: the GEMMs read dpre16_ alone
    if (half) dpre16_.emplace_back(dev_, size_t(max_batch_) * cfg_.sizes[l + 1]);
    else dpre_.emplace_back(dev_, size_t(max_batch_) * cfg_.sizes[l + 1]);
  }
  grad_ = Buffer<float>(dev_, rows);
  size_t dw_pad = 0, dx_pad = 0;
  for (int l = 0; l < L; ++l) {
    const int in = cfg_.sizes[l];
    gemm_in_.push_back(half && in % 8 != 0 && in <= INT_MAX - 7 ? (in + 7) / 8 * 8 : in);
    if (gemm_in_[l] != in) {
      LinearDims full = gemm_dims(l);
      full.batch = max_batch_;
      check_linear_dims(full);
      dw_pad = std::max(dw_pad, size_t(gemm_in_[l]) * cfg_.sizes[l + 1]);
      dx_pad = std::max(dx_pad, size_t(max_batch_) * gemm_in_[l]);
    }
  }
  if (dw_pad > 0) dw_pad_ = Buffer<float>(dev_, dw_pad);
  if (dx_pad > 0) dx_pad_ = Buffer<float>(dev_, dx_pad);
  if (half) {
    for (int l = 0; l < L; ++l) {
      acts16_.emplace_back(dev_, size_t(max_batch_) * gemm_in_[l]);
      w16_.emplace_back(dev_, size_t(gemm_in_[l]) * cfg_.sizes[l + 1]);
    }
  }
  // the fused ReLU steps: hidden layers whose output is the next GEMM's input unpadded
  fused_.assign(L, 0);
  for (int l = 0; l < L; ++l) may_fuse_.push_back(half && l + 1 < L && gemm_in_[l + 1] == cfg_.sizes[l + 1]);
}

LinearDims Mlp::dims(int l) const {
  LinearDims d;
  d.layer = layer_names_[l].c_str();
  d.batch = batch_ < 0 ? 0 : batch_;
  d.in = cfg_.sizes[l];
  d.out = cfg_.sizes[l + 1];
  return d;
}

LinearDims Mlp::gemm_dims(int l) const {
  LinearDims d = dims(l);
  d.in = gemm_in_[l];
  return d;
}

const void* Mlp::gemm_input(int l) const {
  if (is_half(cfg_.precision)) return acts16_[l].data();
  return l == 0 ? x_ : acts_[l - 1].data();
}

const void* Mlp::dpre(int l) const {
  if (is_half(cfg_.precision)) return dpre16_[l].data();
  return dpre_[l].data();
}

const void* Mlp::gemm_weight(const float* params, int l) const {
  if (is_half(cfg_.precision)) return w16_[l].data();
  return params + weight_offset(l);
}

uint16_t* Mlp::input16() {
  return is_half(cfg_.precision) && gemm_in_[0] == cfg_.sizes[0] ? acts16_[0].data() : nullptr;
}

uint16_t* Mlp::input16_padded() { return is_half(cfg_.precision) ? acts16_[0].data() : nullptr; }

const float* Mlp::forward(const float* params, const float* x, int64_t batch, Stream stream,
                          const uint64_t* dropout_key) {
  SPARTA_REQUIRE(batch >= 0 && batch <= max_batch_, "MLP '%s': batch must be in [0, %lld] (max_batch), found %lld",
                 cfg_.name.c_str(), (long long)max_batch_, (long long)batch);
  SPARTA_REQUIRE(x || batch == 0 || is_half(cfg_.precision),
                 "MLP '%s': an input in its 16-bit copy (x null) needs 16-bit precision, found %s", cfg_.name.c_str(),
                 gemm_type_name(cfg_.precision));
  batch_ = batch;
  x_ = x;
  dropped_ = dropout_key && cfg_.dropout > 0.f;
  const bool half = is_half(cfg_.precision);
  for (int l = 0; l < layers(); ++l)
    fused_[l] = may_fuse_[l] && !dropped_ &&
                relu_half_fusion_available(dev_, gemm_dims(l), gemm_dims(l + 1), cfg_.precision, stream);
  // the 16-bit copy of a rows x cols fp32 matrix with rows padded to ld
  auto convert = [&](const float* src, int64_t rows, int cols, int ld, uint16_t* dst) {
    if (ld == cols) return to_half(dev_, cfg_.precision, src, dst, size_t(rows) * cols, stream);
    to_half_padded(dev_, cfg_.precision, src, rows, cols, dst, ld, stream);
  };
  if (half) {
    for (int l = 0; l < layers(); ++l)
      convert(params + weight_offset(l), cfg_.sizes[l + 1], cfg_.sizes[l], gemm_in_[l], w16_[l].data());
    if (x) convert(x, batch, in_width(), gemm_in_[0], acts16_[0].data());
  }
  const int L = layers();
  for (int l = 0; l < L; ++l) {
    if (fused_[l]) {  // the 16-bit output (the next layer's input) alone; no fp32 activation
      linear_forward_relu_half(dev_, gemm_dims(l), cfg_.precision, gemm_input(l), gemm_weight(params, l),
                               params + bias_offset(l), acts16_[l + 1].data(), stream);
      continue;
    }
    const Activation act = l < L - 1 || cfg_.relu_last ? Activation::relu : Activation::none;
    linear_forward(dev_, gemm_dims(l), cfg_.precision, act, gemm_input(l), gemm_weight(params, l),
                   params + bias_offset(l), acts_[l].data(), stream);
    if (dropped_ && l + 1 < L)
      dropout_forward(dev_, layer_names_[l].c_str(), DropoutArgs{cfg_.dropout, dropout_key, uint64_t(l)},
                      acts_[l].data(), batch, cfg_.sizes[l + 1], stream);
    if (half && l + 1 < L) convert(acts_[l].data(), batch, cfg_.sizes[l + 1], gemm_in_[l + 1], acts16_[l + 1].data());
  }
  return acts_[L - 1].data();
}

void Mlp::backward(const float* params, const float* dy, float* grads, float* dx, Stream stream) {
  backward_data(params, dy, grads, dx, stream);
  backward_weights(grads, stream);
}

void Mlp::backward_data(const float* params, const float* dy, float* grads, float* dx, Stream stream,
                        bool dx_padded, uint16_t* dx16) {
  SPARTA_REQUIRE(batch_ >= 0, "MLP '%s': backward before any forward", cfg_.name.c_str());
  const bool half = is_half(cfg_.precision);
  SPARTA_REQUIRE(!dx16 || (half && !dx && gemm_dims(0).in == dims(0).in),
                 "MLP '%s': a 16-bit input gradient needs 16-bit precision, an unpadded input and no fp32 dx",
                 cfg_.name.c_str());
  const int L = layers();
  const float* g = dy;
  for (int l = L - 1; l >= 0; --l) {
    const LinearDims d = dims(l);
    const Activation act = l < L - 1 || cfg_.relu_last ? Activation::relu : Activation::none;
    // a dropped hidden layer: its output's gradient times 1 / (1 - p) where kept (y > 0 after the ReLU)
    const float scale = dropped_ && l + 1 < L ? dropout_scale(cfg_.dropout) : 1.f;
    if (fused_[l]) {  // layer l + 1's data gradient is in dpre16_[l] in 16 bits: masked there, in place
      relu_bias_backward_half(dev_, d, cfg_.precision, acts16_[l + 1].data(), dpre16_[l].data(), dpre16_[l].data(),
                              grads + bias_offset(l), stream);
    } else {
      activation_bias_backward(dev_, d, cfg_.precision, act, acts_[l].data(), g, half ? nullptr : dpre_[l].data(),
                               half ? dpre16_[l].data() : nullptr, grads + bias_offset(l), scale, stream);
    }
    if (l > 0 && fused_[l - 1]) {  // the data gradient in 16 bits, for the layer below's fused ReLU step
      linear_backward_data_half(dev_, gemm_dims(l), cfg_.precision, dpre(l), gemm_weight(params, l),
                                dpre16_[l - 1].data(), stream);
      continue;
    }
    if (l == 0 && dx16) {
      linear_backward_data_half(dev_, gemm_dims(0), cfg_.precision, dpre(0), gemm_weight(params, 0), dx16, stream);
      continue;
    }
    float* dx_l = l > 0 ? grad_.data() : dx;
    if (dx_l) {
      const LinearDims gd = gemm_dims(l);
      // computed padded, then copied to the logical shape unless the caller takes it padded
      const bool padded = gd.in != d.in && !(l == 0 && dx_padded);
      linear_backward_data(dev_, gd, cfg_.precision, dpre(l), gemm_weight(params, l), padded ? dx_pad_.data() : dx_l,
                           false, stream);
      if (padded) copy_unpadded(dev_, dx_pad_.data(), gd.in, dx_l, d.batch, d.in, stream);
      g = dx_l;
    }
  }
}

void Mlp::backward_weights(float* grads, Stream stream) {
  SPARTA_REQUIRE(batch_ >= 0, "MLP '%s': backward before any forward", cfg_.name.c_str());
  for (int l = layers() - 1; l >= 0; --l) {
    const LinearDims d = dims(l), gd = gemm_dims(l);
    const bool padded = gd.in != d.in;  // computed padded, then copied to the logical shape
    float* dw = grads + weight_offset(l);
    linear_backward_weight(dev_, gd, cfg_.precision, dpre(l), gemm_input(l), padded ? dw_pad_.data() : dw, stream);
    if (padded) copy_unpadded(dev_, dw_pad_.data(), gd.in, dw, d.out, d.in, stream);
  }
}

std::vector<float> Mlp::initial_params(const std::vector<int>& sizes, uint64_t seed) {
  std::vector<float> p(param_count(sizes));
  uint64_t i = 0;
  // Box-Muller on counter-based uniforms: the same parameters on every rank and machine
  auto normal = [&](double sd) {
    const double u1 = unit_double(hash_mix(seed, 2 * i)), u2 = unit_double(hash_mix(seed, 2 * i + 1));
    ++i;
    return static_cast<float>(sd * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2));
  };
  size_t at = 0;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    const int in = sizes[l], out = sizes[l + 1];
    const double w_sd = std::sqrt(2.0 / (in + out)), b_sd = std::sqrt(1.0 / out);
    for (size_t k = 0; k < size_t(in) * out; ++k) p[at++] = normal(w_sd);
    for (int k = 0; k < out; ++k) p[at++] = normal(b_sd);
  }
  return p;
}

}  // namespace sparta
