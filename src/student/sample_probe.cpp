// probe_sampling: the student's own samples against references from the teacher's outputs.
#include "student/sample_probe.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>

#include "data/flow_sampler.hpp"
#include "data/splitmix64.hpp"
#include "model/image_condition.hpp"

namespace wd::student {

namespace {

constexpr std::uint64_t kProbeNoiseStream = 21;

/// Smallest student/teacher std ratio over channels, and the channels below `ratio`.
double worst_ratio(const data::ChannelStats& student, const data::ChannelStats& teacher, double ratio,
                   std::vector<std::int64_t>& below) {
  below = data::collapsed_channels(student, teacher, ratio);
  double worst = std::numeric_limits<double>::infinity();
  for (std::size_t c = 0; c < student.std.size(); ++c) {
    if (teacher.std[c] > 0) worst = std::min(worst, student.std[c] / teacher.std[c]);
  }
  return worst;
}

}  // namespace

SampleProbe probe_sampling(StudentParts& parts, const comm::TensorDict& batch, const TrainConfig& train) {
  torch::NoGradGuard no_grad;
  // Everything on the student's device, whatever device each message tensor arrived on.
  const auto& device = parts.device();
  const auto x_t = batch.at("x_t").to(device);
  const auto teacher_out = batch.at("teacher_out").to(device, torch::kFloat);
  const auto B = x_t.size(0);
  const auto sigma = (batch.at("t").to(device, torch::kFloat).view({B, -1}).amax(1) / 1000);
  const auto x0_teacher = x_t.to(torch::kFloat) - sigma.view({B, 1, 1, 1, 1}) * teacher_out;

  // The noise is drawn on the host with its own generator: the training RNG is untouched.
  auto gen = at::detail::createCPUGenerator(data::hash_keys(train.seed, kProbeNoiseStream));
  auto noise = torch::randn(teacher_out.sizes(), gen).to(device);
  comm::TensorDict inputs{{"context", batch.at("context").to(device)}, {"context_lens", batch.at("context_lens")}};
  // The batch's image condition goes with the samples: i2v's y at every forward; ti2v's clean
  // first frame (its tokens at t = 0 in the batch, frame weight 0) is the start's and never moves.
  if (const auto y = batch.find("y"); y != batch.end()) inputs["y"] = y->second.to(device);
  const auto batch_t = batch.at("t").to(device, torch::kFloat);
  const auto still = parts.frame_weights({{"t", batch_t}, {"x_t", x_t}});
  if (still.defined()) noise = noise * still + x_t.to(torch::kFloat) * (1 - still);
  const auto velocity = [&](const torch::Tensor& x, double s) {
    inputs["x_t"] = x.to(x_t.scalar_type());
    inputs["t"] = timesteps_at(batch_t, s);
    const auto v = parts.predict(inputs).to(torch::kFloat);
    return still.defined() ? v * still : v;
  };
  const auto sigmas = data::sampling_sigmas(train.sample_steps, train.sample_shift);
  // A few-step student learned Euler jumps: its run sets train.sample_solver euler and
  // train.sample_steps to student.steps.
  const auto sampled = data::sample_flow(train.sample_solver, sigmas, noise, velocity);

  SampleProbe p;
  p.final_ratio = worst_ratio(data::channel_stats(sampled), data::channel_stats(x0_teacher), train.collapse_ratio,
                              p.flat_channels);
  p.moved_ratio = worst_ratio(data::channel_stats(sampled - noise), data::channel_stats(teacher_out),
                              train.collapse_ratio, p.static_channels);
  return p;
}

}  // namespace wd::student
