// Receiver: the receiving end of a stream (receives posted ahead into a ring, held until
// released).
#pragma once

#include <cstdint>

#include "comm/message_spec.hpp"

namespace wd::comm {

/// The receiving end of a stream from its one sender (a student from its teacher, a stage from
/// the previous one, or, the other way, a teacher from a student). Steps are consumed in order,
/// first_step to end_step - 1.
class Receiver {
 public:
  virtual ~Receiver() = default;
  /// The message of `step`; waits with deadline. Receives are posted prefetch_depth steps
  /// ahead. The tensors stay valid until release(step).
  virtual const Message& recv(std::int64_t step) = 0;
  /// Returns the slot of `step`; its receive is reposted for a later step.
  virtual void release(std::int64_t step) = 0;
  /// Seconds spent blocked in waits so far (for "wait fraction" metrics).
  virtual double wait_seconds() const = 0;
};

}  // namespace wd::comm
