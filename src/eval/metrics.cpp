// Paired error, fixed features, Fréchet distance and collapse (metrics.hpp).
#include "eval/metrics.hpp"

#include <cmath>

#include "core/errors.hpp"
#include "data/classes.hpp"
#include "data/flow_sampler.hpp"

namespace wd::eval {

PairedError paired_error(const torch::Tensor& x, const torch::Tensor& ref) {
  WD_CHECK(x.sizes() == ref.sizes() && x.dim() >= 2, "paired_error: " << x.sizes() << " against " << ref.sizes());
  const auto err = (x.to(torch::kDouble) - ref.to(torch::kDouble)).pow(2).flatten(1).sum(1);
  const auto norm = ref.to(torch::kDouble).pow(2).flatten(1).sum(1).clamp_min(1e-30);
  // The lower median of the per-sample ratios (torch's median), so that it is one sample's value.
  return {(err.sum() / norm.sum()).item<double>(), (err / norm).median().item<double>()};
}

torch::Tensor latent_features(const torch::Tensor& latents, const torch::Tensor& patterns) {
  WD_CHECK(latents.dim() == 5, "latent_features: latents must be [B,C,F,H,W], got " << latents.sizes());
  const auto x = latents.to(torch::kDouble).cpu();
  const auto flat = x.flatten(2);  // [B,C,FHW]
  std::vector<torch::Tensor> parts{flat.mean(2), flat.std(2, /*unbiased=*/false),
                                   x.pow(2).flatten(1).mean(1).sqrt().unsqueeze(1)};
  if (patterns.defined()) {
    const auto c = data::classify_latents(latents, patterns);
    const double two_pi = 6.283185307179586;
    const auto dy = c.shift.select(1, 0).to(torch::kDouble) * (two_pi / static_cast<double>(x.size(3)));
    const auto dx = c.shift.select(1, 1).to(torch::kDouble) * (two_pi / static_cast<double>(x.size(4)));
    parts.push_back(c.cosines.to(torch::kDouble));
    parts.push_back(torch::stack({dy.cos(), dy.sin(), dx.cos(), dx.sin()}, 1));
  }
  return torch::cat(parts, 1);
}

namespace {

/// The symmetric square root of a symmetric positive semi-definite matrix.
torch::Tensor sqrt_psd(const torch::Tensor& m) {
  const auto [values, vectors] = torch::linalg_eigh(m, "L");
  return torch::matmul(vectors * values.clamp_min(0).sqrt().unsqueeze(0), vectors.t());
}

torch::Tensor covariance(const torch::Tensor& f, const torch::Tensor& mean) {
  const auto d = f - mean;
  return torch::matmul(d.t(), d) / static_cast<double>(std::max<std::int64_t>(1, f.size(0) - 1));
}

}  // namespace

double frechet_distance(const torch::Tensor& a, const torch::Tensor& b) {
  WD_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1) && a.size(0) >= 2 && b.size(0) >= 2,
           "frechet_distance: feature sets " << a.sizes() << " and " << b.sizes() << " must be [N>=2, D] of one D");
  const auto fa = a.to(torch::kDouble), fb = b.to(torch::kDouble);
  const auto ma = fa.mean(0), mb = fb.mean(0);
  const auto sa = covariance(fa, ma), sb = covariance(fb, mb);
  const auto ra = sqrt_psd(sa);
  const auto middle = torch::matmul(torch::matmul(ra, sb), ra);
  const auto cross = torch::linalg_eigvalsh(0.5 * (middle + middle.t()), "L").clamp_min(0).sqrt().sum();
  const double d = ((ma - mb).pow(2).sum() + sa.trace() + sb.trace() - 2 * cross).item<double>();
  return std::max(0.0, d);
}

std::vector<std::int64_t> collapsed_channels(const torch::Tensor& x, const torch::Tensor& ref, double ratio) {
  return data::collapsed_channels(data::channel_stats(x), data::channel_stats(ref), ratio);
}

}  // namespace wd::eval
