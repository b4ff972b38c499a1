// The WD_CHECK_MPI macro, its message formatter, and the ranks of a communicator.
// Torch-free, for the NCCL layer too.
#pragma once

#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"

namespace wd::comm {

/// Formats a failed MPI call: "<call> failed: <MPI error string> (rank R, at file:line)".
std::string mpi_error_message(int code, const char* call, const char* file, int line);

/// World ranks of the members of `comm`, in communicator order.
std::vector<int> world_ranks_of(MPI_Comm comm);

/// This rank's rank in `comm` and its size; throws (naming `what`) where this rank is in no
/// communicator (MPI_COMM_NULL).
std::pair<int, int> rank_and_size(MPI_Comm comm, const char* what);

}  // namespace wd::comm

/// Throws wd::MpiError naming the call, MPI's error string, the rank and file:line.
#define WD_CHECK_MPI(call)                                                                     \
  do {                                                                                         \
    const int wd_mpi_rc_ = (call);                                                             \
    if (wd_mpi_rc_ != MPI_SUCCESS) {                                                           \
      throw ::wd::MpiError(::wd::comm::mpi_error_message(wd_mpi_rc_, #call, __FILE__, __LINE__)); \
    }                                                                                          \
  } while (0)
