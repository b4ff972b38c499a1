// SampleSchedule: epoch permutations from (seed, epoch) and each replica's slice of a step.
#include "data/sample_schedule.hpp"

#include <numeric>

#include "core/errors.hpp"
#include "data/splitmix64.hpp"

namespace wd::data {

SampleSchedule::SampleSchedule(std::int64_t num_samples, std::int64_t batch_per_replica,
                               int replicas, std::uint64_t seed)
    : n_(num_samples), b_(batch_per_replica), replicas_(replicas), seed_(seed) {
  WD_CHECK_AS(ConfigError, n_ >= 1, "sample schedule: num_samples(" << n_ << ") must be >= 1");
  WD_CHECK_AS(ConfigError, b_ >= 1,
              "sample schedule: batch_per_replica(" << b_ << ") must be >= 1");
  WD_CHECK_AS(ConfigError, replicas_ >= 1,
              "sample schedule: replicas(" << replicas_ << ") must be >= 1");
}

std::vector<std::int64_t> SampleSchedule::permutation(std::int64_t epoch) const {
  std::vector<std::int64_t> perm(static_cast<std::size_t>(n_));
  std::iota(perm.begin(), perm.end(), std::int64_t{0});
  // The stream key (1) keeps shuffles unrelated to the noiser's draws from the same seed.
  SplitMix64 rng(hash_keys(seed_, 1, static_cast<std::uint64_t>(epoch)));
  for (std::int64_t i = n_ - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i + 1)));
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  return perm;
}

std::int64_t SampleSchedule::epoch_of(std::int64_t step) const {
  WD_CHECK(step >= 0, "sample schedule: step(" << step << ") must be >= 0");
  return step * b_ * replicas_ / n_;
}

std::vector<std::int64_t> SampleSchedule::indices(std::int64_t step, int replica) const {
  WD_CHECK(step >= 0, "sample schedule: step(" << step << ") must be >= 0");
  WD_CHECK(replica >= 0 && replica < replicas_,
           "sample schedule: replica(" << replica << ") must be in 0.." << replicas_ - 1);
  // Position in the endless stream of epoch permutations where this replica's slice starts.
  const std::int64_t start = (step * replicas_ + replica) * b_;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(b_));
  // A slice may span epochs (and, when B > N, several); each permutation is built once.
  std::int64_t cached_epoch = -1;
  std::vector<std::int64_t> perm;
  for (std::int64_t pos = start; pos < start + b_; ++pos) {
    const std::int64_t epoch = pos / n_;
    if (epoch != cached_epoch) {
      perm = permutation(epoch);
      cached_epoch = epoch;
    }
    out.push_back(perm[static_cast<std::size_t>(pos % n_)]);
  }
  return out;
}

}  // namespace wd::data
