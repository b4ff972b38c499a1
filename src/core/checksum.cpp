// XXH64 after the xxHash specification (doc/xxhash_spec.md): 32-byte stripes over four lanes,
// then the tail in 8-, 4- and 1-byte steps, then the avalanche.
#include "core/checksum.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/errors.hpp"

namespace wd {

namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The spec reads input words little-endian whatever the host is.
inline std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline std::uint32_t read32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

inline std::uint64_t lane_round(std::uint64_t acc, std::uint64_t lane) {
  acc += lane * kP2;
  return rotl(acc, 31) * kP1;
}

inline std::uint64_t merge(std::uint64_t h, std::uint64_t acc) {
  h ^= lane_round(0, acc);
  return h * kP1 + kP4;
}

/// Consumes whole 32-byte stripes; returns the bytes consumed.
std::size_t stripes(std::uint64_t (&acc)[4], const unsigned char* p, std::size_t n) {
  std::size_t done = 0;
  for (; done + 32 <= n; done += 32) {
    acc[0] = lane_round(acc[0], read64(p + done));
    acc[1] = lane_round(acc[1], read64(p + done + 8));
    acc[2] = lane_round(acc[2], read64(p + done + 16));
    acc[3] = lane_round(acc[3], read64(p + done + 24));
  }
  return done;
}

void init(std::uint64_t (&acc)[4], std::uint64_t seed) {
  acc[0] = seed + kP1 + kP2;
  acc[1] = seed + kP2;
  acc[2] = seed;
  acc[3] = seed - kP1;
}

/// Converges the lanes (or starts from the seed for short input), then the tail and avalanche.
std::uint64_t finish(const std::uint64_t (&acc)[4], std::uint64_t seed, std::uint64_t total,
                     const unsigned char* tail, std::size_t n) {
  std::uint64_t h;
  if (total >= 32) {
    h = rotl(acc[0], 1) + rotl(acc[1], 7) + rotl(acc[2], 12) + rotl(acc[3], 18);
    for (auto a : acc) h = merge(h, a);
  } else {
    h = seed + kP5;
  }
  h += total;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    h ^= lane_round(0, read64(tail + i));
    h = rotl(h, 27) * kP1 + kP4;
  }
  if (i + 4 <= n) {
    h ^= static_cast<std::uint64_t>(read32(tail + i)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    i += 4;
  }
  for (; i < n; ++i) {
    h ^= static_cast<std::uint64_t>(tail[i]) * kP5;
    h = rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t acc[4];
  init(acc, seed);
  const std::size_t done = size >= 32 ? stripes(acc, p, size) : 0;
  return finish(acc, seed, size, p + done, size - done);
}

Xxh64::Xxh64(std::uint64_t seed) : seed_(seed) { init(acc_, seed); }

void Xxh64::update(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ > 0) {
    const std::size_t take = std::min(size, sizeof(buffer_) - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < sizeof(buffer_)) return;
    stripes(acc_, buffer_, sizeof(buffer_));
    buffered_ = 0;
  }
  const std::size_t done = stripes(acc_, p, size);
  std::memcpy(buffer_, p + done, size - done);
  buffered_ = size - done;
}

std::uint64_t Xxh64::digest() const { return finish(acc_, seed_, total_, buffer_, buffered_); }

std::string xxh64_hex(std::uint64_t hash) {
  static const char* digits = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, hash >>= 4) out[static_cast<std::size_t>(i)] = digits[hash & 0xF];
  return out;
}

std::string file_xxh64_hex(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  WD_CHECK_SYS(fd, path);
  // Large reads: checkpoints are many GB and per-call overhead would dominate small ones.
  std::vector<unsigned char> chunk(8u << 20);
  Xxh64 hash;
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) {
      const auto message = detail::errno_message("read(" + path + ")");
      ::close(fd);
      throw SystemError(message);
    }
    if (n == 0) break;
    hash.update(chunk.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return xxh64_hex(hash.digest());
}

}  // namespace wd
