// The training failure handler: notice, reports, diagnosis, release, exit.
#include "job/failure_handler.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <fstream>

namespace wd::job {

namespace {

/// Seconds the protocol lets notices of near-simultaneous failures arrive before choosing the
/// reporter.
constexpr double kSettleSeconds = 1.0;

std::string describe_notice(const comm::FailureNotice& n) {
  std::string text = "rank " + std::to_string(n.rank) + " (" + role_name(static_cast<Role>(n.role)) + ") " +
                     failure_kind_name(n.kind) + " at step " + std::to_string(n.step) + " in " + n.op_text();
  if (!n.lost_ranks().empty()) {
    std::string lost;
    for (const int r : n.lost_ranks()) lost += (lost.empty() ? "" : ",") + std::to_string(r);
    text += " (no answer from rank(s) " + lost + ")";
  }
  return text;
}

memory::DiagnosisInput make_diagnosis(const comm::FailureExchange& ex, const comm::FailureNotice& primary,
                                      const FailureSetup& setup) {
  memory::DiagnosisInput in;
  in.kind = primary.kind;
  in.failed_rank = primary.rank;
  in.failed_role = static_cast<Role>(primary.role);
  in.step = primary.step;
  in.op = primary.op_text();
  in.message = primary.message_text();
  in.lost = ex.lost;
  if (primary.kind == FailureKind::kPeerLost && !primary.lost_ranks().empty()) {
    // The rank that went silent is the one to name (the first that did not speak up in the
    // exchange); the one that noticed says where.
    const auto named = primary.lost_ranks();
    const auto silent = std::find_if(named.begin(), named.end(), [&](int r) {
      return std::find(ex.lost.begin(), ex.lost.end(), r) != ex.lost.end();
    });
    in.failed_rank = silent != named.end() ? *silent : named.front();
    in.failed_role = setup.role_of(in.failed_rank);
    in.op = "no answer to rank " + std::to_string(primary.rank) + "'s " + primary.op_text();
  }
  in.context = setup.remedies;
  for (const auto& n : ex.notices) {
    if (&n == &primary || std::memcmp(&n, &primary, sizeof(n)) == 0) continue;
    in.other_notices.push_back(describe_notice(n));
  }
  for (std::size_t r = 0; r < ex.reports.size(); ++r) {
    memory::RankFailureState state;
    state.rank = static_cast<int>(r);
    if (const auto& report = ex.reports[r]) {
      state.answered = true;
      state.role = static_cast<Role>(report->role);
      state.own = report->own.kind;
      state.step = report->step;
      state.op = report->op;
      if (report->payload_bytes == sizeof(memory::MemoryReport)) {
        std::memcpy(&state.memory, report->payload, sizeof(memory::MemoryReport));
      }
    } else {
      state.role = setup.role_of(state.rank);
    }
    in.ranks.push_back(state);
  }
  return in;
}

}  // namespace

void handle_training_failure(std::exception_ptr failure, comm::HealthChannel& health, comm::MpiRuntime& mpi,
                             const FailureSetup& setup, const memory::MemoryReport& memory) {
  const Topology& topo = health.topology();
  comm::FailureNotice own;  // kind kNone: this rank only stopped because another failed
  own.rank = topo.rank;
  own.role = static_cast<std::int32_t>(topo.role);
  own.step = health.step();
  bool peer = false;
  try {
    std::rethrow_exception(failure);
  } catch (const comm::PeerFailure& e) {
    peer = true;
    spdlog::warn("stopping at step {} in {}: {}", health.step(), health.op(), e.what());
  } catch (...) {
  }
  if (!peer) {
    own = comm::notice_from_exception(failure, topo, health.step(), health.op());
    spdlog::error("failed at step {} in {}: {}: {}", own.step, own.op_text(), failure_kind_name(own.kind),
                  own.message_text());
  }

  comm::FailureReport mine;
  mine.own = own;
  mine.rank = topo.rank;
  mine.role = static_cast<std::int32_t>(topo.role);
  mine.step = health.step();
  std::strncpy(mine.op, health.op(), sizeof(mine.op) - 1);
  static_assert(sizeof(memory::MemoryReport) <= comm::FailureReport::kPayloadBytes, "memory report fits");
  mine.payload_bytes = sizeof(memory::MemoryReport);
  std::memcpy(mine.payload, &memory, sizeof(memory::MemoryReport));

  const double gather_s = std::clamp(setup.timeout_s, 5.0, 60.0);
  const auto ex = comm::exchange_failure_reports(health, own, mine, kSettleSeconds, gather_s);
  const comm::FailureNotice* primary = comm::primary_failure(ex.notices);
  int code = exit_code(primary ? primary->kind : FailureKind::kError);
  if (ex.reporter == topo.rank) {
    comm::FailureNotice fallback = own;
    if (!primary) {
      fallback.kind = FailureKind::kError;
      std::strncpy(fallback.message, "a rank stopped without a notice", sizeof(fallback.message) - 1);
    }
    const auto text = memory::format_diagnosis(make_diagnosis(ex, primary ? *primary : fallback, setup));
    spdlog::error("\n{}", text);
    if (!setup.diagnosis_path.empty()) std::ofstream(setup.diagnosis_path) << text << "\n";
    comm::release_reporters(health, ex, code, 2.0);
  } else {
    code = comm::wait_for_release(health, ex.reporter, gather_s + 10.0).value_or(code);
  }
  spdlog::info("exiting with code {} ({})", code, failure_kind_name(static_cast<FailureKind>(code)));
  mpi.exit_without_finalize(code);
}

}  // namespace wd::job
