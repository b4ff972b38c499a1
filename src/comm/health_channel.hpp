// HealthChannel: failure notices and control messages between ranks, on a communicator of its
// own, polled by every deadline wait it is handed to.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/failure_notice.hpp"
#include "core/topology.hpp"

namespace wd::comm {

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

/// The health channel of one job: a duplicate of the world communicator on which ranks post
/// failure notices and control messages without blocking. Constructed once on every rank when
/// training starts (collective: MPI_Comm_dup) and handed to whatever waits during training
/// (streams, reducers, loops), which poll it on every pass. Non-copyable owner of its
/// communicator and requests.
class HealthChannel {
 public:
  /// Message tags on the channel's communicator: nothing else is sent there.
  enum Tag : int { kNoticeTag = 1, kControlTag = 2, kReportTag = 3, kReleaseTag = 4 };

  HealthChannel(MPI_Comm world, const Topology& topo);
  ~HealthChannel();
  HealthChannel(const HealthChannel&) = delete;
  HealthChannel& operator=(const HealthChannel&) = delete;

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
  /// background; the failure exchange waits for them with a deadline).
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

  /// Tests the posted receives, keeps what arrived and reposts; retires finished sends. Raises
  /// nothing (check() does): the failure exchange polls with it after a failure.
  void poll() noexcept;
  /// The notices received from other ranks so far.
  const std::vector<FailureNotice>& notices() const noexcept { return notices_; }
  /// Sends `size` bytes to `dest` under `tag` without waiting (a copy is kept until sent).
  void post(int dest, Tag tag, const void* data, std::size_t size) noexcept;
  /// Waits (at most timeout_s) for the posted sends to the ranks `to` marks; frees every
  /// finished one. Returns whether they all finished.
  bool settle_sends(double timeout_s, const std::vector<bool>& to) noexcept;
  /// The channel's communicator (world ranks), for the exchange's own receives.
  MPI_Comm comm() const noexcept { return comm_; }

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

  void post_notice_recv() noexcept;
  void post_control_recv() noexcept;

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

}  // namespace wd::comm
