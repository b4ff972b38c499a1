// RunConfig: every section of a training job's configuration, shared by `train` and `plan`
// so that both read the same config files with the same keys and defaults.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>

#include "comm/comm_config.hpp"
#include "core/config.hpp"
#include "core/fault_injection.hpp"
#include "data/data_config.hpp"
#include "data/noiser.hpp"
#include "memory/memory_monitor.hpp"
#include "objective/objective_spec.hpp"
#include "student/dmd_config.hpp"
#include "student/student_config.hpp"
#include "student/train_state.hpp"
#include "teacher/teacher_config.hpp"
#include "teacher/trajectory.hpp"

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

  void bind(OptionTable& t) {
    t.bind("run-dir", run_dir, "directory for metrics.jsonl, the student and the builtin cache");
    t.bind("inject-fault", inject_fault,
           "testing aid: KIND@ROLE:RANK:STEP[:POINT] makes rank RANK of ROLE (teacher|student) fail at "
           "training step STEP with KIND = oom|oom_huge|nan|throw|hang|sigkill|sigterm|sigusr1, at POINT = "
           "step (the step's start; the default) | allreduce (a student, inside the gradient all-reduce) | "
           "send (a teacher, inside the send of the step's batch) | save (student 0, inside the step's "
           "checkpoint save) | serve (a teacher of train.objective dmd, inside a real-score answer) | allgather (a student of "
           "student.shard optimizer, inside the all-gather of the updated parameters), e.g. sigkill@student:1:3:allreduce "
           "(docs/failures.md)");
    teacher.bind(t);
    student.bind(t);
    train.bind(t);
    objective::bind(t, train.objective);
    dmd.bind(t);
    data.bind(t);
    noise.bind(t);
    comm.bind(t);
    memory.bind(t);
    checkpoint.bind(t);
    log.bind(t);
    runtime.bind(t);
    runtime.bind_roles(t);
  }
  void validate() const {
    ConfigProblems p;
    p.check(!run_dir.empty(), "run-dir must not be empty");
    teacher.validate(p);
    student.validate(p);
    train.validate(p);
    dmd.validate(p);
    data.validate(p);
    noise.validate(p);
    comm.validate(p);
    memory.validate(p);
    checkpoint.validate(p);
    log.validate(p);
    runtime.validate(p);
    check_objective(p);
    try {
      FaultSpec::parse(inject_fault);
    } catch (const ConfigError& e) {
      p.check(false, e.what());
    }
    p.throw_if_any("train config");
  }
  /// The sections the objectives read.
  objective::Keys keys() const { return {teacher, student, train, dmd}; }
  /// train.objective's spec in the objective table.
  const objective::ObjectiveSpec& objective() const { return objective::find(train.objective); }
  /// Whether the job has a teacher (not for an objective trained on the data alone).
  bool has_teacher() const { return objective().traits().needs_teacher; }
  /// Whether every rank is a student computing its own targets: a colocated teacher, or none.
  bool students_only() const { return teacher.placement == TeacherPlacement::kColocated || !has_teacher(); }
  /// Every objective's checks (objective::check), and what student.shard parameters excludes.
  void check_objective(ConfigProblems& p) const {
    objective::check(keys(), p);
    if (student.shard == ShardMode::kParameters) {
      // What reads every weight at once, or forwards on one student alone, while the blocks are
      // spread over the students.
      p.check(train.ema_decay == 0, "train.ema_decay with student.shard parameters: the weight average would hold "
                                    "every weight on each student; shard gradients, or no average");
      p.check(train.sample_every == 0, "train.sample_every with student.shard parameters: the sampling probe runs on "
                                       "the first student alone, and every block's gather needs all of them");
    }
  }
  /// The teacher's trajectories' schedules (teacher.steps/shift/solver, student.steps).
  teacher::TrajectorySpec trajectory_spec() const { return objective::trajectory_spec(keys()); }
  /// Whether the teacher's batches come from its trajectories.
  bool trajectory_stream() const { return objective().trajectory_stream(keys()); }
  /// The [train] section as the student loop uses it (ObjectiveSpec::loop_train).
  student::TrainConfig student_train() const { return objective().loop_train(keys()); }
  /// Whether the teacher's forwards are guided ([cond; neg] in one batch).
  bool teacher_guided() const { return objective().guided(keys()); }
  /// Whether the teacher must be whole on one rank (no shard stages).
  bool whole_teacher() const { return !objective().traits().whole_teacher.empty(); }
  /// A LoRA pair: a LoRA student of a two-expert teacher (`teacher_experts` 2) without
  /// student.expert, one adapter set per expert over that expert's base.
  bool lora_pair(std::size_t teacher_experts) const {
    return student.lora_rank > 0 && teacher_experts == 2 && student.expert.empty();
  }
  /// The dmd critic's architecture (a full DiT): the student's (critic.init teacher: the teacher's
  /// dims), with the critic.* dims that are set.
  WanConfig critic_model_config(const WanConfig& teacher_model) const {
    auto c = student.model_config(teacher_model);
    if (dmd.critic_init == CriticInit::kTeacher) {
      c.dim = teacher_model.dim;
      c.ffn_dim = teacher_model.ffn_dim;
      c.num_heads = teacher_model.num_heads;
      c.num_layers = teacher_model.num_layers;
    }
    if (dmd.critic_dim) c.dim = dmd.critic_dim;
    if (dmd.critic_ffn_dim) c.ffn_dim = dmd.critic_ffn_dim;
    if (dmd.critic_num_heads) c.num_heads = dmd.critic_num_heads;
    if (dmd.critic_num_layers) c.num_layers = dmd.critic_num_layers;
    return c;
  }
  /// train.objective dmd's critic as adapters over the teacher's base: critic.lora_rank, else a
  /// LoRA student's rank (student.lora_alpha and lora_targets); rank 0 when the critic is a full DiT.
  LoraSpec critic_lora(std::int64_t num_layers) const {
    if (!objective().traits().real_score || (dmd.critic_lora_rank <= 0 && student.lora_rank <= 0)) return {};
    return student.lora_spec(num_layers, dmd.critic_lora_rank);
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
