// WanConfig: the hyper-parameters of a Wan 2.2 DiT, its presets, config.json I/O and the
// list of its parameters (names, shapes) in the official state_dict order.
#pragma once

#include <array>
#include <map>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wd {

/// The diffusers release whose `WanTransformer3DModel` the diffusers config.json we write was
/// checked against (launch/requirements.txt; tests/python/test_diffusers_interop.py).
inline constexpr const char* kDiffusersVersion = "0.42.1";

/// Fields and defaults of the official `WanModel.__init__` (spec §1, §8).
struct WanConfig {
  std::string model_type = "t2v";  ///< t2v | i2v | ti2v
  std::array<std::int64_t, 3> patch_size{1, 2, 2};
  std::int64_t text_len = 512;
  std::int64_t in_dim = 16;
  std::int64_t dim = 2048;
  std::int64_t ffn_dim = 8192;
  std::int64_t freq_dim = 256;
  std::int64_t text_dim = 4096;
  std::int64_t out_dim = 16;
  std::int64_t num_heads = 16;
  std::int64_t num_layers = 32;
  std::array<std::int64_t, 2> window_size{-1, -1};
  bool qk_norm = true;
  bool cross_attn_norm = true;
  double eps = 1e-6;

  std::int64_t head_dim() const { return dim / num_heads; }
  std::int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }

  /// Throws wd::ConfigError listing every inconsistent field with its value; `source` names
  /// where the config came from (a file or "preset tiny").
  void validate(const std::string& source) const;

  /// Presets: tiny (a few MB, for this machine and tests), wan22-ti2v-5b, wan22-t2v-a14b,
  /// wan22-i2v-a14b (one expert each). Throws wd::ConfigError for an unknown name.
  static WanConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  /// Parses config.json text: native field names (absent fields take the constructor defaults,
  /// as the official loader does for `ignore_for_config` fields) or the diffusers
  /// `WanTransformer3DModel` names (docs/checkpoints.md has the mapping; `_wan_model_type` and
  /// `_wan_text_len` are read when present). Errors are wd::DataError naming `source` and the
  /// field.
  static WanConfig from_json(const std::string& text, const std::string& source);
  /// Reads and parses a config.json file.
  static WanConfig load(const std::string& path);
  /// Native config.json with every field written (pretty, stable order).
  std::string to_json() const;
  /// diffusers `WanTransformer3DModel` config.json: every argument of its constructor, keys
  /// sorted as diffusers writes them, plus `_wan_model_type` and `_wan_text_len`, which diffusers
  /// skips (private `_` fields) and from_json reads back, so nothing is lost. Throws
  /// wd::ConfigError for a model diffusers cannot express (qk_norm false: its attention always
  /// has norm_q / norm_k).
  std::string to_diffusers_json() const;

  /// One line: "t2v dim 64 ffn 128 heads 4 layers 2 in 16 out 16 text 32x8".
  std::string summary() const;

  /// A field in which two configs differ, with this config's value and the other's.
  struct Difference {
    std::string field, mine, other;
  };
  /// Every field, in declaration order, in which `other` differs from this config.
  std::vector<Difference> differences(const WanConfig& other) const;
};

/// What the random initialiser draws for a parameter (the scheme of the golden vectors).
enum class ParamKind { kWeight, kBias, kModulation, kNormGain };

/// Low-rank adapters on a DiT's block linears (LoRA): for each target linear with weight W
/// [out, in], W' = W + (alpha / rank) · up · down, down [rank, in], up [out, rank]. Targets are
/// native linear names, `blocks.<i>.<self_attn|cross_attn>.<q|k|v|o>` and `blocks.<i>.ffn.<0|2>`.
struct LoraSpec {
  std::int64_t rank = 0;  ///< 0: no adapters
  double alpha = 0;       ///< the scale is alpha / rank
  std::vector<std::string> targets;
  double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 0.0; }
};

/// The block linears `student.lora_targets` names: a comma list of `q`, `k`, `v`, `o` (both
/// attentions), `self_attn`, `cross_attn`, `attn` (both), `ffn`, `all`, or exact in-block names
/// (`self_attn.q`, `ffn.0`, ...); expanded over every block. Throws ConfigError naming `key`,
/// the word and the accepted words.
std::vector<std::string> lora_target_linears(const std::string& list, std::int64_t num_layers,
                                             const std::string& key = "student.lora_targets");

/// One parameter of the DiT under its native name.
struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  ParamKind kind;
  std::int64_t numel() const;
};

/// Every parameter of the official state_dict, in its order (spec §7): 15 + 27 per block.
std::vector<ParamSpec> wan_param_specs(const WanConfig& config);
/// Total parameter count.
std::int64_t wan_param_count(const WanConfig& config);
/// Every block linear of `config` (`blocks.<i>.self_attn.q`, ..., `blocks.<i>.ffn.2`) with its
/// weight's (out, in): what a LoRA may adapt.
std::map<std::string, std::pair<std::int64_t, std::int64_t>> block_linear_shapes(const WanConfig& config);
/// Adapter parameters of `spec` on a DiT of `config`: rank · (in + out) per target linear.
std::int64_t lora_param_count(const WanConfig& config, const LoraSpec& spec);

}  // namespace wd
