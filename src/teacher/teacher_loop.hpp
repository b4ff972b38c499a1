// The teacher rank's loop: read its share, add noise, run the frozen DiT, stream to students.
#pragma once

#include <cstdint>

#include "comm/health_channel.hpp"
#include "comm/message_spec.hpp"
#include "comm/receiver.hpp"
#include "comm/sender.hpp"
#include "comm/stream_plan.hpp"
#include "core/fault_injection.hpp"
#include "memory/memory_monitor.hpp"
#include "teacher/score_server.hpp"
#include "teacher/target_source.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::teacher {

/// Everything one teacher rank needs; owned by the caller. The first stage makes each batch with
/// `source` (the objective's: data and forward, trajectories); a pipeline stage (teacher.placement
/// = shard) that is not first receives its batches from `from_previous` and runs its blocks; one
/// that is not last sends to `to_next` instead of the students. Beside a teacher cache (dmd's
/// students read their batches from it) a whole teacher has neither source nor transport and
/// answers the real score alone (`server`), at the students' steps.
struct TeacherJob {
  TeacherStage& stage;
  TargetSource* source;     ///< first stage only; null beside a cache
  comm::Sender* transport;  ///< to the students: last stage only; null beside a cache
  const comm::StreamPlan& plan;
  int students_per_replica = 1;
  bool broadcast = false;  ///< every student gets the same batch
  /// student.sequence_parallel: each group of this many consecutive students shares its samples
  /// (every rank of the group gets the group's whole batch and keeps its own tokens).
  int sequence_parallel = 1;
  /// Called after every training step (memory reports gather every rank); null = none.
  memory::MemoryMonitor* memory = nullptr;
  /// Polled at every step; null in single-process tests.
  comm::HealthChannel* health = nullptr;
  const FaultInjector* faults = nullptr;
  comm::Receiver* from_previous = nullptr;  ///< shard: the previous stage's stream
  comm::Sender* to_next = nullptr;          ///< shard: the stream to the next stage
  /// train.objective dmd: answers the students' real-score requests between stream steps.
  ScoreServer* server = nullptr;
};

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

/// Streams the plan's eval batches, then one batch per training step (none beside a cache),
/// answering the server's requests as their cycles fall due.
TeacherStats run_teacher(TeacherJob& job);

}  // namespace wd::teacher
