// Measuring one rank's memory and counting the bytes of the student's categories.
#include "memory/memory_report.hpp"

#include "memory/host_memory.hpp"

namespace wd::memory {

namespace {

std::uint64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? static_cast<std::uint64_t>(t.nbytes()) : 0;
}

template <typename State>
bool add_state(const torch::optim::OptimizerParamState& s, std::uint64_t& sum) {
  const auto* state = dynamic_cast<const State*>(&s);
  if (!state) return false;
  sum += bytes_of(state->exp_avg()) + bytes_of(state->exp_avg_sq()) + bytes_of(state->max_exp_avg_sq());
  return true;
}

}  // namespace

MemoryReport measure_memory(Role role, const c10::Device& device, const ModelMemory& model) {
  MemoryReport r;
  r.role = role;
  const auto host = host_memory();
  r.rss_bytes = host.rss_bytes;
  r.peak_rss_bytes = host.peak_rss_bytes;
  r.host_total_bytes = host_total_bytes();
  r.device = compat::device_memory(device);
  r.model = model;
  return r;
}

std::uint64_t tensor_bytes(const std::vector<torch::Tensor>& tensors) {
  std::uint64_t sum = 0;
  for (const auto& t : tensors) sum += bytes_of(t);
  return sum;
}

std::uint64_t grad_bytes(const std::vector<torch::Tensor>& params) {
  std::uint64_t sum = 0;
  for (const auto& p : params) sum += bytes_of(p.grad());
  return sum;
}

std::uint64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::uint64_t sum = 0;
  for (const auto& entry : optimizer.state()) {
    // The step counter is a plain integer in LibTorch's C++ Adam/AdamW state: only the three
    // moment tensors take memory.
    if (!add_state<torch::optim::AdamWParamState>(*entry.second, sum)) {
      add_state<torch::optim::AdamParamState>(*entry.second, sum);
    }
  }
  return sum;
}

}  // namespace wd::memory
