// The flow-matching sampler: the shifted schedule against hand-computed values, Euler and UniPC
// exact on a point-mass data distribution, UniPC against diffusers' on a Gaussian flow, guidance
// and the collapse statistics.
#include <gtest/gtest.h>

#include <cmath>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "data/flow_sampler.hpp"

namespace wd::data::test_sampler {
namespace {

TEST(SamplerSchedule, ShiftedSigmasMatchHandComputedValues) {
  // σ = linspace(0.999, 0, 5)[:4] = 0.999, 0.74925, 0.4995, 0.24975; σ' = 12σ / (1 + 11σ).
  const std::vector<double> expected{0.9999165902076903, 0.9728676928070982, 0.9229347909769804,
                                     0.7997865101074121, 0.0};
  const auto sigmas = sampling_sigmas(4, 12.0);
  ASSERT_EQ(sigmas.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(sigmas[i], expected[i], 1e-15) << i;
  // shift 5, 2 steps: 5·0.999/(1 + 4·0.999), 5·0.4995/(1 + 4·0.4995), 0.
  const auto five = sampling_sigmas(2, 5.0);
  ASSERT_EQ(five.size(), 3u);
  EXPECT_NEAR(five[0], 0.9997998398718975, 1e-15);
  EXPECT_NEAR(five[1], 0.8330553702468312, 1e-15);
  EXPECT_EQ(five[2], 0.0);
  // shift 1 leaves the linear schedule.
  const auto flat = sampling_sigmas(3, 1.0);
  EXPECT_NEAR(flat[1], 0.666, 1e-15);
  EXPECT_NEAR(shift_sigma(0.5, 3.0), 0.75, 1e-15);
  EXPECT_THROW(sampling_sigmas(0, 1.0), Error);
}

// The exact velocity when all data sit at x0: v(x, σ) = (x − x0) / σ (x0 = x − σ·v is x0).
// Both solvers must land on x0 exactly from any start on the path.
torch::Tensor point_mass_start(const torch::Tensor& x0, const torch::Tensor& eps, double sigma) {
  return (1 - sigma) * x0 + sigma * eps;
}

class ExactEndpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(ExactEndpoint, PointMassDataIsReachedExactly) {
  torch::manual_seed(3);
  const auto x0 = torch::randn({2, 4, 1, 2, 2}, torch::kDouble);
  const auto eps = torch::randn({2, 4, 1, 2, 2}, torch::kDouble);
  for (const std::int64_t steps : {1, 2, 3, 7, 40}) {
    const auto sigmas = sampling_sigmas(steps, 12.0);
    const auto out = sample_flow(parse_choice<Solver>("solver", GetParam()), sigmas, point_mass_start(x0, eps, sigmas[0]),
                                 [&](const torch::Tensor& x, double s) { return (x - x0) / s; });
    EXPECT_LT((out - x0).abs().max().item<double>(), 1e-12) << GetParam() << " steps " << steps;
  }
}

TEST_P(ExactEndpoint, ConstantVelocityIsIntegratedExactly) {
  // A straight path x_σ = x0 + σ·v with v = ε − x0 constant: x_0 = x_{σ0} − σ0·v.
  const auto v = torch::full({1, 2, 1, 1, 1}, 0.75, torch::kDouble);
  const auto start = torch::full({1, 2, 1, 1, 1}, 2.0, torch::kDouble);
  const auto sigmas = sampling_sigmas(5, 3.0);
  const auto out = sample_flow(parse_choice<Solver>("solver", GetParam()), sigmas, start, [&](const torch::Tensor&, double) { return v; });
  EXPECT_NEAR(out[0][0][0][0][0].item<double>(), 2.0 - sigmas[0] * 0.75, 1e-12) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Solvers, ExactEndpoint, ::testing::Values("euler", "unipc"));

// Gaussian data x0 ~ N(0, s²), s² = 1/4: E[x0 | x_σ] = (1−σ)s² / ((1−σ)²s² + σ²) · x_σ, a
// curved flow on which every term of UniPC's predictor and corrector is exercised.
torch::Tensor gaussian_velocity(const torch::Tensor& x, double sigma) {
  const double s2 = 0.25, a = 1 - sigma;
  return (x - a * s2 / (a * a * s2 + sigma * sigma) * x) / sigma;
}

struct UniPCReference {
  std::vector<double> sigmas;
  std::vector<double> endpoint;
};

// diffusers 0.42.1 UniPCMultistepScheduler(solver_order=2, prediction_type="flow_prediction",
// use_flow_sigmas=True, flow_shift=5 | 1, predict_x0=True, solver_type="bh2",
// lower_order_final=True, final_sigmas_type="zero"), set_timesteps(10 | 7), stepped on
// gaussian_velocity from x = linspace(-2, 2, 9) in fp64 (its own σ, stored in fp32).
const std::vector<UniPCReference> kUniPCReference{
    {{0.99999898672103882, 0.97828447818756104, 0.9524376392364502, 0.92115646600723267, 0.88252586126327515,
      0.83361095190048218, 0.76967412233352661, 0.6825404167175293, 0.55678790807723999, 0.3594328761100769, 0},
     {-0.65088291813043497, -0.4881621885978264, -0.32544145906521749, -0.16272072953260874, 0,
      0.16272072953260874, 0.32544145906521749, 0.4881621885978264, 0.65088291813043497}},
    {{0.99999898672103882, 0.85728573799133301, 0.71457141637802124, 0.57185715436935425, 0.42914286255836487,
      0.28642857074737549, 0.14371427893638611, 0},
     {-0.96491243863818221, -0.72368432897863677, -0.48245621931909111, -0.24122810965954555, 0,
      0.24122810965954555, 0.48245621931909111, 0.72368432897863677, 0.96491243863818221}},
};

TEST(SamplerUniPC, MatchesDiffusersOnAGaussianFlow) {
  for (const auto& ref : kUniPCReference) {
    const auto start = torch::linspace(-2, 2, 9, torch::kDouble).view({1, 1, 1, 3, 3});
    const auto out = sample_flow(Solver::kUnipc, ref.sigmas, start, gaussian_velocity).flatten();
    for (std::size_t k = 0; k < ref.endpoint.size(); ++k) {
      // diffusers forms its step coefficients from fp32 σ tensors: agreement to ~1e-7.
      EXPECT_NEAR(out[static_cast<std::int64_t>(k)].item<double>(), ref.endpoint[k], 1e-6)
          << ref.sigmas.size() - 1 << " steps, element " << k;
    }
    // And not by accident: Euler on the same schedule lands elsewhere.
    const auto euler = sample_flow(Solver::kEuler, ref.sigmas, start, gaussian_velocity).flatten();
    EXPECT_GT((euler - out).abs().max().item<double>(), 1e-3);
  }
}

TEST(Sampler, StepsMustComeInOrder) {
  FlowSampler sampler(Solver::kEuler, sampling_sigmas(3, 1.0));
  const auto x = torch::zeros({1, 1, 1, 1, 1});
  EXPECT_THROW(sampler.step(1, x, x), Error);
  EXPECT_THROW(parse_choice<Solver>("teacher.solver", "heun"), ConfigError);
}

TEST(Sampler, GuidanceAndStatistics) {
  const auto cond = torch::full({2}, 3.0), uncond = torch::full({2}, 1.0);
  EXPECT_NEAR(guide(cond, uncond, 5.0)[0].item<double>(), 11.0, 1e-6);
  EXPECT_NEAR(guide(cond, uncond, 1.0)[1].item<double>(), 3.0, 1e-6);
  EXPECT_NEAR(relative_mse(torch::full({4}, 3.0), torch::full({4}, 2.0)), 0.25, 1e-12);

  // Channel 0: values ±1 (mean 0, std 1); channel 1: constant 5 (std 0).
  auto latents = torch::zeros({2, 2, 1, 1, 2});
  latents.select(1, 0).copy_(torch::tensor({1.0f, -1.0f, -1.0f, 1.0f}).view({2, 1, 1, 2}));
  latents.select(1, 1).fill_(5.0f);
  const auto stats = channel_stats(latents);
  EXPECT_NEAR(stats.mean[0], 0.0, 1e-12);
  EXPECT_NEAR(stats.std[0], 1.0, 1e-12);
  EXPECT_NEAR(stats.mean[1], 5.0, 1e-12);
  EXPECT_NEAR(stats.std[1], 0.0, 1e-12);
  const ChannelStats teacher{{0, 0}, {1.0, 1.0}};
  EXPECT_EQ(collapsed_channels(stats, teacher, 0.1), std::vector<std::int64_t>{1});
  EXPECT_TRUE(collapsed_channels(teacher, teacher, 0.1).empty());
}

}  // namespace
}  // namespace wd::data::test_sampler
