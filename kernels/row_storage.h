// row_storage.h: reading and writing a table's values in its RowStorage (kernels/embedding_types.h), the same
// bits on the host (the cpu reference) and on the GPU.
//
// A 16-bit element widens exactly to fp32. A new row's values round to nearest even from key_init's fp32 value
// (src/base/half.h's bits). Every update rounds its fp32 result stochastically: to the upper neighbour (in
// magnitude) with probability equal to the distance from the lower one over the gap, so the expected stored value
// is the fp32 result and small steps are not lost. The random bits are a hash of (seed, step, element, the fp32
// result's bits, the element's stored bits before the update): a pure function of what every copy of a row holds
// and receives, so a rerun reproduces bit for bit and every copy of a row (hybrid's hot copies, replicated's
// replicas, any placement and rank count) rounds alike, without the row's key (an update knows rows, not keys).
// Infinities and NaN are rounded to nearest; fp16 magnitudes >= 65536 give infinity, and fp16 magnitudes below
// 2^-64 round to zero (their rounding would need more random bits than the hash gives).
#pragma once

#include <cstdint>
#include <cstring>

#include "src/base/device.h"  // SPARTA_HD
#include "src/base/half.h"
#include "src/base/random.h"  // hash_mix
#include "kernels/embedding_types.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace sparta {
namespace rowstore {

SPARTA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// 16 bits of storage s to fp32 (exact).
SPARTA_HD float widen(RowStorage s, uint16_t h) {
#if defined(__CUDA_ARCH__)
  return s == RowStorage::bf16 ? __uint_as_float(uint32_t(h) << 16) : __half2float(__ushort_as_half(h));
#else
  return s == RowStorage::bf16 ? bf16_to_float(h) : f16_to_float(h);
#endif
}

// fp32 to 16 bits of storage s, round to nearest even.
SPARTA_HD uint16_t round_nearest(RowStorage s, float x) {
#if defined(__CUDA_ARCH__)
  return s == RowStorage::bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
#else
  return s == RowStorage::bf16 ? float_to_bf16(x) : float_to_f16(x);
#endif
}

// fp32 to bf16, stochastically: the 16 bits below bf16's are compared with r's low 16 (adding them carries into
// the kept bits with probability low / 2^16). Works the same for subnormals; the largest finite magnitudes may
// round up to infinity, their upper neighbour.
SPARTA_HD uint16_t bf16_stochastic(float x, uint64_t r) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return round_nearest(RowStorage::bf16, x);
  return static_cast<uint16_t>((u + uint32_t(r & 0xffffu)) >> 16);
}

// fp32 to fp16, stochastically: the magnitude's significand m (24 bits) keeps m >> shift, and rounds up when r's
// low `shift` bits are below the dropped bits (probability dropped / 2^shift). shift is 13 for normal halves and
// grows below them (subnormals).
SPARTA_HD uint16_t f16_stochastic(float x, uint64_t r) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
  if (exp == 0xffu) return round_nearest(RowStorage::fp16, x);
  const int e = int(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  const int shift = e > 0 ? 13 : 14 - e;  // e <= 0: a subnormal half, value / 2^-24 = m >> (14 - e)
  if (shift > 63) return static_cast<uint16_t>(sign);
  const uint64_t m = uint64_t(exp == 0 ? mant : (mant | 0x800000u));
  const uint64_t low = (uint64_t(1) << shift) - 1;
  const uint32_t up = (r & low) < (m & low) ? 1u : 0u;
  // normal: a carry out of the significand into the exponent is the right answer (up to infinity)
  if (e > 0) return static_cast<uint16_t>(sign | (((uint32_t(e) << 10) | (mant >> 13)) + up));
  return static_cast<uint16_t>(sign | (uint32_t(m >> shift) + up));
}

SPARTA_HD uint16_t round_stochastic(RowStorage s, float x, uint64_t r) {
  return s == RowStorage::bf16 ? bf16_stochastic(x, r) : f16_stochastic(x, r);
}

// The random bits of an update's rounding: (seed, step) then (the element's old stored bits, its index, the fp32
// result's bits).
SPARTA_HD uint64_t step_stream(uint64_t seed, int32_t step) {
  return hash_mix(seed ^ 0x2545F4914F6CDD1Dull, uint64_t(uint32_t(step)));
}
SPARTA_HD uint64_t rounding_bits(uint64_t step_stream, uint32_t elem, float result, uint16_t old_bits) {
  return hash_mix(step_stream, (uint64_t(old_bits) << 48) | (uint64_t(elem & 0xffffu) << 32) | float_bits(result));
}

// Element i of values [.., dim] of storage s, as fp32.
SPARTA_HD float load(const void* values, RowStorage s, int64_t i) {
  if (s == RowStorage::fp32) return static_cast<const float*>(values)[i];
  return widen(s, static_cast<const uint16_t*>(values)[i]);
}

// Element i of values of storage s = x, rounded to nearest (a new row's initial value, a loaded row).
SPARTA_HD void store_nearest(void* values, RowStorage s, int64_t i, float x) {
  if (s == RowStorage::fp32) static_cast<float*>(values)[i] = x;
  else static_cast<uint16_t*>(values)[i] = round_nearest(s, x);
}

}  // namespace rowstore
}  // namespace sparta
