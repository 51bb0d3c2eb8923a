// model.h: the dense, data-parallel part of DLRM and DCNv2 on top of the kernels/ layers: the bottom MLP on the
// dense features, the interaction with the pooled embeddings, the top MLP to one logit, and the binary
// cross-entropy.
//
//   dot     (DLRM, MLPerf v1)  z = [b, the strictly lower triangle of T T^T], T = [b, e_0 .. e_{S-1}]
//                              (kernels/interaction_dot.h); every slot has the bottom MLP's output width
//   dcnv2   (MLPerf DCNv2)     x0 = [b, e_0 .. e_{S-1}], z = the low-rank cross network of x0 (kernels/cross_layer.h)
//   logit = top_mlp(z)   (its last width is 1, no ReLU after it);   loss = mean BCE(logit, label)
// with b = bottom_mlp(dense) (ReLU after every layer) and e_s the pooled embedding of slot s.
//
// Parameters: one flat fp32 array [bottom MLP | cross network (dcnv2) | top MLP], each part laid out as its
// layer class says (weights [out, in] then bias [out] per MLP layer; V, U, b per cross layer); gradients alike.
// That array is what the dense optimizer steps and the data-parallel all-reduce moves, and in bf16 or fp16
// precision it holds the fp32 masters: the layers make the 16-bit copies their GEMMs read at every forward
// (fp16 training scales the loss gradient, loss()'s grad_scale, so that small gradients survive fp16's range).
//
// Every launch is asynchronous on the device's stream (Device::stream); nothing here synchronizes the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "src/base/graph.h"
#include "kernels/cross_layer.h"
#include "kernels/dense_linear.h"
#include "kernels/dense_mlp.h"

namespace sparta {

enum class Interaction { dot, dcnv2 };
// "dot" | "dcnv2"; parse throws sparta::Error naming the value otherwise.
const char* interaction_name(Interaction i);
Interaction parse_interaction(const std::string& name);
// model.precision's name of a GEMM type: "fp32" | "bf16" | "fp16".
const char* precision_name(GemmType t);

struct ModelConfig {
  int num_dense = 13;                // dense features per sample
  int num_slots = 26;                // pooled embeddings per sample
  int embedding_dim = 128;           // width of every pooled embedding
  std::vector<int> bottom_mlp = {512, 256, 128};          // widths after num_dense
  std::vector<int> top_mlp = {1024, 1024, 512, 256, 1};  // widths after the interaction; the last is 1
  Interaction interaction = Interaction::dot;
  int cross_layers = 3;              // dcnv2
  int cross_rank = 512;              // dcnv2
  GemmType precision = GemmType::f32;
  // Training only: dropout with probability `dropout` on the top MLP's hidden outputs (kernels/dense_dropout.h),
  // masks drawn from (dropout_seed, step, layer, element); the trainer makes dropout_seed from model.seed and
  // its rank, so each rank's slice has masks of its own.
  float dropout = 0.f;
  uint64_t dropout_seed = 1;

  int embedding_width() const { return num_slots * embedding_dim; }  // floats of a sample's pooled embeddings
  // Width of the interaction's output, the top MLP's input.
  int interaction_width() const;
  // One line: "dot, 13-512-256-128 bottom, 26 x 128 embeddings, 479-1024-...-1 top, fp32".
  std::string describe() const;
};

// Throws sparta::Error naming the field (model.bottom_mlp, model.top_mlp, ...), what was expected and what was
// found: widths < 1, a top MLP not ending in 1, a dot interaction whose bottom output differs from
// embedding_dim, cross sizes < 1 for dcnv2, dropout outside [0, 1).
void check_model_config(const ModelConfig& cfg);

// One named part of the flat parameters (a checkpoint's dense tensor): name, offset, shape.
struct ParamPart {
  std::string name;  // "bottom_mlp.0.weight", "bottom_mlp.0.bias", "cross.1.V", "top_mlp.2.bias", ...
  size_t offset = 0;
  std::vector<int64_t> shape;
  size_t count() const;
};

class DenseModel {
 public:
  // Buffers for batches of up to max_batch samples. Throws sparta::Error (check_model_config, max_batch < 1).
  DenseModel(const Device& dev, const ModelConfig& cfg, int64_t max_batch);

  const ModelConfig& config() const { return cfg_; }
  static size_t param_count(const ModelConfig& cfg);
  size_t param_count() const { return param_count(cfg_); }
  // Where the parts start in the flat parameters.
  size_t bottom_offset() const { return 0; }
  size_t cross_offset() const { return bottom_count_; }
  size_t top_offset() const { return bottom_count_ + cross_count_; }
  // Every layer's tensors in parameter order; they tile [0, param_count()).
  static std::vector<ParamPart> parts(const ModelConfig& cfg);

  // The initial parameters on the host, deterministic by seed (each part's own initialization: dense_mlp.h,
  // cross_layer.h, with seeds derived from seed).
  static std::vector<float> initial_params(const ModelConfig& cfg, uint64_t seed);

  // dense [batch, num_dense], emb [batch, embedding_width] (device) → the logits [batch], held by the model
  // until the next forward. dense and emb must stay unchanged until backward. train_step >= 1: a training
  // step's forward (dropout, when configured, with that step's masks); 0: evaluation (no dropout).
  // Throws sparta::Error when batch is not in [0, max_batch].
  const float* forward(const float* params, const float* dense, const float* emb, int64_t batch,
                       int64_t train_step = 0);
  // dcnv2 in bf16 or fp16: x0's 16-bit array [max_batch, D] (D = the bottom MLP's width + embedding_width(), rows
  // of D values), into which the embeddings' producer writes them (columns from the bottom MLP's width on, each
  // value rounded once from its float: EmbeddingCollection with CollectionConfig::output_row D and output_col the
  // bottom width) before forward_in_x0; nullptr for other models and precisions. The model reads it until the
  // backward's inputs_read.
  uint16_t* x0_half();
  // forward with the embeddings in x0_half(): no fp32 copy of them and no pass converting them, the same logits
  // (and backward the same gradients) as forward with emb their fp32 values. Throws sparta::Error when x0_half()
  // is nullptr.
  const float* forward_in_x0(const float* params, const float* dense, int64_t batch, int64_t train_step = 0);
  const float* logits() const { return logits_; }

  // After forward: loss[0] (device) = Σ_i BCE(logit_i, labels[i]) / mean_over (the global batch in data-parallel
  // training: the all-reduced sum of the ranks' losses is then the mean), and the logits' gradient, kept for
  // backward, multiplied by grad_scale (fp16 loss scaling, src/loss_scale.h; 1: as is). mean_over >= batch.
  void loss(const float* labels, int64_t mean_over, float* loss, float grad_scale = 1.f);

  // After loss: grads [param_count] (device) and demb [batch, embedding_width] (device) are overwritten.
  // demb comes first: the top MLP's input gradients, the interaction's (or the cross network's data) backward,
  // then demb_ready() is called on the host as soon as the launches that finish demb are queued, so the caller can
  // start the embeddings' backward on another stream while the rest runs: the cross network's and the top MLP's
  // weight gradients and the bottom MLP. ready(offset, count) is called likewise once the launches that finish grads[offset,
  // offset + count) are queued (dcnv2: the cross network's; then the top MLP's, then the bottom MLP's), so the
  // caller can start reducing that bucket.
  // inputs_read() is called once the launches that read the forward's embeddings for the last time are queued
  // (so that the caller may write the next batch's there): with demb_ready for forward's emb, after the cross
  // network's weight gradients for x0_half().
  using GradsReady = std::function<void(size_t offset, size_t count)>;
  void backward(const float* params, float* grads, float* demb, const GradsReady& ready = GradsReady(),
                const std::function<void()>& demb_ready = std::function<void()>(),
                const std::function<void()>& inputs_read = std::function<void()>());

  // CUDA graphs (src/base/graph.h) for the forward, the loss and the backward's pieces between its callbacks:
  // each piece is recorded the second time it runs with the same pointers, batch, mean_over and grad_scale,
  // and replayed from the third on. Off by default; the cpu backend ignores it. Resets the graphs held.
  void use_graphs(bool on);
  const StreamGraphs& graphs() const { return graphs_; }

  // Device bytes of the activations and scratch this model holds (not the parameters).
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  Device dev_;
  ModelConfig cfg_;
  int64_t max_batch_ = 0;
  int64_t batch_ = -1;
  size_t bottom_count_ = 0, cross_count_ = 0, top_count_ = 0;
  size_t workspace_bytes_ = 0;
  Mlp bottom_, top_;
  std::unique_ptr<CrossNet> cross_;  // dcnv2
  const float* emb_ = nullptr;       // the last forward's embeddings
  bool in_x0_ = false;               // the last forward read them in x0_half() (forward_in_x0)
  const float* bottom_out_ = nullptr;  // and bottom MLP output (held by bottom_)
  const float* logits_ = nullptr;
  Buffer<float> z_;        // dot, fp32: the interaction [max_batch, interaction_width] (16-bit: the top MLP's
                           // input16_padded() alone; dcnv2 reads x0 in its blocks)
  Buffer<float> dz_;       // the top MLP's input gradient [max_batch, interaction_width] (dot: rows of the
                           // top MLP's input_ld())
  Buffer<float> dbottom_;  // [max_batch, bottom output]
  Buffer<float> dlogits_;  // [max_batch]
  Buffer<float> loss_;     // [1]: with graphs, loss()'s sum, copied to the caller's slot
  Buffer<uint64_t> dropout_key_;  // [1]: the step's dropout key, written before each training forward (so a
  uint64_t dropout_key_host_ = 0; // recorded forward reads each step's); the host copy the upload reads from

  enum Piece { kForward, kLoss, kBackwardTop, kBackwardCrossWeights, kBackwardTopWeights, kBackwardBottom, kPieces };
  const float* forward_any(const float* params, const float* dense, const float* emb, bool in_x0, int64_t batch,
                           int64_t train_step);
  StreamGraphs graphs_;
  // A piece's key: the given words, the batch and the epoch of the layers' shared scratch.
  StreamGraphs::Key key(std::initializer_list<uint64_t> words) const;
};

}  // namespace sparta
