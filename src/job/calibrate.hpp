// The speed model's input for `plan` and `train --teacher.layout auto`: the teacher forward and
// the student training step of the job's shapes, timed on this host (or its GPU) with the
// intra-op threads a rank of the job would get, or FLOPs at given rates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "job/run_config.hpp"
#include "core/torch_compat.hpp"
#include "model/wan_config.hpp"
#include "plan/planner.hpp"
#include "plan/speed.hpp"

namespace wd::job {

struct Calibration {
  double teacher_s_per_sample = 0;  ///< forward in the teacher's compute dtype, the largest size whole
  /// (samples a forward, seconds per sample) for every size timed, largest first.
  std::vector<std::pair<std::int64_t, double>> teacher_by_size;
  double student_s_per_sample = 0;  ///< forward, loss, backward, clip and AdamW
  int threads = 1;                  ///< intra-op threads it ran with
};

/// Builds the teacher (random weights in `weights`, matmuls in `compute` when given) and the
/// student of `cfg` on the host, and times the teacher's forward over teacher_sizes.front()
/// samples in slices of each of `teacher_sizes` (plan::teacher_forward_sizes) and the
/// student's step on `batch` samples, of latent `latent` (`tokens` tokens) with `context_len`
/// text rows: one untimed run, then the median of at least three (of as many as fit in a
/// second). Nothing is read from disk.
Calibration calibrate_speed(const RunConfig& cfg, const WanConfig& teacher, c10::ScalarType weights,
                            std::optional<c10::ScalarType> compute, const std::array<std::int64_t, 4>& latent,
                            std::int64_t tokens, std::int64_t context_len, std::int64_t batch,
                            const std::vector<std::int64_t>& teacher_sizes, int threads,
                            const c10::Device& device = torch::kCPU);

/// What teacher.micro_batch auto chose.
struct MicroBatchChoice {
  std::int64_t samples = 0;         ///< samples a forward; 0 = the whole batch
  double seconds_per_sample = 0;    ///< the chosen schedule's measured forward time
  std::string reason;               ///< the log line: every size tried and its time
};

/// teacher.micro_batch auto: times the no-grad forward of the teacher `teacher` (random
/// weights in `weights`, matmuls in `compute`) on `device` with this thread's intra-op threads,
/// over a batch of `batch` samples run whole and in slices of its halvings (ceil: 4, 2, 1),
/// and takes the size plan::fastest_forward picks (the planner's rule).
MicroBatchChoice choose_micro_batch(const WanConfig& teacher, c10::ScalarType weights,
                                    std::optional<c10::ScalarType> compute, const std::array<std::int64_t, 4>& latent,
                                    std::int64_t context_len, std::int64_t batch, const c10::Device& device);

/// The speed model's input for `world` ranks: shapes from the memory plan's input; seconds per
/// sample from rates when both are given (GFLOP/s of one rank), else measured on `device` by
/// running the job's models (calibrate: yes; auto = when a teacher forward of one batch is
/// estimated under a minute; no), else the matmul rate of `device` (teacher::measure_matmul_rate: on a
/// GPU large products timed with CUDA events) times the fitted efficiencies.
/// On the host the ranks share `cores` (-1: this host's); on a GPU each has its own. No device
/// and no rates: no input (this host cannot tell a GPU's speed).
std::optional<plan::SpeedInput> speed_input(const RunConfig& cfg, const plan::PlanInput& in, const WanConfig& tc,
                                              c10::ScalarType weights, const std::array<std::int64_t, 4>& latent,
                                              int world, std::optional<c10::Device> device, int cores,
                                              double teacher_gflops, double student_gflops,
                                              Calibrate calibrate);

}  // namespace wd::job
