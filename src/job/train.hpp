// The `train` job as one call: what `wan-distill train` runs once it has parsed its options.
#pragma once

#include "job/train_job.hpp"

namespace wd::job {

/// Runs `train` on this MPI rank for `job` (cfg, args and config_ini set; MPI not yet
/// initialised): start-up (startup.hpp), this rank's role, the run summary; any failure on any
/// rank ends every rank with one diagnosis (failure_handler.hpp). Returns the exit code, or
/// leaves the process with it (a failure in training, a requeue stop).
int run_train_job(TrainJob& job);

}  // namespace wd::job
