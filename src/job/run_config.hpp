// RunConfig: every section of a training job's configuration, shared by `train` and `plan`
// so that both read the same config files with the same keys and defaults.
#pragma once

#include <filesystem>
#include <string>

#include "comm/comm_config.hpp"
#include "core/config.hpp"
#include "core/fault_injection.hpp"
#include "data/data_config.hpp"
#include "data/noise_config.hpp"
#include "memory/memory_config.hpp"
#include "objective/objective_spec.hpp"
#include "student/dmd_config.hpp"
#include "student/student_config.hpp"
#include "student/checkpoint_config.hpp"
#include "teacher/teacher_config.hpp"

namespace wd::job {

/// The builtin tiny teacher / data set, generated into the run directory's cache.
constexpr const char* kBuiltin = "builtin:tiny";

/// Every section of the job's configuration, bound into one options table.
struct RunConfig {
  std::string run_dir = "runs/tiny";
  teacher::TeacherConfig teacher;
  student::StudentConfig student;
  student::TrainConfig train;
  student::DmdConfig dmd;  ///< train.objective dmd's keys (critic.*, train.dmd_*)
  data::DataConfig data;
  data::NoiseConfig noise;
  comm::CommConfig comm;
  memory::MemoryConfig memory;
  student::CheckpointConfig checkpoint;
  LogConfig log;
  RuntimeConfig runtime;
  std::string inject_fault;

  /// Binds every section into `t` (train.objective through the objective table).
  void bind(OptionTable& t);
  /// Every section's problems and the objectives' checks, in one ConfigError.
  void validate() const;
  /// The sections the objectives read.
  objective::Keys keys() const { return {teacher, student, train, dmd, !data.teacher_cache.empty()}; }
  /// train.objective's spec in the objective table.
  const objective::ObjectiveSpec& objective() const { return objective::find(train.objective); }
  /// Whether the job has a teacher (not for an objective trained on the data alone).
  bool has_teacher() const { return objective().traits().needs_teacher; }
  /// Whether every rank is a student computing its own targets: a colocated teacher, none, or a
  /// teacher cache (data.teacher_cache) read by every rank with no live teacher.
  bool students_only() const {
    return teacher.placement == TeacherPlacement::kColocated || !has_teacher() || cache_only();
  }
  /// Whether the students read the teacher's batches from a cache (data.teacher_cache).
  bool from_cache() const { return !data.teacher_cache.empty(); }
  /// Whether the teacher's batches are also written into a cache (data.teacher_cache_write).
  bool writes_cache() const { return !data.teacher_cache_write.empty(); }
  /// Whether the students read their batches from a cache and no rank runs the teacher (every
  /// objective but one with a real score: dmd's teacher answers it live, beside the cache).
  bool cache_only() const { return from_cache() && !objective().traits().real_score; }
  /// Every objective's checks (objective::check), and what student.shard parameters excludes.
  void check_objective(ConfigProblems& p) const;
  /// The [train] section as the student loop uses it (ObjectiveSpec::loop_train).
  student::TrainConfig student_train() const { return objective().loop_train(keys()); }
  /// A LoRA pair: a LoRA student of a two-expert teacher (`teacher_experts` 2) without
  /// student.expert, one adapter set per expert over that expert's base.
  bool lora_pair(std::size_t teacher_experts) const {
    return student.lora_rank > 0 && teacher_experts == 2 && student.expert.empty();
  }
  /// Teacher forwards (in samples) per trained sample (ObjectiveSpec::teacher_forwards).
  double teacher_forwards() const { return objective().teacher_forwards(keys()); }
  std::string cache(const std::string& name) const { return (std::filesystem::path(run_dir) / "cache" / name).string(); }
  std::string teacher_path() const { return teacher.checkpoint == kBuiltin ? cache("tiny-teacher") : teacher.checkpoint; }
  std::string data_path() const { return data.path == kBuiltin ? cache("tiny-data.h5") : data.path; }
  std::string checkpoint_root() const {
    return checkpoint.dir.empty() ? (std::filesystem::path(run_dir) / "checkpoints").string() : checkpoint.dir;
  }
};

}  // namespace wd::job
