// WanDiT: the Wan 2.2 diffusion transformer (official `WanModel`) as a LibTorch module.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/token_head_exchange.hpp"
#include "model/wan_config.hpp"

namespace wd {

/// Inputs of one forward call, in the official list form (samples may differ in size).
struct WanInputs {
  std::vector<torch::Tensor> x;        ///< B × [in_dim (minus y's channels), F, H, W]
  std::vector<torch::Tensor> y;        ///< i2v only: B × [C_y, F, H, W], concatenated after x
  torch::Tensor t;                     ///< [B] per sample, or [B, S] per token (TI2V)
  std::vector<torch::Tensor> context;  ///< B × [L_b, text_dim], L_b <= text_len
  std::int64_t seq_len = 0;            ///< S; 0 = the largest token count of the batch
  /// Set by `batched`: the tensors the entries of x, y and context are views of. Where every
  /// entry still is `batch[b]` (x, y) or its leading rows (context), embed moves each batch to
  /// the model's device and dtype in one copy instead of one per sample; otherwise they are
  /// ignored. Undefined for inputs built as lists.
  torch::Tensor x_batch, y_batch, context_batch;
  /// Sequence parallelism (docs/sequence-parallel.md): null for none. Otherwise this rank is
  /// rank r of the exchange's group of N, which shares every sample of the batch: each sample is
  /// padded to S' = S rounded up to a multiple of N (the key mask keeps every real token from
  /// attending to the padding) and this rank holds tokens [r·S'/N, (r+1)·S'/N) through every
  /// block. Every rank of the group passes the same inputs. Not owned.
  TokenHeadExchange* sequence_parallel = nullptr;

  /// Builds the list form from batched tensors: x [B,C,F,H,W], context [B,L,text_dim] with
  /// `context_lens` [B] (rows past a sample's length are dropped; undefined = all L rows),
  /// and y [B,C_y,F,H,W] for i2v (undefined otherwise). A host `context_lens` is read without
  /// a device synchronisation; a device one costs one (counted by wd::note_host_sync).
  static WanInputs batched(const torch::Tensor& x, const torch::Tensor& t,
                           const torch::Tensor& context, const torch::Tensor& context_lens = {},
                           std::int64_t seq_len = 0, const torch::Tensor& y = {});
};

/// Intermediate tensors of a forward, captured on request (for golden tests and debugging).
struct WanTrace {
  torch::Tensor patch_tokens;  ///< [B,S,D] patch embedding, zero-padded to S
  torch::Tensor time_emb_e;    ///< [B,S,D] e
  torch::Tensor time_proj_e0;  ///< [B,S,6,D] e0 (before each block adds its modulation)
  torch::Tensor context_emb;   ///< [B,text_len,D]
  torch::Tensor block0_out;    ///< [B,S,D]
  torch::Tensor head_out;      ///< [B,S,patch·out_dim]
};

/// The hidden state between stages: what `embed` produces, each block updates and `unembed`
/// consumes. Pipeline stages and block streaming pass this between ranks / devices.
struct WanState {
  torch::Tensor x;         ///< [B,S,D] residual stream (fp32 after block 0's first add)
  torch::Tensor e;         ///< [B,1,D] (per-sample t) or [B,S,D] (per-token t) fp32 time embedding (head)
  torch::Tensor e0;        ///< [B,1,6,D] or [B,S,6,D] fp32 time projection (shared by all blocks)
  torch::Tensor context;   ///< [B,text_len,D] embedded text
  /// [B,S,1,d] fp32, each channel pair's cos twice; 1 on padded tokens (a view broadcast over B
  /// when every sample has the same patch grid)
  torch::Tensor rope_cos;
  torch::Tensor rope_sin;  ///< [B,S,1,d] fp32, each pair's (−sin, sin); 0 on padded tokens (likewise)
  /// [B,1,1,S] bool, true for a sample's real tokens; undefined when every sample has S tokens,
  /// so self-attention passes no mask and SDPA may pick its flash kernel.
  torch::Tensor key_mask;
  std::vector<std::array<std::int64_t, 3>> grids;  ///< per-sample patch grid (f,h,w)
  /// Sequence parallelism (WanInputs::sequence_parallel): x, e, e0 and the RoPE rows hold this
  /// rank's tokens [token_begin, token_begin + x.size(1)) of tokens_total (S', what key_mask
  /// spans); null, 0 and S without.
  TokenHeadExchange* sequence_parallel = nullptr;
  std::int64_t token_begin = 0;
  std::int64_t tokens_total = 0;
};

/// How a freshly built module's parameters are filled.
enum class WanInit {
  kEmpty,   ///< 0-element placeholders, to be bound to checkpoint tensors (no allocation)
  kRandom,  ///< the seeded scheme of the golden vectors (see wan_random_parameter)
};

/// The DiT. Parameter names equal the native state_dict keys. Weights may be fp32, bf16 or
/// fp16; compute follows spec §6: matmuls, attention and GELUs in the weight dtype, with fp32
/// islands for the sinusoid/time MLP, modulation, LayerNorms, RoPE (float64), residual stream
/// and head. With fp32 weights everything is fp32 and matches the official model.
class WanDiTImpl : public torch::nn::Module {
 public:
  explicit WanDiTImpl(WanConfig config, WanInit init = WanInit::kEmpty,
                      c10::ScalarType dtype = torch::kFloat, std::uint64_t seed = 0);

  const WanConfig& config() const { return config_; }
  /// Computes the matmuls and attention in `dtype` instead of the weights' dtype (weights are
  /// converted per call, so they stay stored as they are); nullopt restores spec §6. Used where
  /// the weight dtype's matmul is slow on this device (a bf16 teacher on a CPU without bf16
  /// instructions: teacher.compute).
  void set_compute_dtype(std::optional<c10::ScalarType> dtype) { compute_override_ = dtype; }
  /// Dtype of the weights (that of patch_embedding.weight).
  c10::ScalarType dtype() const;

  /// Full forward: list of B float32 tensors [out_dim, F, H, W]. Under sequence parallelism
  /// every rank of the group gets the whole output (the head's rows are gathered); for a loss
  /// over this rank's tokens only, use forward_tokens.
  std::vector<torch::Tensor> forward(const WanInputs& inputs, WanTrace* trace = nullptr);
  /// Forward to the head's rows of this rank's tokens, [B, S_local, patch_volume·out_dim] fp32
  /// (unembed_tokens). Without sequence parallelism S_local is S.
  torch::Tensor forward_tokens(const WanInputs& inputs);

  /// Stage 1: patch, time and text embeddings, RoPE tables and masks.
  WanState embed(const WanInputs& inputs, WanTrace* trace = nullptr);
  /// Stage 2: block `index` updates state.x in place of the old value.
  void run_block(std::int64_t index, WanState& state);
  /// Stage 3: head and unpatchify (under sequence parallelism the head's rows are gathered
  /// from the group first, so every rank returns the whole output).
  std::vector<torch::Tensor> unembed(const WanState& state, WanTrace* trace = nullptr);
  /// The head alone: [B, S_local, patch_volume·out_dim] fp32 rows of this rank's tokens, features
  /// ordered (pt, ph, pw, out_dim) as wan_patchify orders a latent's; rows past a sample's
  /// token count (padding) carry no meaning.
  torch::Tensor unembed_tokens(const WanState& state, WanTrace* trace = nullptr);
  /// The parameters of block `index` (`blocks.<index>.*`) that exist in this config, in a fixed
  /// order; the tensors run_block reads, so a caller can make them inputs of its own autograd node.
  std::vector<torch::Tensor> block_parameters(std::int64_t index) const;

  /// The float64 RoPE table for positions 0..1023 as (cos, sin), each [1024, head_dim/2], on
  /// the host; columns are the frame, height and width groups in that order.
  const torch::Tensor& rope_cos_table() const { return rope_cos_; }
  const torch::Tensor& rope_sin_table() const { return rope_sin_; }

  /// Replaces the tensor behind parameter `name` (a native key) without copying it; the
  /// shape must equal the config's. Used to bind memory-mapped checkpoint tensors.
  void bind_parameter(const std::string& name, const torch::Tensor& value);

  /// Adds fp32 adapters on spec.targets (on the weights' device): down drawn as LoRA's usual
  /// init (uniform ±1/sqrt(in), seeded per adapter), up zeros, so the model's output is unchanged
  /// until up trains. Registered as parameters `<linear>.lora_down` and `<linear>.lora_up`; the
  /// forward adds scale · up(down(x)) in the compute dtype. Once per module.
  void add_lora(const LoraSpec& spec, std::uint64_t seed);
  const LoraSpec& lora() const { return lora_; }
  /// The adapters as (name, tensor) in spec.targets order, down before up.
  std::vector<std::pair<std::string, torch::Tensor>> lora_parameters() const;
  /// True for an adapter's parameter name (`*.lora_down`, `*.lora_up`).
  static bool is_lora_name(const std::string& name);

 private:
  struct Linear {
    torch::Tensor weight, bias;
    torch::Tensor down, up;  ///< LoRA adapters (undefined without)
    double scale = 0;
  };
  struct Attention {
    Linear q, k, v, o;
    torch::Tensor norm_q, norm_k;  ///< undefined when qk_norm is off
  };
  struct Block {
    torch::Tensor modulation;
    Attention self_attn, cross_attn;
    torch::Tensor norm3_weight, norm3_bias;  ///< undefined when cross_attn_norm is off
    Linear ffn0, ffn2;
  };

  /// Registers `value` under its dotted native name, creating the child modules on the way.
  void register_native(const std::string& name, const torch::Tensor& value);
  c10::ScalarType compute_dtype() const;
  torch::Tensor linear(const torch::Tensor& x, const Linear& l) const;
  torch::Tensor linear_f32(const torch::Tensor& x, const Linear& l) const;
  torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight) const;
  torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight = {},
                           const torch::Tensor& bias = {}) const;
  /// The RoPE tables on `device`, copied there on first use and kept (the host tables are not
  /// parameters or buffers, so Module::to does not move them).
  std::pair<torch::Tensor, torch::Tensor> rope_tables_on(const c10::Device& device) const;
  torch::Tensor apply_rope(const torch::Tensor& x, const WanState& state) const;
  // The parts of `embed`, in its order: [B,S,D] patch tokens zero-padded to S; the [B,S,1,d]
  // RoPE cos/sin rows of each sample's grid (interleaved per channel); e and e0 of the timesteps; the embedded text.
  torch::Tensor embed_patches(const WanInputs& in, std::int64_t begin, std::int64_t end) const;
  std::pair<torch::Tensor, torch::Tensor> token_rope(const std::vector<std::array<std::int64_t, 3>>& grids,
                                                     std::int64_t S) const;
  std::pair<torch::Tensor, torch::Tensor> embed_time(const torch::Tensor& t, std::int64_t B, std::int64_t S) const;
  torch::Tensor embed_text(const WanInputs& in) const;
  torch::Tensor attention_qkv(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const WanState* masked_by) const;
  torch::Tensor self_attention(const torch::Tensor& x, const Attention& a, const WanState& s) const;
  /// Self-attention of q, k, v [B,S_local,n,d] (RoPE applied) across the sequence-parallel group:
  /// all-to-all to n/N heads of every token, attention, all-to-all back; [B,S_local,n·d].
  torch::Tensor split_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const WanState& s) const;
  torch::Tensor cross_attention(const torch::Tensor& x, const Attention& a, const WanState& s) const;

  WanConfig config_;
  torch::Tensor rope_cos_;
  torch::Tensor rope_sin_;
  mutable std::mutex rope_mutex_;  ///< guards rope_on_device_ (stages may share a module)
  mutable std::vector<std::pair<c10::Device, std::pair<torch::Tensor, torch::Tensor>>> rope_on_device_;
  std::optional<c10::ScalarType> compute_override_;
  std::unordered_map<std::string, torch::Tensor> params_;  ///< native name -> registered tensor
  torch::Tensor patch_weight_, patch_bias_, head_modulation_;
  Linear text0_, text2_, time0_, time2_, time_proj_, head_;
  std::vector<Block> blocks_;
  LoraSpec lora_;
  /// The block linear a native linear name (`blocks.3.self_attn.q`) names; throws for others.
  Linear& block_linear(const std::string& name);
};
TORCH_MODULE(WanDiT);

/// The value the random initialiser gives one parameter: modulation 0.1·N(0,1), biases
/// 0.05·N, norm gains 1 + 0.1·N, other weights N(0,1)/sqrt(fan_in). Deterministic per
/// (seed, parameter index), so a checkpoint can be generated one tensor at a time.
torch::Tensor wan_random_parameter(const ParamSpec& spec, std::size_t index, std::uint64_t seed,
                                   c10::ScalarType dtype);

/// Splits a latent tensor [C,F,H,W] into the per-token patch vectors [L, C·pt·ph·pw] in the
/// order of the Conv3d weight (C, pt, ph, pw), tokens f-major then h then w.
torch::Tensor wan_patchify(const torch::Tensor& latent, const std::array<std::int64_t, 3>& patch);

}  // namespace wd
