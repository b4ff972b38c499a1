// WanCheckpoint: an official (or diffusers / ComfyUI) Wan DiT checkpoint on disk, opened
// without reading its tensors, validated against its config, and loaded into a WanDiT.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/choices.hpp"
#include "model/safetensors.hpp"
#include "model/wan_config.hpp"
#include "model/wan_dit.hpp"
#include "model/wan_keys.hpp"
#include "model/wan_lora.hpp"

namespace wd {

/// File-name stem of a diffusers-layout checkpoint: `<stem>.safetensors` or its shards and index.
inline constexpr const char* kCheckpointStem = "diffusion_pytorch_model";

class WanCheckpoint {
 public:
  /// Opens `path`: a directory with `diffusion_pytorch_model.safetensors.index.json` and its
  /// shards, a directory holding exactly one .safetensors file, a single .safetensors file, or
  /// a diffusers pipeline folder with one DiT (its transformer/; a two-expert one is refused).
  /// The config is `config_path` when given, else config.json in the directory (or beside the
  /// file). Every file is mapped and validated; no tensor data is read.
  /// A LoRA student folder (lora.json, model/wan_lora.hpp) opens as its base with the adapters
  /// merged: every target weight reads as W + scale · up · down, everything else as the base's.
  static WanCheckpoint open(const std::string& path, const std::string& config_path = "");

  const std::string& path() const { return path_; }
  const std::string& config_path() const { return config_path_; }
  const WanConfig& config() const { return config_; }
  KeyLayout layout() const { return layout_; }
  /// True when keys carried the ComfyUI `model.diffusion_model.` prefix.
  bool prefixed() const { return prefixed_; }
  /// The safetensors files, in index order.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::size_t tensor_count() const { return entries_.size(); }
  /// Bytes of tensor data over all files.
  std::uint64_t total_bytes() const;
  /// Tensor count and bytes per safetensors dtype name.
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> dtype_summary() const;

  /// Missing, unexpected and mis-shaped keys with respect to the config, all of them.
  std::vector<std::string> problems() const;
  /// Throws one wd::DataError listing every problem.
  void check() const;

  bool contains(const std::string& native_key) const { return entries_.count(native_key) > 0; }
  const TensorInfo& info(const std::string& native_key) const;
  /// A tensor under its native name as a zero-copy CPU view of the mapping, or converted to
  /// `dtype` / `device` when they differ from the stored ones.
  torch::Tensor tensor(const std::string& native_key,
                       std::optional<c10::ScalarType> dtype = std::nullopt,
                       const torch::Device& device = torch::kCPU) const;
  /// The file a tensor is stored in and its name there (for error messages).
  std::pair<std::string, std::string> location(const std::string& native_key) const;
  /// Drops a tensor's mapped pages from the resident set (streaming readers, see
  /// SafetensorsFile::release).
  void release(const std::string& native_key) const;
  /// The adapters merged into this checkpoint's tensors (a LoRA student folder), else null.
  const LoraFolder* lora() const { return lora_.get(); }
  /// Whether tensor(native_key) is a base weight with its adapters merged (computed in fp32, then
  /// given the base's stored dtype unless another is asked).
  bool merges(const std::string& native_key) const { return merged_.count(native_key) > 0; }

 private:
  struct Entry {
    std::size_t file;
    std::string stored_name;
  };
  void add_file(SafetensorsFile file);
  /// A LoRA folder (lora.json): its base opened, its adapters checked against it and merged on read.
  static WanCheckpoint open_lora(const std::string& path, const std::string& config_path);
  /// The shards a folder's safetensors index names, each checked to hold the tensors it is named for.
  void add_indexed_shards(const std::string& dir);
  /// Decides the layout from all keys, then maps every stored name to its native name.
  void index_keys();
  std::string path_;
  std::string config_path_;
  WanConfig config_;
  KeyLayout layout_ = KeyLayout::kNative;
  bool prefixed_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry> entries_;        ///< native name -> where it is stored
  std::vector<std::string> unmapped_;           ///< stored names that are no DiT key
  std::shared_ptr<const LoraFolder> lora_;     ///< adapters merged on read (LoRA folder)
  std::map<std::string, std::string> merged_;  ///< weight key -> its linear, for lora_
};

/// Builds a frozen WanDiT over the checkpoint's tensors: weights kept as stored are zero-copy
/// views of the mapping (nothing is read until used); others are converted to `dtype` on
/// `device`, with progress logged for long loads. Without `dtype` every tensor keeps its stored
/// dtype, so a mixed file (bf16 with fp32 time/modulation/head/LayerNorm tensors, as `convert`
/// writes) loads entirely zero-copy; the model's dtype is then patch_embedding's. Throws
/// wd::DataError listing every problem. With `blocks` = [begin, end) only those blocks are
/// loaded (a pipeline stage); the others stay 0-element placeholders and must not be run.
WanDiT load_wan_dit(const WanCheckpoint& checkpoint,
                    std::optional<c10::ScalarType> dtype = std::nullopt,
                    const torch::Device& device = torch::kCPU,
                    std::optional<std::pair<std::int64_t, std::int64_t>> blocks = std::nullopt);

/// The block index of a native key `blocks.<i>.…`, or -1 for the embeddings and the head.
std::int64_t wan_block_of(const std::string& native_key);

/// The config.json of a checkpoint in `layout`: WanConfig::to_json (native) or
/// to_diffusers_json (diffusers; throws wd::ConfigError for a model diffusers cannot express).
std::string wan_config_json(const WanConfig& config, KeyLayout layout);

/// Writes a randomly initialised DiT: config.json (in `layout`), then the tensors (names in
/// `layout`) produced one shard at a time (never all in memory) into shards of at most
/// `shard_bytes` with `diffusion_pytorch_model.safetensors.index.json`, or one
/// `diffusion_pytorch_model.safetensors` when they fit.
ShardedWriteResult write_random_wan_checkpoint(const std::string& dir, const WanConfig& config,
                                               c10::ScalarType dtype, std::uint64_t shard_bytes,
                                               std::uint64_t seed,
                                               KeyLayout layout = KeyLayout::kNative);

/// Parses "fp32|bf16|fp16" (also "float32", "bfloat16", "float16").
c10::ScalarType parse_dtype(const std::string& name);
const char* dtype_name(c10::ScalarType dtype);
/// A dtype option's value as a dtype; nullopt for auto (each tensor as stored).
std::optional<c10::ScalarType> dtype_of(DtypeChoice choice);

}  // namespace wd
