// The ring every stream shares, whatever carries its bytes: steps in order, prefetch_depth
// preallocated slots, checked messages, deadlines and wait accounting. The MPI transport
// (transport.cpp) and the NCCL transport (nccl_transport.cpp) supply only how a slot is packed,
// sent, posted and waited for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/transport.hpp"

namespace wd::comm {

/// The sending end of a stream: acquires the slot of the next step once the sends of the step
/// that used it before have completed, packs the message(s) into it and starts the sends.
class SendingTransport : public Transport {
 public:
  void send(std::int64_t step, const std::vector<TensorDict>& per_receiver) final;
  void broadcast(std::int64_t step, const TensorDict& message) final;
  const Message& recv(std::int64_t step) final;
  void release(std::int64_t step) final;
  void flush() final;
  double wait_seconds() const final { return waited_; }
  void set_send_fault_hook(FaultHook hook) final { fault_hook_ = std::move(hook); }

 protected:
  SendingTransport(const StreamEnd& end, const MessageSpec& spec, std::size_t slots,
                   std::int64_t first, std::int64_t end_step);

  /// Messages a slot holds: one per receiver, or one shared by all in broadcast mode.
  std::size_t messages_per_slot() const { return broadcast_ ? 1 : end_.peers.size(); }
  const StreamEnd& ends() const { return end_; }
  const MessageSpec& spec() const { return spec_; }

  /// Copies `dict` (already checked against the spec) into message `message` of slot `slot`.
  virtual void pack(std::size_t slot, std::size_t message, const TensorDict& dict) = 0;
  /// Starts the sends of slot `slot`, which holds `step`.
  virtual void start(std::size_t slot, std::int64_t step) = 0;
  /// Blocks, with deadline, until the sends of slot `slot` (holding `step`) completed.
  virtual void wait_sent(std::size_t slot, std::int64_t step) = 0;
  /// Called before each acquire: lets a backend progress the sends still in flight.
  virtual void progress() {}

 private:
  std::size_t acquire(std::int64_t step);
  /// Starts the sends of the packed slot and records them in flight.
  void start_step(std::size_t slot, std::int64_t step);
  void settle(std::size_t slot);

  StreamEnd end_;
  MessageSpec spec_;
  bool broadcast_;
  std::int64_t first_step_, end_step_;
  std::int64_t next_step_;
  std::vector<std::int64_t> in_flight_;  ///< per slot: the step whose sends may be pending, or -1
  double waited_ = 0;
  FaultHook fault_hook_;
};

/// The receiving end of a stream: `slots` receives posted ahead in step order, each message
/// held until released, then its slot reposted for a later step.
class ReceivingTransport : public Transport {
 public:
  void send(std::int64_t step, const std::vector<TensorDict>& per_receiver) final;
  void broadcast(std::int64_t step, const TensorDict& message) final;
  void flush() final;
  const Message& recv(std::int64_t step) final;
  void release(std::int64_t step) final;
  double wait_seconds() const final { return waited_; }

 protected:
  ReceivingTransport(const StreamEnd& end, std::size_t slots, std::int64_t first,
                     std::int64_t end_step);

  /// Posts the first receives. A subclass calls it once, when its buffers exist.
  void post_ahead();
  const StreamEnd& ends() const { return end_; }
  int sender() const { return end_.peers.front(); }
  int sender_rank() const { return end_.peer_ranks.front(); }
  std::size_t slots() const { return state_.size(); }

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
  [[noreturn]] void sender_only(const char* what, std::int64_t step) const;
  void post_step(std::int64_t step);

  StreamEnd end_;
  std::int64_t first_step_, end_step_;
  std::int64_t next_release_;
  std::vector<SlotState> state_;
  double waited_ = 0;
};

}  // namespace wd::comm
