// The speed model's matmul probe: the host's small product, or a GPU's large ones timed with CUDA
// events.
#include "teacher/matmul_probe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "teacher/compute_dtype.hpp"

namespace wd::teacher {

std::string MatmulRate::describe(c10::ScalarType dtype) const {
  return fmt::format("{}x{}x{} {} matmul, {}", rows, inner, cols, c10::toString(dtype),
                     device_clock ? "CUDA events" : "host clock");
}

MatmulRate measure_matmul_rate(c10::ScalarType dtype, const c10::Device& device) {
  MatmulRate r;
  if (!device.is_cuda()) {
    // matmul_gflops's product (compute_dtype.cpp), kept as it is: the fitted efficiencies hold
    // for its rate.
    r.rows = 256;
    r.inner = 512;
    r.cols = 512;
    r.gflops = matmul_gflops(dtype, device);
    return r;
  }
  constexpr std::int64_t kProducts = 4;
  r.rows = r.inner = r.cols = kGpuProbeSide;
  r.device_clock = true;
  std::array<double, 4> seconds{};  // [0]: the warm-up, not counted
  {
    torch::NoGradGuard no_grad;
    const auto options = torch::TensorOptions().dtype(dtype).device(device);
    const auto a = torch::randn({kGpuProbeSide, kGpuProbeSide}, options);
    const auto b = torch::randn({kGpuProbeSide, kGpuProbeSide}, options);
    auto out = torch::empty({kGpuProbeSide, kGpuProbeSide}, options);
    const auto products = [&] {
      for (std::int64_t i = 0; i < kProducts; ++i) at::matmul_out(out, a, b);
    };
    for (auto& s : seconds) {
      const auto timed = compat::cuda_event_seconds(device, products);
      WD_CHECK(timed, "matmul probe: " << device.str() << " is a CUDA device, but this LibTorch has no CUDA");
      s = *timed;
    }
  }
  // The operands (0.4 GB in bf16, 0.8 in fp32) go back to the device rather than stay cached
  // for a job that has not loaded its models yet.
  compat::empty_device_cache(device);
  std::sort(seconds.begin() + 1, seconds.end());
  const double flops = 2.0 * static_cast<double>(kGpuProbeSide * kGpuProbeSide) * static_cast<double>(kGpuProbeSide) *
                       static_cast<double>(kProducts);
  r.gflops = flops / std::max(seconds[2], 1e-9) / 1e9;
  return r;
}

}  // namespace wd::teacher
