// FlowSampler (Euler, UniPC bh2), the Wan sampling schedule, guidance and latent statistics.
#include "data/flow_sampler.hpp"

#include <cmath>

#include "core/errors.hpp"

namespace wd::data {

double shift_sigma(double sigma, double shift) { return shift * sigma / (1.0 + (shift - 1.0) * sigma); }

std::vector<double> sampling_sigmas(std::int64_t steps, double shift) {
  WD_CHECK(steps >= 1, "sampling_sigmas: steps(" << steps << ") must be >= 1");
  WD_CHECK(shift > 0 && std::isfinite(shift), "sampling_sigmas: shift(" << shift << ") must be > 0");
  constexpr double kSigmaMax = 1.0 - 1.0 / 1000.0;  // the first σ of the 1000-step training table
  std::vector<double> sigmas;
  for (std::int64_t i = 0; i < steps; ++i) {
    const double s = kSigmaMax - kSigmaMax * static_cast<double>(i) / static_cast<double>(steps);
    sigmas.push_back(shift_sigma(s, shift));
  }
  sigmas.push_back(0.0);
  return sigmas;
}

FlowSampler::FlowSampler(Solver solver, std::vector<double> sigmas) : solver_(solver), sigmas_(std::move(sigmas)) {
  WD_CHECK(sigmas_.size() >= 2 && sigmas_.back() == 0.0, "sampler: the schedule must have >= 2 σ ending at 0");
}

torch::Tensor FlowSampler::step(std::int64_t i, const torch::Tensor& x, const torch::Tensor& velocity) {
  WD_CHECK(i == next_ && i < steps(), "sampler: step " << i << " out of order (expected " << next_ << " of " << steps() << ")");
  ++next_;
  if (solver_ == Solver::kUnipc) {
    // At least fp32 as diffusers (which upcasts the sample); fp64 stays fp64.
    const auto type = x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    return unipc_step(i, x.to(type), velocity.to(type));
  }
  return x + (sigma(i + 1) - sigma(i)) * velocity;
}

double FlowSampler::lambda(std::int64_t i) const {
  const double s = sigma(i);
  return std::log(1.0 - s) - std::log(s);  // +inf at σ = 0
}

namespace {

// The b vector of UniPC's bh2 variant for hh = −h: b_k = h_phi_k · k! / B(h), B(h) = e^hh − 1.
std::vector<double> unipc_b(double hh, int order) {
  const double b_h = std::expm1(hh);
  double h_phi_k = std::expm1(hh) / hh - 1.0;
  double factorial = 1.0;
  std::vector<double> b;
  for (int k = 1; k <= order; ++k) {
    b.push_back(h_phi_k * factorial / b_h);
    factorial *= k + 1;
    h_phi_k = h_phi_k / hh - 1.0 / factorial;
  }
  return b;
}

}  // namespace

// diffusers' UniPCMultistepScheduler.step with predict_x0, bh2, solver_order 2,
// lower_order_final, flow sigmas (α = 1 − σ): the corrector refines x with this step's x0
// prediction, then the predictor moves to σ_{i+1}.
torch::Tensor FlowSampler::unipc_step(std::int64_t i, torch::Tensor x, const torch::Tensor& velocity) {
  const torch::Tensor m_t = x - sigma(i) * velocity;  // x0 from the uncorrected sample
  if (i > 0) {
    // Corrector (uni_c_bh_update) from σ_{i−1} to σ_i with the order the last predictor used.
    const torch::Tensor& m0 = x0_.back();
    const double h = lambda(i) - lambda(i - 1);
    const double alpha_t = 1.0 - sigma(i);
    const double hh = -h;
    const auto b = unipc_b(hh, last_order_);
    const double b_h = std::expm1(hh);
    auto base = sigma(i) / sigma(i - 1) * last_sample_ - alpha_t * std::expm1(hh) * m0;
    torch::Tensor corr;
    if (last_order_ == 1) {
      corr = 0.5 * (m_t - m0);
    } else {
      const double rk = (lambda(i - 2) - lambda(i - 1)) / h;
      const auto d1 = (x0_[x0_.size() - 2] - m0) / rk;
      const double rho0 = (b[0] - b[1]) / (1.0 - rk);  // R = [[1, 1], [rk, 1]], R·ρ = b
      const double rho1 = b[0] - rho0;
      corr = rho0 * d1 + rho1 * (m_t - m0);
    }
    x = base - alpha_t * b_h * corr;
  }
  x0_.push_back(m_t);
  if (x0_.size() > 2) x0_.erase(x0_.begin());
  const int order = static_cast<int>(std::min<std::int64_t>({2, steps() - i, static_cast<std::int64_t>(x0_.size())}));
  last_sample_ = x;
  last_order_ = order;
  // Predictor (uni_p_bh_update) from σ_i to σ_{i+1}.
  const double sigma_t = sigma(i + 1);
  const double alpha_t = 1.0 - sigma_t;
  if (sigma_t == 0.0) return m_t;  // h = ∞: the x0 prediction itself (order 1 here)
  const double h = lambda(i + 1) - lambda(i);
  const double hh = -h;
  auto out = sigma_t / sigma(i) * x - alpha_t * std::expm1(hh) * m_t;
  if (order == 2) {
    const double rk = (lambda(i - 1) - lambda(i)) / h;
    const auto d1 = (x0_.front() - m_t) / rk;
    out = out - alpha_t * std::expm1(hh) * 0.5 * d1;  // ρ_p = 0.5 for order 2
  }
  return out;
}

torch::Tensor sample_flow(Solver solver, const std::vector<double>& sigmas, const torch::Tensor& noise,
                          const VelocityFn& velocity, const KeepFn& keep) {
  FlowSampler sampler(solver, sigmas);
  torch::Tensor x = keep ? keep(noise) : noise;
  for (std::int64_t i = 0; i < sampler.steps(); ++i) {
    x = sampler.step(i, x, velocity(x, sampler.sigma(i)));
    if (keep) x = keep(x);
  }
  return x;
}

torch::Tensor guide(const torch::Tensor& cond, const torch::Tensor& uncond, double guidance) {
  return uncond + guidance * (cond - uncond);
}

double relative_mse(const torch::Tensor& x, const torch::Tensor& ref) {
  const double denom = ref.to(torch::kDouble).pow(2).mean().item<double>();
  const double num = (x.to(torch::kDouble) - ref.to(torch::kDouble)).pow(2).mean().item<double>();
  return denom > 0 ? num / denom : num;
}

ChannelStats channel_stats(const torch::Tensor& latents) {
  WD_CHECK(latents.dim() == 5, "channel_stats: latents must be [B,C,F,H,W], got " << latents.sizes());
  const auto per_channel = latents.to(torch::kDouble).transpose(0, 1).reshape({latents.size(1), -1});
  const auto mean = per_channel.mean(1);
  const auto std = per_channel.std(1, /*unbiased=*/false);
  ChannelStats out;
  for (std::int64_t c = 0; c < latents.size(1); ++c) {
    out.mean.push_back(mean[c].item<double>());
    out.std.push_back(std[c].item<double>());
  }
  return out;
}

std::vector<std::int64_t> collapsed_channels(const ChannelStats& student, const ChannelStats& teacher,
                                             double ratio) {
  WD_CHECK(student.std.size() == teacher.std.size(),
           "collapse check: " << student.std.size() << " student channels, " << teacher.std.size() << " teacher");
  std::vector<std::int64_t> out;
  for (std::size_t c = 0; c < student.std.size(); ++c) {
    if (student.std[c] < ratio * teacher.std[c]) out.push_back(static_cast<std::int64_t>(c));
  }
  return out;
}

}  // namespace wd::data
