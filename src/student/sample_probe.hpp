// SampleProbe: during training, student rank 0 samples its student with the flow-matching
// sampler and checks the result for collapse against the teacher's outputs in a held-out batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/message_spec.hpp"
#include "student/student_config.hpp"
#include "student/student_parts.hpp"

namespace wd::student {

/// What one probe found. A ratio is the smallest over channels of the student's std over
/// the teacher reference's std.
struct SampleProbe {
  double final_ratio = 0;  ///< std of the sampled latents / std of the teacher's x0 estimate
  double moved_ratio = 0;  ///< std of (sampled − noise) / std of the teacher's velocity
  std::vector<std::int64_t> flat_channels;    ///< final_ratio below train.collapse_ratio
  std::vector<std::int64_t> static_channels;  ///< moved_ratio below train.collapse_ratio
  bool collapsed() const { return !flat_channels.empty() || !static_channels.empty(); }
};

/// Samples `parts` (train.sample_steps UniPC steps, Euler for train.objective trajectory; shift
/// train.sample_shift) from noise seeded
/// by train.seed, with the contexts of `batch` (a received batch: x_t, t, context,
/// context_lens, teacher_out). The references come from the same batch: the teacher's x0
/// estimate x_t − σ·teacher_out and its velocity teacher_out (σ = t / 1000, per sample; the
/// largest of a per-token row).
SampleProbe probe_sampling(StudentParts& parts, const comm::TensorDict& batch, const TrainConfig& train);

}  // namespace wd::student
