// The synthetic data set of `wan-distill make-dataset`.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/choices.hpp"

namespace wd::data {

/// Parameters of `wan-distill make-dataset`.
struct SyntheticDatasetSpec {
  std::string output;
  std::int64_t samples = 64;
  std::array<std::int64_t, 4> latent{16, 3, 16, 16};  ///< C, F, H, W
  std::int64_t text_len = 16;
  std::int64_t text_dim = 64;
  std::uint64_t seed = 0;
  bool half = false;  ///< store float16 instead of float32
  /// smooth: random smooth latents and random contexts | classes: `classes` classes, each its
  /// own smooth pattern and context; sample i is class i mod K, its pattern shifted (circularly,
  /// up to a quarter of H and W), moving by up to one row and column a frame, scaled by 0.8-1.2,
  /// plus noise of std 0.05; /labels and /class_patterns are written too (data/classes.hpp).
  DatasetKind kind = DatasetKind::kSmooth;
  std::int64_t classes = 6;
  /// No /latents: the contexts (and classes) alone, the latent shape declared in the root
  /// attribute latent_shape (the input of train.objective trajectory; docs/data-format.md).
  bool contexts_only = false;
  /// /condition: none | i2v (each sample's first latent frame followed by zero frames, [N,C,F,H,W])
  /// | ti2v (its first latent frame, [N,C,1,H,W]). A synthetic stand-in for a VAE's latent of the
  /// first video frame, which for a real video is its first latent frame too.
  ImageCondition condition = ImageCondition::kNone;
};

/// Writes a synthetic data set (`spec.kind`): spatially smooth latents (low-resolution noise upsampled, not
/// white noise), context features with lengths varied over 1..text_len, chunked per sample,
/// atomically (temporary name, then rename), with progress logged. Deterministic from the seed.
void write_synthetic_dataset(const SyntheticDatasetSpec& spec);

}  // namespace wd::data
