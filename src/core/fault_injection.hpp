// Fault injection, a testing aid (`--inject-fault KIND@ROLE:RANK:STEP[:POINT]`): a real
// out-of-memory, NaN, exception, hang, SIGKILL, SIGTERM or SIGUSR1 (requeue) on one rank at one
// training step, at its start or inside its gradient all-reduce, batch send or checkpoint save.
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
  /// Where in the step: kStep its start; kAllreduce (students) inside the gradient all-reduce,
  /// once this rank's part is posted; kSend (teachers) inside the send of the step's batch,
  /// once its sends are started; kSave (student 0, the writer) inside the checkpoint save of
  /// the step, once the files are in the temporary directory and before it is sealed; kServe
  /// (teachers, train.objective dmd) inside the real-score answer due after the step's batch,
  /// once the students' requests are received and before the answer is sent; kAllgather
  /// (students, student.shard optimizer) inside the all-gather of the updated parameter slices,
  /// once this rank's part is posted.
  enum class Point { kStep, kAllreduce, kSend, kSave, kServe, kAllgather };
  Kind kind = Kind::kThrow;
  Role role = Role::kStudent;
  int role_rank = 0;        ///< index among the ranks of `role` (teacher i, student i)
  std::int64_t step = 1;    ///< 1-based training step, as the logs count
  Point point = Point::kStep;

  /// Parses "oom@student:0:3" or "sigkill@student:1:3:allreduce"; empty text means no fault.
  /// Throws wd::ConfigError naming the option and the expected form otherwise, also for a
  /// point its role never reaches (allreduce and save are students', send teachers') and for
  /// nan anywhere but the step's start (it poisons the step's input).
  static std::optional<FaultSpec> parse(const std::string& text);
  std::string describe() const;
};

/// Performs the planned fault when this rank reaches its step and point. Faults go through the
/// real paths: oom asks the allocator for an impossible tensor, nan poisons a tensor the caller
/// computes with (detection is the production check), sigterm raises the signal the handler
/// catches, sigkill dies without a word, hang stops making progress without polling anything.
class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(std::optional<FaultSpec> spec, Role role, int role_rank);

  /// At point `point` of training step `step` (1-based): the oom, oom_huge, throw, hang,
  /// sigkill, sigterm and sigusr1 faults due there happen here (oom allocates on `device`).
  void at(FaultSpec::Point point, std::int64_t step, const c10::Device& device) const;
  /// at() the start of training step `step`.
  void at_step(std::int64_t step, const c10::Device& device) const {
    at(FaultSpec::Point::kStep, step, device);
  }
  /// True when this rank has a fault planned at `point` (the wiring installs hooks only then).
  bool planned(FaultSpec::Point point) const;
  /// True (and logged) when this rank's NaN fault is due at `step`; ask once per step.
  bool nan_due(std::int64_t step) const;

 private:
  bool due(FaultSpec::Point point, std::int64_t step) const;
  std::optional<FaultSpec> spec_;
  Role role_ = Role::kStudent;
  int role_rank_ = 0;
};

}  // namespace wd
