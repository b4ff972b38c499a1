// The process's stop and requeue signals: handlers that only set flags, and the flags read back.
#pragma once

#include <string>

#include "core/failure.hpp"

namespace wd::comm {

/// Raised at the next wait or step boundary after SIGTERM or SIGINT.
class Interrupted : public KindedError {
 public:
  explicit Interrupted(int signal);
  int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

/// Installs the process's handlers: SIGTERM and SIGINT request a stop (raised as Interrupted
/// at the next check), SIGUSR1 a checkpoint and a requeue exit. The handlers only set flags.
void install_signal_handlers();
/// The stop signal received (SIGTERM/SIGINT), or 0.
int stop_signal() noexcept;
/// True once this process received SIGUSR1 (a checkpoint-and-requeue request).
bool requeue_signalled() noexcept;

}  // namespace wd::comm
