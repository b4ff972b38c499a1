// Which library moves a group's tensors: NCCL where every rank's tensors sit on a distinct CUDA
// device and the build has NCCL, MPI otherwise (comm.backend = auto | mpi | nccl).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace wd::comm {

enum class Backend { kMpi, kNccl };

/// "mpi" | "nccl".
const char* backend_name(Backend backend);

/// True when this build has the NCCL transport and gradient reducer (a CUDA LibTorch with NCCL).
bool nccl_built();

/// Where one rank of a group keeps the tensors it communicates.
struct RankDevice {
  int world_rank = 0;
  std::string host;     ///< MPI_Get_processor_name
  int cuda_index = -1;  ///< the CUDA device index; -1 for host tensors
  /// "rank 3 (cuda:1 on node7)".
  std::string describe() const;
};

/// Every member's RankDevice, in `comm` order (collective over `comm`, with deadline).
std::vector<RankDevice> gather_devices(MPI_Comm comm, int world_rank, const c10::Device& device,
                                       double timeout_s, const char* what);

struct BackendChoice {
  Backend backend = Backend::kMpi;
  std::string reason;  ///< one clause for the log: why this backend
};

/// The backend for a group whose members are `ends`. `requested` is comm.backend: mpi always
/// gives MPI; nccl gives NCCL or throws ConfigError naming the ranks and devices that rule it
/// out (a host member, two members on one GPU of one node, no NCCL in the build); auto gives
/// NCCL where nccl would not throw, MPI otherwise. `what` names the group in messages.
BackendChoice choose_backend(const std::string& requested, const std::vector<RankDevice>& ends,
                             bool nccl_available, const std::string& what);

}  // namespace wd::comm
