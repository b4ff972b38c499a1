// The measures `evaluate` scores a sampler's latents with: paired error against a reference from
// the same noise, Fréchet distance on fixed features against a reference from other noise, and a
// per-channel collapse check, and the per-class diversity that a partly collapsed sampler loses
// (docs/objectives.md#evaluate).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace wd::data {
struct Classified;
}

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

/// The measurement noise of frechet_distance(a, b) at these sample sizes: the standard deviation
/// of the distance over `rounds` bootstrap resamples (each set's rows drawn with replacement,
/// seeded by `seed`). Two distances closer than about twice this are not told apart.
double frechet_spread(const torch::Tensor& a, const torch::Tensor& b, int rounds = 50, std::uint64_t seed = 0);

/// Channels whose std in `x` falls below `ratio` times that in `ref` (latents [B,C,F,H,W]).
std::vector<std::int64_t> collapsed_channels(const torch::Tensor& x, const torch::Tensor& ref, double ratio);

/// Each latent's amplitude: the least-squares coefficient a of its first frame against its best
/// class's first frame placed at its best shift, a = ⟨x[:,0], roll(p[:,0], (dy,dx))⟩ / ‖p[:,0]‖²
/// (x ≈ a·p there). latents [B,C,F,H,W], patterns [K,C,F,H,W], labels [B] (classes), shifts [B,2]
/// (dy, dx): classify_latents' `label` and `shift`, which are of the first frame. [B] float64.
torch::Tensor pattern_amplitudes(const torch::Tensor& latents, const torch::Tensor& patterns,
                                 const torch::Tensor& labels, const torch::Tensor& shifts);

/// How varied a sampler's samples of each class are, grouped by the class each sample was meant
/// to be (`wanted`, per sample, not the class it came out as). A sampler that partly collapses
/// keeps the classes right and loses this: fewer positions, a narrower range of amplitudes,
/// samples of a class closer together. Raw values; `evaluate` divides a row's by the reference's.
struct ClassDiversity {
  struct Class {
    std::int64_t label = 0;
    std::int64_t samples = 0;
    std::int64_t positions = 0;  ///< distinct best (dy, dx) shifts among them
    double amplitude_std = 0;    ///< the std (population: /n) of their amplitudes
    double pair_distance = 0;    ///< the mean over pairs i<j of ‖x_i − x_j‖₂, latents flattened
  };
  std::vector<Class> classes;  ///< ascending label; only classes with 2 samples or more
};
/// latents [B,C,F,H,W], shifts [B,2] (dy, dx), amplitudes [B] and wanted (B classes).
ClassDiversity class_diversity(const torch::Tensor& latents, const torch::Tensor& shifts,
                               const torch::Tensor& amplitudes, const std::vector<std::int64_t>& wanted);
/// The same with the shifts of classify_latents' `got` and the amplitudes pattern_amplitudes gives.
ClassDiversity class_diversity(const torch::Tensor& latents, const data::Classified& got, const torch::Tensor& patterns,
                               const std::vector<std::int64_t>& wanted);

}  // namespace wd::eval
