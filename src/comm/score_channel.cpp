// The real-score channel's message specs and its ends.
#include "comm/score_channel.hpp"

#include <string>

#include "comm/mpi_check.hpp"
#include "comm/transport_factory.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {

/// The tensors of the plan's student message named in `names`, in that order.
MessageSpec pick(const StreamPlan& plan, const std::vector<std::string>& names) {
  const auto all = plan.message_spec();
  MessageSpec spec;
  for (const auto& name : names) {
    for (const auto& t : all.tensors) {
      if (t.name == name) spec.tensors.push_back(t);
    }
  }
  WD_CHECK(spec.tensors.size() == names.size(), "the stream plan lacks a tensor of the real-score channel");
  return spec;
}

/// The link's end with its communicator swapped for a duplicate (the answers' stream: each
/// stream has its own communicator, as MPI ends use one tag a stream).
StreamEnd answer_end(const ProcessGroups& groups, int world_rank, const CommConfig& config) {
  auto end = link_end(groups, world_rank, config);
  MPI_Comm dup = MPI_COMM_NULL;
  WD_CHECK_MPI(MPI_Comm_dup(end.comm, &dup));
  end.comm = dup;  // lives until MPI_Finalize, like the other communicators of the job
  end.broadcast = false;  // every student gets the answer to its own request
  end.name = "the real-score answers of replica " + std::to_string(groups.layout().replica_of(world_rank));
  return end;
}

/// The communicator of the link's teacher (link rank 0) and its student at link rank
/// `student_rank`, as rank 0 and 1; collective over those two alone.
MPI_Comm pair_comm(MPI_Comm link, int student_rank) {
  MPI_Group all = MPI_GROUP_NULL, pair = MPI_GROUP_NULL;
  WD_CHECK_MPI(MPI_Comm_group(link, &all));
  const int ranks[2] = {0, student_rank};
  WD_CHECK_MPI(MPI_Group_incl(all, 2, ranks, &pair));
  MPI_Comm comm = MPI_COMM_NULL;
  WD_CHECK_MPI(MPI_Comm_create_group(link, pair, /*tag=*/7900 + student_rank, &comm));
  MPI_Group_free(&pair);
  MPI_Group_free(&all);
  return comm;
}

/// `world_rank`'s end of the request stream of the student at link rank `student_rank` (world
/// rank `student_world`): the student sends (to `peer`, the teacher, pair rank 0), the teacher
/// receives (from `peer`, the student, pair rank 1).
StreamEnd request_end(const ProcessGroups& groups, int world_rank, int student_rank, int peer, int student_world) {
  StreamEnd end;
  end.comm = pair_comm(groups.link(), student_rank);
  end.world_rank = world_rank;
  end.sending = world_rank == student_world;
  end.peers = {peer};
  end.peer_ranks = {end.sending ? 0 : 1};
  end.name = "the real-score requests of student rank " + std::to_string(student_world) + " (replica " +
             std::to_string(groups.layout().replica_of(student_world)) + ")";
  end.receiver = "teacher";
  return end;
}

}  // namespace

MessageSpec request_spec(const StreamPlan& plan) {
  std::vector<std::string> names{"x_t", "t", "context", "context_lens"};
  if (plan.condition_channels > 0) names.emplace_back("y");  // an i2v teacher's condition
  return pick(plan, names);
}

MessageSpec answer_spec(const StreamPlan& plan) { return pick(plan, {"teacher_out"}); }

StudentService student_service(const ProcessGroups& groups, int world_rank, const StreamPlan& plan,
                               const ServiceSchedule& schedule, const CommConfig& config, const c10::Device& device,
                               HealthChannel* health) {
  const auto first = schedule.first_cycle();
  const auto end = std::max(first, schedule.end_cycle());
  StudentService out;
  out.answers = make_receiver(answer_end(groups, world_rank, config), answer_spec(plan), config, first, end, device,
                              health);
  int link_rank = 0;
  WD_CHECK_MPI(MPI_Comm_rank(groups.link(), &link_rank));
  const auto teacher = groups.layout().sender_of_replica(groups.layout().replica_of(world_rank));
  out.requests = make_sender(request_end(groups, world_rank, link_rank, teacher, world_rank), request_spec(plan),
                             config, first, end, device, health);
  return out;
}

TeacherService teacher_service(const ProcessGroups& groups, int world_rank, const StreamPlan& plan,
                               const ServiceSchedule& schedule, const CommConfig& config, const c10::Device& device,
                               HealthChannel* health) {
  const auto first = schedule.first_cycle();
  const auto end = std::max(first, schedule.end_cycle());
  TeacherService out;
  auto answers = answer_end(groups, world_rank, config);
  out.answers = make_sender(answers, answer_spec(plan), config, first, end, device, health);
  for (std::size_t i = 0; i < answers.peers.size(); ++i) {
    const auto ask = request_end(groups, world_rank, answers.peer_ranks[i], answers.peers[i], answers.peers[i]);
    out.requests.push_back(make_receiver(ask, request_spec(plan), config, first, end, device, health));
  }
  return out;
}

}  // namespace wd::comm
