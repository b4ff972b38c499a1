// The official Wan 2.2 samplers' settings per model (wan/configs/wan_t2v_A14B.py, wan_i2v_A14B.py
// and wan_ti2v_5B.py of Wan-Video/Wan2.2): what a teacher of that type and size is sampled with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/guidance_scale.hpp"

namespace wd {

/// One official model's sampler: sample_shift, sample_steps, sample_guide_scale (low-noise,
/// high-noise expert) and the expert boundary.
struct OfficialSampler {
  const char* name;                ///< "T2V-A14B", "I2V-A14B", "TI2V-5B"
  const char* model_type;          ///< its config.json model_type
  std::size_t experts;             ///< 2: the A14B pairs; 1: the dense TI2V-5B
  double shift;                    ///< sample_shift
  std::int64_t steps;              ///< sample_steps
  GuidanceScale guidance;          ///< sample_guide_scale
  std::optional<double> boundary;  ///< high-noise expert for t >= boundary·1000 (A14B only)
};

/// The three official models, in the order above.
const std::vector<OfficialSampler>& official_samplers();

/// The official model a teacher of `model_type` with `experts` experts is shaped as (model type
/// and expert count: T2V-A14B is a t2v pair, I2V-A14B an i2v pair, TI2V-5B one ti2v model), or
/// nullptr for any other teacher (one t2v or i2v model: Wan 2.1-like, or a small test teacher).
const OfficialSampler* official_sampler(const std::string& model_type, std::size_t experts);

/// "T2V-A14B (model_type t2v, two experts)": what official_sampler matched, for logs.
std::string describe(const OfficialSampler& s);

}  // namespace wd
