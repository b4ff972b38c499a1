// PlanInput from the run config and what is known of the teacher, the data and the machine.
#include "app/plan_input.hpp"

#include <algorithm>

#include "comm/process_groups.hpp"
#include "comm/stream_plan.hpp"
#include "core/torch_compat.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "student/checkpointing.hpp"

namespace wd::app {

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

data::DatasetExpectations dataset_expectations(const WanConfig& tc) {
  data::DatasetExpectations expect;
  expect.latent_channels = tc.in_dim;
  expect.text_dim = tc.text_dim;
  expect.text_len = tc.text_len;
  expect.patch = tc.patch_size;
  return expect;
}

std::optional<c10::ScalarType> teacher_dtype(const RunConfig& cfg) {
  if (cfg.teacher.dtype == "auto") return std::nullopt;
  return parse_dtype(cfg.teacher.dtype);
}

memory::DitShape dit_shape(const WanConfig& c, std::int64_t experts) {
  memory::DitShape s;
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

memory::PlanInput make_plan_input(const RunConfig& cfg, const PlanContext& ctx) {
  const auto& tc = ctx.teacher;
  const auto& lat = ctx.latent;
  const auto sc = cfg.student.model_config(tc);
  const auto layout = comm::Layout::make(ctx.world, cfg.teacher.ranks);
  const bool broadcast = cfg.comm.mode == "broadcast";
  const auto global_batch = cfg.train.batch_size * (broadcast ? layout.replicas : layout.student_ranks);

  comm::StreamPlan stream;
  stream.batch_per_student = cfg.train.batch_size;
  stream.latent = lat;
  stream.out_channels = tc.out_dim;
  stream.context_len = ctx.context_len;
  stream.text_dim = tc.text_dim;
  stream.tokens = (lat[1] / tc.patch_size[0]) * (lat[2] / tc.patch_size[1]) * (lat[3] / tc.patch_size[2]);
  stream.per_token_seq_len = tc.model_type == "ti2v" ? stream.tokens : 0;
  stream.teacher_dim = tc.dim;
  const auto pairs = cfg.student.feature_pairs();
  for (const auto& pr : pairs) stream.feature_blocks.push_back(pr.second);
  std::sort(stream.feature_blocks.begin(), stream.feature_blocks.end());
  stream.feature_blocks.erase(std::unique(stream.feature_blocks.begin(), stream.feature_blocks.end()),
                              stream.feature_blocks.end());

  memory::PlanInput in;
  in.teacher = dit_shape(tc, ctx.experts);
  in.student = dit_shape(sc, 1);
  const auto dtype = teacher_dtype(cfg);
  in.teacher_elem_bytes = dtype ? elem_bytes(*dtype) : ctx.stored_elem_bytes;
  in.checkpoint_elem_bytes = ctx.stored_elem_bytes;
  in.student_bf16_mixed = cfg.student.precision == "bf16-mixed";
  const auto policy = student::CheckpointPolicy::parse(cfg.student.checkpointing);
  for (std::int64_t b = 0; b < sc.num_layers; ++b) in.checkpointed_blocks += policy.applies(b) ? 1 : 0;
  // Channel projections (when the student's channels differ) and feature heads, fp32.
  if (sc.in_dim != lat[0]) in.student_extra_params += lat[0] * sc.in_dim + sc.in_dim;
  if (sc.out_dim != tc.out_dim) in.student_extra_params += sc.out_dim * tc.out_dim + tc.out_dim;
  in.student_extra_params += static_cast<std::int64_t>(pairs.size()) * (sc.dim * tc.dim + tc.dim);
  in.batch = cfg.train.batch_size;
  in.tokens = stream.tokens;
  in.context_len = tc.text_len;  // the model pads every context to text_len
  in.feature_blocks = static_cast<std::int64_t>(stream.feature_blocks.size());
  in.message_bytes = static_cast<std::int64_t>(stream.message_spec().bytes());
  in.prefetch_depth = cfg.comm.prefetch_depth;
  in.eval_messages = global_batch > 0 ? cfg.train.eval_samples / global_batch : 0;
  in.teacher_ranks = layout.teacher_ranks;
  in.student_ranks = layout.student_ranks;
  in.broadcast = broadcast;
  in.cpu_job = ctx.cpu_job;
  // GPU jobs run a CUDA LibTorch 2.x (fused attention); a CPU job runs this build.
  in.fused_attention = !ctx.cpu_job || compat::kHasFusedAttention;
  in.device_budget = ctx.gpu_bytes;
  in.host_budget = ctx.host_bytes;
  in.gpus_per_node = ctx.gpus_per_node;
  return in;
}

}  // namespace wd::app
