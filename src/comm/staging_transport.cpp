// StagingTransport: host ring in, device tensors out.
#include "comm/staging_transport.hpp"

#include "core/errors.hpp"
#include "core/torch_compat.hpp"

namespace wd::comm {

StagingTransport::StagingTransport(std::unique_ptr<Transport> host, const MessageSpec& spec,
                                   const c10::Device& device, std::size_t slots,
                                   std::int64_t first_step)
    : host_(std::move(host)), device_(device), first_step_(first_step), slots_(slots) {
  WD_CHECK(slots > 0, "a staging transport needs at least one slot");
  for (auto& slot : slots_) {
    for (const auto& t : spec.tensors) {
      slot.tensors[t.name] = torch::empty(t.shape, torch::TensorOptions().dtype(t.dtype).device(device_));
    }
  }
}

void StagingTransport::send(std::int64_t step, const std::vector<TensorDict>& per_student) {
  host_->send(step, per_student);
}

void StagingTransport::broadcast(std::int64_t step, const TensorDict& message) {
  host_->broadcast(step, message);
}

void StagingTransport::flush() { host_->flush(); }

const Message& StagingTransport::recv(std::int64_t step) {
  Message& slot = slots_[static_cast<std::size_t>(step - first_step_) % slots_.size()];
  if (slot.step == step) return slot;
  WD_CHECK(slot.step == -1, "recv(step " << step << "): step " << slot.step
                                         << " still holds its device slot; release it first");
  const Message& received = host_->recv(step);
  // Asynchronous from pinned memory: the copy overlaps whatever the device still runs.
  for (auto& [name, tensor] : slot.tensors) tensor.copy_(received.at(name), /*non_blocking=*/true);
  slot.step = step;
  return slot;
}

void StagingTransport::release(std::int64_t step) {
  Message& slot = slots_[static_cast<std::size_t>(step - first_step_) % slots_.size()];
  WD_CHECK(slot.step == step, "release(step " << step << ") before recv(step " << step << ")");
  // The host buffer is reposted to MPI on release: the copy out of it must have finished.
  compat::synchronize_device(device_);
  slot.step = -1;
  host_->release(step);
}

}  // namespace wd::comm
