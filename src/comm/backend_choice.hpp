// Which library moves a group's tensors: NCCL where every rank's tensors sit on a distinct CUDA
// device and the build has NCCL, MPI otherwise (comm.backend = auto | mpi | nccl).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/choices.hpp"

namespace wd::comm {

class HealthChannel;

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
  /// The GPU's PCI bus id ("0000:3B:00.0"), "" where unknown (host tensors, a build without
  /// CUDA). The index alone does not name a GPU: under per-rank CUDA_VISIBLE_DEVICES (SLURM
  /// --gpus-per-task, --gpu-bind, cgroups) every rank of a node sees its own GPU as cuda:0.
  std::string bus_id;
  /// "rank 3 (cuda:1 on node7)", or "rank 3 (cuda:0 [0000:3B:00.0] on node7)" with a bus id.
  std::string describe() const;
};

/// True when `a` and `b` hold their tensors on one GPU: same host and, where both bus ids are
/// known, the same bus id (what NCCL itself compares); else the same CUDA index.
bool same_gpu(const RankDevice& a, const RankDevice& b);

/// The PCI bus id of CUDA `device` (its index, or the current device), "" for a host device,
/// in a build without CUDA, or where the runtime cannot tell. Never throws.
std::string gpu_bus_id(const c10::Device& device);

/// Every member's RankDevice (with the bus id of its GPU), in `comm` order (collective over
/// `comm`, with deadline, polling `health`: null before training).
std::vector<RankDevice> gather_devices(MPI_Comm comm, int world_rank, const c10::Device& device,
                                       double timeout_s, const char* what, HealthChannel* health);

struct BackendChoice {
  Backend backend = Backend::kMpi;
  std::string reason;  ///< one clause for the log: why this backend
};

/// The backend for a group whose members are `ends`. `requested` is comm.backend: mpi always
/// gives MPI; nccl gives NCCL or throws ConfigError naming the ranks and devices that rule it
/// out (a host member, two members on one GPU (same_gpu), no NCCL in the build); auto gives
/// NCCL where nccl would not throw, MPI otherwise. `what` names the group in messages.
BackendChoice choose_backend(CommBackend requested, const std::vector<RankDevice>& ends,
                             bool nccl_available, const std::string& what);

/// The members of `ends` other than `world_rank` whose tensors sit on `world_rank`'s GPU
/// (same_gpu); empty for a host rank or a rank not in `ends`.
std::vector<RankDevice> sharing_gpu_with(const std::vector<RankDevice>& ends, int world_rank);

}  // namespace wd::comm
