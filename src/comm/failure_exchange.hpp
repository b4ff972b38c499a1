// The failure protocol: after a failure every rank's report reaches one rank over the health
// channel, and that rank's exit code reaches the others, without any blocking collective.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "comm/failure_notice.hpp"
#include "comm/health_channel.hpp"

namespace wd::comm {

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

/// Run by every rank that caught a failure (after the stack unwound, with the notice of its
/// own failure, or kind kNone when it stopped because of another's): announces its own failure
/// on `health`, collects notices for `settle_s`, picks the reporter (the lowest rank nobody
/// reported lost), and sends `mine` there; the reporter gathers every rank's report for up to
/// `gather_s`. Never blocks without a deadline and never throws.
FailureExchange exchange_failure_reports(HealthChannel& health, const FailureNotice& own,
                                         const FailureReport& mine, double settle_s,
                                         double gather_s) noexcept;

/// Reporter: tells every rank that reported the job's exit code (waits at most grace_s).
void release_reporters(HealthChannel& health, const FailureExchange& exchange, int code,
                       double grace_s) noexcept;

/// Others: waits (at most timeout_s) for the reporter's exit code.
std::optional<int> wait_for_release(HealthChannel& health, int reporter, double timeout_s) noexcept;

}  // namespace wd::comm
