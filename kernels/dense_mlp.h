// dense_mlp.h: a multilayer perceptron of dense_linear.h layers (DLRM's bottom and top MLPs), with the
// activations it saves for its backward pass.
//
// sizes {13, 512, 256, 128} are three layers 13→512→256→128; every layer but the last applies ReLU, the last
// one too when relu_last (DLRM's bottom MLP: yes; the top MLP, whose last layer gives the logit: no).
//
// Parameters are not owned: the caller keeps every dense parameter of the model in one flat fp32 array (what
// the optimizer steps and the data-parallel all-reduce moves), and passes this MLP's part of it, laid out
// layer after layer as weight [out, in] then bias [out]; gradients have the same layout. In 16-bit precision
// (bf16 or fp16) the GEMMs read 16-bit copies of the weights (made at every forward from the fp32 masters), of
// the input and of the saved activations, and of the backward's intermediate gradients; everything else stays
// fp32. The 16-bit copies of a layer's input and weight have rows padded with zeros to a multiple of 8 elements (DLRM's top MLP
// reads 479 = 128 + 351 interaction features, its bottom MLP 13 dense features) so that cuBLASLt can use its
// 16-byte-aligned kernels; the GEMMs then run over the padded width, whose zero columns add exactly nothing,
// and the weight and input gradients of a padded layer are computed padded and copied to their logical shape.
// The parameters, gradients and dx keep the logical shapes.
//
// In 16-bit precision a hidden layer whose output the next layer reads unpadded takes dense_linear.h's fused ReLU
// steps where the backend has them (relu_half_fusion_available), without dropout: its forward writes the 16-bit
// output alone (bias and ReLU in the GEMM's epilogue; no fp32 activation, no conversion), the next layer's data
// gradient GEMM writes the layer's output gradient in 16 bits, and one pass over the two 16-bit arrays makes the
// pre-activation gradient (in place) and the bias gradient. The forward's numbers are the separate steps' (one
// rounding of the same sum); the backward rounds the output gradient to 16 bits before the ReLU mask (which the
// separate steps do after it: the same 16-bit gradient) and sums the bias gradient from those 16-bit values.
//
// Dropout (MlpConfig::dropout > 0, kernels/dense_dropout.h): a forward given a step's key drops elements of every
// hidden layer's output (all but the last layer's; layer l's mask is layer l's), scaling the rest by 1 / (1 - p),
// and its backward scales their gradients alike; a forward without a key (evaluation) drops nothing.
//
// Every launcher takes the stream it runs on last (cuda: asynchronous on it; cpu: runs on the calling thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "kernels/dense_linear.h"

namespace sparta {

struct MlpConfig {
  std::string name = "mlp";  // errors name it: "bottom_mlp.1" is bottom_mlp's layer 1
  std::vector<int> sizes;    // input width, then each layer's output width
  bool relu_last = false;
  GemmType precision = GemmType::f32;
  float dropout = 0.f;       // on the hidden layers' outputs in training, in [0, 1)
};

class Mlp {
 public:
  // Buffers for batches of up to max_batch rows. Throws sparta::Error naming the MLP for fewer than two sizes,
  // a size < 1, max_batch < 1 or dropout outside [0, 1).
  Mlp(const Device& dev, MlpConfig cfg, int64_t max_batch);

  // Floats of the parameters (and of the gradients) of an MLP of these sizes.
  static size_t param_count(const std::vector<int>& sizes);
  size_t param_count() const { return param_count(cfg_.sizes); }
  // Where layer l's weight [out, in] and bias [out] start in the MLP's parameters.
  size_t weight_offset(int l) const { return offsets_[l]; }
  size_t bias_offset(int l) const { return offsets_[l] + size_t(cfg_.sizes[l]) * cfg_.sizes[l + 1]; }
  int layers() const { return int(cfg_.sizes.size()) - 1; }
  int in_width() const { return cfg_.sizes.front(); }
  int out_width() const { return cfg_.sizes.back(); }
  const MlpConfig& config() const { return cfg_; }

  // x [batch, in_width] → the output [batch, out_width], held by the MLP until the next forward. x must stay
  // unchanged until backward. Throws sparta::Error naming the MLP when batch is not in [0, max_batch].
  // dropout_key: the training step's key (dense_dropout.h: device memory for cuda, read when the pass runs), or
  // nullptr: no dropout (evaluation, or dropout 0).
  // x == nullptr (16-bit precision): the input is already in input16() / input16_padded(), written there by its
  // producer.
  const float* forward(const float* params, const float* x, int64_t batch, Stream stream,
                       const uint64_t* dropout_key = nullptr);
  // 16-bit precision with an unpadded input: where the first GEMM reads the input, [max_batch, in_width] in the
  // precision's 16-bit type, for a producer to write it there before forward(params, nullptr, ...); otherwise
  // nullptr.
  uint16_t* input16();
  // 16-bit precision, any input width: where the first GEMM reads the input, [max_batch, input_ld()] in the
  // precision's 16-bit type, for a producer to write it there with zeros in columns in_width .. input_ld() - 1
  // before forward(params, nullptr, ...); fp32: nullptr.
  uint16_t* input16_padded();
  // The row pitch of input16_padded() and of a padded dx (backward_data): in_width, in 16-bit precision rounded up
  // to a multiple of 8.
  int input_ld() const { return gemm_in_[0]; }

  // From dy [batch, out_width] (the batch of the last forward): grads [param_count] are overwritten, and
  // dx [batch, in_width] too when dx != nullptr. params must be those of the forward.
  void backward(const float* params, const float* dy, float* grads, float* dx, Stream stream);
  // The same in two parts, so that work can be queued between dx and the weight gradients: backward_data writes
  // the bias gradients and dx, and keeps every layer's pre-activation gradient; backward_weights then writes the
  // weight gradients from them (the same values as backward). dx_padded: dx has rows of input_ld() floats, the
  // first GEMM's output as it comes (no copy to the logical shape; columns past in_width are not gradients).
  // dx16 (16-bit precision, an unpadded input, instead of dx): the input's gradient in the precision's 16-bit
  // type, rounded once from the GEMM's fp32 sum (what a 16-bit producer's backward reads: cross_layer.h's
  // output_grad16).
  void backward_data(const float* params, const float* dy, float* grads, float* dx, Stream stream,
                     bool dx_padded = false, uint16_t* dx16 = nullptr);
  void backward_weights(float* grads, Stream stream);

  // DLRM's initialization on the host, deterministic by seed: weights N(0, sqrt(2 / (in + out))), biases
  // N(0, sqrt(1 / out)).
  static std::vector<float> initial_params(const std::vector<int>& sizes, uint64_t seed);

 private:
  LinearDims dims(int l) const;       // the logical shape of layer l
  LinearDims gemm_dims(int l) const;  // what its GEMMs run over: in = the padded width of its 16-bit copies
  const void* gemm_input(int l) const;  // what layer l's GEMMs read as x: fp32 or its 16-bit copy
  const void* gemm_weight(const float* params, int l) const;  // and as w

  Device dev_;
  MlpConfig cfg_;
  int64_t max_batch_ = 0;
  int64_t batch_ = -1;  // of the last forward; -1 before the first
  bool dropped_ = false;  // the last forward applied dropout
  std::vector<char> fused_;     // per layer: the last forward took the fused ReLU steps (hidden layers only)
  std::vector<char> may_fuse_;  // per layer: a 16-bit hidden layer whose output the next layer reads unpadded
  std::vector<size_t> offsets_;
  std::vector<std::string> layer_names_;
  const float* x_ = nullptr;             // the last forward's input
  std::vector<Buffer<float>> acts_;      // acts_[l]: layer l's output [max_batch, sizes[l+1]]
  std::vector<int> gemm_in_;             // per layer: sizes[l], rounded up to a multiple of 8 for 16-bit
  std::vector<Buffer<uint16_t>> acts16_; // 16-bit: acts16_[0] the input, acts16_[l+1] layer l's output (not the last),
                                         // [max_batch, gemm_in_[l]] with zeros in the padding
  std::vector<Buffer<uint16_t>> w16_;   // 16-bit: layer l's weights [out, gemm_in_[l]], each its own (256-byte aligned)
                                         // buffer, zeros in the padding
  Buffer<float> dw_pad_, dx_pad_;        // a padded layer's weight and input gradients, before their copy
  std::vector<Buffer<float>> dpre_;      // per layer [max_batch, sizes[l+1]]: its pre-activation gradient (fp32
                                         // only: 16-bit GEMMs read dpre16_), kept for backward_weights
  std::vector<Buffer<uint16_t>> dpre16_;
  Buffer<float> grad_;                   // [max_batch, widest]: the next layer's dy
  const void* dpre(int l) const;         // what layer l's backward GEMMs read: dpre_[l] or dpre16_[l]
};

}  // namespace sparta
