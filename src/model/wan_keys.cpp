// The renaming table between native Wan keys and diffusers keys (scripts/convert_wan_to_diffusers.py).
#include "model/wan_keys.hpp"

#include <array>
#include <utility>

#include "core/errors.hpp"

namespace wd {

namespace {

// Sub-path renames, applied to the part after "blocks.N." (or to the whole key outside blocks).
// Order matters only in that longer native prefixes come first.
constexpr std::array<std::pair<const char*, const char*>, 17> kRenames{{
    {"text_embedding.0.", "condition_embedder.text_embedder.linear_1."},
    {"text_embedding.2.", "condition_embedder.text_embedder.linear_2."},
    {"time_embedding.0.", "condition_embedder.time_embedder.linear_1."},
    {"time_embedding.2.", "condition_embedder.time_embedder.linear_2."},
    {"time_projection.1.", "condition_embedder.time_proj."},
    {"head.modulation", "scale_shift_table"},
    {"head.head.", "proj_out."},
    // inside a block:
    {"modulation", "scale_shift_table"},
    {"self_attn.o.", "attn1.to_out.0."},
    {"cross_attn.o.", "attn2.to_out.0."},
    {"self_attn.norm_", "attn1.norm_"},
    {"cross_attn.norm_", "attn2.norm_"},
    {"self_attn.", "attn1.to_"},   // q, k, v
    {"cross_attn.", "attn2.to_"},  // q, k, v
    {"norm3.", "norm2."},          // the affine cross-attention norm: names swapped in diffusers
    {"ffn.0.", "ffn.net.0.proj."},
    {"ffn.2.", "ffn.net.2."},
}};

/// Splits "blocks.N.rest" into ("blocks.N.", "rest"); ("", key) outside blocks.
std::pair<std::string, std::string> split_block(const std::string& key) {
  if (!starts_with(key, "blocks.")) return {"", key};
  const auto dot = key.find('.', 7);
  if (dot == std::string::npos) return {"", key};
  return {key.substr(0, dot + 1), key.substr(dot + 1)};
}

}  // namespace

const char* layout_name(KeyLayout layout) {
  return layout == KeyLayout::kNative ? "native" : "diffusers";
}

KeyLayout parse_layout(const std::string& name) {
  if (name == "native") return KeyLayout::kNative;
  if (name == "diffusers") return KeyLayout::kDiffusers;
  throw ConfigError("layout(" + name + ") must be native or diffusers");
}

std::string native_to_diffusers(const std::string& native) {
  if (starts_with(native, "patch_embedding.")) return native;
  const auto [block, rest] = split_block(native);
  const std::size_t first = block.empty() ? 0 : 7;  // block-level renames start at index 7
  const std::size_t last = block.empty() ? 7 : kRenames.size();
  for (std::size_t i = first; i < last; ++i) {
    const std::string from = kRenames[i].first;
    if (starts_with(rest, from)) return block + kRenames[i].second + rest.substr(from.size());
  }
  throw Error("no diffusers name for Wan key '" + native + "'");
}

std::optional<std::string> diffusers_to_native(const std::string& diffusers) {
  if (starts_with(diffusers, "patch_embedding.")) return diffusers;
  const auto [block, rest] = split_block(diffusers);
  const std::size_t first = block.empty() ? 0 : 7;
  const std::size_t last = block.empty() ? 7 : kRenames.size();
  for (std::size_t i = first; i < last; ++i) {
    const std::string to = kRenames[i].second;
    if (!starts_with(rest, to)) continue;
    auto native = block + kRenames[i].first + rest.substr(to.size());
    // "attn1.to_" is a prefix of "attn1.to_out.0."; accept only exact inverses.
    try {
      if (native_to_diffusers(native) == diffusers) return native;
    } catch (const Error&) {
      // not a DiT key under this rename; try the next one
    }
  }
  return std::nullopt;
}

std::string strip_comfy_prefix(const std::string& key) {
  static const std::string kPrefix = "model.diffusion_model.";
  return starts_with(key, kPrefix) ? key.substr(kPrefix.size()) : key;
}

bool looks_like_diffusers(const std::string& key) {
  // Native blocks have no affine norm2, so a block's norm2 parameter is diffusers' cross norm.
  for (const char* marker : {"condition_embedder.", "scale_shift_table", "proj_out.", ".attn1.",
                             ".attn2.", ".ffn.net.",
                             ".norm2."}) {
    if (key.find(marker) != std::string::npos) return true;
  }
  return false;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace wd
