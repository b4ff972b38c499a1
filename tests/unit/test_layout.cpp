// `wan-distill layout` end to end: the rank table for an allocation, teacher.ranks from a
// config file or the command line, and exit code 2 naming the values of an invalid layout.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

const std::string kCli = WD_CLI;
const std::string kConfigs = WD_CONFIGS;

wd::test::CommandResult run(const std::string& args) { return wd::test::run_command(kCli + " layout " + args); }

/// The table rows as whitespace-separated words: rank node local device role replica slot.
std::vector<std::vector<std::string>> rows(const std::string& output) {
  std::vector<std::vector<std::string>> table;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.size() == 7 && std::isdigit(static_cast<unsigned char>(w[0][0]))) table.push_back(w);
  }
  return table;
}

TEST(LayoutCommand, PlacesRanksInBlocksTeachersFirst) {
  const auto r = run("--nodes 2 --gpus-per-node 4 --teacher.ranks 2 --node-names gpu-a,gpu-b");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto t = rows(r.output);
  ASSERT_EQ(t.size(), 8u) << r.output;
  // rank node local device role replica slot: replica r serves students [r*3, (r+1)*3).
  const std::vector<std::vector<std::string>> want{
      {"0", "gpu-a", "0", "cuda:0", "teacher", "0", "-"}, {"1", "gpu-a", "1", "cuda:1", "teacher", "1", "-"},
      {"2", "gpu-a", "2", "cuda:2", "student", "0", "0"}, {"3", "gpu-a", "3", "cuda:3", "student", "0", "1"},
      {"4", "gpu-b", "0", "cuda:0", "student", "0", "2"}, {"5", "gpu-b", "1", "cuda:1", "student", "1", "0"},
      {"6", "gpu-b", "2", "cuda:2", "student", "1", "1"}, {"7", "gpu-b", "3", "cuda:3", "student", "1", "2"}};
  EXPECT_EQ(t, want) << r.output;
  EXPECT_NE(r.output.find("8 ranks on 2 node(s) x 4 GPU(s): 2 teacher rank(s) in 2 replica(s), 6 student "
                          "rank(s), 3 per replica"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replica 1: teacher rank 1 on gpu-a streams to students 5-7 on gpu-b (across nodes"),
            std::string::npos)
      << r.output;
}

TEST(LayoutCommand, ReadsTeacherRanksFromTheConfigAndTheFlagWins) {
  auto r = run("--config " + kConfigs + "/wan22-t2v-a14b.ini --nodes 2 --gpus-per-node 8");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("16 ranks on 2 node(s) x 8 GPU(s): 4 teacher rank(s) in 4 replica(s), 12 student"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(rows(r.output).size(), 16u);

  r = run("--config " + kConfigs + "/tiny.ini --nodes 1 --gpus-per-node 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(within the node)"), std::string::npos) << r.output;

  r = run("--config=" + kConfigs + "/wan22-t2v-a14b.ini --nodes 1 --gpus-per-node 4 --teacher.ranks 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1 teacher rank(s) in 1 replica(s), 3 student rank(s)"), std::string::npos) << r.output;
}

TEST(LayoutCommand, InvalidLayoutsExitWithCode2NamingTheValues) {
  auto r = run("--nodes 1 --gpus-per-node 4 --teacher.ranks 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("world_size(4) - teacher.ranks(3) = 1 students is not divisible by 3"),
            std::string::npos)
      << r.output;

  r = run("--nodes 2 --gpus-per-node 2 --node-names a");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("node-names lists 1 node(s) but nodes(2)"), std::string::npos) << r.output;

  r = run("--nodes 1 --gpus-per-node 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("at least 1 student rank is needed"), std::string::npos) << r.output;
}

// More ranks than GPUs: ranks wrap round the GPUs (train's rule), the sharing is noted, and a
// link with two ranks on one GPU goes over MPI; student.device cpu puts students on the host,
// and comm.backend nccl for such a link is refused with exit 2 naming the rank.
TEST(LayoutCommand, SharedGpusAndHostStudentsChooseMpi) {
  auto r = run("--nodes 1 --gpus-per-node 2 --ranks-per-node 3");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<std::vector<std::string>> want{{"0", "node0", "0", "cuda:0", "teacher", "0", "-"},
                                                   {"1", "node0", "1", "cuda:1", "student", "0", "0"},
                                                   {"2", "node0", "2", "cuda:0", "student", "0", "1"}};
  EXPECT_EQ(rows(r.output), want) << r.output;
  EXPECT_NE(r.output.find("3 ranks per node on 2 GPU(s): ranks share GPUs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("over mpi (rank 0 (cuda:0 on node0) and rank 2 (cuda:0 on node0) share one GPU"),
            std::string::npos)
      << r.output;

  r = run("--nodes 1 --gpus-per-node 4 --student.device cpu");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(rows(r.output)[1][3], "host") << r.output;
  EXPECT_NE(r.output.find("over mpi (rank 1 (host on node0) holds host tensors)"), std::string::npos) << r.output;

  r = run("--nodes 1 --gpus-per-node 4 --student.device cpu --comm.backend nccl");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("comm.backend(nccl) cannot carry the teacher -> student link of replica 0: rank 1 (host on node0)"),
            std::string::npos)
      << r.output;
}

// teacher.placement shard: the teacher ranks of a replica are its pipeline stages, and each
// link between two stages gets its own backend (NCCL only where the build has it).
TEST(LayoutCommand, ShardStagesAndTheirLinks) {
  auto r = run("--nodes 1 --gpus-per-node 4 --teacher.ranks 2 --teacher.placement shard");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto t = rows(r.output);
  ASSERT_EQ(t.size(), 4u) << r.output;
  EXPECT_EQ(t[0][5], "0") << "both stages belong to replica 0\n" << r.output;
  EXPECT_EQ(t[1][5], "0") << r.output;
  EXPECT_NE(r.output.find("1 replica(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("replica 0: teacher rank 1 on node0 streams to students 2-3"), std::string::npos)
      << "the last stage streams to the students\n" << r.output;
  EXPECT_NE(r.output.find("replica 0: stage 0 (rank 0 (cuda:0 on node0)) -> stage 1 (rank 1 (cuda:1 on node0)) over "),
            std::string::npos)
      << r.output;

  // Two stages sharing one GPU cannot use NCCL.
  r = run("--nodes 1 --gpus-per-node 1 --ranks-per-node 3 --teacher.ranks 2 --teacher.placement shard");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("-> stage 1 (rank 1 (cuda:0 on node0)) over mpi (rank 0 (cuda:0 on node0) and rank 1 "
                          "(cuda:0 on node0) share one GPU"),
            std::string::npos)
      << r.output;

  // auto decides replicas or stages at start-up: the layout says so.
  r = run("--nodes 1 --gpus-per-node 4 --teacher.ranks 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("teacher.placement auto decides at start-up"), std::string::npos) << r.output;
}

}  // namespace
