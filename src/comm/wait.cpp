// The pieces every deadline wait shares: timeout messages, the health poll and the backoff.
#include "comm/wait.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "comm/health_channel.hpp"

namespace wd::comm {

namespace {

// A wait yields for its first millisecond, then sleeps 2, 4, ... up to 1000 us between polls.
// A 50 us spin let a tiny message's step (a few tens of us of work) wait for a sleeping peer:
// 0.08-0.18 ms a step against 0.043 with this spin (bench/results/transport.md); a wait that
// lasts seconds still costs well under 5% of a core (test_idle_wait).
constexpr std::chrono::microseconds kSpin{1000};
constexpr std::chrono::microseconds kMaxSleep{1000};

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

}  // namespace

void throw_timeout(const WaitInfo& info, std::chrono::duration<double> timeout, int my_rank,
                   const std::vector<int>& peers) {
  throw TimeoutError("timeout after " + format_seconds(timeout.count()) + "s waiting for " +
                         info.op + " of step " + std::to_string(info.step) + " (" +
                         std::to_string(info.bytes) + " bytes) on rank " + std::to_string(my_rank) +
                         "; waited for rank(s) " + join_ranks(peers),
                     info.op, info.step, peers);
}

void watch_health(HealthChannel* health, const char* op) {
  if (health == nullptr) return;
  health->mark(op);
  health->check();
}

void run_fault_hook(const FaultHook& hook, HealthChannel* health, const char* op, std::int64_t step) {
  if (!hook) return;
  if (health != nullptr) health->mark(op);
  hook(step);
}

int current_world_rank() noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) return -1;
  return rank;
}

std::string call_site(const char* file, int line) {
  const int rank = current_world_rank();
  const char* base = std::strrchr(file, '/');
  return "(rank " + (rank >= 0 ? std::to_string(rank) : std::string("?")) + ", at " + (base ? base + 1 : file) +
         ":" + std::to_string(line) + ")";
}

Backoff::Backoff(std::chrono::duration<double> timeout)
    : start_(Clock::now()), deadline_(start_ + std::chrono::duration_cast<Clock::duration>(timeout)) {}

void Backoff::pause() {
  if (Clock::now() - start_ < kSpin) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, kMaxSleep);
}

}  // namespace wd::comm
