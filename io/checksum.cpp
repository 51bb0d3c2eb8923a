// checksum.cpp: XXH64, streamed (see checksum.h).
#include "io/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "src/base/check.h"

namespace sparta {
namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t P2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t P3 = 0x165667B19E3779F9ULL;
constexpr uint64_t P4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t P5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

inline uint64_t round64(uint64_t acc, uint64_t input) {
  acc += input * P2;
  acc = rotl(acc, 31);
  return acc * P1;
}

inline uint64_t merge_round(uint64_t acc, uint64_t lane) {
  acc ^= round64(0, lane);
  return acc * P1 + P4;
}

// One 32-byte stripe into the four lanes.
inline void consume_stripe(uint64_t* lanes, const unsigned char* p) {
  lanes[0] = round64(lanes[0], read64(p));
  lanes[1] = round64(lanes[1], read64(p + 8));
  lanes[2] = round64(lanes[2], read64(p + 16));
  lanes[3] = round64(lanes[3], read64(p + 24));
}

}  // namespace

Checksum64::Checksum64(uint64_t seed) : seed_(seed) {
  lanes_[0] = seed + P1 + P2;
  lanes_[1] = seed + P2;
  lanes_[2] = seed;
  lanes_[3] = seed - P1;
}

void Checksum64::update(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += bytes;
  if (buffered_ + bytes < 32) {
    std::memcpy(buffer_ + buffered_, p, bytes);
    buffered_ += bytes;
    return;
  }
  if (buffered_) {
    size_t fill = 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, fill);
    consume_stripe(lanes_, buffer_);
    p += fill;
    bytes -= fill;
    buffered_ = 0;
  }
  while (bytes >= 32) {
    consume_stripe(lanes_, p);
    p += 32;
    bytes -= 32;
  }
  std::memcpy(buffer_, p, bytes);
  buffered_ = bytes;
}

uint64_t Checksum64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(lanes_[0], 1) + rotl(lanes_[1], 7) + rotl(lanes_[2], 12) + rotl(lanes_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge_round(h, lanes_[i]);
  } else {
    h = seed_ + P5;
  }
  h += total_;
  const unsigned char* p = buffer_;
  size_t left = buffered_;
  while (left >= 8) {
    h ^= round64(0, read64(p));
    h = rotl(h, 27) * P1 + P4;
    p += 8;
    left -= 8;
  }
  if (left >= 4) {
    h ^= static_cast<uint64_t>(read32(p)) * P1;
    h = rotl(h, 23) * P2 + P3;
    p += 4;
    left -= 4;
  }
  while (left > 0) {
    h ^= static_cast<uint64_t>(*p) * P5;
    h = rotl(h, 11) * P1;
    ++p;
    --left;
  }
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t checksum64(const void* data, size_t bytes, uint64_t seed) {
  Checksum64 c(seed);
  c.update(data, bytes);
  return c.digest();
}

uint64_t checksum_file(const std::string& path, uint64_t* bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SPARTA_REQUIRE(fd >= 0, "%s: cannot open to compute its checksum: %s", path.c_str(), std::strerror(errno));
  Checksum64 c;
  std::vector<unsigned char> block(1 << 20);
  while (true) {
    ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw Error(path + ": read failed after " + std::to_string(c.bytes()) + " bytes: " + std::strerror(err));
    }
    if (n == 0) break;
    c.update(block.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  if (bytes) *bytes = c.bytes();
  return c.digest();
}

std::string checksum_hex(uint64_t value) { return strprintf("%016llx", static_cast<unsigned long long>(value)); }

uint64_t parse_checksum_hex(const std::string& text) {
  bool ok = text.size() == 16;
  uint64_t v = 0;
  for (size_t i = 0; ok && i < text.size(); ++i) {
    char ch = text[i];
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    ok = d >= 0;
    v = (v << 4) | static_cast<uint64_t>(d < 0 ? 0 : d);
  }
  SPARTA_REQUIRE(ok, "checksum: expected 16 lower-case hex digits, found '%s'", text.c_str());
  return v;
}

}  // namespace sparta
