// Watchdog: the heartbeat-watching thread.
#include "comm/watchdog.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace wd::comm {

struct Watchdog::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

Watchdog::Watchdog(const HealthChannel& health, double limit_s, int code) : state_(std::make_unique<State>()) {
  State* s = state_.get();
  const HealthChannel* h = &health;
  s->thread = std::thread([s, h, limit_s, code] {
    std::unique_lock<std::mutex> lock(s->mutex);
    while (!s->stop) {
      s->wake.wait_for(lock, std::chrono::milliseconds(250));
      if (s->stop) break;
      const double idle = h->seconds_since_beat();
      if (idle > limit_s) {
        spdlog::error("watchdog: no progress for {:.0f} s in {} at step {} (stuck inside a library "
                      "call, or a step longer than the deadline allows); exiting with code {}",
                      idle, h->op(), h->step(), code);
        spdlog::default_logger()->flush();
        std::fflush(stderr);
        std::_Exit(code);
      }
    }
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace wd::comm
