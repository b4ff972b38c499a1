// StagingTransport: a student's MPI stream delivered on its device. The MPI ring receives into
// (pinned) host buffers; each received message is copied once into device buffers of its own.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "comm/transport.hpp"

namespace wd::comm {

/// Wraps a student's host transport. recv(step) copies the host message into a device slot
/// (allocated once, one per host ring slot) on the current stream and returns the device
/// tensors; release(step) first waits for that copy (the host slot is reposted to MPI right
/// after, which would overwrite it), then releases the host slot. Works for any device, so
/// the ring logic runs on the CPU in tests.
class StagingTransport final : public Transport {
 public:
  StagingTransport(std::unique_ptr<Transport> host, const MessageSpec& spec,
                   const c10::Device& device, std::size_t slots, std::int64_t first_step);
  void send(std::int64_t step, const std::vector<TensorDict>& per_student) override;
  void broadcast(std::int64_t step, const TensorDict& message) override;
  const Message& recv(std::int64_t step) override;
  void release(std::int64_t step) override;
  void flush() override;
  double wait_seconds() const override { return host_->wait_seconds(); }
  void set_send_fault_hook(FaultHook hook) override { host_->set_send_fault_hook(std::move(hook)); }

 private:
  std::unique_ptr<Transport> host_;
  c10::Device device_;
  std::int64_t first_step_;
  std::vector<Message> slots_;  ///< device copies; tensors allocated once
};

}  // namespace wd::comm
