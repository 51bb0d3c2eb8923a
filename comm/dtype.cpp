// dtype.cpp: see dtype.h.
#include "dtype.h"

#include <cstring>

#include "check.h"

namespace sparta {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::f32: return 4;
    case DataType::bf16: return 2;
    case DataType::f16: return 2;
    case DataType::i64: return 8;
    case DataType::i32: return 4;
    case DataType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::f32: return "float32";
    case DataType::bf16: return "bfloat16";
    case DataType::f16: return "float16";
    case DataType::i64: return "int64";
    case DataType::i32: return "int32";
    case DataType::u8: return "uint8";
  }
  return "?";
}

DataType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "float") return DataType::f32;
  if (name == "bfloat16" || name == "bf16") return DataType::bf16;
  if (name == "float16" || name == "f16" || name == "fp16" || name == "half") return DataType::f16;
  if (name == "int64" || name == "i64") return DataType::i64;
  if (name == "int32" || name == "i32") return DataType::i32;
  if (name == "uint8" || name == "u8") return DataType::u8;
  throw Error("data type: expected float32, bfloat16, float16, int64, int32 or uint8, found '" + name + "'");
}

uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    // Subnormal half: value / 2^-24 = (1.mant) * 2^(e - 14 + 23) → shift the 24-bit significand right.
    if (e < -10) return static_cast<uint16_t>(sign);
    uint32_t m = mant | 0x800000u;
    int shift = 14 - e;
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is the right answer
  return static_cast<uint16_t>(sign | h);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign ? -v : v;
  }
  uint32_t x = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112u) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace sparta
