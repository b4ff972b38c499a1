// Gradient checkpointing of WanDiT blocks: the policy (`student.checkpointing`) and the student
// forward that applies it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/wan_dit.hpp"
#include "core/checkpoint_policy.hpp"

namespace wd::student {

/// Where a block's parameters come from when a rank does not hold them between uses
/// (`student.shard parameters`, ZeRO-3). enter(i) makes block i's parameters whole before the
/// block runs (its forward, or its recomputation in the backward) and lets go of any other
/// block's; leave(i) lets go of them after a forward. A backward enters the blocks in reverse and
/// never leaves: the engine has handed a block's gradients to their accumulators before it runs
/// the node of the block before (accumulators run first), so the next enter() may let go of it.
/// rest() lets go of whatever is still held.
class BlockGate {
 public:
  virtual ~BlockGate() = default;
  virtual void enter(std::int64_t block) = 0;
  virtual void leave(std::int64_t block) = 0;
  virtual void rest() = 0;
};

/// Runs block `index` of `model` on `state` like WanDiT::run_block, as one autograd node that
/// keeps only the block's inputs (state.x, e0, context) and recomputes the block in the backward
/// (entering `gate` first, when given).
void run_block_checkpointed(WanDiT& model, std::int64_t index, WanState& state, BlockGate* gate = nullptr);

/// embed → blocks → unembed, checkpointing the blocks `policy` names while grad mode is on (under
/// no-grad there is nothing to save, so every block runs plainly). The policy may change between
/// calls. When `hidden` is given, the hidden state after each block whose index is a key of it
/// is stored there (feature distillation). With a `gate`, every block is entered before it runs
/// and left after (student.shard parameters).
std::vector<torch::Tensor> student_forward(WanDiT& model, const WanInputs& in,
                                           const CheckpointPolicy& policy,
                                           std::map<std::int64_t, torch::Tensor>* hidden = nullptr,
                                           BlockGate* gate = nullptr);

/// student_forward up to the head's rows of this rank's tokens, [B, S_local, patch_volume·out_dim]
/// fp32 (WanDiT::unembed_tokens): under sequence parallelism (in.sequence_parallel) nothing is
/// gathered, so each rank's loss covers its own rows (the training path).
torch::Tensor student_forward_tokens(WanDiT& model, const WanInputs& in, const CheckpointPolicy& policy,
                                     std::map<std::int64_t, torch::Tensor>* hidden = nullptr,
                                     BlockGate* gate = nullptr);

}  // namespace wd::student
