// What a validated HDF5 data set holds (DatasetInfo) and its validation against the schema and
// the teacher's expectations.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/choices.hpp"

namespace wd::data {

/// What the teacher needs the data set to look like (from the teacher's model config).
struct DatasetExpectations {
  std::int64_t latent_channels = 0;  ///< C of /latents (teacher in_dim, minus y channels for i2v)
  std::int64_t text_dim = 0;         ///< last dim of /context
  std::int64_t text_len = 0;         ///< /context rows must be <= this
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< F, H, W must be divisible by these
  /// The image condition the teacher takes: i2v needs /condition, ti2v reads it when present
  /// (its image mode), none refuses it unless ignore_condition. Unchecked without a teacher
  /// (latent_channels 0).
  ImageCondition condition = ImageCondition::kNone;
  bool ignore_condition = false;  ///< data.ignore_condition: train a none teacher on conditioned data
};

/// Facts read from a validated data set file.
struct DatasetInfo {
  std::string path;
  std::int64_t samples = 0;                    ///< N
  std::array<std::int64_t, 4> latent_shape{};  ///< C, F, H, W
  std::int64_t context_len = 0;                ///< L (rows per sample in /context)
  std::int64_t text_dim = 0;
  std::string latent_dtype;   ///< "float32" | "float16"
  std::string context_dtype;  ///< "float32" | "float16"
  bool has_prompts = false;
  /// false: contexts only (no /latents; latent_shape from the root attribute latent_shape)
  bool has_latents = true;
  /// /condition is present (its shape C, F, H, W), and read unless ignored (data.ignore_condition).
  bool has_condition = false;
  std::array<std::int64_t, 4> condition_shape{};
  std::string condition_dtype;  ///< "float32" | "float16"
  bool condition_ignored = false;
  /// How the model takes the condition read (the expectations' condition: i2v's y, or ti2v's
  /// first frame); none when it is not read or there is no teacher to take it.
  ImageCondition condition_kind = ImageCondition::kNone;
  bool reads_condition() const { return has_condition && !condition_ignored; }
  std::int64_t schema_version = 1;
  std::string latent_layout;  ///< root attribute, "CFHW"
};

/// Opens `path` read-only and validates it. A contexts-only data set (no /latents) declares its
/// latent shape in the root attribute latent_shape [C,F,H,W]; N is then /context's. (datasets present, ranks, dims matching
/// `expect`, dtype classes, N >= 1, context_lens within 1..L, sizes within the file). Every
/// problem is a wd::DataError naming the file, the dataset and the expected value.
DatasetInfo validate_dataset(const std::string& path, const DatasetExpectations& expect);

}  // namespace wd::data
