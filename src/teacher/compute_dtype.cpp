// teacher.compute: the measured choice between the weights' dtype and fp32.
#include "teacher/compute_dtype.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "core/errors.hpp"

namespace wd::teacher {

double matmul_gflops(c10::ScalarType dtype, const c10::Device& device) {
  constexpr std::int64_t kRows = 256, kIn = 512, kOut = 512;
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  const auto x = torch::randn({kRows, kIn}, options), w = torch::randn({kOut, kIn}, options);
  std::array<double, 3> seconds{};
  static_cast<void>(torch::linear(x, w));  // warm-up: kernel selection, allocator
  for (auto& s : seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = torch::linear(x, w);
    if (device.is_cuda()) static_cast<void>(y.sum().item<float>());  // wait for the kernel
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * kRows * kIn * kOut / std::max(seconds[1], 1e-9) / 1e9;
}

ComputeChoice choose_compute(TeacherCompute setting, c10::ScalarType weights, const c10::Device& device) {
  const std::string name = c10::toString(weights);
  if (setting == TeacherCompute::kWeights) return {std::nullopt, "teacher.compute weights: matmuls in " + name};
  if (setting == TeacherCompute::kFp32) {
    return {weights == torch::kFloat ? std::nullopt : std::optional<c10::ScalarType>(torch::kFloat),
            "teacher.compute fp32: matmuls in fp32 (weights stay " + name + ")"};
  }
  if (weights == torch::kFloat || !device.is_cpu()) {
    return {std::nullopt, "teacher.compute auto: matmuls in " + name + " on " + device.str()};
  }
  const double half = matmul_gflops(weights, device), full = matmul_gflops(torch::kFloat, device);
  const auto rates = fmt::format("{} matmul {:.1f} GFLOP/s, fp32 {:.1f} GFLOP/s on this CPU", name, half, full);
  if (full >= 1.5 * half) {
    return {torch::kFloat, "teacher.compute auto: matmuls in fp32, weights stay " + name + " (" + rates + ")"};
  }
  return {std::nullopt, "teacher.compute auto: matmuls in " + name + " (" + rates + ")"};
}

}  // namespace wd::teacher
