// Two teacher ranks of one node share one arena segment (issue 46): the first rank fills it, the
// second only maps it (the same inode, the same bytes); their proportional shares of it add up to
// one copy's worth of host memory; no name is left in /dev/shm; both ranks take the first rank's
// decision to fall back; and each rank's streamed forward from the shared arena equals its
// resident forward bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mpi_test_util.hpp"
#include "model/wan_checkpoint.hpp"
#include "teacher/host_arena.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::teacher::test_host_arena_mpi {
namespace {

using plan::Placement;

constexpr std::uint64_t kBytes = (24ull << 20) + 4096;  // 24 MiB and a page

/// The byte at offset i of the test's arena.
std::uint8_t pattern(std::uint64_t i) { return static_cast<std::uint8_t>((i * 2654435761ull) >> 13); }

/// Kilobytes of `field` ("Rss:", "Pss:") of this process's mapping that starts at `start`
/// (/proc/self/smaps); -1 when there is no such mapping.
std::int64_t smaps_kib(const void* start, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  std::ostringstream head;
  head << std::hex << reinterpret_cast<std::uintptr_t>(start) << "-";
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    const auto token = line.substr(0, line.find(' '));
    if (token.empty()) continue;
    if (token.back() != ':') {  // a mapping's header: "start-end perms offset dev inode path"
      inside = token.rfind(head.str(), 0) == 0;
      continue;
    }
    if (inside && token == field) return std::stoll(line.substr(field.size()));
  }
  return -1;
}

std::int64_t sum_over_ranks(std::int64_t v) {
  std::int64_t all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

TEST(HostArenaMpi, TwoTeacherRanksOfANodeMapOneSegmentFilledOnce) {
  int fills = 0;
  std::string why;
  auto arena = HostArena::create(
      MPI_COMM_WORLD, "shared", kBytes, kBytes,
      [&](std::uint8_t* data) {
        ++fills;
        for (std::uint64_t i = 0; i < kBytes; ++i) data[i] = pattern(i);
      },
      60, why);
  ASSERT_TRUE(arena) << why;
  const int rank = test::world_rank();
  EXPECT_EQ(arena->node_ranks(), 2);
  EXPECT_EQ(arena->filled_here(), rank == 0);
  EXPECT_EQ(fills, rank == 0 ? 1 : 0) << "only the node's first rank copies";
  EXPECT_EQ(arena->bytes(), kBytes);
  // The same segment: one inode on both ranks.
  std::uint64_t inode = arena->inode(), first = inode;
  MPI_Bcast(&first, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  EXPECT_EQ(inode, first);
  // Both see the bytes the first rank wrote (this reads every page of the second rank's mapping).
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < kBytes; ++i) wrong += arena->data()[i] != pattern(i) ? 1 : 0;
  EXPECT_EQ(wrong, 0u);
  MPI_Barrier(MPI_COMM_WORLD);  // both ranks have touched every page before the counts
  // Each rank has the whole segment resident, but the proportional shares add up to one copy.
  const auto rss = smaps_kib(arena->data(), "Rss:");
  const auto pss = smaps_kib(arena->data(), "Pss:");
  EXPECT_EQ(rss, static_cast<std::int64_t>(kBytes / 1024));
  const auto one_copy = static_cast<std::int64_t>(kBytes / 1024);
  EXPECT_NEAR(static_cast<double>(sum_over_ranks(pss)), static_cast<double>(one_copy), 8.0)
      << "Pss " << pss << " KiB here, one copy is " << one_copy << " KiB";
  // No name outlives the load.
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + arena->name())) << arena->name();
  EXPECT_EQ(test::failures_anywhere(::testing::Test::HasFailure() ? 1 : 0), 0);
}

TEST(HostArenaMpi, EveryRankTakesTheFirstRanksDecisionToFallBack) {
  std::string why;
  int fills = 0;
  // The second rank's own limit would fit: the first rank decides for the node.
  const std::uint64_t limit = test::world_rank() == 0 ? 4096 : kBytes;
  const auto arena = HostArena::create(
      MPI_COMM_WORLD, "too-small", kBytes, limit, [&](std::uint8_t*) { ++fills; }, 60, why);
  EXPECT_FALSE(arena);
  EXPECT_EQ(fills, 0);
  EXPECT_NE(why.find("exceed the limit of 4.00 KiB"), std::string::npos) << why;
  EXPECT_EQ(test::failures_anywhere(::testing::Test::HasFailure() ? 1 : 0), 0);
}

TEST(HostArenaMpi, EachRanksStreamedForwardFromTheSharedArenaEqualsItsResidentOne) {
  // Both ranks write the same random teacher (same seed) into a folder of their own.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("wd-arena-mpi-" + std::to_string(::getpid()) + "-" + std::to_string(test::world_rank()));
  auto config = WanConfig::preset("tiny");
  config.num_layers = 3;
  write_random_wan_checkpoint((dir / "teacher").string(), config, torch::kFloat, 1ull << 20, 31);
  const auto ck = WanCheckpoint::open((dir / "teacher").string());
  StageLoad how;
  how.placement = Placement::kStream;
  how.dtype = torch::kBFloat16;
  how.blocks = {0, 3};
  how.arena_group = MPI_COMM_WORLD;
  how.arena_tag = "forward";
  auto streamed = load_stage_model(ck, how);
  ASSERT_TRUE(streamed.arena) << streamed.stream_source;
  EXPECT_EQ(streamed.arena->filled_here(), test::world_rank() == 0);
  how.placement = Placement::kCpu;
  std::vector<StageModel> a, b;
  a.push_back(std::move(streamed));
  b.push_back(load_stage_model(ck, how));
  TeacherStage stream_stage(std::move(a), nullptr, {0, 3}, {}), resident_stage(std::move(b), nullptr, {0, 3}, {});
  torch::manual_seed(7);
  StageBatch x, y;
  x.x_t = torch::randn({2, config.in_dim, 2, 8, 8});
  x.t = torch::tensor({700.f, 90.f});
  x.context = torch::randn({2, 5, config.text_dim});
  x.context_lens = torch::tensor({5, 2}, torch::kLong);
  y = x;
  stream_stage.run(x);
  resident_stage.run(y);
  EXPECT_TRUE(torch::equal(x.out, y.out));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(test::failures_anywhere(::testing::Test::HasFailure() ? 1 : 0), 0);
}

}  // namespace
}  // namespace wd::teacher::test_host_arena_mpi
