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

}  // namespace wd
