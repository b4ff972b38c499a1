// Student loop: one screen of training step, with diagnostics kept apart.
#include "student/student_loop.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "core/torch_compat.hpp"
#include "core/metrics_writer.hpp"
#include "student/sample_probe.hpp"

namespace wd::student {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Sums `values` over the student group (with deadline). The reduction works on a tensor that
/// is kept alive if the wait is abandoned (a peer failed): MPI may still write into it.
void sum_over_students(StudentJob& job, std::vector<double>& values, std::int64_t step, const char* op) {
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

/// Relative MSE Σ‖student − teacher‖² / Σ‖teacher‖² over every student's held-out batches.
double evaluate(StudentJob& job, const std::vector<comm::TensorDict>& eval_set, std::int64_t step) {
  torch::NoGradGuard no_grad;
  std::vector<double> sums{0.0, 0.0};
  for (const auto& b : eval_set) {
    const auto& target = b.at("teacher_out");
    sums[0] += (job.parts.predict(b) - target).pow(2).sum().item<double>();
    sums[1] += target.pow(2).sum().item<double>();
  }
  sum_over_students(job, sums, step, "allreduce eval");
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

/// One line per sampling probe (loud when the student collapsed) and a `sample_step` line in
/// metrics.jsonl.
void report_probe(const SampleProbe& p, std::int64_t step, const TrainConfig& train, MetricsWriter& metrics) {
  if (p.collapsed()) {
    spdlog::error("*** COLLAPSED STUDENT at step {}: sampled per-channel std below {} x the teacher's "
                  "(final latents: channels [{}]; added to the noise: channels [{}]) ***",
                  step, train.collapse_ratio, fmt::join(p.flat_channels, ","), fmt::join(p.static_channels, ","));
  } else {
    spdlog::info("sample probe at step {}: smallest std ratio to the teacher {:.3f} (final), {:.3f} (added "
                 "to the noise)", step, p.final_ratio, p.moved_ratio);
  }
  metrics.append({{"sample_step", step}, {"std_ratio", p.final_ratio}, {"moved_std_ratio", p.moved_ratio},
                  {"collapsed", p.collapsed()}});
}

}  // namespace

torch::Tensor distill_loss(const torch::Tensor& prediction, const torch::Tensor& teacher_out) {
  const auto& target = teacher_out.scalar_type() == prediction.scalar_type()
                           ? teacher_out
                           : teacher_out.to(prediction.scalar_type());
  return torch::mse_loss(prediction, target);
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    norms.push_back(p.grad().norm(2.0));
  }
  if (grads.empty()) return torch::zeros({});
  // The operations of LibTorch's clip_grad_norm_, in its order (the same bits), without its
  // closing .item(): the clamped factor multiplies on the device; a factor of 1 changes nothing.
  const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  const auto factor = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (auto& g : grads) g.mul_(factor);
  return total;
}

StudentStats run_student(StudentJob& job) {
  StudentStats stats;
  const auto t0 = Clock::now();
  const auto& params = job.parts.trainable();  // fixed since start-up: nothing is created later
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(job.train.lr)
                                            .betas({job.train.beta1, job.train.beta2})
                                            .weight_decay(job.train.weight_decay));
  if (job.restore) job.restore(optimizer);
  MetricsWriter metrics(job.leader ? job.metrics_path : "");  // metrics.jsonl and TensorBoard
  const auto first = job.plan.first_step, last = job.plan.train_steps;

  // Held-out batches arrive first; kept (copied out of the ring) for every evaluation.
  std::vector<comm::TensorDict> eval_set;
  for (std::int64_t e = 0; e < job.plan.eval_messages; ++e) {
    comm::TensorDict copy;
    for (const auto& [name, t] : job.transport.recv(e).tensors) copy[name] = t.clone();
    eval_set.push_back(std::move(copy));
    job.transport.release(e);
  }
  if (!eval_set.empty()) {
    stats.first_eval_rel_mse = evaluate(job, eval_set, first);
    if (job.leader) spdlog::info("eval at step {}: relative MSE {:.5f}", first, stats.first_eval_rel_mse);
    metrics.append({{"eval_step", first}, {"rel_mse", stats.first_eval_rel_mse}});
  }

  const auto device = params.front().device();
  const auto model_memory = [&] {
    return memory::ModelMemory{memory::tensor_bytes(params), memory::grad_bytes(params),
                               memory::optimizer_state_bytes(optimizer)};
  };
  auto window_start = Clock::now();
  double window_wait = job.transport.wait_seconds();
  const double micro_scale = 1.0 / static_cast<double>(job.plan.micro_batches);
  int group_size = 1;
  MPI_Comm_size(job.students, &group_size);
  for (std::int64_t step = first; step < last; ++step) {
    if (job.health) job.health->at(step + 1, "train step");
    if (job.faults) job.faults->at_step(step + 1, device);
    if (job.health) job.health->check();
    const double lr = job.train.lr_at(step);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    job.parts.zero_grad();
    // [0]: this rank's mean loss; [1]: requeue asked for on this rank (summed: any student).
    std::vector<double> reduced{0.0, 0.0};
    std::vector<torch::Tensor> micro_losses;  // on the device until the step reads them once
    for (std::int64_t micro = 0; micro < job.plan.micro_batches; ++micro) {
      const auto ts = job.plan.transport_step(step, micro);
      const auto& batch = job.transport.recv(ts).tensors;
      if (micro == 0 && job.faults && job.faults->nan_due(step + 1)) {
        batch.at("x_t").view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
      }
      // micro_step releases its prediction, loss and graph when it returns (backward has run);
      // release() then hands the batch's ring slot back, so nothing of this micro-batch
      // survives into the next receive. Only the accumulated grads stay.
      micro_losses.push_back(job.parts.micro_step(batch, micro_scale, job.checkpointing).total);
      job.transport.release(ts);
    }
    // Before the gradients leave this rank: a NaN must not reach the other students' weights.
    // The step's one read of its losses (a host synchronisation on a GPU).
    const auto losses = torch::stack(micro_losses).to(torch::kDouble);
    note_host_sync("step losses");
    const auto host_losses = losses.cpu();
    for (std::int64_t micro = 0; micro < job.plan.micro_batches; ++micro) {
      const double loss = host_losses[micro].item<double>();
      WD_CHECK_AS(NumericalError, std::isfinite(loss),
                  "the loss of step " << step + 1 << " (micro-batch " << micro << ") is " << loss
                                      << " on rank " << job.world_rank);
      reduced[0] += micro_scale * loss;
    }
    job.reducer.average(step);
    if (job.train.grad_clip > 0) clip_grad_norm(params, job.train.grad_clip);
    // CUDA students: LibTorch's fused multi-tensor AdamW; the host keeps the exact per-parameter one.
    if (!compat::fused_adamw_step(optimizer)) optimizer.step();
    job.parts.after_optimizer_step();
    if (job.tracked_memory) *job.tracked_memory = model_memory();

    // Diagnostics, apart from the step.
    reduced[1] = job.health && job.health->requeue_requested() ? 1.0 : 0.0;
    sum_over_students(job, reduced, step, "allreduce loss");
    stats.losses.push_back(reduced[0] / group_size);
    // The same on every student: it came out of the reduction. At the last step the run ends
    // anyway, with its final checkpoint.
    const bool stop = reduced[1] > 0 && step + 1 < last;
    const bool log_now = (step + 1) % job.train.log_every == 0 || step + 1 == last || stop;
    if (log_now && job.leader) {
      const double secs = since(window_start);
      const double waited = job.transport.wait_seconds() - window_wait;
      const auto steps_in_window = (step - first) % job.train.log_every + 1;
      const double samples_s = steps_in_window * job.plan.micro_batches * job.plan.batch_per_student *
                               group_size / secs;
      const double eta = secs / steps_in_window * (last - step - 1);
      spdlog::info("step {}/{} loss {:.5f} lr {:.2e} {:.1f} samples/s wait {:.0f}% ETA {:.0f} s",
                   step + 1, last, stats.losses.back(), lr, samples_s, 100 * waited / secs, eta);
      metrics.append({{"step", step + 1}, {"loss", stats.losses.back()}, {"lr", lr},
                      {"samples_per_s", samples_s}, {"wait_fraction", waited / secs}});
    }
    if (log_now) {
      window_start = Clock::now();
      window_wait = job.transport.wait_seconds();
    }
    if (job.train.eval_every > 0 && (step + 1) % job.train.eval_every == 0 && !eval_set.empty() &&
        step + 1 < last && !stop) {
      const double rel = evaluate(job, eval_set, step + 1);
      if (job.leader) spdlog::info("eval at step {}: relative MSE {:.5f}", step + 1, rel);
      metrics.append({{"eval_step", step + 1}, {"rel_mse", rel}});
    }
    if (job.leader && job.train.sample_every > 0 && (step + 1) % job.train.sample_every == 0 && !eval_set.empty()) {
      report_probe(probe_sampling(job.parts, eval_set.front(), job.train), step + 1, job.train, metrics);
    }
    if (job.memory) job.memory->after_step(step + 1, device, model_memory);
    const bool due = job.checkpoint_every > 0 && (step + 1) % job.checkpoint_every == 0;
    if (job.save && (due || stop || step + 1 == last)) {
      if (job.health) job.health->at(step + 1, "save checkpoint");
      job.save(step + 1, optimizer);
    }
    if (stop) {
      // The checkpoint is durable before the teachers learn of the stop and everyone leaves.
      if (job.leader) {
        spdlog::warn("requeue requested (SIGUSR1): stopped after step {} with a checkpoint", step + 1);
        if (job.health) job.health->send_stop_after(step + 1, job.teachers);
      }
      stats.stopped_after = step + 1;
      break;
    }
  }
  if (!eval_set.empty() && stats.stopped_after < 0) {
    stats.final_eval_rel_mse = evaluate(job, eval_set, last);
    if (job.leader) {
      spdlog::info("eval after training: relative MSE {:.5f} (at step {}: {:.5f})",
                   stats.final_eval_rel_mse, first, stats.first_eval_rel_mse);
    }
    metrics.append({{"eval_step", last}, {"rel_mse", stats.final_eval_rel_mse},
                    {"rel_mse_before", stats.first_eval_rel_mse}});
  }
  stats.seconds = since(t0);
  stats.wait_seconds = job.transport.wait_seconds();
  return stats;
}

}  // namespace wd::student
