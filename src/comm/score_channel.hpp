// The real-score channel of train.objective dmd: students ask their replica's teacher for the
// guided velocity at their own samples, the teacher answers. Requests flow student -> teacher
// (one stream per student), answers teacher -> students (one stream per replica), both with the
// forward stream's rings, checks, deadlines and health polling (docs/transport.md#requests).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm_config.hpp"
#include "comm/message_spec.hpp"
#include "comm/process_groups.hpp"
#include "comm/receiver.hpp"
#include "comm/sender.hpp"
#include "comm/stream_end.hpp"
#include "comm/stream_plan.hpp"

namespace wd::comm {

class HealthChannel;

/// When requests are asked and answered, computed alike on every rank of a run. Training steps
/// are critic updates; the generator updates after step s when (s + 1) % ratio == 0, so cycle c
/// is steps [c·ratio, (c + 1)·ratio) and ends in its generator update. The generator is frozen
/// through a cycle, so its request goes out at the cycle's first step (of this run) and the
/// teacher answers it while the students run the critic updates.
struct ServiceSchedule {
  std::int64_t ratio = 5;        ///< train.critic_ratio
  std::int64_t first_step = 0;   ///< the run's first step (a resume may start mid-cycle)
  std::int64_t train_steps = 0;  ///< steps in all
  std::int64_t lead = 1;         ///< stream steps a teacher produces ahead before it answers

  /// Cycles with a generator update in this run: [first_cycle, end_cycle), numbering the
  /// channel's steps.
  std::int64_t first_cycle() const { return first_step / ratio; }
  std::int64_t end_cycle() const { return train_steps / ratio; }
  /// Whether the generator updates after step `step`.
  bool generator_step(std::int64_t step) const { return (step + 1) % ratio == 0; }
  std::int64_t cycle_of(std::int64_t step) const { return step / ratio; }
  /// The step whose batch makes cycle `c`'s request: its first step, or the run's first.
  std::int64_t request_step(std::int64_t c) const { return std::max(first_step, c * ratio); }
  /// The stream step after which a teacher answers cycle `c`: `lead` steps past the request,
  /// at the latest the cycle's last step (whose update waits for the answer).
  std::int64_t answer_after(std::int64_t c) const {
    return std::min(request_step(c) + lead, c * ratio + ratio - 1);
  }
  /// Whether step `step` sends a request: the request step of a cycle with an update.
  bool asks_at(std::int64_t step) const {
    const auto c = cycle_of(step);
    return c < end_cycle() && step == request_step(c);
  }
};

/// A request: the re-noised sample x_t [b,C,F,H,W], its t [b] (1000·σ; ti2v: per token [b,S],
/// a clean first frame's at 0), its context [b,L,text], context_lens [b] and, for an i2v teacher,
/// its image condition y; an answer: teacher_out [b,C_out,F,H,W], the teacher's (guided) velocity.
MessageSpec request_spec(const StreamPlan& plan);
MessageSpec answer_spec(const StreamPlan& plan);

/// A student's ends of the channel.
struct StudentService {
  std::unique_ptr<Sender> requests;  ///< to the teacher
  std::unique_ptr<Receiver> answers;  ///< from the teacher
};

/// A teacher's ends: one request stream per student of its replica (slot order) and the answer
/// stream to them all.
struct TeacherService {
  std::vector<std::unique_ptr<Receiver>> requests;
  std::unique_ptr<Sender> answers;
};

/// The student's ends (collective with its teacher's teacher_service). The answers ride a
/// duplicate of the link's communicator; each request stream a communicator of the teacher and
/// that student alone (NCCL pairs two ranks a stream), made in slot order.
StudentService student_service(const ProcessGroups& groups, int world_rank, const StreamPlan& plan,
                                const ServiceSchedule& schedule, const CommConfig& config, const c10::Device& device,
                                HealthChannel* health);
/// The teacher's ends (see student_service).
TeacherService teacher_service(const ProcessGroups& groups, int world_rank, const StreamPlan& plan,
                               const ServiceSchedule& schedule, const CommConfig& config, const c10::Device& device,
                               HealthChannel* health);

}  // namespace wd::comm
