// sparse_optimizer.h: the sparse optimizers that update only the rows of a table a batch touched, given one
// summed gradient per unique row (embedding_backward.h makes them; backward_and_update fuses both).
//
// Store layout (embedding_types.h): values [capacity_rows, dim], state [capacity_rows, state_width].
// With g the row's gradient, w its values, t = step (the global step, counted from 1), every element:
//   sgd        w -= lr * g
//   momentum   v = momentum * v + g;                      w -= lr * v                        (PyTorch form)
//   nesterov   v = momentum * v + g;                      w -= lr * (g + momentum * v)       (PyTorch form)
//   adagrad    a += g * g;                                w -= lr * g / (sqrt(a) + epsilon)
//   rowwise_adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) one accumulator a per row:
//              a += sum(g * g) / dim;  r = lr / (sqrt(a) + epsilon);  w -= r * g
//              The sum of squares is a balanced binary tree over the element index (pairs (0,1), (2,3), ..., then
//              pairs of those), zero-padded to a power of two: an order the GPU's lane groups take whatever the
//              row's shape (row_square_sum), so both backends give the same bits.
//   adam       m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g;
//              w -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
//              Only the batch's rows change; the bias correction uses the global step t.
//   lazy_adam  (HugeCTR's LazyGlobal) the row's last update step s is kept in the state's last float (int32
//              bits; 0 for a new row). A row untouched for k = max(0, t - 1 - s) steps first applies the decay
//              it missed, m *= beta1^k, v *= beta2^k, then takes the adam step above, and s = t. Its m and v
//              are then what dense Adam would hold had the missed steps had zero gradient; only w differs
//              (it did not move while the row was absent).
// Weight decay (OptimizerConfig::weight_decay, every optimizer): g is first replaced by g + weight_decay * w
// (skipped when weight_decay is 0, so a zero decay changes no bit).
// adagrad's and rowwise_adagrad's accumulators start at OptimizerConfig::initial_accumulator (the table sets it
// when it creates a row); every other state starts at zero.
//
// Every multiply, add, divide and square root is an IEEE round-to-nearest operation on both backends (no
// fused multiply-add, beta^k by repeated squaring, the bias corrections computed once on the host), so the
// cpu and cuda backends give the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/base/check.h"
#include "src/base/device.h"
#include "kernels/embedding_types.h"
#include "kernels/row_storage.h"


namespace sparta {

// The constants of one optimizer step, computed on the host from the configuration and the step.
struct OptimizerStep {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0, momentum = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, epsilon = 0;
  float inv_bias1 = 1, inv_bias2 = 1;  // 1 / (1 - beta1^t), 1 / (1 - beta2^t)
  float weight_decay = 0;
  int32_t step = 1;
  RowStorage storage = RowStorage::fp32;  // 16 bits: each result rounded stochastically (kernels/row_storage.h)
  uint64_t rounding_stream = 0;           // rowstore::step_stream(rounding_seed, step)
};

// Throws sparta::Error when step is not in [1, INT32_MAX] (the lazy_adam state stores it as int32).
OptimizerStep optimizer_step(const OptimizerConfig& cfg, int64_t step);

// Applies the optimizer to rows unique_rows[u] for u < *num_unique with gradients row_grads[u].
//   unique_rows [max_unique]        int64, each in [0, capacity_rows); rows outside are skipped
//   row_grads   [max_unique, dim]
//   num_unique  [1] int32 in device memory: read on the device, so no host synchronization (cuda); the
//               launch covers max_unique rows, the host's upper bound on *num_unique.
//   values      [capacity_rows, dim], state [capacity_rows, optimizer_state_width(kind, dim)]
// The rows must be distinct (embedding_backward makes them so). Asynchronous on stream (cuda).
void sparse_optimizer_update(const Device& dev, const OptimizerConfig& cfg, int64_t step,
                             const int64_t* unique_rows, const float* row_grads, const int32_t* num_unique,
                             int64_t max_unique, float* values, float* state, int64_t capacity_rows, int dim,
                             Stream stream);

void sparse_optimizer_update_cpu(const OptimizerStep& c, const int64_t* unique_rows, const float* row_grads,
                                 int64_t num_unique, float* values, float* state, int64_t capacity_rows, int dim);
void sparse_optimizer_update_cuda(const OptimizerStep& c, const int64_t* unique_rows, const float* row_grads,
                                  const int32_t* num_unique, int64_t max_unique, float* values, float* state,
                                  int64_t capacity_rows, int dim, Stream stream);

// ---------------------------------------------------------------------------------------------------------
// The element formulas, shared by the cpu reference and the CUDA kernels (here and in embedding_backward.cu).

namespace rn {  // IEEE round-to-nearest arithmetic that the compiler may not contract into fused multiply-adds
#if defined(__CUDA_ARCH__)
SPARTA_HD float mul(float a, float b) { return __fmul_rn(a, b); }
SPARTA_HD float add(float a, float b) { return __fadd_rn(a, b); }
SPARTA_HD float sub(float a, float b) { return __fsub_rn(a, b); }
SPARTA_HD float div(float a, float b) { return __fdiv_rn(a, b); }
SPARTA_HD float sqrt(float a) { return __fsqrt_rn(a); }
#else
// Host: C++17 without -ffp-contract=fast contracts nothing; these are plain IEEE float operations.
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float div(float a, float b) { return a / b; }
inline float sqrt(float a) { return std::sqrt(a); }
#endif
}  // namespace rn

// base^k for k >= 0 by repeated squaring: the same bits on both backends (powf is not correctly rounded).
SPARTA_HD float pow_steps(float base, int32_t k) {
  float r = 1.0f;
  while (k > 0) {
    if (k & 1) r = rn::mul(r, base);
    base = rn::mul(base, base);
    k >>= 1;
  }
  return r;
}

// What one row's elements share: the decay a lazy_adam row missed (from the step of its last update), and
// rowwise_adagrad's step size r = lr / (sqrt(a) + epsilon).
struct RowDecay {
  float beta1_k = 1, beta2_k = 1;
  float row_lr = 0;
};
SPARTA_HD RowDecay lazy_decay(const OptimizerStep& c, int32_t last_step) {
  int32_t k = c.step - 1 - last_step;
  if (k < 0) k = 0;  // a replayed or out-of-order step misses nothing
  return {pow_steps(c.beta1, k), pow_steps(c.beta2, k)};
}

// One element: g its gradient, w its value, s0 and s1 its state (unused ones are ignored).
template <OptimizerKind K>
SPARTA_HD void update_element(const OptimizerStep& c, const RowDecay& d, float g, float& w, float& s0,
                                     float& s1) {
  if (K == OptimizerKind::sgd) {
    w = rn::sub(w, rn::mul(c.lr, g));
  } else if (K == OptimizerKind::momentum) {
    s0 = rn::add(rn::mul(c.momentum, s0), g);
    w = rn::sub(w, rn::mul(c.lr, s0));
  } else if (K == OptimizerKind::nesterov) {
    s0 = rn::add(rn::mul(c.momentum, s0), g);
    w = rn::sub(w, rn::mul(c.lr, rn::add(g, rn::mul(c.momentum, s0))));
  } else if (K == OptimizerKind::adagrad) {
    s0 = rn::add(s0, rn::mul(g, g));
    w = rn::sub(w, rn::div(rn::mul(c.lr, g), rn::add(rn::sqrt(s0), c.epsilon)));
  } else if (K == OptimizerKind::rowwise_adagrad) {
    w = rn::sub(w, rn::mul(d.row_lr, g));
  } else {  // adam, lazy_adam
    if (K == OptimizerKind::lazy_adam) {
      s0 = rn::mul(s0, d.beta1_k);
      s1 = rn::mul(s1, d.beta2_k);
    }
    s0 = rn::add(rn::mul(c.beta1, s0), rn::mul(c.one_minus_beta1, g));
    s1 = rn::add(rn::mul(c.beta2, s1), rn::mul(rn::mul(c.one_minus_beta2, g), g));
    float m_hat = rn::mul(s0, c.inv_bias1), v_hat = rn::mul(s1, c.inv_bias2);
    w = rn::sub(w, rn::div(rn::mul(c.lr, m_hat), rn::add(rn::sqrt(v_hat), c.epsilon)));
  }
}

// Where the state of element e of a row lives: s0 at state[e], s1 at state[dim + e] (adam, lazy_adam), and
// lazy_adam's last step at state[2 * dim].
// rowwise_adagrad's one float per row is neither (row_accumulate).
SPARTA_HD constexpr bool optimizer_has_s0(OptimizerKind k) {
  return k != OptimizerKind::sgd && k != OptimizerKind::rowwise_adagrad;
}
SPARTA_HD constexpr bool optimizer_has_s1(OptimizerKind k) {
  return k == OptimizerKind::adam || k == OptimizerKind::lazy_adam;
}

// The last-step slot of a lazy_adam row: int32 bits in a float.
inline int32_t load_last_step(const float* slot) {
  int32_t s;
  std::memcpy(&s, slot, sizeof(s));
  return s;
}
inline void store_last_step(float* slot, int32_t s) { std::memcpy(slot, &s, sizeof(s)); }

// The gradient an optimizer takes: g + weight_decay * w (g itself without decay).
SPARTA_HD float decayed_grad(const OptimizerStep& c, float g, float w) {
  return c.weight_decay != 0.0f ? rn::add(g, rn::mul(c.weight_decay, w)) : g;
}

// rowwise_adagrad: the accumulator a += square_sum / dim, and the row's step size lr / (sqrt(a) + epsilon).
SPARTA_HD float row_accumulate(const OptimizerStep& c, float& a, float square_sum, int dim) {
  a = rn::add(a, rn::div(square_sum, float(dim)));
  return rn::div(c.lr, rn::add(rn::sqrt(a), c.epsilon));
}

// The sum of x[e] * x[e] for e < n as sparse_optimizer.h's balanced tree (zero-padded to a power of two).
inline float row_square_sum(const float* x, int n) {
  float t[256];  // rows are at most 256 floats
  int m = 1;
  while (m < n) m *= 2;
  for (int e = 0; e < m; ++e) t[e] = e < n ? rn::mul(x[e], x[e]) : 0.0f;
  for (; m > 1; m /= 2)
    for (int i = 0; i < m / 2; ++i) t[i] = rn::add(t[2 * i], t[2 * i + 1]);
  return t[0];
}

// Updates one whole row on the host (the cpu reference).
template <OptimizerKind K>
inline void update_row_cpu(const OptimizerStep& c, const float* g_in, float* w, float* st, int dim) {
  float decayed[256];  // rows are at most 256 floats
  const float* g = g_in;
  if (c.weight_decay != 0.0f) {
    for (int e = 0; e < dim; ++e) decayed[e] = decayed_grad(c, g_in[e], w[e]);
    g = decayed;
  }
  RowDecay d;
  if (K == OptimizerKind::lazy_adam) {
    d = lazy_decay(c, load_last_step(st + 2 * dim));
    store_last_step(st + 2 * dim, c.step);
  }
  if (K == OptimizerKind::rowwise_adagrad) d.row_lr = row_accumulate(c, st[0], row_square_sum(g, dim), dim);
  float unused0 = 0, unused1 = 0;
  for (int e = 0; e < dim; ++e) {
    float& s0 = optimizer_has_s0(K) ? st[e] : unused0;
    float& s1 = optimizer_has_s1(K) ? st[dim + e] : unused1;
    update_element<K>(c, d, g[e], w[e], s0, s1);
  }
}

// The same on a row of 16-bit storage c.storage: read into fp32, updated, each element written back rounded
// stochastically with the bits of rowstore::rounding_bits.
template <OptimizerKind K>
inline void update_row16_cpu(const OptimizerStep& c, const float* g, uint16_t* w16, float* st, int dim) {
  float w[256];  // rows are at most 256 floats
  for (int e = 0; e < dim; ++e) w[e] = rowstore::widen(c.storage, w16[e]);
  update_row_cpu<K>(c, g, w, st, dim);
  for (int e = 0; e < dim; ++e)
    w16[e] = rowstore::round_stochastic(c.storage, w[e], rowstore::rounding_bits(c.rounding_stream, e, w[e], w16[e]));
}

// Calls f(std::integral_constant<OptimizerKind, K>{}) with the optimizer kind as a compile-time constant.
template <class F>
inline void dispatch_optimizer(OptimizerKind kind, F&& f) {
  using K = OptimizerKind;
  switch (kind) {
    case K::sgd: return f(std::integral_constant<K, K::sgd>{});
    case K::momentum: return f(std::integral_constant<K, K::momentum>{});
    case K::nesterov: return f(std::integral_constant<K, K::nesterov>{});
    case K::adagrad: return f(std::integral_constant<K, K::adagrad>{});
    case K::adam: return f(std::integral_constant<K, K::adam>{});
    case K::lazy_adam: return f(std::integral_constant<K, K::lazy_adam>{});
    case K::rowwise_adagrad: return f(std::integral_constant<K, K::rowwise_adagrad>{});
  }
}

}  // namespace sparta

#if defined(__CUDACC__)
// ---------------------------------------------------------------------------------------------------------
// Device side of a row update, shared by the update kernel (sparse_optimizer.cu) and the fused backward
// (embedding_backward.cu). A row is handled by a group of G lanes (G a power of two <= 32, all in one warp);
// lane l owns the vectors c = l + p*G (p < P) of V floats (V = 4: float4 loads) for c < dim / V.
namespace sparta {
namespace rowvec {

template <int V>
__device__ __forceinline__ void load(const float* p, float* out) {
  if (V == 4) {
    float4 x = *reinterpret_cast<const float4*>(p);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = p[v];
  }
}
template <int V>
__device__ __forceinline__ void store(float* p, const float* in) {
  if (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) p[v] = in[v];
  }
}
// Gradients are read once: read-only path.
template <int V>
__device__ __forceinline__ void load_ro(const float* p, float* out) {
  if (V == 4) {
    float4 x = __ldg(reinterpret_cast<const float4*>(p));
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = __ldg(p + v);
  }
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The lanes of this thread's group, for __syncwarp.
__device__ __forceinline__ unsigned group_mask(int G) {
  if (G == 32) return 0xffffffffu;
  unsigned lane = threadIdx.x & 31u;
  return ((1u << G) - 1u) << (lane & ~unsigned(G - 1));
}

// A row's values in storage S: fp32, or 16 bits (sgd and rowwise_adagrad only: embedding_types.h check_row_storage)
// read widened to fp32 and written back rounded stochastically with rowstore::rounding_bits of the element's
// index, its fp32 result and its old bits: the bits of update_row16_cpu.
template <RowStorage S>
using stored_t = std::conditional_t<S == RowStorage::fp32, float, uint16_t>;

// V elements of a row at p as fp32 in w; 16 bits: their stored bits in old too (8-byte loads when V is 4).
template <int V, RowStorage S>
__device__ __forceinline__ void load_values(const stored_t<S>* p, float* w, uint16_t* old) {
  if constexpr (S == RowStorage::fp32) {
    load<V>(p, w);
  } else {
    if (V == 4) {
      const uint2 x = *reinterpret_cast<const uint2*>(p);
      old[0] = uint16_t(x.x & 0xffffu), old[1] = uint16_t(x.x >> 16);
      old[2] = uint16_t(x.y & 0xffffu), old[3] = uint16_t(x.y >> 16);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) old[v] = p[v];
    }
#pragma unroll
    for (int v = 0; v < V; ++v) w[v] = rowstore::widen(S, old[v]);
  }
}
// The V results w of elements e .. e + V - 1 written at p (16 bits: rounded stochastically).
template <int V, RowStorage S>
__device__ __forceinline__ void store_values(stored_t<S>* p, const float* w, const uint16_t* old,
                                             uint64_t rounding_stream, int e) {
  if constexpr (S == RowStorage::fp32) {
    store<V>(p, w);
  } else {
    uint16_t out[V];
#pragma unroll
    for (int v = 0; v < V; ++v)
      out[v] = rowstore::round_stochastic(S, w[v], rowstore::rounding_bits(rounding_stream, uint32_t(e + v), w[v], old[v]));
    if (V == 4) {
      uint2 x;
      x.x = uint32_t(out[0]) | (uint32_t(out[1]) << 16);
      x.y = uint32_t(out[2]) | (uint32_t(out[3]) << 16);
      *reinterpret_cast<uint2*>(p) = x;
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) p[v] = out[v];
    }
  }
}

// Applies optimizer K to row `row` of the store (values of storage S) with this lane's part of the gradient,
// acc[P*V] (vector p of the lane at acc + p*V). Every lane of the group must call it (lazy_adam and
// rowwise_adagrad synchronize the group).
template <OptimizerKind K, int V, int P, RowStorage S = RowStorage::fp32>
struct RowUpdate {
  static_assert(S == RowStorage::fp32 || K == OptimizerKind::sgd || K == OptimizerKind::rowwise_adagrad,
                "16-bit rows: sgd, rowwise_adagrad");
  OptimizerStep c;
  stored_t<S>* values;  // [capacity_rows, dim]
  float* state;         // [capacity_rows, state_width]
  int dim;
  int state_width;

  // Asks L2 for the row's values and state while its gradient is still being summed.
  __device__ __forceinline__ void prefetch(uint32_t row, int lane, int G) const {
    const stored_t<S>* w_row = values + size_t(row) * dim;
    const float* s_row = state + size_t(row) * state_width;
    const int nv = dim / V;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int col = lane + p * G;
      if (col >= nv) break;
      prefetch_l2(w_row + col * V);
      if (optimizer_has_s0(K)) prefetch_l2(s_row + col * V);
      if (optimizer_has_s1(K)) prefetch_l2(s_row + dim + col * V);
    }
    if (K == OptimizerKind::rowwise_adagrad && lane == 0) prefetch_l2(s_row);
  }

  // rowwise_adagrad: the row's gradient (decayed) and sum of squares in the header's tree order: each vector of V
  // in the lane, then across lanes (lane bits are the element index's next bits: xor 1, 2, ..., G/2), then across
  // the lane's P vectors (the index's top bits). Lanes past the row hold zeros.
  __device__ __forceinline__ void apply_rowwise(uint32_t row, int lane, int G, const float* acc) const {
    stored_t<S>* w_row = values + size_t(row) * dim;
    float* s_row = state + size_t(row) * state_width;
    const int nv = dim / V;
    const unsigned mask = group_mask(G);
    float a = s_row[0];
    float w[P * V], g[P * V], part[P];
    uint16_t old[P * V];  // 16-bit storage: the stored bits
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int col = lane + p * G;
      if (col < nv) {
        load_values<V, S>(w_row + col * V, w + p * V, old + p * V);
#pragma unroll
        for (int v = 0; v < V; ++v) g[p * V + v] = decayed_grad(c, acc[p * V + v], w[p * V + v]);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) w[p * V + v] = 0.f, g[p * V + v] = 0.f, old[p * V + v] = 0;
      }
      float q[V];
#pragma unroll
      for (int v = 0; v < V; ++v) q[v] = rn::mul(g[p * V + v], g[p * V + v]);
#pragma unroll
      for (int h = 1; h < V; h *= 2)
#pragma unroll
        for (int v = 0; v < V; v += 2 * h) q[v] = rn::add(q[v], q[v + h]);
      part[p] = q[0];
    }
    for (int o = 1; o < G; o *= 2)
#pragma unroll
      for (int p = 0; p < P; ++p) part[p] = rn::add(part[p], __shfl_xor_sync(mask, part[p], o));
#pragma unroll
    for (int h = 1; h < P; h *= 2)
#pragma unroll
      for (int p = 0; p < P; p += 2 * h) part[p] = rn::add(part[p], part[p + h]);
    RowDecay d;
    d.row_lr = row_accumulate(c, a, part[0], dim);
    __syncwarp(mask);  // every lane has read the accumulator before lane 0 overwrites it
    if (lane == 0) s_row[0] = a;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int col = lane + p * G;
      if (col >= nv) break;
      float unused0 = 0, unused1 = 0;
#pragma unroll
      for (int v = 0; v < V; ++v) update_element<K>(c, d, g[p * V + v], w[p * V + v], unused0, unused1);
      store_values<V, S>(w_row + col * V, w + p * V, old + p * V, c.rounding_stream, col * V);
    }
  }

  __device__ __forceinline__ void apply(uint32_t row, int lane, int G, const float* acc) const {
    if (K == OptimizerKind::rowwise_adagrad) return apply_rowwise(row, lane, G, acc);
    // state rows of lazy_adam (2*dim+1 floats) are not 16-byte aligned: scalar loads there
    constexpr int SV = (K == OptimizerKind::lazy_adam) ? 1 : V;
    stored_t<S>* w_row = values + size_t(row) * dim;
    float* s_row = state + size_t(row) * state_width;
    RowDecay d;
    if (K == OptimizerKind::lazy_adam) {
      int32_t last = __float_as_int(s_row[2 * dim]);
      d = lazy_decay(c, last);
      __syncwarp(group_mask(G));  // every lane has read the last step before lane 0 overwrites it
      if (lane == 0) s_row[2 * dim] = __int_as_float(c.step);
    }
    const int nv = dim / V;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int col = lane + p * G;
      if (col >= nv) break;
      int e = col * V;
      float w[V], s0[V], s1[V], g[V];
      uint16_t old[V];
      load_values<V, S>(w_row + e, w, old);
#pragma unroll
      for (int v = 0; v < V; ++v) g[v] = decayed_grad(c, acc[p * V + v], w[v]);
      if (optimizer_has_s0(K)) {
#pragma unroll
        for (int v = 0; v < V; v += SV) load<SV>(s_row + e + v, s0 + v);
      }
      if (optimizer_has_s1(K)) {
#pragma unroll
        for (int v = 0; v < V; v += SV) load<SV>(s_row + dim + e + v, s1 + v);
      }
#pragma unroll
      for (int v = 0; v < V; ++v) update_element<K>(c, d, g[v], w[v], s0[v], s1[v]);
      store_values<V, S>(w_row + e, w, old, c.rounding_stream, e);
      if (optimizer_has_s0(K)) {
#pragma unroll
        for (int v = 0; v < V; v += SV) store<SV>(s_row + e + v, s0 + v);
      }
      if (optimizer_has_s1(K)) {
#pragma unroll
        for (int v = 0; v < V; v += SV) store<SV>(s_row + dim + e + v, s1 + v);
      }
    }
  }
};

// Lanes per row and vectors per lane for a row of dim floats read V at a time.
struct RowShape {
  int V = 1, G = 1, log2_G = 0, P = 1;
};
// V = 4 when dim % 4 == 0 and every pointer given is 16-byte aligned; P rounded up to a power of two.
RowShape row_shape(int dim, bool aligned16);

// Blocks for `units` groups of G lanes in blocks of `block` threads: grid-stride beyond a few waves.
int grid_for(int64_t units, int G, int block);

// Calls f(std::integral_constant<int, V>{}, std::integral_constant<int, P>{}) for the row shape
// (V in {1, 4}, P in {1, 2, 4, 8}).
template <class F>
inline void dispatch_shape(const RowShape& s, F&& f) {
  using one = std::integral_constant<int, 1>;
  using two = std::integral_constant<int, 2>;
  using four = std::integral_constant<int, 4>;
  using eight = std::integral_constant<int, 8>;
  if (s.V == 4) {
    if (s.P == 1) return f(four{}, one{});
    if (s.P == 2) return f(four{}, two{});
    if (s.P == 4) return f(four{}, four{});
  } else {
    if (s.P == 1) return f(one{}, one{});
    if (s.P == 2) return f(one{}, two{});
    if (s.P == 4) return f(one{}, four{});
    if (s.P == 8) return f(one{}, eight{});
  }
  SPARTA_FATAL("no kernel for row shape V=%d P=%d", s.V, s.P);
}

}  // namespace rowvec
}  // namespace sparta
#endif
