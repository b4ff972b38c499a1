// Where the ranks of a job run: the rank placement log (host from MPI, SLURM ids for reference).
#pragma once

#include "core/topology.hpp"

namespace wd::app {

/// Gathers every rank's host (MPI_Get_processor_name), local rank and, when set, SLURM's job,
/// node name and task ids to world rank 0, which logs one table. Logging only: the layout
/// itself comes from MPI alone. Collective over MPI_COMM_WORLD; waits at most `timeout_s`.
void log_rank_placement(const Topology& topo, double timeout_s);

}  // namespace wd::app
