// `wan-distill layout`: prints which world rank is teacher or student on which node and GPU,
// for a config and an allocation, without MPI (checked before a queue slot is spent).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "app/commands.hpp"
#include "comm/backend_choice.hpp"
#include "comm/process_groups.hpp"
#include "comm/stream_end.hpp"
#include "core/topology.hpp"
#include "teacher/placement.hpp"

namespace wd::app {

namespace {

/// The allocation the job will get; ranks are placed in blocks (srun --distribution=block,
/// mpirun --map-by ppr:N:node), by default one per GPU, so rank r runs on node r / N as
/// node-local rank r % N, on GPU (r % N) mod G (train's rule, gpu_of_local_rank). Which rank
/// is teacher or student follows from the nodes as in train (Layout::make).
struct AllocationConfig {
  int nodes = 1;
  int gpus_per_node = 8;
  int ranks_per_node = 0;  ///< 0: gpus_per_node
  std::string node_names;  ///< comma-separated; empty: node0, node1, ...
  // The train keys that decide devices and links; 0 / empty: the value in --config.
  int teacher_ranks = 0;
  std::string teacher_placement;
  int teacher_stages = 0;
  std::string student_device;
  std::string comm_backend;

  void bind(OptionTable& t) {
    t.bind("nodes", nodes, "nodes in the allocation (sbatch --nodes)")
        .bind("gpus-per-node", gpus_per_node, "GPUs per node")
        .bind("ranks-per-node", ranks_per_node,
              "ranks per node (0: one per GPU); more ranks than GPUs share GPUs, as train does")
        .bind("node-names", node_names,
              "node names, comma-separated (e.g. from scontrol show hostnames); default node0,node1,...")
        .bind("teacher.ranks", teacher_ranks, "teacher ranks (0: the value in --config, default 1)")
        .bind("teacher.placement", teacher_placement,
              "as in train (empty: the value in --config, default auto); cpu puts teachers on the host, "
              "shard splits each replica's blocks over teacher.stages ranks")
        .bind("teacher.stages", teacher_stages,
              "as in train, with teacher.placement shard (0: the value in --config, else "
              "teacher.shard_map's stages, else teacher.ranks)")
        .bind("student.device", student_device, "as in train (empty: the value in --config, default auto)")
        .bind("comm.backend", comm_backend, "as in train (empty: the value in --config, default auto)");
  }
};

/// The train keys of a config file that the layout depends on (defaults where absent).
struct TrainKeys {
  int teacher_ranks = 1;
  std::string teacher_placement = "auto";
  int teacher_stages = 0;
  std::string teacher_shard_map;
  std::string student_device = "auto";
  std::string comm_backend = "auto";
};

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

/// The layout's keys from a train config file. Only these matter here; the file's other keys
/// belong to `train`, which checks them.
TrainKeys train_keys_in(const std::string& file) {
  TrainKeys keys;
  if (file.empty()) return keys;
  std::ifstream in(file);
  if (!in) throw ConfigError("config file " + file + ": cannot be opened");
  po::options_description only;
  only.add_options()("teacher.ranks", po::value<int>(&keys.teacher_ranks))(
      "teacher.placement", po::value<std::string>(&keys.teacher_placement))(
      "teacher.stages", po::value<int>(&keys.teacher_stages))(
      "teacher.shard_map", po::value<std::string>(&keys.teacher_shard_map))(
      "student.device", po::value<std::string>(&keys.student_device))(
      "comm.backend", po::value<std::string>(&keys.comm_backend));
  po::variables_map vm;
  try {
    po::store(po::parse_config_file(in, only, /*allow_unregistered=*/true), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError("config file " + file + ": " + e.what());
  }
  return keys;
}

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
    print_help("wan-distill layout [--config FILE] --nodes N --gpus-per-node G [--ranks-per-node R]\n"
               "                   [--teacher.ranks T] [--teacher.placement P] [--teacher.stages S]\n"
               "                   [--student.device D] [--comm.backend B]",
               "Prints the rank layout `train` will use on an allocation of N nodes x G GPUs: for\n"
               "every world rank its node, local rank and device, its role and its teacher replica,\n"
               "then which library (NCCL or MPI) carries each teacher -> student link, each link\n"
               "between shard stages (--teacher.placement shard) and the gradient all-reduce, and\n"
               "why. Ranks are placed in blocks, one per GPU unless\n"
               "--ranks-per-node says otherwise (as slurm/*.sbatch and launch/mpirun.sh start them).\n"
               "Needs no MPI; exit code 2 when the layout is invalid.",
               table);
    return kExitOk;
  }
  // The command line wins over the file, as in `train`.
  auto keys = train_keys_in(config_file);
  if (alloc.teacher_ranks > 0) keys.teacher_ranks = alloc.teacher_ranks;
  if (!alloc.teacher_placement.empty()) keys.teacher_placement = alloc.teacher_placement;
  if (alloc.teacher_stages > 0) keys.teacher_stages = alloc.teacher_stages;
  if (!alloc.student_device.empty()) keys.student_device = alloc.student_device;
  if (!alloc.comm_backend.empty()) keys.comm_backend = alloc.comm_backend;
  const int per_node = alloc.ranks_per_node > 0 ? alloc.ranks_per_node : alloc.gpus_per_node;
  auto names = split_names(alloc.node_names);
  ConfigProblems problems;
  problems.check(alloc.nodes >= 1, "nodes(" + std::to_string(alloc.nodes) + ") must be >= 1");
  problems.check(alloc.gpus_per_node >= 1,
                 "gpus-per-node(" + std::to_string(alloc.gpus_per_node) + ") must be >= 1");
  problems.check(alloc.ranks_per_node >= 0,
                 "ranks-per-node(" + std::to_string(alloc.ranks_per_node) + ") must be >= 0");
  problems.check(names.empty() || static_cast<int>(names.size()) == alloc.nodes,
                 "node-names lists " + std::to_string(names.size()) + " node(s) but nodes(" +
                     std::to_string(alloc.nodes) + ")");
  problems.check(keys.student_device == "auto" || keys.student_device == "cpu" || keys.student_device == "cuda",
                 "student.device(" + keys.student_device + ") must be auto, cpu or cuda");
  problems.throw_if_any("layout");
  if (names.empty()) {
    for (int n = 0; n < alloc.nodes; ++n) names.push_back("node" + std::to_string(n));
  }
  const int world = alloc.nodes * per_node;
  // Pipeline stages as train makes them for an explicit shard placement (auto decides at start-up,
  // from the teacher's size and the free memory, so its stages are not known here).
  teacher::TeacherConfig stage_keys;
  stage_keys.ranks = keys.teacher_ranks;
  stage_keys.stages = keys.teacher_stages;
  stage_keys.shard_map = keys.teacher_shard_map;
  const bool shard = keys.teacher_placement == "shard";
  std::vector<int> node_of_rank;
  for (int r = 0; r < world; ++r) node_of_rank.push_back(r / per_node);
  const auto layout = comm::Layout::make(
      world, keys.teacher_ranks,
      teacher::stages_for(stage_keys, shard ? plan::Placement::kShard : plan::Placement::kGpu), node_of_rank);
  const auto node_of = [&](int rank) { return names[static_cast<std::size_t>(layout.node_of(rank))]; };
  // Each rank's device as train resolves it on a node with these GPUs.
  const auto device_of = [&](int rank) {
    const bool teacher = layout.role_of(rank) == Role::kTeacher;
    const bool host = teacher ? keys.teacher_placement == "cpu" : keys.student_device == "cpu";
    return comm::RankDevice{rank, node_of(rank), host ? -1 : gpu_of_local_rank(rank % per_node, alloc.gpus_per_node)};
  };

  std::cout << "layout: " << world << " ranks on " << alloc.nodes << " node(s) x " << alloc.gpus_per_node
            << " GPU(s): " << layout.teacher_ranks << " teacher rank(s) in " << layout.replicas
            << " replica(s), " << layout.student_ranks << " student rank(s), "
            << layout.students_per_replica() << " per replica; " << layout.placement << "\n";
  std::printf("  %4s  %-16s %5s  %-7s  %-7s  %7s  %4s\n", "rank", "node", "local", "device", "role",
              "replica", "slot");
  for (int r = 0; r < world; ++r) {
    const bool teacher = layout.role_of(r) == Role::kTeacher;
    const auto d = device_of(r);
    const std::string device = d.cuda_index < 0 ? "host" : "cuda:" + std::to_string(d.cuda_index);
    std::printf("  %4d  %-16s %5d  %-7s  %-7s  %7d  %4s\n", r, node_of(r).c_str(), r % per_node, device.c_str(),
                teacher ? "teacher" : "student", layout.replica_of(r),
                teacher ? "-" : std::to_string(layout.student_slot(r)).c_str());
  }
  if (per_node > alloc.gpus_per_node) {
    std::cout << "note: " << per_node << " ranks per node on " << alloc.gpus_per_node
              << " GPU(s): ranks share GPUs (train warns); links between ranks on one GPU use MPI\n";
  }
  // Where each replica's batches travel, and over which library (train's rule, choose_backend).
  for (int rep = 0; rep < layout.replicas; ++rep) {
    const int sender = layout.sender_of_replica(rep);
    const auto students = layout.students_of_replica(rep);
    std::set<std::string> student_nodes;
    std::vector<comm::RankDevice> ends{device_of(sender)};
    for (int s : students) {
      student_nodes.insert(node_of(s));
      ends.push_back(device_of(s));
    }
    const bool local = student_nodes.size() == 1 && *student_nodes.begin() == node_of(sender);
    const auto choice = comm::choose_backend(keys.comm_backend, ends, comm::nccl_built(),
                                             comm::student_link_name(rep));
    std::cout << "replica " << rep << ": teacher rank " << sender << " on " << node_of(sender)
              << " streams to students " << rank_range(students) << " on " << join(student_nodes)
              << (local ? " (within the node)" : " (across nodes: batches travel over the network)")
              << " over " << comm::backend_name(choice.backend) << " (" << choice.reason << ")\n";
  }
  // Shard stages hand activations down each replica's pipeline, link by link (make_stage_streams).
  for (int rep = 0; rep < layout.replicas && layout.stages > 1; ++rep) {
    for (int k = 0; k + 1 < layout.stages; ++k) {
      const auto a = device_of(layout.teacher_of(rep, k)), b = device_of(layout.teacher_of(rep, k + 1));
      const auto choice =
          comm::choose_backend(keys.comm_backend, {a, b}, comm::nccl_built(), comm::stage_link_name(rep, k));
      std::cout << "replica " << rep << ": stage " << k << " (" << a.describe() << ") -> stage " << k + 1
                << " (" << b.describe() << ") over " << comm::backend_name(choice.backend) << " ("
                << choice.reason << ")\n";
    }
  }
  if (keys.teacher_placement == "auto" && keys.teacher_ranks > 1) {
    std::cout << "note: teacher.placement auto decides at start-up whether the " << keys.teacher_ranks
              << " teacher ranks are replicas or shard stages; --teacher.placement shard shows the stages\n";
  }
  std::vector<comm::RankDevice> students;
  for (int r : layout.student_world_ranks()) students.push_back(device_of(r));
  if (students.size() == 1) {  // make_gradient_reducer's rule: nothing to average with
    std::cout << "gradient all-reduce: none (a group of one student: its gradients are the average)\n";
    return kExitOk;
  }
  const auto reduce = comm::choose_backend(keys.comm_backend, students, comm::nccl_built(), "the gradient all-reduce");
  std::cout << "gradient all-reduce over " << comm::backend_name(reduce.backend) << " (" << reduce.reason << ")\n";
  return kExitOk;
}

}  // namespace wd::app
