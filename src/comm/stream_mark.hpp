// StreamMark: a point in a device's current stream that the host waits for by polling, with a
// deadline, instead of synchronising the whole stream. Device-generic (c10::Event), so it
// compiles in every build; on the host there is nothing to wait for.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <optional>

#include "comm/wait.hpp"

namespace wd::comm {

/// One recordable point on `device`'s current stream. On a host device every method is a
/// no-op: the work before a point has finished when the host reaches it. Move-only.
class StreamMark {
 public:
  explicit StreamMark(const c10::Device& device);

  /// Marks the work queued so far on the device's current stream.
  void record();
  /// True when nothing is recorded or the recorded work has finished (never waits).
  bool done() const;
  /// Waits until done(), polling `health` (when not null), for at most `timeout`; counts one
  /// host synchronisation at `where` (a static label) when something was recorded on a device.
  /// Throws TimeoutError naming `info`'s op and step.
  void wait(const WaitInfo& info, std::chrono::duration<double> timeout, int world_rank,
            HealthChannel* health, const char* where);
  /// Like wait, but for teardown: never throws, gives up after `grace`; false when the marked
  /// work had not finished by then.
  bool settle(std::chrono::duration<double> grace) const noexcept;

 private:
  std::optional<c10::Event> event_;  ///< empty on a host device
  c10::Device device_;
  bool recorded_ = false;
};

}  // namespace wd::comm
