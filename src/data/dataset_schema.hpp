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
/// Optional: each sample's image condition, [N,C,F,H,W] for an i2v teacher (the first frame's VAE
/// latent followed by the latents of zero frames; the 4 mask channels are made when read) or
/// [N,C,1,H,W] for a ti2v teacher (the first frame's latent).
inline constexpr const char* kCondition = "/condition";
inline constexpr const char* kSchemaAttr = "schema_version";
/// A data set of contexts only (prompts, no videos; train.objective trajectory) has no /latents
/// and declares the latent shape its samples would have: [C,F,H,W] int64.
inline constexpr const char* kLatentShapeAttr = "latent_shape";
inline constexpr const char* kLayoutAttr = "latent_layout";

/// How a DataError names a root attribute: "root attribute <name>".
inline std::string root_attr(const char* name) { return std::string("root attribute ") + name; }

}  // namespace wd::data
