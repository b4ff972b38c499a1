// StreamMark: record an event on the current stream, poll it with a deadline.
#include "comm/stream_mark.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <thread>

#include "core/host_sync.hpp"

namespace wd::comm {

StreamMark::StreamMark(const c10::Device& device) : device_(device) {
  // A host device has no events (its guard implementation refuses them) and needs none.
  if (device.type() != c10::kCPU) event_.emplace(device.type());
}

void StreamMark::record() {
  if (!event_) return;
  const c10::impl::VirtualGuardImpl guard(device_.type());
  const c10::Device device = device_.has_index() ? device_ : guard.getDevice();
  event_->record(guard.getStream(device));
  recorded_ = true;
}

bool StreamMark::done() const { return !recorded_ || event_->query(); }

void StreamMark::wait(const WaitInfo& info, std::chrono::duration<double> timeout, int world_rank,
                      HealthChannel* health, const char* where) {
  if (!recorded_) return;
  note_host_sync(where);
  const bool done = poll_until(timeout, [&] {
    if (event_->query()) return true;
    watch_health(health, info.op);
    return false;
  });
  if (!done) throw_timeout(info, timeout, world_rank, info.peers);
}

bool StreamMark::settle(std::chrono::duration<double> grace) const noexcept {
  try {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
  } catch (...) {
    return false;  // a device error: the work's outcome is unknown, so treat it as unfinished
  }
}

}  // namespace wd::comm
