// Building the student DiT (random or from teacher blocks) and saving it as a Wan checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "model/wan_checkpoint.hpp"
#include "student/student_config.hpp"

namespace wd::student {

/// A trainable fp32 student. With `teacher-blocks:i,j,...` the listed teacher blocks (and every
/// non-block tensor whose shape matches) are copied in; the teacher's dims must then equal the
/// student's, which is checked with a clear error. With `weights:PATH` every tensor comes from
/// the checkpoint at PATH (an earlier run's student, any layout WanCheckpoint opens), whose
/// config must equal the student's (ConfigError naming the fields that differ; DataError for a
/// missing or mis-shaped tensor). `teacher` may be null (a job without one) unless the init
/// copies teacher blocks. `role` names the model in the log line ("student", "dmd critic").
WanDiT build_student(const WanConfig& student, const StudentConfig& config,
                     const WanCheckpoint* teacher, std::uint64_t seed, const std::string& role = "student");

/// Writes `model` as a Wan-layout checkpoint (config.json + safetensors, native keys) into
/// `dir`, each file atomically; `wan-distill forward` and `inspect` accept it.
void save_student(WanDiT& model, const std::string& dir);

}  // namespace wd::student
