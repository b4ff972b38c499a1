// SequenceGroups: which student ranks share a sample under student.sequence_parallel, the one
// rule of the job, the teacher, dmd and the planner (docs/sequence-parallel.md). Torch-free.
#pragma once

#include <cstdint>

namespace wd {

/// How student ranks form sequence-parallel groups of `size`, the one rule of every place that
/// deals with them (the teacher's messages and real-score answers, the groups' communicators,
/// dmd's noise and its checkpointed requests): `size` consecutive student slots, a replica's or
/// the student world's indices, are one group, slot / size, whose first slot leads it (the teacher
/// runs its request; a checkpoint keeps its inputs). Size 1: every student its own group.
struct SequenceGroups {
  int size = 1;
  int group_of(std::int64_t slot) const { return static_cast<int>(slot / size); }
  bool leads(std::int64_t slot) const { return slot % size == 0; }
  /// Whether `slots` students (a replica's) form whole groups: the job's check and the planner's.
  bool divides(std::int64_t slots) const { return slots % size == 0; }
  /// Groups among `slots` students (whole groups: divides(slots)).
  int groups_in(std::int64_t slots) const { return static_cast<int>(slots / size); }
};

}  // namespace wd
