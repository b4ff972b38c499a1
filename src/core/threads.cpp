#include "core/threads.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace wd {
namespace {

// Looked up at run time: the active libblas.so.3 may be the reference BLAS or BLIS instead.
using SetFn = void (*)(int);
using GetFn = int (*)();

SetFn openblas_set() { return reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")); }
GetFn openblas_get() { return reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads")); }
using ConfigFn = char* (*)();

}  // namespace

void set_intra_op_threads(int n) {
  torch::set_num_threads(n);
  if (const auto set = openblas_set()) set(n);
}

ScopedIntraOpThreads::ScopedIntraOpThreads(int n)
    : torch_before_(torch::get_num_threads()), blas_before_(openblas_threads()) {
  set_intra_op_threads(n);
}

ScopedIntraOpThreads::~ScopedIntraOpThreads() {
  torch::set_num_threads(torch_before_);
  if (const auto set = openblas_set(); set && blas_before_ > 0) set(blas_before_);
}

int openblas_threads() {
  const auto get = openblas_get();
  return get ? get() : 0;
}

std::string blas_config() {
  const auto config = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  return config ? std::string(config()) : "not loaded (libblas.so.3 is not OpenBLAS)";
}

std::string describe_blas_threads() {
  const int n = openblas_threads();
  return n > 0 ? fmt::format("OpenBLAS {} thread(s)", n) : std::string();
}

}  // namespace wd
