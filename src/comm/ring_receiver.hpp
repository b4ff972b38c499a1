// RingReceiver: the receiving end's ring, whatever carries its bytes: `slots` receives posted
// ahead in step order, each message held until released, then its slot reposted for a later
// step. The MPI and NCCL receivers supply only how a slot is posted, waited for and checked.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/receiver.hpp"
#include "comm/stream_end.hpp"

namespace wd::comm {

class HealthChannel;

/// Posts `slots` receives ahead in step order, hands out each completed message until it is
/// released, then reposts its slot for the step `slots` later.
class RingReceiver : public Receiver {
 public:
  const Message& recv(std::int64_t step) final;
  void release(std::int64_t step) final;
  double wait_seconds() const final { return waited_; }

 protected:
  /// `health` (null: none) is polled by the waits.
  RingReceiver(const StreamEnd& end, std::size_t slots, std::int64_t first, std::int64_t end_step,
               HealthChannel* health);

  /// Posts the first receives. A subclass calls it once, when its buffers exist.
  void post_ahead();
  const StreamEnd& ends() const { return end_; }
  int sender() const { return end_.peers.front(); }
  int sender_rank() const { return end_.peer_ranks.front(); }
  std::size_t slots() const { return state_.size(); }
  HealthChannel* health() const { return health_; }

  /// Posts the receive of `step` into slot `slot`.
  virtual void post(std::size_t slot, std::int64_t step) = 0;
  /// Blocks, with deadline, until the receive posted in slot `slot` for `step` completed.
  virtual void wait_received(std::size_t slot, std::int64_t step) = 0;
  /// The message of a completed receive, checked (it must be `step`'s).
  virtual Message& accept(std::size_t slot, std::int64_t step) = 0;
  /// The message in slot `slot` was released; called before the slot is reposted.
  virtual void consumed(std::size_t slot) {}

 private:
  enum class State { kIdle, kPosted, kReceived };
  struct SlotState {
    State state = State::kIdle;
    std::int64_t step = -1;     ///< posted for, or held
    Message* held = nullptr;    ///< kReceived: the message accept returned
  };
  void post_step(std::int64_t step);

  StreamEnd end_;
  std::int64_t first_step_, end_step_;
  std::int64_t next_release_;
  std::vector<SlotState> state_;
  double waited_ = 0;
  HealthChannel* health_;
};

}  // namespace wd::comm
