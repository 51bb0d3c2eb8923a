// row_traffic.cpp: CPU version of row_traffic.h (keys one by one, in key order), the checks and the backend
// dispatch.
#include "experiments/lab/row_traffic.h"

#include "src/base/check.h"

namespace sparta {

namespace {

void check_rows(const char* what, int64_t n, const void* rows, const void* values, int64_t capacity_rows, int dim) {
  SPARTA_REQUIRE(dim >= 1 && dim <= 256, "%s: dim must be in [1, 256], found %d", what, dim);
  SPARTA_REQUIRE(capacity_rows >= 0, "%s: capacity_rows must be >= 0, found %lld", what,
                 static_cast<long long>(capacity_rows));
  SPARTA_REQUIRE(n >= 0, "%s: keys (bags) must be >= 0, found %lld", what, static_cast<long long>(n));
  SPARTA_REQUIRE(n == 0 || rows != nullptr, "%s: %lld keys (bags) but no rows given", what,
                 static_cast<long long>(n));
  SPARTA_REQUIRE(n == 0 || values != nullptr, "%s: no values given", what);
}

}  // namespace

void row_traffic_gather_cpu(const int64_t* offsets, const int64_t* rows, int64_t bags, const float* values,
                            int64_t capacity_rows, int dim, float* out) {
  SPARTA_REQUIRE(offsets[0] == 0, "row traffic gather: offsets must start at 0, found %lld",
                 static_cast<long long>(offsets[0]));
  for (int64_t b = 0; b < bags; ++b)
    SPARTA_REQUIRE(offsets[b] <= offsets[b + 1], "row traffic gather: offsets decrease at bag %lld: %lld then %lld",
                   static_cast<long long>(b), static_cast<long long>(offsets[b]),
                   static_cast<long long>(offsets[b + 1]));
  for (int64_t b = 0; b < bags; ++b) {
    float* o = out + b * dim;
    for (int d = 0; d < dim; ++d) o[d] = 0.f;
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
      const int64_t r = rows[i];
      if (r < 0 || r >= capacity_rows) continue;
      for (int d = 0; d < dim; ++d) o[d] += values[r * dim + d];
    }
  }
}

void row_traffic_add_cpu(const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows, int dim, float add) {
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= capacity_rows) continue;
    for (int d = 0; d < dim; ++d) values[r * dim + d] += add;
  }
}

void row_traffic_gather(const Device& dev, const int64_t* offsets, const int64_t* rows, int64_t bags,
                        const float* values, int64_t capacity_rows, int dim, float* out, Stream stream) {
  const char* what = "row traffic gather";
  check_rows(what, bags, rows, values, capacity_rows, dim);
  SPARTA_REQUIRE(offsets != nullptr, "%s: no offsets given", what);
  SPARTA_REQUIRE(bags == 0 || out != nullptr, "%s: %lld bags but no output given", what,
                 static_cast<long long>(bags));
  if (!dev.is_cuda()) return row_traffic_gather_cpu(offsets, rows, bags, values, capacity_rows, dim, out);
#if SPARTA_CUDA
  row_traffic_gather_cuda(offsets, rows, bags, values, capacity_rows, dim, out, stream);
#else
  (void)stream;
  SPARTA_FATAL("row_traffic_gather on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void row_traffic_read_write(const Device& dev, const int64_t* rows, int64_t nnz, float* values,
                            int64_t capacity_rows, int dim, float add, Stream stream) {
  check_rows("row traffic read_write", nnz, rows, values, capacity_rows, dim);
  if (!dev.is_cuda()) return row_traffic_add_cpu(rows, nnz, values, capacity_rows, dim, add);
#if SPARTA_CUDA
  row_traffic_read_write_cuda(rows, nnz, values, capacity_rows, dim, add, stream);
#else
  (void)stream;
  SPARTA_FATAL("row_traffic_read_write on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void row_traffic_atomic(const Device& dev, const int64_t* rows, int64_t nnz, float* values, int64_t capacity_rows,
                        int dim, float add, Stream stream) {
  check_rows("row traffic atomic", nnz, rows, values, capacity_rows, dim);
  if (!dev.is_cuda()) return row_traffic_add_cpu(rows, nnz, values, capacity_rows, dim, add);
#if SPARTA_CUDA
  row_traffic_atomic_cuda(rows, nnz, values, capacity_rows, dim, add, stream);
#else
  (void)stream;
  SPARTA_FATAL("row_traffic_atomic on %s in a CUDA=0 build", dev.name().c_str());
#endif
}

}  // namespace sparta
