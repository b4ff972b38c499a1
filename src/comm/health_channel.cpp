// HealthChannel: notices, control messages, signals, and the requeue barrier.
#include "comm/health_channel.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>

#include "comm/mpi_runtime.hpp"
#include "comm/signals.hpp"
#include "comm/wait.hpp"

namespace wd::comm {

namespace {

constexpr int kControlRequeue = 1;
constexpr int kControlStopAfter = 2;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

HealthChannel::HealthChannel(MPI_Comm world, const Topology& topo) : topo_(topo) {
  WD_CHECK_MPI(MPI_Comm_dup(world, &comm_));
  WD_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  beat_ns_ = now_ns();
  post_notice_recv();
  post_control_recv();
}

HealthChannel::~HealthChannel() {
  std::vector<MPI_Request*> pending{&notice_req_, &control_req_};
  for (auto& o : outgoing_) pending.push_back(&o.request);
  if (!cancel_and_settle(pending)) {
    // Something is still in flight: its buffers must outlive us, and freeing the communicator
    // under it is not allowed.
    for (auto& o : outgoing_) static_cast<void>(o.bytes.release());
    return;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void HealthChannel::at(std::int64_t step, const char* op) noexcept {
  step_ = step;
  op_ = op;
  beat_ns_ = now_ns();
}

void HealthChannel::mark(const char* op) noexcept {
  op_ = op;
  beat_ns_ = now_ns();
}

double HealthChannel::seconds_since_beat() const noexcept {
  return static_cast<double>(now_ns() - beat_ns_.load()) * 1e-9;
}

void HealthChannel::post_notice_recv() noexcept {
  if (MPI_Irecv(&incoming_notice_, sizeof(FailureNotice), MPI_BYTE, MPI_ANY_SOURCE, kNoticeTag, comm_,
                &notice_req_) != MPI_SUCCESS) {
    notice_req_ = MPI_REQUEST_NULL;
  }
}

void HealthChannel::post_control_recv() noexcept {
  if (MPI_Irecv(&incoming_control_, sizeof(Control), MPI_BYTE, MPI_ANY_SOURCE, kControlTag, comm_,
                &control_req_) != MPI_SUCCESS) {
    control_req_ = MPI_REQUEST_NULL;
  }
}

void HealthChannel::poll() noexcept {
  for (;;) {
    int done = 0;
    if (notice_req_ == MPI_REQUEST_NULL || MPI_Test(&notice_req_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
    notices_.push_back(incoming_notice_);
    post_notice_recv();
  }
  for (;;) {
    int done = 0;
    if (control_req_ == MPI_REQUEST_NULL || MPI_Test(&control_req_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
    if (incoming_control_.type == kControlRequeue) requeue_ = true;
    if (incoming_control_.type == kControlStopAfter) stop_after_ = incoming_control_.step;
    post_control_recv();
  }
  // Retire finished sends so the queue stays short in a long run (any of them: a send to a
  // dead rank never finishes and must not hold back the others').
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    int done = 0;
    const bool finished = it->request == MPI_REQUEST_NULL ||
                          (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done);
    it = finished ? outgoing_.erase(it) : std::next(it);
  }
}

void HealthChannel::check() {
  poll();
  if (notices_raised_ < notices_.size()) throw PeerFailure(notices_[notices_raised_++]);
  if (const int signal = stop_signal()) throw Interrupted(signal);
  static_cast<void>(requeue_requested());
  if (stop_after_) throw StopRequested(*stop_after_);
}

void HealthChannel::post(int dest, Tag tag, const void* data, std::size_t size) noexcept {
  try {
    Outgoing out;
    out.bytes = std::make_unique<std::uint8_t[]>(size);
    out.dest = dest;
    std::memcpy(out.bytes.get(), data, size);
    if (MPI_Isend(out.bytes.get(), static_cast<int>(size), MPI_BYTE, dest, tag, comm_, &out.request) !=
        MPI_SUCCESS) {
      return;
    }
    outgoing_.push_back(std::move(out));
  } catch (...) {
    // Out of memory while reporting a failure: the deadline path still stops everyone.
  }
}

void HealthChannel::announce(const FailureNotice& notice) noexcept {
  for (int r = 0; r < topo_.world_size; ++r) {
    if (r != topo_.rank) post(r, kNoticeTag, &notice, sizeof(notice));
  }
}

bool HealthChannel::requeue_requested() noexcept {
  poll();
  if (requeue_signalled() && !requeue_forwarded_) {
    // The signal may reach only some ranks (a `kill` of one process): tell the others.
    requeue_forwarded_ = true;
    requeue_ = true;
    Control c;
    c.type = kControlRequeue;
    for (int r = 0; r < topo_.world_size; ++r) {
      if (r != topo_.rank) post(r, kControlTag, &c, sizeof(c));
    }
  }
  return requeue_;
}

void HealthChannel::send_stop_after(std::int64_t step, const std::vector<int>& ranks) noexcept {
  Control c;
  c.type = kControlStopAfter;
  c.step = step;
  for (const int r : ranks) {
    if (r != topo_.rank) post(r, kControlTag, &c, sizeof(c));
  }
}

std::optional<std::int64_t> HealthChannel::stop_after() noexcept {
  poll();
  return stop_after_;
}

void HealthChannel::barrier(const char* op, double timeout_s) {
  MPI_Request request = MPI_REQUEST_NULL;
  WD_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  const bool met = poll_until(std::chrono::duration<double>(timeout_s), [&] {
    int done = 0;
    WD_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    poll();
    mark(op);
    return false;
  });
  if (!met) {
    throw TimeoutError("timeout after " + std::to_string(timeout_s) + "s in " + op + " on rank " +
                           std::to_string(topo_.rank),
                       op, step(), {});
  }
}

bool HealthChannel::settle_sends(double timeout_s, const std::vector<bool>& to) noexcept {
  return poll_until(std::chrono::duration<double>(timeout_s), [&] {
    poll();
    const bool settled = std::none_of(outgoing_.begin(), outgoing_.end(), [&](const Outgoing& o) {
      return o.dest >= 0 && static_cast<std::size_t>(o.dest) < to.size() && to[static_cast<std::size_t>(o.dest)];
    });
    if (!settled) mark("failure protocol");
    return settled;
  });
}

}  // namespace wd::comm
