// Watchdog: a thread that ends the process when the main thread stops making progress.
#pragma once

#include <memory>

#include "comm/health_channel.hpp"

namespace wd::comm {

/// Ends the process when the main thread stops making progress: a wait stuck inside a library
/// (a collective that never returns, a hung device) cannot poll its deadline, so this thread
/// watches the health channel's heartbeat and, after `limit_s` without one, logs where the rank
/// was stuck and exits with `code`. The thread is joined on destruction.
class Watchdog {
 public:
  Watchdog(const HealthChannel& health, double limit_s, int code);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace wd::comm
