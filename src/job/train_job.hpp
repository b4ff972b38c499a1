// The `train` job's state once start-up is agreed (startup.hpp), and each role's set-up and run
// (run_teacher_rank, run_student_rank).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job/run_config.hpp"
#include "comm/health_channel.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
#include "comm/stream_plan.hpp"
#include "core/checkpoint_store.hpp"
#include "core/fault_injection.hpp"
#include "core/topology.hpp"
#include "data/dataset_info.hpp"
#include "data/noiser.hpp"
#include "memory/memory_monitor.hpp"
#include "memory/memory_report.hpp"
#include "model/wan_experts.hpp"
#include "plan/planner.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::job {

/// student.expert's index among a two-expert teacher's experts: WanExperts::kHigh for "high",
/// else kLow (the config allows nothing else).
inline std::size_t expert_index(const std::string& expert) {
  return expert == "high" ? WanExperts::kHigh : WanExperts::kLow;
}

/// The model timesteps student.expert `expert` learns: its side of `experts`' boundary (the rule
/// of WanExperts::expert_for); every t when `expert` is empty or there is no teacher.
inline data::TimestepRange expert_range(const std::string& expert, const WanExperts* experts) {
  data::TimestepRange range;
  if (expert.empty() || !experts) return range;
  range.side = expert_index(expert) == WanExperts::kHigh ? data::TimestepRange::kHigh : data::TimestepRange::kLow;
  range.boundary_timestep = experts->boundary_timestep();
  return range;
}

/// What every rank knows once start-up is agreed. The same on every rank except where noted.
struct TrainJob {
  RunConfig cfg;
  std::vector<std::string> args;  ///< the command line (the diagnosis adjusts it)
  std::string config_ini;         ///< the effective config, saved with every checkpoint
  Topology topo;
  plan::Placement placement = plan::Placement::kCpu;
  std::optional<c10::ScalarType> compute;  ///< teacher.compute's choice; nullopt: the weights' dtype
  comm::Layout layout;
  std::optional<comm::ProcessGroups> groups;
  std::optional<WanExperts> experts;  ///< none for train.objective flow
  /// The DiT config the stream is shaped by: the teacher's, or without a teacher (flow) the base
  /// the student's keys apply to, made from the data set (model_for_data).
  WanConfig model;
  std::optional<data::DatasetInfo> info;  ///< teacher ranks only
  comm::StreamPlan plan;
  std::int64_t per_replica = 0;    ///< samples a replica computes per transport step
  std::int64_t micro_batch = 0;    ///< samples per teacher forward (teacher.micro_batch, auto resolved); 0 = all
  std::int64_t train_samples = 0;  ///< samples before the held-out ones
  bool broadcast = false;          ///< comm.mode broadcast
  std::string resume_path;         ///< the checkpoint to resume from; empty: step 0
  std::optional<CheckpointStore> store;  ///< the first student rank only (it writes)

  const WanCheckpoint& teacher() const { return experts->expert(0); }
  /// The checkpoint a student's weights come from (LoRA base, student.init teacher-blocks): the expert
  /// of student.expert on a two-expert teacher, else the teacher's only (or first) model. A LoRA pair
  /// (lora_pair()) takes each expert's own.
  const WanCheckpoint& student_base() const {
    if (cfg.student.expert.empty()) return teacher();
    return experts->expert(expert_index(cfg.student.expert));
  }
  /// The model timesteps the student learns: student.expert's side of the teacher's boundary,
  /// else every t.
  data::TimestepRange student_range() const { return expert_range(cfg.student.expert, experts ? &*experts : nullptr); }
  /// A LoRA student of a two-expert teacher without student.expert: one adapter set per expert,
  /// each over its own expert's base and trained on the samples the teacher routes to it.
  bool lora_pair() const { return cfg.lora_pair(experts ? experts->size() : 0); }
  int world_rank() const { return topo.rank; }
};

/// What the failure handler reports about this rank after the stack unwound: filled in by the
/// role as it sets up and trains.
struct RankMemory {
  c10::Device device = torch::kCPU;
  std::uint64_t teacher_weights_bytes = 0;
  std::uint64_t transport_bytes = 0;
  memory::ModelMemory model;  ///< the student's own tensors, updated every step
};

/// The services every role uses, alive from the start of training to the failure handler.
struct RoleServices {
  comm::HealthChannel& health;
  memory::MemoryMonitor& monitor;
  const FaultInjector& faults;
  RankMemory& memory;
};

/// What each rank reports at the end of a run (gathered as doubles).
struct RankSummary {
  double role = 0;  ///< 0 teacher, 1 student
  double seconds = 0;
  double busy_fraction = 0;  ///< teacher: reading + noising + forward
  double wait_fraction = 0;  ///< blocked in the transport
  double samples = 0;
  double peak_rss = 0;
  double peak_pss = 0;     ///< sampled: memory reports and the end of the run
  double cpu_seconds = 0;  ///< user + system, the whole process
  /// RSS once start-up is done (MPI, LibTorch, config, run directory), before any model: what
  /// the planner's fixed per-process constant stands for, so peak - start is what its formulas
  /// predict (bench/results/planner.md).
  double start_rss = 0;
};

/// How a role ended.
struct RoleResult {
  RankSummary summary;
  bool requeue = false;  ///< stopped after SIGUSR1 with a checkpoint written
};

/// This rank's teacher stage: every expert's model for `how`, computing in job.compute, with
/// job.micro_batch set; adds the weights to `memory`.
teacher::TeacherStage load_teacher_stage(const TrainJob& job, const teacher::StageLoad& how, RankMemory& memory);

/// A teacher rank: its device, its link to the students (the last stage of a replica), its
/// stage of the model, its stage links, then the teacher loop.
RoleResult run_teacher_rank(TrainJob& job, RoleServices& services);

/// A student rank: its device, its link to its teacher, the student parts on the device, the
/// gradient reducer, then the student loop; the first student saves the student at the end.
RoleResult run_student_rank(TrainJob& job, RoleServices& services);

}  // namespace wd::job
