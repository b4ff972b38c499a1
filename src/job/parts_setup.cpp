// The student parts' set-up from the run config (parts_setup.hpp).
#include "job/parts_setup.hpp"

namespace wd::job {

student::PartsSetup parts_setup(const RunConfig& cfg, std::int64_t in_channels, std::int64_t out_channels,
                                std::int64_t teacher_dim, const c10::Device& device) {
  student::PartsSetup setup;
  setup.teacher_in_channels = in_channels;
  setup.teacher_out_channels = out_channels;
  setup.teacher_dim = teacher_dim;
  setup.feature_pairs = cfg.student.feature_pairs();
  setup.feature_weight = cfg.student.feature_weight;
  setup.train_projections = cfg.student.projection == Projection::kTrained;
  setup.mixed_bf16 = cfg.student.precision == Precision::kBf16Mixed;
  setup.seed = cfg.train.seed;
  setup.device = device;
  return setup;
}

}  // namespace wd::job
