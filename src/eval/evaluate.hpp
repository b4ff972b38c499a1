// `wan-distill evaluate`: a teacher and a few-step student sampled from the same held-out noises
// and contexts, every row scored against the guided teacher (docs/objectives.md#evaluate).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>

#include "core/guidance_scale.hpp"
#include "core/choices.hpp"
#include "core/config.hpp"
#include "teacher/sampling_teacher.hpp"

namespace wd::eval {

struct EvaluateConfig {
  std::string teacher;
  double boundary = 0.0;
  std::string student;
  std::string data_path;
  std::string samples;     ///< empty: the last `count` samples of the data set (the held-out ones)
  std::int64_t count = 192;
  std::uint64_t seed = 7;  ///< the rows' noise; the reference's second set draws from seed + 1
  std::int64_t teacher_steps = 40;
  Solver teacher_solver = Solver::kUnipc;
  GuidanceScale teacher_guidance = 5.0;  ///< one scale, or LOW,HIGH per expert of a two-expert teacher
  double shift = 5.0;
  std::int64_t student_steps = 4;
  double student_guidance = 1.0;
  Solver student_solver = Solver::kEuler;
  std::string reuse;  ///< an earlier evaluate's OUTPUT whose teacher rows are taken (same settings)
  std::string negative;
  std::int64_t batch = 32;
  double collapse_ratio = 0.5;
  std::string output;
  DtypeChoice dtype = DtypeChoice::kFp32;
  std::string device = "cpu";
  teacher::SamplingPlacement placement;
  LogConfig log;
  RuntimeConfig runtime;
  /// The keys given on the command line or in --config (ParsedOptions::given): teacher.steps,
  /// teacher.shift and teacher.guidance left out of it follow the teacher's official sampler.
  std::set<std::string> given;

  void bind(OptionTable& t);
  void validate() const;
};

/// Samples every row, writes OUTPUT/report.json and OUTPUT/latents.safetensors (when `output` is
/// set) and returns the report. The teacher's unset sampler keys take its official sampler's
/// values first (take_official_defaults).
nlohmann::json run_evaluation(const EvaluateConfig& options);

}  // namespace wd::eval
