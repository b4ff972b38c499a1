// RingSender: the sending end's ring, whatever carries its bytes: steps in order,
// prefetch_depth preallocated slots, checked messages, deadlines and wait accounting. The MPI
// and NCCL senders supply only how a slot is packed, sent and waited for.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/message_spec.hpp"
#include "comm/sender.hpp"
#include "comm/stream_end.hpp"

namespace wd::comm {

/// Acquires the slot of the next step once the sends of the step that used it before have
/// completed, packs the message(s) into it and starts the sends.
class RingSender : public Sender {
 public:
  void send(std::int64_t step, const std::vector<TensorDict>& per_receiver) final;
  void broadcast(std::int64_t step, const TensorDict& message) final;
  void flush() final;
  double wait_seconds() const final { return waited_; }
  void set_send_fault_hook(FaultHook hook) final { fault_hook_ = std::move(hook); }

 protected:
  /// `health` (null: none) is polled by the waits and marked by the fault hook.
  RingSender(const StreamEnd& end, const MessageSpec& spec, std::size_t slots, std::int64_t first,
             std::int64_t end_step, HealthChannel* health);

  /// Messages a slot holds: one per receiver, or one shared by all in broadcast mode.
  std::size_t messages_per_slot() const { return broadcast_ ? 1 : end_.peers.size(); }
  const StreamEnd& ends() const { return end_; }
  const MessageSpec& spec() const { return spec_; }
  HealthChannel* health() const { return health_; }

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
  HealthChannel* health_;
};

}  // namespace wd::comm
