// FailureNotice from an exception, PeerFailure, and primary_failure.
#include "comm/failure_notice.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

#include "comm/wait.hpp"

namespace wd::comm {

namespace {

/// Copies `text` into `dst`, truncated and NUL-terminated (the fixed text fields sent as bytes).
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

}  // namespace wd::comm
