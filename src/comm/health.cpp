// The health channel (notices, control messages, signals), the failure protocol and the watchdog.
#include "comm/health.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>

#include "comm/mpi_runtime.hpp"

namespace wd::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Tags on the channel's own communicator: nothing else is sent there.
constexpr int kNoticeTag = 1;
constexpr int kControlTag = 2;
constexpr int kReportTag = 3;
constexpr int kReleaseTag = 4;
constexpr int kControlRequeue = 1;
constexpr int kControlStopAfter = 2;
constexpr auto kPollPause = std::chrono::milliseconds(2);

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_requeue_signal = 0;
std::atomic<HealthChannel*> g_active{nullptr};

extern "C" void on_stop_signal(int signal) { g_stop_signal = signal; }
extern "C" void on_requeue_signal(int) { g_requeue_signal = 1; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

template <std::size_t N>
void copy_text(char (&dst)[N], const std::string& text) {
  const std::size_t n = std::min(text.size(), N - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

}  // namespace

std::vector<int> FailureNotice::lost_ranks() const {
  const int n = std::clamp(lost_count, 0, kMaxLost);
  return std::vector<int>(lost, lost + n);
}

FailureNotice notice_from_exception(std::exception_ptr failure, const Topology& topo,
                                    std::int64_t step, const std::string& op) {
  FailureNotice n;
  n.rank = topo.rank;
  n.role = static_cast<std::int32_t>(topo.role);
  n.step = step;
  n.kind = classify_failure(failure);
  std::string where = op;
  try {
    std::rethrow_exception(failure);
  } catch (const TimeoutError& e) {
    n.kind = FailureKind::kPeerLost;
    where = e.op();
    const auto& missing = e.missing();
    n.lost_count = static_cast<std::int32_t>(missing.size());
    for (std::size_t i = 0; i < missing.size() && i < FailureNotice::kMaxLost; ++i) n.lost[i] = missing[i];
  } catch (...) {
  }
  copy_text(n.op, where);
  copy_text(n.message, failure_message(failure));
  return n;
}

PeerFailure::PeerFailure(const FailureNotice& n)
    : KindedError(n.kind, "rank " + std::to_string(n.rank) + " (" + role_name(static_cast<Role>(n.role)) +
                              ") failed at step " + std::to_string(n.step) + ": " + n.message),
      notice_(n) {}

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

const FailureNotice* primary_failure(const std::vector<FailureNotice>& notices) {
  const FailureNotice* best = nullptr;
  // A rank that posted a notice was alive to post it. Timeouts can chain: a student waiting in
  // an all-reduce names its peer, which was itself waiting on the teacher that really went
  // silent, and both time out within the same second.
  std::set<int> posted;
  for (const auto& n : notices) {
    if (n.kind != FailureKind::kNone) posted.insert(n.rank);
  }
  const auto names_silent_rank = [&](const FailureNotice& n) {
    const auto lost = n.lost_ranks();
    return std::any_of(lost.begin(), lost.end(), [&](int r) { return !posted.count(r); });
  };
  const auto rank_of = [&](const FailureNotice& n) {
    // A rank that failed by itself outranks one that only saw a peer go silent, and a notice
    // naming a silent rank outranks one whose named ranks all spoke up.
    const int order = n.kind != FailureKind::kPeerLost ? 0 : names_silent_rank(n) ? 1 : 2;
    return std::make_tuple(order, n.step, n.rank);
  };
  for (const auto& n : notices) {
    if (n.kind == FailureKind::kNone) continue;
    if (!best || rank_of(n) < rank_of(*best)) best = &n;
  }
  return best;
}

HealthChannel::HealthChannel(MPI_Comm world, const Topology& topo) : topo_(topo) {
  WD_CHECK(g_active.load() == nullptr, "only one health channel may be active in a process");
  WD_CHECK_MPI(MPI_Comm_dup(world, &comm_));
  WD_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  beat_ns_ = now_ns();
  post_notice_recv();
  post_control_recv();
  g_active = this;
}

HealthChannel::~HealthChannel() {
  g_active = nullptr;
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

HealthChannel* HealthChannel::active() noexcept { return g_active.load(); }

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

void HealthChannel::send_bytes(int dest, int tag, const void* data, std::size_t size) noexcept {
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
    if (r != topo_.rank) send_bytes(r, kNoticeTag, &notice, sizeof(notice));
  }
}

bool HealthChannel::requeue_requested() noexcept {
  poll();
  if (g_requeue_signal && !requeue_forwarded_) {
    // The signal may reach only some ranks (a `kill` of one process): tell the others.
    requeue_forwarded_ = true;
    requeue_ = true;
    Control c;
    c.type = kControlRequeue;
    for (int r = 0; r < topo_.world_size; ++r) {
      if (r != topo_.rank) send_bytes(r, kControlTag, &c, sizeof(c));
    }
  }
  return requeue_;
}

void HealthChannel::send_stop_after(std::int64_t step, const std::vector<int>& ranks) noexcept {
  Control c;
  c.type = kControlStopAfter;
  c.step = step;
  for (const int r : ranks) {
    if (r != topo_.rank) send_bytes(r, kControlTag, &c, sizeof(c));
  }
}

std::optional<std::int64_t> HealthChannel::stop_after() noexcept {
  poll();
  return stop_after_;
}

void HealthChannel::barrier(const char* op, double timeout_s) {
  MPI_Request request = MPI_REQUEST_NULL;
  WD_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    int done = 0;
    WD_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    poll();
    mark(op);
    if (Clock::now() >= end) {
      throw TimeoutError("timeout after " + std::to_string(timeout_s) + "s in " + op + " on rank " +
                             std::to_string(topo_.rank),
                         op, step(), {});
    }
    std::this_thread::sleep_for(kPollPause);
  }
}

void HealthChannel::settle_sends(double timeout_s, const std::vector<bool>& to) noexcept {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (Clock::now() < deadline) {
    poll();
    const bool settled = std::none_of(outgoing_.begin(), outgoing_.end(), [&](const Outgoing& o) {
      return o.dest >= 0 && static_cast<std::size_t>(o.dest) < to.size() && to[static_cast<std::size_t>(o.dest)];
    });
    if (settled) return;
    mark("failure protocol");
    std::this_thread::sleep_for(kPollPause);
  }
}

FailureExchange HealthChannel::exchange_failure_reports(const FailureNotice& own, const FailureReport& mine,
                                                        double settle_s, double gather_s) noexcept {
  FailureExchange ex;
  try {
    if (own.kind != FailureKind::kNone) announce(own);
    // Let the notices of ranks that failed at about the same time arrive, so every rank
    // chooses the same reporter.
    const auto settle_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settle_s));
    while (Clock::now() < settle_end) {
      poll();
      mark("failure protocol");
      std::this_thread::sleep_for(kPollPause);
    }
    const auto collect = [&] {
      ex.notices = notices_;
      if (own.kind != FailureKind::kNone) ex.notices.push_back(own);
      // A rank that posted a notice is alive, whatever a timeout elsewhere said of it: an
      // all-reduce names every member it waited for, including one that was itself waiting
      // on the rank that really went silent.
      std::set<int> lost, alive{topo_.rank};
      for (const auto& n : ex.notices) alive.insert(n.rank);
      for (const auto& n : ex.notices) {
        for (const int r : n.lost_ranks()) {
          if (!alive.count(r) && r >= 0 && r < topo_.world_size) lost.insert(r);
        }
      }
      ex.lost.assign(lost.begin(), lost.end());
    };
    collect();
    ex.reporter = 0;
    while (std::find(ex.lost.begin(), ex.lost.end(), ex.reporter) != ex.lost.end()) ++ex.reporter;
    if (ex.reporter != topo_.rank) {
      send_bytes(ex.reporter, kReportTag, &mine, sizeof(mine));
      return ex;
    }

    // The reporter: a receive per rank; waits for those not named lost (a lost rank that
    // answers anyway is welcome).
    const int n = topo_.world_size;
    auto incoming = std::make_unique<FailureReport[]>(static_cast<std::size_t>(n));
    std::vector<MPI_Request> requests(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    ex.reports.assign(static_cast<std::size_t>(n), std::nullopt);
    ex.reports[static_cast<std::size_t>(topo_.rank)] = mine;
    for (int r = 0; r < n; ++r) {
      if (r == topo_.rank) continue;
      if (MPI_Irecv(&incoming[r], sizeof(FailureReport), MPI_BYTE, r, kReportTag, comm_, &requests[r]) != MPI_SUCCESS) {
        requests[r] = MPI_REQUEST_NULL;
      }
    }
    const auto gather_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gather_s));
    for (;;) {
      poll();
      collect();
      bool waiting = false;
      for (int r = 0; r < n; ++r) {
        if (requests[r] == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&requests[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          requests[r] = MPI_REQUEST_NULL;
          continue;
        }
        if (done) {
          ex.reports[r] = incoming[r];
        } else if (std::find(ex.lost.begin(), ex.lost.end(), r) == ex.lost.end()) {
          waiting = true;
        }
      }
      if (!waiting || Clock::now() >= gather_end) break;
      mark("failure protocol");
      std::this_thread::sleep_for(kPollPause);
    }
    std::vector<MPI_Request*> pending;
    for (auto& r : requests) pending.push_back(&r);
    if (!cancel_and_settle(pending)) static_cast<void>(incoming.release());  // MPI may still write there
  } catch (...) {
    // Never throws: the caller is already handling a failure.
  }
  return ex;
}

void HealthChannel::release(const FailureExchange& ex, int code, double grace_s) noexcept {
  const std::int32_t value = code;
  // Only the ranks that reported are waited for: a send to a silent (dead) rank, this one or an
  // earlier notice, would hold the reporter for the whole grace.
  std::vector<bool> reported(ex.reports.size(), false);
  for (std::size_t r = 0; r < ex.reports.size(); ++r) {
    if (static_cast<int>(r) == topo_.rank || !ex.reports[r]) continue;
    send_bytes(static_cast<int>(r), kReleaseTag, &value, sizeof(value));
    reported[r] = true;
  }
  settle_sends(grace_s, reported);
}

std::optional<int> HealthChannel::wait_for_release(int reporter, double timeout_s) noexcept {
  std::int32_t value = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Irecv(&value, 1, MPI_INT32_T, reporter, kReleaseTag, comm_, &request) != MPI_SUCCESS) return std::nullopt;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (Clock::now() < end) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return std::nullopt;
    if (done) return static_cast<int>(value);
    poll();
    mark("failure protocol");
    std::this_thread::sleep_for(kPollPause);
  }
  // No release in time: the reporter is gone. The caller exits at once; were the receive still
  // pending after the cancel, nothing else of this process runs to be hurt by it.
  static_cast<void>(cancel_and_settle({&request}));
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Watchdog

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
