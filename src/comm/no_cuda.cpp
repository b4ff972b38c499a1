// Builds without a CUDA LibTorch: the CUDA queries of src/comm answer "unknown".
#include "comm/backend_choice.hpp"

namespace wd::comm {

std::string gpu_bus_id(const c10::Device&) { return ""; }

}  // namespace wd::comm
