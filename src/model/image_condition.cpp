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

}  // namespace wd
