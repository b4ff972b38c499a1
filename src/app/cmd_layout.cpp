// `wan-distill layout`: prints which world rank is teacher or student on which node and GPU,
// for a config and an allocation, without MPI (checked before a queue slot is spent).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "app/commands.hpp"
#include "comm/process_groups.hpp"

namespace wd::app {

namespace {

/// The allocation the job will get; ranks are placed in blocks (srun --distribution=block,
/// mpirun --map-by ppr:G:node), one per GPU, so rank r runs on node r / G with GPU r % G.
struct AllocationConfig {
  int nodes = 1;
  int gpus_per_node = 8;
  std::string node_names;  ///< comma-separated; empty: node0, node1, ...
  int teacher_ranks = 0;   ///< 0: teacher.ranks from the config file (default 1)

  void bind(OptionTable& t) {
    t.bind("nodes", nodes, "nodes in the allocation (sbatch --nodes)")
        .bind("gpus-per-node", gpus_per_node, "GPUs per node = ranks per node (one rank per GPU)")
        .bind("node-names", node_names,
              "node names, comma-separated (e.g. from scontrol show hostnames); default node0,node1,...")
        .bind("teacher.ranks", teacher_ranks, "teacher ranks (0: the value in --config, default 1)");
  }
};

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

/// teacher.ranks from a train config file. Only that key matters here; the file's other keys
/// belong to `train`, which checks them.
int teacher_ranks_in(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError("config file " + file + ": cannot be opened");
  int ranks = 1;
  po::options_description only;
  only.add_options()("teacher.ranks", po::value<int>(&ranks));
  po::variables_map vm;
  try {
    po::store(po::parse_config_file(in, only, /*allow_unregistered=*/true), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError("config file " + file + ": " + e.what());
  }
  return ranks;
}

/// "2-8" or "5" for a sorted run of ranks.
std::string rank_range(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  if (ranks.size() == 1) return std::to_string(ranks.front());
  return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Takes `--config FILE` (or `--config=FILE`) out of `args`: parse_options would read the file
/// strictly into the layout table, and a train config has many keys besides teacher.ranks.
std::string take_config(std::vector<std::string>& args) {
  std::string file;
  for (auto it = args.begin(); it != args.end();) {
    if (*it == "--config" && it + 1 != args.end()) {
      file = *(it + 1);
      it = args.erase(it, it + 2);
    } else if (it->rfind("--config=", 0) == 0) {
      file = it->substr(9);
      it = args.erase(it);
    } else {
      ++it;
    }
  }
  return file;
}

}  // namespace

int run_layout(const std::vector<std::string>& args) {
  AllocationConfig alloc;
  OptionTable table("layout options (--config FILE: a train config, read for teacher.ranks)");
  alloc.bind(table);
  auto rest = args;
  const auto config_file = take_config(rest);
  const auto parsed = parse_options(rest, table);
  if (parsed.help) {
    print_help("wan-distill layout [--config FILE] --nodes N --gpus-per-node G [--teacher.ranks T]",
               "Prints the rank layout `train` will use on an allocation of N nodes x G GPUs: for\n"
               "every world rank its node, local rank and GPU, its role and its teacher replica.\n"
               "Ranks are placed in blocks, one per GPU (as slurm/*.sbatch and launch/mpirun.sh\n"
               "start them). Needs no MPI; exit code 2 when the layout is invalid.",
               table);
    return kExitOk;
  }
  // The command line wins over the file, as in `train`.
  const int teachers = alloc.teacher_ranks > 0 ? alloc.teacher_ranks
                       : config_file.empty()   ? 1
                                               : teacher_ranks_in(config_file);
  auto names = split_names(alloc.node_names);
  ConfigProblems problems;
  problems.check(alloc.nodes >= 1, "nodes(" + std::to_string(alloc.nodes) + ") must be >= 1");
  problems.check(alloc.gpus_per_node >= 1,
                 "gpus-per-node(" + std::to_string(alloc.gpus_per_node) + ") must be >= 1");
  problems.check(names.empty() || static_cast<int>(names.size()) == alloc.nodes,
                 "node-names lists " + std::to_string(names.size()) + " node(s) but nodes(" +
                     std::to_string(alloc.nodes) + ")");
  problems.throw_if_any("layout");
  if (names.empty()) {
    for (int n = 0; n < alloc.nodes; ++n) names.push_back("node" + std::to_string(n));
  }
  const int world = alloc.nodes * alloc.gpus_per_node;
  const auto layout = comm::Layout::make(world, teachers);
  const auto node_of = [&](int rank) { return names[static_cast<std::size_t>(rank / alloc.gpus_per_node)]; };

  std::cout << "layout: " << world << " ranks on " << alloc.nodes << " node(s) x " << alloc.gpus_per_node
            << " GPU(s): " << layout.teacher_ranks << " teacher rank(s) in " << layout.replicas
            << " replica(s), " << layout.student_ranks << " student rank(s), "
            << layout.students_per_replica() << " per replica\n";
  std::printf("  %4s  %-16s %5s  %-7s  %-7s  %7s  %4s\n", "rank", "node", "local", "device", "role",
              "replica", "slot");
  for (int r = 0; r < world; ++r) {
    const bool teacher = layout.role_of(r) == Role::kTeacher;
    const int local = r % alloc.gpus_per_node;
    std::printf("  %4d  %-16s %5d  cuda:%-2d  %-7s  %7d  %4s\n", r, node_of(r).c_str(), local, local,
                teacher ? "teacher" : "student", layout.replica_of(r),
                teacher ? "-" : std::to_string(layout.student_slot(r)).c_str());
  }
  // Where each replica's batches travel: within a node (NVLink / shared memory) or across.
  for (int rep = 0; rep < layout.replicas; ++rep) {
    const int sender = layout.sender_of_replica(rep);
    const auto students = layout.students_of_replica(rep);
    std::set<std::string> student_nodes;
    for (int s : students) student_nodes.insert(node_of(s));
    const bool local = student_nodes.size() == 1 && *student_nodes.begin() == node_of(sender);
    std::cout << "replica " << rep << ": teacher rank " << sender << " on " << node_of(sender)
              << " streams to students " << rank_range(students) << " on " << join(student_nodes)
              << (local ? " (within the node)" : " (across nodes: batches travel over the network)")
              << "\n";
  }
  return kExitOk;
}

}  // namespace wd::app
