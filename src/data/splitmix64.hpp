// SplitMix64: the small, version-independent generator and hash behind every data-side draw.
#pragma once

#include <cmath>
#include <cstdint>

namespace wd::data {

/// The SplitMix64 finaliser: a bijective 64-bit mix, so distinct keys never collide.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// One 64-bit seed for a tuple of keys (seed, step, sample, stream ...). Chaining the mix
/// keeps the order of the keys significant: (a, b) and (b, a) get unrelated seeds.
constexpr std::uint64_t hash_keys(std::uint64_t seed) { return mix64(seed); }

template <typename... Rest>
constexpr std::uint64_t hash_keys(std::uint64_t seed, std::uint64_t next, Rest... rest) {
  return hash_keys(mix64(seed) ^ next, static_cast<std::uint64_t>(rest)...);
}

/// Sequential SplitMix64 generator (Steele, Lea & Flood 2014), plus the few draws we need.
/// Our own so that shuffles and σ never change with the LibTorch version.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    const std::uint64_t z = mix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return z;
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// Uniform integer in [0, bound), without modulo bias (rejection of the short last range).
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % bound;
  }

  /// Standard normal by Box–Muller (one of the pair; the draw count stays fixed per call).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log() stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

}  // namespace wd::data
