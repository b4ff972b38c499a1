// Batches as a teacher sends them to a student, for the one-process student tests.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "comm/message_spec.hpp"
#include "model/wan_config.hpp"

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

/// The small student these batches fit (text rows 5 of width 8), `in_dim` and `out_dim` latent
/// channels (the batches' teacher space has 4).
inline WanConfig small_student(std::int64_t in_dim = 4, std::int64_t out_dim = 4, std::int64_t dim = 32) {
  WanConfig c = WanConfig::preset("tiny");
  c.dim = dim;
  c.num_heads = 2;
  c.ffn_dim = 48;
  c.num_layers = 2;
  c.text_dim = 8;
  c.text_len = 5;
  c.freq_dim = 16;
  c.in_dim = in_dim;
  c.out_dim = out_dim;
  return c;
}

/// Samples [lo, hi) of every tensor of `d`.
inline comm::TensorDict slice(const comm::TensorDict& d, std::int64_t lo, std::int64_t hi) {
  comm::TensorDict out;
  for (const auto& [k, v] : d) out[k] = v.slice(0, lo, hi);
  return out;
}

}  // namespace wd::student::testing
