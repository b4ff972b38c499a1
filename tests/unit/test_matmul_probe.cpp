// The speed model's matmul probe: the host's small product by the host clock, a GPU's large
// products by CUDA events (gpu-review C5), and the compat timer that does nothing on the host.
#include <gtest/gtest.h>

#include "core/threads.hpp"
#include "core/torch_compat.hpp"
#include "teacher/matmul_probe.hpp"

namespace wd::teacher::test_matmul_probe {
namespace {

TEST(MatmulProbe, OnTheHostTimesTheSmallProductByTheHostClock) {
  const ScopedIntraOpThreads one(1);
  const auto r = measure_matmul_rate(torch::kFloat, torch::kCPU);
  EXPECT_FALSE(r.device_clock);
  EXPECT_EQ(r.rows, 256);
  EXPECT_EQ(r.inner, 512);
  EXPECT_EQ(r.cols, 512);
  EXPECT_EQ(r.describe(torch::kFloat), "256x512x512 Float matmul, host clock");
  // One core multiplies fp32 at 1-250 GFLOP/s (AVX2 to AVX-512 at 4 GHz); the bounds leave room
  // for a host shared with compilers.
  EXPECT_GT(r.gflops, 0.5);
  EXPECT_LT(r.gflops, 1000.0);
}

TEST(MatmulProbe, CudaEventTimerDoesNothingOffTheGpu) {
  bool ran = false;
  EXPECT_FALSE(compat::cuda_event_seconds(torch::Device(torch::kCPU), [&] { ran = true; }));
  EXPECT_FALSE(ran);
}

TEST(MatmulProbe, OnAGpuTimesLargeBf16ProductsWithCudaEvents) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto r = measure_matmul_rate(torch::kBFloat16, torch::Device(torch::kCUDA, 0));
  EXPECT_TRUE(r.device_clock);
  EXPECT_EQ(r.rows, kGpuProbeSide);
  // Tensor-core bf16: ~100 TFLOP/s (A10) to ~1000 (H100 dense spec 989); the host-timed small
  // product measured about 1% of that (launch latency).
  EXPECT_GT(r.gflops, 20'000.0) << r.describe(torch::kBFloat16);
  EXPECT_LT(r.gflops, 5'000'000.0) << r.describe(torch::kBFloat16);
  const auto fp32 = measure_matmul_rate(torch::kFloat, torch::Device(torch::kCUDA, 0));
  EXPECT_LT(fp32.gflops, r.gflops) << "fp32 " << fp32.gflops << " GFLOP/s";
}

}  // namespace
}  // namespace wd::teacher::test_matmul_probe
