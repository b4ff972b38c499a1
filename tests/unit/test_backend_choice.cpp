// choose_backend: which library carries a group's tensors, for every kind of group, and the
// errors comm.backend nccl gives where NCCL cannot work.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/backend_choice.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"

namespace wd::comm::test_backend_choice {
namespace {

std::vector<RankDevice> group(std::vector<RankDevice> ends) { return ends; }

/// The ConfigError's message of choose_backend(nccl, ...); fails the test when it does not throw.
std::string nccl_error(const std::vector<RankDevice>& ends, bool built = true) {
  try {
    choose_backend(CommBackend::kNccl, ends, built, "the link");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "comm.backend nccl was accepted";
  return "";
}

TEST(BackendChoice, DistinctGpusGetNcclUnderAutoAndNccl) {
  // Two nodes: the same index on different hosts is two GPUs.
  const auto ends = group({{0, "a", 0}, {1, "a", 1}, {2, "b", 0}, {3, "b", 1}});
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kNccl);
  EXPECT_EQ(automatic.reason, "all 4 rank(s) on distinct GPUs");
  EXPECT_EQ(choose_backend(CommBackend::kNccl, ends, true, "the link").backend, Backend::kNccl);
  EXPECT_EQ(choose_backend(CommBackend::kMpi, ends, true, "the link").backend, Backend::kMpi);
}

TEST(BackendChoice, AHostRankMeansMpiAndNcclNamesIt) {
  const auto ends = group({{0, "a", -1}, {1, "a", 0}, {2, "a", 1}});
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  EXPECT_EQ(automatic.reason, "rank 0 (host on a) holds host tensors");
  EXPECT_EQ(nccl_error(ends).rfind("comm.backend(nccl) cannot carry the link: rank 0 (host on a) holds "
                                   "host tensors; use comm.backend auto or mpi",
                                   0),
            0u);
}

TEST(BackendChoice, TwoRanksOnOneGpuMeansMpiAndNcclNamesBoth) {
  const auto ends = group({{0, "a", 0}, {1, "a", 1}, {2, "a", 0}});
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  const std::string want = "rank 0 (cuda:0 on a) and rank 2 (cuda:0 on a) share one GPU";
  EXPECT_EQ(automatic.reason.rfind(want, 0), 0u) << automatic.reason;
  EXPECT_NE(nccl_error(ends).find(want), std::string::npos);
}

TEST(BackendChoice, NoNcclInTheBuildMeansMpi) {
  const auto ends = group({{0, "a", 0}, {1, "a", 1}});
  const auto automatic = choose_backend(CommBackend::kAuto, ends, false, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  EXPECT_NE(automatic.reason.find("this build has no NCCL transport"), std::string::npos);
  EXPECT_NE(nccl_error(ends, false).find("this build has no NCCL transport"), std::string::npos);
}

// Per-rank CUDA_VISIBLE_DEVICES (SLURM --gpus-per-task, --gpu-bind=single:1, cgroups): every
// rank of a node sees its own GPU as cuda:0. The bus ids tell the GPUs apart.
std::vector<RankDevice> bound_node(const std::string& host, int first_rank, int ranks) {
  std::vector<RankDevice> ends;
  for (int i = 0; i < ranks; ++i) {
    char bus[16];
    std::snprintf(bus, sizeof bus, "0000:%02X:00.0", 0x18 + 0x10 * i);  // 0000:18:00.0, 0000:28:00.0, ...
    ends.push_back({first_rank + i, host, 0, bus});
  }
  return ends;
}

TEST(BackendChoice, EightRanksEachSeeingCuda0WithDistinctBusIdsGetNccl) {
  const auto ends = bound_node("a", 0, 8);
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the gradient all-reduce");
  EXPECT_EQ(automatic.backend, Backend::kNccl) << automatic.reason;
  EXPECT_EQ(automatic.reason, "all 8 rank(s) on distinct GPUs");
  EXPECT_EQ(choose_backend(CommBackend::kNccl, ends, true, "the gradient all-reduce").backend, Backend::kNccl);
  for (const auto& e : ends) EXPECT_TRUE(sharing_gpu_with(ends, e.world_rank).empty()) << e.describe();
}

TEST(BackendChoice, OneBusIdUnderTwoIndicesIsOneGpu) {
  // Rank 1 sees the node's GPUs in another order (CUDA_VISIBLE_DEVICES=1,0): its cuda:1 is
  // rank 0's cuda:0. Indices differ, the bus id says it is one GPU.
  const std::vector<RankDevice> ends{{0, "a", 0, "0000:18:00.0"}, {1, "a", 1, "0000:18:00.0"}};
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  const std::string want =
      "rank 0 (cuda:0 [0000:18:00.0] on a) and rank 1 (cuda:1 [0000:18:00.0] on a) share one GPU "
      "(NCCL refuses two ranks of one communicator on one GPU)";
  EXPECT_EQ(automatic.reason, want);
  EXPECT_NE(nccl_error(ends).find(want), std::string::npos);
}

TEST(BackendChoice, TwoRanksWithOneBusIdAmongBoundRanksMeanMpi) {
  auto ends = bound_node("a", 0, 4);
  ends[3].bus_id = ends[1].bus_id;  // ranks 1 and 3 were bound to one GPU
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  EXPECT_EQ(automatic.reason.rfind("rank 1 (cuda:0 [0000:28:00.0] on a) and rank 3 (cuda:0 [0000:28:00.0] on a) "
                                   "share one GPU",
                                   0),
            0u)
      << automatic.reason;
  EXPECT_EQ(sharing_gpu_with(ends, 1).size(), 1u);
  EXPECT_EQ(sharing_gpu_with(ends, 1).front().world_rank, 3);
  EXPECT_EQ(sharing_gpu_with(ends, 3).front().world_rank, 1);
  EXPECT_TRUE(sharing_gpu_with(ends, 0).empty());
}

TEST(BackendChoice, BoundNodesRepeatBusIdsAcrossHosts) {
  // Two nodes of one model: the same bus ids on each, one rank per GPU, all seeing cuda:0.
  auto ends = bound_node("a", 0, 4);
  for (const auto& e : bound_node("b", 4, 4)) ends.push_back(e);
  EXPECT_EQ(choose_backend(CommBackend::kAuto, ends, true, "the link").backend, Backend::kNccl);
  // A ninth rank bound to a GPU of node b that rank 6 holds: shared there, not on node a.
  ends.push_back({8, "b", 0, ends[6].bus_id});
  const auto automatic = choose_backend(CommBackend::kAuto, ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  EXPECT_EQ(automatic.reason.rfind("rank 6 (cuda:0 [0000:38:00.0] on b) and rank 8 (cuda:0 [0000:38:00.0] on b)", 0),
            0u)
      << automatic.reason;
  EXPECT_TRUE(sharing_gpu_with(ends, 2).empty()) << "rank 2 has the same bus id on another host";
}

TEST(BackendChoice, WithoutBusIdsTheIndexDecides) {
  // A build or driver that cannot tell the bus id: (host, index) as before.
  EXPECT_TRUE(same_gpu({0, "a", 0, ""}, {1, "a", 0, ""}));
  EXPECT_FALSE(same_gpu({0, "a", 0, ""}, {1, "a", 1, ""}));
  EXPECT_FALSE(same_gpu({0, "a", 0, ""}, {1, "b", 0, ""}));
  EXPECT_TRUE(same_gpu({0, "a", 0, "0000:18:00.0"}, {1, "a", 0, ""})) << "one id unknown: the index";
  EXPECT_FALSE(same_gpu({0, "a", -1, ""}, {1, "a", -1, ""})) << "host tensors share no GPU";
  EXPECT_EQ(RankDevice({3, "node7", 1, ""}).describe(), "rank 3 (cuda:1 on node7)");
  EXPECT_EQ(RankDevice({3, "node7", 0, "0000:3B:00.0"}).describe(), "rank 3 (cuda:0 [0000:3B:00.0] on node7)");
  EXPECT_EQ(RankDevice({3, "node7", -1, ""}).describe(), "rank 3 (host on node7)");
}

TEST(BackendChoice, HostDevicesHaveNoBusId) { EXPECT_EQ(gpu_bus_id(c10::Device(c10::kCPU)), ""); }

// With a GPU (CUDA build): "dddd:bb:dd.f", the runtime's PCI bus id; without one, or in a CPU
// build, "" (then the (host, index) rule applies) and no exception.
TEST(BackendChoice, CudaDevicesHaveABusIdWhereTheRuntimeKnowsIt) {
  const std::string id = gpu_bus_id(c10::Device(c10::kCUDA, 0));
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(id, "");
    return;
  }
  ASSERT_GE(id.size(), 12u) << id;  // the domain has 4 hex digits or more
  const std::size_t n = id.size();
  EXPECT_EQ(id.substr(n - 9, 1) + id.substr(n - 6, 1) + id.substr(n - 2, 1), "::.") << id;
}

TEST(BackendChoice, UnknownBackendIsAConfigError) {
  EXPECT_THROW(parse_choice<CommBackend>("comm.backend", "gloo"), ConfigError);
}

}  // namespace
}  // namespace wd::comm::test_backend_choice
