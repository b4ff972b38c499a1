// XXH64 checksums (one-shot, streaming, and of a whole file), written from the published spec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace wd {

/// XXH64 of `size` bytes at `data` (the reference algorithm; equal to XXH64() of xxHash).
std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed = 0);

/// Streaming XXH64: update() any number of times with any split, digest() equals xxh64()
/// of the concatenation. digest() does not end the stream; more updates may follow.
class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0);
  /// Appends `size` bytes.
  void update(const void* data, std::size_t size);
  /// The hash of everything appended so far.
  std::uint64_t digest() const;

 private:
  std::uint64_t seed_;
  std::uint64_t acc_[4];
  std::uint64_t total_ = 0;
  unsigned char buffer_[32];  ///< a partial 32-byte stripe waiting for more input
  std::size_t buffered_ = 0;
};

/// The 16 lowercase hex digits of `hash` (how checksums are written in manifests).
std::string xxh64_hex(std::uint64_t hash);

/// XXH64 (seed 0) of the file at `path` as 16 hex digits, read in large chunks;
/// throws wd::SystemError when it cannot be opened or read.
std::string file_xxh64_hex(const std::string& path);

}  // namespace wd
