// Where the ranks of a job run and how they leave it: the rank placement log (host from MPI,
// SLURM ids for reference) and the common exit of a requeue stop.
#pragma once

#include "core/topology.hpp"

namespace wd::app {

/// Gathers every rank's host (MPI_Get_processor_name), local rank and, when set, SLURM's job,
/// node name and task ids to world rank 0, which logs one table. Logging only: the layout
/// itself comes from MPI alone. Collective over MPI_COMM_WORLD; waits at most `timeout_s`.
void log_rank_placement(const Topology& topo, double timeout_s);

/// Returns once every rank has reached it (or after `timeout_s`, with a warning), so no rank
/// leaves a requeue stop before the others: a launcher that stops the job when one rank exits
/// non-zero (srun --kill-on-bad-exit, mpirun) would otherwise interrupt a rank still finishing
/// its last step. Stop signals are not polled here: the stop is already agreed.
void leave_together(int rank, double timeout_s);

}  // namespace wd::app
