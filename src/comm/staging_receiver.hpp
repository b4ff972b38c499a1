// StagingReceiver: an MPI stream delivered on the receiver's device. The MPI ring receives into
// (pinned) host buffers; each received message is copied once into device buffers of its own.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "comm/stream_mark.hpp"
#include "comm/receiver.hpp"

namespace wd::comm {

/// Wraps a host receiver. recv(step) copies the host message into a device slot
/// (allocated once, one per host ring slot) on the current stream and marks the end of the copy
/// with an event; release(step) first waits for that event only (the host slot is reposted to
/// MPI right after, which would overwrite it; later work on the stream need not finish), with
/// deadline `timeout_s` and polling `health` (null: none), then releases the host slot. Works
/// for any device, so the ring logic runs on the CPU in tests.
class StagingReceiver final : public Receiver {
 public:
  StagingReceiver(std::unique_ptr<Receiver> host, const MessageSpec& spec,
                  const c10::Device& device, std::size_t slots, std::int64_t first_step,
                  double timeout_s, int world_rank, HealthChannel* health);
  /// Waits (a bounded grace) for copies still reading the host ring before it goes; if one does
  /// not finish, the host receiver and its buffers are kept until exit rather than freed under
  /// a queued copy.
  ~StagingReceiver() override;
  StagingReceiver(const StagingReceiver&) = delete;
  StagingReceiver& operator=(const StagingReceiver&) = delete;

  const Message& recv(std::int64_t step) override;
  void release(std::int64_t step) override;
  double wait_seconds() const override { return host_->wait_seconds(); }

 private:
  struct Slot {
    Message message;  ///< device copies; tensors allocated once; step -1 when free
    StreamMark copied;  ///< after the copy out of the host ring
  };

  // Declared first, destroyed last: the host ring's pinned buffers outlive the device slots
  // and their events (the destructor has drained the copies from them by then).
  std::unique_ptr<Receiver> host_;
  c10::Device device_;
  std::int64_t first_step_;
  double timeout_s_;
  int world_rank_;
  HealthChannel* health_;
  std::uint64_t bytes_;  ///< one message, for timeout messages
  std::vector<Slot> slots_;
};

}  // namespace wd::comm
