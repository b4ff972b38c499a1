// Diagnostics: the student's log window, evaluations, sampling probes and memory reports.
#include "student/diagnostics.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "data/flow_sampler.hpp"
#include "student/sample_probe.hpp"
#include "student/student_loop.hpp"
#include "student/trajectory_rollout.hpp"

namespace wd::student {

namespace {

/// One line per sampling probe (loud when the student collapsed) and a `sample_step` line in
/// metrics.jsonl.
void report_probe(const SampleProbe& p, std::int64_t step, const TrainConfig& train, metrics::MetricsWriter& metrics) {
  if (p.collapsed()) {
    spdlog::error("*** COLLAPSED STUDENT at step {}: sampled per-channel std below {} x the teacher's "
                  "(final latents: channels [{}]; added to the noise: channels [{}]) ***",
                  step, train.collapse_ratio, fmt::join(p.flat_channels, ","), fmt::join(p.static_channels, ","));
  } else {
    spdlog::info("sample probe at step {} ({} {} steps, shift {}): smallest std ratio to the teacher {:.3f} (final), "
                 "{:.3f} (added to the noise)", step, train.sample_steps, train.sample_solver == Solver::kEuler ? "Euler" : "UniPC",
                 train.sample_shift, p.final_ratio, p.moved_ratio);
  }
  metrics.append({{"sample_step", step}, {"std_ratio", p.final_ratio}, {"moved_std_ratio", p.moved_ratio},
                  {"collapsed", p.collapsed()}});
}

}  // namespace

void sum_over_students(const StudentJob& job, std::vector<double>& values, std::int64_t step, const char* op) {
  // MPI may still write into the buffer after an abandoned wait (a peer failed): it is a
  // tensor, kept alive until exit in that case.
  auto buffer = torch::tensor(values, torch::kDouble);
  MPI_Request req;
  WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr<double>(), static_cast<int>(values.size()),
                              MPI_DOUBLE, MPI_SUM, job.students, &req));
  try {
    comm::wait_with_deadline(req, {op, step, values.size() * sizeof(double), job.peers},
                             std::chrono::duration<double>(job.timeout_s), job.world_rank, job.health);
  } catch (...) {
    comm::keep_until_exit(buffer);
    throw;
  }
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = buffer[static_cast<std::int64_t>(i)].item<double>();
}

Diagnostics::Diagnostics(StudentJob& job)
    : job_(job), metrics_(job.leader ? job.metrics_path : "") {
  MPI_Comm_size(job_.students, &group_size_);
  group_size_ /= std::max(1, job_.sequence_parallel);  // a sequence-parallel group trains one batch
  // Held-out batches arrive first; kept (copied out of the ring) for every evaluation.
  for (std::int64_t e = 0; e < job_.plan.eval_messages; ++e) {
    comm::TensorDict copy;
    for (const auto& [name, t] : job_.transport.recv(e).tensors) copy[name] = t.clone();
    eval_set_.push_back(std::move(copy));
    job_.transport.release(e);
  }
  if (job_.train.interval_metrics) {  // student_train(): sample_steps = student.steps, sample_shift = teacher.shift
    interval_sigmas_ = data::sampling_sigmas(job_.train.sample_steps, job_.train.sample_shift);
  }
}

double Diagnostics::report_eval(std::int64_t step, const std::string& when, const std::string& note,
                                nlohmann::json extra) {
  const double rel = evaluate(step);
  std::string intervals;
  for (std::size_t i = 0; i < interval_rel_mse_.size(); ++i) {
    // -1: no held-out sample in the interval (student.expert trains some of them only).
    const auto value = interval_rel_mse_[i] < 0 ? std::string("-") : fmt::format("{:.5f}", interval_rel_mse_[i]);
    intervals += (i ? ", " : " (per interval: ") + value;
  }
  if (!intervals.empty()) intervals += ")";
  if (job_.leader) spdlog::info("eval {}: relative MSE {:.5f}{}{}", when, rel, note, intervals);
  nlohmann::json line{{"eval_step", step}, {"rel_mse", rel}};
  // An object keyed by interval (TensorBoard: eval/rel_mse_interval/<i>).
  for (std::size_t i = 0; i < interval_rel_mse_.size(); ++i) {
    if (interval_rel_mse_[i] >= 0) line["rel_mse_interval"][std::to_string(i)] = interval_rel_mse_[i];
  }
  for (const auto& [key, value] : extra.items()) line[key] = value;
  metrics_.append(line);
  return rel;
}

double Diagnostics::before_training() {
  const auto first = job_.plan.first_step;
  if (!eval_set_.empty()) {
    first_eval_ = report_eval(first, fmt::format("at step {}", first));
  }
  window_start_ = Clock::now();
  window_wait_ = job_.transport.wait_seconds();
  return first_eval_;
}

bool Diagnostics::log_due(std::int64_t step, bool stop) const {
  return (step + 1) % job_.train.log_every == 0 || step + 1 == job_.plan.train_steps || stop;
}

bool Diagnostics::eval_due(std::int64_t step, bool stop) const {
  // The last step is followed by after_training's evaluation; a stop leaves at once.
  return job_.train.eval_every > 0 && (step + 1) % job_.train.eval_every == 0 && !eval_set_.empty() &&
         step + 1 < job_.plan.train_steps && !stop;
}

bool Diagnostics::probe_due(std::int64_t step) const {
  return job_.leader && job_.train.sample_every > 0 && (step + 1) % job_.train.sample_every == 0 &&
         !eval_set_.empty();
}

void Diagnostics::after_step(std::int64_t step, double lr, double loss, bool stop) {
  if (log_due(step, stop)) log_window(step, lr, loss);
  if (eval_due(step, stop)) {
    report_eval(step + 1, fmt::format("at step {}", step + 1));
  }
  if (probe_due(step)) {
    report_probe(probe_sampling(job_.parts, eval_set_.front(), job_.train), step + 1, job_.train, metrics_);
  }
  if (job_.memory) {
    job_.memory->after_step(step + 1, job_.parts.trainable().front().device(), [this] { return model_memory(); });
  }
}

double Diagnostics::after_training() {
  if (eval_set_.empty()) return -1;
  const auto last = job_.plan.train_steps;
  return report_eval(last, "after training", fmt::format(" (at step {}: {:.5f})", job_.plan.first_step, first_eval_),
                     {{"rel_mse_before", first_eval_}});
}

void Diagnostics::track_memory() {
  if (job_.tracked_memory) *job_.tracked_memory = model_memory();
}

double Diagnostics::evaluate(std::int64_t step) {
  torch::NoGradGuard no_grad;
  const auto k = interval_sigmas_.empty() ? 0 : interval_sigmas_.size() - 1;
  std::vector<double> sums(2 + 2 * k, 0.0);  // error, norm; then per interval
  for (const auto& b : eval_set_) {
    const auto& target = b.at("teacher_out");
    // A clean image frame (ti2v's image mode) is given, not predicted: it counts in neither sum.
    const auto w = job_.parts.frame_weights(b);
    const auto weighed = [&w](const torch::Tensor& x) { return w.defined() ? x * w.to(x.scalar_type()) : x; };
    const auto err = weighed((job_.parts.predict(b) - target).pow(2)).flatten(1).sum(1).to(torch::kDouble).cpu();
    const auto norm = weighed(target.pow(2)).flatten(1).sum(1).to(torch::kDouble).cpu();
    sums[0] += err.sum().item<double>();
    sums[1] += norm.sum().item<double>();
    if (k == 0) continue;
    const auto nearest = nearest_interval(b.at("t"), interval_sigmas_);
    const auto by_interval = torch::zeros({2, static_cast<std::int64_t>(k)}, torch::kDouble);
    by_interval[0].index_add_(0, nearest, err);
    by_interval[1].index_add_(0, nearest, norm);
    const auto acc = by_interval.accessor<double, 2>();
    for (std::size_t i = 0; i < k; ++i) {
      sums[2 + 2 * i] += acc[0][i];
      sums[3 + 2 * i] += acc[1][i];
    }
  }
  sum_over_students(job_, sums, step, "allreduce eval");
  interval_rel_mse_.assign(k, -1.0);
  for (std::size_t i = 0; i < k; ++i) {
    if (sums[3 + 2 * i] > 0) interval_rel_mse_[i] = sums[2 + 2 * i] / sums[3 + 2 * i];
  }
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

void Diagnostics::log_window(std::int64_t step, double lr, double loss) {
  if (job_.leader) {
    const auto first = job_.plan.first_step, last = job_.plan.train_steps;
    const double secs = std::chrono::duration<double>(Clock::now() - window_start_).count();
    const double waited = job_.transport.wait_seconds() - window_wait_;
    const auto steps_in_window = (step - first) % job_.train.log_every + 1;
    const double samples_s =
        steps_in_window * job_.plan.micro_batches * job_.plan.batch_per_student * group_size_ / secs;
    const double eta = secs / steps_in_window * (last - step - 1);
    spdlog::info("step {}/{} loss {:.5f} lr {:.2e} {:.1f} samples/s wait {:.0f}% ETA {:.0f} s", step + 1, last,
                 loss, lr, samples_s, 100 * waited / secs, eta);
    metrics_.append({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"samples_per_s", samples_s},
                     {"wait_fraction", waited / secs}});
  }
  window_start_ = Clock::now();
  window_wait_ = job_.transport.wait_seconds();
}

memory::ModelMemory Diagnostics::model_memory() const {
  auto m = student::model_memory(job_.parts.trainable(), job_.optimizer.shard(), job_.optimizer.adamw());
  if (job_.method) {  // what the method trains beside the student (dmd: the critic)
    const auto extra = job_.method->extra_memory();
    m.weights_bytes += extra.weights_bytes;
    m.grads_bytes += extra.grads_bytes;
    m.optimizer_state_bytes += extra.optimizer_state_bytes;
  }
  return m;
}

}  // namespace wd::student
