// student.shard gradients on 2, 3 and 4 ranks: OptimizerShard's GradientScatter against the
// average every rank can compute itself (each rank's loss is a known function of its rank), for
// buckets sent from the backward's hooks, parameters used twice or not at all, micro-batches, the
// global-norm clip and the all-gather of the updated slices.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mpi_test_util.hpp"
#include "student/optimizer_shard.hpp"

namespace wd::student::test_gradient_scatter {
namespace {

using test::world_rank;
using test::failures_anywhere;
using test::world_size;

// 35 + 13 + 9 + 29 = 86 elements: 2 ranks split them evenly, 3 and 4 pad the last slice (87, 88).
// Buckets of 100 bytes (25 floats): {35}, {13, 9}, {29}.
const std::vector<std::vector<std::int64_t>> kShapes{{7, 5}, {13}, {3, 3}, {29}};
constexpr std::uint64_t kBucketBytes = 100;

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);  // the same start on every rank
  std::vector<torch::Tensor> params;
  for (const auto& shape : kShapes) params.push_back(torch::randn(shape).requires_grad_(true));
  return params;
}

/// Rank r's per-element weights for parameter i: its loss is Σ_i Σ ½·(c·p)², so dL/dp = c²·p.
torch::Tensor weights(int rank, std::size_t i) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(1000 + 17 * rank + static_cast<int>(i));
  return torch::rand(kShapes[i], g) + 0.5;
}

torch::Tensor loss_of(const std::vector<torch::Tensor>& params, int rank, const std::vector<std::size_t>& used) {
  auto loss = torch::zeros({});
  for (const auto i : used) loss = loss + 0.5 * (weights(rank, i) * params[i]).pow(2).sum();
  return loss;
}

/// The group's average of dL/dp for the parameters (flat, in order), `uses` times parameter i's.
torch::Tensor expected_average(const std::vector<torch::Tensor>& params, const std::vector<int>& uses) {
  std::vector<torch::Tensor> flat;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto sum = torch::zeros(kShapes[i]);
    for (int r = 0; r < world_size(); ++r) sum += weights(r, i).pow(2) * params[i].detach();
    flat.push_back((sum * uses[i] / world_size()).reshape({-1}));
  }
  return torch::cat(flat);
}

/// This rank's slice of the gradients as the optimizer sees it (its views' grads), against
/// `expected` (flat); how many elements disagree.
int slice_mismatches(const OptimizerShard& shard, const torch::Tensor& expected) {
  int bad = 0;
  const auto& views = shard.views();
  for (std::size_t k = 0; k < views.size(); ++k) {
    const auto& s = shard.segments()[k];
    const auto want = expected.narrow(0, s.global, s.length);
    if (!torch::allclose(views[k].grad(), want, 1e-6, 1e-7)) ++bad;
  }
  return bad;
}

OptimizerShard make_shard(std::vector<torch::Tensor>& params) {
  return OptimizerShard(MPI_COMM_WORLD, params, kBucketBytes, 30.0, world_rank(), nullptr);
}

TEST(GradientScatter, EveryBucketLeavesFromTheBackwardAndEachRankGetsItsSliceOfTheAverage) {
  auto params = make_params();
  auto shard = make_shard(params);
  ASSERT_EQ(shard.scatter()->bucket_count(), 3u);
  EXPECT_EQ(shard.slice_size(), (86 + world_size() - 1) / world_size());
  shard.begin_step();
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  // Sent and dropped as they came: no full gradient is left on the rank.
  int held = 0;
  for (const auto& p : params) held += p.grad().defined() ? 1 : 0;
  EXPECT_EQ(held, 0);
  EXPECT_EQ(shard.scatter()->sent_in_backward(), 3);
  shard.reduce(0, {});
  EXPECT_EQ(shard.scatter()->sent_after_backward(), 0);
  EXPECT_EQ(failures_anywhere(slice_mismatches(shard, expected_average(params, {1, 1, 1, 1}))), 0);
  EXPECT_EQ(shard.gradient_bytes(), static_cast<std::uint64_t>(shard.slice_size()) * sizeof(float));
}

// Parameter 1 gets a second gradient after its bucket left (a second backward: an objective that
// runs one, or gradients given past the hooks), parameter 3 none (its
// bucket never completes, nobody sends it, its slice stays zero): what is left goes after the
// backward, alike on every rank.
TEST(GradientScatter, LateGradientsUnusedParametersAndMicroBatches) {
  auto params = make_params();
  auto shard = make_shard(params);
  shard.begin_step();
  loss_of(params, world_rank(), {0, 1, 2}).backward();
  loss_of(params, world_rank(), {1}).backward();
  shard.reduce(0, {});
  EXPECT_EQ(shard.scatter()->sent_in_backward(), 2);     // {35} and {13, 9}; {29} never completes
  EXPECT_EQ(shard.scatter()->sent_after_backward(), 1);  // {13, 9} again: parameter 1's second gradient
  EXPECT_EQ(failures_anywhere(slice_mismatches(shard, expected_average(params, {1, 2, 1, 0}))), 0);

  // Two micro-batches: every bucket leaves twice, the slice holds the sum.
  shard.begin_step();
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  shard.reduce(1, {});
  EXPECT_EQ(shard.scatter()->sent_in_backward(), 6);
  EXPECT_EQ(failures_anywhere(slice_mismatches(shard, expected_average(params, {2, 2, 2, 2}))), 0);
}

// A backward outside a step (a dmd generator's loss through the critic) sends nothing, and the
// next step drops what it left.
TEST(GradientScatter, HooksStayQuietOutsideAStep) {
  auto params = make_params();
  auto shard = make_shard(params);
  shard.begin_step();
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  shard.reduce(0, {});
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();  // not armed
  EXPECT_TRUE(params[0].grad().defined());
  shard.begin_step();
  EXPECT_FALSE(params[0].grad().defined());
  EXPECT_EQ(shard.scatter()->sent_in_backward(), 0);
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  shard.reduce(1, {});
  EXPECT_EQ(failures_anywhere(slice_mismatches(shard, expected_average(params, {1, 1, 1, 1}))), 0);
}

// The clip's norm is the norm of the whole averaged gradient, though each rank holds a slice.
TEST(GradientScatter, ClipUsesTheGlobalNorm) {
  auto params = make_params();
  auto shard = make_shard(params);
  shard.begin_step();
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  shard.reduce(0, {});
  const auto full = expected_average(params, {1, 1, 1, 1});
  const double norm = full.norm().item<double>();
  const double max_norm = norm / 4;
  const double got = shard.clip_grad_norm(max_norm, 0).item<double>();
  EXPECT_NEAR(got, norm, 1e-5 * norm);
  EXPECT_EQ(failures_anywhere(slice_mismatches(shard, full * (max_norm / (norm + 1e-6)))), 0);
  // Below the limit nothing changes.
  const auto before = shard.views().front().grad().clone();
  shard.clip_grad_norm(norm * 10, 0);
  EXPECT_TRUE(torch::equal(shard.views().front().grad(), before));
}

// Each rank updates its slice (a plain gradient step); the all-gather gives every rank the whole
// updated model.
TEST(GradientScatter, TheAllGatherHandsEveryRankTheWholeUpdate) {
  auto params = make_params();
  auto shard = make_shard(params);
  shard.begin_step();
  loss_of(params, world_rank(), {0, 1, 2, 3}).backward();
  shard.reduce(0, {});
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().reshape({-1}).clone());
  const auto expected = torch::cat(flat) - 0.1 * expected_average(params, {1, 1, 1, 1});
  {
    torch::NoGradGuard no_grad;
    for (const auto& v : shard.views()) v.sub_(0.1 * v.grad());
  }
  shard.gather(0);
  std::vector<torch::Tensor> now;
  for (const auto& p : params) now.push_back(p.detach().reshape({-1}));
  EXPECT_EQ(failures_anywhere(torch::allclose(torch::cat(now), expected, 1e-6, 1e-7) ? 0 : 1), 0);
}

}  // namespace
}  // namespace wd::student::test_gradient_scatter
