// Layout arithmetic (roles, replicas, slots) and the communicators split for each group.
#include "comm/process_groups.hpp"

#include <exception>

#include "comm/mpi_runtime.hpp"

namespace wd::comm {

namespace {

std::string named(const char* name, int value) {
  return std::string(name) + "(" + std::to_string(value) + ")";
}

}  // namespace

Layout Layout::make(int world_size, int teacher_ranks, int stages) {
  ConfigProblems problems;
  const int students = world_size - teacher_ranks;
  problems.check(teacher_ranks >= 1, named("teacher.ranks", teacher_ranks) + " must be >= 1");
  problems.check(stages >= 1, named("stages", stages) + " must be >= 1");
  problems.check(students >= 1, named("world_size", world_size) + " - " +
                                    named("teacher.ranks", teacher_ranks) + " = " +
                                    std::to_string(students) +
                                    " students; at least 1 student rank is needed");
  if (teacher_ranks >= 1 && stages >= 1) {
    const bool whole = teacher_ranks % stages == 0;
    problems.check(whole, named("teacher.ranks", teacher_ranks) + " must be divisible by " +
                              named("stages", stages));
    const int replicas = teacher_ranks / stages;
    if (whole && students >= 1) {
      problems.check(students % replicas == 0,
                     named("world_size", world_size) + " - " +
                         named("teacher.ranks", teacher_ranks) + " = " + std::to_string(students) +
                         " students is not divisible by " + std::to_string(replicas) +
                         " teacher replicas (teacher.ranks / stages)");
    }
  }
  problems.throw_if_any("process layout");

  Layout layout;
  layout.world_size = world_size;
  layout.teacher_ranks = teacher_ranks;
  layout.student_ranks = students;
  layout.stages = stages;
  layout.replicas = teacher_ranks / stages;
  return layout;
}

Layout Layout::colocated(int world_size) {
  if (world_size < 1) throw ConfigError("process layout: colocated needs at least 1 rank");
  Layout layout;
  layout.world_size = world_size;
  layout.teacher_ranks = 0;
  layout.student_ranks = world_size;
  layout.stages = 1;
  layout.replicas = world_size;
  return layout;
}

Role Layout::role_of(int world_rank) const {
  WD_CHECK(world_rank >= 0 && world_rank < world_size,
           "rank " << world_rank << " is outside the world of " << world_size << " ranks");
  return world_rank < teacher_ranks ? Role::kTeacher : Role::kStudent;
}

int Layout::replica_of(int world_rank) const {
  if (role_of(world_rank) == Role::kTeacher) return world_rank / stages;
  return (world_rank - teacher_ranks) / students_per_replica();
}

int Layout::stage_of(int world_rank) const {
  WD_CHECK(role_of(world_rank) == Role::kTeacher,
           "rank " << world_rank << " is a student, not a teacher stage");
  return world_rank % stages;
}

int Layout::sender_of_replica(int replica) const {
  WD_CHECK(replica >= 0 && replica < replicas,
           "replica " << replica << " does not exist (" << replicas << " replicas)");
  // The last pipeline stage holds the teacher's output, so it is the one that streams.
  return replica * stages + stages - 1;
}

std::vector<int> Layout::students_of_replica(int replica) const {
  WD_CHECK(replica >= 0 && replica < replicas,
           "replica " << replica << " does not exist (" << replicas << " replicas)");
  const int per = students_per_replica();
  std::vector<int> ranks(static_cast<std::size_t>(per));
  for (int i = 0; i < per; ++i)
    ranks[static_cast<std::size_t>(i)] = teacher_ranks + replica * per + i;
  return ranks;
}

int Layout::student_slot(int world_rank) const {
  WD_CHECK(role_of(world_rank) == Role::kStudent,
           "rank " << world_rank << " is a teacher, not a student");
  return (world_rank - teacher_ranks) % students_per_replica();
}

Topology Layout::topology(int world_rank, int local_rank, int local_size) const {
  Topology t;
  t.rank = world_rank;
  t.world_size = world_size;
  t.local_rank = local_rank;
  t.local_size = local_size;
  t.role = role_of(world_rank);
  return t;
}

namespace {

void free_comm(MPI_Comm& comm) noexcept {
  if (comm == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

/// MPI_Comm_split whose result, when this rank is in it, reports errors as return codes.
MPI_Comm split(int color, int key) {
  MPI_Comm comm = MPI_COMM_NULL;
  WD_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm));
  if (comm != MPI_COMM_NULL) {
    const int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      free_comm(comm);
      WD_CHECK_MPI(rc);
    }
  }
  return comm;
}

}  // namespace

ProcessGroups::ProcessGroups(const Layout& layout, int world_rank) : layout_(layout) {
  int world = 0;
  WD_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  if (world != layout.world_size) {
    throw ConfigError("process layout: world_size(" + std::to_string(layout.world_size) +
                      ") but the job was started with " + std::to_string(world) + " ranks");
  }
  const bool teacher = layout.role_of(world_rank) == Role::kTeacher;
  // Every split is collective over the world, so each rank makes all six calls in the same
  // order; a failure half-way frees what was already made.
  try {
    teachers_ = split(teacher ? 0 : MPI_UNDEFINED, world_rank);
    students_ = split(teacher ? MPI_UNDEFINED : 1, world_rank);
    const int replica = layout.replica_of(world_rank);
    int color = MPI_UNDEFINED, key = 0;
    if (!teacher && !layout.colocated()) {  // colocated students have no link
      color = replica;
      key = 1 + layout.student_slot(world_rank);
    } else if (world_rank == layout.sender_of_replica(replica)) {
      color = replica;
      key = 0;
    }
    link_ = split(color, key);
    pipeline_ = split(teacher ? replica : MPI_UNDEFINED, teacher ? layout.stage_of(world_rank) : 0);
    // Stage edges: edge k joins stages k and k+1 of a replica. A stage is in at most two edges,
    // one of each parity, so one split makes the even edges and a second the odd ones.
    const int stage = teacher ? layout.stage_of(world_rank) : 0;
    for (int parity = 0; parity < 2; ++parity) {
      int edge = -1;
      if (teacher && stage % 2 == parity && stage + 1 < layout.stages) edge = stage;      // out
      if (teacher && (stage - 1) % 2 == parity && stage >= 1) edge = stage - 1;           // in
      MPI_Comm comm = split(edge < 0 ? MPI_UNDEFINED : replica * layout.stages + edge, stage);
      if (edge >= 0) (edge == stage ? stage_out_ : stage_in_) = comm;
    }
  } catch (...) {
    free_comm(stage_out_);
    free_comm(stage_in_);
    free_comm(pipeline_);
    free_comm(link_);
    free_comm(students_);
    free_comm(teachers_);
    throw;
  }
}

ProcessGroups::~ProcessGroups() {
  // Unwinding from a failure: a non-blocking collective abandoned on one of these
  // communicators is still progressed by MPI, which would then touch a freed communicator.
  // The process exits after the failure protocol, so leaving them is the safe choice.
  if (std::uncaught_exceptions() > 0) return;
  free_comm(stage_out_);
  free_comm(stage_in_);
  free_comm(pipeline_);
  free_comm(link_);
  free_comm(students_);
  free_comm(teachers_);
}

}  // namespace wd::comm
