// Wan 2.2's image conditions as the model takes them (docs/data-format.md, "Image conditions").
#pragma once

#include <torch/torch.h>

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

}  // namespace wd
