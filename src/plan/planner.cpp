// The memory planner's formulas (derivations in docs/placement.md, "Memory planner").
#include "plan/planner.hpp"

#include <algorithm>
#include <sstream>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "core/sequence_groups.hpp"

namespace wd::plan {

namespace {

using u64 = std::uint64_t;

/// The sequence-parallel group size (1: none).
int sequence_size(const PlanInput& in) { return static_cast<int>(std::max<std::int64_t>(1, in.sequence_parallel)); }

constexpr u64 kF32 = 4;  // fp32: norms, modulation, softmax and residual stream
constexpr u64 kRopeTable = 8;  // RoPE's cos and sin tables: 2 fp32 values per head channel and token
/// During the backward the gradients of one block's activations and the allocator's retained
/// blocks add this many times one block's saved activations on top of what is saved (measured
/// on the CPU build: 1.6 and 1.7 for students of dim 256 and 512, bench/results/planner.md).
constexpr double kBackwardTransient = 1.65;
/// The reference attention (no fused kernel: LibTorch 1.13) holds this many [B,H,S,S+L] fp32
/// score-sized tensors beside the saved softmax output in one block's backward: the gradient of
/// the probabilities, the softmax backward's product and its result, and the scale's gradient.
/// Measured at 4096 tokens, where they dominate a block: bench/results/sequence-parallel.md.
constexpr u64 kReferenceAttentionBackward = 4;
/// Stream placement: the block in use plus two prefetched ahead.
constexpr u64 kStreamDeviceBlocks = 3;

u64 n(std::int64_t v) { return static_cast<u64>(std::max<std::int64_t>(v, 0)); }

u64 student_param_bytes(const PlanInput& in) {
  return kF32 * ((in.student_lora ? 0 : n(in.student.params())) + n(in.student_extra_params) + n(in.lora_params));
}

/// The per-replica batch a teacher forward runs.
std::int64_t teacher_samples(const PlanInput& in, int replicas) {
  const int spr = std::max(1, in.student_ranks / std::max(1, replicas));
  return in.batch * (in.broadcast ? 1 : std::max<std::int64_t>(1, spr / std::max<std::int64_t>(1, in.sequence_parallel)));
}

/// Tokens of a sample one student rank holds: all, or under sequence parallelism ceil(S/N) (the
/// sample padded to a multiple of N, N equal runs).
u64 local_tokens(const PlanInput& in) {
  const u64 g = n(std::max<std::int64_t>(1, in.sequence_parallel));
  return (n(in.tokens) + g - 1) / g;
}

PlanItem item(const char* name, u64 device, u64 host, std::string note = "") {
  return {name, device, host, std::move(note)};
}

}  // namespace

std::uint64_t arena_bytes(const PlanInput& in) {
  const auto& t = in.teacher;
  return n(t.experts) * n(t.num_layers) * n(t.block_params) * n(in.teacher_elem_bytes);
}

std::uint64_t arena_limit_of(const PlanInput& in) {
  if (in.arena_limit) return *in.arena_limit;
  return static_cast<u64>(kArenaShareOfAvailable * static_cast<double>(in.host_budget));
}

bool arena_fits(const PlanInput& in) { return arena_limit_of(in) > 0 && arena_bytes(in) <= arena_limit_of(in); }

std::string stream_source(const PlanInput& in) {
  const auto bytes = format_bytes(static_cast<double>(arena_bytes(in)));
  if (arena_fits(in)) return "pinned arena of " + bytes + ", shared per node";
  const auto limit = arena_limit_of(in);
  return "mapped checkpoint, " + std::to_string(in.copy_threads) + " copy threads (" +
         (limit == 0 ? std::string("teacher.arena_limit 0: no arena")
                     : "an arena of " + bytes + " exceeds its limit of " + format_bytes(static_cast<double>(limit))) +
         ")";
}

std::string placement_name(Placement p) {
  switch (p) {
    case Placement::kGpu: return "gpu";
    case Placement::kCpu: return "cpu";
    case Placement::kStream: return "stream";
    case Placement::kShard: return "shard";
  }
  return "?";
}

const std::vector<Placement>& all_placements() {
  static const std::vector<Placement> all{Placement::kGpu, Placement::kCpu, Placement::kStream,
                                          Placement::kShard};
  return all;
}

u64 RankPlan::device_total() const {
  u64 s = 0;
  for (const auto& i : items) s += i.device;
  return s;
}

u64 RankPlan::host_total() const {
  u64 s = 0;
  for (const auto& i : items) s += i.host;
  return s;
}

const PlanItem& RankPlan::at(const std::string& name) const {
  for (const auto& i : items) {
    if (i.name == name) return i;
  }
  throw Error("the plan has no item '" + name + "'");
}

namespace {

/// student_block_activation_bytes for a trained DiT of shape `s` (the student, or a dmd critic).
u64 block_activation_bytes(const PlanInput& in, const DitShape& s) {
  const u64 c = in.student_bf16_mixed ? 2 : 4;  // linear outputs, attention inputs
  // Under sequence parallelism the rank's tokens (S_l of them), and in self-attention every
  // token (S_l·g, with the padding) with H/g heads.
  const u64 g = n(std::max<std::int64_t>(1, in.sequence_parallel));
  const u64 N = n(in.batch) * local_tokens(in), D = n(s.dim), F = n(s.ffn_dim), H = n(s.num_heads) / g;
  const u64 B = n(in.batch), S = local_tokens(in) * g, L = n(in.context_len);
  // Saved for the backward, per token (docs/placement.md): fp32 elementwise work (modulation
  // [B,S,6,D], norms, scale/shift, residuals: 24 x D), linear outputs in the compute dtype
  // (8 x D), the FFN hidden before and after GELU (2 x ffn_dim), the softmax outputs of self- and
  // cross-attention (fp32), and the cross attention's keys and values of the text. RoPE keeps
  // nothing of its own (its fp32 rotation's backward needs only the tables).
  u64 bytes = N * D * (24 * kF32 + 8 * c) + 2 * N * F * c;
  // The softmax outputs; a fused kernel saves only its log-sum-exp per query row.
  bytes += (in.fused_attention ? 2 * B * H * S : B * H * S * (S + L)) * kF32;
  bytes += 4 * B * L * D * c;
  // The all-to-alls' outputs, which attention saves: q, k, v with every token and H/g heads, and
  // its output before the way back (the same bytes as the rank's tokens with every head).
  if (g > 1) bytes += 4 * N * D * c;
  return bytes;
}

/// student_activation_bytes for a trained DiT of shape `s`.
u64 activation_bytes(const PlanInput& in, const DitShape& s, std::int64_t checkpointed) {
  const u64 N = n(in.batch) * local_tokens(in), D = n(s.dim);
  const u64 layers = n(s.num_layers), k = std::min(n(checkpointed), layers);
  const u64 block = block_activation_bytes(in, s);
  // Embedding: the time embedding (freq_dim, then 10 x D of MLP and e0 [B,rows,6,D]; a row per
  // sample, or per token for TI2V), patch tokens and head (4 x D per token), the RoPE tables
  // (cos, sin interleaved per channel, fp32); all fp32 (the official model's choice).
  const u64 rows = in.per_token_time ? N : n(in.batch);
  const u64 embed = rows * (n(s.freq_dim) + 10 * D) * kF32 + N * 4 * D * kF32 + N * n(s.head_dim()) * kRopeTable;
  // A checkpointed block keeps only its input; one block's internals exist again while it is
  // recomputed in the backward.
  const u64 kept = (layers - k) * block + k * N * D * kF32 + (k > 0 ? block : 0);
  // The reference attention's backward (no fused kernel): score-sized gradients of the block
  // in its backward, every token's with this rank's heads under sequence parallelism.
  const u64 g = n(std::max<std::int64_t>(1, in.sequence_parallel));
  const u64 S = local_tokens(in) * g;
  const u64 scores = in.fused_attention ? 0
                                        : kReferenceAttentionBackward * n(in.batch) * (n(s.num_heads) / g) * S *
                                              (S + n(in.context_len)) * kF32;
  return embed + kept + static_cast<u64>(kBackwardTransient * static_cast<double>(block)) + scores;
}

}  // namespace

u64 student_block_activation_bytes(const PlanInput& in) { return block_activation_bytes(in, in.student); }

std::uint64_t student_activation_bytes(const PlanInput& in, std::int64_t checkpointed) {
  const u64 own = activation_bytes(in, in.student, checkpointed);
  if (in.critic.num_layers <= 0) return own;
  // The dmd critic's blocks follow the student's policy (by share of blocks). Its update comes
  // after the generator's graph is gone, its classifier's step at real and fake (2 B); the
  // generator's GAN term holds the generator's graph and the critic's at B at once.
  const auto layers = std::max<std::int64_t>(1, in.student.num_layers);
  const auto critic_checkpointed = (checkpointed * in.critic.num_layers + layers / 2) / layers;
  const u64 critic = activation_bytes(in, in.critic, critic_checkpointed);
  auto pairs = in;
  pairs.batch = 2 * in.batch;
  const u64 update = in.critic_classifies ? activation_bytes(pairs, in.critic, critic_checkpointed) : critic;
  return std::max(in.critic_in_generator_graph ? own + critic : own, update);
}

std::uint64_t teacher_activation_bytes(const PlanInput& in, std::int64_t samples) {
  const auto& t = in.teacher;
  const u64 c = n(in.teacher_elem_bytes);
  const u64 B = n(samples), S = n(in.tokens), L = n(in.context_len);
  const u64 N = B * S, D = n(t.dim), F = n(t.ffn_dim), H = n(t.num_heads);
  // Held through the forward: residual x, e, e0 [B,rows,6,D] (fp32; a row per sample, or per
  // token for TI2V), RoPE tables, text keys.
  const u64 rows = in.per_token_time ? N : B;
  const u64 state = N * D * kF32 + rows * D * 7 * kF32 + N * n(t.head_dim()) * kRopeTable + B * L * D * c;
  // One block at a time: modulation m [B,rows,6,D] fp32, then the larger of self-attention
  // (normed input, q, k, v, RoPE's fp32 temporaries: x·cos, swap(x), the rotated q or k; and the
  // scores: the product in the compute dtype, its fp32 copy, the fp32 softmax and its cast back)
  // and the FFN.
  const u64 mod = rows * D * 6 * kF32;
  const u64 scores = in.fused_attention ? B * H * S * kF32 : B * H * S * S * (c == 4 ? 8 : 10);
  const u64 attention = N * D * (3 * kF32 + c + 3 * kF32) + scores;
  const u64 ffn = N * D * kF32 + 2 * N * F * c;
  // Hidden states sent for feature distillation (fp32) and the output.
  const u64 features = n(in.feature_blocks) * N * D * kF32;
  return state + mod + std::max(attention, ffn) + features;
}

namespace {

/// What every part of one placement's plan shares.
struct Shape {
  bool cuda = false;
  bool shard = false;
  int P = 1;          ///< pipeline stages (shard: teacher.ranks)
  int replicas = 1;   ///< teacher replicas
  u64 weights = 0;    ///< the teacher's weights in its compute dtype
  u64 converted = 0;  ///< a private copy of the checkpoint's dtype when it differs
  u64 host_overhead = 0;
  bool gathered = false;  ///< student.shard parameters over more than one student
};

Shape shape_of(const PlanInput& in, Placement p) {
  Shape s;
  s.cuda = !in.cpu_job;
  const auto& t = in.teacher;
  s.weights = n(t.params()) * n(in.teacher_elem_bytes);
  s.converted = in.checkpoint_elem_bytes == in.teacher_elem_bytes ? 0 : n(t.params()) * n(in.checkpoint_elem_bytes);
  // Shard: the teacher ranks form one pipeline (P = teacher.ranks); otherwise each is a replica.
  s.shard = p == Placement::kShard;
  s.P = s.shard ? in.teacher_ranks : 1;
  s.replicas = s.shard ? 1 : in.teacher_ranks;
  s.host_overhead = s.cuda ? kHostCudaProcessBytes : in.host_process_bytes;
  s.gathered = in.shard_optimizer && in.student_ranks > 1 && in.shard_gradients && in.shard_parameters;
  return s;
}

/// The teacher rank's items; returns the page cache its node shares (counted once per node).
u64 plan_teacher(const PlanInput& in, Placement p, const Shape& s, RankPlan& rank) {
  auto& T = rank.items;
  const auto& t = in.teacher;
  const u64 e = n(in.teacher_elem_bytes);
  const u64 block_bytes = n(t.experts) * n(t.block_params) * e;
  const std::int64_t samples = teacher_samples(in, s.replicas);
  const u64 act = teacher_activation_bytes(in, samples * in.teacher_forwards);
  u64 shared_page_cache = 0;  // per node, counted once however many ranks map it
  switch (p) {
    case Placement::kGpu:
      T.push_back(item(kTeacherWeights, s.weights, s.converted,
                       s.converted ? "host: checkpoint read for the dtype conversion" : ""));
      T.push_back(item(kStreamingBuffers, 0, 0));
      T.push_back(item(kTeacherActivations, act, 0));
      break;
    case Placement::kCpu:
      // Zero-copy from the mapped checkpoint when the dtypes agree (page cache, shared by the
      // node's teacher ranks); a conversion keeps a private copy next to the mapped file.
      T.push_back(item(kTeacherWeights, 0, s.weights + s.converted,
                       s.converted ? "converted copy + mapped checkpoint" : "mapped checkpoint, shared per node"));
      if (!s.converted) shared_page_cache = s.weights;
      T.push_back(item(kStreamingBuffers, 0, 0));
      T.push_back(item(kTeacherActivations, 0, act));
      break;
    case Placement::kStream:
      // The arena (pinned, one per node) replaces the page cache as the blocks' home; the
      // embeddings and head are on the device, counted within the weights' bytes here.
      T.push_back(item(kTeacherWeights, 0, s.weights, stream_source(in)));
      shared_page_cache = s.weights;
      T.push_back(item(kStreamingBuffers, kStreamDeviceBlocks * block_bytes, arena_fits(in) ? 0 : block_bytes,
                       arena_fits(in) ? "3 block buffers on the device, one DMA a block from the arena"
                                      : "3 block buffers on the device, 1 pinned staging block"));
      T.push_back(item(kTeacherActivations, act, 0));
      break;
    case Placement::kShard: {
      const auto per_stage = (n(t.num_layers) + n(s.P) - 1) / n(s.P);
      const u64 stage = (per_stage * n(t.block_params) + n(t.other_params)) * n(t.experts) * e;
      T.push_back(item(kTeacherWeights, stage, 0,
                       std::to_string(per_stage) + " of " + std::to_string(t.num_layers) + " blocks + embeddings/head"));
      T.push_back(item(kStreamingBuffers, 0, 0));
      T.push_back(item(kTeacherActivations, act, 0));
      break;
    }
  }
  // Send ring: prefetch_depth slots of one message per student of the replica (one in broadcast
  // mode); a pipeline stage also receives and sends the hidden state [B,S,D] fp32.
  const int spr = in.student_ranks / std::max(1, s.replicas);
  u64 ring = n(in.prefetch_depth) * n(in.broadcast ? 1 : spr) * n(in.message_bytes);
  if (s.shard && s.P > 1) ring += 2 * n(samples) * n(in.tokens) * n(t.dim) * kF32;
  const bool teacher_on_device = s.cuda && p != Placement::kCpu;
  T.push_back(teacher_on_device ? item(kTransportBuffers, ring, 0) : item(kTransportBuffers, 0, ring));
  // A host-only teacher of a GPU job still loads the CUDA build's libraries, but opens no context.
  T.push_back(item(kFrameworkOverhead, teacher_on_device ? kDeviceContextBytes : 0, s.host_overhead));
  return shared_page_cache;
}

/// The student rank's weights (with a LoRA base, or a ZeRO-3 slice) and gradients.
void plan_student_weights(const PlanInput& in, const Shape& s, u64 W, u64 half_copy, u64 slice, u64 N,
                          RankPlan& rank) {
  auto& St = rank.items;
  const auto place = [&](const char* name, u64 bytes, std::string note = "") {
    St.push_back(s.cuda ? item(name, bytes, 0, std::move(note)) : item(name, 0, bytes, std::move(note)));
  };
  if (in.lora_base_bytes > 0) {
    place(kStudentWeights, W + half_copy + in.lora_base_bytes,
          std::string(in.student_lora ? "fp32 adapters" : (in.student_bf16_mixed ? "fp32 master + bf16 copy, fp32 "
                                                                                   "critic adapters"
                                                                                 : "fp32, fp32 critic adapters")) +
              " + the frozen base (" + format_bytes(static_cast<double>(in.lora_base_bytes)) + ")");
  }
  // student.shard parameters: the slice, the root whole, and one gathered block at a time.
  const u64 block = kF32 * n(in.student.block_params);
  const u64 root = W - std::min(W, block * n(in.student.num_layers) * n(in.student.experts));
  if (s.gathered) {
    place(kStudentWeights, slice + root + block,
          "fp32 slice of 1/" + std::to_string(N) + " + the rest whole (" + format_bytes(static_cast<double>(root)) +
              ") + one block gathered (" + format_bytes(static_cast<double>(block)) + ")");
  } else if (in.lora_base_bytes == 0) {
    place(kStudentWeights, W + half_copy, in.student_bf16_mixed ? "fp32 master + bf16 copy" : "fp32");
  }
  const bool scattered = in.shard_optimizer && in.student_ranks > 1 && in.shard_gradients;
  if (!scattered) {
    // The .grad of every parameter is a view into its all-reduce bucket (comm::bind_grads), so
    // the buckets add nothing; a group of one student has no buckets at all. (The MPI reduce of
    // host students once seemed to hold one more copy at the peak: that copy was the packed
    // buckets; with views the measured peaks hold the gradients once: PlanAccuracy.
    // FormulasOfALargeStudent, 11-13% over with it counted, both builds.)
    place(kGradients, W + half_copy,
          in.student_ranks <= 1 ? "fp32 .grad (one student: no all-reduce buckets)"
                                : "fp32 .grad, views into the all-reduce buckets");
    return;
  }
  // The averaged slice, and in the backward the grads of the buckets not yet complete (two
  // buckets; bf16-mixed: their bf16 grads too). A device student's hooks pack each bucket to the
  // host and send after the backward (MPI): the host holds every bucket once, with the
  // all-gather's pinned copy beside it; over NCCL the buckets go from the device in the backward.
  const u64 in_flight = std::min<u64>(2 * in.bucket_bytes, W) * (in.student_bf16_mixed ? 3 : 2) / 2;
  if (s.cuda && !in.shard_on_device) {
    St.push_back(item(kGradients, slice + in_flight, W,
                      "fp32 slice of 1/" + std::to_string(N) + " + two buckets in the backward; host: packed buckets"));
  } else {
    place(kGradients, slice + in_flight, "fp32 slice of 1/" + std::to_string(N) + " + two buckets in flight");
  }
}

/// The student rank's items (on a GPU in a GPU job, on the host in a CPU job).
void plan_student(const PlanInput& in, const Shape& s, PlacementPlan& out) {
  auto& St = out.student.items;
  const u64 W = student_param_bytes(in);
  // A LoRA student computes in its base's dtype: its fp32 adapters have no bf16 copy.
  const u64 half_copy = in.student_bf16_mixed && !in.student_lora ? W / 2 : 0;
  const u64 s_ring = (n(in.prefetch_depth) + n(in.eval_messages)) * n(in.message_bytes);
  const u64 s_act = student_activation_bytes(in, in.checkpointed_blocks);
  out.student_activations_all = student_activation_bytes(in, in.student.num_layers);
  out.student_activations_off = student_activation_bytes(in, 0);
  const auto place = [&](const char* name, u64 bytes, std::string note = "") {
    St.push_back(s.cuda ? item(name, bytes, 0, std::move(note)) : item(name, 0, bytes, std::move(note)));
  };
  place(kTransportBuffers, s_ring, "receive ring + kept held-out batches");
  const bool sharded = in.shard_optimizer && in.student_ranks > 1;
  const u64 N = sharded ? n(in.student_ranks) : 1;
  // Sharded: each rank's slice is ceil(params / N) (the flat layout is padded to N slices).
  const u64 slice = kF32 * ((W / kF32 + N - 1) / N);
  plan_student_weights(in, s, W, half_copy, slice, N, out.student);
  const u64 optimizer = 2 * slice + (in.student_ema ? W : 0);
  std::string optimizer_note = sharded ? "AdamW exp_avg + exp_avg_sq of 1/" + std::to_string(N) + " of the parameters"
                                       : "AdamW exp_avg + exp_avg_sq";
  optimizer_note += in.student_ema ? " + the weight average (fp32)" : " (fp32)";
  // A device student's slices are all-gathered through a pinned host copy of the whole buffer
  // (MPI; NCCL gathers on the device).
  if (sharded && s.cuda && !in.shard_on_device) {
    St.push_back(item(kOptimizerState, optimizer, W, optimizer_note + "; pinned host buffer for the all-gather"));
  } else {
    place(kOptimizerState, optimizer, optimizer_note);
  }
  // A host student with sharded gradients (or a device one over NCCL) all-gathers through a buffer
  // of the whole model after the step, when the activations are gone: the larger of the two is
  // the peak's.
  const bool scattered = sharded && in.shard_gradients;
  const u64 block = kF32 * n(in.student.block_params);
  const u64 root = W - std::min(W, block * n(in.student.num_layers) * n(in.student.experts));
  const u64 step_buffer = s.gathered ? root : W;  // parameters: only the rest is gathered after the step
  if (scattered && (!s.cuda || in.shard_on_device) && step_buffer > s_act) {
    place(kStudentActivations, step_buffer,
          "the all-gather's step buffer (larger than the activations, not held with them)");
  } else {
    place(kStudentActivations, s_act);
  }
  St.push_back(item(kFrameworkOverhead, s.cuda ? kDeviceContextBytes : 0, s.host_overhead));
}

/// The fullest node's host memory. Where every node holds whole replicas (comm::Layout places
/// each replica's teacher stages on its students' node), every node holds the same; otherwise
/// the first node holds the teacher ranks, then students.
u64 host_per_node(const PlanInput& in, const Shape& s, const PlacementPlan& out, u64 shared_page_cache) {
  const int world = in.teacher_ranks + in.student_ranks;
  const int per_node = in.cpu_job ? world : std::max(1, in.gpus_per_node);
  const int replica_ranks = s.P + (s.replicas > 0 ? in.student_ranks / s.replicas : in.student_ranks);
  const bool by_replica = world > per_node && world % per_node == 0 && per_node % replica_ranks == 0 &&
                          s.replicas > 0 && in.student_ranks % s.replicas == 0;
  const int teachers_on_node = by_replica ? per_node / replica_ranks * s.P : std::min(in.teacher_ranks, per_node);
  const int students_on_node =
      by_replica ? per_node - teachers_on_node : std::min(in.student_ranks, per_node - teachers_on_node);
  const u64 teacher_private_host = out.teacher.host_total() - shared_page_cache;
  const u64 node0 = n(teachers_on_node) * teacher_private_host + (teachers_on_node > 0 ? shared_page_cache : 0) +
                    n(students_on_node) * out.student.host_total();
  // With whole replicas on every node there is no node of students alone.
  const int students_left = by_replica ? 0 : in.student_ranks - students_on_node;
  const u64 student_node = n(std::min(students_left, per_node)) * out.student.host_total();
  return std::max(node0, student_node);
}

/// Why a placement does not fit: one row a reason, in the order they are reported.
std::string why_not(const PlanInput& in, const Shape& s, const PlacementPlan& out) {
  const std::vector<std::pair<bool, const char*>> rows{
      {s.cuda && out.teacher.device_total() > in.device_budget, "teacher rank's device"},
      {s.cuda && out.student.device_total() > in.device_budget, "student rank's device"},
      {out.host_per_node > in.host_budget, "node's host memory"},
      {s.shard && in.teacher_ranks < 2, "shard needs teacher.ranks >= 2"},
      {s.gathered && s.cuda, "student.shard parameters trains host students only (GPU students: gradients)"},
      {s.shard && in.whole_teacher, "the job needs the whole teacher on one rank (guidance or trajectories)"},
  };
  std::string out_text;
  for (const auto& [over, reason] : rows) {
    if (over) out_text += (out_text.empty() ? "exceeds: " : ", ") + std::string(reason);
  }
  return out_text;
}

PlacementPlan plan_placement(const PlanInput& in, Placement p) {
  PlacementPlan out;
  out.placement = p;
  if (in.cpu_job && p != Placement::kCpu) {
    out.applicable = false;
    out.why_not = "a CPU job has no device";
    return out;
  }
  const auto s = shape_of(in, p);
  const u64 shared_page_cache = plan_teacher(in, p, s, out.teacher);
  plan_student(in, s, out);
  out.host_per_node = host_per_node(in, s, out, shared_page_cache);
  out.why_not = why_not(in, s, out);
  out.fits = out.why_not.empty();
  return out;
}

/// The first placement that fits, fastest first: all weights on the device; then a pipeline (no
/// host traffic, but fewer replicas); then streaming (every block crosses PCIe every step); then
/// host compute. Under sequence parallelism only placements whose replicas' students its groups
/// divide.
std::optional<Placement> first_fitting(const PlanInput& in, const std::vector<PlacementPlan>& placements) {
  const Placement order[] = {Placement::kGpu, Placement::kShard, Placement::kStream, Placement::kCpu};
  for (const auto p : order) {
    const auto& pp = placements[static_cast<std::size_t>(
        std::find(all_placements().begin(), all_placements().end(), p) - all_placements().begin())];
    const int replicas = p == Placement::kShard ? 1 : std::max(1, in.teacher_ranks);
    const bool groups_divide = SequenceGroups{sequence_size(in)}.divides(in.student_ranks / replicas);
    if (pp.applicable && pp.fits && groups_divide) return p;
  }
  return std::nullopt;
}

/// Plan::sequence_parallel_fits: the smallest size above the input's that divides the student's
/// heads and with which a placement fits, trying the input's teacher.ranks first and then the
/// others nearest it (the world kept: students = world − teacher ranks).
void find_sequence_parallel(const PlanInput& in, Plan& plan) {
  const int world = in.teacher_ranks + in.student_ranks;
  std::vector<int> teacher_ranks;
  for (int d = 0; d < world; ++d) {
    for (const int t : {in.teacher_ranks - d, in.teacher_ranks + d}) {
      const bool seen = std::find(teacher_ranks.begin(), teacher_ranks.end(), t) != teacher_ranks.end();
      if (t >= 1 && t < world && !seen) teacher_ranks.push_back(t);
    }
  }
  for (std::int64_t g = std::max<std::int64_t>(1, in.sequence_parallel) + 1; g <= in.student.num_heads; ++g) {
    if (in.student.num_heads % g != 0) continue;
    for (const int t : teacher_ranks) {
      auto wider = in;
      wider.sequence_parallel = g;
      wider.teacher_ranks = t;
      wider.student_ranks = world - t;
      if (wider.student_ranks % g != 0) continue;
      std::vector<PlacementPlan> placements;
      for (const auto p : all_placements()) placements.push_back(plan_placement(wider, p));
      const auto p = first_fitting(wider, placements);
      // Replicas need whole shares of the students (comm::Layout); a pipeline is one replica.
      if (!p || (*p != Placement::kShard && wider.student_ranks % t != 0)) continue;
      plan.sequence_parallel_fits = g;
      plan.sequence_parallel_placement = p;
      plan.sequence_parallel_teacher_ranks = t;
      return;
    }
  }
}

}  // namespace

Plan make_plan(const PlanInput& in) {
  Plan plan;
  for (const auto p : all_placements()) plan.placements.push_back(plan_placement(in, p));
  plan.recommended = first_fitting(in, plan.placements);
  if (!plan.recommended) {
    plan.reason = "no placement fits: lower train.batch_size, set student.checkpointing = all, "
                  "use student.precision = bf16-mixed, or add ranks";
    const int replicas = std::max(1, in.teacher_ranks);
    if (!SequenceGroups{sequence_size(in)}.divides(in.student_ranks / replicas)) {
      plan.reason += "; student.sequence_parallel " + std::to_string(in.sequence_parallel) + " does not divide the " +
                     std::to_string(in.student_ranks / replicas) + " students of each of the " +
                     std::to_string(replicas) + " teacher replicas";
    }
    find_sequence_parallel(in, plan);
    if (plan.sequence_parallel_fits > 0) {
      plan.reason += "; student.sequence_parallel " + std::to_string(plan.sequence_parallel_fits) + " fits with " +
                     (plan.sequence_parallel_teacher_ranks == in.teacher_ranks ? std::string("")
                                                                               : "teacher.ranks " +
                                                                                     std::to_string(plan.sequence_parallel_teacher_ranks) +
                                                                                     " and ") +
                     "teacher.placement " + placement_name(*plan.sequence_parallel_placement) +
                     ": each student rank then holds 1/" + std::to_string(plan.sequence_parallel_fits) +
                     " of every sample's tokens";
    }
    if (in.lora_pair) {
      plan.reason += "; the LoRA pair holds both experts' bases on every student: student.expert high and low "
                     "train one expert's adapters per job over one base";
    }
  } else if (*plan.recommended == Placement::kGpu) {
    plan.reason = "the whole teacher fits on its GPU: no weight copies during the forward";
  } else if (*plan.recommended == Placement::kShard) {
    plan.reason = "the teacher does not fit on one GPU; split across the teacher ranks it does, "
                  "with no host traffic";
  } else if (*plan.recommended == Placement::kStream) {
    plan.reason = "neither the whole teacher nor one shard fits on a GPU; blocks stream from host memory";
  } else {
    plan.reason = in.cpu_job ? "a CPU job" : "no device placement fits; the teacher computes on the host";
  }
  return plan;
}

Plan make_generate_plan(const PlanInput& in) {
  WD_CHECK(in.student_ranks == 0, "make_generate_plan: generate has no student rank, not " << in.student_ranks);
  Plan plan;
  for (const auto p : all_placements()) {
    PlacementPlan out;
    out.placement = p;
    out.applicable = p == Placement::kCpu || (p == Placement::kGpu && !in.cpu_job);
    if (!out.applicable) {
      out.why_not = in.cpu_job && p == Placement::kGpu ? "a CPU job has no device"
                                                       : "generate holds the whole teacher on every rank";
      plan.placements.push_back(out);
      continue;
    }
    const auto s = shape_of(in, p);
    const u64 shared_page_cache = plan_teacher(in, p, s, out.teacher);
    // No send ring: the message in hand, copied to the host for its shard.
    for (auto& i : out.teacher.items) {
      if (i.name == kTransportBuffers) i = item(kTransportBuffers, 0, n(in.message_bytes), "the message being written");
    }
    out.host_per_node = host_per_node(in, s, out, shared_page_cache);
    out.why_not = why_not(in, s, out);
    out.fits = out.why_not.empty();
    plan.placements.push_back(out);
  }
  for (const auto& pp : plan.placements) {  // gpu first, then cpu: the others do not apply
    if (!plan.recommended && pp.applicable && pp.fits) plan.recommended = pp.placement;
  }
  if (!plan.recommended) {
    plan.reason = "no placement fits: generate holds the whole teacher on every rank (no stream or shard placement "
                  "of it yet); lower train.batch_size, or plan a machine with more memory";
  } else if (*plan.recommended == Placement::kGpu) {
    plan.reason = "the whole teacher fits on each rank's GPU: generate computes where a colocated student would "
                  "(student.device)";
  } else {
    plan.reason = in.cpu_job ? "a CPU job" : "the teacher does not fit on a GPU: generate computes on the host with "
                                             "student.device cpu";
  }
  return plan;
}

std::string format_plan(const PlanInput& in, const Plan& plan) {
  const auto b = [](u64 v) { return v ? format_bytes(static_cast<double>(v)) : std::string("-"); };
  // generate's plan has no student rank: its columns are left out.
  const bool students = in.student_ranks > 0;
  const auto row = [&](const std::string& label, const std::string& td, const std::string& th, const std::string& sd,
                       const std::string& sh) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-34s %12s %12s", label.c_str(), td.c_str(), th.c_str());
    std::string out = line;
    if (students) {
      std::snprintf(line, sizeof line, "   %12s %12s", sd.c_str(), sh.c_str());
      out += line;
    }
    return out + "\n";
  };
  std::ostringstream os;
  for (const auto& pp : plan.placements) {
    os << "placement " << placement_name(pp.placement);
    if (!pp.applicable) {
      os << ": not applicable (" << pp.why_not << ")\n\n";
      continue;
    }
    os << (pp.fits ? ": fits" : ": does not fit") << (pp.fits ? "" : " (" + pp.why_not + ")") << "\n";
    os << row(students ? "per rank" : "per generating rank", "teacher dev", "teacher host", "student dev",
              "student host");
    const char* names[] = {kTeacherWeights, kStreamingBuffers, kTeacherActivations, kTransportBuffers,
                           kStudentWeights, kGradients, kOptimizerState, kStudentActivations,
                           kFrameworkOverhead};
    for (const char* name : names) {
      PlanItem t{name}, s{name};
      bool teachers = false;
      for (const auto& i : pp.teacher.items) {
        if (i.name != name) continue;
        t = i;
        teachers = true;
      }
      for (const auto& i : pp.student.items) if (i.name == name) s = i;
      if (!students && !teachers) continue;  // a student's category
      std::string label = name;
      if (label == kStudentActivations) {
        label += " (" + std::to_string(in.checkpointed_blocks) + "/" + std::to_string(in.student.num_layers) + " ckpt)";
      }
      os << row(label, b(t.device), b(t.host), b(s.device), b(s.host));
    }
    os << row("total", b(pp.teacher.device_total()), b(pp.teacher.host_total()), b(pp.student.device_total()),
              b(pp.student.host_total()));
    if (!in.cpu_job) os << row("budget", b(in.device_budget), "", b(in.device_budget), "");
    if (students) {
      os << "  student activations: checkpointing off " << b(pp.student_activations_off) << ", all "
         << b(pp.student_activations_all) << "\n";
    }
    os << "  host memory of the fullest node: " << b(pp.host_per_node) << " of " << b(in.host_budget) << "\n";
    if (pp.placement == Placement::kStream) os << "  blocks stream from the " << stream_source(in) << "\n";
    os << "\n";
  }
  const std::string what = students ? "teacher.placement = " : "";
  if (plan.recommended) {
    os << "recommended: " << what << placement_name(*plan.recommended) << " (" << plan.reason << ")\n";
  } else {
    os << "recommended: none (" << plan.reason << ")\n";
  }
  return os.str();
}

}  // namespace wd::plan
