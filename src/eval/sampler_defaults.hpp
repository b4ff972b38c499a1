// The sampling commands' keys that follow the teacher's official Wan 2.2 sampler when left unset
// (model/official_samplers.hpp): `sample`'s steps and shift, `evaluate`'s teacher.steps,
// teacher.shift and teacher.guidance.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "core/guidance_scale.hpp"
#include "model/wan_experts.hpp"

namespace wd::eval {

/// A command's keys that follow the official sampler; a null field is one the command keeps.
struct SamplerKeys {
  std::string command;  ///< "sample", "evaluate": named in the log
  std::string steps_key;
  std::int64_t* steps = nullptr;
  std::string shift_key;
  double* shift = nullptr;
  std::string guidance_key;
  GuidanceScale* guidance = nullptr;
};

/// Sets each key of `keys` that is not in `given` (ParsedOptions::given: an explicit value always
/// wins) to the sampler of the official model the teacher `experts` is shaped as
/// (official_sampler: model type and expert count), and logs what every unset key took and why,
/// and a two-expert teacher's boundary and where it came from. A teacher of no official shape
/// keeps the command's own defaults, said so in the log.
void take_official_defaults(const WanExperts& experts, const std::set<std::string>& given, const SamplerKeys& keys);

}  // namespace wd::eval
