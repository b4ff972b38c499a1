// Teacher loop: data -> noise -> frozen DiT (no grad) -> transport.
#include "teacher/teacher_loop.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>
#include <map>

#include "core/errors.hpp"

namespace wd::teacher {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// One batch through the teacher: what every student of this replica receives.
std::vector<comm::TensorDict> make_messages(TeacherJob& job, const std::vector<std::int64_t>& idx,
                                            std::int64_t noise_step,
                                            const data::FlowMatchingNoiser& noiser, bool poison = false) {
  auto clean = job.reader.read(idx);
  const auto& cfg = job.model->config();
  auto noisy = noiser.apply(clean.latents, clean.indices, noise_step, job.plan.per_token_seq_len,
                            cfg.patch_size);
  torch::Tensor out;
  std::map<std::int64_t, torch::Tensor> features;  // hidden states for feature distillation
  {
    torch::NoGradGuard no_grad;
    auto state = job.model->embed(WanInputs::batched(noisy.x_t, noisy.t, clean.context, clean.context_lens));
    for (std::int64_t i = 0; i < cfg.num_layers; ++i) {
      job.model->run_block(i, state);
      for (const auto j : job.plan.feature_blocks) {
        if (j == i) features[j] = state.x.to(torch::kFloat);
      }
    }
    out = torch::stack(job.model->unembed(state));
  }
  if (poison) out.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  // A non-finite teacher output would silently poison every student: stop here instead.
  if (!torch::isfinite(out).all().item<bool>()) {
    const auto bad = (~torch::isfinite(out)).sum().item<std::int64_t>();
    throw NumericalError("the teacher's output for batch " + std::to_string(noise_step) + " has " +
                         std::to_string(bad) + " NaN/Inf values of " + std::to_string(out.numel()));
  }
  const auto b = job.plan.batch_per_student;
  std::vector<comm::TensorDict> messages;
  const int slots = job.broadcast ? 1 : job.students_per_replica;
  for (int s = 0; s < slots; ++s) {
    const auto lo = s * b, hi = (s + 1) * b;
    messages.push_back({{"x_t", noisy.x_t.slice(0, lo, hi)},
                        {"t", noisy.t.slice(0, lo, hi)},
                        {"context", clean.context.slice(0, lo, hi)},
                        {"context_lens", clean.context_lens.slice(0, lo, hi)},
                        {"teacher_out", out.slice(0, lo, hi)}});
    for (const auto& [j, h] : features) messages.back()["feat." + std::to_string(j)] = h.slice(0, lo, hi);
  }
  return messages;
}

void send(TeacherJob& job, std::int64_t step, const std::vector<comm::TensorDict>& messages) {
  if (job.broadcast) {
    job.transport.broadcast(step, messages.front());
  } else {
    job.transport.send(step, messages);
  }
}

}  // namespace

std::vector<std::int64_t> eval_indices(std::int64_t e, int replica, std::int64_t per_replica,
                                       int replicas, std::int64_t train_samples) {
  std::vector<std::int64_t> idx;
  const auto start = train_samples + (e * replicas + replica) * per_replica;
  for (std::int64_t i = 0; i < per_replica; ++i) idx.push_back(start + i);
  return idx;
}

TeacherStats run_teacher(TeacherJob& job) {
  TeacherStats stats;
  const auto t0 = Clock::now();
  const auto per_replica = job.broadcast ? job.plan.batch_per_student
                                         : job.plan.batch_per_student * job.students_per_replica;
  for (std::int64_t e = 0; e < job.plan.eval_messages; ++e) {
    const auto t = Clock::now();
    auto msgs = make_messages(job, eval_indices(e, job.replica, per_replica, job.replicas, job.train_samples),
                              e, job.eval_noiser);
    stats.busy_seconds += since(t);
    send(job, e, msgs);
  }
  const auto device = job.model->parameters().front().device();
  try {
    for (std::int64_t step = job.plan.first_step; step < job.plan.train_steps; ++step) {
      if (job.health) job.health->at(step + 1, "teacher forward");
      if (job.faults) job.faults->at_step(step + 1, device);
      if (job.health) job.health->check();
      for (std::int64_t micro = 0; micro < job.plan.micro_batches; ++micro) {
        const auto t = Clock::now();
        const auto batch = step * job.plan.micro_batches + micro;  // the data stream's position
        auto msgs = make_messages(job, job.schedule.indices(batch, job.replica), batch, job.noiser,
                                  micro == 0 && job.faults && job.faults->nan_due(step + 1));
        stats.busy_seconds += since(t);
        stats.samples += per_replica;
        send(job, job.plan.transport_step(step, micro), msgs);
      }
      // The memory report is collective over all ranks: teachers join at the students' steps,
      // with zeros for the student categories. Step `step`'s batch is on its way, so the
      // students can reach this step while this rank waits.
      if (job.memory) job.memory->after_step(step + 1, device);
    }
    job.transport.flush();
  } catch (const comm::StopRequested& stop) {
    // The students stopped after stop.step() for a requeue; what this rank streamed beyond it
    // is dropped (a resumed run recomputes it: batches are a function of the step).
    stats.stopped_after = stop.step();
  }
  stats.seconds = since(t0);
  stats.wait_seconds = job.transport.wait_seconds();
  spdlog::info("teacher done: {} samples in {:.1f} s, busy {:.0f}%, waiting on students {:.0f}%",
               stats.samples, stats.seconds, 100 * stats.busy_seconds / stats.seconds,
               100 * stats.wait_seconds / stats.seconds);
  return stats;
}

}  // namespace wd::teacher
