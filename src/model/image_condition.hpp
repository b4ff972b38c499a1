// Wan 2.2's image conditions as the model takes them (docs/data-format.md, "Image conditions").
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>

#include "core/choices.hpp"
#include "model/wan_config.hpp"

namespace wd {

/// Channels of the mask an i2v model's y starts with: latent frame 0 stands for 4 video frames
/// (the VAE's temporal stride), each with its own mask channel.
inline constexpr std::int64_t kI2vMaskChannels = 4;

/// An i2v model's y for a batch of image latents [B,C,F,H,W] (the first frame's VAE latent
/// followed by the latents of zero frames, as a data set's /condition holds them): the mask,
/// ones at latent frame 0 and zeros after, then the latents: [B, 4 + C, F, H, W], on the
/// latents' device and dtype. This is the y of the official Wan 2.2 I2V code and of diffusers'
/// WanImageToVideoPipeline.prepare_latents.
torch::Tensor i2v_condition(const torch::Tensor& image_latents);

/// The image condition a model of `c`'s type takes (none for t2v).
ImageCondition image_condition_of(const WanConfig& c);

/// The channels of the noisy latents `c` takes, its data set's C: in_dim, less the condition's
/// channels for i2v (whose in_dim also counts y: out_dim + 4 + out_dim).
std::int64_t latent_channels_of(const WanConfig& c);

/// The channels of the y `c` takes beside the noisy latents: in_dim − out_dim for i2v, else 0.
std::int64_t condition_channels_of(const WanConfig& c);

/// A batch's model inputs with its image condition taken as its model type takes it.
struct ConditionedInput {
  torch::Tensor x_t;  ///< ti2v: the first latent frame is the image
  torch::Tensor t;    ///< ti2v: [B,S], the first frame's tokens at t = 0
  torch::Tensor y;    ///< i2v: i2v_condition(image); otherwise undefined
};

/// The inputs (x_t [B,C,F,H,W], t) with `image` (the data set's /condition rows) as `kind` takes
/// it: i2v: y = i2v_condition(image), x_t and t unchanged; ti2v (TI2V-5B's image mode, `image`
/// [B,C,1,H,W]): x_t's first latent frame replaced by the image and, t being per token [B,S]
/// (tokens in (f, h, w) order over the `patch` grid), the tokens of the first token frame at
/// t = 0, as the official code's mask does; none or an undefined image: unchanged. The inputs
/// are not modified.
ConditionedInput condition_input(ImageCondition kind, const torch::Tensor& image, const torch::Tensor& x_t,
                                 const torch::Tensor& t, const std::array<std::int64_t, 3>& patch);

/// A sampler's state after a step, with what the condition fixes put back: ti2v: the first latent
/// frame is the image again (the official sampler re-imposes it after every step); otherwise `x`.
torch::Tensor keep_condition(ImageCondition kind, const torch::Tensor& image, const torch::Tensor& x);

/// The timesteps at σ of a batch whose timesteps are `like` ([B], or per token [B,S]): fp32
/// 1000·σ everywhere but on the tokens `like` has at 0 (a clean image frame), which stay 0.
torch::Tensor timesteps_at(const torch::Tensor& like, double sigma);

/// Timesteps shaped as `like` ([B], or per token [B,S]) at each sample's own `t` [B] (fp32, on
/// `like`'s device), with the tokens `like` has at 0 (a clean image frame) staying 0; for a `like`
/// of [B], `t` itself.
torch::Tensor timesteps_like(const torch::Tensor& like, const torch::Tensor& t);

/// Each sample's timestep [B] of timesteps `t` ([B], or per token [B,S]: the largest, its noised
/// tokens'; a clean image frame's are 0).
torch::Tensor sample_timesteps(const torch::Tensor& t);

/// `x` [B,C,F,H,W] with the frames whose weight (frame_loss_weights, [B,1,F,1,1]) is 0 taken from
/// `clean`: a sample's clean image frame kept through steps that move the rest (x·w + clean·(1 − w));
/// `x` itself when `weights` is undefined. Gradients flow through `x`'s weighted frames alone.
torch::Tensor keep_clean_frames(const torch::Tensor& x, const torch::Tensor& clean, const torch::Tensor& weights);

/// A sampler's image condition: a batch's /condition rows and how its model takes them.
struct ImageInput {
  ImageCondition kind = ImageCondition::kNone;
  torch::Tensor image;  ///< [B,C,F,H,W] (i2v) or [B,C,1,H,W] (ti2v); undefined: none
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< the model's (ti2v's per-token t)

  bool defined() const { return image.defined() && kind != ImageCondition::kNone; }
  /// The model's inputs at state `x` [B,C,F,H,W] and σ: t = 1000·σ in fp32 on the host ([B], or
  /// for ti2v [B, tokens] with the first frame's at 0), i2v's y, ti2v's first frame the image.
  ConditionedInput at(const torch::Tensor& x, double sigma) const;
  /// `x` with what the condition fixes put back (keep_condition).
  torch::Tensor keep(const torch::Tensor& x) const { return keep_condition(kind, image, x); }
  /// Samples [lo, hi).
  ImageInput slice(std::int64_t lo, std::int64_t hi) const;
  /// The rows twice over, for a batched [cond; neg] forward.
  ImageInput twice() const;
};

/// The loss weights of a batch's latent frames [B,1,F,1,1] (x_t's dtype and device): 0 for the
/// first token frame of each sample whose tokens there all have t = 0 (a clean image the model
/// is given, not asked for: ti2v's image mode, noise.first_frame_clean), 1 elsewhere. Undefined
/// when t is per sample ([B]): every frame counts. Computed on t's device, with no host read.
torch::Tensor frame_loss_weights(const torch::Tensor& t, const torch::Tensor& x_t,
                                 const std::array<std::int64_t, 3>& patch);

/// The mean squared error of `prediction` against `target` over the elements whose frame weight
/// (frame_loss_weights, broadcast over C, H and W) is 1; torch::mse_loss when `weights` is undefined.
torch::Tensor frame_weighted_mse(const torch::Tensor& prediction, const torch::Tensor& target,
                                 const torch::Tensor& weights);

}  // namespace wd
