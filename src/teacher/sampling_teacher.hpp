// The teacher of `sample` and `evaluate` in train's placements: gpu (every weight on the
// sampling device), cpu (computed on the host) and stream (blocks mapped on the host, copied to
// the device ahead of use), so a teacher larger than the GPU samples there.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "model/sampling_model.hpp"
#include "plan/planner.hpp"

namespace wd::teacher {

/// The placements `sample` and `evaluate` take: train's but shard and colocated (one process
/// holds the whole teacher).
enum class SamplingPlacementChoice { kAuto, kGpu, kCpu, kStream };
const std::vector<std::pair<SamplingPlacementChoice, const char*>>& choices(SamplingPlacementChoice);

/// `--teacher.placement` and `--teacher.stream_ahead` of the sampling commands.
struct SamplingPlacement {
  SamplingPlacementChoice placement = SamplingPlacementChoice::kAuto;
  int stream_ahead = 2;

  void bind(OptionTable& t);
  /// Problems of the keys for sampling on `device` (gpu needs a CUDA device).
  void validate(ConfigProblems& p, const std::string& device) const;
  /// The placement on `device`: auto is gpu on a CUDA device, else cpu.
  plan::Placement resolve(const c10::Device& device) const;
};

/// What load_sampling_teacher loads.
struct SamplingTeacherLoad {
  std::string path;                      ///< a folder WanCheckpoint reads, or a two-expert folder
  double boundary = 0;                   ///< two experts: 0 = the folder's or the model type's
  std::optional<c10::ScalarType> dtype;  ///< nullopt: each tensor as stored
  c10::Device device = torch::kCPU;      ///< where the sampler's latents live
  plan::Placement placement = plan::Placement::kCpu;
  int stream_ahead = 2;
};

/// The teacher as a SamplingModel: one TeacherStage holding every block of each expert (routed
/// by t), on the placement's device; inputs and outputs move between it and `how.device`.
/// shard is refused. Its forward takes an i2v teacher's y.
SamplingModel load_sampling_teacher(const SamplingTeacherLoad& how);

}  // namespace wd::teacher
