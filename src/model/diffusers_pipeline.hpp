// DiffusersPipeline: the DiT part of a diffusers Wan pipeline folder (model_index.json with
// transformer/ and, for the Wan 2.2 A14B pair, transformer_2/ and boundary_ratio), and writing
// the model_index.json of such a folder.
#pragma once

#include <optional>
#include <string>

#include "model/wan_config.hpp"

namespace wd {

struct DiffusersPipeline {
  static constexpr const char* kIndexName = "model_index.json";
  /// The only DiT, or the high-noise expert of a pair (diffusers runs it for t >= boundary).
  static constexpr const char* kTransformer = "transformer";
  /// The low-noise expert of a pair.
  static constexpr const char* kTransformer2 = "transformer_2";

  std::string path;                      ///< the pipeline folder
  std::string class_name;                ///< WanPipeline, WanImageToVideoPipeline, ...
  bool two_experts = false;              ///< model_index.json names a transformer_2
  std::optional<double> boundary_ratio;  ///< absent or null in the file: none

  /// Whether `path` is a directory holding model_index.json.
  static bool is_pipeline_dir(const std::string& path);
  /// Reads `path`/model_index.json. Throws wd::DataError naming the file and the field when it
  /// is not JSON, names no WanTransformer3DModel as transformer, names another class as
  /// transformer_2, or has a boundary_ratio that is not a number in (0, 1).
  static DiffusersPipeline read(const std::string& path);

  /// `path`/transformer: the only DiT or the high-noise expert.
  std::string transformer_dir() const;
  /// `path`/transformer_2: the low-noise expert.
  std::string transformer_2_dir() const;
};

/// Writes `dir`/model_index.json of a Wan pipeline whose DiT is `transformer/` alone or, with
/// `two_experts`, the pair `transformer/` (high) + `transformer_2/` (low) with `boundary_ratio`.
/// Class and `expand_timesteps` follow config.model_type (i2v: WanImageToVideoPipeline; ti2v:
/// per-token timesteps). Only the DiT entries are written: the text encoder, VAE and scheduler
/// are not this project's to provide.
void write_diffusers_model_index(const std::string& dir, const WanConfig& config, bool two_experts,
                                 std::optional<double> boundary_ratio);

}  // namespace wd
