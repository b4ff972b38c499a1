// The colocated teacher: messages computed on the receiving rank.
#include "teacher/colocated_teacher.hpp"

#include <chrono>

#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "teacher/teacher_loop.hpp"

namespace wd::teacher {

comm::TensorDict message_on_device(const comm::TensorDict& message, const c10::Device& device) {
  comm::TensorDict moved;
  for (const auto& [name, t] : message) {
    moved[name] = comm::host_resident(name) ? t.to(torch::kCPU) : t.to(device, /*non_blocking=*/true);
  }
  return moved;
}

LocalSamples local_samples(const comm::StreamPlan& plan, const data::SampleSchedule& schedule, int replica,
                           int replicas, std::int64_t train_samples, std::int64_t step) {
  if (step < plan.eval_messages) {
    return {eval_indices(step, replica, plan.batch_per_student, replicas, train_samples), step, true};
  }
  // Training: transport step -> (optimizer step, micro-batch) -> position in the data stream.
  const auto k = step - plan.eval_messages;
  const auto position = (plan.first_step + k / plan.micro_batches) * plan.micro_batches + k % plan.micro_batches;
  return {schedule.indices(position, replica), position, false};
}

const comm::Message& LocalReceiver::recv(std::int64_t step) {
  WD_CHECK(held_.step < 0, what_ << ": recv(" << step << ") while step " << held_.step << " is not released");
  WD_CHECK(next_ < 0 || step == next_,
           what_ << ": recv(" << step << ") but step " << next_ << " comes next (steps are received in order)");
  const auto t0 = std::chrono::steady_clock::now();
  // Computed on the host or the teacher's device: the student gets it all on its own device.
  held_.tensors = message_on_device(compute(step), device_);
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

comm::TensorDict ColocatedTeacher::compute(std::int64_t step) {
  const auto& plan = src_.plan;
  const auto at = local_samples(plan, src_.schedule, src_.replica, src_.replicas, src_.train_samples, step);
  if (src_.trajectory) return student_message(src_.trajectory->batch(at.noise_step, at.eval), 0, plan.batch_per_student);
  auto batch = read_stage_batch(src_.reader, src_.stage, plan, at.indices, at.noise_step,
                                at.eval ? src_.eval_noiser : src_.noiser);
  if (!plan.train_targets && !at.eval) {  // nothing of the teacher's is read (StreamPlan::train_targets)
    batch.out = untargeted_out(plan, batch.x_t.size(0));
    return student_message(batch, 0, plan.batch_per_student);
  }
  src_.stage.run(batch);
  if (!read_scalar<bool>(torch::isfinite(batch.out).all(), "colocated teacher finite check")) {
    throw NumericalError("the colocated teacher's output for step " + std::to_string(step) + " has NaN/Inf values");
  }
  return student_message(batch, 0, plan.batch_per_student);
}

}  // namespace wd::teacher
