// How a student trains, one per objective: the distillation step (a target in every batch) or
// dmd's cycle of critic and generator updates. run_student calls the method and asks it about
// the weight average, the memory it trains beside the student and what a checkpoint keeps of it,
// never about the objective (docs/architecture.md#objectives).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "memory/memory_report.hpp"
#include "student/train_step.hpp"

namespace wd::student {

/// A method's share of one checkpoint: begun on every student at the same step (its gathers are
/// collective), written by the first student, its optimizer slices written by each.
class MethodCheckpoint {
 public:
  virtual ~MethodCheckpoint() = default;
  /// Whether each student writes a slice of it (write_slice).
  virtual bool sliced() const { return false; }
  /// Writes what the first student keeps into checkpoint directory `dir`.
  virtual void write(const std::string& dir, const std::string& config_ini) {}
  /// Writes this student's slice into `dir` (sliced() only).
  virtual void write_slice(const std::string& dir) {}
};

/// The student-side half of an objective (the teacher-side half is its target source).
class StudentMethod {
 public:
  virtual ~StudentMethod() = default;
  /// Step `step`'s update over its micro-batches, with the student's optimizer, reducer and
  /// objective in `context`; returns this rank's loss, the one the loop reduces and logs.
  virtual double step(StepContext& context, std::int64_t step, double lr, MicroBatches& batches) = 0;
  /// Whether the weight average (train.ema_decay) follows step `step`'s update.
  virtual bool averages_after(std::int64_t step) const { return true; }
  /// Seconds blocked on anything beyond the batch stream (dmd: the teacher's answers).
  virtual double wait_seconds() const { return 0; }
  /// The weights, gradients and optimizer state of what it trains beside the student.
  virtual memory::ModelMemory extra_memory() const { return {}; }
  /// Restores what its checkpoints keep beside the student's state (a resumed run).
  virtual void restore(const std::string& dir) {}
  /// Begins its share of the checkpoint after `steps_done` steps (collective over the students).
  virtual std::unique_ptr<MethodCheckpoint> begin_save(std::int64_t steps_done) {
    return std::make_unique<MethodCheckpoint>();
  }
};

/// The distillation step: every batch carries its target (train_step).
class DistillMethod final : public StudentMethod {
 public:
  double step(StepContext& context, std::int64_t step, double lr, MicroBatches& batches) override {
    return train_step(context, step, lr, batches);
  }
};

}  // namespace wd::student
