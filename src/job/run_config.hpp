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
  /// Whether the job has a teacher: every objective but flow.
  bool has_teacher() const { return !train.flow(); }
  /// Whether every rank is a student computing its own targets: a colocated teacher, or none.
  bool students_only() const { return teacher.placement == "colocated" || !has_teacher(); }
  /// The objective against the teacher keys: flow trains without a teacher (teacher.ranks 0,
  /// nothing of the teacher's to match); every other objective needs one.
  void check_objective(ConfigProblems& p) const {
    if (train.trajectory_stream()) trajectory_spec().validate(p);
    if (student.shard == "parameters") {
      // What reads every weight at once, or forwards on one student alone, while the blocks are
      // spread over the students.
      p.check(train.ema_decay == 0, "train.ema_decay with student.shard parameters: the weight average would hold "
                                    "every weight on each student; shard gradients, or no average");
      p.check(train.sample_every == 0, "train.sample_every with student.shard parameters: the sampling probe runs on "
                                       "the first student alone, and every block's gather needs all of them");
    }
    p.check(!train.dmd() || !train.critic_dims() || (train.critic_lora_rank <= 0 && student.lora_rank <= 0),
            "critic.dim, ffn_dim, num_heads and num_layers size a full critic; a LoRA critic (critic.lora_rank, or a "
            "LoRA student's) is the teacher's architecture: leave them at 0");
    if (!train.flow()) {
      p.check(teacher.ranks >= 1, "teacher.ranks(0) means no teacher, which only train.objective flow trains "
                                  "without; train.objective(" + train.objective + ") needs teacher.ranks >= 1");
      return;
    }
    p.check(teacher.ranks == 0, "train.objective flow trains without a teacher: set teacher.ranks 0, not " +
                                    std::to_string(teacher.ranks));
    p.check(teacher.layout == "given", "train.objective flow has no teacher to lay out: teacher.layout(" +
                                           teacher.layout + ") must be given");
    p.check(student.features.empty(), "student.features(" + student.features +
                                          ") matches teacher blocks; train.objective flow has no teacher");
    p.check(student.teacher_blocks().empty(),
            "student.init(" + student.init +
                ") copies teacher blocks; train.objective flow has no teacher: random, or weights:PATH to fine-tune a "
                "checkpoint");
  }
  /// train.objective trajectory's schedules (teacher.steps/shift/solver, student.steps).
  teacher::TrajectorySpec trajectory_spec() const {
    return {teacher.solver, teacher.steps, student.steps, teacher.shift};
  }
  /// The [train] section as the student loop uses it: a trajectory student's sampling probe
  /// samples its own student.steps (Euler) on teacher.shift's schedule.
  student::TrainConfig student_train() const {
    auto t = train;
    if (train.trajectory() || train.dmd()) {
      t.sample_steps = student.steps;
      t.sample_shift = teacher.shift;
    }
    return t;
  }
  /// Whether the teacher's forwards are guided ([cond; neg] in one batch): guided, and
  /// trajectory and dmd unless teacher.guidance is 1.
  bool teacher_guided() const {
    return train.guided() || ((train.trajectory() || train.dmd()) && teacher.guidance != 1.0);
  }
  /// Whether the teacher must be whole on one rank (no shard stages): guidance, trajectories
  /// and the dmd real-score service need every block in one forward.
  bool whole_teacher() const { return train.guided() || train.trajectory() || train.dmd(); }
  /// A LoRA pair: a LoRA student of a two-expert teacher (`teacher_experts` 2) without
  /// student.expert, one adapter set per expert over that expert's base.
  bool lora_pair(std::size_t teacher_experts) const {
    return student.lora_rank > 0 && teacher_experts == 2 && student.expert.empty();
  }
  /// The dmd critic's architecture (a full DiT): the student's (critic.init teacher: the teacher's
  /// dims), with the critic.* dims that are set.
  WanConfig critic_model_config(const WanConfig& teacher_model) const {
    auto c = student.model_config(teacher_model);
    if (train.critic_init == "teacher") {
      c.dim = teacher_model.dim;
      c.ffn_dim = teacher_model.ffn_dim;
      c.num_heads = teacher_model.num_heads;
      c.num_layers = teacher_model.num_layers;
    }
    if (train.critic_dim) c.dim = train.critic_dim;
    if (train.critic_ffn_dim) c.ffn_dim = train.critic_ffn_dim;
    if (train.critic_num_heads) c.num_heads = train.critic_num_heads;
    if (train.critic_num_layers) c.num_layers = train.critic_num_layers;
    return c;
  }
  /// train.objective dmd's critic as adapters over the teacher's base: critic.lora_rank, else a
  /// LoRA student's rank (student.lora_alpha and lora_targets); rank 0 when the critic is a full DiT.
  LoraSpec critic_lora(std::int64_t num_layers) const {
    if (!train.dmd() || (train.critic_lora_rank <= 0 && student.lora_rank <= 0)) return {};
    return student.lora_spec(num_layers, train.critic_lora_rank);
  }
  /// Teacher forwards (in samples) per trained sample: 1, doubled when guided; a trajectory's
  /// teacher.steps forwards serve its student.steps intervals (also dmd's with a regression
  /// term); dmd adds its real-score requests, one sample every train.critic_ratio steps.
  double teacher_forwards() const {
    const double guided = teacher_guided() ? 2.0 : 1.0;
    const double requests = train.dmd() ? 1.0 / static_cast<double>(std::max<std::int64_t>(1, train.critic_ratio)) : 0.0;
    if (train.dmd() && !train.trajectory_stream()) return guided * requests;  // StreamPlan::train_targets
    if (!train.trajectory_stream()) return guided;
    return guided * (static_cast<double>(teacher.steps) / static_cast<double>(std::max<std::int64_t>(1, student.steps)) +
                     requests);
  }
  std::string cache(const std::string& name) const { return (std::filesystem::path(run_dir) / "cache" / name).string(); }
  std::string teacher_path() const { return teacher.checkpoint == kBuiltin ? cache("tiny-teacher") : teacher.checkpoint; }
  std::string data_path() const { return data.path == kBuiltin ? cache("tiny-data.h5") : data.path; }
  std::string checkpoint_root() const {
    return checkpoint.dir.empty() ? (std::filesystem::path(run_dir) / "checkpoints").string() : checkpoint.dir;
  }
};

}  // namespace wd::job
