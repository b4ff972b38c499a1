// The memory planner: every category follows from its formula for small hand-checked shapes;
// placements, budgets and the recommendation; generate's ranks and time.
#include <gtest/gtest.h>

#include <map>

#include "plan/planner.hpp"
#include "plan/speed.hpp"

namespace wd::plan::test_planner {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

/// A small job whose numbers are easy to check by hand.
PlanInput small_job() {
  PlanInput in;
  // Teacher: 10 blocks of 1000 params + 500 others, bf16.
  in.teacher = {/*dim*/ 8, /*ffn*/ 16, /*heads*/ 2, /*layers*/ 10, /*freq*/ 4, 1000, 500, 1};
  // Student: 2 blocks of 100 params + 50 others (250 params, 1000 bytes in fp32).
  in.student = {8, 16, 2, 2, 4, 100, 50, 1};
  in.teacher_elem_bytes = 2;
  in.checkpoint_elem_bytes = 2;
  in.batch = 1;
  in.tokens = 4;
  in.context_len = 2;
  in.message_bytes = 1000;
  in.prefetch_depth = 2;
  in.eval_messages = 3;
  in.teacher_ranks = 1;
  in.student_ranks = 2;
  in.device_budget = 80 * kGiB;
  in.host_budget = 1024 * kGiB;
  in.gpus_per_node = 8;
  in.fused_attention = false;  // the reference attention: scores in memory
  return in;
}

const PlacementPlan& placement(const Plan& plan, Placement p) {
  for (const auto& pp : plan.placements) {
    if (pp.placement == p) return pp;
  }
  throw std::runtime_error("missing placement");
}

TEST(Planner, StudentBlockActivationsFollowTheFormula) {
  const auto in = small_job();
  // N = 4 tokens, D = 8, F = 16, H = 2, S = 4, L = 2, fp32:
  // N·D·(24·4 + 8·4) + 2·N·F·4 + B·H·S·(S+L)·4 + 4·B·L·D·4
  const std::uint64_t expected = 4 * 8 * 128 + 2 * 4 * 16 * 4 + 1 * 2 * 4 * 6 * 4 + 4 * 1 * 2 * 8 * 4;
  EXPECT_EQ(student_block_activation_bytes(in), expected);
  auto mixed = in;
  mixed.student_bf16_mixed = true;  // linear outputs and the FFN hidden in bf16
  EXPECT_EQ(student_block_activation_bytes(mixed), 4u * 8 * 112 + 2 * 4 * 16 * 2 + 192 + 4 * 2 * 8 * 2);
}

TEST(Planner, FusedAttentionKeepsNoScores) {
  auto in = small_job();
  const auto reference = student_block_activation_bytes(in);
  in.fused_attention = true;  // B·H·S·(S+L) softmax outputs become 2·B·H·S log-sum-exps
  EXPECT_EQ(reference - student_block_activation_bytes(in), (1u * 2 * 4 * 6 - 2u * 1 * 2 * 4) * 4);
}

TEST(Planner, CheckpointingKeepsOnlyBlockInputsPlusOneBlock) {
  auto in = small_job();
  in.student.num_layers = 6;
  const auto block = student_block_activation_bytes(in);
  const auto off = student_activation_bytes(in, 0);
  const auto all = student_activation_bytes(in, 6);
  const auto every2 = student_activation_bytes(in, 3);
  const std::uint64_t input = 4 * 8 * 4;  // N·D fp32 per checkpointed block
  EXPECT_EQ(off - all, 6 * block - (6 * input + block));
  EXPECT_EQ(off - every2, 3 * block - (3 * input + block));
  EXPECT_LT(all, every2);
}

// train.objective dmd: the critic's update comes after the generator's graph is gone, so a critic
// of the student's shape adds nothing and a larger one (critic.init teacher) sets the peak; the
// generator's GAN term runs its loss through the critic, so both graphs are held at once; the
// critic's GAN step classifies real and fake in one forward.
TEST(Planner, ADmdCriticsActivationsPeakInItsOwnUpdateOrBesideTheGenerators) {
  auto in = small_job();
  in.student.num_layers = 4;
  const auto own = student_activation_bytes(in, 2);
  auto same = in;
  same.critic = in.student;
  EXPECT_EQ(student_activation_bytes(same, 2), own);
  auto wide = in;
  wide.critic = in.student;
  wide.critic.dim = 16;
  wide.critic.ffn_dim = 32;
  wide.critic.num_layers = 8;  // half of them checkpointed, as the student's 2 of 4
  auto wide_alone = wide;
  wide_alone.student = wide.critic;
  wide_alone.critic = {};
  const auto critic = student_activation_bytes(wide_alone, 4);
  EXPECT_GT(critic, own);
  EXPECT_EQ(student_activation_bytes(wide, 2), critic);
  wide.critic_in_generator_graph = true;
  EXPECT_EQ(student_activation_bytes(wide, 2), own + critic);
  // The critic's GAN step: real and fake in one forward, twice the batch.
  same.critic_classifies = true;
  auto doubled = in;
  doubled.batch = 2;
  EXPECT_EQ(student_activation_bytes(same, 2), student_activation_bytes(doubled, 2));
}

// student.shard optimizer: the AdamW moments of 1/N of the parameters (the slice rounded up: the
// flat layout is padded to N slices); the weight average stays whole; one student shards nothing.
TEST(Planner, ShardedOptimizerKeepsASliceOfTheMoments) {
  auto in = small_job();
  in.cpu_job = true;
  in.student_extra_params = 50;  // 300 params in all: W = 1200 bytes
  in.shard_optimizer = true;
  in.student_ranks = 2;
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kOptimizerState).host, 2 * 4 * 150u);
  in.student_ranks = 7;  // 300 / 7 -> slices of 43
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kOptimizerState).host, 2 * 4 * 43u);
  in.student_ema = true;
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kOptimizerState).host, 2 * 4 * 43u + 1200u);
  in.student_ema = false;
  in.student_ranks = 1;
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kOptimizerState).host, 2 * 1200u);
}

// student.shard gradients: the averaged slice, plus the grads of at most two buckets in the
// backward (all of them when the model is smaller); the moments as with optimizer.
TEST(Planner, ShardedGradientsKeepASliceAndTwoBuckets) {
  auto in = small_job();
  in.cpu_job = true;
  in.student_extra_params = 50;  // 300 params in all: W = 1200 bytes
  in.shard_optimizer = in.shard_gradients = true;
  in.student_ranks = 7;  // slices of 43
  in.bucket_bytes = 100;
  const auto cpu = placement(make_plan(in), Placement::kCpu).student;
  EXPECT_EQ(cpu.at(kGradients).host, 4 * 43u + 200u);
  EXPECT_EQ(cpu.at(kOptimizerState).host, 2 * 4 * 43u);
  in.bucket_bytes = 1000;  // two buckets would be more than the model: the model's grads
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kGradients).host, 4 * 43u + 1200u);
  // On a GPU: the host holds the packed buckets of the backward (sent after it) and the
  // all-gather's pinned buffer.
  in.cpu_job = false;
  in.bucket_bytes = 100;
  const auto gpu = placement(make_plan(in), Placement::kGpu).student;
  EXPECT_EQ(gpu.at(kGradients).device, 4 * 43u + 200u);
  EXPECT_EQ(gpu.at(kGradients).host, 1200u);
  EXPECT_EQ(gpu.at(kOptimizerState).host, 1200u);
  // Over NCCL (students on GPUs of their own): no host copy; the buckets leave from the device,
  // and the all-gather's buffer of the whole model is the device's after the step (when it is
  // larger than the activations: here the activations are).
  in.shard_on_device = true;
  const auto nccl = placement(make_plan(in), Placement::kGpu).student;
  EXPECT_EQ(nccl.at(kGradients).device, 4 * 43u + 200u);
  EXPECT_EQ(nccl.at(kGradients).host, 0u);
  EXPECT_EQ(nccl.at(kOptimizerState).host, 0u);
  EXPECT_EQ(nccl.at(kStudentActivations).device, gpu.at(kStudentActivations).device);
  in.student_extra_params = 1'000'000;  // W of 4 MB, more than the activations: the step buffer
  EXPECT_EQ(placement(make_plan(in), Placement::kGpu).student.at(kStudentActivations).device,
            4u * (1'000'000u + 250u));
  in.student_extra_params = 50;
  in.shard_on_device = false;
  // One student: nothing to split.
  in.student_ranks = 1;
  EXPECT_EQ(placement(make_plan(in), Placement::kGpu).student.at(kGradients).device, 1200u);
}

// student.shard parameters: the weights are the slice of every parameter, the parameters outside
// the blocks whole, and one gathered block; gradients and moments as with gradients; after the
// step only the outside parameters are gathered.
TEST(Planner, ShardedParametersKeepASliceTheRestAndOneBlock) {
  auto in = small_job();
  in.cpu_job = true;
  in.student_extra_params = 50;  // 300 params in all (2 blocks of 100): W = 1200 bytes, 400 outside
  in.shard_optimizer = in.shard_gradients = in.shard_parameters = true;
  in.student_ranks = 7;  // slices of 43
  in.bucket_bytes = 100;
  const auto cpu = placement(make_plan(in), Placement::kCpu).student;
  EXPECT_EQ(cpu.at(kStudentWeights).host, 4 * 43u + 400u + 400u);
  EXPECT_EQ(cpu.at(kGradients).host, 4 * 43u + 200u);
  EXPECT_EQ(cpu.at(kOptimizerState).host, 2 * 4 * 43u);
  // GPU students: refused at start-up, so no placement fits.
  in.cpu_job = false;
  const auto gpu = placement(make_plan(in), Placement::kGpu);
  EXPECT_FALSE(gpu.fits);
  EXPECT_NE(gpu.why_not.find("student.shard parameters trains host students only"), std::string::npos) << gpu.why_not;
  in.cpu_job = true;
  // One student: nothing to split, the whole model.
  in.student_ranks = 1;
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kStudentWeights).host, 1200u);
}

// student.lora_rank: the base is held frozen (no gradient, no moments); only the adapters train.
TEST(Planner, LoraStudentsHoldTheBaseAndTrainTheAdapters) {
  auto in = small_job();
  in.cpu_job = true;
  in.student_extra_params = 0;
  in.student_lora = true;
  in.lora_params = 30;        // W = 120 bytes of fp32 adapters
  in.lora_base_bytes = 5000;  // the frozen base
  in.student_bf16_mixed = true;  // a bf16 base computes in bf16: no master copy is added
  const auto s = placement(make_plan(in), Placement::kCpu).student;
  EXPECT_EQ(s.at(kStudentWeights).host, 120u + 5000u);
  EXPECT_EQ(s.at(kGradients).host, 120u);
  EXPECT_EQ(s.at(kOptimizerState).host, 2 * 120u);
  // A LoRA critic beside a full student: its adapters train with the student, over a base.
  in.student_lora = false;
  in.student_bf16_mixed = false;
  const auto full = placement(make_plan(in), Placement::kCpu).student;
  const std::uint64_t W = 4 * static_cast<std::uint64_t>(in.student.params()) + 120u;
  EXPECT_EQ(full.at(kStudentWeights).host, W + 5000u);
  EXPECT_EQ(full.at(kOptimizerState).host, 2 * W);
  // Nothing fits a LoRA pair (both experts' bases on every student): one job per expert is named.
  in.student_lora = true;
  in.host_budget = in.device_budget = 1000;
  const auto none = make_plan(in);
  EXPECT_FALSE(none.recommended.has_value());
  EXPECT_EQ(none.reason.find("student.expert"), std::string::npos) << none.reason;
  in.lora_pair = true;
  EXPECT_NE(make_plan(in).reason.find("student.expert high and low train one expert's adapters per job"),
            std::string::npos);
}

TEST(Planner, CpuJobStudentCategories) {
  auto in = small_job();
  in.cpu_job = true;
  in.student_extra_params = 50;  // 300 params in all: W = 1200 bytes
  const auto plan = make_plan(in);
  const auto& cpu = placement(plan, Placement::kCpu);
  ASSERT_TRUE(cpu.applicable);
  const auto& s = cpu.student;
  EXPECT_EQ(s.at(kStudentWeights).host, 1200u);
  EXPECT_EQ(s.at(kGradients).host, 1200u);  // .grad, the buckets' views: once (2 students)
  EXPECT_EQ(s.at(kOptimizerState).host, 2 * 1200u);
  EXPECT_EQ(s.at(kTransportBuffers).host, (2 + 3) * 1000u);  // ring + kept held-out batches
  EXPECT_EQ(s.at(kFrameworkOverhead).host, kHostProcessBytes);
  EXPECT_EQ(s.device_total(), 0u);
  EXPECT_EQ(s.host_total(), 1200u * 4 + 5000 + student_activation_bytes(in, 0) + kHostProcessBytes);
  // One student: nothing to all-reduce with, so no buckets (no reducer).
  in.student_ranks = 1;
  EXPECT_EQ(placement(make_plan(in), Placement::kCpu).student.at(kGradients).host, 1200u);
  // bf16-mixed: a bf16 copy of the weights and transient bf16 grads.
  in.student_bf16_mixed = true;
  const auto mixed = make_plan(in);
  const auto& m = placement(mixed, Placement::kCpu).student;
  EXPECT_EQ(m.at(kStudentWeights).host, 1800u);
  EXPECT_EQ(m.at(kGradients).host, 1200u + 600u);
  // Only the cpu placement applies to a CPU job.
  for (const auto p : {Placement::kGpu, Placement::kStream, Placement::kShard}) {
    EXPECT_FALSE(placement(plan, p).applicable) << placement_name(p);
  }
  EXPECT_EQ(plan.recommended, Placement::kCpu);
}

TEST(Planner, TeacherWeightsAndTransportPerPlacement) {
  auto in = small_job();
  in.teacher_ranks = 2;
  in.student_ranks = 6;  // 3 students per replica
  const auto plan = make_plan(in);
  const std::uint64_t weights = (10 * 1000 + 500) * 2;
  EXPECT_EQ(placement(plan, Placement::kGpu).teacher.at(kTeacherWeights).device, weights);
  EXPECT_EQ(placement(plan, Placement::kCpu).teacher.at(kTeacherWeights).host, weights);
  const auto& stream = placement(plan, Placement::kStream).teacher;
  EXPECT_EQ(stream.at(kTeacherWeights).device, 0u);
  EXPECT_EQ(stream.at(kTeacherWeights).host, weights);
  EXPECT_EQ(stream.at(kStreamingBuffers).device, 3 * 1000u * 2);
  // Shard: the 2 teacher ranks form one pipeline, 5 blocks each (+ the embeddings and head).
  const auto& shard = placement(plan, Placement::kShard).teacher;
  EXPECT_EQ(shard.at(kTeacherWeights).device, (5 * 1000u + 500) * 2);
  // Send ring: prefetch_depth x students of the replica x message.
  EXPECT_EQ(placement(plan, Placement::kGpu).teacher.at(kTransportBuffers).device, 2 * 3 * 1000u);
  // Shard has one replica of all 6 students, plus the hidden state in and out [B·6,S,D] fp32.
  EXPECT_EQ(shard.at(kTransportBuffers).device, 2 * 6 * 1000u + 2 * 6 * 4 * 8 * 4);
  // The teacher forward runs the replica's batch: 3 samples (6 for the single shard replica).
  EXPECT_EQ(placement(plan, Placement::kGpu).teacher.at(kTeacherActivations).device, teacher_activation_bytes(in, 3));
  EXPECT_EQ(shard.at(kTeacherActivations).device, teacher_activation_bytes(in, 6));
  // train.objective guided: the replica's 3 samples run as 6, conditional and negative halves.
  auto guided = in;
  guided.teacher_forwards = 2;
  EXPECT_EQ(placement(make_plan(guided), Placement::kGpu).teacher.at(kTeacherActivations).device,
            teacher_activation_bytes(in, 6));
  // guided and trajectory need the whole teacher on one rank: shard does not fit them.
  guided.whole_teacher = true;
  EXPECT_FALSE(placement(make_plan(guided), Placement::kShard).fits);
  EXPECT_NE(placement(make_plan(guided), Placement::kShard).why_not.find("the whole teacher on one rank"), std::string::npos);
  // Broadcast: one message per slot.
  in.broadcast = true;
  EXPECT_EQ(placement(make_plan(in), Placement::kGpu).teacher.at(kTransportBuffers).device, 2 * 1000u);
}

// Host memory per node follows comm::Layout's rank order: with whole replicas on every node
// (2 nodes x 8 GPUs, 2 teachers, 7 students each) every node holds one teacher and its students;
// where they do not fit so (3 teachers) the first node holds every teacher.
TEST(Planner, HostPerNodeFollowsWhereTheLayoutPutsTheReplicas) {
  auto in = small_job();
  in.gpus_per_node = 8;
  in.teacher_ranks = 2;
  in.student_ranks = 14;
  const auto gpu = placement(make_plan(in), Placement::kCpu);  // a host teacher: its memory counts
  const auto teacher = gpu.teacher.host_total(), student = gpu.student.host_total();
  const auto shared = std::uint64_t{(10 * 1000 + 500) * 2};  // the mapped checkpoint, once per node
  EXPECT_EQ(gpu.host_per_node, (teacher - shared) + shared + 7 * student);
  in.teacher_ranks = 3;
  in.student_ranks = 12;  // 15 ranks: a replica of 5 does not divide a node of 8
  in.gpus_per_node = 8;
  const auto mixed = placement(make_plan(in), Placement::kCpu);
  const auto node0 = 3 * (mixed.teacher.host_total() - shared) + shared + 5 * mixed.student.host_total();
  EXPECT_EQ(mixed.host_per_node, std::max<std::uint64_t>(node0, 7 * mixed.student.host_total()));
}

TEST(Planner, ConvertingTheCheckpointKeepsTheMappedFileToo) {
  auto in = small_job();
  in.cpu_job = true;
  in.teacher_elem_bytes = 4;  // fp32 teacher from a bf16 checkpoint
  const auto plan = make_plan(in);
  const auto& t = placement(plan, Placement::kCpu).teacher;
  EXPECT_EQ(t.at(kTeacherWeights).host, 10500u * 4 + 10500u * 2);
}

TEST(Planner, TeacherActivationsGrowWithTheSquareOfTheTokens) {
  auto in = small_job();
  const auto a1 = teacher_activation_bytes(in, 1);
  in.tokens = 8;
  const auto a2 = teacher_activation_bytes(in, 1);
  // Scores B·H·S² x 10 bytes in bf16 dominate a long sequence: 2·(64 - 16)·10 more.
  EXPECT_GE(a2, 2 * a1);
  EXPECT_GT(teacher_activation_bytes(in, 2), a2);
}

TEST(Planner, RecommendsTheFastestPlacementThatFits) {
  auto in = small_job();
  in.teacher_ranks = 2;
  in.student_ranks = 6;
  auto plan = make_plan(in);
  EXPECT_EQ(plan.recommended, Placement::kGpu);
  // A teacher of 40 GiB in bf16 on 32 GiB GPUs: 2 shards of 20 GiB fit, the whole does not.
  in.teacher.block_params = 2 * static_cast<std::int64_t>(kGiB);
  in.teacher.other_params = 0;
  in.device_budget = 32 * kGiB;
  plan = make_plan(in);
  EXPECT_FALSE(placement(plan, Placement::kGpu).fits);
  EXPECT_TRUE(placement(plan, Placement::kShard).fits);
  EXPECT_EQ(plan.recommended, Placement::kShard);
  // With one teacher rank there is no pipeline: stream (3 blocks of 4 GiB on the device).
  in.teacher_ranks = 1;
  plan = make_plan(in);
  EXPECT_FALSE(placement(plan, Placement::kShard).fits);
  EXPECT_EQ(placement(plan, Placement::kStream).teacher.at(kStreamingBuffers).device, 3 * 4 * kGiB);
  EXPECT_EQ(plan.recommended, Placement::kStream);
  // Host memory too small for the mapped teacher: only device placements without host copies.
  in.host_budget = 16 * kGiB;
  plan = make_plan(in);
  EXPECT_FALSE(placement(plan, Placement::kStream).fits);
  EXPECT_FALSE(placement(plan, Placement::kCpu).fits);
  EXPECT_FALSE(plan.recommended.has_value());
  EXPECT_NE(format_plan(in, plan).find("recommended: none"), std::string::npos);
}

// `generate`'s ranks (plan --generate): a whole teacher each, its batch of one stream at a time,
// the message being written on the host, no student; gpu where it fits, else cpu.
TEST(GeneratePlan, EachRankHoldsAWholeTeacherAndTheMessageItWrites) {
  auto in = small_job();
  in.teacher_ranks = 2;
  in.student_ranks = 0;
  in.batch = 2;
  in.teacher_forwards = 2;  // guided: conditional and negative halves
  auto plan = make_generate_plan(in);
  const std::uint64_t weights = (10 * 1000 + 500) * 2;
  const auto& gpu = placement(plan, Placement::kGpu);
  ASSERT_TRUE(gpu.applicable);
  EXPECT_TRUE(gpu.student.items.empty());
  EXPECT_EQ(gpu.teacher.at(kTeacherWeights).device, weights);
  EXPECT_EQ(gpu.teacher.at(kTeacherActivations).device, teacher_activation_bytes(in, 4));
  EXPECT_EQ(gpu.teacher.at(kTransportBuffers).device, 0u);
  EXPECT_EQ(gpu.teacher.at(kTransportBuffers).host, 1000u);  // one message, no ring
  EXPECT_EQ(gpu.teacher.device_total(), weights + teacher_activation_bytes(in, 4) + kDeviceContextBytes);
  // The host teacher: both ranks of the node map the checkpoint once.
  const auto& cpu = placement(plan, Placement::kCpu);
  EXPECT_EQ(cpu.teacher.at(kTeacherWeights).host, weights);
  EXPECT_EQ(cpu.host_per_node, 2 * (cpu.teacher.host_total() - weights) + weights);
  for (const auto p : {Placement::kStream, Placement::kShard}) {
    EXPECT_FALSE(placement(plan, p).applicable);
    EXPECT_EQ(placement(plan, p).why_not, "generate holds the whole teacher on every rank");
  }
  EXPECT_EQ(plan.recommended, Placement::kGpu);
  const auto table = format_plan(in, plan);
  EXPECT_NE(table.find("per generating rank"), std::string::npos) << table;
  EXPECT_EQ(table.find("student dev"), std::string::npos) << table;
  EXPECT_NE(table.find("recommended: gpu ("), std::string::npos) << table;
  // A GPU smaller than the teacher: the host; a CPU job: only the host applies.
  in.device_budget = weights;
  EXPECT_EQ(make_generate_plan(in).recommended, Placement::kCpu);
  in.cpu_job = true;
  plan = make_generate_plan(in);
  EXPECT_FALSE(placement(plan, Placement::kGpu).applicable);
  EXPECT_EQ(plan.recommended, Placement::kCpu);
  EXPECT_EQ(plan.reason, "a CPU job");
}

// student.sequence_parallel: each rank holds ceil(S/g) tokens (S padded to a multiple of g), every
// token with H/g heads in self-attention; the text's keys and values stay whole; the all-to-alls'
// outputs (q, k, v with H/g heads, the attention's output) add 4·N_l·D in the compute dtype.
TEST(Planner, SequenceParallelGroupsHoldTheirTokensShare) {
  auto in = small_job();
  in.tokens = 7;
  in.student.num_heads = 2;
  in.sequence_parallel = 2;  // 7 tokens: 4 a rank, 8 with the padding
  // N_l·D·(24·4 + 8·4) + 2·N_l·F·4 + B·(H/g)·S'·(S'+L)·4 + 4·B·L·D·4 + 4·N_l·D·4
  const std::uint64_t expected = 4 * 8 * 128 + 2 * 4 * 16 * 4 + 1 * 1 * 8 * 10 * 4 + 4 * 1 * 2 * 8 * 4 + 4 * 4 * 8 * 4;
  EXPECT_EQ(student_block_activation_bytes(in), expected);
  // Checkpointed blocks keep their inputs at N_l tokens: the whole student's grows as N_l.
  in.tokens = 4096;
  in.student.num_layers = 6;
  in.student.num_heads = 4;
  in.fused_attention = true;
  const auto one = [&](std::int64_t g) {
    auto x = in;
    x.sequence_parallel = g;
    return static_cast<double>(student_activation_bytes(x, 6));
  };
  EXPECT_LT(one(2), 0.6 * one(1));
  EXPECT_LT(one(4), 0.6 * one(2));
  // A replica's teacher computes batch x (its students / g).
  in.teacher_ranks = 1;
  in.student_ranks = 4;
  in.sequence_parallel = 2;
  const auto plan = make_plan(in);
  const auto& cpu = placement(plan, Placement::kGpu);
  auto whole = in;
  whole.sequence_parallel = 1;
  whole.student_ranks = 2;
  EXPECT_EQ(cpu.teacher.at(kTeacherActivations).device, placement(make_plan(whole), Placement::kGpu).teacher.at(kTeacherActivations).device);
}

// Nothing fits: plan names the smallest sequence-parallel size (dividing the heads) that does, and
// the teacher.ranks that lets its groups divide each replica's students.
TEST(Planner, RecommendsASequenceParallelSizeWhenNothingFits) {
  auto in = small_job();
  in.tokens = 1 << 14;
  in.student.num_heads = 8;
  in.student.dim = 64;
  in.fused_attention = true;
  in.teacher_ranks = 2;
  in.student_ranks = 6;  // 3 students a replica
  const auto at = [&](std::int64_t g) {
    auto x = in;
    x.sequence_parallel = g;
    return placement(make_plan(x), Placement::kGpu).student.device_total();
  };
  in.device_budget = (at(2) + at(4)) / 2;  // groups of 4 fit, groups of 2 do not
  const auto plan = make_plan(in);
  EXPECT_FALSE(plan.recommended.has_value());
  EXPECT_EQ(plan.sequence_parallel_fits, 4);
  // The world of 8 kept: 2 teacher ranks leave 3 students a replica, which 4 does not divide;
  // 4 ranks as one pipeline (shard) feed 4 students, one group.
  EXPECT_EQ(plan.sequence_parallel_teacher_ranks, 4);
  EXPECT_EQ(plan.sequence_parallel_placement, Placement::kShard);
  EXPECT_NE(plan.reason.find("student.sequence_parallel 4 fits with teacher.ranks " +
                             std::to_string(plan.sequence_parallel_teacher_ranks)),
            std::string::npos)
      << plan.reason;
}

}  // namespace
}  // namespace wd::plan::test_planner

namespace wd::plan::test_planner {
namespace {

DitShape dit(std::int64_t dim, std::int64_t ffn, std::int64_t heads, std::int64_t layers, std::int64_t freq) {
  DitShape d;
  d.dim = dim;
  d.ffn_dim = ffn;
  d.num_heads = heads;
  d.num_layers = layers;
  d.freq_dim = freq;
  return d;
}

TEST(Speed, ForwardFlopsMatchBenchForwardsCount) {
  // bench_forward's `small` (dim 512, ffn 2048, 8 blocks, text 64) counts 37.6 GFLOP a sample
  // of 512 tokens with the embeddings and head (bench/results/throughput.md); the model leaves
  // those out, which costs under 2%.
  const double f = dit_forward_flops(dit(512, 2048, 8, 8, 256), 512, 64);
  EXPECT_NEAR(f / 1e9, 37.6, 0.02 * 37.6);
}

TEST(Speed, RatesOrMeasuredSecondsGiveTheSecondsPerSample) {
  SpeedInput in;
  in.teacher = dit(512, 1024, 8, 8, 256);
  in.student = dit(256, 512, 4, 4, 256);
  in.tokens = 512;
  in.context_len = 32;
  in.teacher_gflops = 40;
  in.student_gflops = 30;
  EXPECT_NEAR(teacher_seconds_per_sample(in), dit_forward_flops(in.teacher, 512, 32) / 40e9, 1e-12);
  EXPECT_NEAR(student_seconds_per_sample(in), 3 * dit_forward_flops(in.student, 512, 32) / 30e9, 1e-12);
  in.recomputed_blocks = 4;  // every block checkpointed: its forward runs twice
  EXPECT_NEAR(student_seconds_per_sample(in), 4 * dit_forward_flops(in.student, 512, 32) / 30e9, 1e-12);
  in.teacher_measured_s = 0.25;
  in.student_measured_s = 0.125;
  EXPECT_EQ(teacher_seconds_per_sample(in), 0.25);
  EXPECT_EQ(student_seconds_per_sample(in), 0.125);
  // train.objective guided: two teacher forwards (conditional, negative) per trained sample.
  in.teacher_forwards = 2;
  EXPECT_EQ(teacher_seconds_per_sample(in), 0.5);
  EXPECT_EQ(student_seconds_per_sample(in), 0.125);
  // train.trajectory_rollout 1 at k = 4: 1.5 jumps (forwards) a sample on top of the step's 3.
  in.student_extra_forwards = 1.5;
  EXPECT_EQ(student_seconds_per_sample(in), 0.125 * 1.5);
  in.student_measured_s = 0;
  in.recomputed_blocks = 0;
  EXPECT_NEAR(student_seconds_per_sample(in), 4.5 * dit_forward_flops(in.student, 512, 32) / 30e9, 1e-12);
  in.student_measured_s = 0.125;
  in.student_extra_forwards = 0;
  in.teacher_measured_by_size = {{4, 0.2}, {2, 0.3}};
  EXPECT_EQ(teacher_forward(in, 4).seconds_per_sample, 0.4);
  // train.objective trajectory, guided, 40 teacher steps for 4 student intervals: 20 forwards.
  in.teacher_forwards = 20;
  in.teacher_measured_by_size.clear();
  EXPECT_EQ(teacher_seconds_per_sample(in), 5.0);
}

// generate's time: the busiest rank's messages, each its batch at the teacher's seconds per
// sample (its forwards per sample included) plus a step's overhead; ranks over the cores share them.
TEST(Speed, GenerateTakesTheBusiestRanksMessagesAtTheTeachersRate) {
  SpeedInput in;
  in.teacher = dit(512, 1024, 8, 8, 256);
  in.batch = 2;
  in.teacher_measured_s = 0.25;
  in.teacher_forwards = 20;  // trajectory: 40 guided teacher steps for 4 student intervals
  in.step_overhead_s = 0.5;
  in.ranks = 4;
  EXPECT_DOUBLE_EQ(generate_seconds(in, 16), 16 * (2 * 20 * 0.25 + 0.5));  // a device each
  in.cores = 2;  // 4 ranks on 2 cores: each at half speed
  EXPECT_DOUBLE_EQ(generate_seconds(in, 16), 2 * 16 * (2 * 20 * 0.25 + 0.5));
  in.cores = 8;  // more cores than ranks: a core each
  EXPECT_DOUBLE_EQ(generate_seconds(in, 16), 16 * (2 * 20 * 0.25 + 0.5));
  in.stream = {true, 1e9, 8, 1, 1, "arena"};  // a streamed teacher's copies: generate does not stream
  EXPECT_DOUBLE_EQ(generate_seconds(in, 16), 16 * (2 * 20 * 0.25 + 0.5));
}

/// The `small` job's shapes on 3 ranks sharing 2 cores, batch 2, a student step of 0.15 s/sample.
SpeedInput small_job_on_two_cores() {
  SpeedInput in;
  in.teacher = dit(512, 1024, 8, 8, 256);
  in.student = dit(256, 512, 4, 4, 256);
  in.ranks = 3;
  in.cores = 2;
  in.batch = 2;
  in.student_measured_s = 0.15;
  return in;
}

TEST(Speed, EveryAllowedLayoutIsPredictedBySharingTheCores) {
  auto in = small_job_on_two_cores();
  in.teacher_measured_s = 0.2;
  in.step_overhead_s = 0;  // the figures below are the compute alone
  const auto layouts = predict_layouts(in);
  // 3 ranks: colocated, 1 teacher + 2 students, 1 replica of 2 stages + 1 student. Two replicas
  // for one student are not a layout Layout::make allows.
  ASSERT_EQ(layouts.size(), 3u);
  std::map<std::string, LayoutSpeed> by_name;
  for (const auto& l : layouts) by_name[l.name] = l;
  ASSERT_EQ(by_name.count("colocated x3"), 1u);
  ASSERT_EQ(by_name.count("1 teacher(s) + 2 student(s)"), 1u);
  ASSERT_EQ(by_name.count("1 replica(s) x 2 stages + 1 student(s)"), 1u);
  // The ranks run as the job runs them, the cores shared fairly among those computing.
  // Colocated: three ranks of 2 x 0.35 s on 2 cores: 1.05 s a step of 6 samples.
  const auto& co = by_name["colocated x3"];
  EXPECT_NEAR(co.samples_per_s, 6 / 1.05, 1e-9);
  EXPECT_EQ(co.bound, "cores");
  EXPECT_EQ(co.student_wait, 0);
  // Dedicated: the teacher's step takes 0.8 s of a core. The students start a step when its
  // batch arrives, while the teacher starts the next: three ranks on two cores for 0.45 s (the
  // students' 0.3 s at 2/3 of a core, the teacher's first 0.3 s), then the teacher's last 0.5 s
  // alone: 4 samples in 0.95 s, the students waiting 0.5 s of it.
  const auto& dedicated = by_name["1 teacher(s) + 2 student(s)"];
  EXPECT_NEAR(dedicated.samples_per_s, 4 / 0.95, 1e-9);
  EXPECT_NEAR(dedicated.student_wait, 0.5 / 0.95, 1e-9);
  EXPECT_EQ(dedicated.bound, "teacher");
  // Two stages of 0.2 s and the student's 0.3 s: 0.7 s of work on 2 cores, more than the
  // student's own 0.3 s: 2 samples in 0.35 s; the stages run ahead, the student never waits.
  const auto& shard = by_name["1 replica(s) x 2 stages + 1 student(s)"];
  EXPECT_NEAR(shard.samples_per_s, 2 / 0.35, 1e-9);
  EXPECT_NEAR(shard.student_wait, 0, 1e-12);
  EXPECT_EQ(shard.bound, "cores");
  for (std::size_t i = 1; i < layouts.size(); ++i) {
    EXPECT_GE(layouts[i - 1].samples_per_s, layouts[i].samples_per_s) << "fastest first";
  }
  // Each rank's fixed seconds per step add to its work, twice on a colocated rank (teacher and
  // student): colocated 3 x 0.8 s on 2 cores (6 samples in 1.2 s); shard 0.25 + 0.25 + 0.35 s
  // on 2 cores (2 samples in 0.425 s); dedicated 0.35 s of students beside the teacher (0.525 s
  // at 2/3 of a core), then the rest of the teacher's 0.85 s (4 samples in 1.025 s). Colocated
  // pays the fewest overheads per sample and is recommended.
  in.step_overhead_s = 0.05;
  const auto with_overhead = predict_layouts(in);
  for (const auto& l : with_overhead) {
    if (l.colocated) {
      EXPECT_NEAR(l.samples_per_s, 6 / 1.2, 1e-9);
    } else if (l.stages == 1) {
      EXPECT_NEAR(l.samples_per_s, 4 / 1.025, 1e-9);
    } else {
      EXPECT_NEAR(l.samples_per_s, 2 / 0.425, 1e-9);
    }
  }
  EXPECT_EQ(with_overhead.front().name, "colocated x3");
  EXPECT_NE(format_speeds(in, with_overhead).find("recommended layout: colocated x3 (--teacher.placement colocated)"),
            std::string::npos);
}

TEST(Speed, EachLayoutsTeacherComputesInItsFastestMeasuredSize) {
  EXPECT_EQ(teacher_forward_sizes(4), (std::vector<std::int64_t>{4, 2, 1}));
  EXPECT_EQ(teacher_forward_sizes(6), (std::vector<std::int64_t>{6, 3, 2, 1}));
  EXPECT_EQ(teacher_forward_sizes(1), (std::vector<std::int64_t>{1}));
  auto in = small_job_on_two_cores();
  in.step_overhead_s = 0.01;
  // A device whose forward slows down per sample with the batch: a sample costs 0.33 s in a
  // forward of 4, 0.25 s in one of 2, 0.2 s alone.
  in.teacher_measured_s = 0.33;
  in.teacher_measured_by_size = {{4, 0.33}, {2, 0.25}, {1, 0.2}};
  EXPECT_EQ(teacher_forward(in, 4).micro_batch, 1);
  EXPECT_EQ(teacher_forward(in, 4).seconds_per_sample, 0.2);
  EXPECT_EQ(teacher_forward(in, 1).micro_batch, 0) << "a replica batch of one sample is its whole batch";
  // Where the whole batch is the fastest, no micro-batch.
  in.teacher_measured_by_size = {{4, 0.1}, {2, 0.25}, {1, 0.2}};
  EXPECT_EQ(teacher_forward(in, 4).micro_batch, 0);
  EXPECT_EQ(teacher_forward(in, 4).seconds_per_sample, 0.1);
  EXPECT_EQ(teacher_forward(in, 2).micro_batch, 1) << "a replica of 2 takes the best size up to 2";
  // A smaller size must beat the best larger one by kMicroBatchMargin (5%); the rule train's
  // teacher.micro_batch auto applies to its own timings.
  EXPECT_EQ(fastest_forward({{4, 0.30}, {2, 0.29}, {1, 0.29}}, 4).micro_batch, 0) << "3% is noise";
  EXPECT_EQ(fastest_forward({{4, 0.30}, {2, 0.29}, {1, 0.27}}, 4).micro_batch, 1) << "10% is not";
  EXPECT_EQ(fastest_forward({{1, 0.20}, {2, 0.30}, {4, 0.40}}, 4).micro_batch, 1) << "in any order";
  EXPECT_EQ(fastest_forward({{4, 0.4}, {2, 0.3}}, 1).micro_batch, 0) << "below every size: the smallest, whole";
  EXPECT_EQ(fastest_forward({{4, 0.4}, {2, 0.3}}, 1).seconds_per_sample, 0.3);

  in.teacher_measured_by_size = {{4, 0.33}, {2, 0.25}, {1, 0.2}};
  std::map<std::string, LayoutSpeed> by_name;
  for (const auto& l : predict_layouts(in)) by_name[l.name] = l;
  // Dedicated: the teacher computes both students' 4 samples one at a time (0.8 s + 0.01 s);
  // the students' 0.31 s beside it take 0.465 s, then the teacher's last 0.5 s: 4 samples in
  // 0.965 s.
  const auto& dedicated = by_name.at("1 teacher(s) + 2 student(s)");
  EXPECT_EQ(dedicated.replica_batch, 4);
  EXPECT_EQ(dedicated.micro_batch, 1);
  EXPECT_NEAR(dedicated.samples_per_s, 4 / 0.965, 1e-9);
  EXPECT_EQ(layout_flags(dedicated), "--teacher.ranks 1 --teacher.micro_batch 1");
  // Colocated: each rank's batch of 2 one at a time, 2 x (0.2 + 0.15) + 2 x 0.01 on each of 3
  // ranks sharing 2 cores.
  const auto& co = by_name.at("colocated x3");
  EXPECT_EQ(co.replica_batch, 2);
  EXPECT_EQ(co.micro_batch, 1);
  EXPECT_NEAR(co.samples_per_s, 6 / (3 * 0.72 / 2), 1e-9);
  const auto table = format_speeds(in, predict_layouts(in));
  EXPECT_NE(table.find("teacher forward by size: 4 a forward 0.330 s/sample, 2 a forward 0.250 s/sample, 1 a "
                       "forward 0.200 s/sample"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("recommended layout: colocated x3 (--teacher.placement colocated --teacher.micro_batch 1)"),
            std::string::npos)
      << table;
}

TEST(Speed, AHeavyTeacherOnADeviceEachIsRankedByItsSlowestRank) {
  // 4 GPUs, a teacher forward 10x a student step: colocated computes 1.1 s a sample on every
  // GPU (3.6 samples/s); 3 stages feeding one student are next (3/s); one teacher for three
  // students is last (1/s).
  SpeedInput in;
  in.teacher = dit(512, 1024, 8, 8, 256);
  in.student = dit(256, 512, 4, 4, 256);
  in.ranks = 4;
  in.cores = 0;
  in.batch = 1;
  in.teacher_measured_s = 1.0;
  in.student_measured_s = 0.1;
  in.step_overhead_s = 0;
  const auto ranked = predict_layouts(in);
  ASSERT_EQ(ranked.size(), 5u) << format_speeds(in, ranked);
  EXPECT_EQ(ranked.front().name, "colocated x4");
  EXPECT_NEAR(ranked.front().samples_per_s, 4 / 1.1, 1e-9);
  EXPECT_EQ(ranked[1].name, "1 replica(s) x 3 stages + 1 student(s)");
  EXPECT_NEAR(ranked[1].samples_per_s, 3.0, 1e-9);
  EXPECT_EQ(ranked.back().name, "1 teacher(s) + 3 student(s)");
  EXPECT_NEAR(ranked.back().samples_per_s, 1.0, 1e-9);
  EXPECT_EQ(ranked.back().bound, "teacher");
}

TEST(PlannerSpeed, AWholeTeacherObjectiveListsNoShardStages) {
  auto in = small_job_on_two_cores();
  in.ranks = 5;
  bool staged = false;
  for (const auto& l : predict_layouts(in)) staged = staged || l.stages > 1;
  EXPECT_TRUE(staged);
  in.whole_teacher = true;
  for (const auto& l : predict_layouts(in)) EXPECT_EQ(l.stages, 1) << l.name;
}

}  // namespace
}  // namespace wd::plan::test_planner

namespace wd::plan::test_planner {
namespace {

// The stream's PCIe term (issue 46): the copies of a forward against its compute.

/// A TI2V-5B teacher (dim 3072, ffn 14336, 30 blocks: 163,656,704 parameters a block, 327.3 MB
/// in bf16) on a node of `host` bytes.
PlanInput ti2v_5b_on(std::uint64_t host) {
  auto in = small_job();
  in.teacher = {3072, 14336, 24, 30, 256, 163'656'704, 0, 1};
  in.host_budget = host;
  return in;
}

TEST(StreamTerm, TheArenaCopiesEveryBlockAtPcieSpeed) {
  const auto in = ti2v_5b_on(1024 * kGiB);
  ASSERT_TRUE(arena_fits(in));
  EXPECT_EQ(arena_bytes(in), 30ull * 163'656'704 * 2);
  const auto s = stream_cost(in, kPcieGbps);
  EXPECT_EQ(s.gbps, 50.0);
  EXPECT_EQ(s.blocks, 30);
  // 30 x 327.3 MB at 50 GB/s: 196.4 ms of copies a forward, 6.55 ms a block.
  EXPECT_NEAR(stream_copy_seconds(s), 30 * 327.313408e6 / 50e9, 1e-9);
  // Hidden behind the measured 265 ms resident forward (bench/results/gpu-h200.md); at 150 ms of
  // compute the copies bound the forward: 1.31x.
  EXPECT_NEAR(streamed_forward_seconds(0.265, s), 0.265, 1e-12);
  EXPECT_NEAR(streamed_forward_seconds(0.150, s) / 0.150, 196.388e-3 / 0.150, 1e-4);
  EXPECT_NE(s.source.find("pinned arena of 9.15 GiB, shared per node"), std::string::npos) << s.source;
}

TEST(StreamTerm, WithoutTheArenaTheCopyThreadsStageAtTheirMeasuredRateUpToPcie) {
  EXPECT_EQ(stream_gbps(50, false, 1), kStagingGbpsPerThread);
  EXPECT_EQ(stream_gbps(50, false, 4), 4 * kStagingGbpsPerThread);
  EXPECT_EQ(stream_gbps(50, false, 16), 50.0);  // never above the link
  EXPECT_EQ(stream_gbps(25, true, 1), 25.0);
  // The H200 runs' bench: 8 blocks of dim 1024 (16,802,816 parameters, 33.6 MB bf16) staged by
  // one thread against a 20.5 ms resident forward measured 2.2-2.5x; the model gives 2.38x.
  auto bench = small_job();
  bench.teacher = {1024, 4096, 8, 8, 256, 16'802'816, 0, 1};
  bench.arena_limit = 0;
  bench.copy_threads = 1;
  const auto s = stream_cost(bench, kPcieGbps);
  EXPECT_EQ(s.gbps, kStagingGbpsPerThread);
  const double ratio = streamed_forward_seconds(0.0205, s) / 0.0205;
  EXPECT_GT(ratio, 2.2);
  EXPECT_LT(ratio, 2.5);
  EXPECT_NE(s.source.find("mapped checkpoint, 1 copy threads (teacher.arena_limit 0: no arena)"), std::string::npos)
      << s.source;
}

TEST(StreamTerm, AnArenaOverItsLimitFallsBackInThePlan) {
  // 9.15 GiB of blocks on a 10 GiB node: over 80% of it (the default limit).
  auto in = ti2v_5b_on(10 * kGiB);
  EXPECT_FALSE(arena_fits(in));
  auto stream = placement(make_plan(in), Placement::kStream).teacher;
  EXPECT_EQ(stream.at(kStreamingBuffers).host, 163'656'704u * 2);  // the pinned staging block
  EXPECT_NE(stream.at(kTeacherWeights).note.find("mapped checkpoint, 4 copy threads (an arena of 9.15 GiB exceeds "
                                                 "its limit of 8.00 GiB)"),
            std::string::npos)
      << stream.at(kTeacherWeights).note;
  EXPECT_NE(format_plan(in, make_plan(in)).find("blocks stream from the mapped checkpoint"), std::string::npos);
  in.arena_limit = 16 * kGiB;  // teacher.arena_limit decides over the host's share
  EXPECT_TRUE(arena_fits(in));
  stream = placement(make_plan(in), Placement::kStream).teacher;
  EXPECT_EQ(stream.at(kStreamingBuffers).host, 0u);  // one DMA a block from the arena: no staging
  EXPECT_EQ(stream.at(kTeacherWeights).host, arena_bytes(in));
}

TEST(StreamTerm, AStreamedTeacherPaysItsCopiesPerForwardAndLayoutAutoSeesIt) {
  // 8 blocks of 25 MB at 10 GB/s: 20 ms of copies a forward; the forward computes 10 ms a sample.
  SpeedInput in;  // on 4 GPUs (ranks, no shared cores)
  in.teacher = dit(512, 1024, 8, 8, 256);
  in.student = dit(256, 512, 4, 4, 256);
  in.cores = 0;
  in.batch = 1;
  in.teacher_measured_s = 0.010;
  in.student_measured_s = 0.010;
  in.step_overhead_s = 0;
  in.stream = {true, 25e6, 8, 10, 10, "test"};
  // One sample a forward: copy-bound at 20 ms; four: the compute's 40 ms hides the copies.
  EXPECT_NEAR(teacher_forward(in, 1).seconds_per_sample, 0.020, 1e-12);
  EXPECT_NEAR(teacher_forward(in, 4).seconds_per_sample, 0.010, 1e-12);
  // Timed by size: the streamed copies make the smaller micro-batch the slower one.
  in.teacher_measured_by_size = {{2, 0.010}, {1, 0.008}};
  EXPECT_EQ(teacher_forward(in, 2).micro_batch, 0);
  EXPECT_NEAR(teacher_forward(in, 2).seconds_per_sample, 0.010, 1e-12);
  in.teacher_measured_by_size.clear();
  in.ranks = 4;
  const auto layouts = predict_layouts(in);
  int checked = 0;
  for (const auto& l : layouts) {
    if (l.name == "1 teacher(s) + 3 student(s)") {
      EXPECT_NEAR(l.stream_overhead, 1.0, 1e-9);  // a replica batch of 3: 30 ms compute hides 20 ms of copies
      ++checked;
    }
    if (l.name == "2 teacher(s) + 2 student(s)") {
      EXPECT_NEAR(l.stream_overhead, 2.0, 1e-9);  // one sample a forward: copy-bound
      EXPECT_NEAR(l.samples_per_s, 2 / 0.020, 1e-6);  // each teacher's 20 ms forward feeds its student
      ++checked;
    }
    if (l.colocated || l.stages > 1) {
      EXPECT_EQ(l.stream_overhead, 1.0) << l.name;
    }
  }
  EXPECT_EQ(checked, 2) << format_speeds(in, layouts);
  EXPECT_NE(format_speeds(in, layouts).find("stream: 8 blocks of 25.0 MB a forward from the test at 10.0 GB/s"),
            std::string::npos)
      << format_speeds(in, layouts);
}

}  // namespace
}  // namespace wd::plan::test_planner
