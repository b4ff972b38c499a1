// LoRA folders and files: a LoRA student's adapters beside the base checkpoint they adapt
// (what `train` writes as RUN/student), the files the Wan ecosystem loads (diffusers' and
// ComfyUI's key layouts, `convert --layout lora`), and reading any of them back.
#pragma once

#include <torch/torch.h>

#include <array>
#include <map>
#include <string>
#include <utility>

#include "model/wan_config.hpp"
#include "model/wan_dit.hpp"

namespace wd {

/// Files of a LoRA student folder and of an export.
inline constexpr const char* kLoraJson = "lora.json";
inline constexpr const char* kLoraAdapters = "adapters.safetensors";
inline constexpr const char* kDiffusersLoraFile = "pytorch_lora_weights.safetensors";
inline constexpr const char* kComfyLoraFile = "wan_lora_comfyui.safetensors";

/// Adapters by native linear name (`blocks.3.self_attn.q`): (down [r, in], up [out, r]), fp32.
using LoraAdapters = std::map<std::string, std::pair<torch::Tensor, torch::Tensor>>;

/// A LoRA student folder: lora.json {format, version, base, rank, alpha, targets} and
/// adapters.safetensors (`<linear>.lora_down`, `<linear>.lora_up`, unscaled).
struct LoraFolder {
  std::string dir;   ///< where it was read from (messages)
  std::string base;  ///< the base checkpoint (absolute path as written)
  LoraSpec spec;
  LoraAdapters adapters;
  /// `weight` + scale · up · down, in fp32 (the weight of `linear`).
  torch::Tensor merged(const std::string& linear, const torch::Tensor& weight) const;
};

/// True when `path` is a directory holding lora.json.
bool is_lora_folder(const std::string& path);
/// Writes `model`'s adapters as a LoRA student folder over `base` (each file atomically).
void write_lora_folder(const WanDiTImpl& model, const std::string& dir, const std::string& base);
/// Reads and validates a LoRA student folder; throws DataError naming the file and the field.
LoraFolder read_lora_folder(const std::string& dir);

/// A two-expert (A14B) LoRA pair: a folder whose two-expert subfolders (WanExperts::folders:
/// high_noise_model/ and low_noise_model/, or a diffusers pipeline's transformer/ and
/// transformer_2/) are LoRA folders, one per expert (student.expert high and low runs).
bool is_lora_pair(const std::string& dir);
/// Checks that `low` and `high` (the pair `dir`'s subfolders) adapt the low- and high-noise
/// experts of one two-expert teacher: their bases are that folder's two expert subfolders, the
/// high one's high_noise_model/ or transformer/, the low one's low_noise_model/ or transformer_2/.
/// DataError naming the lora.json and its base field otherwise.
void check_lora_pair(const LoraFolder& low, const LoraFolder& high, const std::string& dir);
/// Reads the pair `dir`, {low, high}, checked by check_lora_pair.
std::array<LoraFolder, 2> read_lora_pair(const std::string& dir);

/// Writes DIR/pytorch_lora_weights.safetensors (diffusers / peft: `transformer.<diffusers
/// linear>.lora_A.weight` = down, `.lora_B.weight` = scale · up, so it loads right with
/// diffusers' default alpha = rank) and DIR/wan_lora_comfyui.safetensors (ComfyUI:
/// `diffusion_model.<native linear>.lora_down.weight`, `.lora_up.weight` = scale · up, `.alpha` =
/// rank), both in `dtype`, into an existing directory.
void write_lora_exports(const LoraFolder& lora, const std::string& dir, c10::ScalarType dtype);

/// A LoRA file read for import: rank and, per linear, (down, up) with every scale folded into
/// up (the weight delta is up · down).
struct ImportedLora {
  std::int64_t rank = 0;
  LoraAdapters adapters;
};
/// Reads a LoRA in any of the layouts above (ours, diffusers / peft with or without the
/// `transformer.` prefix, ComfyUI's lora_down/lora_up with optional alpha, or a LoRA student
/// folder) for a model of `config`. Throws DataError naming the file and the key for a key that
/// is no adapter of a block linear, a missing half, or shapes that do not fit the config.
ImportedLora read_lora_file(const std::string& path, const WanConfig& config);
/// Sets `model`'s adapters (add_lora done) from `lora`: down as read, up / the model's scale.
/// The ranks must be equal and every linear of the file one of the model's targets (ConfigError).
void load_lora_into(WanDiTImpl& model, const ImportedLora& lora, const std::string& path);

}  // namespace wd
