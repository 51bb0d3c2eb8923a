// row_marks.cuh: the atomic SGD update's row marks (atomic_sgd.h), device side. Two bits per row, "seen" and
// "repeated", in pairs of words: word 2w holds the seen bits of rows 32w .. 32w + 31, word 2w + 1 their repeated
// bits, so one 8-byte load reads both bits of a row. A train lookup that hands out rows sets them as it writes
// each row (pooled_forward.cu), or atomic_sgd.cu's marking pass over the update's rows; the update reads them.
#pragma once

#include <cstdint>

namespace sparta {
namespace rowmarks {

// Row `row` (>= 0) seen once more: its seen bit set, and its repeated bit when the seen bit was set before. A row
// already marked repeated (its word read through L2) sets nothing: with skewed keys a hot row's keys would
// otherwise queue one atomic each at the same word (on one H200, 13.6M keys at alpha 1.1: 1.12 ms for a marking
// pass against 0.27 with the read first; uniform keys 0.25 against 0.28). A stale clear bit only costs the
// atomics it would have cost anyway.
__device__ __forceinline__ void mark(uint32_t* marks, int64_t row) {
  uint32_t* w = marks + 2 * (row >> 5);
  const uint32_t bit = 1u << (row & 31);
  if (__ldcg(w + 1) & bit) return;
  if (atomicOr(w, bit) & bit) atomicOr(w + 1, bit);
}

// True when the marks say one key touches row: seen, and not repeated. A row never seen (marks that do not cover
// it) is not single: the update then takes the atomics, which are right whoever else touches the row.
__device__ __forceinline__ bool single(const uint32_t* marks, int64_t row) {
  const uint2 m = *reinterpret_cast<const uint2*>(marks + 2 * (row >> 5));
  const uint32_t bit = 1u << (row & 31);
  return (m.x & bit) != 0 && (m.y & bit) == 0;
}

}  // namespace rowmarks
}  // namespace sparta
