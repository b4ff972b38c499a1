// gpu_bus_id for builds with a CUDA LibTorch (no_cuda.cpp stands in elsewhere).
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <string>

#include "comm/backend_choice.hpp"

namespace wd::comm {

std::string gpu_bus_id(const c10::Device& device) {
  if (!device.is_cuda()) return "";
  try {
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    // A property query: no context is made on the device.
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), index) != cudaSuccess) {
      cudaGetLastError();  // clear it: the next CUDA call should see its own error, not this one
      return "";
    }
    return id;
  } catch (...) {
    return "";  // no device (current_device throws): the (host, index) rule applies
  }
}

}  // namespace wd::comm
