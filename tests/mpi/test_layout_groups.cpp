// ProcessGroups on layouts whose replicas were placed by node (world ranks permuted): every
// communicator keeps its documented rank order, and a replica's link reaches its own students.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "comm/process_groups.hpp"
#include "mpi_test_util.hpp"

namespace test_layout_groups {
namespace {

using wd::Role;
using wd::comm::Layout;
using wd::comm::ProcessGroups;
using wd::test::world_rank;
using wd::test::world_size;

int rank_in(MPI_Comm comm) {
  int r = -1;
  MPI_Comm_rank(comm, &r);
  return r;
}

/// Checks one layout's groups on this rank (its own ranks in each, the link's broadcast and
/// the stage hand-over).
void check_groups(const Layout& l) {
  const int rank = world_rank();
  ProcessGroups g(l, rank);
  if (l.role_of(rank) == Role::kTeacher) {
    ASSERT_NE(g.teachers(), MPI_COMM_NULL);
    EXPECT_EQ(rank_in(g.teachers()), l.teacher_index(rank));
    ASSERT_NE(g.pipeline(), MPI_COMM_NULL);
    EXPECT_EQ(rank_in(g.pipeline()), l.stage_of(rank));
    if (l.stage_of(rank) + 1 < l.stages) {
      ASSERT_NE(g.stage_out(), MPI_COMM_NULL);
      EXPECT_EQ(rank_in(g.stage_out()), 0);
    }
    if (l.stage_of(rank) > 0) {
      ASSERT_NE(g.stage_in(), MPI_COMM_NULL);
      EXPECT_EQ(rank_in(g.stage_in()), 1);
    }
  } else {
    ASSERT_NE(g.students(), MPI_COMM_NULL);
    EXPECT_EQ(rank_in(g.students()), l.student_index(rank));
  }
  // The sender broadcasts its world rank over the link; each student must hear its replica's.
  if (g.link() != MPI_COMM_NULL) {
    int sender = rank;
    const int want = l.role_of(rank) == Role::kStudent ? 1 + l.student_slot(rank) : 0;
    EXPECT_EQ(rank_in(g.link()), want);
    ASSERT_EQ(MPI_Bcast(&sender, 1, MPI_INT, 0, g.link()), MPI_SUCCESS);
    EXPECT_EQ(sender, l.sender_of_replica(l.replica_of(rank)));
  }
  // A stage hands its world rank to the next one.
  if (g.stage_out() != MPI_COMM_NULL) {
    ASSERT_EQ(MPI_Send(&rank, 1, MPI_INT, 1, 7, g.stage_out()), MPI_SUCCESS);
  }
  if (g.stage_in() != MPI_COMM_NULL) {
    int from = -1;
    ASSERT_EQ(MPI_Recv(&from, 1, MPI_INT, 0, 7, g.stage_in(), MPI_STATUS_IGNORE), MPI_SUCCESS);
    EXPECT_EQ(from, l.teacher_of(l.replica_of(rank), l.stage_of(rank) - 1));
  }
}

/// Every rank's failure count, summed: the verdict all ranks agree on.
int failures_everywhere() {
  int mine = ::testing::Test::HasFailure() ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

TEST(LayoutGroups, ReplicasPlacedByNodeKeepEveryGroupsOrder) {
  std::vector<Layout> layouts;
  if (world_size() == 4) {
    // Nodes {0, 3} and {1, 2}: replica 0 = teacher 0 + student 3, replica 1 = teacher 1 +
    // student 2, so the students' communicator runs against world order.
    layouts.push_back(Layout::make(4, 2, 1, {0, 1, 1, 0}));
    EXPECT_EQ(layouts.back().student_world_ranks(), (std::vector<int>{3, 2}));
    layouts.push_back(Layout::make(4, 2, 1, {0, 0, 1, 1}));  // teachers 0 and 2
    EXPECT_EQ(layouts.back().teacher_world_ranks(), (std::vector<int>{0, 2}));
  } else {
    // 8 ranks round-robin over 2 nodes, 2 replicas of 2 stages: stages 0, 2 and 1, 3.
    layouts.push_back(Layout::make(8, 4, 2, {0, 1, 0, 1, 0, 1, 0, 1}));
    EXPECT_EQ(layouts.back().teacher_world_ranks(), (std::vector<int>{0, 2, 1, 3}));
  }
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.placement);
    check_groups(l);
  }
  EXPECT_EQ(failures_everywhere(), 0);
}

}  // namespace

}  // namespace test_layout_groups
