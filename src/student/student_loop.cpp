// Student loop: one screen of training steps, with the diagnostics kept apart.
#include "student/student_loop.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>
#include <memory>
#include <utility>

#include "data/flow_sampler.hpp"
#include "student/diagnostics.hpp"
#include "student/distill_objective.hpp"
#include "student/train_step.hpp"
#include "student/trajectory_rollout.hpp"


namespace wd::student {

namespace {

using Clock = std::chrono::steady_clock;

/// A step's micro-batches as the teacher stream delivers them (with the injected NaN fault).
class StreamBatches final : public MicroBatches {
 public:
  explicit StreamBatches(StudentJob& job) : job_(job) {}
  std::int64_t count() const override { return job_.plan.micro_batches; }
  const comm::TensorDict& take(std::int64_t step, std::int64_t micro) override {
    const auto& batch = job_.transport.recv(job_.plan.transport_step(step, micro)).tensors;
    if (micro == 0 && job_.faults && job_.faults->nan_due(step + 1)) {
      batch.at("x_t").view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
    }
    return batch;
  }
  void release(std::int64_t step, std::int64_t micro) override {
    job_.transport.release(job_.plan.transport_step(step, micro));
  }

 private:
  StudentJob& job_;
};

/// What every student learns of step `step` in one reduction: the group's mean of this rank's
/// `loss`, and whether to stop after it (any student asked for a requeue; never at the last
/// step, which ends the run anyway with its final checkpoint).
std::pair<double, bool> share_step(StudentJob& job, std::int64_t step, double loss) {
  std::vector<double> reduced{loss, job.health && job.health->requeue_requested() ? 1.0 : 0.0};
  sum_over_students(job, reduced, step, "allreduce loss");
  int group_size = 1;
  MPI_Comm_size(job.students, &group_size);
  return {reduced[0] / group_size, reduced[1] > 0 && step + 1 < job.plan.train_steps};
}

/// train.trajectory_rollout: `distill` with part of each batch starting from the student's own
/// states; null when off.
std::unique_ptr<RolloutObjective> rollout_of(StudentJob& job, Objective& distill) {
  if (job.train.trajectory_rollout <= 0) return nullptr;  // a trajectory key (its spec refuses it elsewhere)
  return std::make_unique<RolloutObjective>(job.parts, distill,
                                            data::sampling_sigmas(job.train.sample_steps, job.train.sample_shift),
                                            job.train.trajectory_rollout);
}

}  // namespace

StudentStats run_student(StudentJob& job) {
  StudentStats stats;
  const auto t0 = Clock::now();
  auto& optimizer = job.optimizer;
  if (job.restore) job.restore(optimizer);
  Diagnostics diagnostics(job);  // receives the held-out batches
  stats.first_eval_rel_mse = diagnostics.before_training();
  DistillObjective distill(job.parts, job.checkpointing);
  const auto rollout = rollout_of(job, distill);
  Objective& objective = rollout ? static_cast<Objective&>(*rollout) : distill;
  StreamBatches batches(job);
  DistillMethod distill_step;
  StudentMethod& method = job.method ? *job.method : distill_step;
  StepContext context{objective, optimizer, &job.reducer, job.train.grad_clip, job.world_rank,
                      [&] { diagnostics.track_memory(); }};
  const auto device = job.parts.trainable().front().device();
  const auto last = job.plan.train_steps;
  for (std::int64_t step = job.plan.first_step; step < last; ++step) {
    if (job.health) job.health->at(step + 1, "train step");
    if (job.faults) job.faults->at_step(step + 1, device);
    if (job.health) job.health->check();
    const double lr = job.train.lr_at(step);
    const auto [loss, stop] = share_step(job, step, method.step(context, step, lr, batches));
    if (job.ema && method.averages_after(step)) job.ema->update(job.parts, step + 1);
    stats.losses.push_back(loss);
    diagnostics.after_step(step, lr, loss, stop);
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
  if (stats.stopped_after < 0) stats.final_eval_rel_mse = diagnostics.after_training();
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stats.wait_seconds = job.transport.wait_seconds() + method.wait_seconds();
  return stats;
}

}  // namespace wd::student
