// `wan-distill layout`: prints which world rank is teacher or student on which node and GPU,
// for a train config and an allocation, without MPI (checked before a queue slot is spent).
// The roles come from train's own start-up stage (job::make_layout) and the table from the
// function train logs it with (job::describe_layout).
#include <iostream>
#include <sstream>

#include "app/commands.hpp"
#include "job/layout_report.hpp"
#include "job/run_config.hpp"
#include "job/startup.hpp"
#include "teacher/placement.hpp"

namespace wd::app {

namespace {

/// The allocation the job will get; ranks are placed in blocks (srun --distribution=block,
/// mpirun --map-by ppr:N:node), by default one per GPU, so rank r runs on node r / N as
/// node-local rank r % N, on GPU (r % N) mod G (train's rule, gpu_of_local_rank).
struct Allocation {
  int nodes = 1;
  int gpus_per_node = 8;
  int ranks_per_node = 0;  ///< 0: gpus_per_node
  std::string node_names;  ///< comma-separated; empty: node0, node1, ...

  void bind(OptionTable& t) {
    t.bind("nodes", nodes, "nodes in the allocation (sbatch --nodes)")
        .bind("gpus-per-node", gpus_per_node, "GPUs per node")
        .bind("ranks-per-node", ranks_per_node,
              "ranks per node (0: one per GPU); more ranks than GPUs share GPUs, as train does")
        .bind("node-names", node_names,
              "node names, comma-separated (e.g. from scontrol show hostnames); default node0,node1,...");
  }
  int per_node() const { return ranks_per_node > 0 ? ranks_per_node : gpus_per_node; }

  /// The node names, checked against `nodes`, with the others' problems.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    std::stringstream in(node_names);
    for (std::string name; std::getline(in, name, ',');) {
      if (!name.empty()) out.push_back(name);
    }
    ConfigProblems p;
    p.check(nodes >= 1, "nodes(" + std::to_string(nodes) + ") must be >= 1");
    p.check(gpus_per_node >= 1, "gpus-per-node(" + std::to_string(gpus_per_node) + ") must be >= 1");
    p.check(ranks_per_node >= 0, "ranks-per-node(" + std::to_string(ranks_per_node) + ") must be >= 0");
    p.check(out.empty() || static_cast<int>(out.size()) == nodes,
            "node-names lists " + std::to_string(out.size()) + " node(s) but nodes(" + std::to_string(nodes) + ")");
    p.throw_if_any("layout");
    for (int n = static_cast<int>(out.size()); n < nodes; ++n) out.push_back("node" + std::to_string(n));
    return out;
  }
};

/// The placement the roles follow. auto decides at start-up from the teacher's size and the
/// free memory, between whole teachers (shown) and shard stages.
plan::Placement shown_placement(const job::RunConfig& cfg) {
  const auto p = cfg.teacher.placement;
  if (p == TeacherPlacement::kAuto || p == TeacherPlacement::kColocated) return plan::Placement::kGpu;
  return teacher::parse_placement(name_of(p));
}

}  // namespace

int run_layout(const std::vector<std::string>& args) {
  job::RunConfig cfg;
  Allocation alloc;
  OptionTable table("layout options (the allocation; with --config, a train config, and train's keys)");
  alloc.bind(table);
  OptionTable train("train's options (as in `wan-distill train`)");
  cfg.bind(train);
  table.add(train);
  if (parse_options(args, table).help) {
    print_help("wan-distill layout [--config FILE] --nodes N --gpus-per-node G [--ranks-per-node R]\n"
               "                   [--node-names a,b] [any train option: --teacher.ranks T ...]",
               "Prints the rank layout `train` will use on an allocation of N nodes x G GPUs: for\n"
               "every world rank its node, local rank and device, its role and its teacher replica,\n"
               "then which library (NCCL or MPI) carries each teacher -> student link, each link\n"
               "between shard stages (teacher.placement shard) and the gradient all-reduce, and why:\n"
               "the same table train logs at start-up. Ranks are placed in blocks, one per GPU unless\n"
               "--ranks-per-node says otherwise (as slurm/*.sbatch and launch/mpirun.sh start them).\n"
               "Needs no MPI; exit code 2 when the layout is invalid.",
               table);
    return kExitOk;
  }
  cfg.validate();
  const auto names = alloc.names();
  const int per_node = alloc.per_node();
  const int world = alloc.nodes * per_node;
  std::vector<int> node_of_rank;
  for (int r = 0; r < world; ++r) node_of_rank.push_back(r / per_node);
  const auto placement = shown_placement(cfg);
  const auto layout = job::make_layout(cfg, placement, world, node_of_rank);
  std::vector<job::RankPlace> places;
  for (int r = 0; r < world; ++r) {
    const int gpu = job::planned_gpu(cfg, placement, layout.role_of(r), r % per_node, alloc.gpus_per_node);
    places.push_back({{r, names[static_cast<std::size_t>(r / per_node)], gpu, ""}, r % per_node});
  }
  std::cout << "allocation: " << alloc.nodes << " node(s) x " << alloc.gpus_per_node << " GPU(s), " << per_node
            << " rank(s) per node\n"
            << job::describe_layout(layout, places, cfg.comm.backend);
  if (per_node > alloc.gpus_per_node) {
    std::cout << "note: " << per_node << " ranks per node on " << alloc.gpus_per_node
              << " GPU(s): ranks share GPUs (train warns); links between ranks on one GPU use MPI\n";
  }
  if (cfg.teacher.placement == TeacherPlacement::kAuto && cfg.teacher.ranks > 1) {
    std::cout << "note: teacher.placement auto decides at start-up whether the " << cfg.teacher.ranks
              << " teacher ranks are replicas or shard stages; --teacher.placement shard shows the stages\n";
  }
  if (cfg.teacher.layout == TeacherLayout::kAuto) {
    std::cout << "note: teacher.layout auto times the job's models at start-up and may choose other roles; "
                 "shown: the given teacher.ranks and teacher.placement\n";
  }
  return kExitOk;
}

}  // namespace wd::app
