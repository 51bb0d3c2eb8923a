// key_init.h: initial values of embedding rows as a pure function of (seed, table id, key, element).
//
// A row's first value does not depend on when, where or on which rank its key was inserted, so a model is
// the same whatever the placement, the rank count or the insertion order, and checkpoints can reshard.
// initial_value() is __host__ __device__ and bit-identical on CPU and GPU: integer hashing (splitmix64),
// then a 24-bit integer converted exactly to float and one multiply (a single rounding, no contraction).
#pragma once

#include <cstdint>

#include "src/base/device.h"
#include "src/base/random.h"  // splitmix64
#include "kernels/embedding_types.h"  // RowStorage


namespace sparta {

// Tagged keys: several tables share one hash table by tagging their keys, (table_id << kKeyTagShift) | key
// for keys in [0, 2^kKeyTagShift) (src/embedding_collection.h groups tables this way).
constexpr int kKeyTagShift = 56;
constexpr uint64_t kKeyTagMask = (uint64_t(1) << kKeyTagShift) - 1;
SPARTA_HD int64_t tag_key(int table_id, int64_t key) {
  return static_cast<int64_t>((uint64_t(table_id) << kKeyTagShift) | uint64_t(key));
}

// One table of several whose keys lie end to end in one physical table (src/embedding_collection.cpp groups
// direct-index tables so): the keys from key_begin on, up to the next segment's key_begin, are table table_id's
// keys key - key_begin, and take that table's initial values of that key.
struct KeySegment {
  int64_t key_begin = 0;
  int table_id = 0;
};

// How a table draws the initial values of new rows: uniform in [-scale, scale).
struct KeyInit {
  uint64_t seed = 0;
  uint32_t table_id = 0;
  float scale = 0.05f;
  // The keys are tagged: table_id = key >> kKeyTagShift and key = key & kKeyTagMask before the formula, so a
  // tagged key's row has the bits of the untagged key's row of its own table (table_id above is ignored).
  bool tagged = false;
  // Keys end to end (KeySegment): the last segment whose key_begin is <= the key gives the table id and the key
  // within it (table_id above is ignored). segments: memory of the table's backend (device memory on cuda),
  // key_begin ascending from 0; num_segments 0: not used. Not with tagged.
  const KeySegment* segments = nullptr;
  int num_segments = 0;
  // The values written: fp32, or 16 bits rounded to nearest even from the fp32 value (kernels/row_storage.h).
  RowStorage storage = RowStorage::fp32;
};

// The per-key stream: distinct keys give distinct streams (splitmix64 is a bijection).
SPARTA_HD uint64_t key_stream(const KeyInit& init, uint64_t key) {
  uint64_t id = init.tagged ? (key >> kKeyTagShift) : uint64_t(init.table_id);
  if (init.tagged) key &= kKeyTagMask;
  if (init.num_segments > 0) {  // the last segment beginning at or before the key (binary search)
    int lo = 0, hi = init.num_segments - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (uint64_t(init.segments[mid].key_begin) <= key) lo = mid;
      else hi = mid - 1;
    }
    id = uint64_t(init.segments[lo].table_id);
    key -= uint64_t(init.segments[lo].key_begin);
  }
  return splitmix64(splitmix64(init.seed ^ splitmix64(id + 0x5851F42D4C957F2Dull)) ^ key);
}

// Element elem of the row whose stream is `stream`: 2m - 2^24 for a 24-bit m is exact in float, and
// scale * 2^-24 is an exact power-of-two scaling, so the one multiply is the only rounding.
SPARTA_HD float initial_value_at(uint64_t stream, float scale, uint32_t elem) {
  uint64_t x = splitmix64(stream + uint64_t(elem) * 0xD1B54A32D192ED03ull);
  int32_t m = static_cast<int32_t>(x >> 40);
  return static_cast<float>(2 * m - (1 << 24)) * (scale * 5.9604644775390625e-08f);
}

SPARTA_HD float initial_value(const KeyInit& init, uint64_t key, uint32_t elem) {
  return initial_value_at(key_stream(init, key), init.scale, elem);
}

// values[rows[i], :] = initial values of keys[i] for every i with rows[i] >= 0 (rows < 0 are skipped).
// keys, rows: [n]; values: [capacity_rows, dim] of init.storage. Asynchronous on stream (cuda).
void init_rows_by_key(const Device& dev, const int64_t* keys, const int64_t* rows, int64_t n, void* values,
                      int dim, const KeyInit& init, Stream stream);

// values[r, :] = initial values of key offset + r * stride, for r < n: every row of a direct index
// (hash_table.h DirectIndex); values of init.storage. Asynchronous on stream (cuda).
void init_rows_strided(const Device& dev, int64_t n, int64_t stride, int64_t offset, void* values, int dim,
                       const KeyInit& init, Stream stream);

void init_rows_by_key_cpu(const int64_t* keys, const int64_t* rows, int64_t n, void* values, int dim,
                          const KeyInit& init);
void init_rows_strided_cpu(int64_t n, int64_t stride, int64_t offset, void* values, int dim, const KeyInit& init);
void init_rows_strided_cuda(int64_t n, int64_t stride, int64_t offset, void* values, int dim, const KeyInit& init,
                            Stream stream);
void init_rows_by_key_cuda(const int64_t* keys, const int64_t* rows, int64_t n, void* values, int dim,
                           const KeyInit& init, Stream stream);

}  // namespace sparta
