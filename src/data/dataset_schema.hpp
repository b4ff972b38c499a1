// The HDF5 data set's schema (docs/data-format.md): the names of its datasets and root
// attributes and the schema version, shared by validation, the reader and the writer.
#pragma once

#include <cstdint>
#include <string>

namespace wd::data {

inline constexpr std::int64_t kSchemaVersion = 1;
inline constexpr const char* kLatentLayout = "CFHW";
inline constexpr const char* kLatents = "/latents";
inline constexpr const char* kContext = "/context";
inline constexpr const char* kContextLens = "/context_lens";
inline constexpr const char* kPrompts = "/prompts";
/// Optional, in a `classes` data set: each sample's class [N] int32, each class's pattern [K,C,F,H,W].
inline constexpr const char* kLabels = "/labels";
inline constexpr const char* kClassPatterns = "/class_patterns";
inline constexpr const char* kSchemaAttr = "schema_version";
/// A data set of contexts only (prompts, no videos; train.objective trajectory) has no /latents
/// and declares the latent shape its samples would have: [C,F,H,W] int64.
inline constexpr const char* kLatentShapeAttr = "latent_shape";
inline constexpr const char* kLayoutAttr = "latent_layout";

/// How a DataError names a root attribute: "root attribute <name>".
inline std::string root_attr(const char* name) { return std::string("root attribute ") + name; }

}  // namespace wd::data
