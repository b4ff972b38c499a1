// describe_layout: the rank table and the links' libraries (layout_report.hpp).
#include "job/layout_report.hpp"

#include <fmt/format.h>

#include <set>

#include "comm/stream_end.hpp"

namespace wd::job {

namespace {

/// "2-8" for a run of consecutive ranks, "5" for one, "1,3,5" otherwise.
std::string rank_range(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  if (ranks.size() == 1) return std::to_string(ranks.front());
  bool run = true;
  for (std::size_t i = 1; i < ranks.size(); ++i) run = run && ranks[i] == ranks[i - 1] + 1;
  if (run) return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string headline(const comm::Layout& layout, const std::vector<RankPlace>& places) {
  std::set<std::string> nodes;
  for (const auto& p : places) nodes.insert(p.device.host);
  const auto world = fmt::format("layout: {} ranks on {} node(s): ", layout.world_size, nodes.size());
  if (layout.colocated()) {
    return world + fmt::format("colocated: {} student rank(s), each computing its own targets (with its own "
                               "teacher, or from the data alone); no teacher ranks\n",
                               layout.student_ranks);
  }
  return world + fmt::format("{} teacher rank(s) in {} replica(s) of {} stage(s), {} student rank(s), {} per "
                             "replica; {}\n",
                             layout.teacher_ranks, layout.replicas, layout.stages, layout.student_ranks,
                             layout.students_per_replica(), layout.placement);
}

std::string rank_rows(const comm::Layout& layout, const std::vector<RankPlace>& places) {
  std::string out = fmt::format("  {:>4}  {:<16} {:>5}  {:<7}  {:<7}  {:>7}  {:>4}\n", "rank", "node", "local",
                                "device", "role", "replica", "slot");
  for (int r = 0; r < layout.world_size; ++r) {
    const auto& p = places[static_cast<std::size_t>(r)];
    const bool teacher = layout.role_of(r) == Role::kTeacher;
    const auto device = p.device.cuda_index < 0 ? std::string("host") : "cuda:" + std::to_string(p.device.cuda_index);
    out += fmt::format("  {:>4}  {:<16} {:>5}  {:<7}  {:<7}  {:>7}  {:>4}\n", r, p.device.host, p.local_rank, device,
                       teacher ? "teacher" : "student", layout.replica_of(r),
                       teacher ? std::string("-") : std::to_string(layout.student_slot(r)));
  }
  return out;
}

/// Each replica's batches, then the activations down each replica's stages.
std::string link_lines(const comm::Layout& layout, const std::vector<RankPlace>& places, CommBackend backend) {
  if (layout.colocated()) return "";
  const auto at = [&](int r) { return places[static_cast<std::size_t>(r)].device; };
  std::string out;
  for (int rep = 0; rep < layout.replicas; ++rep) {
    const int sender = layout.sender_of_replica(rep);
    const auto students = layout.students_of_replica(rep);
    std::set<std::string> student_nodes;
    std::vector<comm::RankDevice> ends{at(sender)};
    for (int s : students) {
      student_nodes.insert(at(s).host);
      ends.push_back(at(s));
    }
    const bool local = student_nodes.size() == 1 && *student_nodes.begin() == at(sender).host;
    const auto choice = comm::choose_backend(backend, ends, comm::nccl_built(), comm::student_link_name(rep));
    out += fmt::format("replica {}: teacher rank {} on {} streams to students {} on {}{} over {} ({})\n", rep, sender,
                       at(sender).host, rank_range(students), join(student_nodes),
                       local ? " (within the node)" : " (across nodes: batches travel over the network)",
                       comm::backend_name(choice.backend), choice.reason);
  }
  for (int rep = 0; rep < layout.replicas && layout.stages > 1; ++rep) {
    for (int k = 0; k + 1 < layout.stages; ++k) {
      const auto a = at(layout.teacher_of(rep, k)), b = at(layout.teacher_of(rep, k + 1));
      const auto choice = comm::choose_backend(backend, {a, b}, comm::nccl_built(), comm::stage_link_name(rep, k));
      out += fmt::format("replica {}: stage {} ({}) -> stage {} ({}) over {} ({})\n", rep, k, a.describe(), k + 1,
                         b.describe(), comm::backend_name(choice.backend), choice.reason);
    }
  }
  return out;
}

}  // namespace

std::string describe_layout(const comm::Layout& layout, const std::vector<RankPlace>& places,
                            CommBackend backend) {
  auto out = headline(layout, places) + rank_rows(layout, places) + link_lines(layout, places, backend);
  std::vector<comm::RankDevice> students;
  for (int r : layout.student_world_ranks()) students.push_back(places[static_cast<std::size_t>(r)].device);
  if (students.size() == 1) {  // make_gradient_reducer's rule: nothing to average with
    return out + "gradient all-reduce: none (a group of one student: its gradients are the average)\n";
  }
  const auto reduce = comm::choose_backend(backend, students, comm::nccl_built(), "the gradient all-reduce");
  return out + fmt::format("gradient all-reduce over {} ({})\n", comm::backend_name(reduce.backend), reduce.reason);
}

}  // namespace wd::job
