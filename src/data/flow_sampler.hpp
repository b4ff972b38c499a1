// Flow-matching samplers of the Wan pipelines (spec §9): the shifted σ schedule, Euler and
// UniPC (bh2, order 2, x0 prediction), classifier-free guidance, and collapse statistics.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/choices.hpp"

namespace wd::data {

/// σ' = s·σ / (1 + (s−1)·σ).
double shift_sigma(double sigma, double shift);

/// The official sampling schedule (FlowUniPCMultistepScheduler.set_timesteps): σ =
/// linspace(1 − 1/1000, 0, steps+1) without its last point, shifted, then a final 0 appended;
/// steps + 1 values, decreasing.
std::vector<double> sampling_sigmas(std::int64_t steps, double shift);

/// A sampler's state over one trajectory: call step(i, x, v) for i = 0 .. steps−1 in order,
/// with v the model's velocity (ε − x0) at (x, σ_i); it returns x at σ_{i+1}.
class FlowSampler {
 public:
  FlowSampler(Solver solver, std::vector<double> sigmas);
  std::int64_t steps() const { return static_cast<std::int64_t>(sigmas_.size()) - 1; }
  double sigma(std::int64_t i) const { return sigmas_.at(static_cast<std::size_t>(i)); }
  torch::Tensor step(std::int64_t i, const torch::Tensor& x, const torch::Tensor& velocity);

 private:
  torch::Tensor unipc_step(std::int64_t i, torch::Tensor x, const torch::Tensor& velocity);
  double lambda(std::int64_t i) const;

  Solver solver_;
  std::vector<double> sigmas_;
  std::int64_t next_ = 0;
  // UniPC: the x0 predictions of the last two steps (newest last), the sample the last
  // predictor started from, and the order that predictor used.
  std::vector<torch::Tensor> x0_;
  torch::Tensor last_sample_;
  int last_order_ = 0;
};

/// The model's velocity at (x, σ).
using VelocityFn = std::function<torch::Tensor(const torch::Tensor& x, double sigma)>;

/// What a conditioned sampler puts back into its state (a ti2v image's clean first frame).
using KeepFn = std::function<torch::Tensor(const torch::Tensor& x)>;

/// Runs a whole trajectory from `noise` (at σ_0) and returns x at σ_N = 0. With `keep`, the
/// start and the state after every step go through it (the official TI2V sampler re-imposes
/// the image after each step).
torch::Tensor sample_flow(Solver solver, const std::vector<double>& sigmas, const torch::Tensor& noise,
                          const VelocityFn& velocity, const KeepFn& keep = nullptr);

/// Classifier-free guidance: v_uncond + g·(v_cond − v_uncond).
torch::Tensor guide(const torch::Tensor& cond, const torch::Tensor& uncond, double guidance);

/// mean((x − ref)²) / mean(ref²).
double relative_mse(const torch::Tensor& x, const torch::Tensor& ref);

/// Per-channel mean and std of latents [B,C,F,H,W] (over B, F, H, W).
struct ChannelStats {
  std::vector<double> mean;
  std::vector<double> std;
};
ChannelStats channel_stats(const torch::Tensor& latents);

/// Channels whose std in `student` is below `ratio` times that in `teacher`.
std::vector<std::int64_t> collapsed_channels(const ChannelStats& student,
                                             const ChannelStats& teacher, double ratio);

}  // namespace wd::data
