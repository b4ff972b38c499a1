// teacher.compute: the dtype the teacher's matmuls run in. bf16 weights halve the teacher's
// memory everywhere, but only some devices multiply bf16 quickly: a GPU does, a CPU without
// bf16 instructions emulates it (30x slower than fp32 with LibTorch 1.13 on an AVX2 CPU,
// bench/results/throughput.md). There the teacher keeps its bf16 weights and computes in fp32.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "core/choices.hpp"

namespace wd::teacher {

/// What teacher.compute decided for one device.
struct ComputeChoice {
  std::optional<c10::ScalarType> dtype;  ///< nullopt: the weights' dtype (spec §6)
  std::string reason;                    ///< for the log: the setting and the measured rates
};

/// Matmul rate in GFLOP/s of a [256 x 512] x [512 x 512] product in `dtype` on `device` with
/// this thread's intra-op threads (the median of 3 after one warm-up; about 0.3 s at worst).
double matmul_gflops(c10::ScalarType dtype, const c10::Device& device);

/// Decides teacher.compute for weights of dtype `weights` on
/// `device`. `auto` measures on a CPU with half-precision weights and picks fp32 when it runs
/// at least 1.5x the weights' dtype; it keeps the weights' dtype on a GPU and for fp32 weights.
ComputeChoice choose_compute(TeacherCompute setting, c10::ScalarType weights, const c10::Device& device);

}  // namespace wd::teacher
