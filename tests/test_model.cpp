// src/model: the whole dense model (bottom MLP, dot or DCNv2 interaction, top MLP, BCE) against a plain
// double-precision DLRM written here from the formulas, for the loss, the logits and every gradient (the
// expected gradients are central differences of that reference); a finite-difference check of the model's own
// backward; the cuda backend against the cpu one; the parameter layout; errors naming the field.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/model.h"
#include "tests/test_dense_util.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// ---- the reference: a tiny DLRM / DCNv2 in double, the parameter layout of model.h written out again

struct RefModel {
  explicit RefModel(const ModelConfig& config) : c(config) {}
  ModelConfig c;
  // Of the last loss() call: the smallest |pre-activation| of any ReLU (how far the inputs are from a kink), and
  // the fewest ReLUs open in one layer of one sample (0: some sample's gradient stops there).
  mutable double relu_margin = 0;
  mutable int fewest_open = 0;
  mutable std::vector<bool> open_relus;  // every ReLU's side, in evaluation order
  // dense [B, num_dense], emb [B, S*dim], labels [B] → mean BCE over mean_over; logits out.
  double loss(const std::vector<double>& p, const std::vector<double>& dense, const std::vector<double>& emb,
              const std::vector<float>& labels, int64_t B, int64_t mean_over, std::vector<double>* logits) const {
    size_t at = 0;
    relu_margin = INFINITY;
    fewest_open = INT32_MAX;
    open_relus.clear();
    auto mlp = [&](std::vector<double> x, int in, const std::vector<int>& widths, bool relu_last) {
      for (size_t l = 0; l < widths.size(); ++l) {
        const int out = widths[l];
        const size_t w = at, b = at + size_t(out) * in;
        at = b + out;
        std::vector<double> y(size_t(B) * out);
        const bool relu = l + 1 < widths.size() || relu_last;
        for (int64_t r = 0; r < B; ++r) {
          int open = 0;
          for (int o = 0; o < out; ++o) {
            double s = p[b + o];
            for (int i = 0; i < in; ++i) s += x[r * in + i] * p[w + size_t(o) * in + i];
            if (relu) {
              relu_margin = std::min(relu_margin, std::fabs(s));
              open += s > 0;
              open_relus.push_back(s > 0);
              if (s < 0) s = 0;
            }
            y[r * out + o] = s;
          }
          if (relu) fewest_open = std::min(fewest_open, open);
        }
        x = std::move(y);
        in = out;
      }
      return x;
    };
    const int S = c.num_slots, d = c.embedding_dim, bo = c.bottom_mlp.back();
    std::vector<double> bottom = mlp(dense, c.num_dense, c.bottom_mlp, true);
    std::vector<double> z;
    int W = 0;
    if (c.interaction == Interaction::dot) {
      W = d + S * (S + 1) / 2;
      z.assign(size_t(B) * W, 0);
      for (int64_t r = 0; r < B; ++r) {
        auto T = [&](int i, int k) { return i == 0 ? bottom[r * d + k] : emb[(r * S + i - 1) * d + k]; };
        for (int k = 0; k < d; ++k) z[r * W + k] = T(0, k);
        int col = d;
        for (int i = 1; i <= S; ++i)
          for (int j = 0; j < i; ++j) {
            double s = 0;
            for (int k = 0; k < d; ++k) s += T(i, k) * T(j, k);
            z[r * W + col++] = s;
          }
      }
    } else {
      W = bo + S * d;
      std::vector<double> x0(size_t(B) * W);
      for (int64_t r = 0; r < B; ++r)
        for (int k = 0; k < W; ++k) x0[r * W + k] = k < bo ? bottom[r * bo + k] : emb[r * S * d + k - bo];
      std::vector<double> x = x0;
      const int R = c.cross_rank;
      for (int l = 0; l < c.cross_layers; ++l) {
        const size_t V = at, U = V + size_t(R) * W, b = U + size_t(W) * R;
        at = b + W;
        std::vector<double> nx(x.size());
        for (int64_t r = 0; r < B; ++r) {
          std::vector<double> h(R, 0.0);
          for (int q = 0; q < R; ++q)
            for (int k = 0; k < W; ++k) h[q] += p[V + size_t(q) * W + k] * x[r * W + k];
          for (int k = 0; k < W; ++k) {
            double zz = p[b + k];
            for (int q = 0; q < R; ++q) zz += p[U + size_t(k) * R + q] * h[q];
            nx[r * W + k] = x0[r * W + k] * zz + x[r * W + k];
          }
        }
        x = std::move(nx);
      }
      z = std::move(x);
    }
    std::vector<double> lg = mlp(z, W, c.top_mlp, false);
    double sum = 0;
    for (int64_t r = 0; r < B; ++r) {
      const double t = lg[r], y = labels[r];
      sum += std::max(t, 0.0) - t * y + std::log1p(std::exp(-std::fabs(t)));
    }
    if (logits) *logits = lg;
    return sum / double(mean_over);
  }
};

std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// d loss / d v[i] of the reference by central differences in double (h small: the reference is smooth except
// at ReLU kinks, which random inputs do not hit within h).
template <class F>
std::vector<double> ref_grad(std::vector<double>& v, F f) {
  std::vector<double> g(v.size());
  const double h = 1e-6;
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = f();
    v[i] = keep - h;
    const double down = f();
    v[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

ModelConfig tiny(Interaction it) {
  ModelConfig c;
  c.num_dense = 5;
  c.num_slots = 3;
  c.embedding_dim = 4;
  c.bottom_mlp = {8, 4};
  c.top_mlp = {6, 1};
  c.interaction = it;
  c.cross_layers = 2;
  c.cross_rank = 3;
  return c;
}

struct Inputs {
  int64_t B, mean_over;
  std::vector<float> params, dense, emb, labels;
};

Inputs random_inputs(const ModelConfig& c, int64_t B, int64_t mean_over) {
  Inputs in{B, mean_over, {}, {}, {}, {}};
  in.params = DenseModel::initial_params(c, testing::rng()());
  // Biases of the initialization are small: perturb every parameter so a wrong layout or a skipped term shows.
  std::vector<float> noise = testing::random_floats(in.params.size(), -0.3f, 0.3f);
  for (size_t i = 0; i < in.params.size(); ++i) in.params[i] += noise[i];
  in.dense = testing::random_floats(size_t(B) * c.num_dense, 0.f, 2.f);
  in.emb = testing::random_floats(size_t(B) * c.embedding_width(), -0.5f, 0.5f);
  for (int64_t r = 0; r < B; ++r) in.labels.push_back(float(testing::random_ints(1, 0, 1)[0]));
  return in;
}

// Random inputs drawn again until every ReLU input of the double reference is at least `margin` from zero: a
// finite difference or a 16-bit rounding then moves no sample across a kink (which changes a gradient by far more
// than either). And every layer of every sample keeps a ReLU open, so no sample's gradient is zero (a margin
// alone favours closed layers). With 4 samples about 1 draw in 10 to 100 qualifies at margins of 0.02 to 0.05.
Inputs inputs_clear_of_kinks(const ModelConfig& c, int64_t B, double margin, int64_t mean_over = 0) {
  const RefModel ref{c};
  Inputs in;
  int draws = 0;
  do {
    in = random_inputs(c, B, mean_over ? mean_over : B);
    ++draws;
    ref.loss(as_double(in.params), as_double(in.dense), as_double(in.emb), in.labels, in.B, in.mean_over, nullptr);
  } while ((ref.relu_margin < margin || ref.fewest_open == 0) && draws < 10000);
  BOOST_TEST_MESSAGE(interaction_name(c.interaction) << ": " << draws << " draws for a ReLU margin of "
                                                     << ref.relu_margin << ", " << ref.fewest_open << "+ open per layer");
  BOOST_REQUIRE(ref.relu_margin >= margin);
  BOOST_REQUIRE(ref.fewest_open > 0);
  return in;
}

struct Outputs {
  float loss;
  std::vector<float> logits, grads, demb;
};

Outputs run_model(const Device& dev, const ModelConfig& c, const Inputs& in, int64_t max_batch,
                  float grad_scale = 1.f, int64_t train_step = 0) {
  DenseModel m(dev, c, max_batch);
  Buffer<float> p(dev, in.params), dense(dev, in.dense), emb(dev, in.emb), labels(dev, in.labels);
  Buffer<float> loss = dense_test::poisoned(dev, 1);
  Buffer<float> grads = dense_test::poisoned(dev, m.param_count());
  Buffer<float> demb = dense_test::poisoned(dev, size_t(in.B) * c.embedding_width());
  const float* lg = m.forward(p.data(), dense.data(), emb.data(), in.B, train_step);
  m.loss(labels.data(), in.mean_over, loss.data(), grad_scale);
  std::vector<std::pair<size_t, size_t>> ready;
  int demb_calls = 0;
  size_t buckets_before_demb = 0;
  m.backward(
      p.data(), grads.data(), demb.data(), [&](size_t o, size_t n) { ready.push_back({o, n}); },
      [&] {
        ++demb_calls;
        buckets_before_demb = ready.size();
      });
  // demb is announced once, before every bucket (dcnv2: the cross network's weight gradients come after it, then
  // the top MLP's); the buckets tile the parameters, the bottom MLP's last.
  const bool dot = c.interaction == Interaction::dot;
  BOOST_TEST(demb_calls == 1);
  BOOST_TEST(buckets_before_demb == 0u);
  BOOST_TEST(ready.size() == (dot ? 2u : 3u));
  BOOST_TEST(ready.front().first == (dot ? m.top_offset() : m.cross_offset()));
  BOOST_TEST(ready[dot ? 0 : 1].first == m.top_offset());
  BOOST_TEST(ready.back().first == 0u);
  size_t covered = 0;
  for (auto& r : ready) covered += r.second;
  BOOST_TEST(covered == m.param_count());
  Outputs o;
  o.logits.resize(in.B);
  copy_to_host(dev, o.logits.data(), lg, in.B * sizeof(float));
  o.loss = loss.download()[0];
  o.grads = grads.download();
  o.demb = demb.download();
  return o;
}

void check_against_reference(Backend backend, Interaction it) {
  const Device dev = dense_test::device_for(backend);
  const ModelConfig c = tiny(it);
  const int64_t B = 7;
  // a global batch of 11, of which this rank has 7; no ReLU input within 1e-4 of zero, where the float model
  // and the double reference may take different sides
  Inputs in = inputs_clear_of_kinks(c, B, 1e-4, 11);
  Outputs got = run_model(dev, c, in, 9);

  RefModel ref{c};
  std::vector<double> p = as_double(in.params), dense = as_double(in.dense), emb = as_double(in.emb);
  std::vector<double> logits;
  const double loss = ref.loss(p, dense, emb, in.labels, B, in.mean_over, &logits);
  auto f = [&] { return ref.loss(p, dense, emb, in.labels, B, in.mean_over, nullptr); };
  const std::vector<double> dp = ref_grad(p, f), de = ref_grad(emb, f);

  BOOST_TEST(std::fabs(got.loss - loss) <= 1e-5 + 1e-5 * std::fabs(loss), "loss " << got.loss << " vs " << loss);
  BOOST_TEST(dense_test::mismatches(got.logits, logits, 1e-5, 1e-4, "logits") == 0u);
  BOOST_TEST(dense_test::mismatches(got.grads, dp, 2e-6, 1e-3, "parameter gradients") == 0u);
  BOOST_TEST(dense_test::mismatches(got.demb, de, 2e-6, 1e-3, "embedding gradients") == 0u);
  close_device(const_cast<Device&>(dev));
}

void dot_against_reference(Backend b) { check_against_reference(b, Interaction::dot); }
void dcnv2_against_reference(Backend b) { check_against_reference(b, Interaction::dcnv2); }

// A model a little larger than tiny(): wider layers, 5 slots of 16, a cross rank of 24.
ModelConfig small(Interaction it, GemmType precision) {
  ModelConfig c = tiny(it);
  c.precision = precision;
  c.bottom_mlp = {32, 16};
  c.embedding_dim = 16;
  c.num_slots = 5;
  c.top_mlp = {64, 32, 1};
  c.cross_rank = 24;
  return c;
}

// The cuda backend gives what the cpu backend gives, in fp32, bf16 and fp16 (both multiply the same rounded numbers).
void cuda_matches_cpu(Interaction it, GemmType precision) {
  const ModelConfig c = small(it, precision);
  Inputs in = random_inputs(c, 300, 300);
  Device cpu = dense_test::device_for(Backend::cpu), gpu = dense_test::device_for(Backend::cuda);
  Outputs a = run_model(cpu, c, in, 300), b = run_model(gpu, c, in, 300);
  // 16-bit: the backends sum a GEMM's fp32 products in different orders, so an activation within an fp32 ulp of
  // a 16-bit rounding boundary can round one 16-bit ulp (2^-8 relative in bf16) apart, and a logit can move by a
  // few 1e-3.
  const double tol = is_half(precision) ? 1e-3 : 1e-5, logit_tol = is_half(precision) ? 1e-2 : 1e-5;
  BOOST_TEST(std::fabs(a.loss - b.loss) <= tol);
  BOOST_TEST(testing::count_mismatches(b.logits, a.logits, logit_tol, logit_tol, "logits") == 0u);
  BOOST_TEST(testing::count_mismatches(b.grads, a.grads, tol, 1e-2, "gradients") == 0u);
  BOOST_TEST(testing::count_mismatches(b.demb, a.demb, tol, 1e-2, "embedding gradients") == 0u);
  close_device(gpu);
}

}  // namespace

SPARTA_BACKEND_CASES(dot_model_matches_reference, dot_against_reference)
SPARTA_BACKEND_CASES(dcnv2_model_matches_reference, dcnv2_against_reference)

namespace {

// model.dropout: an evaluation forward (step 0) drops nothing (the model without dropout's logits and gradients, bit
// for bit); a training step's forward drops (other logits), the same step twice gives the same bits and another
// step or seed other masks; cuda agrees with cpu on a dropped step (the same masks) within the GEMMs' rounding.
// The gradients of a dropped MLP against a double-precision chain: tests/test_dense_mlp.cpp.
void dropout_in_training_only(Backend be) {
  const Device dev = dense_test::device_for(be);
  for (Interaction it : {Interaction::dot, Interaction::dcnv2})
    for (GemmType t : {GemmType::f32, GemmType::bf16}) {
      ModelConfig c = small(it, t);
      c.dropout = 0.25f;
      c.dropout_seed = testing::rng()();
      ModelConfig plain = c, reseeded = c;
      plain.dropout = 0.f;
      reseeded.dropout_seed = c.dropout_seed + 1;
      const Inputs in = random_inputs(c, 65, 65);
      const Outputs eval = run_model(dev, c, in, 65), none = run_model(dev, plain, in, 65, 1.f, 5);
      const Outputs s5 = run_model(dev, c, in, 65, 1.f, 5), again = run_model(dev, c, in, 65, 1.f, 5);
      const Outputs s6 = run_model(dev, c, in, 65, 1.f, 6), other = run_model(dev, reseeded, in, 65, 1.f, 5);
      BOOST_TEST_CONTEXT(dev.name() << " " << interaction_name(it) << " " << precision_name(t)) {
        BOOST_TEST(eval.logits == none.logits);
        BOOST_TEST(eval.grads == none.grads);
        BOOST_TEST(s5.logits == again.logits);
        BOOST_TEST(s5.grads == again.grads);
        BOOST_TEST(s5.demb == again.demb);
        BOOST_TEST(s5.logits != none.logits);
        BOOST_TEST(s6.logits != s5.logits);
        BOOST_TEST(other.logits != s5.logits);
        if (dev.is_cuda()) {
          const Outputs ref = run_model(dense_test::device_for(Backend::cpu), c, in, 65, 1.f, 5);
          const double tol = is_half(t) ? 2e-2 : 1e-4;
          BOOST_TEST(testing::count_mismatches(s5.logits, ref.logits, tol, tol, "logits vs cpu") == 0u);
          BOOST_TEST(testing::count_mismatches(s5.grads, ref.grads, tol, tol, "grads vs cpu") == 0u);
          BOOST_TEST(testing::count_mismatches(s5.demb, ref.demb, tol, tol, "demb vs cpu") == 0u);
        }
      }
    }
  close_device(const_cast<Device&>(dev));
}

}  // namespace

SPARTA_BACKEND_CASES(dropout_only_in_training_with_step_masks, dropout_in_training_only)

namespace {

// forward_in_x0 (the embeddings written into x0's 16-bit array, rounded on the host here, as the collection
// writes them for the trainer) gives the bits of forward with the embeddings in fp32: the logits, the loss, every
// parameter gradient and demb. x0's first columns are poisoned before (the model writes them); demb is poisoned. inputs_read comes once, after demb_ready
// (the cross network's weight gradients read x0 after it). Batches 1, 7 and 65; bf16 and fp16.
void x0_half_gives_the_bits_of_fp32_embeddings(Backend be) {
  const Device dev = dense_test::device_for(be);
  for (GemmType t : {GemmType::bf16, GemmType::f16})
    for (int64_t B : {1, 7, 65}) {
      const ModelConfig c = small(Interaction::dcnv2, t);
      const Inputs in = random_inputs(c, B, B);
      const Outputs ref = run_model(dev, c, in, B);
      DenseModel m(dev, c, B);
      BOOST_REQUIRE(m.x0_half());
      const int bottom = c.bottom_mlp.back(), W = c.embedding_width(), D = bottom + W;
      const HalfFromFloat round16 = half_from_float(t);
      std::vector<uint16_t> x0(size_t(B) * D, 0x7FC1);  // a NaN in both types
      for (int64_t r = 0; r < B; ++r)
        for (int j = 0; j < W; ++j) x0[size_t(r * D + bottom + j)] = round16(in.emb[size_t(r * W + j)]);
      copy_to_device(dev, m.x0_half(), x0.data(), x0.size() * sizeof(uint16_t));
      Buffer<float> p(dev, in.params), dense(dev, in.dense), labels(dev, in.labels);
      Buffer<float> loss = dense_test::poisoned(dev, 1), grads = dense_test::poisoned(dev, m.param_count());
      Buffer<float> demb = dense_test::poisoned(dev, size_t(B) * W);
      const float* lg = m.forward_in_x0(p.data(), dense.data(), B);
      m.loss(labels.data(), in.mean_over, loss.data());
      int calls = 0, demb_at = 0, read_at = 0;
      m.backward(p.data(), grads.data(), demb.data(), DenseModel::GradsReady(), [&] { demb_at = ++calls; },
                 [&] { read_at = ++calls; });
      std::vector<float> logits(static_cast<size_t>(B), 0.f);
      copy_to_host(dev, logits.data(), lg, logits.size() * sizeof(float));
      const std::vector<float> cols = demb.download();
      BOOST_TEST_CONTEXT(dev.name() << " " << precision_name(t) << " batch " << B) {
        BOOST_TEST(std::memcmp(logits.data(), ref.logits.data(), logits.size() * sizeof(float)) == 0);
        BOOST_TEST(loss.download()[0] == ref.loss);
        BOOST_TEST(std::memcmp(grads.download().data(), ref.grads.data(), ref.grads.size() * sizeof(float)) == 0);
        BOOST_TEST(std::memcmp(cols.data(), ref.demb.data(), ref.demb.size() * sizeof(float)) == 0);
        BOOST_TEST(demb_at == 1);
        BOOST_TEST(read_at == 2);
      }
    }
  // the other models and fp32 have no such array, and refuse the forward
  DenseModel f32(dev, small(Interaction::dcnv2, GemmType::f32), 4), dot(dev, small(Interaction::dot, GemmType::bf16), 4);
  BOOST_TEST(!f32.x0_half());
  BOOST_TEST(!dot.x0_half());
  BOOST_CHECK_THROW(f32.forward_in_x0(nullptr, nullptr, 1), Error);
  close_device(const_cast<Device&>(dev));
}

}  // namespace

SPARTA_BACKEND_CASES(x0_half_gives_the_bits_of_fp32_embeddings, x0_half_gives_the_bits_of_fp32_embeddings)

BOOST_AUTO_TEST_CASE(cuda_matches_cpu_fp32, *testing::needs_gpu()) {
  cuda_matches_cpu(Interaction::dot, GemmType::f32);
  cuda_matches_cpu(Interaction::dcnv2, GemmType::f32);
}
BOOST_AUTO_TEST_CASE(cuda_matches_cpu_bf16, *testing::needs_gpu()) {
  cuda_matches_cpu(Interaction::dot, GemmType::bf16);
  cuda_matches_cpu(Interaction::dcnv2, GemmType::bf16);
}
BOOST_AUTO_TEST_CASE(cuda_matches_cpu_fp16, *testing::needs_gpu()) {
  cuda_matches_cpu(Interaction::dot, GemmType::f16);
  cuda_matches_cpu(Interaction::dcnv2, GemmType::f16);
}

// CUDA graphs (DenseModel::use_graphs) give the bits of the same launches made one by one: two models on one GPU,
// one replaying graphs and one not, fed the same inputs, new contents every step in the same buffers, parameters
// moved after each step, a smaller evaluation batch from other buffers in the middle (its forward runs as is and
// makes the held graphs stale), a new loss scale, and the bucket callbacks on some steps; every step's loss,
// logits, parameter and embedding gradients are compared bit for bit, and the graphs must have been replayed.
// With dropout, every training forward is its step's (the replayed graph reads each step's mask key).
void graphs_replay_the_direct_bits(const Device& dev, Interaction it, GemmType precision, float dropout) {
  ModelConfig c = small(it, precision);
  c.dropout = dropout;
  const int64_t B = 300, E = 200;
  DenseModel direct(dev, c, B), graphed(dev, c, B);
  graphed.use_graphs(true);
  Inputs in = random_inputs(c, B, B);
  struct State {
    Buffer<float> p, dense, emb, labels, loss, grads, demb, eval_dense, eval_emb;
  };
  auto state = [&](const DenseModel& m) {
    return State{Buffer<float>(dev, in.params), Buffer<float>(dev, in.dense), Buffer<float>(dev, in.emb),
                 Buffer<float>(dev, in.labels), dense_test::poisoned(dev, 1), dense_test::poisoned(dev, m.param_count()),
                 dense_test::poisoned(dev, size_t(B) * c.embedding_width()),
                 Buffer<float>(dev, size_t(E) * c.num_dense), Buffer<float>(dev, size_t(E) * c.embedding_width())};
  };
  State a = state(direct), b = state(graphed);
  size_t differing = 0;
  auto same = [&](const std::vector<float>& x, const std::vector<float>& y, const char* what, int step) {
    const bool eq = x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    if (!eq) BOOST_TEST_MESSAGE("step " << step << ": " << what << " differ");
    differing += !eq;
  };
  std::vector<float> params = in.params;
  for (int step = 0; step < 8; ++step) {
    const Inputs fresh = random_inputs(c, B, B);
    const float scale = step < 5 ? 1.f : 4.f;
    const bool buckets = step % 3 == 1;
    std::vector<size_t> calls[2];
    std::vector<float> logits[2], eval_logits[2];
    int k = 0;
    for (State* st : {&a, &b}) {
      DenseModel& m = st == &a ? direct : graphed;
      st->p.upload(params);
      st->dense.upload(fresh.dense);
      st->emb.upload(fresh.emb);
      st->labels.upload(fresh.labels);
      if (step == 3) {  // an evaluation batch between two training steps
        st->eval_dense.upload(std::vector<float>(fresh.dense.begin(), fresh.dense.begin() + E * c.num_dense));
        st->eval_emb.upload(std::vector<float>(fresh.emb.begin(), fresh.emb.begin() + E * c.embedding_width()));
        const float* lg = m.forward(st->p.data(), st->eval_dense.data(), st->eval_emb.data(), E);
        eval_logits[k].resize(E);
        copy_to_host(dev, eval_logits[k].data(), lg, E * sizeof(float));
      }
      const float* lg = m.forward(st->p.data(), st->dense.data(), st->emb.data(), B, step + 1);
      m.loss(st->labels.data(), B, st->loss.data(), scale);
      std::vector<size_t>& log = calls[k];
      DenseModel::GradsReady ready;
      if (buckets) ready = [&log](size_t o, size_t n) { log.push_back(o), log.push_back(n); };
      m.backward(st->p.data(), st->grads.data(), st->demb.data(), ready, [&log] { log.push_back(size_t(-1)); });
      logits[k].resize(B);
      copy_to_host(dev, logits[k].data(), lg, B * sizeof(float));
      ++k;
    }
    same(logits[0], logits[1], "logits", step);
    same(eval_logits[0], eval_logits[1], "evaluation logits", step);
    same(a.loss.download(), b.loss.download(), "losses", step);
    const std::vector<float> g = a.grads.download();
    same(g, b.grads.download(), "parameter gradients", step);
    same(a.demb.download(), b.demb.download(), "embedding gradients", step);
    BOOST_TEST(calls[0] == calls[1]);
    for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * g[i];
  }
  BOOST_TEST(differing == 0u);
  BOOST_TEST_MESSAGE(interaction_name(it) << " " << precision_name(precision) << ": " << graphed.graphs().replays()
                     << " pieces replayed, " << graphed.graphs().captures() << " recorded, "
                     << graphed.graphs().direct_runs() << " run as is");
  // By graph.h's rules, with P pieces (forward, loss, and the backward's between its callbacks: 4 for dcnv2, 3
  // for dot, which has no cross weights): step 0
  // runs all as is, step 1 records all, step 2 replays all; step 3's evaluation forward runs as is and so does the training
  // forward after it, the rest is recorded; step 4 records the forward and replays P - 1; step 5's new loss
  // scale runs the loss as is after a replayed forward, and records the P - 2 backward pieces; step 6 records
  // the forward and the loss and replays P - 2; step 7 replays all.
  const int64_t P = it == Interaction::dcnv2 ? 6 : 5;
  BOOST_TEST(graphed.graphs().replays() == P + (P - 1) + 1 + (P - 2) + P);
  BOOST_TEST(graphed.graphs().captures() == P + (P - 1) + 1 + (P - 2) + 2);
  BOOST_TEST(direct.graphs().replays() == 0);
}

BOOST_AUTO_TEST_CASE(cuda_graphs_replay_the_direct_bits, *testing::needs_gpu()) {
  for (float dropout : {0.f, 0.25f})
  for (Interaction it : {Interaction::dot, Interaction::dcnv2})
    for (GemmType t : {GemmType::f32, GemmType::bf16, GemmType::f16}) {
      Device dev = dense_test::device_for(Backend::cuda);
      graphs_replay_the_direct_bits(dev, it, t, dropout);  // its models and buffers are gone before the device
      close_device(dev);
    }
}

// The loss gradient's scale (fp16 loss scaling) scales every gradient by exactly that power of two when nothing
// rounds to 16 bits (fp32), and leaves the loss and the logits alone; in fp16 the scaled gradients, divided
// back, stay within fp16 rounding of the unscaled ones.
BOOST_AUTO_TEST_CASE(loss_scale_scales_the_gradients) {
  for (Interaction it : {Interaction::dot, Interaction::dcnv2}) {
    const Device dev = dense_test::device_for(Backend::cpu);
    ModelConfig c = tiny(it);
    Inputs in = random_inputs(c, 16, 16);
    const float S = 1024.f;
    Outputs plain = run_model(dev, c, in, 16), scaled = run_model(dev, c, in, 16, S);
    BOOST_TEST(scaled.loss == plain.loss);
    BOOST_TEST(scaled.logits == plain.logits);
    size_t bad = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) bad += scaled.grads[i] != S * plain.grads[i];
    for (size_t i = 0; i < plain.demb.size(); ++i) bad += scaled.demb[i] != S * plain.demb[i];
    BOOST_TEST(bad == 0u);
    c.precision = GemmType::f16;
    Outputs h = run_model(dev, c, in, 16), hs = run_model(dev, c, in, 16, S);
    for (float& g : hs.grads) g /= S;
    for (float& g : hs.demb) g /= S;
    // Unscaled, the fp16 backward rounds its smallest gradients into fp16's subnormals (under 6.1e-5), a few percent
    // off now and then (the reason for loss scaling): entries are compared to 1e-3 of the largest one.
    auto largest = [](const std::vector<float>& v) {
      float m = 0;
      for (float x : v) m = std::max(m, std::fabs(x));
      return double(m);
    };
    BOOST_TEST(testing::count_mismatches(hs.grads, h.grads, 1e-3 * largest(h.grads), 1e-2, "fp16 unscaled gradients") == 0u);
    BOOST_TEST(testing::count_mismatches(hs.demb, h.demb, 1e-3 * largest(h.demb), 1e-2, "fp16 unscaled embedding gradients") == 0u);
  }
}

// d loss / d x[i] as the least-squares slope of the loss at x[i] + k h, k = -4..4: the float forward's rounding
// (a few ulps of the loss, ~1e-6 when the loss is 4) is noise that one central difference divides by 2h; the fit
// averages it over 9 points (about 5x less).
template <class Loss>
std::vector<double> fitted_slopes(std::vector<float>& x, Loss loss, double h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    double sxy = 0, sxx = 0, sx = 0, sy = 0;
    for (int k = -4; k <= 4; ++k) {
      x[i] = static_cast<float>(v + k * h);
      const double dx = double(x[i]) - double(v), y = loss();
      sx += dx, sy += y, sxy += dx * y, sxx += dx * dx;
    }
    x[i] = v;
    g[i] = (sxy - sx * sy / 9) / (sxx - sx * sx / 9);
  }
  return g;
}

// The model's backward against the slopes of its own (float) forward and loss, on the cpu backend. A slope is the
// derivative only where the loss is smooth over [x - 4h, x + 4h]: a ReLU whose input crosses zero inside it
// bends the line (and one pre-activation near zero moves every entry feeding it, up to a quarter of the embedding
// gradients of a 4-sample batch). So the inputs are drawn again until every ReLU input of the double reference
// is at least 0.05 from zero, which leaves only entries that move some pre-activation more than 12 times as far
// as themselves (a cross weight of a large input, now and then): those whose ReLU sides in the reference differ
// at x - 4h and x + 4h are left out, a few at most. Every other entry must match its slope.
BOOST_AUTO_TEST_CASE(gradient_check_by_finite_differences) {
  const double h = 1e-3, margin = 0.05;
  for (Interaction it : {Interaction::dot, Interaction::dcnv2}) {
    const Device dev = dense_test::device_for(Backend::cpu);
    const ModelConfig c = tiny(it);
    const Inputs in = inputs_clear_of_kinks(c, 4, margin);
    Outputs got = run_model(dev, c, in, 4);
    DenseModel m(dev, c, 4);
    Buffer<float> dense(dev, in.dense), labels(dev, in.labels), loss(dev, 1);
    std::vector<float> p = in.params, e = in.emb;
    auto loss_of = [&] {
      Buffer<float> pd(dev, p), ed(dev, e);
      m.forward(pd.data(), dense.data(), ed.data(), in.B);
      m.loss(labels.data(), in.B, loss.data());
      return double(loss.download()[0]);
    };
    // The ReLU sides of the reference with x[i] moved by delta.
    const RefModel ref{c};
    auto sides = [&](const std::vector<float>& x, size_t i, double delta) {
      std::vector<double> pd = as_double(p), ed = as_double(e);
      (&x == &p ? pd : ed)[i] += delta;
      ref.loss(pd, as_double(in.dense), ed, in.labels, in.B, in.mean_over, nullptr);
      return ref.open_relus;
    };
    // The rounding noise is relative to the loss (random parameters put it anywhere from 0.5 to 10): so is atol.
    const double atol = 2e-4 * std::max(1.0, loss_of() / 2);
    auto check = [&](std::vector<float>& x, const std::vector<float>& grad, const char* what) {
      const std::vector<double> slope = fitted_slopes(x, loss_of, h);
      size_t wrong = 0, at_kink = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (sides(x, i, -4 * h) != sides(x, i, 4 * h)) {
          ++at_kink;
          continue;
        }
        if (std::fabs(grad[i] - slope[i]) > atol + 2e-2 * std::fabs(slope[i])) {
          ++wrong;
          BOOST_TEST_MESSAGE(what << "[" << i << "] = " << grad[i] << ", slope " << slope[i]);
        }
      }
      BOOST_TEST_MESSAGE(interaction_name(it) << ": " << at_kink << " of " << x.size() << " " << what
                                              << " left out at a ReLU kink");
      BOOST_TEST(at_kink <= x.size() / 20 + 2);
      BOOST_TEST(wrong == 0u, interaction_name(it) << ": " << wrong << " of " << x.size() << " " << what
                                                   << " off the slopes of the loss");
    };
    check(p, got.grads, "parameter gradients");
    check(e, got.demb, "embedding gradients");
  }
}

// bf16 and fp16 GEMMs on the cpu backend stay near the fp32 model (the masters are fp32; only the GEMM inputs
// round), on inputs whose ReLU inputs are all at least 0.02 from zero (a 16-bit rounding moves them by ~3e-3; a
// sample whose ReLU flips has gradients that differ by far more than a rounding). The error of one draw has a
// long tail (a random model can be badly conditioned), so each error is the median of 9 draws. Its bounds are
// about 1.5 times the 99th percentile of single draws out of 1000 (bf16 / fp16: loss 6.4e-3 / 7.0e-4 relative,
// logits 1.1e-2 / 1.4e-3 relative to 1 + |logit|, gradients 1.7e-2 / 2.0e-3 and embedding gradients 9.5e-3 /
// 1.4e-3 relative L2; the medians are 3 to 10 times less); a wrong term moves them by O(1).
BOOST_AUTO_TEST_CASE(bf16_close_to_fp32) {
  auto relative_l2 = [](const std::vector<float>& got, const std::vector<float>& want) {
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff2 += std::pow(double(got[i]) - want[i], 2);
      norm2 += std::pow(double(want[i]), 2);
    }
    return std::sqrt(diff2 / norm2);
  };
  auto worst_logit = [](const std::vector<float>& got, const std::vector<float>& want) {
    double m = 0;
    for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(double(got[i]) - want[i]) / (1 + std::fabs(want[i])));
    return m;
  };
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  for (Interaction it : {Interaction::dot, Interaction::dcnv2}) {
    const Device dev = dense_test::device_for(Backend::cpu);
    std::vector<double> err[2][4];  // [bf16, fp16][loss, logits, gradients, embedding gradients]
    for (int draw = 0; draw < 9; ++draw) {
      ModelConfig c = tiny(it);
      const Inputs in = inputs_clear_of_kinks(c, 4, 0.02);
      const Outputs f32 = run_model(dev, c, in, 4);
      for (int k = 0; k < 2; ++k) {
        c.precision = k == 0 ? GemmType::bf16 : GemmType::f16;
        const Outputs o = run_model(dev, c, in, 4);
        // and 16-bit does round: the logits are not the fp32 ones bit for bit
        BOOST_TEST(o.logits != f32.logits);
        err[k][0].push_back(std::fabs(o.loss - f32.loss) / std::fabs(f32.loss));
        err[k][1].push_back(worst_logit(o.logits, f32.logits));
        err[k][2].push_back(relative_l2(o.grads, f32.grads));
        err[k][3].push_back(relative_l2(o.demb, f32.demb));
      }
    }
    const double bound[2][4] = {{1e-2, 1.5e-2, 2.5e-2, 1.5e-2}, {1e-3, 2e-3, 3e-3, 2e-3}};
    const char* name[4] = {"loss", "logits", "gradients", "embedding gradients"};
    for (int k = 0; k < 2; ++k)
      for (int q = 0; q < 4; ++q)
        BOOST_TEST(median(err[k][q]) <= bound[k][q], interaction_name(it) << (k == 0 ? " bf16 " : " fp16 ") << name[q]
                                                                           << ": median error " << median(err[k][q]));
  }
}

BOOST_AUTO_TEST_CASE(parameter_layout) {
  for (Interaction it : {Interaction::dot, Interaction::dcnv2}) {
    const ModelConfig c = tiny(it);
    const std::vector<ParamPart> parts = DenseModel::parts(c);
    size_t at = 0;
    for (const ParamPart& p : parts) {
      BOOST_TEST(p.offset == at, p.name);
      at += p.count();
    }
    BOOST_TEST(at == DenseModel::param_count(c));
    BOOST_TEST(DenseModel::initial_params(c, 5).size() == at);
    BOOST_TEST(DenseModel::initial_params(c, 5) == DenseModel::initial_params(c, 5));
    BOOST_TEST(DenseModel::initial_params(c, 5) != DenseModel::initial_params(c, 6));
    // hand-computed: bottom 5→8→4 = 48+36, top (4+6)→6→1 or (4+12)→6→1; cross 2 x (3*16 + 16*3 + 16)
    const size_t want = it == Interaction::dot ? 84 + (10 * 6 + 6) + 7 : 84 + 2 * (48 + 48 + 16) + (16 * 6 + 6) + 7;
    BOOST_TEST(at == want);
    BOOST_TEST(parts.front().name == "bottom_mlp.0.weight");
    BOOST_TEST(parts.back().name == "top_mlp.1.bias");
  }
}

BOOST_AUTO_TEST_CASE(bad_configs_name_the_field) {
  using dense_test::Names;
  ModelConfig c = tiny(Interaction::dot);
  c.bottom_mlp = {8, 5};
  BOOST_CHECK_EXCEPTION(check_model_config(c), Error, (Names{"model.bottom_mlp", "embedding_dim", "4", "5"}));
  c = tiny(Interaction::dot);
  c.top_mlp = {6, 2};
  BOOST_CHECK_EXCEPTION(check_model_config(c), Error, (Names{"model.top_mlp", "must be 1", "2"}));
  c = tiny(Interaction::dcnv2);
  c.cross_rank = 0;
  BOOST_CHECK_EXCEPTION(check_model_config(c), Error, (Names{"model.cross_rank", "0"}));
  c = tiny(Interaction::dot);
  c.bottom_mlp = {};
  BOOST_CHECK_EXCEPTION(check_model_config(c), Error, (Names{"model.bottom_mlp", "at least one"}));
  BOOST_CHECK_EXCEPTION(parse_interaction("dlrm"), Error, (Names{"model.interaction", "dlrm"}));
  const Device dev = dense_test::device_for(Backend::cpu);
  DenseModel m(dev, tiny(Interaction::dot), 4);
  BOOST_CHECK_EXCEPTION(m.forward(nullptr, nullptr, nullptr, 5), Error, (Names{"batch", "[0, 4]", "5"}));
}
