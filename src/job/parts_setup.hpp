// The student parts' set-up from the run config: one function for the training students and the
// speed calibration, so that both build the same parts.
#pragma once

#include <cstdint>

#include "job/run_config.hpp"
#include "student/student_parts.hpp"

namespace wd::job {

/// The set-up of a student (or a critic) of `cfg` against a teacher of `in_channels` and
/// `out_channels` latent channels and `teacher_dim` hidden width, on `device`: its channel
/// projections, feature pairs, precision and seed. A LoRA base is the caller's to add.
student::PartsSetup parts_setup(const RunConfig& cfg, std::int64_t in_channels, std::int64_t out_channels,
                                std::int64_t teacher_dim, const c10::Device& device);

}  // namespace wd::job
