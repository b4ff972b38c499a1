// The logic of the GPU code paths, run on the host (issue 23): where message tensors go, the
// device a rank makes current, and the gradient clipping that reads nothing on the host.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/host_sync.hpp"
#include "core/torch_compat.hpp"
#include "student/train_step.hpp"
#include "teacher/target_source.hpp"

namespace test_gpu_paths {
namespace {

using namespace wd;

comm::TensorDict message() {
  return {{"x_t", torch::randn({2, 4, 1, 2, 2})},
          {"t", torch::rand({2})},
          {"context", torch::randn({2, 3, 8})},
          {"context_lens", torch::tensor({3, 2}, torch::kLong)},
          {"teacher_out", torch::randn({2, 4, 1, 2, 2})},
          {"feat.1", torch::randn({2, 4, 16})}};
}

// The meta device stands in for a GPU: a device that is not the host, on every machine.
TEST(ColocatedMessage, EveryTensorGoesToTheStudentsDeviceButTheLengths) {
  const auto moved = teacher::message_on_device(message(), c10::Device(c10::kMeta));
  ASSERT_EQ(moved.size(), message().size());
  for (const auto& [name, t] : moved) {
    if (name == "context_lens") {
      EXPECT_TRUE(t.device().is_cpu()) << name;
    } else {
      EXPECT_EQ(t.device().type(), c10::kMeta) << name;
    }
  }
}

TEST(ColocatedMessage, OnTheHostItIsTheSameValues) {
  const auto m = message();
  const auto moved = teacher::message_on_device(m, torch::kCPU);
  for (const auto& [name, t] : m) EXPECT_TRUE(torch::equal(moved.at(name), t)) << name;
}

TEST(CurrentDevice, TheHostChangesNothing) {
  const int before = compat::current_cuda_device();
  compat::set_current_device(torch::kCPU);
  EXPECT_EQ(compat::current_cuda_device(), before);
}

std::vector<torch::Tensor> params_with_grads(std::uint64_t seed, double grad_scale) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> params;
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{7, 5}, {5}, {3, 3, 2}}) {
    auto p = torch::randn(shape, gen).requires_grad_();
    p.mutable_grad() = torch::randn(shape, gen) * grad_scale;
    params.push_back(p);
  }
  params.push_back(torch::zeros({2}).requires_grad_());  // no grad: skipped, as LibTorch does
  return params;
}

// Bit for bit LibTorch's clip_grad_norm_, whether the norm is above the limit or not, with no
// counted host synchronisation.
TEST(ClipGradNorm, IsLibTorchsWithoutTheHostRead) {
  for (const double scale : {0.01, 10.0}) {
    auto ours = params_with_grads(7, scale);
    auto theirs = params_with_grads(7, scale);
    const auto syncs = host_sync_count();
    const auto norm = student::clip_grad_norm(ours, 1.0);
    EXPECT_EQ(host_sync_count(), syncs);
    const double expected = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
    EXPECT_EQ(norm.item<double>(), expected) << scale;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      if (!theirs[i].grad().defined()) {
        EXPECT_FALSE(ours[i].grad().defined());
        continue;
      }
      EXPECT_TRUE(torch::equal(ours[i].grad(), theirs[i].grad())) << "tensor " << i << " scale " << scale;
    }
  }
}

// The fused AdamW that CUDA students use, run here on the host (LibTorch 2.x has a CPU kernel
// too), against the per-parameter update the host keeps: the same moments, step counts and
// parameters to float rounding, so checkpoints and resume see one optimizer.
TEST(FusedAdamW, FollowsThePerParameterUpdate) {
  if (!compat::fused_adamw_step_available()) GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no fused AdamW";
  auto fused = params_with_grads(3, 1.0);
  auto plain = params_with_grads(3, 1.0);
  const auto options = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).weight_decay(0.1);
  torch::optim::AdamW a(fused, options), b(plain, options);
  auto gen = at::detail::createCPUGenerator(11);
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i + 1 < fused.size(); ++i) {
      const auto g = torch::randn(fused[i].sizes(), gen);
      fused[i].mutable_grad().copy_(g);
      plain[i].mutable_grad().copy_(g);
    }
    ASSERT_TRUE(compat::fused_adamw_step(a, /*force=*/true));
    b.step();
  }
  for (std::size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(torch::allclose(fused[i], plain[i], 1e-5, 1e-6)) << "parameter " << i;
    const auto key = compat::optimizer_state_key(fused[i]);
    const auto found = a.state().find(key);
    if (i + 1 == fused.size()) {
      EXPECT_TRUE(found == a.state().end()) << "a parameter without a gradient gets no state";
      continue;
    }
    const auto& sa = static_cast<torch::optim::AdamWParamState&>(*found->second);
    const auto& sb = static_cast<torch::optim::AdamWParamState&>(*b.state().at(compat::optimizer_state_key(plain[i])));
    EXPECT_EQ(sa.step(), 5);
    EXPECT_EQ(sa.step(), sb.step());
    EXPECT_TRUE(torch::allclose(sa.exp_avg(), sb.exp_avg(), 1e-5, 1e-7));
    EXPECT_TRUE(torch::allclose(sa.exp_avg_sq(), sb.exp_avg_sq(), 1e-5, 1e-7));
  }
}

TEST(FusedAdamW, HostParametersKeepThePerParameterUpdate) {
  auto params = params_with_grads(5, 1.0);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  EXPECT_FALSE(compat::fused_adamw_step(opt));
  EXPECT_TRUE(opt.state().empty());
}

}  // namespace

}  // namespace test_gpu_paths
