// exchange_failure_reports, release_reporters, wait_for_release: the failure protocol.
#include "comm/failure_exchange.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include "comm/mpi_runtime.hpp"
#include "comm/wait.hpp"

namespace wd::comm {

namespace {

constexpr const char* kProtocolOp = "failure protocol";

std::chrono::duration<double> protocol_seconds(double s) { return std::chrono::duration<double>(s); }

/// Every notice known (the channel's and this rank's own) and the ranks they name as lost.
/// A rank that posted a notice is alive, whatever a timeout elsewhere said of it: an
/// all-reduce names every member it waited for, including one that was itself waiting on the
/// rank that really went silent.
void collect_notices(const HealthChannel& health, const FailureNotice& own, FailureExchange& ex) {
  const Topology& topo = health.topology();
  ex.notices = health.notices();
  if (own.kind != FailureKind::kNone) ex.notices.push_back(own);
  std::set<int> lost, alive{topo.rank};
  for (const auto& n : ex.notices) alive.insert(n.rank);
  for (const auto& n : ex.notices) {
    for (const int r : n.lost_ranks()) {
      if (!alive.count(r) && r >= 0 && r < topo.world_size) lost.insert(r);
    }
  }
  ex.lost.assign(lost.begin(), lost.end());
}

bool named_lost(const FailureExchange& ex, int rank) {
  return std::find(ex.lost.begin(), ex.lost.end(), rank) != ex.lost.end();
}

/// The reporter's side: a receive per rank; waits for those not named lost (a lost rank that
/// answers anyway is welcome).
void gather_reports(HealthChannel& health, const FailureNotice& own, const FailureReport& mine,
                    double gather_s, FailureExchange& ex) {
  const int me = health.topology().rank;
  const int n = health.topology().world_size;
  auto incoming = std::make_unique<FailureReport[]>(static_cast<std::size_t>(n));
  std::vector<MPI_Request> requests(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
  ex.reports.assign(static_cast<std::size_t>(n), std::nullopt);
  ex.reports[static_cast<std::size_t>(me)] = mine;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    if (MPI_Irecv(&incoming[r], sizeof(FailureReport), MPI_BYTE, r, HealthChannel::kReportTag,
                  health.comm(), &requests[r]) != MPI_SUCCESS) {
      requests[r] = MPI_REQUEST_NULL;
    }
  }
  poll_until(protocol_seconds(gather_s), [&] {
    health.poll();
    collect_notices(health, own, ex);
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
      } else if (!named_lost(ex, r)) {
        waiting = true;
      }
    }
    if (waiting) health.mark(kProtocolOp);
    return !waiting;
  });
  std::vector<MPI_Request*> pending;
  for (auto& r : requests) pending.push_back(&r);
  if (!cancel_and_settle(pending)) static_cast<void>(incoming.release());  // MPI may still write there
}

}  // namespace

FailureExchange exchange_failure_reports(HealthChannel& health, const FailureNotice& own,
                                         const FailureReport& mine, double settle_s,
                                         double gather_s) noexcept {
  FailureExchange ex;
  try {
    if (own.kind != FailureKind::kNone) health.announce(own);
    // Let the notices of ranks that failed at about the same time arrive, so every rank
    // chooses the same reporter.
    poll_until(protocol_seconds(settle_s), [&] {
      health.poll();
      health.mark(kProtocolOp);
      return false;
    });
    collect_notices(health, own, ex);
    ex.reporter = 0;
    while (named_lost(ex, ex.reporter)) ++ex.reporter;
    if (ex.reporter != health.topology().rank) {
      health.post(ex.reporter, HealthChannel::kReportTag, &mine, sizeof(mine));
      return ex;
    }
    gather_reports(health, own, mine, gather_s, ex);
  } catch (...) {
    // Never throws: the caller is already handling a failure.
  }
  return ex;
}

void release_reporters(HealthChannel& health, const FailureExchange& ex, int code, double grace_s) noexcept {
  const std::int32_t value = code;
  // Only the ranks that reported are waited for: a send to a silent (dead) rank, this one or an
  // earlier notice, would hold the reporter for the whole grace.
  std::vector<bool> reported(ex.reports.size(), false);
  for (std::size_t r = 0; r < ex.reports.size(); ++r) {
    if (static_cast<int>(r) == health.topology().rank || !ex.reports[r]) continue;
    health.post(static_cast<int>(r), HealthChannel::kReleaseTag, &value, sizeof(value));
    reported[r] = true;
  }
  static_cast<void>(health.settle_sends(grace_s, reported));
}

std::optional<int> wait_for_release(HealthChannel& health, int reporter, double timeout_s) noexcept {
  std::int32_t value = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Irecv(&value, 1, MPI_INT32_T, reporter, HealthChannel::kReleaseTag, health.comm(), &request) !=
      MPI_SUCCESS) {
    return std::nullopt;
  }
  bool failed = false;
  const bool released = poll_until(protocol_seconds(timeout_s), [&] {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      failed = true;
      return true;
    }
    if (done) return true;
    health.poll();
    health.mark(kProtocolOp);
    return false;
  });
  if (failed) return std::nullopt;
  if (released) return static_cast<int>(value);
  // No release in time: the reporter is gone. The caller exits at once; were the receive still
  // pending after the cancel, nothing else of this process runs to be hurt by it.
  static_cast<void>(cancel_and_settle({&request}));
  return std::nullopt;
}

}  // namespace wd::comm
