// Gradient checkpointing: a custom autograd function around one WanDiT block, and its policy.
#include "student/checkpointing.hpp"

#include <torch/csrc/autograd/custom_function.h>


#include "core/errors.hpp"
#include "core/torch_compat.hpp"

namespace wd::student {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What a checkpointed block needs in its backward besides its differentiable inputs: the module
/// (a shared handle, so it outlives the graph), the block index, the state that carries no
/// gradient (captured by value: RoPE tables, key mask, grids, the sequence-parallel group and
/// this rank's token span) and the RNG states of the forward.
struct BlockReplay : torch::CustomClassHolder {
  BlockReplay(WanDiT m, std::int64_t i, const WanState& s, BlockGate* g)
      : model(std::move(m)), index(i), rope_cos(s.rope_cos), rope_sin(s.rope_sin),
        key_mask(s.key_mask), grids(s.grids), sequence_parallel(s.sequence_parallel), token_begin(s.token_begin),
        tokens_total(s.tokens_total), gate(g) {}

  /// The state run_block reads, around the given differentiable inputs.
  WanState state(const torch::Tensor& x, const torch::Tensor& e0, const torch::Tensor& context) const {
    WanState s;
    s.x = x;
    s.e0 = e0;
    s.context = context;
    s.rope_cos = rope_cos;
    s.rope_sin = rope_sin;
    s.key_mask = key_mask;
    s.grids = grids;
    // The recomputation repeats the block's all-to-alls: every rank of the group recomputes the
    // same blocks in the same order (the backward runs the blocks in reverse on each of them).
    s.sequence_parallel = sequence_parallel;
    s.token_begin = token_begin;
    s.tokens_total = tokens_total;
    return s;
  }

  WanDiT model;
  std::int64_t index;
  torch::Tensor rope_cos, rope_sin, key_mask;
  std::vector<std::array<std::int64_t, 3>> grids;
  TokenHeadExchange* sequence_parallel;
  std::int64_t token_begin, tokens_total;
  BlockGate* gate;  ///< student.shard parameters: makes the block whole again for the recomputation
  compat::RngSnapshot rng;
};

/// Puts the generators into the forward's states for the recomputation and back afterwards, so
/// the recomputation draws what the forward drew and the caller's stream is left as it was.
class RngReplay {
 public:
  explicit RngReplay(const compat::RngSnapshot& forward) : outer_(compat::rng_snapshot(forward.device)) {
    compat::rng_restore(forward);
  }
  ~RngReplay() {
    try {
      compat::rng_restore(outer_);
    } catch (...) {  // a destructor must not throw; a failed restore only perturbs later draws
    }
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  compat::RngSnapshot outer_;
};

constexpr std::size_t kStateInputs = 3;  // x, e0, context; the block's parameters follow

/// One block as one autograd node. Its inputs are x, e0, context and the block's parameters, so
/// the engine routes their gradients (into earlier nodes for non-leaf inputs, into .grad for
/// parameters); only the inputs are kept, the activations are recomputed in backward.
class CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& e0,
                               const torch::Tensor& context, at::TensorList params,
                               c10::intrusive_ptr<BlockReplay> replay) {
    // Function::apply runs this under no-grad: the block builds no graph and its activations
    // are freed as soon as they are used.
    replay->rng = compat::rng_snapshot(x.device());
    auto s = replay->state(x, e0, context);
    replay->model->run_block(replay->index, s);
    variable_list keep{x, e0, context};
    // Saving the parameters too makes the engine refuse a backward after they changed in place
    // (an optimizer step between forward and backward), which would recompute something else.
    keep.insert(keep.end(), params.begin(), params.end());
    ctx->save_for_backward(std::move(keep));
    // saved_data holds IValues; a capsule is the IValue that carries a plain C++ object.
    ctx->saved_data["replay"] = at::IValue::make_capsule(std::move(replay));
    return s.x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto holder = ctx->saved_data.at("replay").toCapsule();
    auto& replay = static_cast<BlockReplay&>(*holder);
    if (replay.gate) replay.gate->enter(replay.index);
    // run_block reads the module's own parameter tensors, so those are what to differentiate by.
    const auto params = replay.model->block_parameters(replay.index);
    WD_CHECK(params.size() + kStateInputs == saved.size(),
             "checkpointed block " << replay.index << " saved " << saved.size() - kStateInputs
                                   << " parameters, the block has " << params.size());

    // Detached copies end the recomputed graph at the block's inputs: the backward through it
    // stops there and hands their gradients to the engine, which carries them further.
    variable_list inputs(kStateInputs);
    variable_list wrt;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < kStateInputs; ++i) {
      inputs[i] = saved[i].detach();
      if (ctx->needs_input_grad(i)) {
        inputs[i].requires_grad_(true);
        wrt.push_back(inputs[i]);
        where.push_back(i);
      }
    }
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (ctx->needs_input_grad(kStateInputs + p)) {
        wrt.push_back(params[p]);
        where.push_back(kStateInputs + p);
      }
    }
    variable_list result(saved.size() + 1);  // one per forward argument; `replay` gets none
    if (wrt.empty()) return result;

    torch::Tensor y;
    {
      RngReplay rng(replay.rng);
      torch::AutoGradMode grad_on(true);  // the engine runs backward with grad mode off
      auto s = replay.state(inputs[0], inputs[1], inputs[2]);
      replay.model->run_block(replay.index, s);
      y = s.x;
    }
    auto grads = torch::autograd::grad({y}, wrt, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t k = 0; k < where.size(); ++k) result[where[k]] = std::move(grads[k]);
    return result;
  }
};

}  // namespace


void run_block_checkpointed(WanDiT& model, std::int64_t index, WanState& state, BlockGate* gate) {
  auto replay = c10::make_intrusive<BlockReplay>(model, index, state, gate);
  const auto params = model->block_parameters(index);
  state.x = CheckpointedBlock::apply(state.x, state.e0, state.context, at::TensorList(params),
                                     std::move(replay));
}

namespace {

/// embed and the blocks of student_forward, up to the head.
WanState run_student_blocks(WanDiT& model, const WanInputs& in, const CheckpointPolicy& policy,
                            std::map<std::int64_t, torch::Tensor>* hidden, BlockGate* gate) {
  auto state = model->embed(in);
  const bool recording = torch::GradMode::is_enabled();
  for (std::int64_t i = 0; i < model->config().num_layers; ++i) {
    // A gate lets go of a block after its forward: its backward must recompute it.
    WD_CHECK(!gate || !recording || policy.applies(i),
             "block " << i << " runs with its graph but is not checkpointed (student.checkpointing "
                      << policy.str() << "); student.shard parameters needs student.checkpointing all");
    if (gate) gate->enter(i);
    if (recording && policy.applies(i)) {
      run_block_checkpointed(model, i, state, gate);
    } else {
      model->run_block(i, state);
    }
    if (gate) gate->leave(i);
    if (hidden && hidden->count(i)) (*hidden)[i] = state.x;
  }
  return state;
}

}  // namespace

std::vector<torch::Tensor> student_forward(WanDiT& model, const WanInputs& in,
                                           const CheckpointPolicy& policy,
                                           std::map<std::int64_t, torch::Tensor>* hidden, BlockGate* gate) {
  return model->unembed(run_student_blocks(model, in, policy, hidden, gate));
}

torch::Tensor student_forward_tokens(WanDiT& model, const WanInputs& in, const CheckpointPolicy& policy,
                                     std::map<std::int64_t, torch::Tensor>* hidden, BlockGate* gate) {
  return model->unembed_tokens(run_student_blocks(model, in, policy, hidden, gate));
}

}  // namespace wd::student
