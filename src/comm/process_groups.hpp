// Roles and communicators: teacher ranks first, then students; teacher replicas and the
// students each replica serves.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/topology.hpp"

namespace wd::comm {

/// How the world is split (pure arithmetic, testable for any rank in one process).
/// World ranks [0, T) are teachers, [T, T+S) students. With R teacher replicas of P = T/R
/// pipeline stages (P > 1 with teacher.placement = shard), replica r owns teacher ranks [r·P, (r+1)·P)
/// and serves students [r·S/R, (r+1)·S/R) (student indices, i.e. world rank − T).
struct Layout {
  int world_size = 0;
  int teacher_ranks = 0;   ///< T
  int student_ranks = 0;   ///< S
  int replicas = 0;        ///< R
  int stages = 1;          ///< P

  /// Validates (T >= 1, S >= 1, T + S == world, T divisible by P... , S divisible by R) and
  /// throws wd::ConfigError naming every value: "teacher.ranks(3) + students(4) != world_size(8)".
  static Layout make(int world_size, int teacher_ranks, int stages = 1);
  /// teacher.placement = colocated: no teacher ranks; every rank is a student that computes
  /// its own targets, its own replica (replicas = students, one student each).
  static Layout colocated(int world_size);
  bool colocated() const { return teacher_ranks == 0; }

  Role role_of(int world_rank) const;
  /// Replica of a teacher or student rank.
  int replica_of(int world_rank) const;
  /// Pipeline stage of a teacher rank: 0 reads the data, P - 1 streams to the students.
  int stage_of(int world_rank) const;
  /// World rank of the last pipeline stage of replica r (the one that sends to students).
  int sender_of_replica(int replica) const;
  /// World ranks of the students served by replica r, in order.
  std::vector<int> students_of_replica(int replica) const;
  /// Students per replica (S/R).
  int students_per_replica() const { return student_ranks / replicas; }
  /// Index of a student within its replica's students.
  int student_slot(int world_rank) const;
  /// Topology value for a world rank.
  Topology topology(int world_rank, int local_rank, int local_size) const;
};

/// Communicators derived from MPI_COMM_WORLD by MPI_Comm_split; freed in the destructor.
/// `teachers` is MPI_COMM_NULL on students and `students` on teachers; `link` joins a replica's
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
