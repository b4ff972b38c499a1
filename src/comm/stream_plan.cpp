// The message layout of the teacher -> student stream.
#include "comm/stream_plan.hpp"

namespace wd::comm {

MessageSpec StreamPlan::message_spec() const {
  const auto b = batch_per_student;
  MessageSpec spec;
  spec.tensors.push_back({"x_t", torch::kFloat, {b, latent[0], latent[1], latent[2], latent[3]}});
  spec.tensors.push_back({"t", torch::kFloat,
                          per_token_seq_len > 0 ? std::vector<std::int64_t>{b, per_token_seq_len}
                                                : std::vector<std::int64_t>{b}});
  spec.tensors.push_back({"context", torch::kFloat, {b, context_len, text_dim}});
  spec.tensors.push_back({"context_lens", torch::kLong, {b}});
  spec.tensors.push_back(
      {"teacher_out", torch::kFloat, {b, out_channels, latent[1], latent[2], latent[3]}});
  if (start_states) spec.tensors.push_back({"x_start", torch::kFloat, {b, latent[0], latent[1], latent[2], latent[3]}});
  if (condition_channels > 0) {
    spec.tensors.push_back({"y", torch::kFloat, {b, condition_channels, latent[1], latent[2], latent[3]}});
  }
  for (const auto j : feature_blocks) {
    spec.tensors.push_back({"feat." + std::to_string(j), torch::kFloat, {b, tokens, teacher_dim}});
  }
  return spec;
}

}  // namespace wd::comm
