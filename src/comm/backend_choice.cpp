// choose_backend and the device gather it decides from.
#include "comm/backend_choice.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"

namespace wd::comm {

const char* backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "mpi"; }

std::string RankDevice::describe() const {
  std::string where = cuda_index < 0 ? "host" : "cuda:" + std::to_string(cuda_index);
  if (cuda_index >= 0 && !bus_id.empty()) where += " [" + bus_id + "]";
  return "rank " + std::to_string(world_rank) + " (" + where + " on " + host + ")";
}

bool same_gpu(const RankDevice& a, const RankDevice& b) {
  if (a.cuda_index < 0 || b.cuda_index < 0 || a.host != b.host) return false;
  if (!a.bus_id.empty() && !b.bus_id.empty()) return a.bus_id == b.bus_id;
  return a.cuda_index == b.cuda_index;
}

std::vector<RankDevice> sharing_gpu_with(const std::vector<RankDevice>& ends, int world_rank) {
  const auto me = std::find_if(ends.begin(), ends.end(),
                               [&](const RankDevice& e) { return e.world_rank == world_rank; });
  std::vector<RankDevice> others;
  if (me == ends.end()) return others;
  for (const RankDevice& e : ends) {
    if (e.world_rank != world_rank && same_gpu(*me, e)) others.push_back(e);
  }
  return others;
}

std::vector<RankDevice> gather_devices(MPI_Comm comm, int world_rank, const c10::Device& device,
                                       double timeout_s, const char* what, HealthChannel* health) {
  // Fixed-size records, so one MPI_Iallgather of bytes carries them.
  struct Record {
    int world_rank;
    int cuda_index;
    char host[MPI_MAX_PROCESSOR_NAME];
    char bus_id[32];  // "0000:3B:00.0" needs 13
  };
  int size = 0;
  WD_CHECK_MPI(MPI_Comm_size(comm, &size));
  auto buffer = torch::zeros({static_cast<std::int64_t>(sizeof(Record)) * (size + 1)}, torch::kUInt8);
  auto* records = reinterpret_cast<Record*>(buffer.data_ptr<std::uint8_t>());
  Record& mine = records[size];  // the send record sits after the receive area
  mine.world_rank = world_rank;
  mine.cuda_index = device.is_cuda() ? (device.has_index() ? device.index() : 0) : -1;
  int length = 0;
  WD_CHECK_MPI(MPI_Get_processor_name(mine.host, &length));
  const std::string bus = device.is_cuda() ? gpu_bus_id(device) : std::string();
  std::snprintf(mine.bus_id, sizeof mine.bus_id, "%s", bus.c_str());
  MPI_Request request;
  WD_CHECK_MPI(MPI_Iallgather(&mine, sizeof(Record), MPI_BYTE, records, sizeof(Record), MPI_BYTE,
                              comm, &request));
  std::vector<int> peers = world_ranks_of(comm);
  peers.erase(std::remove(peers.begin(), peers.end(), world_rank), peers.end());
  try {
    wait_with_deadline(request, {what, -1, sizeof(Record) * static_cast<std::size_t>(size), peers},
                       std::chrono::duration<double>(timeout_s), world_rank, health);
  } catch (...) {
    keep_until_exit(buffer);  // MPI may still write into it
    throw;
  }
  std::vector<RankDevice> ends;
  for (int i = 0; i < size; ++i) {
    records[i].host[MPI_MAX_PROCESSOR_NAME - 1] = '\0';
    records[i].bus_id[sizeof records[i].bus_id - 1] = '\0';
    ends.push_back({records[i].world_rank, records[i].host, records[i].cuda_index, records[i].bus_id});
  }
  return ends;
}

BackendChoice choose_backend(CommBackend requested, const std::vector<RankDevice>& ends,
                             bool nccl_available, const std::string& what) {
  if (requested == CommBackend::kMpi) return {Backend::kMpi, "comm.backend mpi"};
  // The first reason NCCL cannot carry this group, or "" when it can.
  std::string obstacle;
  for (std::size_t i = 0; i < ends.size() && obstacle.empty(); ++i) {
    if (ends[i].cuda_index < 0) {
      obstacle = ends[i].describe() + " holds host tensors";
      break;
    }
    for (std::size_t j = i + 1; j < ends.size(); ++j) {
      if (same_gpu(ends[i], ends[j])) {
        obstacle = ends[i].describe() + " and " + ends[j].describe() +
                   " share one GPU (NCCL refuses two ranks of one communicator on one GPU)";
        break;
      }
    }
  }
  if (obstacle.empty() && !nccl_available) {
    obstacle = "this build has no NCCL transport (LibTorch without CUDA, or -DWD_NCCL=OFF)";
  }
  if (requested == CommBackend::kNccl) {
    WD_CHECK_AS(ConfigError, obstacle.empty(),
                "comm.backend(nccl) cannot carry " << what << ": " << obstacle
                                                   << "; use comm.backend auto or mpi");
    return {Backend::kNccl, "comm.backend nccl"};
  }
  if (!obstacle.empty()) return {Backend::kMpi, obstacle};
  return {Backend::kNccl, "all " + std::to_string(ends.size()) + " rank(s) on distinct GPUs"};
}

}  // namespace wd::comm
