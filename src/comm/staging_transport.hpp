// StagingTransport: a student's MPI stream delivered on its device. The MPI ring receives into
// (pinned) host buffers; each received message is copied once into device buffers of its own.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "comm/stream_mark.hpp"
#include "comm/transport.hpp"

namespace wd::comm {

/// Wraps a student's host transport. recv(step) copies the host message into a device slot
/// (allocated once, one per host ring slot) on the current stream and marks the end of the copy
/// with an event; release(step) first waits for that event only (the host slot is reposted to
/// MPI right after, which would overwrite it; later work on the stream need not finish), with
/// deadline `timeout_s`, then releases the host slot. Works for any device, so the ring logic
/// runs on the CPU in tests.
class StagingTransport final : public Transport {
 public:
  StagingTransport(std::unique_ptr<Transport> host, const MessageSpec& spec,
                   const c10::Device& device, std::size_t slots, std::int64_t first_step,
                   double timeout_s, int world_rank);
  /// Waits (a bounded grace) for copies still reading the host ring before it goes; if one does
  /// not finish, the host transport and its buffers are kept until exit rather than freed under
  /// a queued copy.
  ~StagingTransport() override;
  StagingTransport(const StagingTransport&) = delete;
  StagingTransport& operator=(const StagingTransport&) = delete;

  void send(std::int64_t step, const std::vector<TensorDict>& per_student) override;
  void broadcast(std::int64_t step, const TensorDict& message) override;
  const Message& recv(std::int64_t step) override;
  void release(std::int64_t step) override;
  void flush() override;
  double wait_seconds() const override { return host_->wait_seconds(); }
  void set_send_fault_hook(FaultHook hook) override { host_->set_send_fault_hook(std::move(hook)); }

 private:
  struct Slot {
    Message message;  ///< device copies; tensors allocated once; step -1 when free
    StreamMark copied;  ///< after the copy out of the host ring
  };

  // Declared first, destroyed last: the host ring's pinned buffers outlive the device slots
  // and their events (the destructor has drained the copies from them by then).
  std::unique_ptr<Transport> host_;
  c10::Device device_;
  std::int64_t first_step_;
  double timeout_s_;
  int world_rank_;
  std::uint64_t bytes_;  ///< one message, for timeout messages
  std::vector<Slot> slots_;
};

}  // namespace wd::comm
