// FailureNotice: one rank's account of a failure as sent between ranks, the exception a peer's
// notice raises, and the choice of the failure that caused the others.
#pragma once

#include <cstdint>
#include <exception>
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

/// The failure that caused the others: the first notice whose kind is not kPeerLost (lowest
/// step, then lowest rank), else the first kPeerLost one naming a rank that posted no notice
/// itself, else the first kPeerLost one. Null when `notices` is empty.
const FailureNotice* primary_failure(const std::vector<FailureNotice>& notices);

}  // namespace wd::comm
