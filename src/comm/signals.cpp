// Signal handlers and their flags. The flags are process-wide because a signal handler can
// reach nothing else; everything past the flag goes through the health channel.
#include "comm/signals.hpp"

#include <csignal>

namespace wd::comm {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_requeue_signal = 0;

extern "C" void on_stop_signal(int signal) { g_stop_signal = signal; }
extern "C" void on_requeue_signal(int) { g_requeue_signal = 1; }

}  // namespace

Interrupted::Interrupted(int signal)
    : KindedError(FailureKind::kInterrupted,
                  std::string("stopped by ") + (signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal")),
      signal_(signal) {}

void install_signal_handlers() {
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  sigemptyset(&stop.sa_mask);
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
  struct sigaction requeue {};
  requeue.sa_handler = on_requeue_signal;
  sigemptyset(&requeue.sa_mask);
  sigaction(SIGUSR1, &requeue, nullptr);
}

int stop_signal() noexcept { return static_cast<int>(g_stop_signal); }

bool requeue_signalled() noexcept { return g_requeue_signal != 0; }

}  // namespace wd::comm
