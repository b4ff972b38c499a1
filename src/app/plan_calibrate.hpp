// plan's speed calibration: one teacher forward and one student training step of the job's
// shapes, timed on this host with the intra-op threads a rank of the job would get.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "app/run_config.hpp"
#include "core/torch_compat.hpp"
#include "model/wan_config.hpp"

namespace wd::app {

struct Calibration {
  double teacher_s_per_sample = 0;  ///< forward in the teacher's compute dtype
  double student_s_per_sample = 0;  ///< forward, loss, backward, clip and AdamW
  int threads = 1;                  ///< intra-op threads it ran with
};

/// Builds the teacher (random weights in `weights`, matmuls in `compute` when given) and the
/// student of `cfg` on the host, and times each on `batch` samples of latent `latent` (`tokens`
/// tokens) with `context_len` text rows: one untimed run, then the median of at least three (of as many
/// as fit in a second). Nothing is read from disk.
Calibration calibrate_speed(const RunConfig& cfg, const WanConfig& teacher, c10::ScalarType weights,
                            std::optional<c10::ScalarType> compute, const std::array<std::int64_t, 4>& latent,
                            std::int64_t tokens, std::int64_t context_len, std::int64_t batch, int threads);

}  // namespace wd::app
