// Start-up agreement: every rank learns whether any rank failed its checks, and why, before
// training begins, so a bad config or data set stops all ranks with one clear error.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace wd::comm {

class HealthChannel;

/// Collective over `comm` (with deadline): if any rank passes a non-null `failure`, every rank
/// throws the same error: the failing rank's own exception there, and on the others a
/// wd::Error (or wd::DataError / wd::ConfigError, matching the kind) saying
/// "<stage> failed on rank R: <message>". Returns normally when no rank failed. The waits poll
/// `health` (null before training).
void agree_on_startup(const std::string& stage, std::exception_ptr failure, MPI_Comm comm,
                      double timeout_s, HealthChannel* health);

/// Broadcasts a vector of int64 from `root` with deadline (the size must be known to all),
/// polling `health` (null before training).
void broadcast_ints(std::vector<std::int64_t>& values, int root, MPI_Comm comm, double timeout_s,
                    const char* what, HealthChannel* health);

}  // namespace wd::comm
