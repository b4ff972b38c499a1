// `wan-distill layout` against `train`: for every teacher placement, colocated included, the
// table `layout` prints for a config and an allocation is the one `train` logs when it starts
// on that allocation (this host, one node), row for row and link for link.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "launch_util.hpp"

namespace wd::test_layout_launch {
namespace {

/// This host's name, as MPI_Get_processor_name gives it to train.
std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

/// The block from "layout: " to the gradient all-reduce line, without other ranks' log lines
/// (they start with spdlog's "[") that may land inside it.
std::string layout_block(const std::string& output) {
  const auto from = output.find("layout: ");
  if (from == std::string::npos) return "";
  std::istringstream in(output.substr(from));
  std::string block;
  for (std::string line; std::getline(in, line);) {
    if (!block.empty() && line.rfind("[", 0) == 0) continue;
    block += line + "\n";
    if (line.rfind("gradient all-reduce", 0) == 0) break;
  }
  return block;
}

/// `train` on `ranks` ranks and `layout` for one node of `ranks` GPUs, with the same options.
void expect_layout_matches_train(const std::string& name, int ranks, const std::string& options) {
  const auto dir = test::fresh_dir("layout-" + name);
  const auto args = "--run-dir " + dir.string() + " --train.steps 1 --train.eval_samples 4 " + options;
  const auto shown = test::run_captured(std::string(WD_CLI) + " layout --nodes 1 --gpus-per-node " +
                                        std::to_string(ranks) + " --node-names " + host_name() + " " +
                                        test::pinned_args(args) + " 2>&1");
  ASSERT_EQ(shown.code, 0) << shown.output;
  const auto trained = test::launch_train(ranks, args);
  ASSERT_EQ(trained.code, 0) << trained.output;
  const auto want = layout_block(shown.output);
  ASSERT_FALSE(want.empty()) << shown.output;
  EXPECT_EQ(layout_block(trained.output), want) << "layout printed:\n" << shown.output << "\ntrain logged:\n"
                                                << trained.output;
}

TEST(Layout, CpuPlacementMatchesTrain) { expect_layout_matches_train("cpu", 3, "--teacher.placement cpu"); }

TEST(Layout, GpuPlacementMatchesTrain) {
  // teacher.device cpu: the `gpu` placement's teacher on this host, as a GPU-less test can run it.
  expect_layout_matches_train("gpu", 3, "--teacher.placement gpu --teacher.device cpu");
}

TEST(Layout, StreamPlacementMatchesTrain) { expect_layout_matches_train("stream", 3, "--teacher.placement stream"); }

TEST(Layout, ShardStagesMatchTrain) {
  expect_layout_matches_train("shard", 4, "--teacher.placement shard --teacher.ranks 2");
}

TEST(Layout, TwoReplicasMatchTrain) {
  expect_layout_matches_train("replicas", 4, "--teacher.placement cpu --teacher.ranks 2");
}

TEST(Layout, ColocatedMatchesTrain) {
  expect_layout_matches_train("colocated", 2, "--teacher.placement colocated");
}

}  // namespace
}  // namespace wd::test_layout_launch
