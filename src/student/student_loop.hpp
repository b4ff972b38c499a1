// The student rank's loop: its steps (train_step) over the teacher stream, its diagnostics, its
// checkpoints and the requeue stop.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "comm/health_channel.hpp"
#include "comm/stream_plan.hpp"
#include "core/fault_injection.hpp"
#include "comm/receiver.hpp"
#include "memory/memory_monitor.hpp"
#include "model/wan_dit.hpp"
#include "student/ema.hpp"
#include "student/checkpointing.hpp"
#include "student/optimizer_shard.hpp"
#include "student/train_optimizer.hpp"
#include "student/student_config.hpp"
#include "student/student_method.hpp"
#include "student/student_parts.hpp"

namespace wd::student {

/// Everything one student rank needs; owned by the caller.
struct StudentJob {
  StudentParts& parts;
  comm::Receiver& transport;
  comm::GradientReducer& reducer;
  TrainOptimizer& optimizer;  ///< whole, or under student.shard over this rank's slice
  const comm::StreamPlan& plan;
  const TrainConfig& train;
  MPI_Comm students;          ///< for the loss / eval reductions
  double timeout_s = 120;
  int world_rank = 0;
  std::vector<int> peers;     ///< world ranks of the other students (named on a timeout)
  bool leader = false;        ///< student rank 0: logs and writes metrics
  std::string metrics_path;   ///< metrics.jsonl (leader only); TensorBoard runs beside it
  CheckpointPolicy checkpointing;  ///< blocks recomputed in the training backward
  /// Called after every training step (memory reports gather every rank); null = none.
  memory::MemoryMonitor* memory = nullptr;
  /// Polled at every step; null in single-process tests.
  comm::HealthChannel* health = nullptr;
  const FaultInjector* faults = nullptr;
  /// World ranks of the teachers: told where training stops after a requeue request.
  std::vector<int> teachers;
  /// Called once with the optimizer before the first step (a resume restores state here).
  std::function<void(TrainOptimizer&)> restore;
  /// Writes a checkpoint after optimizer step `step` (1-based count of steps done). Called on
  /// every student at the same steps (the implementation decides who writes).
  std::function<void(std::int64_t step, TrainOptimizer&)> save;
  std::int64_t checkpoint_every = 0;  ///< 0: only at the end and on a requeue
  /// Updated after every optimizer step with the weights/grads/optimizer bytes, so a failure
  /// report can name them after the stack unwound; null = not tracked.
  memory::ModelMemory* tracked_memory = nullptr;
  /// train.ema_decay: the weight average, updated after every optimizer step; null = off.
  EmaWeights* ema = nullptr;
  /// The objective's student method (dmd's cycle of critic and generator updates); null = the
  /// distillation step (DistillMethod).
  StudentMethod* method = nullptr;
  /// student.sequence_parallel: the students train students / N batches a step (the log's samples/s).
  int sequence_parallel = 1;
};

struct StudentStats {
  double seconds = 0;
  double wait_seconds = 0;           ///< blocked receiving batches
  double first_eval_rel_mse = -1;    ///< before training
  double final_eval_rel_mse = -1;    ///< after training
  std::vector<double> losses;        ///< mean loss over students, per step of this run
  /// The step training stopped after for a requeue (SIGUSR1); -1 when it ran to the end.
  std::int64_t stopped_after = -1;
};

/// Receives the eval set, evaluates, trains steps plan.first_step..plan.train_steps-1,
/// evaluates again. Checks every loss for NaN/Inf (wd::NumericalError). After a requeue
/// request (SIGUSR1 anywhere) every student stops after the same step, a checkpoint is
/// written and the teachers are told.
StudentStats run_student(StudentJob& job);

}  // namespace wd::student
