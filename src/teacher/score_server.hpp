// The teacher's side of train.objective dmd's real-score channel: it answers the requests of its
// replica's students between the batches of its forward stream (docs/transport.md#requests).
#pragma once

#include <cstdint>

#include "comm/score_channel.hpp"
#include "comm/health_channel.hpp"
#include "core/fault_injection.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::teacher {

/// Answers each cycle's requests after the forward stream's step schedule.answer_after(cycle):
/// receives every student's request (a sequence-parallel group's once), runs them as one batch through the whole (guided) teacher
/// (teacher.micro_batch slices it; a two-expert teacher routes each sample by its t), and sends
/// each student its teacher_out.
class ScoreServer {
 public:
  ScoreServer(TeacherStage& stage, comm::TeacherService& service, comm::ServiceSchedule schedule)
      : stage_(stage), service_(service), schedule_(schedule), next_(schedule.first_cycle()) {}
  /// Called after the forward stream's training step `step`: answers the cycles due then.
  void after_stream_step(std::int64_t step);
  /// Testing aid: inject-fault's point serve strikes at step + 1 inside the answer due after step.
  void set_faults(const FaultInjector* faults) { faults_ = faults; }
  /// student.sequence_parallel: consecutive slots of this many are one group, whose ranks send
  /// the same request; the teacher runs each group's once and answers every rank of it.
  void set_sequence_parallel(int n) { sequence_parallel_ = n; }
  /// Where a failure report says this rank was ("real-score answer"); null = none.
  void set_health(comm::HealthChannel* health) { health_ = health; }
  /// Waits until every answer is sent.
  void flush() { service_.answers->flush(); }
  double busy_seconds() const { return busy_seconds_; }
  /// Seconds blocked on requests and answers.
  double wait_seconds() const;
  std::int64_t answered() const { return answered_; }

 private:
  void answer(std::int64_t cycle, std::int64_t step);
  const FaultInjector* faults_ = nullptr;
  comm::HealthChannel* health_ = nullptr;

  TeacherStage& stage_;
  comm::TeacherService& service_;
  comm::ServiceSchedule schedule_;
  std::int64_t next_;  ///< the next cycle to answer
  double busy_seconds_ = 0;
  std::int64_t answered_ = 0;  ///< samples
  int sequence_parallel_ = 1;
};

}  // namespace wd::teacher
