// half16.cuh: the device side of the GEMMs' 16-bit operand types (dense_linear.h's GemmType::bf16 and ::f16) for
// the kernels that write 16-bit copies: Bf16 and F16 round a float to nearest even and give the bits
// (src/base/half.h's formats: the host reference gives the same bits for every non-NaN input; fp16 overflows
// to ±inf as IEEE does), one value or a pair packed into 32 bits (the lower address in the low half); value(bits)
// widens back (exact).
// with_half(t, f) calls f(Bf16{}) or f(F16{}): launchers pick the kernel template's instance at run time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/dense_linear.h"

namespace sparta {
namespace dense {

struct Bf16 {
  static __device__ __forceinline__ uint16_t bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
  static __device__ __forceinline__ float value(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
  static __device__ __forceinline__ unsigned pair(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
};

struct F16 {
  static __device__ __forceinline__ uint16_t bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
  static __device__ __forceinline__ float value(uint16_t b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ unsigned pair(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
};

// t is bf16 or f16 (the callers check it).
template <class F>
void with_half(GemmType t, F&& f) {
  if (t == GemmType::f16)
    f(F16{});
  else
    f(Bf16{});
}

}  // namespace dense
}  // namespace sparta
