// choose_backend: which library carries a group's tensors, for every kind of group, and the
// errors comm.backend nccl gives where NCCL cannot work.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/backend_choice.hpp"
#include "core/errors.hpp"

namespace wd::comm {
namespace {

std::vector<RankDevice> group(std::vector<RankDevice> ends) { return ends; }

/// The ConfigError's message of choose_backend(nccl, ...); fails the test when it does not throw.
std::string nccl_error(const std::vector<RankDevice>& ends, bool built = true) {
  try {
    choose_backend("nccl", ends, built, "the link");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "comm.backend nccl was accepted";
  return "";
}

TEST(BackendChoice, DistinctGpusGetNcclUnderAutoAndNccl) {
  // Two nodes: the same index on different hosts is two GPUs.
  const auto ends = group({{0, "a", 0}, {1, "a", 1}, {2, "b", 0}, {3, "b", 1}});
  const auto automatic = choose_backend("auto", ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kNccl);
  EXPECT_EQ(automatic.reason, "all 4 rank(s) on distinct GPUs");
  EXPECT_EQ(choose_backend("nccl", ends, true, "the link").backend, Backend::kNccl);
  EXPECT_EQ(choose_backend("mpi", ends, true, "the link").backend, Backend::kMpi);
}

TEST(BackendChoice, AHostRankMeansMpiAndNcclNamesIt) {
  const auto ends = group({{0, "a", -1}, {1, "a", 0}, {2, "a", 1}});
  const auto automatic = choose_backend("auto", ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  EXPECT_EQ(automatic.reason, "rank 0 (host on a) holds host tensors");
  EXPECT_EQ(nccl_error(ends).rfind("comm.backend(nccl) cannot carry the link: rank 0 (host on a) holds "
                                   "host tensors; use comm.backend auto or mpi",
                                   0),
            0u);
}

TEST(BackendChoice, TwoRanksOnOneGpuMeansMpiAndNcclNamesBoth) {
  const auto ends = group({{0, "a", 0}, {1, "a", 1}, {2, "a", 0}});
  const auto automatic = choose_backend("auto", ends, true, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  const std::string want = "rank 0 (cuda:0 on a) and rank 2 (cuda:0 on a) share one GPU";
  EXPECT_EQ(automatic.reason.rfind(want, 0), 0u) << automatic.reason;
  EXPECT_NE(nccl_error(ends).find(want), std::string::npos);
}

TEST(BackendChoice, NoNcclInTheBuildMeansMpi) {
  const auto ends = group({{0, "a", 0}, {1, "a", 1}});
  const auto automatic = choose_backend("auto", ends, false, "the link");
  EXPECT_EQ(automatic.backend, Backend::kMpi);
  EXPECT_NE(automatic.reason.find("this build has no NCCL transport"), std::string::npos);
  EXPECT_NE(nccl_error(ends, false).find("this build has no NCCL transport"), std::string::npos);
}

TEST(BackendChoice, UnknownBackendIsAConfigError) {
  EXPECT_THROW(choose_backend("gloo", group({{0, "a", 0}}), true, "the link"), ConfigError);
}

}  // namespace
}  // namespace wd::comm
