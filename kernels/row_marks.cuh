// row_marks.cuh: the atomic SGD update's row marks (atomic_sgd.h), device side. Two bits per row, "seen" and
// "repeated", in two bitmaps of row_mark_half(capacity_rows) words each, one after the other: the seen bits, then
// the repeated bits (in one word pair per 32 rows instead, the checks read lines that the marks' atomics are
// changing, and the marking pass and the update took 0.18 ms more at dim 32 on one H200). A train lookup that
// hands out rows sets them as it writes each row (pooled_forward.cu), or atomic_sgd.cu's marking pass over the
// update's rows; the update reads them.
#pragma once

#include <cstdint>

namespace sparta {
namespace rowmarks {

// Words of one bitmap.
__host__ __device__ __forceinline__ int64_t half(int64_t capacity_rows) { return (capacity_rows + 31) / 32; }

// Row `row` (>= 0) seen once more: its seen bit set, and its repeated bit when the seen bit was set before. A row
// already marked repeated (its word read through L2) sets nothing: with skewed keys a hot row's keys would
// otherwise queue one atomic each at the same word (on one H200, 13.6M keys at alpha 1.1: 1.12 ms for a marking
// pass against 0.27 with the read first; uniform keys 0.25 against 0.28). A stale clear bit only costs the
// atomics it would have cost anyway.
__device__ __forceinline__ void mark(uint32_t* marks, int64_t half_words, int64_t row) {
  const int64_t w = row >> 5;
  const uint32_t bit = 1u << (row & 31);
  if (__ldcg(marks + half_words + w) & bit) return;
  if (atomicOr(marks + w, bit) & bit) atomicOr(marks + half_words + w, bit);
}

// True when the marks say one key touches row: seen, and not repeated. A row never seen (marks that do not cover
// it) is not single: the update then takes the atomics, which are right whoever else touches the row.
__device__ __forceinline__ bool single(const uint32_t* marks, int64_t half_words, int64_t row) {
  const int64_t w = row >> 5;
  const uint32_t bit = 1u << (row & 31);
  return (marks[half_words + w] & bit) == 0 && (marks[w] & bit) != 0;
}

}  // namespace rowmarks
}  // namespace sparta
