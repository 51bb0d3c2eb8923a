// dtype.cpp: see dtype.h.
#include "comm/dtype.h"

#include <cstring>

#include "src/base/check.h"

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

}  // namespace sparta
