// What `plan` and `train` both derive from a run's config: the teacher on disk, what the data
// set must hold for it, and the planner's input (train's teacher.placement = auto).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "job/run_config.hpp"
#include "comm/score_channel.hpp"
#include "comm/stream_plan.hpp"
#include "data/dataset_info.hpp"
#include "model/wan_config.hpp"
#include "model/wan_experts.hpp"
#include "plan/planner.hpp"

namespace wd::job {

/// What the config does not say: the teacher's shapes, the data's, the machine's.
struct PlanContext {
  WanConfig teacher;
  std::int64_t stored_elem_bytes = 2;  ///< the checkpoint's dtype
  std::int64_t experts = 1;
  std::array<std::int64_t, 4> latent{};
  std::int64_t context_len = 0;
  int world = 0;                       ///< world ranks
  bool cpu_job = false;
  std::uint64_t gpu_bytes = 0;
  std::uint64_t host_bytes = 0;
  int gpus_per_node = 8;
};

/// The teacher: one checkpoint, or the two experts of an A14B folder (spec §10), with
/// teacher.boundary (0 = the model_type's default) and teacher.model_config.
WanExperts open_teacher(const RunConfig& cfg);

/// Bytes per element of a checkpoint as stored (of its last tensor, a block weight).
std::int64_t stored_elem_bytes(const WanCheckpoint& ck);

/// What the data set must hold for teacher `tc`: its latent channels (an i2v model's out_dim:
/// in_dim also counts y's mask and image channels), text size, latent sizes divisible by its patch,
/// and the image condition its model type takes. `ignore_condition` (data.ignore_condition, or a
/// command that reads the contexts and shapes alone) lets a t2v teacher's data set hold one.
data::DatasetExpectations dataset_expectations(const WanConfig& tc, bool ignore_condition);

/// The checks `plan` and `train` share once the teacher's config is known: a supported model
/// type and the student config (these throw ConfigError at once), then student.features against
/// both models' blocks, `stages` against the teacher's blocks, teacher.shard_map and
/// checkpoint.every against train.steps, added to `problems` so that the caller names every
/// problem in one error.
void validate_with_teacher(const RunConfig& cfg, const WanConfig& tc, int stages, ConfigProblems& problems);

/// Bytes of each teacher block and of the head (what only a last stage holds), as stored.
std::pair<std::vector<std::uint64_t>, std::uint64_t> teacher_block_bytes(const WanCheckpoint& ck);

/// Tokens of one latent sample: its frames, height and width over the patch size.
std::int64_t tokens_per_sample(const WanConfig& c, const std::array<std::int64_t, 4>& latent);

/// train.objective dmd: when the students ask and the teachers answer (plan's steps, train.critic_ratio,
/// comm.prefetch_depth stream steps of lead before an answer).
comm::ServiceSchedule service_schedule(const RunConfig& cfg, const comm::StreamPlan& plan);

/// The dmd critic's architecture: objective::critic_model_config's, or the teacher's when it is
/// adapters over the teacher's base (critic.lora_rank, or a LoRA student's).
WanConfig dmd_critic_config(const RunConfig& cfg, const WanConfig& tc);

/// A dmd critic forward (`in.critic`, make_plan_input's dmd_critic_config) in student forwards,
/// by FLOPs (dit_forward_flops).
double dmd_critic_cost(const plan::PlanInput& in);

/// The message geometry of a run (batch, latent, context, channels, feature blocks): what
/// every transport step carries. `train` adds the steps to stream.
comm::StreamPlan stream_plan_for(const RunConfig& cfg, const WanConfig& tc,
                                 const std::array<std::int64_t, 4>& latent, std::int64_t context_len);

/// teacher.dtype as a dtype; nullopt for `auto` (each tensor as stored).
std::optional<c10::ScalarType> teacher_dtype(const RunConfig& cfg);

/// The dtype the speed timings build the teacher's weights in: teacher.dtype, or for `auto` the
/// checkpoint's (bf16 for `stored_elem_bytes` 2, else fp32).
c10::ScalarType timed_weight_dtype(const RunConfig& cfg, std::int64_t stored_elem_bytes);

plan::PlanInput make_plan_input(const RunConfig& cfg, const PlanContext& ctx);

/// A WanConfig reduced to what the planner needs.
plan::DitShape dit_shape(const WanConfig& c, std::int64_t experts);

}  // namespace wd::job
