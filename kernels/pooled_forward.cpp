// pooled_forward.cpp: CPU reference of pooled_forward.h (one key at a time through the CPU hash table),
// half-precision conversions, and the backend dispatch.
#include "pooled_forward.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "check.h"

namespace sparta {

const char* lookup_mode_name(LookupMode m) { return m == LookupMode::train ? "train" : "eval"; }

const char* output_type_name(OutputType t) {
  switch (t) {
    case OutputType::f32: return "f32";
    case OutputType::bf16: return "bf16";
    case OutputType::f16: return "f16";
  }
  return "?";
}

size_t output_type_bytes(OutputType t) { return t == OutputType::f32 ? 4 : 2; }

namespace {
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

uint16_t float_to_bf16_bits(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_float(uint16_t h) { return float_of(uint32_t(h) << 16); }

uint16_t float_to_f16_bits(float f) {
  uint32_t u = bits_of(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;           // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;          // rounds to >= 65520: infinity
  if (a >= 0x38800000u) {                               // normal half
    uint32_t r = a - 0x38000000u;                       // rebias exponent 127 → 15
    r += 0xFFFu + ((r >> 13) & 1u);
    return sign | static_cast<uint16_t>(r >> 13);
  }
  // Subnormal half (or zero): value = m * 2^-24, round the float to a multiple of 2^-24, nearest even.
  int exp = static_cast<int>(a >> 23);
  if (exp < 102) return sign;  // below half of the smallest subnormal
  uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  int shift = 126 - exp;       // mant * 2^(exp-150) / 2^-24 = mant >> (126 - exp)
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

float f16_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return float_of(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24
    return sign ? -v : v;
  }
  return float_of(sign | ((e + 112) << 23) | (m << 13));
}

void embedding_forward_cpu(const ForwardArgs& a) {
  const int dim = a.rows_init.dim;
  const bool train = a.mode == LookupMode::train;
  std::vector<float> acc(static_cast<size_t>(dim));
  for (int64_t b = 0; b < a.bags; ++b) {
    int64_t begin = a.offsets ? a.offsets[b] : b, end = a.offsets ? a.offsets[b + 1] : b + 1;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t i = begin; i < end; ++i) {
      int64_t row = -1;
      if (train)
        hash_get_insert_cpu(a.table, &a.keys[i], 1, &row, a.rows_init);
      else
        hash_find_cpu(a.table, &a.keys[i], 1, &row, nullptr);
      if (a.rows) a.rows[i] = row;
      if (row < 0) continue;
      const float* v = a.rows_init.values + row * dim;
      for (int e = 0; e < dim; ++e) acc[e] += v[e];
    }
    int64_t n = end - begin;
    if (a.combiner == Combiner::mean && n > 0)
      for (int e = 0; e < dim; ++e) acc[e] = acc[e] / static_cast<float>(n);
    switch (a.out_type) {
      case OutputType::f32: std::memcpy(static_cast<float*>(a.out) + b * dim, acc.data(), sizeof(float) * dim); break;
      case OutputType::bf16:
        for (int e = 0; e < dim; ++e) static_cast<uint16_t*>(a.out)[b * dim + e] = float_to_bf16_bits(acc[e]);
        break;
      case OutputType::f16:
        for (int e = 0; e < dim; ++e) static_cast<uint16_t*>(a.out)[b * dim + e] = float_to_f16_bits(acc[e]);
        break;
    }
  }
}

namespace {
void check_args(const ForwardArgs& a, const char* what) {
  SPARTA_REQUIRE(a.rows_init.dim >= 1 && a.rows_init.dim <= 256, "%s: dim must be in 1..256, found %d", what,
                 a.rows_init.dim);
  SPARTA_REQUIRE(a.bags >= 0, "%s: bags must be >= 0, found %lld", what, (long long)a.bags);
  SPARTA_REQUIRE(a.bags == 0 || (a.out && a.rows_init.values && a.table.slots), "%s: null output, values or table",
                 what);
}

void dispatch(const Device& dev, const ForwardArgs& a, const char* what) {
  check_args(a, what);
  if (!dev.is_cuda()) return embedding_forward_cpu(a);
#if SPARTA_CUDA
  embedding_forward_cuda(a, dev.stream);
#else
  SPARTA_FATAL("%s on %s in a CUDA=0 build", what, dev.name().c_str());
#endif
}
}  // namespace

void pooled_forward(const Device& dev, const ForwardArgs& a) {
  SPARTA_REQUIRE(a.bags == 0 || a.offsets, "pooled_forward: offsets are null");
  dispatch(dev, a, "pooled_forward");
}

void unpooled_forward(const Device& dev, const ForwardArgs& a) {
  ForwardArgs u = a;
  u.offsets = nullptr;
  u.combiner = Combiner::sum;
  dispatch(dev, u, "unpooled_forward");
}

}  // namespace sparta
