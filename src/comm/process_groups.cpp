// Layout arithmetic (roles, replicas, slots) and the communicators split for each group.
#include "comm/process_groups.hpp"

#include <algorithm>
#include <exception>

#include "comm/mpi_runtime.hpp"

namespace wd::comm {

namespace {

std::string named(const char* name, int value) {
  return std::string(name) + "(" + std::to_string(value) + ")";
}

}  // namespace

namespace {

/// Node ids renumbered by first appearance in world-rank order (world rank 0's node is 0).
std::vector<int> renumbered(const std::vector<int>& ids) {
  std::vector<int> seen, out;
  for (int id : ids) {
    auto it = std::find(seen.begin(), seen.end(), id);
    if (it == seen.end()) it = seen.insert(seen.end(), id);
    out.push_back(static_cast<int>(it - seen.begin()));
  }
  return out;
}

}  // namespace

void Layout::place_replicas() {
  Layout& layout = *this;
  const int nodes = layout.nodes.empty() ? 1 : *std::max_element(layout.nodes.begin(), layout.nodes.end()) + 1;
  if (layout.colocated()) {
    layout.placement = "colocated: every rank is its own replica";
    return;
  }
  if (nodes == 1) {
    layout.placement = "one node: teachers first (world ranks 0-" + std::to_string(layout.teacher_ranks - 1) + ")";
    return;
  }
  const int per = layout.students_per_replica();
  const int unit = layout.stages + per;  // ranks of one replica
  std::vector<std::vector<int>> ranks_on(static_cast<std::size_t>(nodes));
  for (int w = 0; w < layout.world_size; ++w) ranks_on[static_cast<std::size_t>(layout.nodes[static_cast<std::size_t>(w)])].push_back(w);
  for (int n = 0; n < nodes; ++n) {
    const int count = static_cast<int>(ranks_on[static_cast<std::size_t>(n)].size());
    if (count % unit != 0) {
      layout.placement = "teachers first (world ranks 0-" + std::to_string(layout.teacher_ranks - 1) +
                         "), replicas may span nodes: node " + std::to_string(n) + " has " +
                         std::to_string(count) + " rank(s), not a multiple of a replica's " + std::to_string(unit) +
                         " (" + std::to_string(layout.stages) + " teacher stage(s) + " + std::to_string(per) +
                         " student(s))";
      return;
    }
  }
  // Node n takes the next count/unit replicas: its lowest world ranks their teacher stages,
  // the rest their students, each in logical order.
  layout.world_of_logical_.assign(static_cast<std::size_t>(layout.world_size), -1);
  int replica = 0;
  for (const auto& on_node : ranks_on) {
    const int held = static_cast<int>(on_node.size()) / unit;
    std::size_t next = 0;
    for (int i = 0; i < held * layout.stages; ++i)
      layout.world_of_logical_[static_cast<std::size_t>(replica * layout.stages + i)] = on_node[next++];
    for (int i = 0; i < held * per; ++i)
      layout.world_of_logical_[static_cast<std::size_t>(layout.teacher_ranks + replica * per + i)] = on_node[next++];
    replica += held;
  }
  layout.logical_of_world_.assign(static_cast<std::size_t>(layout.world_size), -1);
  for (int l = 0; l < layout.world_size; ++l)
    layout.logical_of_world_[static_cast<std::size_t>(layout.world_of_logical_[static_cast<std::size_t>(l)])] = l;
  layout.placement = "each replica on one node (" + std::to_string(layout.stages) + " teacher stage(s) + " +
                     std::to_string(per) + " student(s) of " + std::to_string(unit) + " ranks; " +
                     std::to_string(nodes) + " nodes)";
}

Layout Layout::make(int world_size, int teacher_ranks, int stages, const std::vector<int>& node_of_rank) {
  ConfigProblems problems;
  const int students = world_size - teacher_ranks;
  problems.check(teacher_ranks >= 1, named("teacher.ranks", teacher_ranks) + " must be >= 1");
  problems.check(stages >= 1, named("stages", stages) + " must be >= 1");
  problems.check(students >= 1, named("world_size", world_size) + " - " +
                                    named("teacher.ranks", teacher_ranks) + " = " +
                                    std::to_string(students) +
                                    " students; at least 1 student rank is needed");
  problems.check(node_of_rank.empty() || static_cast<int>(node_of_rank.size()) == world_size,
                 "the node list names " + std::to_string(node_of_rank.size()) + " rank(s) but " +
                     named("world_size", world_size));
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
  layout.nodes = renumbered(node_of_rank);
  layout.place_replicas();
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
  layout.place_replicas();
  return layout;
}

int Layout::logical(int world_rank) const {
  WD_CHECK(world_rank >= 0 && world_rank < world_size,
           "rank " << world_rank << " is outside the world of " << world_size << " ranks");
  return logical_of_world_.empty() ? world_rank : logical_of_world_[static_cast<std::size_t>(world_rank)];
}

int Layout::world(int logical_rank) const {
  return world_of_logical_.empty() ? logical_rank : world_of_logical_[static_cast<std::size_t>(logical_rank)];
}

Role Layout::role_of(int world_rank) const {
  return logical(world_rank) < teacher_ranks ? Role::kTeacher : Role::kStudent;
}

int Layout::replica_of(int world_rank) const {
  if (role_of(world_rank) == Role::kTeacher) return teacher_index(world_rank) / stages;
  return student_index(world_rank) / students_per_replica();
}

int Layout::stage_of(int world_rank) const {
  return teacher_index(world_rank) % stages;
}

int Layout::teacher_of(int replica, int stage) const {
  WD_CHECK(replica >= 0 && replica < replicas,
           "replica " << replica << " does not exist (" << replicas << " replicas)");
  WD_CHECK(stage >= 0 && stage < stages, "stage " << stage << " does not exist (" << stages << " stages)");
  return world(replica * stages + stage);
}

int Layout::sender_of_replica(int replica) const {
  // The last pipeline stage holds the teacher's output, so it is the one that streams.
  return teacher_of(replica, stages - 1);
}

std::vector<int> Layout::students_of_replica(int replica) const {
  WD_CHECK(replica >= 0 && replica < replicas,
           "replica " << replica << " does not exist (" << replicas << " replicas)");
  const int per = students_per_replica();
  std::vector<int> ranks(static_cast<std::size_t>(per));
  for (int i = 0; i < per; ++i) ranks[static_cast<std::size_t>(i)] = world(teacher_ranks + replica * per + i);
  return ranks;
}

int Layout::student_slot(int world_rank) const {
  return student_index(world_rank) % students_per_replica();
}

int Layout::teacher_index(int world_rank) const {
  const int l = logical(world_rank);
  WD_CHECK(l < teacher_ranks, "rank " << world_rank << " is a student, not a teacher stage");
  return l;
}

int Layout::student_index(int world_rank) const {
  const int l = logical(world_rank);
  WD_CHECK(l >= teacher_ranks, "rank " << world_rank << " is a teacher, not a student");
  return l - teacher_ranks;
}

std::vector<int> Layout::teacher_world_ranks() const {
  std::vector<int> ranks;
  for (int l = 0; l < teacher_ranks; ++l) ranks.push_back(world(l));
  return ranks;
}

std::vector<int> Layout::student_world_ranks() const {
  std::vector<int> ranks;
  for (int l = teacher_ranks; l < world_size; ++l) ranks.push_back(world(l));
  return ranks;
}

int Layout::node_of(int world_rank) const {
  logical(world_rank);  // range check
  return nodes.empty() ? 0 : nodes[static_cast<std::size_t>(world_rank)];
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
    // Keyed by index, so each group's ranks follow the logical order whatever the nodes.
    teachers_ = split(teacher ? 0 : MPI_UNDEFINED, teacher ? layout.teacher_index(world_rank) : 0);
    students_ = split(teacher ? MPI_UNDEFINED : 1, teacher ? 0 : layout.student_index(world_rank));
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
