// What a rank does once training has failed anywhere: the failure protocol over the health
// channel, the diagnosis on the reporting rank, and one exit code on every rank.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "comm/failure_exchange.hpp"
#include "comm/health_channel.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/topology.hpp"
#include "memory/diagnosis.hpp"
#include "memory/memory_report.hpp"

namespace wd::job {

/// Everything the handler needs besides the exception; filled before training starts.
struct FailureSetup {
  memory::RemedyContext remedies;  ///< config values and command line for the remedies
  double timeout_s = 120;          ///< comm.timeout_s: bounds the protocol's waits
  std::string diagnosis_path;      ///< the diagnosis is also written here (run-dir/diagnosis.txt)
  /// Each world rank's role, from the layout; empty before it is made (then rank 0 is taken
  /// for the teacher, as in every layout on one node).
  std::vector<Role> roles;

  Role role_of(int rank) const {
    if (rank >= 0 && static_cast<std::size_t>(rank) < roles.size()) return roles[static_cast<std::size_t>(rank)];
    return rank == 0 ? Role::kTeacher : Role::kStudent;
  }
};

/// Runs the failure protocol for `failure` caught on this rank (its own, or a PeerFailure
/// that says another rank failed), prints the diagnosis if this rank is the reporter, and
/// leaves the process with the job's exit code without MPI_Finalize. `memory` is this rank's
/// report (measured by the caller after the stack unwound, with the categories it tracked).
[[noreturn]] void handle_training_failure(std::exception_ptr failure, comm::HealthChannel& health,
                                          comm::MpiRuntime& mpi, const FailureSetup& setup,
                                          const memory::MemoryReport& memory);

}  // namespace wd::job
