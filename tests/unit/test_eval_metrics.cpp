// evaluate's measures: the Fréchet distance against its closed forms, the paired error and its
// median, the fixed features (and that they see positions), the collapse check, the per-class
// diversity (positions, amplitude spread, pair distance) and the amplitudes it uses.
#include <gtest/gtest.h>

#include <cmath>

#include "data/classes.hpp"
#include "data/synthetic_dataset.hpp"
#include "eval/metrics.hpp"

namespace wd::eval::test_eval_metrics {
namespace {

TEST(Frechet, MatchesTheClosedFormsOfGaussians) {
  torch::manual_seed(1);
  // Whitened: a's sample covariance is exactly the identity, so diagonal scalings commute with it.
  auto a = torch::randn({4000, 3}, torch::kDouble);
  a = a - a.mean(0);
  const auto cov = torch::matmul(a.t(), a) / (a.size(0) - 1);
  a = torch::matmul(a, torch::linalg_inv(torch::linalg_cholesky(cov)).t());
  EXPECT_NEAR(frechet_distance(a, a), 0.0, 1e-9);
  // Equal covariances: the squared distance of the means only.
  const auto shifted = a + torch::tensor({1.0, -2.0, 0.5}, torch::kDouble);
  EXPECT_NEAR(frechet_distance(a, shifted), 1 + 4 + 0.25, 1e-9);
  // Commuting covariances (I and diag(s²)): Σ (1 − s)², here (2−1)² + 0 + (3−1)².
  const auto scaled = a * torch::tensor({2.0, 1.0, 3.0}, torch::kDouble);
  EXPECT_NEAR(frechet_distance(a, scaled), 1.0 + 0.0 + 4.0, 1e-9);
  // A rotation keeps the distance to itself rotated back: not commuting, and still symmetric.
  const auto rot = torch::tensor({{0.6, -0.8, 0.0}, {0.8, 0.6, 0.0}, {0.0, 0.0, 1.0}}, torch::kDouble);
  const auto b = torch::matmul(scaled, rot);
  EXPECT_NEAR(frechet_distance(a, b), frechet_distance(b, a), 1e-9);
  EXPECT_GT(frechet_distance(a, b), 0.1);
}

TEST(Frechet, ItsSpreadIsTheSamplingNoiseAndShrinksWithTheCount) {
  auto g = at::detail::createCPUGenerator(5);
  const auto small_a = torch::randn({60, 4}, g, torch::kDouble), small_b = torch::randn({60, 4}, g, torch::kDouble);
  const auto big_a = torch::randn({960, 4}, g, torch::kDouble), big_b = torch::randn({960, 4}, g, torch::kDouble);
  const double small = eval::frechet_spread(small_a, small_b, 40, 1), big = eval::frechet_spread(big_a, big_b, 40, 1);
  EXPECT_GT(small, 0.0);
  EXPECT_LT(big, small / 2) << "16x the samples: about a quarter of the spread";  // ~1/n for a bias-dominated estimate
  EXPECT_EQ(small, eval::frechet_spread(small_a, small_b, 40, 1));  // seeded
  // Two sets of one distribution are about their spread apart; two of distributions 1 apart are not.
  EXPECT_LT(eval::frechet_distance(small_a, small_b), 4 * small);
  EXPECT_GT(eval::frechet_distance(small_a, small_b + 1.0), 4 * small);
}

TEST(PairedError, IsTheRatioOfSumsAndTheMedianOfRatios) {
  const auto ref = torch::ones({3, 1, 1, 2, 2});
  auto x = ref.clone();
  x[1] *= 2;  // error 4 of norm 4: 1
  x[2] *= 1.5;  // error 1 of norm 4: 0.25
  const auto e = paired_error(x, ref);
  EXPECT_NEAR(e.rel_mse, (4.0 + 1.0) / 12.0, 1e-12);
  EXPECT_NEAR(e.median, 0.25, 1e-12);
}

TEST(LatentFeatures, SeeClassesAndPositionsAndCollapseIsPerChannel) {
  const std::int64_t C = 2, H = 8, W = 8;
  auto pattern = torch::zeros({1, C, 1, H, W});
  pattern.index_put_({0, torch::indexing::Slice(), 0, 2, 3}, 1.0);
  // One pattern at 8 positions, against the same pattern always at one position.
  std::vector<torch::Tensor> spread, still;
  for (std::int64_t i = 0; i < 8; ++i) {
    spread.push_back(torch::roll(pattern[0], {i, (3 * i) % W}, {2, 3}));
    still.push_back(pattern[0].clone());
  }
  const auto fs = latent_features(torch::stack(spread), pattern), ft = latent_features(torch::stack(still), pattern);
  ASSERT_EQ(fs.size(1), 2 * C + 1 + 1 + 4);
  EXPECT_NEAR(fs[0][2 * C + 1].item<double>(), 1.0, 1e-6);  // the class's best-shift cosine
  EXPECT_GT(frechet_distance(fs, ft), 0.5);  // the lost spread of positions shows
  // Without patterns: channel means, stds and the RMS.
  EXPECT_EQ(latent_features(torch::stack(spread)).size(1), 2 * C + 1);
  auto flat = torch::randn({4, C, 1, H, W});
  auto ref = flat.clone();
  flat.select(1, 1).mul_(0.01);
  EXPECT_EQ(collapsed_channels(flat, ref, 0.5), std::vector<std::int64_t>{1});
}

TEST(ClassDiversity, RawValuesOfAHandComputedExample) {
  // Six latents [1,1,1,2] = (a, b): class 0 twice alike, class 1 three times, class 2 once.
  const auto x = torch::tensor({1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 3.0, 0.0, 0.0, 4.0, 7.0, 7.0}).view({6, 1, 1, 1, 2});
  const std::vector<std::int64_t> wanted{0, 1, 0, 1, 1, 2};
  const auto shifts = torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 0, 0}, torch::kLong).view({6, 2});
  const auto amplitudes = torch::tensor({2.0, 1.0, 2.0, 2.0, 3.0, 5.0}, torch::kDouble);
  const auto d = class_diversity(x, shifts, amplitudes, wanted);
  ASSERT_EQ(d.classes.size(), 2U);  // class 2 has one sample: skipped
  const auto& c0 = d.classes[0];
  EXPECT_EQ(c0.label, 0);
  EXPECT_EQ(c0.samples, 2);
  EXPECT_EQ(c0.positions, 1);
  EXPECT_NEAR(c0.amplitude_std, 0.0, 1e-12);
  EXPECT_NEAR(c0.pair_distance, 0.0, 1e-12);  // identical samples
  const auto& c1 = d.classes[1];
  EXPECT_EQ(c1.label, 1);
  EXPECT_EQ(c1.samples, 3);
  EXPECT_EQ(c1.positions, 2);  // (1,1) twice and (2,3)
  EXPECT_NEAR(c1.amplitude_std, std::sqrt(2.0 / 3.0), 1e-12);  // 1, 2, 3: population std
  EXPECT_NEAR(c1.pair_distance, (3.0 + 4.0 + 5.0) / 3.0, 1e-12);  // (0,0), (3,0), (0,4)
}

TEST(ClassDiversity, PatternAmplitudeIsTheLeastSquaresCoefficientAtTheShift) {
  auto p = torch::zeros({1, 1, 2, 2, 2});
  p.index_put_({0, 0, 0, 0, 0}, 1.0);
  p.index_put_({0, 0, 0, 0, 1}, 2.0);
  p.index_put_({0, 0, 1}, 5.0);  // the second frame is not used
  // x's first frame: 3 · p rolled by (1, 1), plus a part orthogonal to it.
  auto x = torch::zeros({1, 1, 2, 2, 2});
  x.index_put_({0, 0, 0, 1, 1}, 3.0);
  x.index_put_({0, 0, 0, 1, 0}, 6.0);
  x.index_put_({0, 0, 0, 0, 0}, -4.0);
  x.index_put_({0, 0, 1}, 1.0);
  const auto a = pattern_amplitudes(x, p, torch::tensor({0}, torch::kLong), torch::tensor({{1, 1}}, torch::kLong));
  EXPECT_NEAR(a[0].item<double>(), 3.0, 1e-12);
}

TEST(ClassDiversity, SeesLostPositionsAmplitudesAndDistances) {
  // Two random classes; class 0 at 4 positions with amplitudes 0.8-1.2, against a collapsed set:
  // all at one position, the amplitudes' spread about 1 halved. Class 1 alike in both.
  torch::manual_seed(3);
  const std::int64_t C = 2, F = 2, H = 8, W = 8;
  const auto patterns = torch::randn({2, C, F, H, W});
  const std::vector<std::vector<std::int64_t>> at{{0, 0}, {1, 2}, {3, 5}, {6, 1}};
  const std::vector<double> amp{0.8, 0.9, 1.1, 1.2};
  std::vector<torch::Tensor> spread, collapsed;
  std::vector<std::int64_t> wanted;
  for (std::size_t i = 0; i < at.size(); ++i) {
    spread.push_back(amp[i] * torch::roll(patterns[0], {at[i][0], at[i][1]}, {2, 3}));
    collapsed.push_back((1 + (amp[i] - 1) / 2) * torch::roll(patterns[0], {1, 2}, {2, 3}));
    wanted.push_back(0);
  }
  for (std::int64_t i = 0; i < 3; ++i) {
    const auto other = (0.9 + 0.1 * static_cast<double>(i)) * torch::roll(patterns[1], {i, 2 * i}, {2, 3});
    spread.push_back(other);
    collapsed.push_back(other);
    wanted.push_back(1);
  }
  const auto xs = torch::stack(spread), xc = torch::stack(collapsed);
  const auto got_s = data::classify_latents(xs, patterns), got_c = data::classify_latents(xc, patterns);
  // The classifier finds each sample's shift and pattern_amplitudes its amplitude.
  EXPECT_EQ(got_s.shift[2][0].item<std::int64_t>(), 3);
  EXPECT_EQ(got_s.shift[2][1].item<std::int64_t>(), 5);
  EXPECT_NEAR(pattern_amplitudes(xs, patterns, got_s.label, got_s.shift)[3].item<double>(), 1.2, 1e-5);
  const auto s = class_diversity(xs, got_s, patterns, wanted), c = class_diversity(xc, got_c, patterns, wanted);
  ASSERT_EQ(s.classes.size(), 2U);
  ASSERT_EQ(c.classes.size(), 2U);
  EXPECT_EQ(s.classes[0].positions, 4);
  EXPECT_EQ(c.classes[0].positions, 1);
  EXPECT_NEAR(static_cast<double>(c.classes[0].positions) / static_cast<double>(s.classes[0].positions), 0.25, 1e-12);
  EXPECT_NEAR(s.classes[0].amplitude_std, std::sqrt((0.04 + 0.01 + 0.01 + 0.04) / 4), 1e-5);
  EXPECT_NEAR(c.classes[0].amplitude_std / s.classes[0].amplitude_std, 0.5, 1e-4);
  EXPECT_LT(c.classes[0].pair_distance, 0.3 * s.classes[0].pair_distance);  // one position: only the scale differs
  // Class 1 is the same in both sets.
  EXPECT_EQ(c.classes[1].positions, s.classes[1].positions);
  EXPECT_NEAR(c.classes[1].amplitude_std, s.classes[1].amplitude_std, 1e-9);
  EXPECT_NEAR(c.classes[1].pair_distance, s.classes[1].pair_distance, 1e-9);
  // Identical samples: no distance between them, one position, no amplitude spread.
  const auto same = patterns[0].unsqueeze(0).expand({3, C, F, H, W}).contiguous();
  const auto d = class_diversity(same, data::classify_latents(same, patterns), patterns, {0, 0, 0});
  ASSERT_EQ(d.classes.size(), 1U);
  EXPECT_EQ(d.classes[0].positions, 1);
  EXPECT_NEAR(d.classes[0].amplitude_std, 0.0, 1e-9);
  EXPECT_NEAR(d.classes[0].pair_distance, 0.0, 1e-9);
}

}  // namespace
}  // namespace wd::eval::test_eval_metrics
