// Which samples each teacher replica reads at each step: deterministic epoch shuffles, sharded.
#pragma once

#include <cstdint>
#include <vector>

namespace wd::data {

/// The training stream is the concatenation of epoch permutations of samples [0, num_samples);
/// global step s consumes positions [s·G, (s+1)·G) of it (G = batch_per_replica × replicas) and
/// replica r takes its contiguous slice of B = batch_per_replica. Every sample is therefore used
/// exactly once per epoch across all replicas, whatever the replica count. Permutations depend
/// only on (seed, epoch), computed with our own splitmix64 + Fisher-Yates so they do not change
/// with the LibTorch version.
class SampleSchedule {
 public:
  SampleSchedule(std::int64_t num_samples, std::int64_t batch_per_replica, int replicas,
                 std::uint64_t seed);
  /// Sample indices for `replica` at global `step`.
  std::vector<std::int64_t> indices(std::int64_t step, int replica) const;
  /// Epoch of the first sample of `step`.
  std::int64_t epoch_of(std::int64_t step) const;
  /// The permutation of one epoch (exposed for tests).
  std::vector<std::int64_t> permutation(std::int64_t epoch) const;

 private:
  std::int64_t n_, b_;
  int replicas_;
  std::uint64_t seed_;
};

}  // namespace wd::data
