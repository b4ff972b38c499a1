// The CUDA side of block streaming for builds without the CUDA toolkit: make_cuda_copy_engine
// and make_cuda_direct_copy_engine refuse, the host registration reports that it cannot pin.
#include "core/errors.hpp"
#include "teacher/block_streamer.hpp"
#include "teacher/cuda_host.hpp"

namespace wd::teacher {

namespace {

[[noreturn]] void no_toolkit(const c10::Device& device) {
  throw ConfigError("teacher.placement(stream) on " + device.str() +
                    ": this build has no CUDA toolkit (configure with CUDA to stream to a GPU)");
}

}  // namespace

std::unique_ptr<CopyEngine> make_cuda_copy_engine(std::size_t, const c10::Device& device, double, int) {
  no_toolkit(device);
}

std::unique_ptr<CopyEngine> make_cuda_direct_copy_engine(std::size_t, const c10::Device& device) {
  no_toolkit(device);
}

bool cuda_host_register(void*, std::size_t, std::string& why) {
  why = "this build has no CUDA toolkit";
  return false;
}

void cuda_host_unregister(void*) noexcept {}

double measure_h2d_gbps(const c10::Device& device, std::uint64_t, int) { no_toolkit(device); }

}  // namespace wd::teacher
