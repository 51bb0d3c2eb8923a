// route.cu: CUDA version of route.h. Element-wise kernels over keys or rows (grid-stride, 64-bit indices), one
// thread per (bag, element) for pooling so a bag's sum runs in key order exactly as the cpu reference does, and
// CUB for the two passes that need a global order: the stable bucketing (a radix sort of (part, index) pairs on
// the bits of the part count, stable) and the scans from lengths to offsets.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "src/base/check.h"
#include "kernels/half16.cuh"
#include "kernels/route.h"

namespace sparta {

namespace {

constexpr int kBlock = 256;

int grid_for(int64_t n) {
  int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);  // grid-stride beyond
}

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// ----------------------------------------------------------------------------
// kernels

__global__ void __launch_bounds__(kBlock) owner_by_key_kernel(const int64_t* keys, int64_t n, int world,
                                                              int32_t* part) {
  GRID_STRIDE(i, n) part[i] = owner_of_key(keys[i], world);
}

__global__ void __launch_bounds__(kBlock) membership_kernel(const int64_t* keys, int64_t n, const int64_t* set,
                                                            int64_t m, int32_t* part) {
  GRID_STRIDE(i, n) {
    int64_t k = keys[i], lo = 0, hi = m;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (set[mid] < k) lo = mid + 1; else hi = mid;
    }
    part[i] = (lo < m && set[lo] == k) ? 0 : 1;
  }
}

__global__ void __launch_bounds__(kBlock) index_in_set_kernel(const int64_t* keys, int64_t n, const int64_t* set,
                                                              int64_t m, int32_t* idx) {
  GRID_STRIDE(i, n) {
    int64_t k = keys[i], lo = 0, hi = m;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (set[mid] < k) lo = mid + 1; else hi = mid;
    }
    idx[i] = (lo < m && set[lo] == k) ? static_cast<int32_t>(lo) : -1;
  }
}

__global__ void __launch_bounds__(kBlock) part_nonzero_kernel(const int64_t* counts, int64_t n, int32_t* part) {
  GRID_STRIDE(i, n) part[i] = counts[i] > 0 ? 0 : 1;
}

__global__ void __launch_bounds__(kBlock) iota_kernel(int64_t n, int64_t* out) { GRID_STRIDE(i, n) out[i] = i; }

__global__ void __launch_bounds__(kBlock) widen_kernel(const int32_t* in, int64_t n, int64_t* out) {
  GRID_STRIDE(i, n) out[i] = in[i];
}

// counts[p] = elements of part p among the sorted parts: the distance between the first positions of p and p+1.
__global__ void __launch_bounds__(kBlock) bucket_counts_kernel(const int32_t* sorted, int64_t n, int parts,
                                                               int64_t* counts) {
  GRID_STRIDE(p, int64_t(parts)) {
    int64_t lo = 0, hi = n;  // first position with part >= p
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < p) lo = mid + 1; else hi = mid;
    }
    int64_t a = lo;
    hi = n;  // first position with part >= p + 1
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < p + 1) lo = mid + 1; else hi = mid;
    }
    counts[p] = lo - a;
  }
}

__global__ void __launch_bounds__(kBlock) head_flags_kernel(const int64_t* sorted, int64_t n, int64_t* flags) {
  GRID_STRIDE(j, n) flags[j] = (j == 0 || sorted[j] != sorted[j - 1]) ? 1 : 0;
}

// scan: the inclusive sum of the head flags, turned into uid in place.
__global__ void __launch_bounds__(kBlock) unique_runs_kernel(const int64_t* sorted, int64_t n, int64_t* scan,
                                                             int64_t* unique, int64_t* runs, int64_t* num_unique) {
  GRID_STRIDE(j, n) {
    int64_t u = scan[j] - 1;
    scan[j] = u;
    if (j == 0 || sorted[j] != sorted[j - 1]) unique[u] = sorted[j], runs[u] = j;
    if (j == n - 1) runs[u + 1] = n, num_unique[0] = u + 1;
  }
}

__global__ void __launch_bounds__(kBlock) gather_rows_kernel(const float* src, const int64_t* idx, int64_t n, int dim,
                                                             float* dst) {
  GRID_STRIDE(t, n * dim) {
    int64_t i = t / dim;
    int e = static_cast<int>(t - i * dim);
    dst[t] = src[idx[i] * dim + e];
  }
}

__global__ void __launch_bounds__(kBlock) scatter_rows_kernel(const float* src, const int64_t* idx, int64_t n,
                                                              int dim, float* dst) {
  GRID_STRIDE(t, n * dim) {
    int64_t i = t / dim;
    int e = static_cast<int>(t - i * dim);
    dst[idx[i] * dim + e] = src[t];
  }
}

// Four elements of a row a thread, for dims that are multiples of 4 with 16-byte aligned rows (the launchers
// check): 16-byte accesses and 32-bit index math (n * dim / 4 < 2^31) instead of a 64-bit division an element.
__global__ void __launch_bounds__(kBlock) gather_rows4_kernel(const float4* src, const int64_t* idx, uint32_t n4,
                                                              uint32_t dim4, float4* dst) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const uint32_t i = t / dim4, e = t - i * dim4;
    dst[t] = src[idx[i] * dim4 + e];
  }
}

__global__ void __launch_bounds__(kBlock) scatter_rows4_kernel(const float4* src, const int64_t* idx, uint32_t n4,
                                                               uint32_t dim4, float4* dst) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const uint32_t i = t / dim4, e = t - i * dim4;
    dst[idx[i] * dim4 + e] = src[t];
  }
}

__global__ void __launch_bounds__(kBlock) gather_keys_kernel(const int64_t* src, const int64_t* idx, int64_t n,
                                                             int64_t* dst) {
  GRID_STRIDE(i, n) dst[i] = src[idx[i]];
}

__global__ void __launch_bounds__(kBlock) scatter_keys_kernel(const int64_t* src, const int64_t* idx, int64_t n,
                                                              int64_t* dst) {
  GRID_STRIDE(i, n) dst[idx[i]] = src[i];
}

__global__ void __launch_bounds__(kBlock) lengths_kernel(const int64_t* offsets, int64_t bags, int64_t* lengths) {
  GRID_STRIDE(b, bags) lengths[b] = offsets[b + 1] - offsets[b];
}

__global__ void __launch_bounds__(kBlock) key_bags_kernel(const int64_t* offsets, int64_t bags, int64_t base,
                                                          int64_t* bag_of_key) {
  GRID_STRIDE(b, bags) {
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bag_of_key[i] = base + b;
  }
}

__global__ void __launch_bounds__(kBlock) offsets_from_sorted_bags_kernel(const int64_t* bag_ids, int64_t n,
                                                                          int64_t bags, int64_t* offsets) {
  GRID_STRIDE(b, bags + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (bag_ids[mid] < b) lo = mid + 1; else hi = mid;
    }
    offsets[b] = lo;
  }
}

// One thread per (bag, element): the bag's keys are added in order from 0.0f, as the cpu reference does.
__global__ void __launch_bounds__(kBlock) pool_bags_kernel(const int64_t* offsets, const float* vecs,
                                                           const int64_t* idx, int64_t bags, int dim, bool mean,
                                                           float* out, BagLayout layout) {
  GRID_STRIDE(t, bags * dim) {
    int64_t b = t / dim;
    int e = static_cast<int>(t - b * dim);
    float acc = 0.f;
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) acc = __fadd_rn(acc, vecs[(idx ? idx[i] : i) * dim + e]);
    int64_t n = offsets[b + 1] - offsets[b];
    if (mean && n > 0) acc = __fdiv_rn(acc, static_cast<float>(n));
    out[layout.at(b, dim) + e] = acc;
  }
}

// The same, four elements of a bag a thread (each element still summed in key order from 0.0f: the same bits).
__global__ void __launch_bounds__(kBlock) pool_bags4_kernel(const int64_t* offsets, const float4* vecs,
                                                            const int64_t* idx, uint32_t n4, uint32_t dim4, bool mean,
                                                            float4* out, BagLayout layout) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const uint32_t b = t / dim4, e = t - b * dim4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
      const float4 v = vecs[(idx ? idx[i] : i) * dim4 + e];
      acc.x = __fadd_rn(acc.x, v.x), acc.y = __fadd_rn(acc.y, v.y), acc.z = __fadd_rn(acc.z, v.z),
      acc.w = __fadd_rn(acc.w, v.w);
    }
    const int64_t n = offsets[b + 1] - offsets[b];
    if (mean && n > 0) {
      const float f = static_cast<float>(n);
      acc.x = __fdiv_rn(acc.x, f), acc.y = __fdiv_rn(acc.y, f), acc.z = __fdiv_rn(acc.z, f),
      acc.w = __fdiv_rn(acc.w, f);
    }
    out[layout.contiguous() ? int64_t(t) : (layout.at(b, int(dim4) * 4) >> 2) + e] = acc;
  }
}

__device__ __forceinline__ float bag_scale(bool mean, int64_t n) {
  return mean && n > 0 ? __fdiv_rn(1.0f, static_cast<float>(n)) : 1.0f;
}

__global__ void __launch_bounds__(kBlock) scale_bag_grads_kernel(const int64_t* offsets, const float* grad,
                                                                 int64_t bags, int dim, bool mean, float* out) {
  GRID_STRIDE(t, bags * dim) {
    int64_t b = t / dim;
    float g = grad[t];
    if (mean) {
      int64_t n = offsets[b + 1] - offsets[b];
      g = n > 0 ? __fmul_rn(g, bag_scale(true, n)) : 0.f;
    }
    out[t] = g;
  }
}

__global__ void __launch_bounds__(kBlock) divide_by_lengths_kernel(const int64_t* offsets, int64_t bags, int dim,
                                                                   float* x) {
  GRID_STRIDE(t, bags * dim) {
    int64_t b = t / dim;
    int64_t n = offsets[b + 1] - offsets[b];
    if (n > 0) x[t] = __fdiv_rn(x[t], static_cast<float>(n));
  }
}

__global__ void __launch_bounds__(kBlock) select_slot_lengths_kernel(const int64_t* offsets, int64_t batch,
                                                                     int num_slots, const int32_t* slots,
                                                                     int table_slots, int64_t* lengths) {
  GRID_STRIDE(t, batch * table_slots) {
    int64_t s = t / table_slots;
    int j = static_cast<int>(t - s * table_slots);
    int64_t row = s * num_slots + slots[j];
    lengths[t] = offsets[row + 1] - offsets[row];
  }
}

// The keys of a table's slots, kBlock bags at a time: each thread reads one bag's source start and output position
// into shared memory, then the block's threads copy the block's keys in output order, each finding its bag by a
// binary search there. Loads and stores are coalesced whatever the bags' lengths (a thread per bag walks a 100-key
// bag alone). f(key, source index, j) gives the key written for slot j.
template <class F>
__device__ void select_keys(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                            const int32_t* slots, int table_slots, const int64_t* out_offsets, int64_t* out_keys,
                            F f) {
  __shared__ int64_t at[kBlock + 1];
  __shared__ int64_t src[kBlock];
  __shared__ int32_t slot_of[kBlock];
  const int64_t bags = batch * table_slots;
  const int x = threadIdx.x;
  for (int64_t t0 = blockIdx.x * int64_t(kBlock); t0 < bags; t0 += int64_t(gridDim.x) * kBlock) {
    const int n = static_cast<int>(bags - t0 < kBlock ? bags - t0 : kBlock);
    if (x < n) {
      const int64_t t = t0 + x;
      const int64_t s = t / table_slots;
      const int j = static_cast<int>(t - s * table_slots);
      src[x] = offsets[s * num_slots + slots[j]];
      at[x] = out_offsets[t];
      slot_of[x] = j;
    }
    if (x == 0) at[n] = out_offsets[t0 + n];
    __syncthreads();
    for (int64_t o = at[0] + x; o < at[n]; o += kBlock) {
      int lo = 0, hi = n - 1;  // the last bag that starts at or before o: the one holding it (empty bags skipped)
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (at[mid] <= o) lo = mid;
        else hi = mid - 1;
      }
      const int64_t i = src[lo] + (o - at[lo]);
      out_keys[o] = f(keys[i], i, slot_of[lo]);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kBlock) select_slot_keys_kernel(const int64_t* offsets, const int64_t* keys,
                                                                  int64_t batch, int num_slots, const int32_t* slots,
                                                                  int table_slots, const int64_t* out_offsets,
                                                                  int64_t* out_keys) {
  select_keys(offsets, keys, batch, num_slots, slots, table_slots, out_offsets, out_keys,
              [](int64_t k, int64_t, int) { return k; });
}

__global__ void __launch_bounds__(kBlock) select_group_keys_kernel(
    const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots, const int32_t* slots, int table_slots,
    const int64_t* out_offsets, const int64_t* bases, const int64_t* bounds, int64_t* out_keys, int64_t* first_bad) {
  select_keys(offsets, keys, batch, num_slots, slots, table_slots, out_offsets, out_keys,
              [=](int64_t k, int64_t i, int j) {
                if (k < 0 || k >= bounds[j])  // indices are >= 0: their unsigned order is theirs
                  atomicMin(reinterpret_cast<unsigned long long*>(first_bad), static_cast<unsigned long long>(i));
                return bases[j] + k;
              });
}

__global__ void __launch_bounds__(kBlock) check_offsets_kernel(const int64_t* offsets, int64_t rows,
                                                               int64_t* first_bad) {
  GRID_STRIDE(r, rows + 1) {
    const bool bad = r == 0 ? offsets[0] != 0 : offsets[r - 1] > offsets[r];
    if (bad) atomicMin(reinterpret_cast<unsigned long long*>(first_bad), static_cast<unsigned long long>(r));
  }
}

// Round to nearest even (__float2bfloat16_rn); a NaN becomes half.h's quiet NaN (its top bits with the quiet bit
// set) rather than the canonical one, so both backends give the same bits.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Four elements a thread (a float4 against 8 bytes of bf16): these passes move every vector an exchange sends
// or receives with the bf16 wire, so they run at memory speed. The launchers take the tail (n % 4) and
// unaligned buffers one element at a time.
__global__ void __launch_bounds__(kBlock) to_bf16_kernel(const float* in, int64_t n, uint16_t* out) {
  GRID_STRIDE(i, n) out[i] = bf16_bits(in[i]);
}

__global__ void __launch_bounds__(kBlock) to_bf16_4_kernel(const float4* in, int64_t n4, uint2* out) {
  GRID_STRIDE(i, n4) {
    const float4 v = in[i];
    out[i] = make_uint2(uint32_t(bf16_bits(v.x)) | uint32_t(bf16_bits(v.y)) << 16,
                        uint32_t(bf16_bits(v.z)) | uint32_t(bf16_bits(v.w)) << 16);
  }
}

__global__ void __launch_bounds__(kBlock) from_bf16_kernel(const uint16_t* in, int64_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

__global__ void __launch_bounds__(kBlock) from_bf16_4_kernel(const uint2* in, int64_t n4, float4* out) {
  GRID_STRIDE(i, n4) {
    const uint2 w = in[i];
    out[i] = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                         __uint_as_float(w.y & 0xffff0000u));
  }
}

// Element t of a table's [batch, table_slots, dim] bags: its position in the batch's rows of row_elems elements
// (slot j of the table at column cols[j]).
__device__ __forceinline__ int64_t slot_position(int64_t t, int dim, int table_slots, const int32_t* cols,
                                                 int64_t row_elems) {
  const int64_t bag = t / dim;
  const int e = static_cast<int>(t - bag * dim);
  const int64_t s = bag / table_slots;
  const int j = static_cast<int>(bag - s * table_slots);
  return s * row_elems + cols[j] + e;
}

// The same for the first of 4 elements t4 * 4 .. t4 * 4 + 3 (dim a multiple of 4, dim4 = dim / 4), in 32 bits.
__device__ __forceinline__ int64_t slot_position4(uint32_t t4, uint32_t dim4, uint32_t table_slots, const int32_t* cols,
                                                  int64_t row_elems) {
  const uint32_t bag = t4 / dim4, e = (t4 - bag * dim4) * 4, s = bag / table_slots, j = bag - s * table_slots;
  return int64_t(s) * row_elems + cols[j] + e;
}

__global__ void __launch_bounds__(kBlock) put_slots_kernel(const float* pooled, int64_t batch, int table_slots,
                                                           int dim, const int32_t* cols, int64_t row_floats,
                                                           float* out) {
  GRID_STRIDE(t, batch * table_slots * dim) {
    out[slot_position(t, dim, table_slots, cols, row_floats)] = pooled[t];
  }
}

__global__ void __launch_bounds__(kBlock) take_slots_kernel(const float* grad, int64_t batch, int table_slots,
                                                            int dim, const int32_t* cols, int64_t row_floats,
                                                            float* grad_table) {
  GRID_STRIDE(t, batch * table_slots * dim) {
    grad_table[t] = grad[slot_position(t, dim, table_slots, cols, row_floats)];
  }
}

// The same four elements at a time, for dims that are multiples of 4 (slot_position4, 32-bit index math, n4 <
// 2^31 checked by the launcher): 16-byte loads and stores where the output position is a multiple of 4 (cols,
// row_floats and the output aligned alike), element by element elsewhere. The scalar kernels' two 64-bit
// divisions an element cost several times the memory traffic (a localized group of several owners puts and takes
// every rank's whole [batch, slots, dim] each step).
__global__ void __launch_bounds__(kBlock) put_slots4_kernel(const float4* pooled, uint32_t n4, uint32_t dim4,
                                                            uint32_t table_slots, const int32_t* cols,
                                                            int64_t row_floats, float* out) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const float4 v = pooled[t];
    const int64_t o = slot_position4(t, dim4, table_slots, cols, row_floats);
    if ((o & 3) == 0) {
      *reinterpret_cast<float4*>(out + o) = v;
    } else {
      out[o] = v.x, out[o + 1] = v.y, out[o + 2] = v.z, out[o + 3] = v.w;
    }
  }
}

__global__ void __launch_bounds__(kBlock) take_slots4_kernel(const float* grad, uint32_t n4, uint32_t dim4,
                                                             uint32_t table_slots, const int32_t* cols,
                                                             int64_t row_floats, float4* grad_table) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const int64_t o = slot_position4(t, dim4, table_slots, cols, row_floats);
    grad_table[t] = (o & 3) == 0 ? *reinterpret_cast<const float4*>(grad + o)
                                 : make_float4(grad[o], grad[o + 1], grad[o + 2], grad[o + 3]);
  }
}

// H: half16.cuh's Bf16 or F16 (round to nearest even).
template <class H>
__global__ void __launch_bounds__(kBlock) put_slots_half_kernel(const float* pooled, int64_t batch, int table_slots,
                                                                int dim, const int32_t* cols, int64_t row_elems,
                                                                uint16_t* out) {
  GRID_STRIDE(t, batch * table_slots * dim) {
    out[slot_position(t, dim, table_slots, cols, row_elems)] = H::bits(pooled[t]);
  }
}

// Widening is exact: bf16 is a float's upper half; f16 through __half2float.
template <bool kF16>
__device__ __forceinline__ float widen(uint16_t h) {
  return kF16 ? __half2float(__ushort_as_half(h)) : __uint_as_float(static_cast<uint32_t>(h) << 16);
}

template <bool kF16>
__global__ void __launch_bounds__(kBlock) take_slots_half_kernel(const uint16_t* grad, int64_t batch,
                                                                 int table_slots, int dim, const int32_t* cols,
                                                                 int64_t row_elems, float* grad_table) {
  GRID_STRIDE(t, batch * table_slots * dim) {
    grad_table[t] = widen<kF16>(grad[slot_position(t, dim, table_slots, cols, row_elems)]);
  }
}

// The same four elements at a time, for dims that are multiples of 4: a float4 of the table's bags against 4
// 16-bit values of the output row, stored (or loaded) as 8 bytes where the output position is a multiple of 4
// (cols, row_elems and out aligned alike) and one by one elsewhere. Index math in 32 bits (n4 < 2^31 checked by
// the launcher): the 64-bit divisions of the scalar kernels cost more than the memory traffic.
template <class H>
__global__ void __launch_bounds__(kBlock) put_slots_half4_kernel(const float4* pooled, uint32_t n4, uint32_t dim4,
                                                                 uint32_t table_slots, const int32_t* cols,
                                                                 int64_t row_elems, uint16_t* out) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const float4 v = pooled[t];
    const int64_t o = slot_position4(t, dim4, table_slots, cols, row_elems);
    const uint16_t b0 = H::bits(v.x), b1 = H::bits(v.y), b2 = H::bits(v.z), b3 = H::bits(v.w);
    if ((o & 3) == 0) {
      *reinterpret_cast<uint2*>(out + o) =
          make_uint2(uint32_t(b0) | uint32_t(b1) << 16, uint32_t(b2) | uint32_t(b3) << 16);
    } else {
      out[o] = b0, out[o + 1] = b1, out[o + 2] = b2, out[o + 3] = b3;
    }
  }
}

template <bool kF16>
__global__ void __launch_bounds__(kBlock) take_slots_half4_kernel(const uint16_t* grad, uint32_t n4, uint32_t dim4,
                                                                  uint32_t table_slots, const int32_t* cols,
                                                                  int64_t row_elems, float4* grad_table) {
  for (uint32_t t = blockIdx.x * kBlock + threadIdx.x; t < n4; t += gridDim.x * kBlock) {
    const int64_t o = slot_position4(t, dim4, table_slots, cols, row_elems);
    uint16_t h[4];
    if ((o & 3) == 0) {
      const uint2 w = *reinterpret_cast<const uint2*>(grad + o);
      h[0] = uint16_t(w.x), h[1] = uint16_t(w.x >> 16), h[2] = uint16_t(w.y), h[3] = uint16_t(w.y >> 16);
    } else {
      h[0] = grad[o], h[1] = grad[o + 1], h[2] = grad[o + 2], h[3] = grad[o + 3];
    }
    grad_table[t] = make_float4(widen<kF16>(h[0]), widen<kF16>(h[1]), widen<kF16>(h[2]), widen<kF16>(h[3]));
  }
}

int bits_for(int parts) {  // bits of the largest part, parts - 1
  int b = 1;
  while ((1ll << b) < parts) ++b;
  return b;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Rows of dim floats four at a time where dim is a multiple of 4, both buffers 16-byte aligned and n * dim / 4
// fits 31 bits.
bool rows_by_four(int64_t n, int dim, const void* a, const void* b) {
  return dim % 4 == 0 && n * dim / 4 < INT32_MAX && aligned_to(a, 16) && aligned_to(b, 16);
}

}  // namespace

// ----------------------------------------------------------------------------
// launchers

#define LAUNCH(kernel, n, stream, ...)                                   \
  do {                                                                   \
    kernel<<<grid_for(n), kBlock, 0, stream>>>(__VA_ARGS__);             \
    CUDA_CHECK_LAUNCH(#kernel);                                          \
  } while (0)

void route_owner_by_key_cuda(const int64_t* keys, int64_t n, int world, int32_t* part, Stream s) {
  LAUNCH(owner_by_key_kernel, n, s, keys, n, world, part);
}

void route_part_by_membership_cuda(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* part,
                                   Stream s) {
  LAUNCH(membership_kernel, n, s, keys, n, set, m, part);
}

void route_index_in_set_cuda(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* idx,
                             Stream s) {
  LAUNCH(index_in_set_kernel, n, s, keys, n, set, m, idx);
}

void route_part_nonzero_cuda(const int64_t* counts, int64_t n, int32_t* part, Stream s) {
  LAUNCH(part_nonzero_kernel, n, s, counts, n, part);
}

void route_bucket_cuda(const Device& dev, const int32_t* part, int64_t n, int parts, int64_t* perm, int64_t* counts,
                       RouteScratch& scratch, Stream s) {
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int64_t) * parts, s));
    return;
  }
  SPARTA_ASSERT(n < (int64_t(1) << 31), "route_bucket: %lld elements (CUB sorts fewer than 2^31)", (long long)n);
  const int end_bit = bits_for(parts);
  // scratch: sorted parts [n] int32, indices [n] int64, then CUB's temporary storage
  size_t temp_bytes = 0;
  // parts are nonnegative: sorted as uint32 on their low end_bit bits
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                             static_cast<int64_t*>(nullptr), static_cast<int>(n), 0, end_bit, s));
  const size_t parts_at = 0, index_at = align256(sizeof(int32_t) * n);
  const size_t temp_at = index_at + align256(sizeof(int64_t) * n);
  auto* base = static_cast<unsigned char*>(scratch.get(dev, temp_at + temp_bytes, s));
  auto* sorted_parts = reinterpret_cast<int32_t*>(base + parts_at);
  auto* index = reinterpret_cast<int64_t*>(base + index_at);
  LAUNCH(iota_kernel, n, s, n, index);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + temp_at, temp_bytes, reinterpret_cast<const uint32_t*>(part),
                                             reinterpret_cast<uint32_t*>(sorted_parts), index, perm,
                                             static_cast<int>(n), 0, end_bit, s));
  LAUNCH(bucket_counts_kernel, parts, s, sorted_parts, n, parts, counts);
}

void route_sort_keys_cuda(const Device& dev, const int64_t* keys, int64_t n, int key_bits, int64_t* sorted,
                          int64_t* perm, RouteScratch& scratch, Stream s) {
  SPARTA_ASSERT(n < (int64_t(1) << 31), "route_sort_keys: %lld keys (CUB sorts fewer than 2^31)", (long long)n);
  // keys sorted by bits [0, key_bits) of their pattern (as uint64): any consistent order puts equal keys together
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint64_t*>(nullptr),
                                             static_cast<uint64_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                             static_cast<int64_t*>(nullptr), static_cast<int>(n), 0, key_bits, s));
  const size_t temp_at = align256(sizeof(int64_t) * n);
  auto* base = static_cast<unsigned char*>(scratch.get(dev, temp_at + temp_bytes, s));
  auto* index = reinterpret_cast<int64_t*>(base);
  LAUNCH(iota_kernel, n, s, n, index);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + temp_at, temp_bytes, reinterpret_cast<const uint64_t*>(keys),
                                             reinterpret_cast<uint64_t*>(sorted), index, perm, static_cast<int>(n), 0,
                                             key_bits, s));
}

void route_unique_sorted_cuda(const Device& dev, const int64_t* sorted, int64_t n, int64_t* unique, int64_t* runs,
                              int64_t* uid, int64_t* num_unique, RouteScratch& scratch, Stream s) {
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(runs, 0, sizeof(int64_t), s));
    CUDA_CHECK(cudaMemsetAsync(num_unique, 0, sizeof(int64_t), s));
    return;
  }
  SPARTA_ASSERT(n < (int64_t(1) << 31), "route_unique_sorted: %lld keys", (long long)n);
  LAUNCH(head_flags_kernel, n, s, sorted, n, uid);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, uid, uid, static_cast<int>(n), s));
  void* temp = scratch.get(dev, temp_bytes, s);
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, uid, uid, static_cast<int>(n), s));
  LAUNCH(unique_runs_kernel, n, s, sorted, n, uid, unique, runs, num_unique);
}

void route_gather_rows_cuda(const float* src, const int64_t* idx, int64_t n, int dim, float* dst, Stream s) {
  if (rows_by_four(n, dim, src, dst)) {
    LAUNCH(gather_rows4_kernel, n * dim / 4, s, reinterpret_cast<const float4*>(src), idx, uint32_t(n * dim / 4),
           uint32_t(dim / 4), reinterpret_cast<float4*>(dst));
    return;
  }
  LAUNCH(gather_rows_kernel, n * dim, s, src, idx, n, dim, dst);
}

void route_scatter_rows_cuda(const float* src, const int64_t* idx, int64_t n, int dim, float* dst, Stream s) {
  if (rows_by_four(n, dim, src, dst)) {
    LAUNCH(scatter_rows4_kernel, n * dim / 4, s, reinterpret_cast<const float4*>(src), idx, uint32_t(n * dim / 4),
           uint32_t(dim / 4), reinterpret_cast<float4*>(dst));
    return;
  }
  LAUNCH(scatter_rows_kernel, n * dim, s, src, idx, n, dim, dst);
}

void route_gather_keys_cuda(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst, Stream s) {
  LAUNCH(gather_keys_kernel, n, s, src, idx, n, dst);
}

void route_scatter_keys_cuda(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst, Stream s) {
  LAUNCH(scatter_keys_kernel, n, s, src, idx, n, dst);
}

void route_iota_cuda(int64_t n, int64_t* out, Stream s) { LAUNCH(iota_kernel, n, s, n, out); }

void route_widen_cuda(const int32_t* in, int64_t n, int64_t* out, Stream s) { LAUNCH(widen_kernel, n, s, in, n, out); }

void route_lengths_cuda(const int64_t* offsets, int64_t bags, int64_t* lengths, Stream s) {
  LAUNCH(lengths_kernel, bags, s, offsets, bags, lengths);
}

void route_offsets_from_lengths_cuda(const Device& dev, const int64_t* lengths, int64_t n, int64_t* offsets,
                                     RouteScratch& scratch, Stream s) {
  CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int64_t), s));
  if (n == 0) return;
  SPARTA_ASSERT(n < (int64_t(1) << 31), "route_offsets_from_lengths: %lld bags", (long long)n);
  if (lengths != offsets + 1)
    CUDA_CHECK(cudaMemcpyAsync(offsets + 1, lengths, sizeof(int64_t) * n, cudaMemcpyDeviceToDevice, s));
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, offsets + 1, offsets + 1, static_cast<int>(n), s));
  void* temp = scratch.get(dev, temp_bytes, s);
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, offsets + 1, offsets + 1, static_cast<int>(n), s));
}

void route_key_bags_cuda(const int64_t* offsets, int64_t bags, int64_t base, int64_t* bag_of_key, Stream s) {
  LAUNCH(key_bags_kernel, bags, s, offsets, bags, base, bag_of_key);
}

void route_offsets_from_sorted_bags_cuda(const int64_t* bag_ids, int64_t n, int64_t bags, int64_t* offsets,
                                         Stream s) {
  LAUNCH(offsets_from_sorted_bags_kernel, bags + 1, s, bag_ids, n, bags, offsets);
}

void route_pool_bags_cuda(const int64_t* offsets, const float* vecs, const int64_t* idx, int64_t bags, int dim,
                          Combiner combiner, float* out, const BagLayout& out_layout, Stream s) {
  if (rows_by_four(bags, dim, vecs, out) && out_layout.four_aligned()) {
    LAUNCH(pool_bags4_kernel, bags * dim / 4, s, offsets, reinterpret_cast<const float4*>(vecs), idx,
           uint32_t(bags * dim / 4), uint32_t(dim / 4), combiner == Combiner::mean, reinterpret_cast<float4*>(out),
           out_layout);
    return;
  }
  LAUNCH(pool_bags_kernel, bags * dim, s, offsets, vecs, idx, bags, dim, combiner == Combiner::mean, out,
         out_layout);
}

void route_scale_bag_grads_cuda(const int64_t* offsets, const float* grad, int64_t bags, int dim, Combiner combiner,
                                float* out, Stream s) {
  LAUNCH(scale_bag_grads_kernel, bags * dim, s, offsets, grad, bags, dim, combiner == Combiner::mean, out);
}

void route_divide_by_lengths_cuda(const int64_t* offsets, int64_t bags, int dim, float* x, Stream s) {
  LAUNCH(divide_by_lengths_kernel, bags * dim, s, offsets, bags, dim, x);
}

void route_select_slot_lengths_cuda(const int64_t* offsets, int64_t batch, int num_slots, const int32_t* slots,
                                    int table_slots, int64_t* lengths, Stream s) {
  LAUNCH(select_slot_lengths_kernel, batch * table_slots, s, offsets, batch, num_slots, slots, table_slots, lengths);
}

void route_select_slot_keys_cuda(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                 const int32_t* slots, int table_slots, const int64_t* out_offsets,
                                 int64_t* out_keys, Stream s) {
  LAUNCH(select_slot_keys_kernel, batch * table_slots, s, offsets, keys, batch, num_slots, slots, table_slots,
         out_offsets, out_keys);
}

void route_select_group_keys_cuda(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                  const int32_t* slots, int table_slots, const int64_t* out_offsets,
                                  const int64_t* bases, const int64_t* bounds, int64_t* out_keys,
                                  int64_t* first_bad, Stream s) {
  LAUNCH(select_group_keys_kernel, batch * table_slots, s, offsets, keys, batch, num_slots, slots, table_slots,
         out_offsets, bases, bounds, out_keys, first_bad);
}

void route_check_offsets_cuda(const int64_t* offsets, int64_t rows, int64_t* first_bad, Stream s) {
  LAUNCH(check_offsets_kernel, rows + 1, s, offsets, rows, first_bad);
}

void route_to_bf16_cuda(const float* in, int64_t n, uint16_t* out, Stream s) {
  int64_t done = 0;
  if (aligned_to(in, 16) && aligned_to(out, 8) && n >= 4) {
    done = n / 4 * 4;
    LAUNCH(to_bf16_4_kernel, done / 4, s, reinterpret_cast<const float4*>(in), done / 4,
           reinterpret_cast<uint2*>(out));
  }
  if (done < n) LAUNCH(to_bf16_kernel, n - done, s, in + done, n - done, out + done);
}

void route_from_bf16_cuda(const uint16_t* in, int64_t n, float* out, Stream s) {
  int64_t done = 0;
  if (aligned_to(in, 8) && aligned_to(out, 16) && n >= 4) {
    done = n / 4 * 4;
    LAUNCH(from_bf16_4_kernel, done / 4, s, reinterpret_cast<const uint2*>(in), done / 4,
           reinterpret_cast<float4*>(out));
  }
  if (done < n) LAUNCH(from_bf16_kernel, n - done, s, in + done, n - done, out + done);
}

void route_put_slots_cuda(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                          int64_t row_floats, float* out, Stream s) {
  const int64_t n = batch * table_slots * dim;
  if (rows_by_four(batch * table_slots, dim, pooled, out)) {
    LAUNCH(put_slots4_kernel, n / 4, s, reinterpret_cast<const float4*>(pooled), uint32_t(n / 4), uint32_t(dim / 4),
           uint32_t(table_slots), cols, row_floats, out);
    return;
  }
  LAUNCH(put_slots_kernel, n, s, pooled, batch, table_slots, dim, cols, row_floats, out);
}

void route_take_slots_cuda(const float* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                           int64_t row_floats, float* grad_table, Stream s) {
  const int64_t n = batch * table_slots * dim;
  if (rows_by_four(batch * table_slots, dim, grad, grad_table)) {
    LAUNCH(take_slots4_kernel, n / 4, s, grad, uint32_t(n / 4), uint32_t(dim / 4), uint32_t(table_slots), cols,
           row_floats, reinterpret_cast<float4*>(grad_table));
    return;
  }
  LAUNCH(take_slots_kernel, n, s, grad, batch, table_slots, dim, cols, row_floats, grad_table);
}

void route_put_slots_half_cuda(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                               int64_t row_elems, OutputType type, uint16_t* out, Stream s) {
  const int64_t n = batch * table_slots * dim;
  if (dim % 4 == 0 && n / 4 < INT32_MAX && aligned_to(pooled, 16) && aligned_to(out, 8)) {
    const uint32_t n4 = uint32_t(n / 4), dim4 = uint32_t(dim / 4), ts = uint32_t(table_slots);
    const float4* p4 = reinterpret_cast<const float4*>(pooled);
    if (type == OutputType::f16)
      LAUNCH(put_slots_half4_kernel<dense::F16>, n4, s, p4, n4, dim4, ts, cols, row_elems, out);
    else
      LAUNCH(put_slots_half4_kernel<dense::Bf16>, n4, s, p4, n4, dim4, ts, cols, row_elems, out);
    return;
  }
  if (type == OutputType::f16)
    LAUNCH(put_slots_half_kernel<dense::F16>, n, s, pooled, batch, table_slots, dim, cols, row_elems, out);
  else
    LAUNCH(put_slots_half_kernel<dense::Bf16>, n, s, pooled, batch, table_slots, dim, cols, row_elems, out);
}

void route_take_slots_half_cuda(const uint16_t* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                                int64_t row_elems, OutputType type, float* grad_table, Stream s) {
  const int64_t n = batch * table_slots * dim;
  if (dim % 4 == 0 && n / 4 < INT32_MAX && aligned_to(grad, 8) && aligned_to(grad_table, 16)) {
    const uint32_t n4 = uint32_t(n / 4), dim4 = uint32_t(dim / 4), ts = uint32_t(table_slots);
    float4* g4 = reinterpret_cast<float4*>(grad_table);
    if (type == OutputType::f16)
      LAUNCH(take_slots_half4_kernel<true>, n4, s, grad, n4, dim4, ts, cols, row_elems, g4);
    else
      LAUNCH(take_slots_half4_kernel<false>, n4, s, grad, n4, dim4, ts, cols, row_elems, g4);
    return;
  }
  if (type == OutputType::f16)
    LAUNCH(take_slots_half_kernel<true>, n, s, grad, batch, table_slots, dim, cols, row_elems, grad_table);
  else
    LAUNCH(take_slots_half_kernel<false>, n, s, grad, batch, table_slots, dim, cols, row_elems, grad_table);
}

}  // namespace sparta
