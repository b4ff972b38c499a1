// XXH64 against the reference vectors, streaming against one-shot, and files in chunks.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/checksum.hpp"
#include "core/errors.hpp"
#include "test_util.hpp"

namespace wd::test_checksum {
namespace {

/// The buffer of xxHash's own sanity check (xxhsum.c, BMK_sanityCheck): 101 bytes.
std::vector<unsigned char> sanity_buffer() {
  std::vector<unsigned char> buf(101);
  std::uint32_t gen = 2654435761U;
  for (auto& b : buf) {
    b = static_cast<unsigned char>(gen >> 24);
    gen *= gen;
  }
  return buf;
}

/// Pseudo-random bytes from a 64-bit LCG (the top byte of each state).
std::vector<unsigned char> lcg_bytes(std::size_t n) {
  std::vector<unsigned char> out(n);
  std::uint64_t x = 0;
  for (auto& b : out) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b = static_cast<unsigned char>(x >> 56);
  }
  return out;
}

TEST(Xxh64, MatchesTheReferenceSanityVectors) {
  const std::uint64_t prime = 2654435761U;
  const auto buf = sanity_buffer();
  EXPECT_EQ(xxh64(nullptr, 0, 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64(nullptr, 0, prime), 0xAC75FDA2929B17EFULL);
  EXPECT_EQ(xxh64(buf.data(), 1, 0), 0x4FCE394CC88952D8ULL);
  EXPECT_EQ(xxh64(buf.data(), 1, prime), 0x739840CB819FA723ULL);
  EXPECT_EQ(xxh64(buf.data(), 14, 0), 0xCFFA8DB881BC3A3DULL);
  EXPECT_EQ(xxh64(buf.data(), 14, prime), 0x5B9611585EFCC9CBULL);
  EXPECT_EQ(xxh64(buf.data(), 101, 0), 0x0EAB543384F878ADULL);
  EXPECT_EQ(xxh64(buf.data(), 101, prime), 0xCAA65939306F1E21ULL);
}

TEST(Xxh64, MatchesPublishedStringVectors) {
  const auto h = [](const char* s) { return xxh64(s, std::strlen(s)); };
  EXPECT_EQ(h("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(h("abc"), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(h("Nobody inspects the spammish repetition"), 0xFBCEA83C8A378BF1ULL);
  EXPECT_EQ(xxh64_hex(h("abc")), "44bc2cf5ad770999");
  EXPECT_EQ(xxh64_hex(0x1), "0000000000000001");
}

TEST(Xxh64, LowHalfMatchesZstdFrameChecksumOfALargeBuffer) {
  // zstd --check stores the low 32 bits of XXH64 (seed 0) of the content; this value was read
  // from `zstd --check` of the same 1 MiB + 13 bytes.
  const auto buf = lcg_bytes((1u << 20) + 13);
  EXPECT_EQ(xxh64(buf.data(), buf.size()) & 0xFFFFFFFFULL, 0x1E58F3E3ULL);
}

TEST(Xxh64, StreamingEqualsOneShotForEverySplit) {
  const auto buf = lcg_bytes(200);
  for (std::size_t n : {0u, 1u, 3u, 4u, 8u, 31u, 32u, 33u, 64u, 100u, 200u}) {
    const auto expected = xxh64(buf.data(), n, 7);
    for (std::size_t a = 0; a <= n; ++a) {
      Xxh64 two(7);
      two.update(buf.data(), a);
      two.update(buf.data() + a, n - a);
      ASSERT_EQ(two.digest(), expected) << "n=" << n << " split at " << a;
      // Three pieces: a, then up to 5 bytes, then the rest (crosses stripe edges in all ways).
      const std::size_t b = std::min(n, a + 5);
      Xxh64 three(7);
      three.update(buf.data(), a);
      three.update(buf.data() + a, b - a);
      three.update(buf.data() + b, n - b);
      ASSERT_EQ(three.digest(), expected) << "n=" << n << " splits at " << a << ", " << b;
    }
    Xxh64 bytewise(7);
    for (std::size_t i = 0; i < n; ++i) bytewise.update(buf.data() + i, 1);
    EXPECT_EQ(bytewise.digest(), expected) << "n=" << n << " byte by byte";
  }
}

TEST(Xxh64, FileHashReadsPastTheChunkSize) {
  test::TempDir dir("wd-xxh");
  const auto buf = lcg_bytes((17u << 20) + 5);  // more than two 8 MiB chunks, and a tail
  {
    std::ofstream out(dir.str("f.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  }
  EXPECT_EQ(file_xxh64_hex(dir.str("f.bin")), xxh64_hex(xxh64(buf.data(), buf.size())));
  { std::ofstream empty(dir.str("empty")); }
  EXPECT_EQ(file_xxh64_hex(dir.str("empty")), "ef46db3751d8e999");
  EXPECT_THROW(file_xxh64_hex(dir.str("absent")), SystemError);
}

}  // namespace
}  // namespace wd::test_checksum
