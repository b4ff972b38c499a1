// student_device: student.device resolved for one rank.
#include "student/student_device.hpp"

#include "core/errors.hpp"
#include "core/topology.hpp"
#include "core/torch_compat.hpp"

namespace wd::student {

c10::Device student_device(DeviceChoice setting, int local_rank) {
  if (setting == DeviceChoice::kCpu) return torch::kCPU;
  if (!compat::cuda_available()) {
    WD_CHECK_AS(ConfigError, setting == DeviceChoice::kAuto,
                "student.device(cuda): "
                    << (compat::kHasCuda ? "this rank sees no GPU (CUDA_VISIBLE_DEVICES, the driver)"
                                         : "this build's LibTorch has no CUDA")
                    << "; use student.device auto or cpu");
    return torch::kCPU;
  }
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(gpu_of_local_rank(local_rank, gpus))};
}

}  // namespace wd::student
