// StreamEnd: the link and stage ends, named for messages.
#include "comm/stream_end.hpp"

#include "core/errors.hpp"

namespace wd::comm {

void check_end(const StreamEnd& end, bool sending) {
  WD_CHECK(end.comm != MPI_COMM_NULL, "rank " << end.world_rank << " is not on " << end.name);
  WD_CHECK(end.sending == sending, "rank " << end.world_rank << " "
                                           << (end.sending ? "sends" : "receives") << " on " << end.name
                                           << ", and a " << (sending ? "sender" : "receiver")
                                           << " was asked for");
}

std::string student_link_name(int replica) {
  return "the teacher -> student link of replica " + std::to_string(replica);
}

std::string stage_link_name(int replica, int from_stage) {
  return "the stage " + std::to_string(from_stage) + " -> " + std::to_string(from_stage + 1) +
         " link of replica " + std::to_string(replica);
}

StreamEnd link_end(const ProcessGroups& groups, int world_rank, const CommConfig& config) {
  WD_CHECK(groups.link() != MPI_COMM_NULL,
           "rank " << world_rank
                   << " has no link to students: only a replica's last teacher stage and "
                      "the students stream batches");
  const auto& layout = groups.layout();
  const int replica = layout.replica_of(world_rank);
  StreamEnd end;
  end.comm = groups.link();
  end.world_rank = world_rank;
  end.broadcast = config.mode == CommMode::kBroadcast;
  end.name = student_link_name(replica);
  end.receiver = "student";
  end.sending = layout.role_of(world_rank) == Role::kTeacher;
  if (end.sending) {
    end.peers = layout.students_of_replica(replica);  // link rank 0 is the teacher
    for (std::size_t i = 0; i < end.peers.size(); ++i) end.peer_ranks.push_back(static_cast<int>(i) + 1);
  } else {
    end.peers = {layout.sender_of_replica(replica)};
    end.peer_ranks = {0};
  }
  return end;
}

StageEnds stage_ends(const ProcessGroups& groups, int world_rank) {
  const auto& layout = groups.layout();
  WD_CHECK(layout.role_of(world_rank) == Role::kTeacher,
           "rank " << world_rank << " is a student, not a teacher pipeline stage");
  const int stage = layout.stage_of(world_rank);
  const int replica = layout.replica_of(world_rank);
  // Each stage link has two ranks: the sending stage is rank 0, the receiving stage rank 1.
  StageEnds out;
  if (groups.stage_in() != MPI_COMM_NULL) {
    out.in = {groups.stage_in(), world_rank, false, {layout.teacher_of(replica, stage - 1)}, {0}, false,
              stage_link_name(replica, stage - 1)};
  }
  if (groups.stage_out() != MPI_COMM_NULL) {
    out.out = {groups.stage_out(), world_rank, true, {layout.teacher_of(replica, stage + 1)}, {1}, false,
               stage_link_name(replica, stage)};
  }
  return out;
}

}  // namespace wd::comm
