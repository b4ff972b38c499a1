// comm::Layout's placement of replicas on nodes, and `wan-distill layout` end to end: the rank
// table for an allocation, teacher.ranks from a config file or the command line, and exit code 2
// naming the values of an invalid layout.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "comm/process_groups.hpp"
#include "core/errors.hpp"
#include "test_util.hpp"

namespace test_layout {
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

// Two nodes that each hold whole replicas (1 teacher + 3 students): each replica on its own node.
TEST(LayoutCommand, PutsEachReplicaOnItsStudentsNode) {
  const auto r = run("--nodes 2 --gpus-per-node 4 --teacher.ranks 2 --node-names gpu-a,gpu-b");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto t = rows(r.output);
  ASSERT_EQ(t.size(), 8u) << r.output;
  // rank node local device role replica slot: a node's first rank is its replica's teacher.
  const std::vector<std::vector<std::string>> want{
      {"0", "gpu-a", "0", "cuda:0", "teacher", "0", "-"}, {"1", "gpu-a", "1", "cuda:1", "student", "0", "0"},
      {"2", "gpu-a", "2", "cuda:2", "student", "0", "1"}, {"3", "gpu-a", "3", "cuda:3", "student", "0", "2"},
      {"4", "gpu-b", "0", "cuda:0", "teacher", "1", "-"}, {"5", "gpu-b", "1", "cuda:1", "student", "1", "0"},
      {"6", "gpu-b", "2", "cuda:2", "student", "1", "1"}, {"7", "gpu-b", "3", "cuda:3", "student", "1", "2"}};
  EXPECT_EQ(t, want) << r.output;
  EXPECT_NE(r.output.find("8 ranks on 2 node(s): 2 teacher rank(s) in 2 replica(s) of 1 stage(s), 6 student "
                          "rank(s), 3 per replica; each replica on one node"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replica 0: teacher rank 0 on gpu-a streams to students 1-3 on gpu-a (within the node)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replica 1: teacher rank 4 on gpu-b streams to students 5-7 on gpu-b (within the node)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("across nodes"), std::string::npos) << r.output;
}

// The case, 2 nodes x 8 GPUs and 2 teacher ranks: teachers at world ranks 0 and 8.
TEST(LayoutCommand, TwoNodesOfEightWithTwoTeachers) {
  const auto r = run("--nodes 2 --gpus-per-node 8 --teacher.ranks 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto t = rows(r.output);
  ASSERT_EQ(t.size(), 16u) << r.output;
  for (int w = 0; w < 16; ++w) {
    const auto& row = t[static_cast<std::size_t>(w)];
    EXPECT_EQ(row[1], w < 8 ? "node0" : "node1") << r.output;
    EXPECT_EQ(row[4], w % 8 == 0 ? "teacher" : "student") << "rank " << w << "\n" << r.output;
    EXPECT_EQ(row[5], std::to_string(w / 8)) << "rank " << w << "\n" << r.output;
    EXPECT_EQ(row[6], w % 8 == 0 ? "-" : std::to_string(w % 8 - 1)) << "rank " << w << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("replica 1: teacher rank 8 on node1 streams to students 9-15 on node1 (within the node)"),
            std::string::npos)
      << r.output;
}

// A replica larger than a node (1 teacher + 7 students on nodes of 4): teachers first, as before,
// and the header says why.
TEST(LayoutCommand, ReplicasThatDoNotFitANodeKeepTeachersFirst) {
  const auto r = run("--nodes 2 --gpus-per-node 4 --teacher.ranks 1 --node-names gpu-a,gpu-b");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto t = rows(r.output);
  ASSERT_EQ(t.size(), 8u) << r.output;
  for (int w = 0; w < 8; ++w) {
    EXPECT_EQ(t[static_cast<std::size_t>(w)][4], w == 0 ? "teacher" : "student") << r.output;
    if (w > 0) {
      EXPECT_EQ(t[static_cast<std::size_t>(w)][6], std::to_string(w - 1)) << r.output;
    }
  }
  EXPECT_NE(r.output.find("teachers first (world ranks 0-0), replicas may span nodes: node 0 has 4 rank(s), not a "
                          "multiple of a replica's 8 (1 teacher stage(s) + 7 student(s))"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replica 0: teacher rank 0 on gpu-a streams to students 1-7 on gpu-a, gpu-b (across nodes"),
            std::string::npos)
      << r.output;
}

TEST(LayoutCommand, ReadsTeacherRanksFromTheConfigAndTheFlagWins) {
  auto r = run("--config " + kConfigs + "/wan22-t2v-a14b.ini --nodes 2 --gpus-per-node 8");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("16 ranks on 2 node(s): 4 teacher rank(s) in 4 replica(s) of 1 stage(s), 12 student"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(rows(r.output).size(), 16u);
  // Two replicas of 1 teacher + 3 students on each node: teachers at 0, 1 and 8, 9, then their
  // students in replica order.
  EXPECT_NE(r.output.find("replica 2: teacher rank 8 on node1 streams to students 10-12 on node1 (within the node)"),
            std::string::npos)
      << r.output;

  r = run("--config " + kConfigs + "/tiny.ini --nodes 1 --gpus-per-node 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(within the node)"), std::string::npos) << r.output;

  r = run("--config=" + kConfigs + "/wan22-t2v-a14b.ini --nodes 1 --gpus-per-node 4 --teacher.ranks 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1 teacher rank(s) in 1 replica(s) of 1 stage(s), 3 student rank(s)"), std::string::npos) << r.output;
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

  // 2 nodes x 8, one replica of 2 stages: 16 ranks cannot sit on a node of 8, so both stages stay
  // on node 0 (the stage link within the node) and stream to students on both nodes.
  r = run("--nodes 2 --gpus-per-node 8 --teacher.ranks 2 --teacher.placement shard");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("replica 0: teacher rank 1 on node0 streams to students 2-15 on node0, node1 (across nodes"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("node 0 has 8 rank(s), not a multiple of a replica's 16 (2 teacher stage(s) + 14 student(s))"),
            std::string::npos)
      << r.output;
  // Two replicas of 2 stages + 6 students: one per node, stages on their students' node.
  r = run("--nodes 2 --gpus-per-node 8 --teacher.ranks 4 --teacher.placement shard --teacher.stages 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("replica 1: teacher rank 9 on node1 streams to students 10-15 on node1 (within the node)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("replica 1: stage 0 (rank 8 (cuda:0 on node1)) -> stage 1 (rank 9 (cuda:1 on node1))"),
            std::string::npos)
      << r.output;

  // auto decides replicas or stages at start-up: the layout says so.
  r = run("--nodes 1 --gpus-per-node 4 --teacher.ranks 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("teacher.placement auto decides at start-up"), std::string::npos) << r.output;
}

// ---- comm::Layout: which world rank is which teacher stage or student, given the nodes ----

using wd::Role;
using wd::comm::Layout;

/// Node of each world rank for `nodes` nodes of `per_node` ranks placed in blocks.
std::vector<int> blocks(int nodes, int per_node) {
  std::vector<int> out;
  for (int r = 0; r < nodes * per_node; ++r) out.push_back(r / per_node);
  return out;
}

std::vector<int> range(int first, int last) {
  std::vector<int> out;
  for (int r = first; r <= last; ++r) out.push_back(r);
  return out;
}

/// Every rank agrees with the layout's own lists: roles, replicas, slots, indices, and each
/// replica's stages and students are the ranks that say they belong to it.
void expect_consistent(const Layout& l) {
  int teachers = 0;
  for (int w = 0; w < l.world_size; ++w) {
    if (l.role_of(w) == Role::kTeacher) {
      ++teachers;
      EXPECT_EQ(l.teacher_of(l.replica_of(w), l.stage_of(w)), w);
      EXPECT_EQ(l.teacher_world_ranks()[static_cast<std::size_t>(l.teacher_index(w))], w);
    } else {
      EXPECT_EQ(l.students_of_replica(l.replica_of(w))[static_cast<std::size_t>(l.student_slot(w))], w);
      EXPECT_EQ(l.student_world_ranks()[static_cast<std::size_t>(l.student_index(w))], w);
    }
  }
  EXPECT_EQ(teachers, l.teacher_ranks);
}

/// Each replica's stages and students on one node.
void expect_replicas_on_one_node(const Layout& l) {
  for (int rep = 0; rep < l.replicas; ++rep) {
    const int node = l.node_of(l.sender_of_replica(rep));
    for (int s = 0; s < l.stages; ++s) EXPECT_EQ(l.node_of(l.teacher_of(rep, s)), node) << "replica " << rep;
    for (int w : l.students_of_replica(rep)) EXPECT_EQ(l.node_of(w), node) << "replica " << rep << " student " << w;
  }
}

TEST(Layout, TwoNodesOfEightPutEachTeacherOnItsStudentsNode) {
  const auto l = Layout::make(16, 2, 1, blocks(2, 8));
  EXPECT_EQ(l.teacher_world_ranks(), (std::vector<int>{0, 8}));
  EXPECT_EQ(l.sender_of_replica(1), 8);
  EXPECT_EQ(l.students_of_replica(0), range(1, 7));
  EXPECT_EQ(l.students_of_replica(1), range(9, 15));
  // Student indices run replica by replica, so the students' communicator and the data each
  // slot gets are as on one node: student 7 is replica 1's slot 0.
  EXPECT_EQ(l.student_index(9), 7);
  EXPECT_EQ(l.student_slot(9), 0);
  EXPECT_EQ(l.student_world_ranks().front(), 1);
  EXPECT_EQ(l.placement, "each replica on one node (1 teacher stage(s) + 7 student(s) of 8 ranks; 2 nodes)");
  expect_replicas_on_one_node(l);
  expect_consistent(l);
}

TEST(Layout, ShardReplicasSitOnOneNodeWhenTheyFit) {
  // T = 2 as two stages of one replica: 16 ranks do not fit a node of 8, so teachers first.
  auto l = Layout::make(16, 2, 2, blocks(2, 8));
  EXPECT_EQ(l.replicas, 1);
  EXPECT_EQ(l.teacher_world_ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.students_of_replica(0), range(2, 15));
  EXPECT_NE(l.placement.find("node 0 has 8 rank(s), not a multiple of a replica's 16"), std::string::npos)
      << l.placement;
  expect_consistent(l);
  // T = 4 as two replicas of two stages: each replica (2 stages + 6 students) fills a node.
  l = Layout::make(16, 4, 2, blocks(2, 8));
  EXPECT_EQ(l.teacher_world_ranks(), (std::vector<int>{0, 1, 8, 9}));
  EXPECT_EQ(l.teacher_of(1, 0), 8);
  EXPECT_EQ(l.stage_of(9), 1);
  EXPECT_EQ(l.students_of_replica(1), range(10, 15));
  expect_replicas_on_one_node(l);
  expect_consistent(l);
}

TEST(Layout, CountsThatCannotBeSplitKeepTeachersFirst) {
  // 3 nodes x 4, 2 teachers: a replica is 1 + 5 = 6 ranks, and 4 is not a multiple of 6.
  const auto l = Layout::make(12, 2, 1, blocks(3, 4));
  const auto same = Layout::make(12, 2);
  for (int w = 0; w < 12; ++w) {
    EXPECT_EQ(l.role_of(w), same.role_of(w)) << w;
    EXPECT_EQ(l.replica_of(w), same.replica_of(w)) << w;
  }
  EXPECT_EQ(l.teacher_world_ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.students_of_replica(1), range(7, 11));
  EXPECT_EQ(l.placement,
            "teachers first (world ranks 0-1), replicas may span nodes: node 0 has 4 rank(s), not a multiple of a "
            "replica's 6 (1 teacher stage(s) + 5 student(s))");
  // Unequal nodes (6 + 2 ranks, replicas of 4): node 1 cannot hold a whole replica either.
  const auto uneven = Layout::make(8, 2, 1, {0, 0, 0, 0, 0, 0, 1, 1});
  EXPECT_EQ(uneven.teacher_world_ranks(), (std::vector<int>{0, 1}));
  EXPECT_NE(uneven.placement.find("node 0 has 6 rank(s)"), std::string::npos) << uneven.placement;
}

TEST(Layout, RanksSpreadRoundRobinOverNodesStillGroupByNode) {
  // mpirun --map-by node: world rank r on node r % 2. A node's lowest ranks hold its teachers.
  const auto l = Layout::make(8, 2, 1, {5, 7, 5, 7, 5, 7, 5, 7});  // any node ids
  EXPECT_EQ(l.node_of(1), 1);
  EXPECT_EQ(l.teacher_world_ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(l.students_of_replica(0), (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(l.students_of_replica(1), (std::vector<int>{3, 5, 7}));
  expect_replicas_on_one_node(l);
  expect_consistent(l);
}

TEST(Layout, OneNodeAndColocatedAreTheIdentity) {
  for (const auto& [world, teachers, stages] : std::vector<std::array<int, 3>>{{8, 2, 1}, {8, 2, 2}, {10, 4, 2}, {3, 1, 1}}) {
    const auto plain = Layout::make(world, teachers, stages);
    const auto one = Layout::make(world, teachers, stages, std::vector<int>(static_cast<std::size_t>(world), 3));
    for (const auto* l : {&plain, &one}) {
      EXPECT_EQ(l->teacher_world_ranks(), range(0, teachers - 1));
      EXPECT_EQ(l->student_world_ranks(), range(teachers, world - 1));
      for (int w = teachers; w < world; ++w) EXPECT_EQ(l->student_index(w), w - teachers);
      for (int w = 0; w < teachers; ++w) {
        EXPECT_EQ(l->replica_of(w), w / stages);
        EXPECT_EQ(l->stage_of(w), w % stages);
      }
      EXPECT_NE(l->placement.find("one node: teachers first"), std::string::npos) << l->placement;
      expect_consistent(*l);
    }
  }
  const auto c = Layout::colocated(4);
  EXPECT_EQ(c.student_world_ranks(), range(0, 3));
  EXPECT_EQ(c.replica_of(2), 2);
  EXPECT_EQ(c.student_slot(2), 0);
}

TEST(Layout, ANodeListOfTheWrongLengthIsRefused) {
  try {
    Layout::make(8, 2, 1, {0, 0, 1});
    FAIL() << "expected a ConfigError";
  } catch (const wd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the node list names 3 rank(s) but world_size(8)"), std::string::npos)
        << e.what();
  }
}

}  // namespace

}  // namespace test_layout
