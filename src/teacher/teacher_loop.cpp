// Teacher loop: data (or the previous stage) -> this rank's share of the frozen DiT -> the next
// stage or the students.
#include "teacher/teacher_loop.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>

#include "core/errors.hpp"
#include "core/sequence_groups.hpp"

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
  // An i2v teacher's y comes too: taken by the first stage's patch embedding, passed on for the students.
  auto b = StageBatch::inputs_of(m.tensors);
  b.hidden = m.at("hidden");
  for (const auto& [name, tensor] : m.tensors) {
    if (name.rfind("feat.", 0) == 0) b.features[std::stoll(name.substr(5))] = tensor;
  }
  return b;
}

/// Checks one made batch and passes it on (next stage or students).
void process(TeacherJob& job, std::int64_t step, StageBatch batch, bool poison) {
  auto& produced = job.stage.last() ? batch.out : batch.hidden;
  if (poison) produced.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  check_finite(produced, step, job.stage.last() ? "teacher's output" : "teacher's hidden state");
  if (!job.stage.last()) {
    comm::TensorDict m{{"x_t", batch.x_t}, {"t", batch.t}, {"context", batch.context},
                       {"context_lens", batch.context_lens}, {"hidden", batch.hidden}};
    for (const auto& [j, h] : batch.features) m["feat." + std::to_string(j)] = h;
    if (batch.y.defined()) m["y"] = batch.y;
    job.to_next->send(step, {m});
    return;
  }
  const auto b = job.plan.batch_per_student;
  const int slots = job.broadcast ? 1 : job.students_per_replica;
  std::vector<comm::TensorDict> messages;
  const SequenceGroups groups{job.sequence_parallel};
  for (int s = 0; s < slots; ++s) {
    const auto group = groups.group_of(s);  // a sequence-parallel group's ranks share its samples
    messages.push_back(student_message(batch, group * b, (group + 1) * b));
  }
  if (job.broadcast) {
    job.transport->broadcast(step, messages.front());
  } else {
    job.transport->send(step, messages);
  }
}

/// One transport step: make the batch (first stage: the source) or receive it and run this
/// stage's blocks, pass it on, free the receive slot.
void stream_step(TeacherJob& job, std::int64_t step, std::int64_t position, bool eval, bool poison,
                 TeacherStats& stats) {
  if (job.source) {
    const auto t = Clock::now();
    process(job, step, job.source->make(position, eval), poison);
    stats.busy_seconds += since(t);
  } else {
    auto batch = receive_batch(job, step);  // waiting on the previous stage, not busy
    const auto t = Clock::now();
    job.stage.run(batch);
    process(job, step, std::move(batch), poison);
    stats.busy_seconds += since(t);
    job.from_previous->release(step);
  }
}

}  // namespace

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

TeacherStats run_teacher(TeacherJob& job) {
  // Beside a teacher cache the students read their batches: no stream, the real score alone.
  const bool streams = job.source || job.from_previous;
  WD_CHECK(streams || (job.server && !job.transport && !job.to_next),
           "a teacher rank that streams no batches answers the real score alone");
  WD_CHECK(!streams || job.stage.first() == (job.source != nullptr),
           "the first teacher stage, and it alone, makes its batches with the objective's source");
  WD_CHECK(!streams || job.stage.last() || job.to_next, "a teacher stage before the last needs the next stage's stream");
  WD_CHECK(!streams || !job.stage.last() || job.transport, "the last teacher stage needs the students' transport");
  comm::Sender* const out = job.stage.last() ? job.transport : job.to_next;  // null: no stream
  TeacherStats stats;
  const auto t0 = Clock::now();
  const auto per_replica = job.broadcast ? job.plan.batch_per_student
                                         : job.plan.batch_per_student * job.students_per_replica / job.sequence_parallel;
  for (std::int64_t e = 0; streams && e < job.plan.eval_messages; ++e) stream_step(job, e, e, true, false, stats);
  const auto device = job.stage.experts().front().model->parameters().front().device();
  try {
    for (std::int64_t step = job.plan.first_step; step < job.plan.train_steps; ++step) {
      if (job.health) job.health->at(step + 1, streams ? "teacher forward" : "real-score service");
      if (job.faults) job.faults->at_step(step + 1, device);
      if (job.health) job.health->check();
      for (std::int64_t micro = 0; streams && micro < job.plan.micro_batches; ++micro) {
        // Each micro-batch is its own transport step, so stages pipeline at that grain.
        const auto batch = step * job.plan.micro_batches + micro;  // the data stream's position
        stream_step(job, job.plan.transport_step(step, micro), batch, false,
                    micro == 0 && job.faults && job.faults->nan_due(step + 1), stats);
        stats.samples += per_replica;
      }
      // The memory report is collective over all ranks: teachers join at the students' steps,
      // with zeros for the student categories. Step `step`'s batch is on its way, so the
      // students can reach this step while this rank waits.
      if (job.memory) job.memory->after_step(step + 1, device);
      // After the collective: a student's request of this cycle went out before its critic steps.
      if (job.server) job.server->after_stream_step(step);
    }
    if (out) out->flush();
    if (job.server) job.server->flush();
  } catch (const comm::StopRequested& stop) {
    // The students stopped after stop.step() for a requeue; what this rank streamed beyond it
    // is dropped (a resumed run recomputes it: batches are a function of the step).
    stats.stopped_after = stop.step();
  }
  stats.seconds = since(t0);
  stats.wait_seconds = (out ? out->wait_seconds() : 0.0) +
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
