// Diagnostics: what a student rank reports beside its training step (the log window, evaluation
// on held-out batches, the sampling probe, the memory report), each deciding when it is due.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "comm/message_spec.hpp"
#include "metrics/metrics_writer.hpp"
#include "memory/memory_report.hpp"

namespace wd::student {

struct StudentJob;

/// Sums `values` over the student group in place (with deadline; `op` names the wait).
void sum_over_students(const StudentJob& job, std::vector<double>& values, std::int64_t step, const char* op);

/// The student loop's reports. Steps are 0-based here as in the loop; what is logged and
/// written counts steps done (step + 1). Evaluation is collective: every student calls the
/// same methods at the same steps.
class Diagnostics {
 public:
  /// Receives the held-out batches (the stream's first plan.eval_messages) and keeps copies.
  /// job.optimizer is read for the memory reports.
  explicit Diagnostics(StudentJob& job);

  /// Evaluates the untrained student; the relative MSE, or -1 without held-out batches.
  double before_training();
  /// After optimizer step `step` with the group's mean `loss` at learning rate `lr`: the log
  /// line, evaluation, sampling probe and memory report that are due. `stop`: training ends
  /// after this step (a requeue).
  void after_step(std::int64_t step, double lr, double loss, bool stop);
  /// Evaluates the trained student; the relative MSE, or -1 without held-out batches.
  double after_training();
  /// Records the weights', gradients' and optimizer state's bytes in job.tracked_memory (if
  /// set), so a failure report can name them after the stack unwound.
  void track_memory();

  /// Whether step `step` closes a log window.
  bool log_due(std::int64_t step, bool stop) const;
  /// Whether the held-out batches are evaluated after step `step`.
  bool eval_due(std::int64_t step, bool stop) const;
  /// Whether the leader samples the student after step `step`.
  bool probe_due(std::int64_t step) const;

 private:
  using Clock = std::chrono::steady_clock;

  /// Relative MSE Σ‖student − teacher‖² / Σ‖teacher‖² over every student's held-out batches;
  /// for train.objective trajectory also per student interval (by each sample's t), logged and
  /// written to metrics.jsonl as `rel_mse_interval` {"0": ..., "k-1": ...}.
  double evaluate(std::int64_t step);
  /// evaluate(), logged as "eval <when>: relative MSE <value><note>" (then the intervals) and
  /// appended to the metrics with `extra`.
  double report_eval(std::int64_t step, const std::string& when, const std::string& note = "",
                     nlohmann::json extra = nlohmann::json::object());
  /// One log line and a metrics line for the window that ends at `step`; opens the next.
  void log_window(std::int64_t step, double lr, double loss);
  memory::ModelMemory model_memory() const;

  StudentJob& job_;
  metrics::MetricsWriter metrics_;  ///< metrics.jsonl and TensorBoard (the leader's; a no-op elsewhere)
  std::vector<comm::TensorDict> eval_set_;
  double first_eval_ = -1;
  std::vector<double> interval_sigmas_;  ///< trajectory: the student's k + 1 σ (empty otherwise)
  std::vector<double> interval_rel_mse_;  ///< the last evaluation's, per interval (-1: none held out)
  int group_size_ = 1;  ///< batches per step: the students, or their sequence-parallel groups
  Clock::time_point window_start_;
  double window_wait_ = 0;  ///< the transport's wait seconds when the window opened
};

}  // namespace wd::student
