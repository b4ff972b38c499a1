// Batches as a teacher sends them to a student, for the one-process student tests.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "comm/message_spec.hpp"

namespace wd::student::testing {

/// A batch as the teacher sends it: teacher space has 4 channels, hidden width 24, 8 tokens.
inline comm::TensorDict batch(std::int64_t b, std::uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  return {{"x_t", torch::randn({b, 4, 2, 4, 4}, g)},
          {"t", torch::rand({b}, g) * 1000},
          {"context", torch::randn({b, 5, 8}, g)},
          {"context_lens", torch::full({b}, 5, torch::kLong)},
          {"teacher_out", torch::randn({b, 4, 2, 4, 4}, g)},
          {"feat.1", torch::randn({b, 8, 24}, g)}};
}

/// Samples [lo, hi) of every tensor of `d`.
inline comm::TensorDict slice(const comm::TensorDict& d, std::int64_t lo, std::int64_t hi) {
  comm::TensorDict out;
  for (const auto& [k, v] : d) out[k] = v.slice(0, lo, hi);
  return out;
}

}  // namespace wd::student::testing
