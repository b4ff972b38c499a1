// Class patterns and labels of a data set, and the shift-invariant classifier (classes.hpp).
#include "data/classes.hpp"

#include "core/errors.hpp"
#include "data/dataset_schema.hpp"
#include "data/h5_file.hpp"

namespace wd::data {

DatasetClasses read_dataset_classes(const std::string& path) {
  DatasetClasses out;
  const auto file = h5_open_read_only(path);
  if (H5Lexists(file.get(), kClassPatterns, H5P_DEFAULT) <= 0) return out;
  const H5Dataset patterns(WD_CHECK_H5(H5Dopen2(file.get(), kClassPatterns, H5P_DEFAULT), path, kClassPatterns));
  const auto dims = h5_dims(patterns.get(), path, kClassPatterns);
  WD_CHECK_DATA(dims.size() == 5, path, kClassPatterns, "has " << dims.size() << " dimensions, expected [K,C,F,H,W]");
  out.patterns = torch::empty(dims, torch::kFloat);
  WD_CHECK_H5(H5Dread(patterns.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.patterns.data_ptr()), path,
              kClassPatterns);
  WD_CHECK_DATA(H5Lexists(file.get(), kLabels, H5P_DEFAULT) > 0, path, kLabels,
                "is missing; a data set with " << kClassPatterns << " labels its samples");
  const H5Dataset labels(WD_CHECK_H5(H5Dopen2(file.get(), kLabels, H5P_DEFAULT), path, kLabels));
  const auto n = h5_dims(labels.get(), path, kLabels);
  WD_CHECK_DATA(n.size() == 1, path, kLabels, "has " << n.size() << " dimensions, expected [N]");
  std::vector<std::int32_t> raw(static_cast<std::size_t>(n[0]));
  WD_CHECK_H5(H5Dread(labels.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), path, kLabels);
  for (const auto l : raw) {
    WD_CHECK_DATA(l >= 0 && l < dims[0], path, kLabels, "holds class " << l << "; the data set has " << dims[0]);
    out.labels.push_back(l);
  }
  return out;
}

namespace {

/// Every frame of every latent against every class's frame at the best circular shift in (H, W).
struct FrameMatch {
  torch::Tensor cosine;  ///< [B,K,F] the best-shift cosine
  torch::Tensor at;      ///< [B,K,F] the best shift, as a flat index dy·W + dx
  std::int64_t height = 0, width = 0;
};

FrameMatch match_frames(const torch::Tensor& latents, const torch::Tensor& patterns, const char* who) {
  WD_CHECK(latents.dim() == 5 && patterns.dim() == 5 && latents.sizes().slice(1) == patterns.sizes().slice(1),
           who << ": latents " << latents.sizes() << " and patterns " << patterns.sizes()
               << " must be [B,C,F,H,W] and [K,C,F,H,W] of one latent shape");
  const auto x = latents.to(torch::kFloat).cpu();
  const auto p = patterns.to(torch::kFloat).cpu();
  const auto h = x.size(3), w = x.size(4);
  // Circular cross-correlation over (H, W) for every (sample, class, channel, frame), summed
  // over channels: corr[b,k,f,dy,dx] = Σ_c Σ_hw x[b,c,f,h,w] · p[k,c,f,h-dy,w-dx].
  const auto fx = torch::fft::rfft2(x, {h, w}, {-2, -1}).unsqueeze(1);
  const auto fp = torch::fft::rfft2(p, {h, w}, {-2, -1}).conj().unsqueeze(0);
  const auto corr = torch::fft::irfft2(fx * fp, {h, w}, {-2, -1}).sum(2);
  const auto [best, at] = corr.flatten(3).max(3);                  // [B,K,F]
  const auto x_norm = x.pow(2).sum({1, 3, 4}).sqrt().unsqueeze(1);  // [B,1,F]
  const auto p_norm = p.pow(2).sum({1, 3, 4}).sqrt().unsqueeze(0);  // [1,K,F]
  return {best / (x_norm * p_norm).clamp_min(1e-12), at, h, w};
}

/// A flat shift index as (dy, dx), stacked on a new last dimension.
torch::Tensor shift_of(const torch::Tensor& at, std::int64_t width) {
  return torch::stack({at.div(width, "floor"), at.remainder(width)}, -1);
}

}  // namespace

Classified classify_latents(const torch::Tensor& latents, const torch::Tensor& patterns) {
  const auto m = match_frames(latents, patterns, "classify_latents");
  const auto cosine = m.cosine.mean(2);  // [B,K]
  const auto [value, index] = cosine.max(1);
  // Where the best class sits: the arg-max shift of its correlation in the first frame.
  const auto at = m.at.select(2, 0).gather(1, index.view({-1, 1})).squeeze(1);
  return {index, value, cosine, shift_of(at, m.width)};
}

FrameClasses classify_frames(const torch::Tensor& latents, const torch::Tensor& patterns) {
  const auto m = match_frames(latents, patterns, "classify_frames");
  const auto [value, label] = m.cosine.max(1);                         // [B,F]
  const auto where = m.at.gather(1, label.unsqueeze(1)).squeeze(1);    // [B,F]
  return {label, value, shift_of(where, m.width), m.height, m.width};
}

double condition_accuracy(const FrameClasses& frames, const FrameClasses& image, double strict_cosine) {
  const auto B = frames.label.size(0), F = frames.label.size(1);
  WD_CHECK(image.label.size(0) == B && image.label.size(1) == 1 && image.height == frames.height &&
               image.width == frames.width,
           "condition_accuracy: " << B << " samples " << frames.height << "x" << frames.width << ", images "
                                  << image.label.sizes() << " " << image.height << "x" << image.width);
  if (B == 0) return 0;
  // Within one step of `from` on a circle of n positions: a difference of 0, 1 or n - 1.
  const auto near = [](const torch::Tensor& to, const torch::Tensor& from, std::int64_t n) {
    const auto d = (to - from).remainder(n);
    return d.le(1).logical_or(d.ge(n - 1));
  };
  auto ok = torch::ones({B}, torch::kBool);
  auto previous = image.shift.select(1, 0);  // [B,2]
  for (std::int64_t f = 1; f < F; ++f) {
    const auto here = frames.shift.select(1, f);
    ok = ok.logical_and(frames.label.select(1, f).eq(image.label.select(1, 0)))
             .logical_and(frames.cosine.select(1, f).ge(strict_cosine))
             .logical_and(near(here.select(1, 0), previous.select(1, 0), frames.height))
             .logical_and(near(here.select(1, 1), previous.select(1, 1), frames.width));
    previous = here;
  }
  return ok.to(torch::kDouble).mean().item<double>();
}

ClassAccuracy class_accuracy(const Classified& got, const std::vector<std::int64_t>& wanted, double strict_cosine) {
  const auto n = static_cast<std::int64_t>(wanted.size());
  WD_CHECK(got.label.size(0) == n, "class_accuracy: " << got.label.size(0) << " latents, " << n << " labels");
  if (n == 0) return {};
  const auto want = torch::tensor(wanted, torch::kLong);
  const auto right = got.label.eq(want);
  const auto strict = right.logical_and(got.cosine.ge(strict_cosine));
  return {right.to(torch::kDouble).mean().item<double>(), strict.to(torch::kDouble).mean().item<double>()};
}

}  // namespace wd::data
