// Fault injection, a testing aid (`--inject-fault KIND@ROLE:RANK:STEP`): a real out-of-memory,
// NaN, exception, hang, SIGKILL, SIGTERM or SIGUSR1 (requeue) on one rank at one training step.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/topology.hpp"

namespace wd {

/// One planned fault.
struct FaultSpec {
  /// kOom: a request just beyond the free memory; kOomHuge: one beyond any machine's (256 TiB,
  /// a wrong shape's kind of request).
  enum class Kind { kOom, kOomHuge, kNan, kThrow, kHang, kSigkill, kSigterm, kSigusr1 };
  Kind kind = Kind::kThrow;
  Role role = Role::kStudent;
  int role_rank = 0;        ///< index among the ranks of `role` (teacher i, student i)
  std::int64_t step = 1;    ///< 1-based training step, as the logs count

  /// Parses "oom@student:0:3"; empty text means no fault. Throws wd::ConfigError naming the
  /// option and the expected form otherwise.
  static std::optional<FaultSpec> parse(const std::string& text);
  std::string describe() const;
};

/// Performs the planned fault when this rank reaches its step. Faults go through the real
/// paths: oom asks the allocator for an impossible tensor, nan poisons a tensor the caller
/// computes with (detection is the production check), sigterm raises the signal the handler
/// catches, sigkill dies without a word, hang stops making progress without polling anything.
class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(std::optional<FaultSpec> spec, Role role, int role_rank);

  /// At the start of training step `step` (1-based): oom, throw, hang, sigkill and sigterm
  /// faults due now happen here (oom allocates on `device`).
  void at_step(std::int64_t step, const c10::Device& device) const;
  /// True (and logged) when this rank's NaN fault is due at `step`; ask once per step.
  bool nan_due(std::int64_t step) const;

 private:
  bool due(std::int64_t step) const;
  std::optional<FaultSpec> spec_;
  Role role_ = Role::kStudent;
  int role_rank_ = 0;
};

}  // namespace wd
