// dtype.h: the element types the communicator moves and sums, and host conversions for the 16-bit floats.
//
// Buffers are passed as void* plus a DataType and element counts, like NCCL and MPI do. bf16 and fp16 are
// stored as their 16-bit patterns (uint16_t on the host); their sums on the MPI path are done by user-defined
// MPI operations that widen to float, add, and round to nearest even, as NCCL does per addition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/base/half.h"  // float <-> bf16 / f16 on the host

namespace sparta {

enum class DataType { f32, bf16, f16, i64, i32, u8 };

size_t dtype_size(DataType t);
const char* dtype_name(DataType t);  // "float32", "bfloat16", "float16", "int64", "int32", "uint8"
// Parses the names above (also "f32", "bf16", "f16", "fp16", "i64", "i32", "u8"); throws sparta::Error otherwise.
DataType parse_dtype(const std::string& name);

template <class T>
constexpr DataType dtype_of();
template <>
constexpr DataType dtype_of<float>() { return DataType::f32; }
template <>
constexpr DataType dtype_of<int64_t>() { return DataType::i64; }
template <>
constexpr DataType dtype_of<int32_t>() { return DataType::i32; }
template <>
constexpr DataType dtype_of<uint8_t>() { return DataType::u8; }

}  // namespace sparta
