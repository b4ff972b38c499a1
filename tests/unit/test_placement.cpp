// Teacher placement: shard maps and balancing, the device rule, the block streamer (host as the
// device) and pipeline stages, each against the plain whole-model forward.
#include <gtest/gtest.h>

#include "core/errors.hpp"
#include "model/wan_checkpoint.hpp"
#include "teacher/block_streamer.hpp"
#include "teacher/compute_dtype.hpp"
#include "teacher/placement.hpp"
#include "teacher/teacher_stage.hpp"
#include "test_util.hpp"

namespace wd::teacher::test_placement {
namespace {

using plan::Placement;

TEST(ShardMap, ParsesContiguousRanges) {
  const auto r = parse_shard_map("0-13, 14-27,28-39", 40);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], (BlockRange{0, 14}));
  EXPECT_EQ(r[1], (BlockRange{14, 28}));
  EXPECT_EQ(r[2], (BlockRange{28, 40}));
  EXPECT_EQ(parse_shard_map("0,1-3", 4)[0], (BlockRange{0, 1}));
}

TEST(ShardMap, RejectsGapsOverlapsAndShortMapsNamingTheRange) {
  const auto message = [](const std::string& map, std::int64_t layers) {
    try {
      parse_shard_map(map, layers);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_TRUE(test::contains(message("0-13,15-39", 40), "'15-39' starts at 15, not 14"));
  EXPECT_TRUE(test::contains(message("0-20,14-39", 40), "starts at 14, not 21"));
  EXPECT_TRUE(test::contains(message("0-13,14-27", 40), "blocks 28-39 are in no stage"));
  EXPECT_TRUE(test::contains(message("0-13,14-40", 40), "reaches past the last block 39"));
  EXPECT_TRUE(test::contains(message("0-x,14-39", 40), "'0-x' is not FIRST-LAST"));
  EXPECT_TRUE(test::contains(message("0-3", 4 + 4), "teacher.shard_map(0-3)"));
}

TEST(BalanceShards, EqualBlocksSplitEvenly) {
  const std::vector<std::uint64_t> blocks(10, 100);
  const auto r = balance_shards(blocks, 0, 3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r.front().begin, 0);
  EXPECT_EQ(r.back().end, 10);
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_GE(r[i].size(), 3) << i;  // 3 + 3 + 4 in some order, never 4 + 4 + 2
    EXPECT_LE(r[i].size(), 4) << i;
    if (i > 0) {
      EXPECT_EQ(r[i].begin, r[i - 1].end);
    }
  }
  const auto forty = balance_shards(std::vector<std::uint64_t>(40, 7), 0, 4);
  for (const auto& s : forty) EXPECT_EQ(s.size(), 10);
}

TEST(BalanceShards, TheHeadWeighsOnTheLastStage) {
  // 4 equal blocks and a head worth one block: 2 stages split 3 + (1 + head).
  const std::vector<std::uint64_t> blocks(4, 100);
  const auto r = balance_shards(blocks, 100, 2);
  EXPECT_EQ(r[0], (BlockRange{0, 3}));
  EXPECT_EQ(r[1], (BlockRange{3, 4}));
}

TEST(BalanceShards, UnevenBlocksMinimiseTheLargestStage) {
  const std::vector<std::uint64_t> blocks{10, 10, 10, 70, 10, 10};
  const auto r = balance_shards(blocks, 0, 3);
  std::uint64_t largest = 0;
  for (const auto& s : r) {
    std::uint64_t bytes = 0;
    for (auto i = s.begin; i < s.end; ++i) bytes += blocks[static_cast<std::size_t>(i)];
    largest = std::max(largest, bytes);
  }
  EXPECT_EQ(largest, 70u);  // the big block alone
  EXPECT_THROW(balance_shards(blocks, 0, 7), ConfigError);
}

TEST(StagesFor, FollowsStagesThenTheMapThenTheRanks) {
  TeacherConfig c;
  c.ranks = 4;
  EXPECT_EQ(stages_for(c, Placement::kCpu), 1);
  EXPECT_EQ(stages_for(c, Placement::kShard), 4);
  c.shard_map = "0-1,2-3";
  EXPECT_EQ(stages_for(c, Placement::kShard), 2);
  c.stages = 2;
  c.shard_map.clear();
  EXPECT_EQ(stages_for(c, Placement::kShard), 2);
}

TEST(TeacherConfig, ValidatesPlacementKeys) {
  TeacherConfig c;
  OptionTable table("teacher");
  c.bind(table);
  EXPECT_THROW(parse_options({"--teacher.placement", "disk"}, table), ConfigError) << "a name outside the table";
  c.placement = TeacherPlacement::kCpu;
  c.shard_map = "0-1,2-3";
  ConfigProblems q;
  c.validate(q);
  try {
    q.throw_if_any("t");
    FAIL() << "a shard map without shard placement was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "teacher.shard_map(0-1,2-3) needs teacher.placement = shard"));
  }
}

TEST(TeacherDevice, CpuBuildRunsStreamAndShardOnTheHostAndRefusesGpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA build picks cuda:<local rank>";
  TeacherConfig c;
  EXPECT_TRUE(teacher_device(c, Placement::kCpu, 3).is_cpu());
  EXPECT_TRUE(teacher_device(c, Placement::kStream, 3).is_cpu());
  EXPECT_TRUE(teacher_device(c, Placement::kShard, 1).is_cpu());
  EXPECT_THROW(teacher_device(c, Placement::kGpu, 0), ConfigError);
}

/// A small fp32 teacher on disk, and a batch for it.
struct Fixture {
  test::TempDir dir{"wd-placement"};
  WanConfig config;
  StageBatch batch;
  explicit Fixture(c10::ScalarType stored = torch::kFloat) {
    config = WanConfig::preset("tiny");
    config.num_layers = 5;
    write_random_wan_checkpoint(dir.str("teacher"), config, stored, 1ull << 20, 11);
    torch::manual_seed(3);
    const std::int64_t B = 3;
    batch.x_t = torch::randn({B, config.in_dim, 2, 8, 8});
    batch.t = torch::tensor({900.f, 412.5f, 17.f});
    batch.context = torch::randn({B, 7, config.text_dim});
    batch.context_lens = torch::tensor({7, 3, 5}, torch::kLong);
  }
  WanCheckpoint checkpoint() const { return WanCheckpoint::open(dir.str("teacher")); }
};

StageBatch copy_inputs(const StageBatch& b) {
  StageBatch c;
  c.x_t = b.x_t;
  c.t = b.t;
  c.context = b.context;
  c.context_lens = b.context_lens;
  return c;
}

TeacherStage make_stage(const WanCheckpoint& ck, Placement p, BlockRange blocks,
                        std::optional<c10::ScalarType> dtype, std::vector<std::int64_t> features = {},
                        int ahead = 2) {
  StageLoad how;
  how.placement = p;
  how.dtype = dtype;
  how.blocks = blocks;
  how.stream_ahead = ahead;
  std::vector<StageModel> models;
  models.push_back(load_stage_model(ck, how));
  return TeacherStage(std::move(models), nullptr, blocks, std::move(features));
}

TEST(BlockStreamer, StreamedForwardIsBitIdenticalToTheResidentOne) {
  Fixture f;
  const auto ck = f.checkpoint();
  const BlockRange all{0, f.config.num_layers};
  auto resident = make_stage(ck, Placement::kCpu, all, torch::kFloat, {1, 3});
  auto streamed = make_stage(ck, Placement::kStream, all, torch::kFloat, {1, 3});
  for (int pass = 0; pass < 2; ++pass) {  // the second pass runs on prefetched, reused buffers
    auto a = copy_inputs(f.batch), b = copy_inputs(f.batch);
    resident.run(a);
    streamed.run(b);
    EXPECT_TRUE(torch::equal(a.out, b.out)) << "pass " << pass;
    EXPECT_TRUE(torch::equal(a.features.at(1), b.features.at(1)));
    EXPECT_TRUE(torch::equal(a.features.at(3), b.features.at(3)));
  }
}

TEST(BlockStreamer, ConvertsWhileCopyingLikeALoadInTheTeacherDtype) {
  Fixture f;  // stored fp32, computed in bf16
  const auto ck = f.checkpoint();
  const BlockRange all{0, f.config.num_layers};
  auto resident = make_stage(ck, Placement::kCpu, all, torch::kBFloat16);
  auto streamed = make_stage(ck, Placement::kStream, all, torch::kBFloat16);
  auto a = copy_inputs(f.batch), b = copy_inputs(f.batch);
  resident.run(a);
  streamed.run(b);
  EXPECT_TRUE(torch::equal(a.out, b.out));
}

TEST(BlockStreamer, CopiesAheadIntoReusedBuffersInOrder) {
  Fixture f;
  const auto ck = f.checkpoint();
  StageLoad how;
  how.placement = Placement::kStream;
  how.blocks = {0, f.config.num_layers};
  how.stream_ahead = 2;
  auto m = load_stage_model(ck, how);
  ASSERT_TRUE(m.streamer);
  const auto slots = m.streamer->buffer_bytes() / m.streamer->block_bytes();
  EXPECT_EQ(slots, 3u);  // ahead + 1, allocated once
  m.streamer->record(true);
  std::vector<StageModel> models;
  models.push_back(std::move(m));
  TeacherStage stage(std::move(models), nullptr, how.blocks, {});
  for (int pass = 0; pass < 3; ++pass) {
    auto b = copy_inputs(f.batch);
    stage.run(b);
  }
  const auto& streamer = *stage.experts().front().streamer;
  const auto& ev = streamer.events();
  const auto L = f.config.num_layers;
  // Per pass every block computes once, in order; its copy was started before it computes,
  // and the copy of the block after it was started before it computes (the overlap).
  std::vector<std::int64_t> computed;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].kind != StreamEvent::kComputeStarted) continue;
    const auto blk = ev[i].block;
    computed.push_back(blk);
    const auto next = (blk + 1) % L;
    bool own = false, ahead = false;
    for (std::size_t j = 0; j < i; ++j) {
      if (ev[j].kind != StreamEvent::kCopyStarted) continue;
      if (ev[j].block == blk) own = true;
      if (ev[j].block == next) ahead = true;
    }
    EXPECT_TRUE(own) << "block " << blk << " computed before its copy started";
    EXPECT_TRUE(ahead) << "block " << next << " was not in flight while block " << blk << " computed";
    EXPECT_LT(ev[i].slot, 3u);
  }
  ASSERT_EQ(computed.size(), static_cast<std::size_t>(3 * L));
  for (std::size_t i = 0; i < computed.size(); ++i) EXPECT_EQ(computed[i], static_cast<std::int64_t>(i) % L);
  // Wrapping prefetch: the next pass's first blocks are copied during this pass, so each
  // block is copied once per pass plus the lookahead past the end of the last pass.
  EXPECT_EQ(streamer.copied_bytes(), static_cast<std::uint64_t>(3 * L + 2) * streamer.block_bytes());
  // A slot is never refilled while its block computes.
  std::vector<std::int64_t> computing_in(3, -1);
  for (const auto& e : ev) {
    if (e.kind == StreamEvent::kComputeStarted) computing_in[e.slot] = e.block;
    if (e.kind == StreamEvent::kComputeDone) computing_in[e.slot] = -1;
    if (e.kind == StreamEvent::kCopyStarted) {
      EXPECT_EQ(computing_in[e.slot], -1) << "slot " << e.slot;
    }
  }
}

TEST(BlockStreamer, RefusesBlocksOutOfOrder) {
  Fixture f;
  const auto ck = f.checkpoint();
  StageLoad how;
  how.placement = Placement::kStream;
  how.blocks = {0, f.config.num_layers};
  auto m = load_stage_model(ck, how);
  m.streamer->before(0);
  m.streamer->after(0);
  EXPECT_THROW(m.streamer->before(2), Error);
}

TEST(PipelineStages, ChainedStagesEqualTheWholeModelBitForBit) {
  Fixture f;
  const auto ck = f.checkpoint();
  const std::vector<std::int64_t> features{1, 3};
  auto whole = make_stage(ck, Placement::kCpu, {0, 5}, torch::kFloat, features);
  auto a = copy_inputs(f.batch);
  whole.run(a);
  for (const auto& map : {std::string("0-1,2-4"), std::string("0-0,1-3,4-4")}) {
    const auto ranges = parse_shard_map(map, 5);
    auto b = copy_inputs(f.batch);
    for (const auto& r : ranges) {
      auto stage = make_stage(ck, Placement::kShard, r, torch::kFloat, features);
      // Only this stage's blocks are loaded; the others stay empty placeholders.
      for (std::int64_t i = 0; i < 5; ++i) {
        const bool held = i >= r.begin && i < r.end;
        EXPECT_EQ(stage.experts().front().model->block_parameters(i).front().numel() > 0, held)
            << map << " block " << i;
      }
      stage.run(b);
      EXPECT_EQ(stage.last(), r.end == 5);
      if (!stage.last()) {
        EXPECT_FALSE(b.out.defined());
      }
    }
    EXPECT_TRUE(torch::equal(a.out, b.out)) << map;
    EXPECT_TRUE(torch::equal(a.features.at(1), b.features.at(1))) << map;
    EXPECT_TRUE(torch::equal(a.features.at(3), b.features.at(3))) << map;
  }
}

/// Equal up to the last bits: max |a - b| within 1e-6 of max |a|.
::testing::AssertionResult close(const torch::Tensor& a, const torch::Tensor& b) {
  const double diff = (a - b).abs().max().item<double>(), scale = a.abs().max().item<double>();
  if (diff <= 1e-6 * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a - b| = " << diff << " of max |a| = " << scale;
}

TEST(MicroBatch, SlicedForwardsEqualTheWholeBatchToTheBlasRounding) {
  // Every op of the forward is per sample, so slicing changes only the row count of each
  // matmul. Whether that changes bits is the BLAS's business: OpenBLAS picks kernels by matrix
  // size, and here (32 tokens a sample) the outputs differ in the last bits (1.7e-6 of a
  // max of ~4). So: equal to 1e-6 of the output's scale, in fp32 on one thread.
  Fixture f;
  const auto ck = f.checkpoint();
  const std::vector<std::int64_t> features{1, 3};
  auto whole = make_stage(ck, Placement::kCpu, {0, 5}, torch::kFloat, features);
  auto a = copy_inputs(f.batch);
  whole.run(a);
  for (const std::int64_t micro : {1, 2}) {  // 3 samples: even slices, and a short last one
    auto stage = make_stage(ck, Placement::kCpu, {0, 5}, torch::kFloat, features);
    stage.set_micro_batch(micro);
    auto b = copy_inputs(f.batch);
    stage.run(b);
    ASSERT_EQ(b.out.sizes(), a.out.sizes());
    EXPECT_TRUE(close(a.out, b.out)) << "micro-batch " << micro;
    EXPECT_TRUE(close(a.features.at(1), b.features.at(1))) << "micro-batch " << micro;
    EXPECT_TRUE(close(a.features.at(3), b.features.at(3))) << "micro-batch " << micro;
    // Sample order is kept: each slice's output lands at its samples' rows.
    EXPECT_TRUE(close(a.out[2], b.out[2])) << "micro-batch " << micro;
  }
  // A later pipeline stage slices the received hidden state and features alike.
  auto first = make_stage(ck, Placement::kShard, {0, 2}, torch::kFloat, features);
  auto later = make_stage(ck, Placement::kShard, {2, 5}, torch::kFloat, features);
  later.set_micro_batch(2);
  auto c = copy_inputs(f.batch);
  first.run(c);
  later.run(c);
  EXPECT_TRUE(close(a.out, c.out));
  EXPECT_TRUE(close(a.features.at(1), c.features.at(1)));
}

TEST(TeacherCompute, Bf16WeightsComputedInFp32EqualAnFp32ModelOfTheSameValues) {
  Fixture f(torch::kBFloat16);  // stored bf16: the fp32 load holds exactly the bf16 values
  const auto ck = f.checkpoint();
  auto as_fp32 = make_stage(ck, Placement::kCpu, {0, 5}, torch::kFloat);
  auto as_bf16 = make_stage(ck, Placement::kCpu, {0, 5}, torch::kBFloat16);
  as_bf16.experts().front().model.ptr()->set_compute_dtype(torch::kFloat);
  EXPECT_EQ(as_bf16.experts().front().model->dtype(), torch::kBFloat16) << "the weights stay bf16";
  auto a = copy_inputs(f.batch), b = copy_inputs(f.batch);
  as_fp32.run(a);
  as_bf16.run(b);
  EXPECT_TRUE(torch::equal(a.out, b.out));
  // Without the override the bf16 weights compute in bf16: a different (rounded) result.
  as_bf16.experts().front().model.ptr()->set_compute_dtype(std::nullopt);
  auto c = copy_inputs(f.batch);
  as_bf16.run(c);
  EXPECT_FALSE(torch::equal(a.out, c.out));
  EXPECT_LT((a.out - c.out).abs().max().item<double>(), 0.1 * a.out.abs().max().item<double>());
}

TEST(TeacherCompute, SettingsDecideAndAutoMeasuresOnlyHalfWeightsOnTheHost) {
  const c10::Device cpu(torch::kCPU);
  EXPECT_FALSE(choose_compute(TeacherCompute::kWeights, torch::kBFloat16, cpu).dtype.has_value());
  EXPECT_EQ(choose_compute(TeacherCompute::kFp32, torch::kBFloat16, cpu).dtype, torch::kFloat);
  EXPECT_FALSE(choose_compute(TeacherCompute::kFp32, torch::kFloat, cpu).dtype.has_value()) << "fp32 weights need no override";
  const auto fp32 = choose_compute(TeacherCompute::kAuto, torch::kFloat, cpu);
  EXPECT_FALSE(fp32.dtype.has_value());
  EXPECT_EQ(fp32.reason.find("GFLOP/s"), std::string::npos) << "nothing to measure: " << fp32.reason;
  // bf16 on the host: measured; either answer is right for some CPU, and the log says why.
  const auto half = choose_compute(TeacherCompute::kAuto, torch::kBFloat16, cpu);
  EXPECT_NE(half.reason.find("GFLOP/s"), std::string::npos) << half.reason;
  EXPECT_EQ(half.dtype.has_value(), half.reason.find("matmuls in fp32") != std::string::npos) << half.reason;
  EXPECT_GT(matmul_gflops(torch::kFloat, cpu), 0.0);
}

TEST(TeacherConfig, ComputeMicroBatchAndColocatedKeysAreChecked) {
  TeacherConfig c;
  ConfigProblems p;
  c.micro_batch = "-1";
  c.placement = TeacherPlacement::kColocated;
  c.ranks = 2;
  c.validate(p);
  ASSERT_EQ(p.list().size(), 2u);
  EXPECT_NE(p.list()[0].find("teacher.micro_batch(-1) must be auto or a number of samples >= 0"), std::string::npos);
  EXPECT_NE(p.list()[1].find("teacher.ranks(2) is not used there"), std::string::npos);
  // teacher.compute is a closed choice: another name stops the parse.
  try {
    parse_choice<TeacherCompute>("teacher.compute", "fast");
    FAIL() << "teacher.compute fast was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("teacher.compute(fast) must be one of auto, weights, fp32"), std::string::npos);
  }
  for (const auto* good : {"0", "3", "auto"}) {
    ConfigProblems ok;
    TeacherConfig d;
    d.micro_batch = good;
    d.validate(ok);
    EXPECT_TRUE(ok.list().empty()) << good;
  }
  for (const auto* bad : {"", "two", "2.5", "99999999999999999999"}) {
    ConfigProblems wrong;
    TeacherConfig d;
    d.micro_batch = bad;
    d.validate(wrong);
    EXPECT_EQ(wrong.list().size(), 1u) << bad;
  }
  TeacherConfig d;
  d.micro_batch = "4";
  EXPECT_EQ(d.micro_batch_samples(), std::optional<std::int64_t>(4));
  d.micro_batch = "auto";
  EXPECT_FALSE(d.micro_batch_samples().has_value());
}

TEST(PipelineStages, ExpertsRouteSamplesAndMergeInBatchOrder) {
  Fixture f;
  const auto ck = f.checkpoint();
  test::TempDir other("wd-expert");
  write_random_wan_checkpoint(other.str("high"), f.config, torch::kFloat, 1ull << 20, 99);
  const auto high_ck = WanCheckpoint::open(other.str("high"));
  StageLoad how;
  how.blocks = {0, 5};
  how.dtype = torch::kFloat;
  std::vector<StageModel> models;
  models.push_back(load_stage_model(ck, how));
  models.push_back(load_stage_model(high_ck, how));
  // Samples with t >= 500 go to the second model.
  Router router = [](const torch::Tensor& t) {
    std::vector<std::vector<std::int64_t>> r(2);
    for (std::int64_t i = 0; i < t.size(0); ++i) r[t[i].item<float>() >= 500 ? 1 : 0].push_back(i);
    return r;
  };
  TeacherStage moe(std::move(models), router, how.blocks, {2});
  auto b = copy_inputs(f.batch);
  moe.run(b);
  auto low = make_stage(ck, Placement::kCpu, how.blocks, torch::kFloat, {2});
  auto high = make_stage(high_ck, Placement::kCpu, how.blocks, torch::kFloat, {2});
  // Each sample alone through its expert.
  for (std::int64_t i = 0; i < 3; ++i) {
    StageBatch one;
    one.x_t = f.batch.x_t.slice(0, i, i + 1);
    one.t = f.batch.t.slice(0, i, i + 1);
    one.context = f.batch.context.slice(0, i, i + 1);
    one.context_lens = f.batch.context_lens.slice(0, i, i + 1);
    (f.batch.t[i].item<float>() >= 500 ? high : low).run(one);
    EXPECT_TRUE(torch::allclose(b.out[i], one.out[0], 1e-5, 1e-6)) << "sample " << i;
    EXPECT_TRUE(torch::allclose(b.features.at(2)[i], one.features.at(2)[0], 1e-5, 1e-6)) << "sample " << i;
  }
}

}  // namespace
}  // namespace wd::teacher::test_placement

namespace wd::teacher::test_placement {
namespace {

/// `b`'s inputs with `negative` ([L',D]; undefined: zeros of b's context) as every sample's
/// context, all of its rows valid: the negative half of a guided forward, run on its own.
StageBatch negative_inputs(const StageBatch& b, const torch::Tensor& negative) {
  auto n = copy_inputs(b);
  const auto B = b.x_t.size(0);
  n.context = negative.defined() ? negative.unsqueeze(0).expand({B, -1, -1}).contiguous() : torch::zeros_like(b.context);
  n.context_lens = torch::full({B}, n.context.size(1), torch::kLong);
  return n;
}

TEST(Guidance, TheGuidedTargetIsTheNegativePlusGTimesTheConditionalStep) {
  Fixture f;
  const auto ck = f.checkpoint();
  const BlockRange all{0, f.config.num_layers};
  auto plain = make_stage(ck, Placement::kCpu, all, torch::kFloat, {2});
  auto guided = make_stage(ck, Placement::kCpu, all, torch::kFloat, {2});
  for (const auto& negative : {torch::Tensor(), torch::randn({4, f.config.text_dim})}) {
    guided.set_guidance(3.0, negative);
    auto cond = copy_inputs(f.batch), neg = negative_inputs(f.batch, negative), both = copy_inputs(f.batch);
    plain.run(cond);
    plain.run(neg);
    guided.run(both);
    const auto want = neg.out + 3.0 * (cond.out - neg.out);
    EXPECT_TRUE(torch::allclose(both.out, want, 1e-5, 1e-5))
        << "max error " << (both.out - want).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(both.features.at(2), cond.features.at(2), 1e-5, 1e-5)) << "the conditional features";
    EXPECT_EQ(both.out.sizes(), cond.out.sizes());
  }
  // In micro-batches of one sample: the same target.
  auto sliced = make_stage(ck, Placement::kCpu, all, torch::kFloat);
  sliced.set_guidance(3.0);
  guided.set_guidance(3.0);
  sliced.set_micro_batch(1);
  auto a = copy_inputs(f.batch), b = copy_inputs(f.batch);
  guided.run(a);
  sliced.run(b);
  EXPECT_TRUE(torch::allclose(a.out, b.out, 1e-5, 1e-5));
}

TEST(Guidance, NeedsTheWholeTeacherOnOneRank) {
  Fixture f;
  auto first_half = make_stage(f.checkpoint(), Placement::kCpu, {0, 2}, torch::kFloat);
  try {
    first_half.set_guidance(4.0);
    FAIL() << "a partial stage accepted guidance";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "teacher.guidance needs the whole teacher on one rank")) << e.what();
  }
}

}  // namespace
}  // namespace wd::teacher::test_placement
