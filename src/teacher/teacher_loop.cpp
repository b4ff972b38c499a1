// Teacher loop: data (or the previous stage) -> this rank's share of the frozen DiT -> the next
// stage or the students.
#include "teacher/teacher_loop.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>

#include "core/errors.hpp"

namespace wd::teacher {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Later stages: the batch the previous stage sent for transport step `step`. The tensors view
/// the receive ring until the step is released, which happens after this stage's forward.
StageBatch receive_batch(TeacherJob& job, std::int64_t step) {
  const auto& m = job.from_previous->recv(step);
  StageBatch b;
  b.x_t = m.at("x_t");
  b.t = m.at("t");
  b.context = m.at("context");
  b.context_lens = m.at("context_lens");
  b.hidden = m.at("hidden");
  for (const auto& [name, tensor] : m.tensors) {
    if (name.rfind("feat.", 0) == 0) b.features[std::stoll(name.substr(5))] = tensor;
  }
  return b;
}

/// A non-finite teacher output would silently poison every student: stop here instead.
void check_finite(const torch::Tensor& produced, std::int64_t step, const char* what) {
  if (torch::isfinite(produced).all().item<bool>()) return;
  const auto bad = (~torch::isfinite(produced)).sum().item<std::int64_t>();
  throw NumericalError(std::string("the teacher's ") + what + " for batch " + std::to_string(step) + " has " +
                       std::to_string(bad) + " NaN/Inf values of " + std::to_string(produced.numel()));
}

/// Runs this rank's share of one batch (unless `computed`: a trajectory batch comes with its
/// target) and passes it on (next stage or students).
void process(TeacherJob& job, std::int64_t step, StageBatch batch, bool poison, bool computed = false) {
  if (!computed) job.stage.run(batch);
  auto& produced = job.stage.last() ? batch.out : batch.hidden;
  if (poison) produced.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  check_finite(produced, step, job.stage.last() ? "output" : "hidden state");
  if (!job.stage.last()) {
    comm::TensorDict m{{"x_t", batch.x_t}, {"t", batch.t}, {"context", batch.context},
                       {"context_lens", batch.context_lens}, {"hidden", batch.hidden}};
    for (const auto& [j, h] : batch.features) m["feat." + std::to_string(j)] = h;
    job.to_next->send(step, {m});
    return;
  }
  const auto b = job.plan.batch_per_student;
  const int slots = job.broadcast ? 1 : job.students_per_replica;
  std::vector<comm::TensorDict> messages;
  for (int s = 0; s < slots; ++s) messages.push_back(student_message(batch, s * b, (s + 1) * b));
  if (job.broadcast) {
    job.transport->broadcast(step, messages.front());
  } else {
    job.transport->send(step, messages);
  }
}

/// One transport step: obtain the batch (read or receive), process it, free the receive slot.
void stream_step(TeacherJob& job, std::int64_t step, const std::vector<std::int64_t>& idx,
                 std::int64_t noise_step, const data::FlowMatchingNoiser& noiser, bool poison,
                 TeacherStats& stats) {
  if (job.trajectory) {
    const auto t = Clock::now();
    process(job, step, job.trajectory->batch(noise_step, &noiser == &job.eval_noiser), poison, true);
    stats.busy_seconds += since(t);
  } else if (job.stage.first()) {
    const auto t = Clock::now();
    auto batch = read_stage_batch(*job.reader, job.stage, job.plan, idx, noise_step, noiser);
    // No target for a training message (StreamPlan::train_targets): the data alone goes out.
    const bool untargeted = !job.plan.train_targets && &noiser != &job.eval_noiser;
    if (untargeted) batch.out = untargeted_out(job.plan, batch.x_t.size(0));
    process(job, step, std::move(batch), poison, untargeted);
    stats.busy_seconds += since(t);
  } else {
    auto batch = receive_batch(job, step);  // waiting on the previous stage, not busy
    const auto t = Clock::now();
    process(job, step, std::move(batch), poison);
    stats.busy_seconds += since(t);
    job.from_previous->release(step);
  }
}

}  // namespace

StageBatch read_stage_batch(data::DatasetReader& reader, const TeacherStage& stage, const comm::StreamPlan& plan,
                            const std::vector<std::int64_t>& idx, std::int64_t noise_step,
                            const data::FlowMatchingNoiser& noiser) {
  auto clean = reader.read(idx);
  const auto& cfg = stage.experts().front().model->config();
  auto noisy = noiser.apply(clean.latents, clean.indices, noise_step, plan.per_token_seq_len, cfg.patch_size);
  StageBatch b;
  b.x_t = noisy.x_t;
  b.t = noisy.t;
  b.context = clean.context;
  b.context_lens = clean.context_lens;
  return b;
}

torch::Tensor untargeted_out(const comm::StreamPlan& plan, std::int64_t samples) {
  return torch::zeros({samples, plan.out_channels, plan.latent[1], plan.latent[2], plan.latent[3]});
}

comm::TensorDict student_message(const StageBatch& batch, std::int64_t lo, std::int64_t hi) {
  comm::TensorDict m{{"x_t", batch.x_t.slice(0, lo, hi)},
                     {"t", batch.t.slice(0, lo, hi)},
                     {"context", batch.context.slice(0, lo, hi)},
                     {"context_lens", batch.context_lens.slice(0, lo, hi)},
                     {"teacher_out", batch.out.slice(0, lo, hi)}};
  for (const auto& [j, h] : batch.features) m["feat." + std::to_string(j)] = h.slice(0, lo, hi);
  if (batch.start.defined()) m["x_start"] = batch.start.slice(0, lo, hi);
  return m;
}

comm::MessageSpec stage_message_spec(const comm::StreamPlan& plan, std::int64_t samples,
                                     const std::vector<std::int64_t>& features) {
  comm::StreamPlan p = plan;
  p.batch_per_student = samples;
  p.feature_blocks = features;
  p.start_states = false;  // stage messages carry the pipeline's state only
  auto spec = p.message_spec();
  // The stage message carries the hidden state where the student message has the output.
  for (auto& t : spec.tensors) {
    if (t.name == "teacher_out") t = {"hidden", torch::kFloat, {samples, plan.tokens, plan.teacher_dim}};
  }
  return spec;
}

std::vector<std::int64_t> eval_indices(std::int64_t e, int replica, std::int64_t per_replica,
                                       int replicas, std::int64_t train_samples) {
  std::vector<std::int64_t> idx;
  const auto start = train_samples + (e * replicas + replica) * per_replica;
  for (std::int64_t i = 0; i < per_replica; ++i) idx.push_back(start + i);
  return idx;
}

TeacherStats run_teacher(TeacherJob& job) {
  WD_CHECK(!job.stage.first() || job.reader, "the first teacher stage needs the data set");
  WD_CHECK(job.stage.first() || job.from_previous, "a later teacher stage needs the previous stage's stream");
  WD_CHECK(!job.stage.last() || job.transport, "the last teacher stage needs the students' transport");
  WD_CHECK(job.stage.last() || job.to_next, "a teacher stage before the last needs the next stage's stream");
  WD_CHECK(!job.trajectory || (job.stage.first() && job.stage.last()),
           "train.objective trajectory needs the whole teacher on one rank");
  TeacherStats stats;
  const auto t0 = Clock::now();
  const auto per_replica = job.broadcast ? job.plan.batch_per_student
                                         : job.plan.batch_per_student * job.students_per_replica;
  for (std::int64_t e = 0; e < job.plan.eval_messages; ++e) {
    stream_step(job, e, job.stage.first() ? eval_indices(e, job.replica, per_replica, job.replicas, job.train_samples)
                                          : std::vector<std::int64_t>{},
                e, job.eval_noiser, false, stats);
  }
  const auto device = job.stage.experts().front().model->parameters().front().device();
  try {
    for (std::int64_t step = job.plan.first_step; step < job.plan.train_steps; ++step) {
      if (job.health) job.health->at(step + 1, "teacher forward");
      if (job.faults) job.faults->at_step(step + 1, device);
      if (job.health) job.health->check();
      for (std::int64_t micro = 0; micro < job.plan.micro_batches; ++micro) {
        // Each micro-batch is its own transport step, so stages pipeline at that grain.
        const auto batch = step * job.plan.micro_batches + micro;  // the data stream's position
        stream_step(job, job.plan.transport_step(step, micro),
                    job.stage.first() ? job.schedule.indices(batch, job.replica) : std::vector<std::int64_t>{},
                    batch, job.noiser, micro == 0 && job.faults && job.faults->nan_due(step + 1), stats);
        stats.samples += per_replica;
      }
      // The memory report is collective over all ranks: teachers join at the students' steps,
      // with zeros for the student categories. Step `step`'s batch is on its way, so the
      // students can reach this step while this rank waits.
      if (job.memory) job.memory->after_step(step + 1, device);
      // After the collective: a student's request of this cycle went out before its critic steps.
      if (job.server) job.server->after_stream_step(step);
    }
    (job.stage.last() ? job.transport : job.to_next)->flush();
    if (job.server) job.server->flush();
  } catch (const comm::StopRequested& stop) {
    // The students stopped after stop.step() for a requeue; what this rank streamed beyond it
    // is dropped (a resumed run recomputes it: batches are a function of the step).
    stats.stopped_after = stop.step();
  }
  stats.seconds = since(t0);
  stats.wait_seconds = (job.stage.last() ? job.transport : job.to_next)->wait_seconds() +
                       (job.from_previous ? job.from_previous->wait_seconds() : 0.0) +
                       (job.server ? job.server->wait_seconds() : 0.0);
  if (job.server) {
    stats.busy_seconds += job.server->busy_seconds();
    spdlog::info("teacher real-score service: {} samples answered in {:.1f} s", job.server->answered(),
                 job.server->busy_seconds());
  }
  spdlog::info("teacher done: {} samples in {:.1f} s, busy {:.0f}%, waiting {:.0f}%", stats.samples,
               stats.seconds, 100 * stats.busy_seconds / stats.seconds, 100 * stats.wait_seconds / stats.seconds);
  return stats;
}

}  // namespace wd::teacher
