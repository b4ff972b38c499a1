// The stream placement's node arena on one rank: the streamed forward from the arena equals the
// resident one bit for bit, no /dev/shm entry outlives the load, the fallback to copy threads
// over the mapped checkpoint is taken and logged when the arena's limit is too small, and
// parallel_copy's pieces reassemble every tensor. (Two ranks of a node sharing one segment:
// tests/mpi/test_host_arena_mpi.cpp.)
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <sstream>

#include "model/wan_checkpoint.hpp"
#include "teacher/block_streamer.hpp"
#include "teacher/host_arena.hpp"
#include "teacher/teacher_stage.hpp"
#include "test_util.hpp"

namespace wd::teacher::test_host_arena {
namespace {

using plan::Placement;

/// Sends spdlog's default logger into a string for the scope's life.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream text_;
};

/// A small teacher stored in fp32, and a batch for it.
struct Fixture {
  test::TempDir dir{"wd-arena"};
  WanConfig config;
  StageBatch batch;
  Fixture() {
    config = WanConfig::preset("tiny");
    config.num_layers = 4;
    write_random_wan_checkpoint(dir.str("teacher"), config, torch::kFloat, 1ull << 20, 23);
    torch::manual_seed(5);
    batch.x_t = torch::randn({2, config.in_dim, 2, 8, 8});
    batch.t = torch::tensor({812.f, 40.f});
    batch.context = torch::randn({2, 6, config.text_dim});
    batch.context_lens = torch::tensor({6, 4}, torch::kLong);
  }
  WanCheckpoint checkpoint() const { return WanCheckpoint::open(dir.str("teacher")); }
  StageBatch inputs() const {
    StageBatch b;
    b.x_t = batch.x_t;
    b.t = batch.t;
    b.context = batch.context;
    b.context_lens = batch.context_lens;
    return b;
  }
};

StageLoad load_for(Placement p, c10::ScalarType dtype, std::optional<std::uint64_t> arena_limit) {
  StageLoad how;
  how.placement = p;
  how.dtype = dtype;
  how.blocks = {0, 4};
  how.arena_limit = arena_limit;
  how.copy_threads = 3;
  how.arena_tag = "unit";
  return how;
}

/// The outputs of two passes (the second on reused, prefetched buffers) of a stage of `m`.
std::vector<torch::Tensor> two_passes(StageModel m, const Fixture& f) {
  std::vector<StageModel> models;
  models.push_back(std::move(m));
  TeacherStage stage(std::move(models), nullptr, {0, 4}, {1});
  std::vector<torch::Tensor> out;
  for (int pass = 0; pass < 2; ++pass) {
    auto b = f.inputs();
    stage.run(b);
    out.push_back(b.out);
    out.push_back(b.features.at(1));
  }
  return out;
}

TEST(HostArena, StreamedForwardFromTheArenaEqualsTheResidentOneBitForBit) {
  Fixture f;  // stored fp32, computed in bf16: the arena holds the converted blocks
  const auto ck = f.checkpoint();
  auto streamed = load_stage_model(ck, load_for(Placement::kStream, torch::kBFloat16, std::nullopt));
  ASSERT_TRUE(streamed.arena) << streamed.stream_source;
  EXPECT_TRUE(streamed.arena->filled_here());
  EXPECT_EQ(streamed.arena->node_ranks(), 1);
  // One block of the slot layout per block, in the teacher's dtype.
  EXPECT_EQ(streamed.arena->bytes(), 4 * streamed.streamer->block_bytes());
  EXPECT_TRUE(test::contains(streamed.stream_source, "host arena /wd-")) << streamed.stream_source;
  // The name went as soon as the (only) rank had it mapped: nothing is left in /dev/shm.
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + streamed.arena->name()));
  const auto a = two_passes(std::move(streamed), f);
  const auto b = two_passes(load_stage_model(ck, load_for(Placement::kCpu, torch::kBFloat16, std::nullopt)), f);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "output " << i;
}

TEST(HostArena, ALimitTooSmallFallsBackToCopyThreadsOverTheMappedCheckpointAndSaysSo) {
  Fixture f;
  const auto ck = f.checkpoint();
  CapturedLog log;
  auto streamed = load_stage_model(ck, load_for(Placement::kStream, torch::kBFloat16, 4096));
  EXPECT_FALSE(streamed.arena);
  EXPECT_TRUE(test::contains(streamed.stream_source, "mapped checkpoint, 3 copy thread(s): no pinned arena"))
      << streamed.stream_source;
  EXPECT_TRUE(test::contains(streamed.stream_source, "exceed the limit of 4.00 KiB")) << streamed.stream_source;
  EXPECT_TRUE(test::contains(log.text(), "[warning] stream: blocks 0-3 from the mapped checkpoint, 3 copy thread(s)"))
      << log.text();
  const auto a = two_passes(std::move(streamed), f);
  const auto b = two_passes(load_stage_model(ck, load_for(Placement::kCpu, torch::kBFloat16, std::nullopt)), f);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "output " << i;
}

TEST(HostArena, LimitZeroMeansNoArenaWithoutAWarning) {
  Fixture f;
  CapturedLog log;
  const auto streamed = load_stage_model(f.checkpoint(), load_for(Placement::kStream, torch::kFloat, 0));
  EXPECT_FALSE(streamed.arena);
  EXPECT_TRUE(test::contains(streamed.stream_source, "teacher.arena_limit 0: no arena")) << streamed.stream_source;
  EXPECT_TRUE(test::contains(log.text(), "[info] stream: blocks 0-3 from the mapped checkpoint")) << log.text();
}

TEST(HostArena, AFailedFillLeavesNoSegmentAndTellsWhy) {
  std::string why;
  std::string name;
  const auto arena = HostArena::create(
      MPI_COMM_NULL, "failing", 1 << 20, 1 << 30,
      [&](std::uint8_t*) {
        throw Error("the fill failed on purpose");
      },
      10, why);
  EXPECT_FALSE(arena);
  EXPECT_TRUE(test::contains(why, "making it failed: the fill failed on purpose")) << why;
  // The segment's would-be name: this process's, tagged "failing".
  const auto path = "/dev/shm/wd-" + HostArena::job_id() + "-" + std::to_string(::getpid()) + "-failing";
  EXPECT_FALSE(std::filesystem::exists(path)) << path;
}

TEST(ParallelCopy, PiecesOverSeveralThreadsReassembleEveryTensorAndConvert) {
  // 9 M floats: a few 8 MiB pieces, the last one short; a small tensor and a conversion too.
  const auto big = torch::arange(9'000'001, torch::kFloat);
  const auto small = torch::randn({3, 5});
  auto big_out = torch::empty_like(big);
  auto small_out = torch::empty({3, 5}, torch::kBFloat16);
  parallel_copy({{big_out, big}, {small_out, small}}, 4);
  EXPECT_TRUE(torch::equal(big_out, big));
  EXPECT_TRUE(torch::equal(small_out, small.to(torch::kBFloat16)));
}

}  // namespace
}  // namespace wd::teacher::test_host_arena
