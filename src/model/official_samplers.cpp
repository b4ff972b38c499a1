// The official Wan 2.2 samplers' table (official_samplers.hpp).
#include "model/official_samplers.hpp"

namespace wd {

const std::vector<OfficialSampler>& official_samplers() {
  // Wan-Video/Wan2.2 wan/configs/: sample_shift, sample_steps, sample_guide_scale, boundary.
  static const std::vector<OfficialSampler> table{
      {"T2V-A14B", "t2v", 2, 12.0, 40, {3.0, 4.0}, 0.875},
      {"I2V-A14B", "i2v", 2, 5.0, 40, {3.5, 3.5}, 0.900},
      {"TI2V-5B", "ti2v", 1, 5.0, 50, {5.0, 5.0}, std::nullopt},
  };
  return table;
}

const OfficialSampler* official_sampler(const std::string& model_type, std::size_t experts) {
  for (const auto& s : official_samplers()) {
    if (model_type == s.model_type && experts == s.experts) return &s;
  }
  return nullptr;
}

std::string describe(const OfficialSampler& s) {
  return std::string(s.name) + " (model_type " + s.model_type + ", " + (s.experts == 2 ? "two experts" : "one model") +
         ")";
}

}  // namespace wd
