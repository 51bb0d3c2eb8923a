// route.h: the routing kernels of the embedding placements: which rank (or part) each key goes to, a stable
// bucketing by it, permuting rows there and back, pooling per-key vectors into (sample, slot) bags, scaling
// bag gradients into per-key ones, and cutting a table's slots out of a batch's CSR and putting them back.
//
// Every launcher takes the device and runs on its backend: the cpu reference (route.cpp) or the CUDA version
// (route.cu), asynchronous on `stream`, its last parameter (the cpu backend ignores it; none synchronizes the
// host). Pointers are device memory (host memory on the cpu backend).
// The arithmetic that touches values is fixed so that both backends give the same bits:
//   pool:   a bag sums its vectors in key order from 0.0f; mean then divides the sum by the key count (one
//           float division, as kernels/pooled_forward does), so pooling looked-up vectors equals the fused
//           pooled_forward bit for bit.
//   scale:  each key of bag b has the gradient grad[b] (sum) or grad[b] * (1.0f / n_b) (mean), the scaling
//           kernels/embedding_backward applies, so a per-key gradient equals what the fused backward adds.
#pragma once

#include <cstdint>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "kernels/embedding_types.h"
#include "kernels/pooled_forward.h"  // OutputType

namespace sparta {

// Scratch the cuda launchers that sort or scan keep between calls (grown when a call needs more; the old memory
// is freed once `stream`, the stream of the calls that used it, is synchronized).
struct RouteScratch {
  Buffer<unsigned char> bytes;
  void* get(const Device& dev, size_t n, Stream stream) {
    if (bytes.size() >= n) return bytes.data();
    if (bytes.empty()) bytes = Buffer<unsigned char>(dev, n);
    else bytes.resize(n, stream);
    return bytes.data();
  }
};

// ---- owners and stable bucketing

// The rank that owns a key under modulo placements: the key's 64-bit pattern modulo world (keys may be
// negative; every module that assigns rows by key uses this).
SPARTA_HD int owner_of_key(int64_t key, int world) {
  return static_cast<int>(static_cast<uint64_t>(key) % static_cast<uint64_t>(world));
}

// part[i] = owner_of_key(keys[i], world). keys, part: [n].
void route_owner_by_key(const Device& dev, const int64_t* keys, int64_t n, int world, int32_t* part, Stream stream);
// part[i] = 0 when keys[i] is in set (sorted ascending, distinct, [m]), else 1.
void route_part_by_membership(const Device& dev, const int64_t* keys, int64_t n, const int64_t* set, int64_t m,
                              int32_t* part, Stream stream);
// idx[i] = the position of keys[i] in set (sorted ascending, distinct, [m] with m < 2^31), or -1 when it is not
// there: a part for route_bucket.
void route_index_in_set(const Device& dev, const int64_t* keys, int64_t n, const int64_t* set, int64_t m,
                        int32_t* idx, Stream stream);
// part[i] = 0 when counts[i] > 0, else 1 (counts, part: [n]).
void route_part_nonzero(const Device& dev, const int64_t* counts, int64_t n, int32_t* part, Stream stream);
// Stable bucketing by part (each in [0, parts)): perm[j] = index of the j-th element when the elements are
// ordered by part, ties in index order; counts[p] = elements of part p. perm: [n] int64, counts: [parts] int64.
void route_bucket(const Device& dev, const int32_t* part, int64_t n, int parts, int64_t* perm, int64_t* counts,
                  RouteScratch& scratch, Stream stream);

// ---- distinct keys

// Stable sort of keys by bits [0, key_bits) of their pattern (1 <= key_bits <= 64; a caller whose keys lie in
// [0, 2^key_bits) names those bits only, and the radix sort makes fewer passes): sorted[j] = keys[perm[j]], keys
// of equal low bits in index order. So keys in [0, 2^key_bits) come out ascending, equal keys together; a key
// outside that range lands among those of its low bits, possibly apart from its equals (route_unique_sorted then
// lists it more than once). sorted, perm: [n].
void route_sort_keys(const Device& dev, const int64_t* keys, int64_t n, int key_bits, int64_t* sorted,
                     int64_t* perm, RouteScratch& scratch, Stream stream);
// The bits a sort of keys in [0, bound) needs (64 where bound <= 0: unbounded).
int route_key_bits(int64_t bound);
// The distinct keys of sorted keys ([n]): unique[u] for u < *num_unique, the run of u at sorted positions
// [runs[u], runs[u+1]) (runs: [n + 1], runs[*num_unique] = n), and uid[j] = the u of position j.
// num_unique: [1] int64 device memory (0 for n == 0).
void route_unique_sorted(const Device& dev, const int64_t* sorted, int64_t n, int64_t* unique, int64_t* runs,
                         int64_t* uid, int64_t* num_unique, RouteScratch& scratch, Stream stream);

// ---- permutations

// dst[i, :] = src[idx[i], :] for i < n (rows of dim floats).
void route_gather_rows(const Device& dev, const float* src, const int64_t* idx, int64_t n, int dim, float* dst,
                       Stream stream);
// dst[idx[i], :] = src[i, :] for i < n (idx distinct).
void route_scatter_rows(const Device& dev, const float* src, const int64_t* idx, int64_t n, int dim, float* dst,
                        Stream stream);
// dst[i] = src[idx[i]] for i < n.
void route_gather_keys(const Device& dev, const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst,
                       Stream stream);
// dst[idx[i]] = src[i] for i < n (idx distinct).
void route_scatter_keys(const Device& dev, const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst,
                        Stream stream);
// out[i] = i for i < n.
void route_iota(const Device& dev, int64_t n, int64_t* out, Stream stream);
// out[i] = in[i], widened to int64 (e.g. route_index_in_set's positions as ids), for i < n.
void route_widen(const Device& dev, const int32_t* in, int64_t n, int64_t* out, Stream stream);

// ---- bags

// lengths[b] = offsets[b + 1] - offsets[b] for b < bags.
void route_lengths(const Device& dev, const int64_t* offsets, int64_t bags, int64_t* lengths, Stream stream);
// offsets[0] = 0, offsets[b + 1] = offsets[b] + lengths[b]: [n + 1].
void route_offsets_from_lengths(const Device& dev, const int64_t* lengths, int64_t n, int64_t* offsets,
                                RouteScratch& scratch, Stream stream);
// bag_of_key[i] = base + b for every key i of bag b (offsets [bags + 1], bag_of_key [offsets[bags]]).
void route_key_bags(const Device& dev, const int64_t* offsets, int64_t bags, int64_t base, int64_t* bag_of_key,
                    Stream stream);
// The CSR of keys whose bag ids are sorted ascending: offsets[b] = keys with bag id < b, for b <= bags.
void route_offsets_from_sorted_bags(const Device& dev, const int64_t* bag_ids, int64_t n, int64_t bags,
                                    int64_t* offsets, Stream stream);
// out[b, :] = the vectors of keys offsets[b] .. offsets[b+1] combined (sum or mean; zeros when empty), in the
// fixed order above; key i's vector is vecs[idx[i], :], or vecs[i, :] when idx is null (so a key's vector can be
// read where it arrived, without first copying every key's own). out: [bags, dim], or laid out as out_layout says
// (kernels/embedding_types.h BagLayout; only the bags' places written).
void route_pool_bags(const Device& dev, const int64_t* offsets, const float* vecs, const int64_t* idx, int64_t bags,
                     int dim, Combiner combiner, float* out, Stream stream, const BagLayout& out_layout = {});
// out[b, :] = grad[b, :] (sum) or grad[b, :] * (1.0f / n_b) (mean; zeros for an empty bag): the gradient of one
// key of each bag. grad, out: [bags, dim]; in place allowed.
void route_scale_bag_grads(const Device& dev, const int64_t* offsets, const float* grad, int64_t bags, int dim,
                           Combiner combiner, float* out, Stream stream);
// x[b, :] /= n_b for every nonempty bag b of counts offsets (the mean of sums pooled elsewhere). x: [bags, dim].
void route_divide_by_lengths(const Device& dev, const int64_t* offsets, int64_t bags, int dim, float* x, Stream stream);

// ---- slots of a table

// A batch's CSR over rows sample * num_slots + slot, cut to the slots of one table: bag sample * table_slots + j
// holds the keys of (sample, slots[j]). slots: [table_slots] int32 device array.
// Step 1: out_offsets [batch * table_slots + 1] (read out_offsets[batch * table_slots] for the key count).
void route_select_slot_offsets(const Device& dev, const int64_t* offsets, int64_t batch, int num_slots,
                               const int32_t* slots, int table_slots, int64_t* out_offsets, RouteScratch& scratch,
                                   Stream stream);
// Step 2: out_keys [out_offsets[batch * table_slots]].
void route_select_slot_keys(const Device& dev, const int64_t* offsets, const int64_t* keys, int64_t batch,
                            int num_slots, const int32_t* slots, int table_slots, const int64_t* out_offsets,
                            int64_t* out_keys, Stream stream);
// Step 2 for tables that share one physical table (src/embedding_collection.cpp's groups): as
// route_select_slot_keys, and the key k of slot slots[j] is moved into the group's key space: bases[j] + k
// (tagged keys, kernels/key_init.h: bases[j] = tag << kKeyTagShift; a direct index: the key offset of the slot's
// table). A key outside [0, bounds[j]) (it would land in another table's keys) lowers *first_bad to its index in
// keys (atomically); *first_bad is not written otherwise, so fill it first (kernels/fill.h). bases, bounds:
// [table_slots] int64 device arrays, bounds[j] >= 1 and bases[j] + bounds[j] - 1 representable. out_offsets may
// be offsets itself when slots are 0..num_slots-1.
void route_select_group_keys(const Device& dev, const int64_t* offsets, const int64_t* keys, int64_t batch,
                             int num_slots, const int32_t* slots, int table_slots, const int64_t* out_offsets,
                             const int64_t* bases, const int64_t* bounds, int64_t* out_keys, int64_t* first_bad,
                             Stream stream);
// The check of a batch's CSR offsets [rows + 1] on the device: *first_bad = min(*first_bad, r) for the smallest
// bad r, where r = 0 is bad when offsets[0] != 0 and r in [1, rows] when offsets[r - 1] > offsets[r]. As above,
// *first_bad is not written when every r is fine: fill it first.
void route_check_offsets(const Device& dev, const int64_t* offsets, int64_t rows, int64_t* first_bad, Stream stream);

// ---- the bf16 wire format (src/placement_common.h Exchange)

// out[i] = in[i] rounded to bf16, nearest even (src/base/half.h float_to_bf16: infinities stay infinite, a NaN
// becomes the quiet NaN half.h gives, the same bits on both backends). in, out: [n]; n = 0 does nothing.
void route_to_bf16(const Device& dev, const float* in, int64_t n, uint16_t* out, Stream stream);
// out[i] = in[i] widened to float (exact). in, out: [n]; n = 0 does nothing.
void route_from_bf16(const Device& dev, const uint16_t* in, int64_t n, float* out, Stream stream);
// out[s, cols[j] .. cols[j] + dim) = pooled[s * table_slots + j, :] for s < batch, j < table_slots.
// pooled: [batch, table_slots, dim]; out: [batch, row_floats]; cols: [table_slots] int32 device array.
void route_put_slots(const Device& dev, const float* pooled, int64_t batch, int table_slots, int dim,
                     const int32_t* cols, int64_t row_floats, float* out, Stream stream);
// The reverse: grad_table[s * table_slots + j, :] = grad[s, cols[j] .. cols[j] + dim).
void route_take_slots(const Device& dev, const float* grad, int64_t batch, int table_slots, int dim,
                      const int32_t* cols, int64_t row_floats, float* grad_table, Stream stream);
// route_put_slots into a 16-bit output: out[s, cols[j] + e] = pooled[s * table_slots + j, e] rounded to `type`
// (OutputType::bf16 or ::f16, nearest even: src/base/half.h's float_to_bf16 / float_to_f16 on the cpu,
// kernels/half16.cuh's Bf16 / F16 on the device; the same bits for every value but a NaN, which stays a NaN;
// f16 overflows to +-inf). out: [batch, row_elems] of 16-bit values (uint16_t bits).
void route_put_slots_half(const Device& dev, const float* pooled, int64_t batch, int table_slots, int dim,
                          const int32_t* cols, int64_t row_elems, OutputType type, uint16_t* out, Stream stream);
// route_take_slots from a 16-bit gradient: grad_table[s * table_slots + j, e] = grad[s, cols[j] + e] widened to
// float (exact). grad: [batch, row_elems] of `type` (bf16 or f16).
void route_take_slots_half(const Device& dev, const uint16_t* grad, int64_t batch, int table_slots, int dim,
                           const int32_t* cols, int64_t row_elems, OutputType type, float* grad_table,
                           Stream stream);

// ---- backend versions (called by the launchers above)

void route_owner_by_key_cpu(const int64_t* keys, int64_t n, int world, int32_t* part);
void route_part_by_membership_cpu(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* part);
void route_index_in_set_cpu(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* idx);
void route_part_nonzero_cpu(const int64_t* counts, int64_t n, int32_t* part);
void route_bucket_cpu(const int32_t* part, int64_t n, int parts, int64_t* perm, int64_t* counts);
void route_sort_keys_cpu(const int64_t* keys, int64_t n, int key_bits, int64_t* sorted, int64_t* perm);
void route_unique_sorted_cpu(const int64_t* sorted, int64_t n, int64_t* unique, int64_t* runs, int64_t* uid,
                             int64_t* num_unique);
void route_gather_rows_cpu(const float* src, const int64_t* idx, int64_t n, int dim, float* dst);
void route_scatter_rows_cpu(const float* src, const int64_t* idx, int64_t n, int dim, float* dst);
void route_gather_keys_cpu(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst);
void route_scatter_keys_cpu(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst);
void route_iota_cpu(int64_t n, int64_t* out);
void route_widen_cpu(const int32_t* in, int64_t n, int64_t* out);
void route_lengths_cpu(const int64_t* offsets, int64_t bags, int64_t* lengths);
void route_offsets_from_lengths_cpu(const int64_t* lengths, int64_t n, int64_t* offsets);
void route_key_bags_cpu(const int64_t* offsets, int64_t bags, int64_t base, int64_t* bag_of_key);
void route_offsets_from_sorted_bags_cpu(const int64_t* bag_ids, int64_t n, int64_t bags, int64_t* offsets);
void route_pool_bags_cpu(const int64_t* offsets, const float* vecs, const int64_t* idx, int64_t bags, int dim,
                         Combiner combiner, float* out, const BagLayout& out_layout);
void route_scale_bag_grads_cpu(const int64_t* offsets, const float* grad, int64_t bags, int dim, Combiner combiner,
                               float* out);
void route_divide_by_lengths_cpu(const int64_t* offsets, int64_t bags, int dim, float* x);
void route_select_slot_lengths_cpu(const int64_t* offsets, int64_t batch, int num_slots, const int32_t* slots,
                                   int table_slots, int64_t* lengths);
void route_select_slot_keys_cpu(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                const int32_t* slots, int table_slots, const int64_t* out_offsets, int64_t* out_keys);
void route_select_group_keys_cpu(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                 const int32_t* slots, int table_slots, const int64_t* out_offsets,
                                 const int64_t* bases, const int64_t* bounds, int64_t* out_keys,
                                 int64_t* first_bad);
void route_check_offsets_cpu(const int64_t* offsets, int64_t rows, int64_t* first_bad);
void route_to_bf16_cpu(const float* in, int64_t n, uint16_t* out);
void route_from_bf16_cpu(const uint16_t* in, int64_t n, float* out);
void route_put_slots_cpu(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                         int64_t row_floats, float* out);
void route_take_slots_cpu(const float* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                          int64_t row_floats, float* grad_table);
void route_put_slots_half_cpu(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                              int64_t row_elems, OutputType type, uint16_t* out);
void route_take_slots_half_cpu(const uint16_t* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                               int64_t row_elems, OutputType type, float* grad_table);

void route_owner_by_key_cuda(const int64_t* keys, int64_t n, int world, int32_t* part, Stream s);
void route_part_by_membership_cuda(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* part,
                                   Stream s);
void route_index_in_set_cuda(const int64_t* keys, int64_t n, const int64_t* set, int64_t m, int32_t* idx,
                             Stream s);
void route_part_nonzero_cuda(const int64_t* counts, int64_t n, int32_t* part, Stream s);
void route_bucket_cuda(const Device& dev, const int32_t* part, int64_t n, int parts, int64_t* perm, int64_t* counts,
                       RouteScratch& scratch, Stream s);
void route_sort_keys_cuda(const Device& dev, const int64_t* keys, int64_t n, int key_bits, int64_t* sorted,
                          int64_t* perm, RouteScratch& scratch, Stream s);
void route_unique_sorted_cuda(const Device& dev, const int64_t* sorted, int64_t n, int64_t* unique, int64_t* runs,
                              int64_t* uid, int64_t* num_unique, RouteScratch& scratch, Stream s);
void route_gather_rows_cuda(const float* src, const int64_t* idx, int64_t n, int dim, float* dst, Stream s);
void route_scatter_rows_cuda(const float* src, const int64_t* idx, int64_t n, int dim, float* dst, Stream s);
void route_gather_keys_cuda(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst, Stream s);
void route_scatter_keys_cuda(const int64_t* src, const int64_t* idx, int64_t n, int64_t* dst, Stream s);
void route_iota_cuda(int64_t n, int64_t* out, Stream s);
void route_widen_cuda(const int32_t* in, int64_t n, int64_t* out, Stream s);
void route_lengths_cuda(const int64_t* offsets, int64_t bags, int64_t* lengths, Stream s);
void route_offsets_from_lengths_cuda(const Device& dev, const int64_t* lengths, int64_t n, int64_t* offsets,
                                     RouteScratch& scratch, Stream s);
void route_key_bags_cuda(const int64_t* offsets, int64_t bags, int64_t base, int64_t* bag_of_key, Stream s);
void route_offsets_from_sorted_bags_cuda(const int64_t* bag_ids, int64_t n, int64_t bags, int64_t* offsets,
                                         Stream s);
void route_pool_bags_cuda(const int64_t* offsets, const float* vecs, const int64_t* idx, int64_t bags, int dim,
                          Combiner combiner, float* out, const BagLayout& out_layout, Stream s);
void route_scale_bag_grads_cuda(const int64_t* offsets, const float* grad, int64_t bags, int dim, Combiner combiner,
                                float* out, Stream s);
void route_divide_by_lengths_cuda(const int64_t* offsets, int64_t bags, int dim, float* x, Stream s);
void route_select_slot_lengths_cuda(const int64_t* offsets, int64_t batch, int num_slots, const int32_t* slots,
                                    int table_slots, int64_t* lengths, Stream s);
void route_select_slot_keys_cuda(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                 const int32_t* slots, int table_slots, const int64_t* out_offsets,
                                 int64_t* out_keys, Stream s);
void route_select_group_keys_cuda(const int64_t* offsets, const int64_t* keys, int64_t batch, int num_slots,
                                  const int32_t* slots, int table_slots, const int64_t* out_offsets,
                                  const int64_t* bases, const int64_t* bounds, int64_t* out_keys,
                                  int64_t* first_bad, Stream s);
void route_check_offsets_cuda(const int64_t* offsets, int64_t rows, int64_t* first_bad, Stream s);
void route_to_bf16_cuda(const float* in, int64_t n, uint16_t* out, Stream s);
void route_from_bf16_cuda(const uint16_t* in, int64_t n, float* out, Stream s);
void route_put_slots_cuda(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                          int64_t row_floats, float* out, Stream s);
void route_take_slots_cuda(const float* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                           int64_t row_floats, float* grad_table, Stream s);
void route_put_slots_half_cuda(const float* pooled, int64_t batch, int table_slots, int dim, const int32_t* cols,
                               int64_t row_elems, OutputType type, uint16_t* out, Stream s);
void route_take_slots_half_cuda(const uint16_t* grad, int64_t batch, int table_slots, int dim, const int32_t* cols,
                                int64_t row_elems, OutputType type, float* grad_table, Stream s);

}  // namespace sparta
