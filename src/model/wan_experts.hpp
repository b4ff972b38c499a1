// WanExperts: the Wan 2.2 A14B two-expert (MoE) teacher on disk — a high-noise and a low-noise
// WanCheckpoint with one architecture, the timestep boundary between them, per-sample routing,
// and the reference forward that runs each expert on its samples and merges the outputs.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_config.hpp"
#include "model/wan_dit.hpp"

namespace wd {

/// The boundary Wan 2.2 uses for a model_type's two experts (official_samplers: T2V-A14B 0.875,
/// I2V-A14B 0.9); none for the others (TI2V-5B is a single dense model).
std::optional<double> default_expert_boundary(const std::string& model_type);

/// Throws wd::DataError when two expert configs describe different architectures, naming both
/// config.json paths and every differing field with both values.
void check_same_architecture(const WanConfig& low, const std::string& low_path,
                             const WanConfig& high, const std::string& high_path);

class WanExperts {
 public:
  /// Expert indices of a two-expert teacher (the order of the official (low, high) tuples).
  static constexpr std::size_t kLow = 0;
  static constexpr std::size_t kHigh = 1;
  /// Subfolder names of the official A14B checkpoints.
  static constexpr const char* kLowDir = "low_noise_model";
  static constexpr const char* kHighDir = "high_noise_model";

  /// The expert subfolders of a two-expert folder and the boundary the folder records.
  struct Folders {
    /// {low, high}: {low_noise_model, high_noise_model} (official) or {transformer_2,
    /// transformer} (diffusers pipeline).
    std::array<std::string, 2> names;
    /// boundary_ratio of a diffusers pipeline's model_index.json, when set there.
    std::optional<double> boundary;
  };
  /// The expert subfolders of `path` when it is a two-expert folder: the official layout (a
  /// directory with high_noise_model/ or low_noise_model/ in it) or a diffusers pipeline whose
  /// model_index.json names a transformer_2; nullopt for anything else.
  static std::optional<Folders> folders(const std::string& path);
  /// True when folders(path) finds a two-expert folder.
  static bool is_two_expert_dir(const std::string& path);

  /// Opens `path`: a two-expert folder (both subfolders required) or anything
  /// WanCheckpoint::open takes (one expert). `boundary` (0 < b < 1) overrides the folder's own
  /// (a diffusers pipeline's boundary_ratio; for a LoRA pair, its teacher's, the folder holding
  /// both bases), which overrides the model_type's default; a
  /// two-expert folder with neither needs it. `config_path` overrides the config of a single
  /// checkpoint; a two-expert folder refuses it (each expert has its own config.json).
  static WanExperts open(const std::string& path, std::optional<double> boundary = std::nullopt,
                         const std::string& config_path = "");
  /// From opened checkpoints: {one} or {low, high}. Same checks as open.
  static WanExperts from_checkpoints(std::vector<WanCheckpoint> experts,
                                     std::optional<double> boundary, const std::string& path);

  const std::string& path() const { return path_; }
  std::size_t size() const { return experts_.size(); }
  bool two_experts() const { return experts_.size() == 2; }
  const WanCheckpoint& expert(std::size_t i) const { return experts_.at(i); }
  const std::vector<WanCheckpoint>& experts() const { return experts_; }
  /// The architecture shared by every expert (the low-noise expert's config).
  const WanConfig& config() const { return experts_.front().config(); }
  /// The boundary ratio; for a single model it is the default of its type (unused) or 0.
  double boundary() const { return boundary_; }
  /// Where a two-expert teacher's boundary came from, for logs: "set explicitly", the
  /// boundary_ratio of a pipeline's model_index.json, or the official model's default; "" for one.
  const std::string& boundary_origin() const { return boundary_origin_; }
  /// boundary · num_train_timesteps (1000), computed as the official pipelines do.
  double boundary_timestep() const { return boundary_ * 1000.0; }
  /// The expert's subfolder ("low_noise_model" / "high_noise_model", or "transformer_2" /
  /// "transformer" in a diffusers pipeline), or "model" for a single checkpoint.
  std::string expert_name(std::size_t i) const;

  /// The expert for one model timestep t = 1000·σ': kHigh when trunc(t) >= boundary_timestep()
  /// (the official sampler compares the int64 timestep), else kLow; always 0 for one expert.
  std::size_t expert_for(double t) const;
  /// Sample indices per expert (ascending), for t [B] float model timesteps. A [B,S] per-token
  /// t is taken when every row is constant (its value is the sample's timestep); rows that vary
  /// are refused, since an expert runs whole samples (the A14B pipelines pass one t per sample;
  /// per-token t is the dense TI2V-5B's).
  std::vector<std::vector<std::int64_t>> route(const torch::Tensor& t) const;

 private:
  std::string path_;
  std::vector<WanCheckpoint> experts_;
  std::array<std::string, 2> names_{kLowDir, kHighDir};
  double boundary_ = 0.0;
  std::string boundary_origin_;
};

/// The samples `samples` (indices into the batch, in that order) of `inputs`; `t` rows follow.
/// seq_len is kept, and an unset one (0) is fixed to the full batch's largest token count
/// (from `patch_size`), so each sample is padded exactly as in the full batch and a per-token
/// t keeps its width.
WanInputs select_samples(const WanInputs& inputs, const std::vector<std::int64_t>& samples,
                         const std::array<std::int64_t, 3>& patch_size);

/// Puts per-expert outputs back into batch order: outputs[e][j] is sample routes[e][j].
/// Throws unless the routes cover 0..batch-1 exactly once and each output list matches its route.
std::vector<torch::Tensor> merge_expert_outputs(
    const std::vector<std::vector<std::int64_t>>& routes,
    const std::vector<std::vector<torch::Tensor>>& outputs, std::int64_t batch);
/// The same for batched tensors: outputs[e] is [routes[e].size(), ...]; returns [batch, ...].
/// An expert with no samples may pass an undefined tensor.
torch::Tensor merge_expert_batches(const std::vector<std::vector<std::int64_t>>& routes,
                                   const std::vector<torch::Tensor>& outputs, std::int64_t batch);

/// Loads every expert with load_wan_dit, in the experts' order.
std::vector<WanDiT> load_wan_experts(const WanExperts& experts,
                                     std::optional<c10::ScalarType> dtype = std::nullopt,
                                     const torch::Device& device = torch::kCPU);

/// A routed forward: `forward(e, samples)` on each expert e that has samples (`routes` from
/// WanExperts::route, in the experts' order; the samples picked by select_samples), the outputs
/// merged in batch order. experts_forward and a LoRA pair's student both route through it.
using ExpertForward = std::function<std::vector<torch::Tensor>(std::size_t, const WanInputs&)>;
std::vector<torch::Tensor> routed_forward(const std::vector<std::vector<std::int64_t>>& routes,
                                          const WanInputs& inputs, const std::array<std::int64_t, 3>& patch,
                                          const ExpertForward& forward);

/// The reference MoE forward: routes the batch by t, runs models[e] on expert e's samples
/// (select_samples) and merges the outputs in batch order. The definition a pipelined teacher
/// must equal. `models` are in the experts' order.
std::vector<torch::Tensor> experts_forward(std::vector<WanDiT>& models, const WanExperts& experts,
                                           const WanInputs& inputs);

/// What write_random_wan_experts wrote, per expert in {low, high} order.
struct ExpertsWriteResult {
  ShardedWriteResult low;
  ShardedWriteResult high;
};

/// Writes a random two-expert checkpoint: in the official A14B layout `dir`/low_noise_model/
/// (seed `seed`) and `dir`/high_noise_model/ (seed `seed + 1`, so the experts differ), each a
/// complete write_random_wan_checkpoint with its own config.json; in the diffusers layout a
/// pipeline folder, transformer_2/ (low) and transformer/ (high) with model_index.json
/// (boundary_ratio: the model_type's default, or null).
ExpertsWriteResult write_random_wan_experts(const std::string& dir, const WanConfig& config,
                                            c10::ScalarType dtype, std::uint64_t shard_bytes,
                                            std::uint64_t seed,
                                            KeyLayout layout = KeyLayout::kNative);

}  // namespace wd
