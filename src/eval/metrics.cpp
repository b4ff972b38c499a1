// Paired error, fixed features, Fréchet distance, collapse and class diversity (metrics.hpp).
#include "eval/metrics.hpp"

#include <cmath>
#include <map>
#include <set>
#include <utility>

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

double frechet_spread(const torch::Tensor& a, const torch::Tensor& b, int rounds, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<double> d;
  for (int r = 0; r < rounds; ++r) {
    const auto ia = torch::randint(a.size(0), {a.size(0)}, gen, torch::kLong);
    const auto ib = torch::randint(b.size(0), {b.size(0)}, gen, torch::kLong);
    d.push_back(frechet_distance(a.index_select(0, ia), b.index_select(0, ib)));
  }
  return torch::tensor(d, torch::kDouble).std().item<double>();
}

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

torch::Tensor pattern_amplitudes(const torch::Tensor& latents, const torch::Tensor& patterns,
                                 const torch::Tensor& labels, const torch::Tensor& shifts) {
  WD_CHECK(latents.dim() == 5 && patterns.dim() == 5 && latents.sizes().slice(1) == patterns.sizes().slice(1),
           "pattern_amplitudes: latents " << latents.sizes() << " and patterns " << patterns.sizes()
                                          << " must be [B,C,F,H,W] and [K,C,F,H,W] of one latent shape");
  const auto b = latents.size(0);
  WD_CHECK(labels.dim() == 1 && labels.size(0) == b && shifts.dim() == 2 && shifts.size(0) == b && shifts.size(1) == 2,
           "pattern_amplitudes: labels " << labels.sizes() << " and shifts " << shifts.sizes() << " for " << b
                                         << " latents must be [B] and [B,2]");
  const auto x = latents.select(2, 0).to(torch::kDouble).cpu();  // [B,C,H,W]
  const auto p = patterns.select(2, 0).to(torch::kDouble).cpu();  // [K,C,H,W]
  const auto label = labels.to(torch::kLong).cpu();
  const auto shift = shifts.to(torch::kLong).cpu();
  auto out = torch::zeros({b}, torch::kDouble);
  for (std::int64_t i = 0; i < b; ++i) {
    const auto k = label[i].item<std::int64_t>();
    WD_CHECK(k >= 0 && k < p.size(0), "pattern_amplitudes: class " << k << " of " << p.size(0));
    const auto placed = torch::roll(p[k], {shift[i][0].item<std::int64_t>(), shift[i][1].item<std::int64_t>()}, {1, 2});
    const double norm = p[k].pow(2).sum().item<double>();
    out[i] = norm > 0 ? (x[i] * placed).sum().item<double>() / norm : 0.0;
  }
  return out;
}

ClassDiversity class_diversity(const torch::Tensor& latents, const torch::Tensor& shifts,
                               const torch::Tensor& amplitudes, const std::vector<std::int64_t>& wanted) {
  const auto b = latents.size(0);
  WD_CHECK(latents.dim() >= 2 && static_cast<std::int64_t>(wanted.size()) == b && shifts.dim() == 2 &&
               shifts.size(0) == b && shifts.size(1) == 2 && amplitudes.dim() == 1 && amplitudes.size(0) == b,
           "class_diversity: latents " << latents.sizes() << ", shifts " << shifts.sizes() << ", amplitudes "
                                       << amplitudes.sizes() << " and " << wanted.size()
                                       << " classes must be [B,...], [B,2], [B] and B");
  const auto flat = latents.to(torch::kDouble).cpu().flatten(1);
  const auto shift = shifts.to(torch::kLong).cpu();
  const auto amplitude = amplitudes.to(torch::kDouble).cpu();
  std::map<std::int64_t, std::vector<std::int64_t>> members;
  for (std::int64_t i = 0; i < b; ++i) members[wanted[static_cast<std::size_t>(i)]].push_back(i);
  ClassDiversity out;
  for (const auto& [label, idx] : members) {
    if (idx.size() < 2) continue;
    std::set<std::pair<std::int64_t, std::int64_t>> positions;
    for (const auto i : idx) positions.emplace(shift[i][0].item<std::int64_t>(), shift[i][1].item<std::int64_t>());
    const auto at = torch::tensor(idx, torch::kLong);
    out.classes.push_back({label, static_cast<std::int64_t>(idx.size()), static_cast<std::int64_t>(positions.size()),
                           amplitude.index_select(0, at).std(/*unbiased=*/false).item<double>(),
                           torch::pdist(flat.index_select(0, at)).mean().item<double>()});
  }
  return out;
}

ClassDiversity class_diversity(const torch::Tensor& latents, const data::Classified& got, const torch::Tensor& patterns,
                               const std::vector<std::int64_t>& wanted) {
  return class_diversity(latents, got.shift, pattern_amplitudes(latents, patterns, got.label, got.shift), wanted);
}

}  // namespace wd::eval
