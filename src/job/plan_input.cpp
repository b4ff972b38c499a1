// PlanInput from the run config and what is known of the teacher, the data and the machine.
#include "job/plan_input.hpp"

#include <algorithm>

#include "comm/process_groups.hpp"
#include "comm/stream_plan.hpp"
#include "core/torch_compat.hpp"
#include "model/image_condition.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "objective/dmd.hpp"
#include "plan/speed.hpp"
#include "student/checkpointing.hpp"
#include "teacher/placement.hpp"

namespace wd::job {

namespace {

std::int64_t elem_bytes(c10::ScalarType t) { return static_cast<std::int64_t>(c10::elementSize(t)); }

}  // namespace

WanExperts open_teacher(const RunConfig& cfg) {
  const auto boundary = cfg.teacher.boundary > 0 ? std::optional<double>(cfg.teacher.boundary) : std::nullopt;
  return WanExperts::open(cfg.teacher_path(), boundary, cfg.teacher.model_config);
}

std::int64_t stored_elem_bytes(const WanCheckpoint& ck) {
  return elem_bytes(safetensors_to_scalar_type(ck.info(wan_param_specs(ck.config()).back().name).dtype));
}

data::DatasetExpectations dataset_expectations(const WanConfig& tc, bool ignore_condition) {
  data::DatasetExpectations expect;
  expect.condition = image_condition_of(tc);
  expect.ignore_condition = ignore_condition;
  expect.latent_channels = latent_channels_of(tc);
  expect.text_dim = tc.text_dim;
  expect.text_len = tc.text_len;
  expect.patch = tc.patch_size;
  return expect;
}

namespace {

/// What an i2v teacher asks of the job: its in_dim counting the mask and image channels, and a
/// student that takes the same inputs (x_t and y). Throws ConfigError.
void check_i2v_job(const RunConfig& cfg, const WanConfig& tc, const WanConfig& sc) {
  WD_CHECK_AS(ConfigError, tc.in_dim == 2 * tc.out_dim + kI2vMaskChannels,
              "teacher " << cfg.teacher_path() << " is an i2v model with in_dim " << tc.in_dim << " and out_dim "
                         << tc.out_dim << "; its forward takes the noisy latents, the mask and the image latents, "
                         << "so in_dim must be " << 2 * tc.out_dim + kI2vMaskChannels << " (out_dim + "
                         << kI2vMaskChannels << " + out_dim; 36 for Wan 2.2 I2V-A14B)");
  WD_CHECK_AS(ConfigError, sc.in_dim == tc.in_dim && sc.out_dim == tc.out_dim,
              "student config: in_dim " << sc.in_dim << " and out_dim " << sc.out_dim << " differ from the i2v teacher's ("
                                        << tc.in_dim << " and " << tc.out_dim << ", teacher " << cfg.teacher_path()
                                        << "): the student takes the same noisy latents and image condition y ("
                                        << tc.out_dim << " + " << tc.in_dim - tc.out_dim << " channels)");
}

}  // namespace

void validate_with_teacher(const RunConfig& cfg, const WanConfig& tc, int stages, ConfigProblems& p) {
  const auto sc = cfg.student.model_config(tc);
  sc.validate("student config");
  if (image_condition_of(tc) == ImageCondition::kI2v) check_i2v_job(cfg, tc, sc);
  if (cfg.dmd.critic_dims()) objective::critic_model_config(cfg.keys(), tc).validate("critic config (critic.*)");
  for (const auto& [s, t] : cfg.student.feature_pairs()) {
    p.check(s < sc.num_layers && t < tc.num_layers,
            "student.features(" + cfg.student.features + ") pairs student block " + std::to_string(s) +
                " with teacher block " + std::to_string(t) + "; the student has " +
                std::to_string(sc.num_layers) + " blocks, the teacher " + std::to_string(tc.num_layers));
  }
  p.check(cfg.checkpoint.every <= cfg.train.steps,
          "checkpoint.every(" + std::to_string(cfg.checkpoint.every) + ") exceeds train.steps(" +
              std::to_string(cfg.train.steps) + "): no checkpoint would be written before the end");
  p.check(stages <= tc.num_layers,
          "teacher.stages(" + std::to_string(stages) + ") exceeds the teacher's " +
              std::to_string(tc.num_layers) + " blocks (each stage needs one at least)");
  if (!cfg.teacher.shard_map.empty()) {
    try {
      teacher::parse_shard_map(cfg.teacher.shard_map, tc.num_layers);
    } catch (const ConfigError& e) {
      p.check(false, e.what());
    }
  }
}

std::pair<std::vector<std::uint64_t>, std::uint64_t> teacher_block_bytes(const WanCheckpoint& ck) {
  const auto& c = ck.config();
  std::vector<std::uint64_t> blocks(static_cast<std::size_t>(c.num_layers), 0);
  std::uint64_t head = 0;
  for (const auto& spec : wan_param_specs(c)) {
    const auto b = wan_block_of(spec.name);
    if (b >= 0) blocks[static_cast<std::size_t>(b)] += ck.info(spec.name).nbytes();
    if (spec.name.rfind("head.", 0) == 0) head += ck.info(spec.name).nbytes();
  }
  return {blocks, head};
}

std::int64_t tokens_per_sample(const WanConfig& c, const std::array<std::int64_t, 4>& latent) {
  return (latent[1] / c.patch_size[0]) * (latent[2] / c.patch_size[1]) * (latent[3] / c.patch_size[2]);
}

std::optional<c10::ScalarType> teacher_dtype(const RunConfig& cfg) {
  return dtype_of(cfg.teacher.dtype);
}

c10::ScalarType timed_weight_dtype(const RunConfig& cfg, std::int64_t stored_elem_bytes) {
  return teacher_dtype(cfg).value_or(stored_elem_bytes == 2 ? torch::kBFloat16 : torch::kFloat);
}

plan::DitShape dit_shape(const WanConfig& c, std::int64_t experts) {
  plan::DitShape s;
  s.dim = c.dim;
  s.ffn_dim = c.ffn_dim;
  s.num_heads = c.num_heads;
  s.num_layers = c.num_layers;
  s.freq_dim = c.freq_dim;
  s.experts = experts;
  std::int64_t block = 0, other = 0;
  for (const auto& p : wan_param_specs(c)) {
    (p.name.rfind("blocks.", 0) == 0 ? block : other) += p.numel();
  }
  s.block_params = c.num_layers > 0 ? block / c.num_layers : 0;
  s.other_params = other;
  return s;
}

comm::StreamPlan stream_plan_for(const RunConfig& cfg, const WanConfig& tc,
                                 const std::array<std::int64_t, 4>& latent, std::int64_t context_len) {
  comm::StreamPlan stream;
  stream.batch_per_student = cfg.train.batch_size;
  stream.micro_batches = cfg.train.grad_accum;
  stream.latent = latent;
  stream.out_channels = tc.out_dim;
  stream.context_len = context_len;
  stream.text_dim = tc.text_dim;
  stream.tokens = tokens_per_sample(tc, latent);
  stream.per_token_seq_len = tc.model_type == "ti2v" ? stream.tokens : 0;
  stream.condition_channels = condition_channels_of(tc);
  stream.teacher_dim = tc.dim;
  cfg.objective().shape_stream(cfg.keys(), stream);
  for (const auto& pair : cfg.student.feature_pairs()) stream.feature_blocks.push_back(pair.second);
  std::sort(stream.feature_blocks.begin(), stream.feature_blocks.end());
  stream.feature_blocks.erase(std::unique(stream.feature_blocks.begin(), stream.feature_blocks.end()),
                              stream.feature_blocks.end());
  return stream;
}

namespace {

/// The machine's side of the plan: the budgets, the GPUs per node, and where a streamed
/// teacher's blocks may live (the pinned arena's limit, unset: a share of the host; the
/// fallback's copy threads).
void set_machine(const RunConfig& cfg, const PlanContext& ctx, plan::PlanInput& in) {
  in.device_budget = ctx.gpu_bytes;
  in.host_budget = ctx.host_bytes;
  in.gpus_per_node = ctx.gpus_per_node;
  in.arena_limit = cfg.teacher.arena_limit_bytes();
  in.copy_threads = cfg.teacher.copy_threads;
}

}  // namespace

plan::PlanInput make_plan_input(const RunConfig& cfg, const PlanContext& ctx) {
  const auto& tc = ctx.teacher;
  const auto& lat = ctx.latent;
  const auto sc = cfg.student.model_config(tc);
  const auto layout = comm::Layout::make(ctx.world, cfg.teacher.ranks);
  const bool broadcast = cfg.comm.mode == CommMode::kBroadcast;
  const auto sp = std::max<std::int64_t>(1, cfg.student.sequence_parallel);
  const auto global_batch =
      cfg.train.batch_size * (broadcast ? layout.replicas : std::max<std::int64_t>(1, layout.student_ranks / sp));

  const auto stream = stream_plan_for(cfg, tc, lat, ctx.context_len);
  const auto pairs = cfg.student.feature_pairs();

  plan::PlanInput in;
  in.teacher = dit_shape(tc, ctx.experts);
  in.student = dit_shape(sc, 1);
  const auto dtype = teacher_dtype(cfg);
  in.teacher_elem_bytes = dtype ? elem_bytes(*dtype) : ctx.stored_elem_bytes;
  in.checkpoint_elem_bytes = ctx.stored_elem_bytes;
  in.student_bf16_mixed = cfg.student.precision == Precision::kBf16Mixed;
  in.student_ema = cfg.train.ema_decay > 0;
  in.shard_parameters = cfg.student.shard == ShardMode::kParameters;
  in.shard_gradients = cfg.student.shard == ShardMode::kGradients || in.shard_parameters;
  in.shard_optimizer = cfg.student.shard == ShardMode::kOptimizer || in.shard_gradients;
  in.bucket_bytes = cfg.comm.bucket_bytes();
  in.shard_on_device = !ctx.cpu_job && cfg.comm.backend != CommBackend::kMpi;
  const auto& policy = cfg.student.checkpointing;
  for (std::int64_t b = 0; b < sc.num_layers; ++b) in.checkpointed_blocks += policy.applies(b) ? 1 : 0;
  // Channel projections (when the student's channels differ) and feature heads, fp32.
  if (sc.in_dim != lat[0] + stream.condition_channels) in.student_extra_params += lat[0] * sc.in_dim + sc.in_dim;
  if (sc.out_dim != tc.out_dim) in.student_extra_params += sc.out_dim * tc.out_dim + tc.out_dim;
  in.student_extra_params += static_cast<std::int64_t>(pairs.size()) * (sc.dim * tc.dim + tc.dim);
  // dmd: the critic, a second student (its weights, gradients and AdamW moments), or adapters over
  // the base a LoRA student holds anyway (critic.lora_rank).
  const auto critic = objective::critic_lora(cfg.keys(), tc.num_layers);
  const bool critic_lora = critic.rank > 0;
  if (stream.score_requests) {
    const auto model = dmd_critic_config(cfg, tc);
    if (!critic_lora) in.student_extra_params += wan_param_count(model);
    in.critic = dit_shape(model, 1);
    in.critic_classifies = cfg.dmd.gan();
    in.critic_in_generator_graph = cfg.dmd.gan_weight > 0;
    // The critic's realism classifier: Linear(dim, dim) and Linear(dim, 1).
    if (cfg.dmd.gan()) in.student_extra_params += model.dim * model.dim + 2 * model.dim + 1;
  }
  if (cfg.student.lora_rank > 0 || critic_lora) {
    // The base: one expert of the teacher, as its file stores it (bf16 under bf16-mixed); a LoRA
    // pair (a two-expert teacher without student.expert) holds both experts and two adapter sets.
    const std::int64_t pair = cfg.lora_pair(static_cast<std::size_t>(ctx.experts)) ? 2 : 1;
    const auto base_elem = cfg.student.precision == Precision::kBf16Mixed ? 2 : ctx.stored_elem_bytes;
    in.lora_base_bytes = static_cast<std::uint64_t>(pair * wan_param_count(tc)) * static_cast<std::uint64_t>(base_elem);
    in.lora_base_shareable = static_cast<std::int64_t>(base_elem) == static_cast<std::int64_t>(in.teacher_elem_bytes);
    in.student_lora = cfg.student.lora_rank > 0;
    in.lora_pair = pair == 2;
    // A LoRA student computes in its base's dtype: a bf16 base's activations are bf16.
    if (in.student_lora && base_elem == 2) in.student_bf16_mixed = true;
    if (in.student_lora) in.lora_params += pair * lora_param_count(tc, cfg.student.lora_spec(tc.num_layers));
    if (critic_lora) in.lora_params += pair * lora_param_count(tc, critic);
  }
  in.batch = cfg.train.batch_size;
  in.tokens = stream.tokens;
  in.context_len = tc.text_len;  // the model pads every context to text_len
  in.feature_blocks = static_cast<std::int64_t>(stream.feature_blocks.size());
  cfg.objective().shape_plan(cfg.keys(), in);
  in.message_bytes = static_cast<std::int64_t>(stream.message_spec().bytes());
  in.prefetch_depth = cfg.comm.prefetch_depth;
  in.eval_messages = global_batch > 0 ? cfg.train.eval_samples / global_batch : 0;
  in.teacher_ranks = layout.teacher_ranks;
  in.student_ranks = layout.student_ranks;
  in.broadcast = broadcast;
  in.sequence_parallel = sp;
  in.cpu_job = ctx.cpu_job;
  in.host_process_bytes = compat::kHasCuda ? plan::kHostProcessBytesCudaLibTorch : plan::kHostProcessBytes;
  // GPU jobs run a CUDA LibTorch 2.x (fused attention); a CPU job runs this build.
  in.fused_attention = !ctx.cpu_job || compat::kHasFusedAttention;
  in.per_token_time = ctx.teacher.model_type == "ti2v";
  set_machine(cfg, ctx, in);
  return in;
}

WanConfig dmd_critic_config(const RunConfig& cfg, const WanConfig& tc) {
  return objective::critic_lora(cfg.keys(), tc.num_layers).rank > 0 ? tc : objective::critic_model_config(cfg.keys(), tc);
}

double dmd_critic_cost(const plan::PlanInput& in) {
  const double own = plan::dit_forward_flops(in.student, in.tokens, in.context_len);
  return own > 0 ? plan::dit_forward_flops(in.critic, in.tokens, in.context_len) / own : 1.0;
}

comm::ServiceSchedule service_schedule(const RunConfig& cfg, const comm::StreamPlan& plan) {
  comm::ServiceSchedule s;
  s.ratio = cfg.dmd.critic_ratio;
  s.first_step = plan.first_step;
  s.train_steps = plan.train_steps;
  s.lead = cfg.comm.prefetch_depth;
  return s;
}

}  // namespace wd::job
