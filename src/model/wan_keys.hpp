// Native <-> diffusers key names of the Wan DiT state_dict (spec §7).
#pragma once

#include <optional>
#include <string>

namespace wd {

/// How a checkpoint names its tensors.
enum class KeyLayout { kNative, kDiffusers };

const char* layout_name(KeyLayout layout);
/// Parses "native" / "diffusers"; throws wd::ConfigError otherwise.
KeyLayout parse_layout(const std::string& name);

/// The diffusers (`WanTransformer3DModel`) name of a native key; throws wd::Error for a key
/// the mapping does not know.
std::string native_to_diffusers(const std::string& native);
/// The native name of a diffusers key, or nullopt when it is not one of the DiT's keys.
std::optional<std::string> diffusers_to_native(const std::string& diffusers);
/// Strips the ComfyUI `model.diffusion_model.` prefix when present.
std::string strip_comfy_prefix(const std::string& key);
/// Whether a (prefix-stripped) key can only be a diffusers name.
bool looks_like_diffusers(const std::string& key);

/// Whether `s` begins with `prefix` (std::string::starts_with is C++20).
bool starts_with(const std::string& s, const std::string& prefix);

}  // namespace wd
