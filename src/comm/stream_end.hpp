// StreamEnd: one end of a stream (its communicator, its peers, which way it flows), and the
// ends of the teacher -> student link and of the links between shard stages.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "comm/comm_config.hpp"
#include "comm/process_groups.hpp"

namespace wd::comm {

/// One end of a stream over a communicator: the sending end (its receivers, in message order)
/// or a receiving end (its one sender). Says nothing of the rank's role: a teacher's end of a
/// link may receive and a student's may send.
struct StreamEnd {
  MPI_Comm comm = MPI_COMM_NULL;
  int world_rank = -1;
  bool sending = false;
  std::vector<int> peers;       ///< world ranks: the receivers in message order, or {sender}
  std::vector<int> peer_ranks;  ///< the same ranks in `comm`
  bool broadcast = false;       ///< one message for every receiver (comm.mode = broadcast)
  std::string name;             ///< "the teacher -> student link of replica 0", for messages
  std::string receiver = "receiver";  ///< what a receiver is called in messages ("student")
};

/// Throws wd::Error unless `end` is on its communicator and is the sending end (`sending`) or
/// a receiving end (otherwise): what a factory of that end checks first.
void check_end(const StreamEnd& end, bool sending);

/// How logs and errors name a stream: "the teacher -> student link of replica R" and "the stage
/// K -> K+1 link of replica R" (train and layout say the same).
std::string student_link_name(int replica);
/// See student_link_name.
std::string stage_link_name(int replica, int from_stage);

/// `world_rank`'s end of its replica's teacher -> student link (`groups.link()`: the last
/// teacher stage is rank 0, the students follow in slot order). Throws wd::Error on a rank
/// without a link (a teacher stage before the last).
StreamEnd link_end(const ProcessGroups& groups, int world_rank, const CommConfig& config);

/// `world_rank`'s ends of the stage links of its replica (teacher.placement = shard): `in`
/// from the previous stage over `groups.stage_in()`, `out` to the next over
/// `groups.stage_out()`; `comm` is MPI_COMM_NULL where there is no such stage.
struct StageEnds {
  StreamEnd in, out;
};
/// See StageEnds. Throws wd::Error on a student rank.
StageEnds stage_ends(const ProcessGroups& groups, int world_rank);

}  // namespace wd::comm
