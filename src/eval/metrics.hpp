// The measures `evaluate` scores a sampler's latents with: paired error against a reference from
// the same noise, Fréchet distance on fixed features against a reference from other noise, and a
// per-channel collapse check (docs/objectives.md#evaluate).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace wd::eval {

/// Σ‖x − ref‖² / Σ‖ref‖² over all samples, and the median of the per-sample ratio.
struct PairedError {
  double rel_mse = 0;
  double median = 0;
};
PairedError paired_error(const torch::Tensor& x, const torch::Tensor& ref);

/// Fixed features of latents [B,C,F,H,W] (no learned network): per channel the mean and the
/// std over (F,H,W), the sample's RMS; with class patterns [K,C,F,H,W] also every class's
/// best-shift cosine and where the best class sits (cos and sin of 2π·dy/H and 2π·dx/W), so
/// that a sampler that loses the spread of positions, amplitudes or classes moves away.
/// [B, 2C + 1 (+ K + 4)] float64.
torch::Tensor latent_features(const torch::Tensor& latents, const torch::Tensor& patterns = {});

/// The Fréchet distance between Gaussians fitted to two feature sets [N,D] and [M,D]:
/// ‖μa − μb‖² + tr(Σa) + tr(Σb) − 2·tr((Σa^½ Σb Σa^½)^½), by symmetric eigendecompositions.
double frechet_distance(const torch::Tensor& a, const torch::Tensor& b);

/// Channels whose std in `x` falls below `ratio` times that in `ref` (latents [B,C,F,H,W]).
std::vector<std::int64_t> collapsed_channels(const torch::Tensor& x, const torch::Tensor& ref, double ratio);

}  // namespace wd::eval
