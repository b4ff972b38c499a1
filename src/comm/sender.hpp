// Sender: the sending end of a stream (non-blocking sends, at most prefetch_depth steps in
// flight, buffers reused).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/message_spec.hpp"
#include "comm/wait.hpp"

namespace wd::comm {

/// The sending end of a stream to its receivers (a teacher to its students, a stage to the
/// next, or, the other way, a student to its teacher). Steps go in order, first_step to
/// end_step - 1.
class Sender {
 public:
  virtual ~Sender() = default;
  /// Copies each receiver's message into a send slot and starts the sends; waits (with
  /// deadline) only when prefetch_depth steps are still in flight. `per_receiver[i]` goes to
  /// receiver i of the end, in message order.
  virtual void send(std::int64_t step, const std::vector<TensorDict>& per_receiver) = 0;
  /// Broadcast mode: the same message to every receiver.
  virtual void broadcast(std::int64_t step, const TensorDict& message) = 0;
  /// Waits (with deadline) until every send completed.
  virtual void flush() = 0;
  /// Seconds spent blocked in waits so far (for "wait fraction" metrics).
  virtual double wait_seconds() const = 0;
  /// Testing aid: `hook(step)` runs inside send/broadcast of every step, once the step's sends
  /// are started and before they complete (a rank dying mid-send).
  virtual void set_send_fault_hook(FaultHook hook) = 0;
};

}  // namespace wd::comm
