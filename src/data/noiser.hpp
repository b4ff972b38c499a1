// Flow-matching noiser (spec §9): σ from a sampler, x_t = (1−σ)·x0 + σ·ε, t = 1000·σ.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "data/noise_config.hpp"
#include "data/splitmix64.hpp"

namespace wd::data {

/// One noisy batch as the teacher feeds it to the DiT.
struct NoisyBatch {
  torch::Tensor x_t;    ///< [B,C,F,H,W] float32
  torch::Tensor t;      ///< [B] float32, or [B,S] float32 when per_token
  torch::Tensor sigma;  ///< [B] float32 (σ after shift)
  torch::Tensor noise;  ///< [B,C,F,H,W] float32 ε
};

/// The model timesteps one expert of a two-expert (A14B) teacher serves, by WanExperts'
/// routing rule: trunc(t) >= boundary_timestep is the high-noise expert's, below it the
/// low-noise expert's. `side` 0 is every t.
struct TimestepRange {
  enum Side { kAll = 0, kHigh = 1, kLow = -1 };
  Side side = kAll;
  double boundary_timestep = 0;  ///< boundary · 1000
  bool contains(double t) const;
  std::string describe() const;  ///< "t >= 875", "t < 875" or "every t"
};

/// Deterministic from (seed, step, sample index): a rerun or a resumed run sees identical
/// inputs, and the same sample gets different noise at different steps.
class FlowMatchingNoiser {
 public:
  /// `range`: only σ whose t = 1000·σ (as fp32, as apply computes it) lies in it are drawn; a
  /// draw outside is redrawn from the next draw of the same (step, sample) stream, so the σ of
  /// a (step, sample) pair stays one deterministic value (a student of one expert, student.expert).
  FlowMatchingNoiser(NoiseConfig config, std::uint64_t seed, TimestepRange range = {});
  /// `x0` [B,C,F,H,W] float32, `indices` the B sample indices. When `per_token_seq_len` > 0 the
  /// timesteps are per token ([B,S], tokens of the first frame possibly clean), with
  /// `patch` giving the token grid; otherwise per sample ([B]).
  NoisyBatch apply(const torch::Tensor& x0, const std::vector<std::int64_t>& indices,
                   std::int64_t step, std::int64_t per_token_seq_len = 0,
                   const std::array<std::int64_t, 3>& patch = {1, 2, 2}) const;
  /// σ for one (step, sample) pair (exposed for tests of the sampler distribution).
  double sigma(std::int64_t step, std::int64_t sample) const;

 private:
  double draw(SplitMix64& rng) const;  ///< one σ of the sampler, shifted and clamped

  NoiseConfig config_;
  std::uint64_t seed_;
  TimestepRange range_;
};

}  // namespace wd::data
