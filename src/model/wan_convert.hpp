// convert_wan_checkpoint and convert_wan_experts: rewrite a Wan DiT checkpoint, or the two experts of
// an A14B model, in another dtype and key layout, one shard at a time, into a directory that
// appears atomically.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_experts.hpp"

namespace wd {

/// What `convert` writes.
struct ConvertOptions {
  c10::ScalarType dtype = torch::kBFloat16;
  /// Key names and config.json: native (official Wan) or diffusers (`WanTransformer3DModel`).
  KeyLayout layout = KeyLayout::kNative;
  /// With the diffusers layout: write `output` as a diffusers pipeline folder, the DiT in
  /// transformer/ beside model_index.json (write_diffusers_model_index: WanImageToVideoPipeline for
  /// an i2v model, expand_timesteps for a ti2v one), which `<Pipeline>.from_pretrained` loads;
  /// two experts (convert_wan_experts) in transformer/ and transformer_2/ with boundary_ratio.
  bool pipeline = false;
  /// Keep the fp32 islands of spec §6 in fp32 when they are stored in fp32 (see kept_in_fp32).
  bool keep_fp32 = true;
  std::uint64_t shard_bytes = 5'000'000'000;  ///< largest shard, like the official checkpoints
  bool force = false;                          ///< replace an existing output
};

/// Files written and what went into them.
struct ConvertResult {
  ShardedWriteResult files;
  std::size_t tensors = 0;
  std::size_t kept_fp32 = 0;          ///< tensors left in fp32 by the precision rule
  std::uint64_t kept_fp32_bytes = 0;
  std::uint64_t input_bytes = 0;
};

/// Whether a native key is one of the parameters the official model only ever uses in fp32
/// (spec §6): time_embedding.*, time_projection.*, blocks.N.modulation, head.modulation,
/// head.head.* and the affine LayerNorm blocks.N.norm3.*.
bool kept_in_fp32(const std::string& native_key);

/// Converts every DiT tensor of `input` (checked against its config first) to `options.dtype`
/// (fp32 islands excepted when `keep_fp32`), under the names of `options.layout`, into `output`:
/// config.json (WanConfig::to_json or to_diffusers_json),
/// `diffusion_pytorch_model[-0000k-of-0000n].safetensors` and, when sharded, the index; with
/// `options.pipeline`, those in `output`/transformer/ and model_index.json in `output`. The files
/// are written into a temporary sibling directory that is renamed to `output` when complete
/// (swapped with the old one under `force`), so a failure leaves nothing behind. At most one
/// shard's converted tensors are in memory, and the input's pages are dropped from the
/// resident set once written. Throws wd::ConfigError when `output` exists without `force`, is
/// the input, or the model cannot be written in the layout (or a pipeline asked in another
/// layout than diffusers); wd::DataError naming the file and
/// tensor for bad input.
ConvertResult convert_wan_checkpoint(const WanCheckpoint& input, const std::string& output,
                                     const ConvertOptions& options);

/// Converts the two experts of `experts` (an A14B teacher, or a LoRA pair whose experts open as
/// their bases with the adapters merged, in fp32 as above) into one folder: with
/// `options.pipeline`, a diffusers pipeline folder laid out as Wan2.2-T2V-A14B-Diffusers, the
/// high-noise expert in transformer/, the low-noise one in transformer_2/ and model_index.json
/// with boundary_ratio experts.boundary(); in the native layout, the official
/// high_noise_model/ and low_noise_model/ (which record no boundary: a warning when it is not
/// the model type's default). Same checks, staging and publishing as convert_wan_checkpoint;
/// a ConfigError for the diffusers layout without a pipeline (one WanTransformer3DModel folder
/// holds one DiT). Returns each expert's result, {low, high}.
std::array<ConvertResult, 2> convert_wan_experts(const WanExperts& experts, const std::string& output,
                                                 const ConvertOptions& options);

}  // namespace wd
