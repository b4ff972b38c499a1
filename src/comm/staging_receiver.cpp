// StagingReceiver: host ring in, device tensors out.
#include "comm/staging_receiver.hpp"

#include <spdlog/spdlog.h>

#include "core/errors.hpp"

namespace wd::comm {

namespace {
/// How long teardown waits for a queued copy out of the host ring before it keeps the ring.
constexpr std::chrono::seconds kDrainGrace{5};
}  // namespace

StagingReceiver::StagingReceiver(std::unique_ptr<Receiver> host, const MessageSpec& spec,
                                 const c10::Device& device, std::size_t slots,
                                 std::int64_t first_step, double timeout_s, int world_rank,
                                 HealthChannel* health)
    : host_(std::move(host)),
      device_(device),
      first_step_(first_step),
      timeout_s_(timeout_s),
      world_rank_(world_rank),
      health_(health),
      bytes_(spec.bytes()) {
  WD_CHECK(slots > 0, "a staging receiver needs at least one slot");
  slots_.reserve(slots);
  for (std::size_t i = 0; i < slots; ++i) {
    Slot slot{Message{}, StreamMark(device_)};
    for (const auto& t : spec.tensors) {
      const auto where = host_resident(t.name) ? c10::Device(torch::kCPU) : device_;
      slot.message.tensors[t.name] = torch::empty(t.shape, torch::TensorOptions().dtype(t.dtype).device(where));
    }
    slots_.push_back(std::move(slot));
  }
}

StagingReceiver::~StagingReceiver() {
  bool drained = true;
  for (const Slot& slot : slots_) {
    if (slot.message.step != -1) drained = slot.copied.settle(kDrainGrace) && drained;
  }
  if (!drained) {
    // A copy may still read the ring's pinned buffers: freeing them would let a new pinned
    // allocation reuse memory under it. Only reached on a failure path, just before exit.
    spdlog::warn("staging receiver of rank {}: a copy out of the receive ring did not finish "
                 "within {} s; its buffers are kept until exit",
                 world_rank_, kDrainGrace.count());
    (void)host_.release();
  }
}

const Message& StagingReceiver::recv(std::int64_t step) {
  Slot& slot = slots_[static_cast<std::size_t>(step - first_step_) % slots_.size()];
  if (slot.message.step == step) return slot.message;
  WD_CHECK(slot.message.step == -1, "recv(step " << step << "): step " << slot.message.step
                                                 << " still holds its device slot; release it first");
  const Message& received = host_->recv(step);
  // Asynchronous from pinned memory: the copy overlaps whatever the device still runs (the
  // host-resident lengths are a plain host copy, done when copy_ returns).
  for (auto& [name, tensor] : slot.message.tensors) {
    tensor.copy_(received.at(name), /*non_blocking=*/true);
  }
  slot.copied.record();
  slot.message.step = step;
  return slot.message;
}

void StagingReceiver::release(std::int64_t step) {
  Slot& slot = slots_[static_cast<std::size_t>(step - first_step_) % slots_.size()];
  WD_CHECK(slot.message.step == step, "release(step " << step << ") before recv(step " << step << ")");
  // The host buffer is reposted to MPI on release: the copy out of it must have finished (the
  // forward and backward queued after it need not).
  slot.copied.wait(WaitInfo{"staging copy", step, bytes_, {}}, std::chrono::duration<double>(timeout_s_),
                   world_rank_, health_, "StagingReceiver::release");
  slot.message.step = -1;
  host_->release(step);
}

}  // namespace wd::comm
