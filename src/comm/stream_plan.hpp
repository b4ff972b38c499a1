// StreamPlan: what flows from a teacher replica to each student, computed alike on every rank.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "comm/message_spec.hpp"

namespace wd::comm {

/// The teacher -> student stream of one run: first `eval_messages` held-out batches (kept by
/// the students for every evaluation), then `micro_batches` batches per optimizer step.
/// Transport steps are numbered in that order.
struct StreamPlan {
  std::int64_t batch_per_student = 0;  ///< b
  std::int64_t eval_messages = 0;      ///< E
  std::int64_t train_steps = 0;        ///< N optimizer steps (in all, counting resumed ones)
  std::int64_t first_step = 0;         ///< optimizer steps done before this run (a resume)
  std::int64_t micro_batches = 1;      ///< batches per optimizer step (train.grad_accum)
  std::array<std::int64_t, 4> latent{};   ///< C, F, H, W of the inputs (x_t)
  std::int64_t out_channels = 0;          ///< channels of teacher_out
  std::int64_t context_len = 0;           ///< L (context rows sent, zero-padded)
  std::int64_t text_dim = 0;
  std::int64_t per_token_seq_len = 0;     ///< > 0: t is [b,S] per token; 0: t is [b]
  /// > 0: an i2v teacher's image condition y [b, condition_channels, F, H, W] (its mask and image
  /// latent channels) goes with every message, for the students' forwards.
  std::int64_t condition_channels = 0;
  /// Teacher blocks whose hidden states are sent as `feat.<block>` [b, tokens, teacher_dim].
  std::vector<std::int64_t> feature_blocks;
  std::int64_t tokens = 0;       ///< tokens per sample
  std::int64_t teacher_dim = 0;  ///< hidden width of the teacher
  /// train.trajectory_rollout: each sample's trajectory noise is sent as `x_start` [b,C,F,H,W].
  bool start_states = false;
  /// false: a training message's teacher_out is not computed and left zero (train.objective dmd
  /// without a regression term reads only the contexts, and x_t with dmd_start data; its teacher
  /// spends its forwards on the real-score requests). Held-out messages always carry it.
  bool train_targets = true;
  /// Students ask their teacher for scores at their own samples, over a request channel beside
  /// the stream (train.objective dmd's real score).
  bool score_requests = false;

  std::int64_t end_step() const { return eval_messages + (train_steps - first_step) * micro_batches; }
  /// Transport step of micro-batch `micro` of optimizer step `train_step` (>= first_step).
  std::int64_t transport_step(std::int64_t train_step, std::int64_t micro = 0) const {
    return eval_messages + (train_step - first_step) * micro_batches + micro;
  }
  /// The optimizer step whose first micro-batch is transport step `step`; -1 for a held-out
  /// message or a later micro-batch.
  std::int64_t train_step_starting_at(std::int64_t step) const {
    const auto offset = step - eval_messages;
    if (offset < 0 || offset % micro_batches != 0) return -1;
    return first_step + offset / micro_batches;
  }
  /// Tensors of one student message: x_t, t, context, context_lens, teacher_out, feat.<j>,
  /// x_start when start_states, and y when condition_channels.
  MessageSpec message_spec() const;
};

}  // namespace wd::comm
