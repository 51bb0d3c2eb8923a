// random.h: counter-based random numbers, the one home of splitmix64. A value is a pure function of its
// inputs, so every rank (and the GPU and the CPU) computes the same one without communication: row initial
// values (kernels/key_init.h), shuffling orders and synthetic samples (io/) all draw from here.
#pragma once

#include <cstdint>

#include "src/base/device.h"  // SPARTA_HD

namespace sparta {

// splitmix64's output function applied to x + golden: a bijection on 64 bits with good avalanche.
SPARTA_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Two inputs into one stream value.
SPARTA_HD uint64_t hash_mix(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b + 0x632be59bd9b4e019ull)); }
// Uniform in [0, 1) with 53 random bits.
SPARTA_HD double unit_double(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace sparta
