// student.shard parameters on 2, 3 and 4 ranks: ParameterGather's units against the parameters
// every rank starts from (the same seed), and a checkpointed two-block model whose loss, gradients
// and update with its weights gathered for each use equal those of the whole model.
#include <gtest/gtest.h>

#include <vector>

#include "mpi_test_util.hpp"
#include "student/optimizer_shard.hpp"

namespace wd::student::test_parameter_gather {
namespace {

using test::world_rank;
using test::failures_anywhere;
using test::world_size;

// Root {5}, block 0 {7x5, 13}, root {3x3}, block 1 {29}, root {2}: 93 elements, so blocks and the
// root cross the slices of every group size; 4 ranks pad the last slice.
const std::vector<std::vector<std::int64_t>> kShapes{{5}, {7, 5}, {13}, {3, 3}, {29}, {2}};
const std::vector<std::vector<std::size_t>> kBlocks{{1, 2}, {4}};
constexpr std::int64_t kTotal = 93;

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(11);  // the same start on every rank
  std::vector<torch::Tensor> params;
  for (const auto& shape : kShapes) params.push_back(torch::randn(shape).requires_grad_(true));
  return params;
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

OptimizerShard make_shard(std::vector<torch::Tensor>& params) {
  return OptimizerShard(MPI_COMM_WORLD, params, /*bucket_bytes=*/64, 30.0, world_rank(), nullptr, kBlocks);
}

TEST(ParameterGather, BlocksAreLetGoAndGatheredWholeTheRootStays) {
  auto params = make_params();
  const auto start = copies(params);
  auto shard = make_shard(params);
  auto* gate = shard.gate();
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->block_count(), 2u);
  EXPECT_EQ(gate->root_parameters(), 5 + 9 + 2);
  EXPECT_EQ(shard.parameter_count(), kTotal);
  const auto slice = (kTotal + world_size() - 1) / world_size();
  EXPECT_EQ(shard.weight_bytes(), static_cast<std::uint64_t>(4 * (slice + 16)));
  int bad = 0;
  // At rest: the blocks hold nothing, the root is whole.
  for (const auto i : {1, 2, 4}) bad += params[i].numel() == 0 ? 0 : 1;
  for (const auto i : {0, 3, 5}) bad += torch::equal(params[i].detach(), start[i]) ? 0 : 1;
  gate->enter(0);
  for (const auto i : {1, 2}) bad += torch::equal(params[i].detach(), start[i]) ? 0 : 1;
  gate->enter(1);  // lets go of block 0
  bad += params[1].numel() == 0 && params[2].numel() == 0 ? 0 : 1;
  bad += torch::equal(params[4].detach(), start[4]) ? 0 : 1;
  gate->leave(1);
  bad += params[4].numel() == 0 ? 0 : 1;
  gate->gather_all();
  for (std::size_t i = 0; i < params.size(); ++i) bad += torch::equal(params[i].detach(), start[i]) ? 0 : 1;
  gate->rest();
  EXPECT_EQ(gate->gathers(), 4);
  EXPECT_EQ(failures_anywhere(bad), 0);
}

// A step's update of the slices reaches the next gather: each rank adds (its rank + 1) to the
// elements it owns; the root is refreshed after the step, a block at its next use.
TEST(ParameterGather, TheUpdatedSlicesAreWhatTheNextGatherHands) {
  auto params = make_params();
  const auto start = copies(params);
  auto shard = make_shard(params);
  torch::NoGradGuard no_grad;
  for (auto& v : shard.views()) v.add_(static_cast<float>(world_rank() + 1));
  shard.gather(0);
  shard.gate()->gather_all();
  // Element e of the flat layout belongs to rank e / slice.
  const auto slice = shard.slice_size();
  int bad = 0;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto want = start[i].reshape({-1}).clone();
    for (std::int64_t e = 0; e < want.numel(); ++e) want[e] += static_cast<float>((offset + e) / slice + 1);
    bad += torch::equal(params[i].detach().reshape({-1}), want) ? 0 : 1;
    offset += want.numel();
  }
  shard.gate()->rest();
  EXPECT_EQ(failures_anywhere(bad), 0);
}

/// Rank r's loss of a two-"block" chain: y = tanh(W1·x + b1), z = Σy · Σw4,
/// loss = ½(z·(r+1))² plus the root parameters' own terms.
torch::Tensor chain_loss(std::vector<torch::Tensor>& params) {
  auto x = torch::linspace(-1, 1, 5).reshape({1, 5});
  auto y = torch::tanh(torch::matmul(x, params[1].t()) + params[2].narrow(0, 0, 7));  // [1,7]
  auto z = y.sum() * params[4].sum();
  const double scale = world_rank() + 1;
  return 0.5 * (z * scale).pow(2) + params[0].pow(2).sum() + params[3].sum() * params[5].sum();
}

// Gradients of a backward through gathered blocks reach the slices as those of the whole model
// do: the scatter's hooks sit on accumulators made while the parameters were whole, and a block
// gathered later is a new tensor behind the same parameter. (The launch tests run the gate
// inside checkpointed blocks.)
TEST(ParameterGather, GradientsOfGatheredBlocksReachTheSlices) {
  auto whole = make_params();
  auto whole_shard = OptimizerShard(MPI_COMM_WORLD, whole, 64, 30.0, world_rank(), nullptr);
  whole_shard.begin_step();
  chain_loss(whole).backward();
  whole_shard.reduce(0, {});

  auto params = make_params();
  auto shard = make_shard(params);
  shard.begin_step();
  shard.gate()->gather_all();  // a plain forward keeps both blocks' graphs: both held across it
  chain_loss(params).backward();
  shard.gate()->rest();
  shard.reduce(0, {});
  int bad = 0;
  for (std::size_t k = 0; k < shard.views().size(); ++k) {
    bad += torch::allclose(shard.views()[k].grad(), whole_shard.views()[k].grad(), 1e-6, 1e-7) ? 0 : 1;
    bad += torch::equal(shard.views()[k].detach(), whole_shard.views()[k].detach()) ? 0 : 1;
  }
  EXPECT_EQ(failures_anywhere(bad), 0);
}

}  // namespace
}  // namespace wd::student::test_parameter_gather
