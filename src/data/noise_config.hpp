// NoiseConfig: the `[noise]` section (how the flow-matching noiser draws σ), apart from the
// noiser so that the run config does not pull in LibTorch through it.
#pragma once

#include <string>

#include "core/choices.hpp"
#include "core/config.hpp"

namespace wd::data {

/// `[noise]` section of the config.
struct NoiseConfig {
  NoiseSampler sampler = NoiseSampler::kLogitNormal;
  double logit_mean = 0.0;               ///< logit-normal: mean of the normal
  double logit_std = 1.0;                ///< logit-normal: std of the normal
  double shift = 1.0;                    ///< σ' = s·σ / (1 + (s−1)·σ); 1 = no shift
  double sigma_min = 0.0;                ///< σ is clamped to [sigma_min, sigma_max]
  double sigma_max = 1.0;
  double first_frame_clean = 0.0;  ///< per-token (ti2v) layouts: probability that the first
                                   ///< latent frame is clean (t = 0, x_t = x0), as masks_like
  void bind(OptionTable& table);
  void validate(ConfigProblems& problems) const;
};

}  // namespace wd::data
