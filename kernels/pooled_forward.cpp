// pooled_forward.cpp: CPU reference of pooled_forward.h (one key at a time through the CPU hash table),
// half-precision conversions, and the backend dispatch.
#include "kernels/pooled_forward.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "src/base/check.h"
#include "kernels/row_storage.h"

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
      const RowStorage st = a.rows_init.key_init.storage;
      if (st == RowStorage::fp32) {
        const float* v = a.rows_init.values + row * dim;
        for (int e = 0; e < dim; ++e) acc[e] += v[e];
      } else {
        for (int e = 0; e < dim; ++e) acc[e] += rowstore::load(a.rows_init.values, st, row * dim + e);
      }
    }
    int64_t n = end - begin;
    if (a.combiner == Combiner::mean && n > 0)
      for (int e = 0; e < dim; ++e) acc[e] = acc[e] / static_cast<float>(n);
    const int64_t at = a.out_layout.at(b, dim);
    switch (a.out_type) {
      case OutputType::f32: std::memcpy(static_cast<float*>(a.out) + at, acc.data(), sizeof(float) * dim); break;
      case OutputType::bf16:
        for (int e = 0; e < dim; ++e) static_cast<uint16_t*>(a.out)[at + e] = float_to_bf16(acc[e]);
        break;
      case OutputType::f16:
        for (int e = 0; e < dim; ++e) static_cast<uint16_t*>(a.out)[at + e] = float_to_f16(acc[e]);
        break;
    }
  }
}

namespace {
void check_args(const ForwardArgs& a, const char* what) {
  SPARTA_REQUIRE(a.rows_init.dim >= 1 && a.rows_init.dim <= 256, "%s: dim must be in 1..256, found %d", what,
                 a.rows_init.dim);
  SPARTA_REQUIRE(a.bags >= 0, "%s: bags must be >= 0, found %lld", what, (long long)a.bags);
  SPARTA_REQUIRE(a.bags == 0 || (a.out && a.rows_init.values && (a.table.slots || a.table.direct_stride > 0)),
                 "%s: null output, values or table", what);
  check_bag_layout(a.out_layout, what);
}

void dispatch(const Device& dev, const ForwardArgs& a, const char* what, Stream stream) {
  check_args(a, what);
  if (!dev.is_cuda()) return embedding_forward_cpu(a);
#if SPARTA_CUDA
  embedding_forward_cuda(a, stream);
#else
  (void)stream;
  SPARTA_FATAL("%s on %s in a CUDA=0 build", what, dev.name().c_str());
#endif
}
}  // namespace

void pooled_forward(const Device& dev, const ForwardArgs& a, Stream stream) {
  SPARTA_REQUIRE(a.bags == 0 || a.offsets, "pooled_forward: offsets are null");
  dispatch(dev, a, "pooled_forward", stream);
}

void unpooled_forward(const Device& dev, const ForwardArgs& a, Stream stream) {
  ForwardArgs u = a;
  u.offsets = nullptr;
  u.combiner = Combiner::sum;
  u.out_layout = BagLayout{};  // one vector per key, one after another
  dispatch(dev, u, "unpooled_forward", stream);
}

}  // namespace sparta
