// Where a student rank trains (student.device = auto | cpu | cuda).
#pragma once

#include <torch/torch.h>

#include "core/choices.hpp"

namespace wd::student {

/// The device of a student rank with node-local rank `local_rank`. cpu: the host. cuda:
/// cuda:<gpu_of_local_rank(local_rank, GPUs)>, a ConfigError where this LibTorch has no CUDA or
/// the rank sees no GPU. auto: as cuda where a GPU is usable, the host otherwise.
c10::Device student_device(DeviceChoice setting, int local_rank);

}  // namespace wd::student
