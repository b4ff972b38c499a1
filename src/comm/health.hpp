// Health channel: failure notices between ranks, stop/requeue signals, and the failure
// protocol that brings every rank's report to one rank without any blocking collective.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/failure.hpp"
#include "core/topology.hpp"

namespace wd::comm {

/// One rank's account of a failure. Fixed-size and trivially copyable: sent as bytes.
struct FailureNotice {
  static constexpr int kMaxLost = 8;
  std::int32_t rank = -1;        ///< world rank that saw the failure
  std::int32_t role = 0;         ///< its Role
  std::int64_t step = 0;         ///< training step it was in (1-based; 0 = before the first)
  FailureKind kind = FailureKind::kNone;
  std::int32_t lost_count = 0;   ///< kPeerLost: how many ranks did not answer
  std::int32_t lost[kMaxLost] = {};  ///< the first kMaxLost of them
  char op[64] = {};              ///< what the rank was doing ("recv batch", "train step" ...)
  char message[832] = {};        ///< the error text, truncated

  std::vector<int> lost_ranks() const;
  std::string op_text() const { return op; }
  std::string message_text() const { return message; }
};
static_assert(std::is_trivially_copyable_v<FailureNotice>, "FailureNotice is sent as bytes");

/// Builds this rank's notice from a caught exception: its kind (a TimeoutError is kPeerLost
/// with the peers that did not answer), its message, and the rank's current step and op.
FailureNotice notice_from_exception(std::exception_ptr failure, const Topology& topo,
                                    std::int64_t step, const std::string& op);

/// Raised on a rank that learns of another rank's failure; its kind is that failure's kind,
/// so every rank exits with the same code.
class PeerFailure : public KindedError {
 public:
  explicit PeerFailure(const FailureNotice& notice);
  const FailureNotice& notice() const noexcept { return notice_; }

 private:
  FailureNotice notice_;
};

/// Raised at the next wait or step boundary after SIGTERM or SIGINT.
class Interrupted : public KindedError {
 public:
  explicit Interrupted(int signal);
  int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

/// Raised on a teacher rank (in a wait or at a step boundary) when the students stopped after
/// `step` for a requeue; the teacher then ends its loop normally.
class StopRequested : public std::runtime_error {
 public:
  explicit StopRequested(std::int64_t step)
      : std::runtime_error("students stopped after step " + std::to_string(step)), step_(step) {}
  std::int64_t step() const noexcept { return step_; }

 private:
  std::int64_t step_;
};

/// Installs the process's handlers: SIGTERM and SIGINT request a stop (raised as Interrupted
/// at the next check), SIGUSR1 a checkpoint and a requeue exit. The handlers only set flags.
void install_signal_handlers();
/// The stop signal received (SIGTERM/SIGINT), or 0.
int stop_signal() noexcept;

/// What every rank sends the reporting rank after a failure. Fixed-size; `payload` carries
/// the caller's memory report (this folder does not know its layout).
struct FailureReport {
  static constexpr std::size_t kPayloadBytes = 1024;
  FailureNotice own;             ///< kind kNone when this rank only stopped because of others
  std::int32_t rank = -1;
  std::int32_t role = 0;
  std::int64_t step = 0;
  char op[64] = {};
  std::uint32_t payload_bytes = 0;
  std::uint8_t payload[kPayloadBytes] = {};
};
static_assert(std::is_trivially_copyable_v<FailureReport>, "FailureReport is sent as bytes");

/// The outcome of the failure protocol on one rank.
struct FailureExchange {
  int reporter = 0;                      ///< world rank that prints the diagnosis
  std::vector<FailureNotice> notices;    ///< every notice this rank knows (its own included)
  std::vector<int> lost;                 ///< ranks named as not answering (never this rank)
  /// On the reporter: reports[r] is rank r's report, nullopt when it did not answer in time.
  std::vector<std::optional<FailureReport>> reports;
};

/// The failure that caused the others: the first notice whose kind is not kPeerLost (lowest
/// step, then lowest rank), else the first kPeerLost one naming a rank that posted no notice
/// itself, else the first kPeerLost one. Null when `notices` is empty.
const FailureNotice* primary_failure(const std::vector<FailureNotice>& notices);

/// The health channel of one job: a duplicate of the world communicator on which ranks post
/// failure notices and control messages without blocking. Constructed once on every rank when
/// training starts (collective: MPI_Comm_dup); while it lives it is the active channel that
/// every deadline wait polls. Non-copyable owner of its communicator and requests.
class HealthChannel {
 public:
  HealthChannel(MPI_Comm world, const Topology& topo);
  ~HealthChannel();
  HealthChannel(const HealthChannel&) = delete;
  HealthChannel& operator=(const HealthChannel&) = delete;

  /// The channel that deadline waits poll, or null when none lives.
  static HealthChannel* active() noexcept;

  /// Marks what this rank is doing (read by failure reports and the watchdog); a heartbeat.
  void at(std::int64_t step, const char* op) noexcept;
  /// Marks the operation only (waits call it on every poll); a heartbeat.
  void mark(const char* op) noexcept;
  std::int64_t step() const noexcept { return step_.load(); }
  const char* op() const noexcept { return op_.load(); }
  /// Seconds since the last at()/mark() (read by the watchdog thread).
  double seconds_since_beat() const noexcept;

  /// Polls for notices, control messages and signals. Throws PeerFailure for the first notice
  /// from another rank, Interrupted after SIGTERM/SIGINT, StopRequested once a stop_after
  /// message arrived. Cheap (a few MPI_Test calls).
  void check();
  /// Posts `notice` to every other rank and returns at once (the sends complete in the
  /// background; the protocol below waits for them with a deadline).
  void announce(const FailureNotice& notice) noexcept;

  /// True once a checkpoint-and-requeue was asked for: SIGUSR1 on this rank or on any other
  /// (a rank that receives the signal forwards it to all).
  bool requeue_requested() noexcept;
  /// Student leader: tells `ranks` that training stops after step `step` (a requeue).
  void send_stop_after(std::int64_t step, const std::vector<int>& ranks) noexcept;
  /// The step after which training stops, once a stop_after message arrived.
  std::optional<std::int64_t> stop_after() noexcept;
  /// Waits (at most timeout_s, then TimeoutError) until every rank called it. Used once, when
  /// every rank stops for a requeue: the checkpoint is then written before anyone exits. It
  /// runs on the channel's own communicator, which no abandoned collective can confuse.
  void barrier(const char* op, double timeout_s);

  /// The failure protocol, run by every rank that caught a failure (after the stack unwound,
  /// with the notice of its own failure, or kind kNone when it stopped because of another's):
  /// announces its own failure, collects notices for `settle_s`, picks the reporter (the lowest
  /// rank nobody reported lost), and sends `mine` there; the reporter gathers every rank's
  /// report for up to `gather_s`. Never blocks without a deadline and never throws.
  FailureExchange exchange_failure_reports(const FailureNotice& own, const FailureReport& mine,
                                           double settle_s, double gather_s) noexcept;
  /// Reporter: tells every rank that reported the job's exit code (waits at most grace_s).
  void release(const FailureExchange& exchange, int code, double grace_s) noexcept;
  /// Others: waits (at most timeout_s) for the reporter's exit code.
  std::optional<int> wait_for_release(int reporter, double timeout_s) noexcept;

  const Topology& topology() const noexcept { return topo_; }

 private:
  struct Control {
    std::int32_t type = 0;  ///< 1: requeue requested, 2: stop after `step`
    std::int32_t pad = 0;
    std::int64_t step = 0;
  };
  struct Outgoing {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<std::uint8_t[]> bytes;
    int dest = -1;
  };

  /// Tests the posted receives; keeps what arrived and reposts. Never throws.
  void poll() noexcept;
  void post_notice_recv() noexcept;
  void post_control_recv() noexcept;
  void send_bytes(int dest, int tag, const void* data, std::size_t size) noexcept;
  /// Waits (at most timeout_s) for the outgoing sends to the ranks `to` marks; frees every
  /// finished one.
  void settle_sends(double timeout_s, const std::vector<bool>& to) noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  Topology topo_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<const char*> op_{"start-up"};
  std::atomic<std::int64_t> beat_ns_{0};

  FailureNotice incoming_notice_{};
  MPI_Request notice_req_ = MPI_REQUEST_NULL;
  Control incoming_control_{};
  MPI_Request control_req_ = MPI_REQUEST_NULL;
  std::vector<FailureNotice> notices_;  ///< received from other ranks
  std::size_t notices_raised_ = 0;      ///< how many check() has turned into PeerFailure
  std::deque<Outgoing> outgoing_;
  bool requeue_ = false;
  bool requeue_forwarded_ = false;
  std::optional<std::int64_t> stop_after_;
};

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
