// The official samplers' defaults for `sample` and `evaluate` (sampler_defaults.hpp).
#include "eval/sampler_defaults.hpp"

#include <spdlog/spdlog.h>

#include <vector>

#include "model/official_samplers.hpp"

namespace wd::eval {

void take_official_defaults(const WanExperts& experts, const std::set<std::string>& given, const SamplerKeys& keys) {
  const auto& type = experts.config().model_type;
  const auto* official = official_sampler(type, experts.size());
  std::vector<std::string> taken;
  const auto unset = [&](const std::string& key, const void* field) { return field && !given.count(key); };
  if (unset(keys.steps_key, keys.steps)) {
    if (official) *keys.steps = official->steps;
    taken.push_back(keys.steps_key + " " + std::to_string(*keys.steps));
  }
  if (unset(keys.shift_key, keys.shift)) {
    if (official) *keys.shift = official->shift;
    taken.push_back(fmt::format("{} {}", keys.shift_key, *keys.shift));
  }
  if (unset(keys.guidance_key, keys.guidance)) {
    if (official) *keys.guidance = official->guidance;
    taken.push_back(keys.guidance_key + " " + keys.guidance->str());
  }
  if (!taken.empty()) {
    spdlog::info("{}: {} (unset: {})", keys.command, fmt::join(taken, ", "),
                 official ? "the official " + describe(*official) + " sampler's"
                          : keys.command + "'s own defaults; the teacher (model_type " + type + ", " +
                                std::to_string(experts.size()) + " expert(s)) is none of Wan 2.2's official models");
  }
  if (experts.two_experts()) {
    spdlog::info("{}: teacher boundary {} (t >= {} to {}), {}", keys.command, experts.boundary(),
                 experts.boundary_timestep(), experts.expert_name(WanExperts::kHigh), experts.boundary_origin());
  }
}

}  // namespace wd::eval
