// The matmul rate the speed model scales (plan, train --teacher.layout auto): teacher.compute's
// small product timed by the host clock on a CPU, large products timed with CUDA events on a GPU.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace wd::teacher {

/// One measurement of a device's matmul rate.
struct MatmulRate {
  double gflops = 0;
  std::int64_t rows = 0, inner = 0, cols = 0;  ///< the product timed: [rows x inner] x [inner x cols]
  bool device_clock = false;  ///< timed with CUDA events on the device; false: the host's steady clock
  /// "256x512x512 bf16 matmul, host clock" (for the log).
  std::string describe(c10::ScalarType dtype) const;
};

/// Square side of the GPU probe's products: 1.1 TFLOP each, milliseconds on a data-centre GPU,
/// so launch latency and the event resolution (~0.5 us) are well under 1% of the time.
inline constexpr std::int64_t kGpuProbeSide = 8192;

/// The matmul rate of `device` in `dtype`. On the host: matmul_gflops, the [256 x 512] x [512 x
/// 512] product with this thread's intra-op threads (the rate plan::kForwardEfficiency and
/// kTrainEfficiency were fitted on). On a CUDA device: kGpuProbeSide-square products, one
/// untimed run of four (kernel choice, allocator, clocks), then the median of three runs of four
/// timed with CUDA events; one small product timed on the host would measure launch latency,
/// about 100x under the rate.
MatmulRate measure_matmul_rate(c10::ScalarType dtype, const c10::Device& device);

}  // namespace wd::teacher
