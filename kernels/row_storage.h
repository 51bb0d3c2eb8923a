// row_storage.h: reading and writing a table's values in its RowStorage (kernels/embedding_types.h), the same
// bits on the host (the cpu reference) and on the GPU.
//
// A 16-bit element widens exactly to fp32. A new row's values round to nearest even from key_init's fp32 value
// (src/base/half.h's bits). Every update rounds its fp32 result stochastically: to the upper neighbour (in
// magnitude) with probability equal to the distance from the lower one over the gap, so the expected stored value
// is the fp32 result and small steps are not lost. The random bits are 32 bits of a hash of (seed, step, element,
// the fp32 result's bits, the element's stored bits before the update): a pure function of what every copy of a row
// holds and receives, so a rerun reproduces bit for bit and every copy of a row (hybrid's hot copies, replicated's
// replicas, any placement and rank count) rounds alike, without the row's key (an update knows rows, not keys).
// The hash is one 32-bit multiply-add of its inputs into a 32-bit mixer (a few integer operations an element: the
// update of a 16-bit row is bound by them, not by its bytes). bf16 takes 16 of the bits; fp16 takes as many as
// its rounding drops (13 for normal halves, more below), the 32 bits as the top ones beyond 32 (a bias under
// 2^-32 of the gap).
// Infinities and NaN are rounded to nearest; fp16 magnitudes >= 65536 give infinity, and fp16 magnitudes below
// 2^-64 round to zero.
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
SPARTA_HD uint16_t bf16_stochastic(float x, uint32_t r) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return round_nearest(RowStorage::bf16, x);
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// fp32 to fp16, stochastically: the magnitude's significand m (24 bits) keeps m >> shift, and rounds up when a
// random number of `shift` bits is below the dropped bits (probability dropped / 2^shift): r's low `shift` bits,
// or for shift > 32, r followed by shift - 32 zero bits. shift is 13 for normal halves and grows below them
// (subnormals).
SPARTA_HD uint16_t f16_stochastic(float x, uint32_t r) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
  if (exp == 0xffu) return round_nearest(RowStorage::fp16, x);
  const int e = int(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e > 0) {  // normal: a carry out of the significand into the exponent is the right answer (up to infinity)
    const uint32_t up = (r & 0x1fffu) < (mant & 0x1fffu) ? 1u : 0u;
    return static_cast<uint16_t>(sign | (((uint32_t(e) << 10) | (mant >> 13)) + up));
  }
  const int shift = 14 - e;  // a subnormal half: value / 2^-24 = m >> (14 - e)
  if (shift > 63) return static_cast<uint16_t>(sign);
  const uint64_t m = uint64_t(exp == 0 ? mant : (mant | 0x800000u));
  const uint64_t low = (uint64_t(1) << shift) - 1;
  const uint64_t rand = shift <= 32 ? (uint64_t(r) & low) : (uint64_t(r) << (shift - 32));
  const uint32_t up = rand < (m & low) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (uint32_t(m >> shift) + up));
}

SPARTA_HD uint16_t round_stochastic(RowStorage s, float x, uint32_t r) {
  return s == RowStorage::bf16 ? bf16_stochastic(x, r) : f16_stochastic(x, r);
}

// The random bits of an update's rounding: (seed, step) hashed once a step into a stream, then for each element
//   x = (result's bits ^ stream's low 32) + ((old_bits << 16 | (elem & 0xffff)) ^ stream's high 32) * 0x9E3779B9
// (32-bit arithmetic) through mix32.
SPARTA_HD uint64_t step_stream(uint64_t seed, int32_t step) {
  return hash_mix(seed ^ 0x2545F4914F6CDD1Dull, uint64_t(uint32_t(step)));
}
// A bijection on 32 bits with good avalanche (two multiplies, three xor-shifts: "lowbias32").
SPARTA_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
SPARTA_HD uint32_t rounding_bits(uint64_t step_stream, uint32_t elem, float result, uint16_t old_bits) {
  const uint32_t lo = float_bits(result) ^ uint32_t(step_stream);
  const uint32_t hi = ((uint32_t(old_bits) << 16) | (elem & 0xffffu)) ^ uint32_t(step_stream >> 32);
  return mix32(lo + hi * 0x9E3779B9u);
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
