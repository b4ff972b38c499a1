// evaluate's measures: the Fréchet distance against its closed forms, the paired error and its
// median, the fixed features (and that they see positions), the collapse check.
#include <gtest/gtest.h>

#include "data/classes.hpp"
#include "data/synthetic_dataset.hpp"
#include "eval/metrics.hpp"

namespace wd::eval {
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

}  // namespace
}  // namespace wd::eval
