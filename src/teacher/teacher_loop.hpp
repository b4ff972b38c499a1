// The teacher rank's loop: read its share, add noise, run the frozen DiT, stream to students.
#pragma once

#include <cstdint>

#include "comm/health_channel.hpp"
#include "comm/message_spec.hpp"
#include "comm/receiver.hpp"
#include "comm/sender.hpp"
#include "comm/stream_plan.hpp"
#include "core/fault_injection.hpp"
#include "data/dataset_reader.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"
#include "memory/memory_monitor.hpp"
#include "teacher/teacher_stage.hpp"
#include "teacher/score_server.hpp"
#include "teacher/trajectory.hpp"

namespace wd::teacher {

/// Everything one teacher rank needs; owned by the caller. A pipeline stage (teacher.placement =
/// shard) that is not first receives its batches from `from_previous` instead of reading data;
/// one that is not last sends to `to_next` instead of the students.
struct TeacherJob {
  TeacherStage& stage;
  data::DatasetReader* reader;  ///< first stage only
  const data::SampleSchedule& schedule;   ///< training samples [0, train_samples)
  const data::FlowMatchingNoiser& noiser;
  const data::FlowMatchingNoiser& eval_noiser;
  comm::Sender* transport;  ///< to the students: last stage only
  const comm::StreamPlan& plan;
  int replica = 0;
  int replicas = 1;
  int students_per_replica = 1;
  std::int64_t train_samples = 0;  ///< eval samples follow these in the file
  bool broadcast = false;          ///< every student gets the same batch
  /// Called after every training step (memory reports gather every rank); null = none.
  memory::MemoryMonitor* memory = nullptr;
  /// Polled at every step; null in single-process tests.
  comm::HealthChannel* health = nullptr;
  const FaultInjector* faults = nullptr;
  comm::Receiver* from_previous = nullptr;  ///< shard: the previous stage's stream
  comm::Sender* to_next = nullptr;          ///< shard: the stream to the next stage
  /// train.objective trajectory: the batches come from the teacher's trajectories (whole teacher).
  TrajectoryRounds* trajectory = nullptr;
  /// train.objective dmd: answers the students' real-score requests between stream steps.
  ScoreServer* server = nullptr;
};

/// Stage 0's input: the samples `idx` read from `reader`, noised for stream position
/// `noise_step` (noise depends on the sample index and the position only, not on the batch).
StageBatch read_stage_batch(data::DatasetReader& reader, const TeacherStage& stage, const comm::StreamPlan& plan,
                            const std::vector<std::int64_t>& idx, std::int64_t noise_step,
                            const data::FlowMatchingNoiser& noiser);

/// The teacher_out of a training message the plan computes no target for
/// (StreamPlan::train_targets false): zeros [samples, out_channels, F, H, W].
torch::Tensor untargeted_out(const comm::StreamPlan& plan, std::int64_t samples);

/// The student message of samples [lo, hi) of a computed batch: x_t, t, context, context_lens,
/// teacher_out and feat.<j> (views of `batch`).
comm::TensorDict student_message(const StageBatch& batch, std::int64_t lo, std::int64_t hi);

/// The message one pipeline stage sends the next for `samples` samples: the inputs, the
/// hidden state after `stage_end` blocks, and the features of the blocks before it.
comm::MessageSpec stage_message_spec(const comm::StreamPlan& plan, std::int64_t samples,
                                     const std::vector<std::int64_t>& features);

struct TeacherStats {
  double seconds = 0;       ///< wall time of the loop
  double busy_seconds = 0;  ///< reading + noising (first stage) + forward
  double wait_seconds = 0;  ///< blocked on the transport
  std::int64_t samples = 0;
  /// Set when the students stopped after this step for a requeue (SIGUSR1); -1 otherwise.
  std::int64_t stopped_after = -1;
};

/// Streams the plan's eval batches, then one batch per training step.
TeacherStats run_teacher(TeacherJob& job);

/// The held-out samples of (replica, eval message e): contiguous positions after train_samples.
std::vector<std::int64_t> eval_indices(std::int64_t e, int replica, std::int64_t per_replica,
                                       int replicas, std::int64_t train_samples);

}  // namespace wd::teacher
