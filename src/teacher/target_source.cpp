// Target sources, the training message and the local receiver (target_source.hpp).
#include "teacher/target_source.hpp"

#include <chrono>

#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "model/image_condition.hpp"

namespace wd::teacher {

std::vector<std::int64_t> eval_indices(std::int64_t e, int replica, std::int64_t per_replica, int replicas,
                                       std::int64_t train_samples) {
  std::vector<std::int64_t> idx;
  const auto start = train_samples + (e * replicas + replica) * per_replica;
  for (std::int64_t i = 0; i < per_replica; ++i) idx.push_back(start + i);
  return idx;
}

std::vector<std::int64_t> replica_indices(const data::SampleSchedule& schedule, int replica, int replicas,
                                          std::int64_t per_replica, std::int64_t train_samples,
                                          std::int64_t position, bool eval) {
  return eval ? eval_indices(position, replica, per_replica, replicas, train_samples)
              : schedule.indices(position, replica);
}

std::vector<std::int64_t> SampleStream::indices(std::int64_t position, bool eval) const {
  return replica_indices(schedule, replica, replicas, per_replica, train_samples, position, eval);
}

void check_finite(const torch::Tensor& produced, std::int64_t step, const std::string& what) {
  if (read_scalar<bool>(torch::isfinite(produced).all(), "teacher output finite check")) return;
  const auto bad = read_scalar<std::int64_t>((~torch::isfinite(produced)).sum(), "teacher output NaN count");
  throw NumericalError("the " + what + " for batch " + std::to_string(step) + " has " + std::to_string(bad) +
                       " NaN/Inf values of " + std::to_string(produced.numel()));
}

NoisedSamples SampleStream::read(std::int64_t position, bool eval, std::int64_t per_token_seq_len,
                                 const std::array<std::int64_t, 3>& patch) const {
  NoisedSamples s;
  s.clean = reader.read(indices(position, eval));
  s.noisy = noiser_for(eval).apply(s.clean.latents, s.clean.indices, position, per_token_seq_len, patch);
  return s;
}

StageBatch NoisedSamples::stage_input(const std::array<std::int64_t, 3>& patch) const {
  StageBatch b;
  auto in = condition_input(clean.condition_kind, clean.condition, noisy.x_t, noisy.t, patch);
  b.x_t = in.x_t;
  b.t = in.t;
  b.y = in.y;
  b.context = clean.context;
  b.context_lens = clean.context_lens;
  return b;
}

namespace {

/// The out of a training batch the plan computes no target for (StreamPlan::train_targets
/// false): zeros [samples, out_channels, F, H, W].
torch::Tensor untargeted_out(const comm::StreamPlan& plan, std::int64_t samples) {
  return torch::zeros({samples, plan.out_channels, plan.latent[1], plan.latent[2], plan.latent[3]});
}

}  // namespace

StageBatch StageTargets::make(std::int64_t position, bool eval) {
  const auto& patch = stage_.experts().front().model->config().patch_size;
  auto batch = samples_.read(position, eval, plan_.per_token_seq_len, patch).stage_input(patch);
  if (!plan_.train_targets && !eval) {  // nothing of the teacher's is read (StreamPlan::train_targets)
    batch.out = untargeted_out(plan_, batch.x_t.size(0));
  } else {
    stage_.run(batch);
  }
  return batch;
}

comm::TensorDict student_message(const StageBatch& batch, std::int64_t lo, std::int64_t hi) {
  comm::TensorDict m{{"x_t", batch.x_t.slice(0, lo, hi)},
                     {"t", batch.t.slice(0, lo, hi)},
                     {"context", batch.context.slice(0, lo, hi)},
                     {"context_lens", batch.context_lens.slice(0, lo, hi)},
                     {"teacher_out", batch.out.slice(0, lo, hi)}};
  for (const auto& [j, h] : batch.features) m["feat." + std::to_string(j)] = h.slice(0, lo, hi);
  if (batch.start.defined()) m["x_start"] = batch.start.slice(0, lo, hi);
  if (batch.y.defined()) m["y"] = batch.y.slice(0, lo, hi);
  return m;
}

comm::TensorDict message_on_device(const comm::TensorDict& message, const c10::Device& device) {
  comm::TensorDict moved;
  for (const auto& [name, t] : message) {
    moved[name] = comm::host_resident(name) ? t.to(torch::kCPU) : t.to(device, /*non_blocking=*/true);
  }
  return moved;
}

StreamPosition stream_position(const comm::StreamPlan& plan, std::int64_t step) {
  if (step < plan.eval_messages) return {step, true};
  // Training: transport step -> (optimizer step, micro-batch) -> position in the data stream.
  const auto k = step - plan.eval_messages;
  return {(plan.first_step + k / plan.micro_batches) * plan.micro_batches + k % plan.micro_batches, false};
}

const comm::Message& LocalReceiver::recv(std::int64_t step) {
  WD_CHECK(held_.step < 0, what_ << ": recv(" << step << ") while step " << held_.step << " is not released");
  WD_CHECK(next_ < 0 || step == next_,
           what_ << ": recv(" << step << ") but step " << next_ << " comes next (steps are received in order)");
  const auto t0 = std::chrono::steady_clock::now();
  const auto at = stream_position(plan_, step);
  const auto batch = source_.make(at.position, at.eval);
  if (check_finite_) check_finite(batch.out, step, what_ + "'s output");
  // Made on the host or the teacher's device: the student gets it all on its own device.
  held_.tensors = message_on_device(student_message(batch, 0, plan_.batch_per_student), device_);
  held_.step = step;
  next_ = step + 1;
  compute_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return held_;
}

void LocalReceiver::release(std::int64_t step) {
  WD_CHECK(step == held_.step, what_ << ": release(" << step << ") but step " << held_.step << " is held");
  held_.tensors.clear();  // the batch's tensors go now, not at the next recv
  held_.step = -1;
}

}  // namespace wd::teacher
