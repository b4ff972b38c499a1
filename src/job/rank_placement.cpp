// The rank placement table (one gather of fixed-size records to world rank 0) and the common
// exit of a requeue stop.
#include "job/rank_placement.hpp"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_runtime.hpp"

namespace wd::job {

namespace {

/// One rank's record; plain bytes so it travels as MPI_BYTE.
struct PlacementRecord {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  char slurm_node[64] = {};  ///< SLURMD_NODENAME
  int role = 0;              ///< Role as int
  int local_rank = 0;
  int local_size = 1;
  int slurm_procid = -1;     ///< SLURM_PROCID
  int slurm_nodeid = -1;     ///< SLURM_NODEID
  int slurm_localid = -1;    ///< SLURM_LOCALID
  int gpu = -1;              ///< CUDA index; -1: the host
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : -1;
}

std::string or_dash(int v) { return v < 0 ? "-" : std::to_string(v); }

}  // namespace

std::vector<int> gather_node_of_ranks(int world_rank, int world_size, double timeout_s) {
  // The node is the shared-memory group that also numbers each rank's local rank (and so its
  // GPU), named by its lowest world rank: host names can repeat across SLURM nodes on one host.
  MPI_Comm node = MPI_COMM_NULL;
  WD_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  struct Freed {
    MPI_Comm& comm;
    ~Freed() { MPI_Comm_free(&comm); }
  } freed{node};
  int leader = world_rank;
  MPI_Request req;
  WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node, &req));
  comm::wait_with_deadline(req, {"find this node's first rank", -1, sizeof(int), {}},
                           std::chrono::duration<double>(timeout_s), world_rank, nullptr);
  std::vector<int> leaders(static_cast<std::size_t>(world_size), -1);
  WD_CHECK_MPI(MPI_Iallgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD, &req));
  std::vector<int> peers;
  for (int r = 0; r < world_size; ++r) {
    if (r != world_rank) peers.push_back(r);
  }
  comm::wait_with_deadline(req, {"gather every rank's node", -1, leaders.size() * sizeof(int), peers},
                           std::chrono::duration<double>(timeout_s), world_rank, nullptr);
  return leaders;
}

std::vector<RankPlace> log_rank_placement(const Topology& topo, int gpu, double timeout_s) {
  PlacementRecord mine;
  int len = 0;
  WD_CHECK_MPI(MPI_Get_processor_name(mine.host, &len));
  if (const char* node = std::getenv("SLURMD_NODENAME")) {
    std::strncpy(mine.slurm_node, node, sizeof(mine.slurm_node) - 1);
  }
  mine.role = static_cast<int>(topo.role);
  mine.local_rank = topo.local_rank;
  mine.local_size = topo.local_size;
  mine.slurm_procid = env_int("SLURM_PROCID");
  mine.slurm_nodeid = env_int("SLURM_NODEID");
  mine.slurm_localid = env_int("SLURM_LOCALID");
  mine.gpu = gpu;

  std::vector<PlacementRecord> all(topo.rank == 0 ? topo.world_size : 0);
  constexpr int kBytes = sizeof(PlacementRecord);
  MPI_Request req;
  WD_CHECK_MPI(MPI_Igather(&mine, kBytes, MPI_BYTE, all.data(), kBytes, MPI_BYTE, 0, MPI_COMM_WORLD, &req));
  std::vector<int> peers;
  if (topo.rank == 0) {
    for (int r = 1; r < topo.world_size; ++r) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  comm::wait_with_deadline(req, {"gather rank placement", -1, sizeof(mine), peers},
                           std::chrono::duration<double>(timeout_s), topo.rank, nullptr);
  if (topo.rank != 0) return {};

  const char* job = std::getenv("SLURM_JOB_ID");
  std::string table = job ? fmt::format("rank placement (SLURM job {}; the ids are logged only, the layout comes from MPI):", job)
                          : std::string("rank placement:");
  table += fmt::format("\n  {:>4}  {:<7}  {:<16} {:>5}  {:<12} {:>6} {:>6} {:>7}", "rank", "role", "host", "local",
                       "slurm-node", "procid", "nodeid", "localid");
  for (int r = 0; r < topo.world_size; ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    table += fmt::format("\n  {:>4}  {:<7}  {:<16} {:>5}  {:<12} {:>6} {:>6} {:>7}", r,
                         role_name(static_cast<Role>(p.role)), p.host,
                         fmt::format("{}/{}", p.local_rank, p.local_size), *p.slurm_node ? p.slurm_node : "-",
                         or_dash(p.slurm_procid), or_dash(p.slurm_nodeid), or_dash(p.slurm_localid));
  }
  spdlog::info("{}", table);
  std::vector<RankPlace> places;
  for (int r = 0; r < topo.world_size; ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    places.push_back({{r, *p.slurm_node ? p.slurm_node : p.host, p.gpu, ""}, p.local_rank});
  }
  return places;
}

}  // namespace wd::job
