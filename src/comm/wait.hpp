// What every deadline wait shares, MPI or NCCL: the wait's description, the timeout error, the
// polling backoff, the one poll loop built on it and the health-channel poll. Torch-free, so the
// NCCL layer can use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/errors.hpp"

namespace wd::comm {

class HealthChannel;

/// What a wait is for, so a timeout message can name it.
struct WaitInfo {
  const char* op;         ///< "recv batch", "send batch", "allreduce grads", ...
  std::int64_t step;      ///< training step (or sequence number)
  std::uint64_t bytes;    ///< payload size
  std::vector<int> peers; ///< world ranks waited for
  /// peers[i] is the peer of requests[i] (wait_all_with_deadline): a timeout then names only
  /// the peers whose requests are still pending.
  bool peer_per_request = false;
};

/// Raised when a wait passes its deadline; the message names op, step, bytes, this rank and
/// the peers. `missing()` are the peers that did not answer: the failure handler reports them
/// as the ranks that stopped answering.
class TimeoutError : public MpiError {
 public:
  TimeoutError(const std::string& what, std::string op, std::int64_t step, std::vector<int> missing)
      : MpiError(what), op_(std::move(op)), step_(step), missing_(std::move(missing)) {}
  const std::string& op() const noexcept { return op_; }
  std::int64_t step() const noexcept { return step_; }
  const std::vector<int>& missing() const noexcept { return missing_; }

 private:
  std::string op_;
  std::int64_t step_;
  std::vector<int> missing_;
};

/// Throws the TimeoutError of `info`: "timeout after Ts waiting for <op> of step S (B bytes) on
/// rank R; waited for rank(s) a,b".
[[noreturn]] void throw_timeout(const WaitInfo& info, std::chrono::duration<double> timeout,
                                int my_rank, const std::vector<int>& peers);

/// Marks this rank as busy in `op` on `health` and polls it; throws PeerFailure, Interrupted or
/// StopRequested. Every polling wait calls it once per poll. Null `health` (before training,
/// single-process tests): nothing to watch.
void watch_health(HealthChannel* health, const char* op);

/// A testing aid (--inject-fault ...:allreduce, ...:send): called at a point inside an
/// operation with the step number the operation was called with; the caller's wiring decides
/// whether a fault strikes there. Empty: no fault planned.
using FaultHook = std::function<void(std::int64_t step)>;

/// Runs `hook` (when set) inside `op`, marked first on `health` (when not null), so a failure
/// there is reported in `op`.
void run_fault_hook(const FaultHook& hook, HealthChannel* health, const char* op, std::int64_t step);

/// World rank of this process, or -1 when MPI is not (or no longer) usable; for messages.
int current_world_rank() noexcept;

/// "(rank R, at file.cpp:line)": where a failed MPI, NCCL or CUDA call was made (R is "?"
/// outside MPI), the tail of every WD_CHECK_* message.
std::string call_site(const char* file, int line);

/// Polling cadence shared by every wait: a short spin keeps latency low when the peer is about
/// to deliver; after that the sleep doubles up to 1 ms so a waiting rank leaves the core to the
/// ranks that are computing (several ranks share few cores on a laptop or a CI runner).
class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Backoff(std::chrono::duration<double> timeout);
  bool expired() const { return Clock::now() >= deadline_; }
  /// Seconds since the wait began.
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void pause();

 private:
  Clock::time_point start_, deadline_;
  std::chrono::microseconds sleep_{2};
};

/// The poll loop of every wait: calls `poll` until it returns true or `timeout` passes, pausing
/// on a Backoff between calls. `poll` runs at least once and once more after the deadline
/// passed, so work that finished just in time counts; an exception from it ends the wait.
/// Returns whether `poll` succeeded.
template <typename Poll>
bool poll_until(std::chrono::duration<double> timeout, Poll&& poll) {
  Backoff backoff(timeout);
  for (;;) {
    const bool expired = backoff.expired();
    if (poll()) return true;
    if (expired) return false;
    backoff.pause();
  }
}

/// Runs `wait` and adds the seconds it took to `total`, also when it throws (the "wait
/// fraction" of a stream or a reducer).
template <typename Wait>
void timed(double& total, Wait&& wait) {
  const auto begin = std::chrono::steady_clock::now();
  try {
    wait();
  } catch (...) {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    throw;
  }
  total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace wd::comm
