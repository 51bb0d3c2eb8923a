// model.cpp: see model.h. Only launchers of kernels/: the same code drives both backends.
#include "src/model.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "src/base/check.h"
#include "src/base/random.h"
#include "kernels/bce_loss.h"
#include "kernels/dense_dropout.h"
#include "kernels/grad_scale.h"
#include "kernels/interaction_dot.h"

namespace sparta {

const char* interaction_name(Interaction i) { return i == Interaction::dot ? "dot" : "dcnv2"; }

const char* precision_name(GemmType t) {
  return t == GemmType::bf16 ? "bf16" : t == GemmType::f16 ? "fp16" : "fp32";
}

Interaction parse_interaction(const std::string& name) {
  if (name == "dot") return Interaction::dot;
  if (name == "dcnv2") return Interaction::dcnv2;
  throw Error("model.interaction: expected dot or dcnv2, found '" + name + "'");
}

int ModelConfig::interaction_width() const {
  const int bottom_out = bottom_mlp.empty() ? num_dense : bottom_mlp.back();
  if (interaction == Interaction::dot) return int(interaction_dot_width(num_slots, embedding_dim));
  return bottom_out + embedding_width();
}

namespace {

std::string join_sizes(int first, const std::vector<int>& rest) {
  std::ostringstream s;
  s << first;
  for (int v : rest) s << "-" << v;
  return s.str();
}

std::vector<int> with_input(int in, const std::vector<int>& widths) {
  std::vector<int> sizes{in};
  sizes.insert(sizes.end(), widths.begin(), widths.end());
  return sizes;
}

MlpConfig bottom_config(const ModelConfig& c) {
  MlpConfig m;
  m.name = "bottom_mlp";
  m.sizes = with_input(c.num_dense, c.bottom_mlp);
  m.relu_last = true;
  m.precision = c.precision;
  return m;
}

MlpConfig top_config(const ModelConfig& c) {
  MlpConfig m;
  m.name = "top_mlp";
  m.sizes = with_input(c.interaction_width(), c.top_mlp);
  m.relu_last = false;
  m.precision = c.precision;
  m.dropout = c.dropout;
  return m;
}

CrossConfig cross_config(const ModelConfig& c) {
  CrossConfig x;
  x.name = "cross";
  x.dim = c.interaction_width();
  x.rank = c.cross_rank;
  x.layers = c.cross_layers;
  x.precision = c.precision;
  return x;
}

void check_widths(const char* field, const std::vector<int>& w) {
  SPARTA_REQUIRE(!w.empty(), "%s: expected at least one layer width, found none", field);
  for (size_t i = 0; i < w.size(); ++i)
    SPARTA_REQUIRE(w[i] >= 1, "%s: layer %zu's width must be >= 1, found %d", field, i, w[i]);
}

}  // namespace

std::string ModelConfig::describe() const {
  std::ostringstream s;
  s << interaction_name(interaction) << ", bottom MLP " << join_sizes(num_dense, bottom_mlp) << ", " << num_slots
    << " x " << embedding_dim << " embeddings";
  if (interaction == Interaction::dcnv2) s << ", cross network " << cross_layers << " x rank " << cross_rank;
  s << ", top MLP " << join_sizes(interaction_width(), top_mlp) << ", " << gemm_type_name(precision);
  if (dropout > 0.f) s << ", dropout " << dropout;
  return s.str();
}

void check_model_config(const ModelConfig& c) {
  SPARTA_REQUIRE(c.num_dense >= 1, "model: num_dense must be >= 1, found %d", c.num_dense);
  SPARTA_REQUIRE(c.num_slots >= 1, "model: num_slots must be >= 1, found %d", c.num_slots);
  SPARTA_REQUIRE(c.embedding_dim >= 1 && c.embedding_dim <= 256,
                 "model.embedding_dim: expected 1..256 (the widest embedding row the tables hold), found %d",
                 c.embedding_dim);
  check_widths("model.bottom_mlp", c.bottom_mlp);
  check_widths("model.top_mlp", c.top_mlp);
  SPARTA_REQUIRE(c.dropout >= 0.f && c.dropout < 1.f, "model.dropout: expected a probability in [0, 1), found %g",
                 double(c.dropout));
  SPARTA_REQUIRE(c.top_mlp.back() == 1, "model.top_mlp: the last width gives the logit and must be 1, found %d",
                 c.top_mlp.back());
  if (c.interaction == Interaction::dot)
    SPARTA_REQUIRE(c.bottom_mlp.back() == c.embedding_dim,
                   "model.bottom_mlp: the dot interaction multiplies the bottom MLP's output with every embedding, "
                   "so its last width must equal model.embedding_dim (%d), found %d",
                   c.embedding_dim, c.bottom_mlp.back());
  else
    SPARTA_REQUIRE(c.cross_layers >= 1 && c.cross_rank >= 1,
                   "model.cross_layers, model.cross_rank: expected >= 1 for dcnv2, found %d and %d", c.cross_layers,
                   c.cross_rank);
}

size_t ParamPart::count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

size_t DenseModel::param_count(const ModelConfig& c) {
  check_model_config(c);
  size_t n = Mlp::param_count(bottom_config(c).sizes) + Mlp::param_count(top_config(c).sizes);
  if (c.interaction == Interaction::dcnv2) n += CrossNet::param_count(c.interaction_width(), c.cross_rank, c.cross_layers);
  return n;
}

std::vector<ParamPart> DenseModel::parts(const ModelConfig& c) {
  check_model_config(c);
  std::vector<ParamPart> out;
  size_t at = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParamPart p{std::move(name), at, std::move(shape)};
    at += p.count();
    out.push_back(std::move(p));
  };
  auto mlp = [&](const MlpConfig& m) {
    for (size_t l = 0; l + 1 < m.sizes.size(); ++l) {
      add(m.name + "." + std::to_string(l) + ".weight", {m.sizes[l + 1], m.sizes[l]});
      add(m.name + "." + std::to_string(l) + ".bias", {m.sizes[l + 1]});
    }
  };
  mlp(bottom_config(c));
  if (c.interaction == Interaction::dcnv2) {
    const int64_t D = c.interaction_width(), r = c.cross_rank;
    for (int l = 0; l < c.cross_layers; ++l) {
      add("cross." + std::to_string(l) + ".V", {r, D});
      add("cross." + std::to_string(l) + ".U", {D, r});
      add("cross." + std::to_string(l) + ".b", {D});
    }
  }
  mlp(top_config(c));
  return out;
}

std::vector<float> DenseModel::initial_params(const ModelConfig& c, uint64_t seed) {
  check_model_config(c);
  std::vector<float> p = Mlp::initial_params(bottom_config(c).sizes, hash_mix(seed, 1));
  if (c.interaction == Interaction::dcnv2) {
    std::vector<float> x = CrossNet::initial_params(c.interaction_width(), c.cross_rank, c.cross_layers, hash_mix(seed, 2));
    p.insert(p.end(), x.begin(), x.end());
  }
  std::vector<float> t = Mlp::initial_params(top_config(c).sizes, hash_mix(seed, 3));
  p.insert(p.end(), t.begin(), t.end());
  return p;
}

namespace {
const ModelConfig& checked(const ModelConfig& c) {
  check_model_config(c);
  return c;
}
}  // namespace

DenseModel::DenseModel(const Device& dev, const ModelConfig& cfg, int64_t max_batch)
    : dev_(dev),
      cfg_(checked(cfg)),
      max_batch_(max_batch),
      bottom_(dev, bottom_config(cfg_), std::max<int64_t>(max_batch, 1)),
      top_(dev, top_config(cfg_), std::max<int64_t>(max_batch, 1)) {
  SPARTA_REQUIRE(max_batch >= 1, "model: max_batch must be >= 1, found %lld", (long long)max_batch);
  bottom_count_ = bottom_.param_count();
  top_count_ = top_.param_count();
  const size_t B = size_t(max_batch_), W = size_t(cfg_.interaction_width());
  // dot: z in fp32 only where the top MLP reads it so (16-bit: the interaction writes the GEMM's padded 16-bit
  // input), its gradient in the GEMM's padded rows as the top MLP gives it; dcnv2: the top MLP's input gradient in
  // fp32 for an fp32 cross network (a 16-bit one takes it in 16 bits)
  const bool dot = cfg_.interaction == Interaction::dot;
  if (dot && !is_half(cfg_.precision)) z_ = Buffer<float>(dev_, B * W);
  if (dot || !is_half(cfg_.precision)) dz_ = Buffer<float>(dev_, B * (dot ? size_t(top_.input_ld()) : W));
  dbottom_ = Buffer<float>(dev_, B * size_t(cfg_.bottom_mlp.back()));
  dlogits_ = Buffer<float>(dev_, B);
  loss_ = Buffer<float>(dev_, 1);
  dropout_key_ = Buffer<uint64_t>(dev_, 1);
  graphs_ = StreamGraphs(dev_, kPieces, false);
  if (cfg_.interaction == Interaction::dcnv2) {
    cross_ = std::make_unique<CrossNet>(dev_, cross_config(cfg_), max_batch_);
    cross_count_ = cross_->param_count();
  }
  // What the layers hold per sample: the MLPs' saved activations, kept pre-activation gradients and scratch,
  // the cross network's x, h, z per layer and its scratch; an estimate for the memory report, in fp32 (16-bit
  // copies add about half again).
  size_t per_sample = 4 * W + cfg_.bottom_mlp.back() + 1;
  for (int w : cfg_.bottom_mlp) per_sample += 2 * w;
  for (int w : cfg_.top_mlp) per_sample += 2 * w;
  if (cross_) per_sample += size_t(cfg_.cross_layers) * (2 * W + cfg_.cross_rank) + 2 * W + cfg_.cross_rank;
  workspace_bytes_ = per_sample * B * sizeof(float);
  if (is_half(cfg_.precision)) workspace_bytes_ += workspace_bytes_ / 2;
}

StreamGraphs::Key DenseModel::key(std::initializer_list<uint64_t> words) const {
  if (!graphs_.enabled()) return {};  // every piece runs as is
  StreamGraphs::Key k(words);
  k.push_back(key_word(batch_));
  k.push_back(scratch_epoch(dev_, dev_.stream));
  return k;
}

void DenseModel::use_graphs(bool on) { graphs_ = StreamGraphs(dev_, kPieces, on); }

uint16_t* DenseModel::x0_half() { return cross_ ? cross_->input16() : nullptr; }

const float* DenseModel::forward(const float* params, const float* dense, const float* emb, int64_t batch,
                                 int64_t train_step) {
  return forward_any(params, dense, emb, false, batch, train_step);
}

const float* DenseModel::forward_in_x0(const float* params, const float* dense, int64_t batch, int64_t train_step) {
  SPARTA_REQUIRE(x0_half(), "model: the embeddings in x0's 16-bit array need a dcnv2 model in bf16 or fp16, found "
                 "%s", cfg_.describe().c_str());
  return forward_any(params, dense, nullptr, true, batch, train_step);
}

const float* DenseModel::forward_any(const float* params, const float* dense, const float* emb, bool in_x0,
                                     int64_t batch, int64_t train_step) {
  SPARTA_REQUIRE(batch >= 0 && batch <= max_batch_, "model: batch must be in [0, %lld], found %lld",
                 (long long)max_batch_, (long long)batch);
  SPARTA_REQUIRE(train_step >= 0, "model: train_step must be >= 0, found %lld", (long long)train_step);
  batch_ = batch;
  emb_ = emb;
  in_x0_ = in_x0;
  const bool drop = train_step > 0 && cfg_.dropout > 0.f;
  if (drop) {  // the key in memory, ahead of the (maybe replayed) forward on the same stream
    dropout_key_host_ = dropout_step_key(cfg_.dropout_seed, train_step);
    dropout_key_.upload(&dropout_key_host_, 1);
  }
  const uint64_t* key_ptr = drop ? dropout_key_.data() : nullptr;
  graphs_.run(kForward, key({key_word(params), key_word(dense), key_word(emb), key_word(int64_t(drop)),
                             key_word(int64_t(in_x0))}),
              dev_.stream, [&] {
    const float* b = bottom_out_ = bottom_.forward(params + bottom_offset(), dense, batch, dev_.stream);
    const float* top_in = nullptr;
    if (cfg_.interaction == Interaction::dot) {
      InteractionDims d{"interaction", batch, cfg_.num_slots, cfg_.embedding_dim, top_.input_ld()};
      if (is_half(cfg_.precision)) {
        interaction_dot_forward_half(dev_, d, cfg_.precision, b, emb, top_.input16_padded(), dev_.stream);
      } else {
        interaction_dot_forward(dev_, d, b, emb, z_.data(), dev_.stream);
        top_in = z_.data();
      }
    } else if (in_x0) {
      // the embeddings in x0's 16-bit array already: the bottom MLP's output rounded into its first columns
      top_in = cross_->forward_from_input16(params + cross_offset(), b, cfg_.bottom_mlp.back(), batch, dev_.stream,
                                            top_.input16());
    } else {
      // x0 = [b, emb] read where the bottom MLP and the embeddings wrote them; 16-bit: x_L straight into the top
      // MLP's 16-bit input (top_in nullptr), no fp32 copy to convert
      top_in = cross_->forward(params + cross_offset(), CrossInput(b, emb, cfg_.bottom_mlp.back()), batch,
                               dev_.stream, top_.input16());
    }
    logits_ = top_.forward(params + top_offset(), top_in, batch, dev_.stream, key_ptr);
  });
  return logits_;
}

void DenseModel::loss(const float* labels, int64_t mean_over, float* loss, float grad_scale) {
  SPARTA_ASSERT(batch_ >= 0, "model: loss before forward");
  // with graphs, into the model's own slot, then copied: a graph of the loss is the same whatever slot the
  // caller gives
  float* sum = graphs_.enabled() ? loss_.data() : loss;
  graphs_.run(kLoss, key({key_word(labels), key_word(mean_over), key_word(grad_scale)}), dev_.stream, [&] {
    bce_with_logits(dev_, logits_, labels, sum, dlogits_.data(), batch_, mean_over, dev_.stream);
    if (grad_scale != 1.f) scale_values(dev_, dlogits_.data(), size_t(batch_), grad_scale, dev_.stream);
  });
  if (sum != loss) copy_on_device(dev_, loss, sum, sizeof(float), dev_.stream);
}

void DenseModel::backward(const float* params, float* grads, float* demb, const GradsReady& ready,
                          const std::function<void()>& demb_ready, const std::function<void()>& inputs_read) {
  SPARTA_ASSERT(batch_ >= 0, "model: backward before forward");
  const StreamGraphs::Key k = key({key_word(params), key_word(grads), key_word(demb), key_word(int64_t(in_x0_))});
  const int bottom_width = cfg_.bottom_mlp.back();
  // the data gradients down to the embeddings first; the weight gradients' GEMMs after demb_ready, beside the
  // embeddings' update
  graphs_.run(kBackwardTop, k, dev_.stream, [&] {
    if (cfg_.interaction == Interaction::dot) {
      top_.backward_data(params + top_offset(), dlogits_.data(), grads + top_offset(), dz_.data(), dev_.stream, true);
      InteractionDims d{"interaction", batch_, cfg_.num_slots, cfg_.embedding_dim, top_.input_ld()};
      interaction_dot_backward(dev_, d, dz_.data(), bottom_out_, emb_, dbottom_.data(), demb, dev_.stream);
    } else {
      // 16-bit: the top MLP writes x_L's gradient where the cross network reads it, in 16 bits; dx0 written as its
      // two blocks: the bottom MLP's output gradient and demb
      uint16_t* g16 = cross_->output_grad16();
      float* g = g16 ? nullptr : dz_.data();
      top_.backward_data(params + top_offset(), dlogits_.data(), grads + top_offset(), g, dev_.stream, false, g16);
      cross_->backward_data(params + cross_offset(), g, grads + cross_offset(),
                            CrossInputGrad(dbottom_.data(), demb, bottom_width), dev_.stream);
    }
  });
  if (demb_ready) demb_ready();
  if (!in_x0_ && inputs_read) inputs_read();
  if (cross_)
    graphs_.run(kBackwardCrossWeights, k, dev_.stream,
                [&] { cross_->backward_weights(grads + cross_offset(), dev_.stream); });
  if (in_x0_ && inputs_read) inputs_read();  // the V_0 gradient GEMM was x0_half()'s last reader
  graphs_.run(kBackwardTopWeights, k, dev_.stream, [&] { top_.backward_weights(grads + top_offset(), dev_.stream); });
  if (cfg_.interaction == Interaction::dcnv2 && ready) ready(cross_offset(), cross_count_);
  if (ready) ready(top_offset(), top_count_);
  graphs_.run(kBackwardBottom, k, dev_.stream, [&] {
    bottom_.backward(params + bottom_offset(), dbottom_.data(), grads + bottom_offset(), nullptr, dev_.stream);
  });
  if (ready) ready(bottom_offset(), bottom_count_);
}

}  // namespace sparta
