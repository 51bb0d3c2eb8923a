// pooled_forward.h: embedding lookup fused with the hash table: keys → rows (get_insert in training, find
// in evaluation) → gathered value vectors → pooled per bag (sum or mean), or one vector per key (unpooled,
// for the dispatch placement, where the requester pools).
//
// Input CSR over bags b = sample * slots + slot: offsets[bags + 1], keys[nnz]. Output [bags, dim] in fp32,
// bf16 or fp16 (rounded to nearest even from the fp32 sum). Keys of a bag are summed in their order, in
// fp32, so the result does not depend on row ids and is bitwise reproducible. Empty bags give zeros.
// rows[nnz] receives the row of every key (-1: absent in eval, refused in train) for the backward pass.
//
// Train: unseen keys are inserted with their initial values (key_init.h); a full table leaves those keys
// at -1 with zero vectors and counts them in meta.refused (HashTable::check_errors turns that into an
// error). Eval: missing keys give zero vectors and count in meta.missing (an error when the caller says so).
// Any dim in 1..256; multiples of 4 take the float4 path (16-byte loads and stores; 16-bit rows of a multiple of 8
// elements: 16-byte loads of 8 elements).
#pragma once

#include <cstdint>

#include "src/base/device.h"
#include "src/base/half.h"  // float <-> bf16 / f16: the CPU reference of half-precision outputs
#include "kernels/embedding_types.h"
#include "kernels/hash_table.h"

namespace sparta {

enum class LookupMode { train, eval };
enum class OutputType { f32, bf16, f16 };

const char* lookup_mode_name(LookupMode m);
const char* output_type_name(OutputType t);
size_t output_type_bytes(OutputType t);

struct ForwardArgs {
  HashTableView table;
  RowInit rows_init;             // values [capacity_rows, dim] (of rows_init.key_init.storage: 16-bit rows are
                                 // uint16 behind the float pointer), dim and the key init of new rows (train)
  LookupMode mode = LookupMode::train;
  const int64_t* offsets = nullptr;  // [bags + 1] (pooled); ignored by unpooled_forward
  const int64_t* keys = nullptr;     // [nnz]
  int64_t bags = 0;                  // pooled: bags; unpooled: nnz
  Combiner combiner = Combiner::sum;
  void* out = nullptr;               // [bags, dim] of out_type (16-byte aligned for the fast path)
  OutputType out_type = OutputType::f32;
  BagLayout out_layout;              // pooled: where each bag goes in out (default [bags, dim]); unpooled: unused
  int64_t* rows = nullptr;           // [nnz], may be null
};

// out[b] = combiner over keys[offsets[b] .. offsets[b+1]) of values[row(key)]. Asynchronous on stream (cuda):
// errors (refused or missing keys) are only counted in the table's meta; HashTable::check_errors reads them.
void pooled_forward(const Device& dev, const ForwardArgs& a, Stream stream);
// out[i] = values[row(keys[i])] for i < a.bags (offsets unused). Asynchronous on stream, as pooled_forward.
void unpooled_forward(const Device& dev, const ForwardArgs& a, Stream stream);

// offsets == nullptr means one key per bag (unpooled).
void embedding_forward_cpu(const ForwardArgs& a);
void embedding_forward_cuda(const ForwardArgs& a, Stream stream);


}  // namespace sparta
