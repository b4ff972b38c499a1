// Wan 2.2's image conditions as the model takes them (docs/data-format.md, "Image conditions").
#pragma once

#include <torch/torch.h>

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

}  // namespace wd
