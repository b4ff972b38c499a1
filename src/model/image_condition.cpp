// Wan 2.2's image conditions as the model takes them (image_condition.hpp).
#include "model/image_condition.hpp"

#include "core/errors.hpp"

namespace wd {

torch::Tensor i2v_condition(const torch::Tensor& image_latents) {
  WD_CHECK(image_latents.dim() == 5, "i2v_condition takes image latents [B,C,F,H,W], got " << image_latents.sizes());
  auto mask_shape = image_latents.sizes().vec();
  mask_shape[1] = kI2vMaskChannels;
  auto mask = torch::zeros(mask_shape, image_latents.options());
  mask.select(2, 0).fill_(1);
  return torch::cat({mask, image_latents}, 1);
}

ImageCondition image_condition_of(const WanConfig& c) {
  return c.model_type == "i2v" ? ImageCondition::kI2v : c.model_type == "ti2v" ? ImageCondition::kTi2v
                                                                              : ImageCondition::kNone;
}

std::int64_t condition_channels_of(const WanConfig& c) {
  return image_condition_of(c) == ImageCondition::kI2v ? c.in_dim - c.out_dim : 0;
}

std::int64_t latent_channels_of(const WanConfig& c) { return c.in_dim - condition_channels_of(c); }

namespace {

/// The tokens of one token frame of a latent [B,C,F,H,W] on the `patch` grid.
std::int64_t frame_tokens(const torch::Tensor& x, const std::array<std::int64_t, 3>& patch) {
  return (x.size(3) / patch[1]) * (x.size(4) / patch[2]);
}

}  // namespace

ConditionedInput condition_input(ImageCondition kind, const torch::Tensor& image, const torch::Tensor& x_t,
                                 const torch::Tensor& t, const std::array<std::int64_t, 3>& patch) {
  ConditionedInput in{x_t, t, torch::Tensor()};
  if (!image.defined() || kind == ImageCondition::kNone) return in;
  if (kind == ImageCondition::kI2v) {
    in.y = i2v_condition(image.to(x_t.device(), x_t.scalar_type()));
    return in;
  }
  WD_CHECK(image.dim() == 5 && image.size(2) == 1 && image.size(0) == x_t.size(0) && image.size(1) == x_t.size(1) &&
               image.size(3) == x_t.size(3) && image.size(4) == x_t.size(4),
           "a ti2v image condition is the first frame's latent [B,C,1,H,W] of x_t " << x_t.sizes() << ", got "
                                                                                    << image.sizes());
  WD_CHECK(t.dim() == 2, "a ti2v image condition needs per-token timesteps [B,S], got t " << t.sizes());
  const auto tokens = frame_tokens(x_t, patch);
  WD_CHECK(tokens <= t.size(1), "t has " << t.size(1) << " tokens, fewer than a frame's " << tokens);
  in.x_t = keep_condition(kind, image, x_t);
  in.t = t.clone();
  in.t.narrow(1, 0, tokens).zero_();
  return in;
}

torch::Tensor keep_condition(ImageCondition kind, const torch::Tensor& image, const torch::Tensor& x) {
  if (!image.defined() || kind != ImageCondition::kTi2v) return x;
  auto out = x.clone();
  out.narrow(2, 0, 1).copy_(image);
  return out;
}

torch::Tensor timesteps_at(const torch::Tensor& like, double sigma) {
  auto t = torch::full_like(like, static_cast<float>(1000.0 * sigma));
  if (like.dim() == 2) t.masked_fill_(like.eq(0), 0);
  return t;
}

torch::Tensor timesteps_like(const torch::Tensor& like, const torch::Tensor& t) {
  if (like.dim() != 2) return t;
  const auto per_token = t.to(torch::kFloat).to(like.device()).view({like.size(0), 1}).expand_as(like);
  return per_token.masked_fill(like.eq(0), 0);
}

torch::Tensor sample_timesteps(const torch::Tensor& t) {
  return t.dim() == 2 ? std::get<0>(t.max(1)) : t;
}

torch::Tensor keep_clean_frames(const torch::Tensor& x, const torch::Tensor& clean, const torch::Tensor& weights) {
  if (!weights.defined()) return x;
  const auto w = weights.to(x.scalar_type()).to(x.device());
  return x * w + clean.to(x.scalar_type()).to(x.device()) * (1 - w);
}

ConditionedInput ImageInput::at(const torch::Tensor& x, double sigma) const {
  auto t = torch::full({x.size(0)}, static_cast<float>(1000.0 * sigma));  // as the noiser
  if (!defined()) return {x, t, torch::Tensor()};
  if (kind == ImageCondition::kTi2v) {
    const auto tokens = (x.size(2) / patch[0]) * frame_tokens(x, patch);
    t = t.view({x.size(0), 1}).expand({x.size(0), tokens}).contiguous();
  }
  return condition_input(kind, image, x, t, patch);
}

ImageInput ImageInput::slice(std::int64_t lo, std::int64_t hi) const {
  return {kind, image.defined() ? image.slice(0, lo, hi) : image, patch};
}

ImageInput ImageInput::twice() const { return {kind, image.defined() ? torch::cat({image, image}) : image, patch}; }

torch::Tensor frame_loss_weights(const torch::Tensor& t, const torch::Tensor& x_t,
                                 const std::array<std::int64_t, 3>& patch) {
  if (t.dim() != 2) return torch::Tensor();
  const auto B = x_t.size(0), F = x_t.size(2);
  const auto tokens = frame_tokens(x_t, patch);
  WD_CHECK(t.size(0) == B && tokens <= t.size(1),
           "per-token t " << t.sizes() << " does not cover a token frame (" << tokens << ") of x_t " << x_t.sizes());
  // 1 where the sample's first token frame is noised, 0 where all its tokens are clean.
  const auto noised = t.narrow(1, 0, tokens).ne(0).any(1).to(x_t.scalar_type()).to(x_t.device());
  auto w = torch::ones({B, 1, F, 1, 1}, x_t.options());
  const auto first = std::min<std::int64_t>(patch[0], F);  // the latent frames of the first token frame
  w.narrow(2, 0, first).copy_(noised.view({B, 1, 1, 1, 1}).expand({B, 1, first, 1, 1}));
  return w;
}

torch::Tensor frame_weighted_mse(const torch::Tensor& prediction, const torch::Tensor& target,
                                 const torch::Tensor& weights) {
  if (!weights.defined()) return torch::mse_loss(prediction, target);
  const auto w = weights.to(prediction.scalar_type()).expand_as(prediction);
  // A batch whose every frame is clean has nothing to learn: its loss is 0, not 0/0.
  return ((prediction - target).pow(2) * w).sum() / w.sum().clamp_min(1);
}

}  // namespace wd
