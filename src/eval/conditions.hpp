// What a sampler starts from: seeded noise, the contexts (a data set's or random ones) and the
// negative context of classifier-free guidance; shared by `sample` and `evaluate`.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/image_condition.hpp"
#include "model/wan_config.hpp"

namespace wd::eval {

/// Where the conditions come from.
struct ConditionSource {
  std::string data_path;        ///< HDF5 data set whose contexts (and latent shape) are used; empty = random
  std::string samples = "0";    ///< data set sample indices, e.g. 0,3,7 or 100-291
  std::string latent = "1,4,4"; ///< random contexts only: F,H,W
  std::int64_t count = 1;       ///< random contexts only: number of samples
  std::uint64_t seed = 0;       ///< the noise of sample i is drawn from (seed, i)
  std::string negative;         ///< safetensors with `context`; empty = zeros
};

/// The inputs of a batched guided sampler: the conditional context and the negative one padded
/// to one width, `lens` [2B] on the host (the conditional lengths, then the negative's).
struct SamplingConditions {
  torch::Tensor noise, context, lens, negative;
  std::vector<std::int64_t> indices;  ///< the samples (data set indices, or 0..count-1)
  /// The data set's image conditions (/condition) as the teacher takes them: an i2v teacher's
  /// y, a ti2v teacher's image mode; none for a t2v teacher or data without them.
  ImageInput image;
  /// Samples [lo, hi) of these conditions (lens: both halves).
  SamplingConditions slice(std::int64_t lo, std::int64_t hi) const;
};

/// Reads (or draws) the conditions for the teacher's config `tc` onto `device`. The noise of
/// sample i depends on (seed, i) only: another batch or order draws the same noise. An i2v
/// teacher needs a data set with /condition (a ConfigError names --data.path otherwise); a ti2v
/// teacher samples its image mode from one that has it, its text-to-video mode otherwise.
SamplingConditions make_conditions(const ConditionSource& src, const WanConfig& tc, const c10::Device& device);

}  // namespace wd::eval
