// checksum.h: the 64-bit checksum that checkpoints record for each of their files.
//
// The algorithm is XXH64 (Yann Collet's xxHash, 64-bit variant, seed 0), written here from its public
// specification: four 64-bit lanes consume 32-byte stripes with multiply-rotate rounds, the lanes are merged,
// the tail is folded in by 8, 4 and 1 bytes, and a final avalanche mixes the bits. It runs at memory speed
// (several GB/s per core), catches flipped, zeroed and truncated bytes (the length is mixed in), and its
// values match every other XXH64 implementation, so `xxhsum -H1 FILE` (xxHash's command-line tool) prints
// the same digest as the manifest holds. Not cryptographic: it guards against corruption, not tampering.
// Bytes are read as little-endian words on any host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparta {

// Streaming XXH64: update() with the bytes in any pieces, digest() at any point (does not end the stream).
class Checksum64 {
 public:
  explicit Checksum64(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;
  uint64_t bytes() const { return total_; }

 private:
  uint64_t lanes_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buffer_[32];
  size_t buffered_ = 0;
};

// XXH64 of one buffer.
uint64_t checksum64(const void* data, size_t bytes, uint64_t seed = 0);

// XXH64 of a file's bytes, read in blocks of 1 MiB; its size in bytes goes to *bytes when given.
// Throws sparta::Error naming the file when it cannot be opened or read.
uint64_t checksum_file(const std::string& path, uint64_t* bytes = nullptr);

// 16 lower-case hex digits, as the manifest stores it; parse_checksum_hex throws sparta::Error on anything else.
std::string checksum_hex(uint64_t value);
uint64_t parse_checksum_hex(const std::string& text);

}  // namespace sparta
