// The distillation loss under sequence parallelism: each rank of a group scores the head's rows
// of its own tokens against the same rows of the teacher's output (docs/sequence-parallel.md).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>

#include "core/token_head_exchange.hpp"

namespace wd::student {

/// The tokens of a sample of `latent` [B,C,F,H,W] under `patch`: F/pt·H/ph·W/pw.
std::int64_t latent_tokens(const torch::Tensor& latent, const std::array<std::int64_t, 3>& patch);

/// Token rows [begin, end) of each sample of `latent` [B,C,F,H,W], as the DiT's head orders its
/// output: tokens f-major, then h, then w; features (pt, ph, pw, C). Rows at or past the
/// sample's F/pt·H/ph·W/pw tokens (the sequence-parallel padding) are zero. [B, end−begin, pt·ph·pw·C].
torch::Tensor latent_token_rows(const torch::Tensor& latent, const std::array<std::int64_t, 3>& patch,
                                std::int64_t begin, std::int64_t end);

/// This rank's share of distill_loss(prediction, teacher_out, weights) when `rows` are the head's
/// rows of its tokens (student_forward_tokens under `group`'s sequence parallelism): the squared
/// error of its rows, weighted by `weights` (frame_loss_weights; undefined: every element), over
/// the whole sample's normaliser, times the group's size N. The group's ranks together hold every
/// token once, so the gradients averaged over all student ranks (the reducer's average) are those
/// of the whole batch's loss, and so is the loss averaged over them; the padding counts nowhere.
torch::Tensor token_distill_loss(const torch::Tensor& rows, const torch::Tensor& teacher_out,
                                 const torch::Tensor& weights, const std::array<std::int64_t, 3>& patch,
                                 const TokenHeadExchange& group);

}  // namespace wd::student
