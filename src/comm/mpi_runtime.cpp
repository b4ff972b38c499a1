// MpiRuntime, the MPI error formatter behind WD_CHECK_MPI, and the polling waits with deadlines.
#include "comm/mpi_runtime.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "comm/health.hpp"

namespace wd::comm {

namespace {

using Clock = std::chrono::steady_clock;

/// World rank of this process, or -1 when MPI is not (or no longer) usable.
int current_world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) return -1;
  return rank;
}

std::string format_seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::string join_ranks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "(none named)";
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(ranks[i]);
  }
  return out;
}

[[noreturn]] void throw_timeout(const WaitInfo& info, std::chrono::duration<double> timeout,
                                int my_rank, const std::vector<int>& peers) {
  throw TimeoutError("timeout after " + format_seconds(timeout.count()) + "s waiting for " +
                         info.op + " of step " + std::to_string(info.step) + " (" +
                         std::to_string(info.bytes) + " bytes) on rank " + std::to_string(my_rank) +
                         "; waited for rank(s) " + join_ranks(peers),
                     info.op, info.step, peers);
}

/// Polls the health channel (when one is active) and marks this rank as busy in `op`; throws
/// PeerFailure or Interrupted.
void watch_health(const char* op) {
  if (HealthChannel* health = HealthChannel::active()) {
    health->mark(op);
    health->check();
  }
}

/// Polling cadence shared by both waits: a short spin keeps latency low when the peer is about
/// to deliver; after that the sleep doubles up to 1 ms so a waiting rank leaves the core to the
/// ranks that are computing (several ranks share few cores on a laptop or a CI runner).
class Backoff {
 public:
  explicit Backoff(std::chrono::duration<double> timeout)
      : start_(Clock::now()),
        deadline_(start_ + std::chrono::duration_cast<Clock::duration>(timeout)) {}
  bool expired() const { return Clock::now() >= deadline_; }
  void pause() {
    if (Clock::now() - start_ < kSpin) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }

 private:
  static constexpr std::chrono::microseconds kSpin{50};
  static constexpr std::chrono::microseconds kMaxSleep{1000};
  Clock::time_point start_, deadline_;
  std::chrono::microseconds sleep_{2};
};

}  // namespace

std::string mpi_error_message(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  std::string reason;
  if (MPI_Error_string(code, text, &len) == MPI_SUCCESS && len > 0) {
    reason.assign(text, static_cast<std::size_t>(len));
  } else {
    reason = "MPI error code " + std::to_string(code);
  }
  const int rank = current_world_rank();
  const char* base = std::strrchr(file, '/');
  return std::string(call) + " failed: " + reason + " (rank " +
         (rank >= 0 ? std::to_string(rank) : std::string("?")) + ", at " +
         (base ? base + 1 : file) + ":" + std::to_string(line) + ")";
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  WD_CHECK_MPI(MPI_Initialized(&initialized));
  if (initialized) {
    // Someone else (a test harness, an embedding program) owns MPI: use it, never finalize it.
    owner_ = false;
  } else {
    int provided = 0;
    WD_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      throw MpiError("MPI_Init_thread provided thread level " + std::to_string(provided) +
                     ", below MPI_THREAD_FUNNELED");
    }
  }
  // Failures come back as return codes, which WD_CHECK_MPI turns into exceptions that name the
  // call and rank, instead of MPI killing the job with its own terse message.
  WD_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  WD_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  WD_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Comm node = MPI_COMM_NULL;
  WD_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  const int rc_rank = MPI_Comm_rank(node, &local_rank_);
  const int rc_size = MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  WD_CHECK_MPI(rc_rank);
  WD_CHECK_MPI(rc_size);
}

MpiRuntime::MpiRuntime(MpiRuntime&& other) noexcept
    : owner_(other.owner_),
      rank_(other.rank_),
      size_(other.size_),
      local_rank_(other.local_rank_),
      local_size_(other.local_size_) {
  other.owner_ = false;
}

MpiRuntime::~MpiRuntime() {
  if (!owner_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiRuntime::abort(int code) {
  owner_ = false;
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever does.
}

void MpiRuntime::exit_without_finalize(int code) {
  owner_ = false;
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

bool cancel_and_settle(std::vector<MPI_Request*> requests) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return true;
  for (MPI_Request* r : requests) {
    if (*r == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (!done && *r != MPI_REQUEST_NULL) MPI_Cancel(r);
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  for (;;) {
    bool pending = false;
    for (MPI_Request* r : requests) {
      if (*r == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) *r = MPI_REQUEST_NULL;
      pending = pending || *r != MPI_REQUEST_NULL;
    }
    if (!pending) return true;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (MPI_Request* r : requests) {
    if (*r != MPI_REQUEST_NULL) MPI_Request_free(r);
  }
  return false;
}

void keep_until_exit(const torch::Tensor& buffer) noexcept {
  try {
    static_cast<void>(new torch::Tensor(buffer));  // deliberately never freed
  } catch (...) {
  }
}

void wait_with_deadline(MPI_Request& request, const WaitInfo& info,
                        std::chrono::duration<double> timeout, int my_rank) {
  Backoff backoff(timeout);
  for (;;) {
    int done = 0;
    WD_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    watch_health(info.op);
    if (backoff.expired()) throw_timeout(info, timeout, my_rank, info.peers);
    backoff.pause();
  }
}

void wait_all_with_deadline(std::vector<MPI_Request>& requests, const WaitInfo& info,
                            std::chrono::duration<double> timeout, int my_rank) {
  if (requests.empty()) return;
  Backoff backoff(timeout);
  const int count = static_cast<int>(requests.size());
  for (;;) {
    int done = 0;
    WD_CHECK_MPI(MPI_Testall(count, requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return;
    watch_health(info.op);
    if (backoff.expired()) {
      // With one peer per request, name only the peers still missing (like horovod's "missing
      // ranks"); MPI_Testsome retires the finished requests and leaves the rest as they are,
      // so the caller may still wait for or cancel them.
      std::vector<int> missing = info.peers;
      if (info.peer_per_request && info.peers.size() == requests.size()) {
        std::vector<int> indices(requests.size());
        int finished = 0;
        WD_CHECK_MPI(
            MPI_Testsome(count, requests.data(), &finished, indices.data(), MPI_STATUSES_IGNORE));
        missing.clear();
        for (std::size_t i = 0; i < requests.size(); ++i) {
          if (requests[i] != MPI_REQUEST_NULL) missing.push_back(info.peers[i]);
        }
        if (missing.empty()) return;  // everything finished at the last moment
      }
      throw_timeout(info, timeout, my_rank, missing);
    }
    backoff.pause();
  }
}

}  // namespace wd::comm
