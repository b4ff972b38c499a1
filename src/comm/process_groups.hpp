// Roles and communicators: which world rank is which teacher stage or student, replica by
// replica (each replica on one node where the counts allow), and the groups split from them.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/topology.hpp"

namespace wd::comm {

/// How the world is split (pure arithmetic, testable for any rank in one process).
/// Logical ranks [0, T) are teachers, [T, T+S) students. With R teacher replicas of P = T/R
/// pipeline stages (P > 1 with teacher.placement = shard), replica r owns logical teacher ranks
/// [r·P, (r+1)·P) and serves students [r·S/R, (r+1)·S/R) (student indices, logical rank − T).
/// Logical ranks sit on world ranks by a permutation: on one node (or without node
/// information) it is the identity, so world ranks [0, T) are the teachers. On several nodes,
/// when every node's rank count is a whole number of replicas (P + S/R ranks each), each
/// replica's stages and students share one node: a node's lowest world ranks hold its replicas'
/// teacher stages, the rest their students, both in logical order. Otherwise the identity again,
/// and `placement` says why. Every method takes and returns world ranks.
struct Layout {
  int world_size = 0;
  int teacher_ranks = 0;   ///< T
  int student_ranks = 0;   ///< S
  int replicas = 0;        ///< R
  int stages = 1;          ///< P
  /// Node index of every world rank (0: the node of world rank 0); empty: one node.
  std::vector<int> nodes;
  /// One line on where the replicas sit and why, for the start-up log and `layout`.
  std::string placement;

  /// Validates (T >= 1, S >= 1, T + S == world, T divisible by P... , S divisible by R) and
  /// throws wd::ConfigError naming every value: "teacher.ranks(3) + students(4) != world_size(8)".
  /// `node_of_rank` (one entry per world rank, any ids; empty: one node) lets each replica sit
  /// on one node where the counts allow.
  static Layout make(int world_size, int teacher_ranks, int stages = 1, const std::vector<int>& node_of_rank = {});
  /// teacher.placement = colocated: no teacher ranks; every rank is a student that computes
  /// its own targets, its own replica (replicas = students, one student each).
  static Layout colocated(int world_size);
  bool colocated() const { return teacher_ranks == 0; }

  Role role_of(int world_rank) const;
  /// Replica of a teacher or student rank.
  int replica_of(int world_rank) const;
  /// Pipeline stage of a teacher rank: 0 reads the data, P - 1 streams to the students.
  int stage_of(int world_rank) const;
  /// World rank of stage `stage` of replica r.
  int teacher_of(int replica, int stage) const;
  /// World rank of the last pipeline stage of replica r (the one that sends to students).
  int sender_of_replica(int replica) const;
  /// World ranks of the students served by replica r, in slot order.
  std::vector<int> students_of_replica(int replica) const;
  /// Students per replica (S/R).
  int students_per_replica() const { return student_ranks / replicas; }
  /// Index of a student within its replica's students.
  int student_slot(int world_rank) const;
  /// A teacher's place among the teachers (replica · P + stage).
  int teacher_index(int world_rank) const;
  /// A student's place among the students (replica · S/R + slot): its rank in the students'
  /// communicator and in the gradient average.
  int student_index(int world_rank) const;
  /// World ranks of the teachers, by teacher index.
  std::vector<int> teacher_world_ranks() const;
  /// World ranks of the students, by student index (the first is the students' leader).
  std::vector<int> student_world_ranks() const;
  /// Node index of a world rank (0 without node information).
  int node_of(int world_rank) const;
  /// Topology value for a world rank.
  Topology topology(int world_rank, int local_rank, int local_size) const;

 private:
  /// Puts each replica on one node when every node holds whole replicas; otherwise keeps the
  /// identity (teachers first) and says why in `placement`.
  void place_replicas();
  int logical(int world_rank) const;
  int world(int logical_rank) const;
  std::vector<int> world_of_logical_;  ///< empty: the identity
  std::vector<int> logical_of_world_;
};

/// Communicators derived from MPI_COMM_WORLD by MPI_Comm_split; freed in the destructor.
/// `teachers` (rank = teacher index) is MPI_COMM_NULL on students and `students` (rank =
/// student index) on teachers; `link` joins a replica's
/// sending teacher (link rank 0) with its students (link ranks 1..S/R, in slot order);
/// `pipeline` joins the P stages of a replica (rank = stage) and is MPI_COMM_NULL on students;
/// `stage_in` joins a stage with the one before it and `stage_out` with the one after it (two
/// ranks each: the sending stage is rank 0), MPI_COMM_NULL where there is no such stage.
class ProcessGroups {
 public:
  ProcessGroups(const Layout& layout, int world_rank);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  const Layout& layout() const { return layout_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  MPI_Comm teachers() const { return teachers_; }
  MPI_Comm students() const { return students_; }
  MPI_Comm link() const { return link_; }  ///< MPI_COMM_NULL for non-sending teacher stages
  MPI_Comm pipeline() const { return pipeline_; }
  MPI_Comm stage_in() const { return stage_in_; }    ///< stage s-1 (rank 0) and this stage s
  MPI_Comm stage_out() const { return stage_out_; }  ///< this stage s (rank 0) and stage s+1

 private:
  Layout layout_;
  MPI_Comm teachers_ = MPI_COMM_NULL;
  MPI_Comm students_ = MPI_COMM_NULL;
  MPI_Comm link_ = MPI_COMM_NULL;
  MPI_Comm pipeline_ = MPI_COMM_NULL;
  MPI_Comm stage_in_ = MPI_COMM_NULL;
  MPI_Comm stage_out_ = MPI_COMM_NULL;
};

}  // namespace wd::comm
