// The student rank's loop: receive, forward, distillation loss, all-reduce, optimizer step.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "comm/stream_plan.hpp"
#include "comm/transport.hpp"
#include "memory/memory_monitor.hpp"
#include "model/wan_dit.hpp"
#include "student/checkpointing.hpp"
#include "student/student_config.hpp"
#include "student/student_parts.hpp"

namespace wd::student {

/// Everything one student rank needs; owned by the caller.
struct StudentJob {
  StudentParts& parts;
  comm::Transport& transport;
  comm::GradientReducer& reducer;
  const comm::StreamPlan& plan;
  const TrainConfig& train;
  MPI_Comm students;          ///< for the loss / eval reductions
  double timeout_s = 120;
  int world_rank = 0;
  std::vector<int> peers;     ///< world ranks of the other students (named on a timeout)
  bool leader = false;        ///< student rank 0: logs and writes metrics
  std::string metrics_path;   ///< metrics.jsonl (leader only)
  CheckpointPolicy checkpointing;  ///< blocks recomputed in the training backward
  /// Called after every training step (memory reports gather every rank); null = none.
  memory::MemoryMonitor* memory = nullptr;
};

struct StudentStats {
  double seconds = 0;
  double wait_seconds = 0;           ///< blocked receiving batches
  double first_eval_rel_mse = -1;    ///< before training
  double final_eval_rel_mse = -1;    ///< after training
  std::vector<double> losses;        ///< mean loss over students, per step
};

/// Receives the eval set, evaluates, trains plan.train_steps steps, evaluates again.
StudentStats run_student(StudentJob& job);

/// Distillation loss: MSE between the student prediction and the teacher output (cast to the
/// prediction's dtype only when they differ).
torch::Tensor distill_loss(const torch::Tensor& prediction, const torch::Tensor& teacher_out);

}  // namespace wd::student
