// make_cuda_copy_engine for builds without the CUDA toolkit.
#include "core/errors.hpp"
#include "teacher/block_streamer.hpp"

namespace wd::teacher {

std::unique_ptr<CopyEngine> make_cuda_copy_engine(std::size_t, const c10::Device& device, double) {
  throw ConfigError("teacher.placement(stream) on " + device.str() +
                    ": this build has no CUDA toolkit (configure with CUDA to stream to a GPU)");
}

}  // namespace wd::teacher
