// route.cpp: CPU reference of route.h, and the backend dispatch.
#include "kernels/route.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "src/base/half.h"
#include "src/base/check.h"

namespace sparta {

// ----------------------------------------------------------------------------
// cpu reference

void route_owner_by_key_cpu(const int64_t* keys, int64_t n, int world, int32_t* part) {
  for (int64_t i = 0; i < n; ++i) part[i] = owner_of_key(keys[i], world);
}

void route_part_by_membership_cpu(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* part) {
  for (int64_t i = 0; i < n; ++i) part[i] = std::binary_search(set, set + m, keys[i]) ? 0 : 1;
}

void route_index_in_set_cpu(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* idx) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* at = std::lower_bound(set, set + m, keys[i]);
    idx[i] = at != set + m && *at == keys[i] ? static_cast<int32_t>(at - set) : -1;
  }
}

void route_part_nonzero_cpu(const int64_t* counts, int64_t n, int32_t* part) {
  for (int64_t i = 0; i < n; ++i) part[i] = counts[i] > 0 ? 0 : 1;
}

void route_bucket_cpu(const int32_t* part, int64_t n, int parts, int64_t* perm, int64_t* counts) {
  std::vector<int64_t> next(size_t(parts) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    SPARTA_ASSERT(part[i] >= 0 && part[i] < parts, "route_bucket: part %d of element %lld outside [0, %d)", part[i],
                  (long long)i, parts);
    ++next[size_t(part[i]) + 1];
  }
  for (int p = 0; p < parts; ++p) counts[p] = next[p + 1];
  for (int p = 0; p < parts; ++p) next[p + 1] += next[p];
  for (int64_t i = 0; i < n; ++i) perm[next[part[i]]++] = i;
}

void route_sort_keys_cpu(const int64_t* keys, int64_t n, int key_bits, int64_t* sorted, int64_t* perm) {
  const uint64_t mask = key_bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << key_bits) - 1;
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  std::stable_sort(perm, perm + n,
                   [&](int64_t a, int64_t b) { return (uint64_t(keys[a]) & mask) < (uint64_t(keys[b]) & mask); });
  for (int64_t j = 0; j < n; ++j) sorted[j] = keys[perm[j]];
}

void route_unique_sorted_cpu(const int64_t* sorted, int64_t n, int64_t* unique, int64_t* runs, int64_t* uid,
                             int64_t* num_unique) {
  int64_t u = -1;
  for (int64_t j = 0; j < n; ++j) {
    if (j == 0 || sorted[j] != sorted[j - 1]) {
      ++u;
      unique[u] = sorted[j];
      runs[u] = j;
    }
    uid[j] = u;
  }
  runs[u + 1] = n;
  *num_unique = u + 1;
}

void route_gather_rows_cpu(const float* src, const int64_t* idx, int64_t n, int dim, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * dim, src + idx[i] * dim, sizeof(float) * dim);
}

void route_scatter_rows_cpu(const float* src, const int64_t* idx, int64_t n, int dim, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + idx[i] * dim, src + i * dim, sizeof(float) * dim);
}

void route_gather_keys_cpu(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[idx[i]];
}

void route_scatter_keys_cpu(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[idx[i]] = src[i];
}

void route_iota_cpu(int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = i;
}

void route_widen_cpu(const int32_t* in, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

void route_lengths_cpu(const int64_t* offsets, int64_t bags, int64_t* lengths) {
  for (int64_t b = 0; b < bags; ++b) lengths[b] = offsets[b + 1] - offsets[b];
}

void route_offsets_from_lengths_cpu(const int64_t* lengths, int64_t n, int64_t* offsets) {
  int64_t sum = 0;
  // lengths may alias offsets + 1: read before writing
  for (int64_t b = 0; b < n; ++b) {
    int64_t len = lengths[b];
    offsets[b] = sum;
    sum += len;
  }
  offsets[n] = sum;
}

void route_key_bags_cpu(const int64_t* offsets, int64_t bags, int64_t base, int64_t* bag_of_key) {
  for (int64_t b = 0; b < bags; ++b)
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bag_of_key[i] = base + b;
}

void route_offsets_from_sorted_bags_cpu(const int64_t* bag_ids, int64_t n, int64_t bags, int64_t* offsets) {
  for (int64_t b = 0; b <= bags; ++b) offsets[b] = std::lower_bound(bag_ids, bag_ids + n, b) - bag_ids;
}

void route_pool_bags_cpu(const int64_t* offsets, const float* vecs, const int64_t* idx, int64_t bags, int dim,
                         Combiner combiner, float* out, const BagLayout& out_layout) {
  for (int64_t b = 0; b < bags; ++b) {
    float* o = out + out_layout.at(b, dim);
    for (int e = 0; e < dim; ++e) o[e] = 0.f;
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
      const float* v = vecs + (idx ? idx[i] : i) * dim;
      for (int e = 0; e < dim; ++e) o[e] += v[e];
    }
    int64_t n = offsets[b + 1] - offsets[b];
    if (combiner == Combiner::mean && n > 0)
      for (int e = 0; e < dim; ++e) o[e] = o[e] / static_cast<float>(n);
  }
}

namespace {
float bag_scale(Combiner combiner, int64_t n) {
  return combiner == Combiner::mean && n > 0 ? 1.0f / static_cast<float>(n) : 1.0f;
}
}  // namespace

void route_scale_bag_grads_cpu(const int64_t* offsets, const float* grad, int64_t bags, int dim, Combiner combiner,
                               float* out) {
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t n = offsets[b + 1] - offsets[b];
    const float s = bag_scale(combiner, n);
    for (int e = 0; e < dim; ++e) {
      float g = grad[b * dim + e];
      out[b * dim + e] = combiner == Combiner::sum ? g : (n > 0 ? g * s : 0.f);
    }
  }
}

void route_divide_by_lengths_cpu(const int64_t* offsets, int64_t bags, int dim, float* x) {
  for (int64_t b = 0; b < bags; ++b) {
    int64_t n = offsets[b + 1] - offsets[b];
    if (n > 0)
      for (int e = 0; e < dim; ++e) x[b * dim + e] = x[b * dim + e] / static_cast<float>(n);
  }
}

void route_select_slot_lengths_cpu(const int64_t* offsets, int64_t batch, int num_slots, const int32_t* slots,
                                   int table_slots, int64_t* lengths) {
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j) {
      int64_t row = s * num_slots + slots[j];
      lengths[s * table_slots + j] = offsets[row + 1] - offsets[row];
    }
}

void route_select_slot_keys_cpu(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                const int32_t* slots, int table_slots, const int64_t* out_offsets, int64_t* out_keys) {
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j) {
      int64_t row = s * num_slots + slots[j];
      int64_t at = out_offsets[s * table_slots + j];
      for (int64_t i = offsets[row]; i < offsets[row + 1]; ++i) out_keys[at++] = keys[i];
    }
}

void route_select_group_keys_cpu(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                 const int32_t* slots, int table_slots, const int64_t* out_offsets,
                                 const int64_t* bases, const int64_t* bounds, int64_t* out_keys,
                                 int64_t* first_bad) {
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j) {
      int64_t row = s * num_slots + slots[j];
      int64_t at = out_offsets[s * table_slots + j];
      for (int64_t i = offsets[row]; i < offsets[row + 1]; ++i) {
        const int64_t k = keys[i];
        if (k < 0 || k >= bounds[j]) *first_bad = std::min(*first_bad, i);
        out_keys[at++] = bases[j] + k;
      }
    }
}

void route_check_offsets_cpu(const int64_t* offsets, int64_t rows, int64_t* first_bad) {
  if (offsets[0] != 0) *first_bad = std::min<int64_t>(*first_bad, 0);
  for (int64_t r = 1; r <= rows; ++r)
    if (offsets[r - 1] > offsets[r]) {
      *first_bad = std::min(*first_bad, r);
      break;
    }
}

void route_to_bf16_cpu(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void route_from_bf16_cpu(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void route_put_slots_cpu(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                         int64_t row_floats, float* out) {
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j)
      std::memcpy(out + s * row_floats + cols[j], pooled + (s * table_slots + j) * dim, sizeof(float) * dim);
}

void route_take_slots_cpu(const float* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                          int64_t row_floats, float* grad_table) {
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j)
      std::memcpy(grad_table + (s * table_slots + j) * dim, grad + s * row_floats + cols[j], sizeof(float) * dim);
}

void route_put_slots_half_cpu(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                              int64_t row_elems, OutputType type, uint16_t* out) {
  const bool f16 = type == OutputType::f16;
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j) {
      const float* src = pooled + (s * table_slots + j) * dim;
      uint16_t* dst = out + s * row_elems + cols[j];
      for (int e = 0; e < dim; ++e) dst[e] = f16 ? float_to_f16(src[e]) : float_to_bf16(src[e]);
    }
}

void route_take_slots_half_cpu(const uint16_t* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                               int64_t row_elems, OutputType type, float* grad_table) {
  const bool f16 = type == OutputType::f16;
  for (int64_t s = 0; s < batch; ++s)
    for (int j = 0; j < table_slots; ++j) {
      const uint16_t* src = grad + s * row_elems + cols[j];
      float* dst = grad_table + (s * table_slots + j) * dim;
      for (int e = 0; e < dim; ++e) dst[e] = f16 ? f16_to_float(src[e]) : bf16_to_float(src[e]);
    }
}

// ----------------------------------------------------------------------------
// dispatch

#if SPARTA_CUDA
#define ROUTE_DISPATCH(name, cpu_call, cuda_call) \
  do {                                            \
    if (!dev.is_cuda()) return cpu_call;          \
    return cuda_call;                             \
  } while (0)
#else
namespace {
[[noreturn]] void no_cuda(const Device& dev, const char* what) {
  SPARTA_FATAL("%s on %s in a CUDA=0 build", what, dev.name().c_str());
}
}  // namespace
#define ROUTE_DISPATCH(name, cpu_call, cuda_call) \
  do {                                            \
    (void)stream;                                 \
    if (!dev.is_cuda()) return cpu_call;          \
    no_cuda(dev, name);                           \
  } while (0)
#endif

void route_owner_by_key(const Device& dev, const int64_t* keys, int64_t n, int world, int32_t* part, Stream stream) {
  SPARTA_ASSERT(world >= 1, "route_owner_by_key: world %d", world);
  if (n == 0) return;
  ROUTE_DISPATCH("route_owner_by_key", route_owner_by_key_cpu(keys, n, world, part),
                 route_owner_by_key_cuda(keys, n, world, part, stream));
}

void route_part_by_membership(const Device& dev, const int64_t* keys, int64_t n, const int64_t* set, int64_t m,
                              int32_t* part, Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_part_by_membership", route_part_by_membership_cpu(keys, n, set, m, part),
                 route_part_by_membership_cuda(keys, n, set, m, part, stream));
}

void route_index_in_set(const Device& dev, const int64_t* keys, int64_t n, const int64_t* set, int64_t m,
                        int32_t* idx, Stream stream) {
  SPARTA_ASSERT(m < (int64_t(1) << 31), "route_index_in_set: a set of %lld keys", (long long)m);
  if (n == 0) return;
  ROUTE_DISPATCH("route_index_in_set", route_index_in_set_cpu(keys, n, set, m, idx),
                 route_index_in_set_cuda(keys, n, set, m, idx, stream));
}

void route_part_nonzero(const Device& dev, const int64_t* counts, int64_t n, int32_t* part, Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_part_nonzero", route_part_nonzero_cpu(counts, n, part),
                 route_part_nonzero_cuda(counts, n, part, stream));
}

void route_bucket(const Device& dev, const int32_t* part, int64_t n, int parts, int64_t* perm, int64_t* counts,
                  RouteScratch& scratch, Stream stream) {
  SPARTA_ASSERT(parts >= 1, "route_bucket: %d parts", parts);
  (void)scratch;  // the cpu reference needs none
  ROUTE_DISPATCH("route_bucket", route_bucket_cpu(part, n, parts, perm, counts),
                 route_bucket_cuda(dev, part, n, parts, perm, counts, scratch, stream));
}

void route_sort_keys(const Device& dev, const int64_t* keys, int64_t n, int key_bits, int64_t* sorted,
                     int64_t* perm, RouteScratch& scratch, Stream stream) {
  SPARTA_REQUIRE(key_bits >= 1 && key_bits <= 64, "route_sort_keys: key_bits must be in [1, 64], found %d",
                 key_bits);
  if (n == 0) return;
  (void)scratch;
  ROUTE_DISPATCH("route_sort_keys", route_sort_keys_cpu(keys, n, key_bits, sorted, perm),
                 route_sort_keys_cuda(dev, keys, n, key_bits, sorted, perm, scratch, stream));
}

int route_key_bits(int64_t bound) {
  if (bound <= 1) return bound == 1 ? 1 : 64;
  int bits = 0;
  while (bits < 63 && (int64_t(1) << bits) < bound) ++bits;
  return bits;
}

void route_unique_sorted(const Device& dev, const int64_t* sorted, int64_t n, int64_t* unique, int64_t* runs,
                         int64_t* uid, int64_t* num_unique, RouteScratch& scratch, Stream stream) {
  (void)scratch;
  ROUTE_DISPATCH("route_unique_sorted", route_unique_sorted_cpu(sorted, n, unique, runs, uid, num_unique),
                 route_unique_sorted_cuda(dev, sorted, n, unique, runs, uid, num_unique, scratch, stream));
}

void route_gather_rows(const Device& dev, const float* src, const int64_t* idx, int64_t n, int dim, float* dst,
                       Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_gather_rows", route_gather_rows_cpu(src, idx, n, dim, dst),
                 route_gather_rows_cuda(src, idx, n, dim, dst, stream));
}

void route_scatter_rows(const Device& dev, const float* src, const int64_t* idx, int64_t n, int dim, float* dst,
                        Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_scatter_rows", route_scatter_rows_cpu(src, idx, n, dim, dst),
                 route_scatter_rows_cuda(src, idx, n, dim, dst, stream));
}

void route_gather_keys(const Device& dev, const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst,
                       Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_gather_keys", route_gather_keys_cpu(src, idx, n, dst),
                 route_gather_keys_cuda(src, idx, n, dst, stream));
}

void route_scatter_keys(const Device& dev, const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst,
                        Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_scatter_keys", route_scatter_keys_cpu(src, idx, n, dst),
                 route_scatter_keys_cuda(src, idx, n, dst, stream));
}

void route_iota(const Device& dev, int64_t n, int64_t* out, Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_iota", route_iota_cpu(n, out), route_iota_cuda(n, out, stream));
}

void route_widen(const Device& dev, const int32_t* in, int64_t n, int64_t* out, Stream stream) {
  if (n == 0) return;
  ROUTE_DISPATCH("route_widen", route_widen_cpu(in, n, out), route_widen_cuda(in, n, out, stream));
}

void route_lengths(const Device& dev, const int64_t* offsets, int64_t bags, int64_t* lengths, Stream stream) {
  if (bags == 0) return;
  ROUTE_DISPATCH("route_lengths", route_lengths_cpu(offsets, bags, lengths),
                 route_lengths_cuda(offsets, bags, lengths, stream));
}

void route_offsets_from_lengths(const Device& dev, const int64_t* lengths, int64_t n, int64_t* offsets,
                                RouteScratch& scratch, Stream stream) {
  (void)scratch;
  ROUTE_DISPATCH("route_offsets_from_lengths", route_offsets_from_lengths_cpu(lengths, n, offsets),
                 route_offsets_from_lengths_cuda(dev, lengths, n, offsets, scratch, stream));
}

void route_key_bags(const Device& dev, const int64_t* offsets, int64_t bags, int64_t base, int64_t* bag_of_key,
                    Stream stream) {
  if (bags == 0) return;
  ROUTE_DISPATCH("route_key_bags", route_key_bags_cpu(offsets, bags, base, bag_of_key),
                 route_key_bags_cuda(offsets, bags, base, bag_of_key, stream));
}

void route_offsets_from_sorted_bags(const Device& dev, const int64_t* bag_ids, int64_t n, int64_t bags,
                                    int64_t* offsets, Stream stream) {
  ROUTE_DISPATCH("route_offsets_from_sorted_bags", route_offsets_from_sorted_bags_cpu(bag_ids, n, bags, offsets),
                 route_offsets_from_sorted_bags_cuda(bag_ids, n, bags, offsets, stream));
}

void route_pool_bags(const Device& dev, const int64_t* offsets, const float* vecs, const int64_t* idx, int64_t bags,
                     int dim, Combiner combiner, float* out, Stream stream, const BagLayout& out_layout) {
  check_bag_layout(out_layout, "route_pool_bags");
  if (bags == 0) return;
  ROUTE_DISPATCH("route_pool_bags", route_pool_bags_cpu(offsets, vecs, idx, bags, dim, combiner, out, out_layout),
                 route_pool_bags_cuda(offsets, vecs, idx, bags, dim, combiner, out, out_layout, stream));
}

void route_scale_bag_grads(const Device& dev, const int64_t* offsets, const float* grad, int64_t bags, int dim,
                           Combiner combiner, float* out, Stream stream) {
  if (bags == 0) return;
  ROUTE_DISPATCH("route_scale_bag_grads", route_scale_bag_grads_cpu(offsets, grad, bags, dim, combiner, out),
                 route_scale_bag_grads_cuda(offsets, grad, bags, dim, combiner, out, stream));
}

void route_divide_by_lengths(const Device& dev, const int64_t* offsets, int64_t bags, int dim, float* x,
                             Stream stream) {
  if (bags == 0) return;
  ROUTE_DISPATCH("route_divide_by_lengths", route_divide_by_lengths_cpu(offsets, bags, dim, x),
                 route_divide_by_lengths_cuda(offsets, bags, dim, x, stream));
}

void route_select_slot_offsets(const Device& dev, const int64_t* offsets, int64_t batch, int num_slots,
                               const int32_t* slots, int table_slots, int64_t* out_offsets, RouteScratch& scratch,
                                   Stream stream) {
  const int64_t bags = batch * table_slots;
  if (!dev.is_cuda()) {
    route_select_slot_lengths_cpu(offsets, batch, num_slots, slots, table_slots, out_offsets + 1);
    return route_offsets_from_lengths_cpu(out_offsets + 1, bags, out_offsets);
  }
#if SPARTA_CUDA
  if (bags > 0)
    route_select_slot_lengths_cuda(offsets, batch, num_slots, slots, table_slots, out_offsets + 1, stream);
  route_offsets_from_lengths_cuda(dev, out_offsets + 1, bags, out_offsets, scratch, stream);
#else
  (void)scratch, (void)stream;
  no_cuda(dev, "route_select_slot_offsets");
#endif
}

void route_select_slot_keys(const Device& dev, const int64_t* offsets, const int64_t* keys, int64_t batch,
                            int num_slots, const int32_t* slots, int table_slots, const int64_t* out_offsets,
                            int64_t* out_keys, Stream stream) {
  if (batch * table_slots == 0) return;
  ROUTE_DISPATCH(
      "route_select_slot_keys",
      route_select_slot_keys_cpu(offsets, keys, batch, num_slots, slots, table_slots, out_offsets, out_keys),
      route_select_slot_keys_cuda(offsets, keys, batch, num_slots, slots, table_slots, out_offsets, out_keys,
                                  stream));
}

void route_select_group_keys(const Device& dev, const int64_t* offsets, const int64_t* keys, int64_t batch,
                             int num_slots, const int32_t* slots, int table_slots, const int64_t* out_offsets,
                             const int64_t* bases, const int64_t* bounds, int64_t* out_keys, int64_t* first_bad,
                             Stream stream) {
  if (batch * table_slots == 0) return;
  ROUTE_DISPATCH("route_select_group_keys",
                 route_select_group_keys_cpu(offsets, keys, batch, num_slots, slots, table_slots, out_offsets,
                                             bases, bounds, out_keys, first_bad),
                 route_select_group_keys_cuda(offsets, keys, batch, num_slots, slots, table_slots, out_offsets,
                                              bases, bounds, out_keys, first_bad, stream));
}

void route_check_offsets(const Device& dev, const int64_t* offsets, int64_t rows, int64_t* first_bad, Stream stream) {
  ROUTE_DISPATCH("route_check_offsets", route_check_offsets_cpu(offsets, rows, first_bad),
                 route_check_offsets_cuda(offsets, rows, first_bad, stream));
}

void route_to_bf16(const Device& dev, const float* in, int64_t n, uint16_t* out, Stream stream) {
  SPARTA_ASSERT(n >= 0, "route_to_bf16: n %lld", (long long)n);
  if (n == 0) return;
  ROUTE_DISPATCH("route_to_bf16", route_to_bf16_cpu(in, n, out), route_to_bf16_cuda(in, n, out, stream));
}

void route_from_bf16(const Device& dev, const uint16_t* in, int64_t n, float* out, Stream stream) {
  SPARTA_ASSERT(n >= 0, "route_from_bf16: n %lld", (long long)n);
  if (n == 0) return;
  ROUTE_DISPATCH("route_from_bf16", route_from_bf16_cpu(in, n, out), route_from_bf16_cuda(in, n, out, stream));
}

void route_put_slots(const Device& dev, const float* pooled, int64_t batch, int table_slots, int dim,
                     const int32_t* cols, int64_t row_floats, float* out, Stream stream) {
  if (batch * table_slots == 0) return;
  ROUTE_DISPATCH("route_put_slots", route_put_slots_cpu(pooled, batch, table_slots, dim, cols, row_floats, out),
                 route_put_slots_cuda(pooled, batch, table_slots, dim, cols, row_floats, out, stream));
}

void route_take_slots(const Device& dev, const float* grad, int64_t batch, int table_slots, int dim,
                      const int32_t* cols, int64_t row_floats, float* grad_table, Stream stream) {
  if (batch * table_slots == 0) return;
  ROUTE_DISPATCH("route_take_slots",
                 route_take_slots_cpu(grad, batch, table_slots, dim, cols, row_floats, grad_table),
                 route_take_slots_cuda(grad, batch, table_slots, dim, cols, row_floats, grad_table, stream));
}

void route_put_slots_half(const Device& dev, const float* pooled, int64_t batch, int table_slots, int dim,
                          const int32_t* cols, int64_t row_elems, OutputType type, uint16_t* out, Stream stream) {
  SPARTA_ASSERT(type == OutputType::bf16 || type == OutputType::f16, "route_put_slots_half: output type %d",
                int(type));
  if (batch * table_slots == 0) return;
  ROUTE_DISPATCH("route_put_slots_half",
                 route_put_slots_half_cpu(pooled, batch, table_slots, dim, cols, row_elems, type, out),
                 route_put_slots_half_cuda(pooled, batch, table_slots, dim, cols, row_elems, type, out, stream));
}

void route_take_slots_half(const Device& dev, const uint16_t* grad, int64_t batch, int table_slots, int dim,
                           const int32_t* cols, int64_t row_elems, OutputType type, float* grad_table,
                           Stream stream) {
  SPARTA_ASSERT(type == OutputType::bf16 || type == OutputType::f16, "route_take_slots_half: gradient type %d",
                int(type));
  if (batch * table_slots == 0) return;
  ROUTE_DISPATCH("route_take_slots_half",
                 route_take_slots_half_cpu(grad, batch, table_slots, dim, cols, row_elems, type, grad_table),
                 route_take_slots_half_cuda(grad, batch, table_slots, dim, cols, row_elems, type, grad_table, stream));
}

}  // namespace sparta
