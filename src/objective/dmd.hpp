// train.objective dmd's critic as the rest of the job sizes and builds it (its keys: critic.*).
#pragma once

#include <cstdint>

#include "model/wan_config.hpp"
#include "objective/objective_spec.hpp"

namespace wd::objective {

/// The dmd critic's architecture as a full DiT: the student's (critic.init teacher: the teacher's
/// dims), with the critic.* dims that are set.
WanConfig critic_model_config(const Keys& k, const WanConfig& teacher_model);
/// The dmd critic as adapters over the teacher's base: critic.lora_rank, else a LoRA student's
/// rank (student.lora_alpha and lora_targets); rank 0 when the critic is a full DiT or
/// train.objective trains no critic.
LoraSpec critic_lora(const Keys& k, std::int64_t num_layers);

}  // namespace wd::objective
