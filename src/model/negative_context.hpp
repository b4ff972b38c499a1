// The negative prompt's encoding for classifier-free guidance, from a safetensors file.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace wd {

/// The `context` tensor of `path`, [L,text_dim] or [1,L,text_dim], as [L,text_dim] fp32 on the
/// host; DataError naming the file and the tensor when missing or of another width than
/// `text_dim`.
torch::Tensor load_negative_context(const std::string& path, std::int64_t text_dim);

}  // namespace wd
