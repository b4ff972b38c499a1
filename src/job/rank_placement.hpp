// Where the ranks of a job run: every rank's node (MPI's shared-memory groups) and the rank
// placement log (host from MPI, SLURM ids for reference).
#pragma once

#include <vector>

#include "core/topology.hpp"
#include "job/layout_report.hpp"

namespace wd::job {

/// The node of every world rank, as ids the layout renumbers (the lowest world rank of the
/// rank's MPI_COMM_TYPE_SHARED group, the group that numbers its local rank and GPU).
/// Collective over MPI_COMM_WORLD; each wait ends within `timeout_s`.
std::vector<int> gather_node_of_ranks(int world_rank, int world_size, double timeout_s);

/// Gathers every rank's host (MPI_Get_processor_name), local rank, GPU (`gpu`, -1: the host)
/// and, when set, SLURM's job, node name and task ids to world rank 0, which logs one table and
/// returns every rank's place (SLURM's node name where set, else the host); the other ranks
/// return nothing. Logging only: the layout itself comes from MPI alone. Collective over
/// MPI_COMM_WORLD; waits at most `timeout_s`.
std::vector<RankPlace> log_rank_placement(const Topology& topo, int gpu, double timeout_s);

}  // namespace wd::job
