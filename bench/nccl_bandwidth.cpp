// nccl_bandwidth: NCCL send/recv bandwidth (a one-rank send-to-self, and rank 0 -> rank 1 when
// there are two ranks with a GPU each) next to a plain cudaMemcpy device -> device of the same
// sizes, 1 MiB .. 1 GiB. Run as `mpirun -np 1` or `-np 2`; without a GPU it says so and exits 2.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi_runtime.hpp"
#include "comm/nccl_comm.hpp"

namespace wd::bench {
namespace {

using comm::CudaEvent;
using comm::CudaStream;
using comm::NcclComm;
using comm::WaitInfo;

constexpr double kTimeout = 120.0;  // deadline of every wait (a 1 GiB copy takes milliseconds)

/// Repetitions for a size: enough to time small messages, few for the big ones.
int reps_for(std::size_t bytes) { return bytes <= (64u << 20) ? 20 : 5; }

/// Device memory owned for the run.
struct DeviceBytes {
  DeviceBytes(int device, std::size_t bytes) {
    comm::CudaDeviceGuard guard(device);
    WD_CHECK_CUDA(cudaMalloc(&data, bytes));
    WD_CHECK_CUDA(cudaMemset(data, 1, bytes));
  }
  ~DeviceBytes() { cudaFree(data); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* data = nullptr;
};

/// Times `reps` runs of `op` on `stream` (after two warm-ups) with CUDA events; GB/s of `bytes`.
template <typename Op>
double gbps(NcclComm& comm, int device, cudaStream_t stream, std::size_t bytes, const char* what,
            Op op) {
  CudaEvent start(device, /*timing=*/true), stop(device, /*timing=*/true);
  const int reps = reps_for(bytes);
  for (int i = 0; i < 2; ++i) op();
  start.record(stream);
  for (int i = 0; i < reps; ++i) op();
  stop.record(stream);
  comm.wait(stop.get(), WaitInfo{what, -1, bytes * static_cast<std::uint64_t>(reps), {}},
            std::chrono::duration<double>(kTimeout));
  float ms = 0;
  WD_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

int run(int rank, int world) {
  int mine = comm::visible_cuda_devices(), gpus = 0;
  WD_CHECK_MPI(MPI_Allreduce(&mine, &gpus, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (gpus == 0) {
    if (mine == 0) {
      try {
        comm::require_cuda_devices();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "nccl_bandwidth needs a GPU: %s\n", e.what());
      }
    }
    return 2;
  }
  const int device = rank % gpus;
  const bool pair = world == 2 && gpus >= 2;
  if (rank == 0 && world == 2 && !pair) {
    std::printf("note: 2 ranks but %d GPU(s): the rank 0 -> rank 1 column needs a GPU per rank\n",
                gpus);
  }
  const std::size_t max_bytes = std::size_t{1} << 30;
  CudaStream stream(device);
  DeviceBytes src(device, max_bytes), dst(device, max_bytes);
  NcclComm self(MPI_COMM_SELF, device, kTimeout, nullptr);
  std::optional<NcclComm> link;
  if (pair) link.emplace(MPI_COMM_WORLD, device, kTimeout, nullptr);
  const cudaStream_t s = stream.get();

  if (rank == 0) {
    cudaDeviceProp prop{};
    WD_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    int nccl_version = 0;
    WD_CHECK_NCCL(ncclGetVersion(&nccl_version));
    std::printf("device %d: %s; NCCL %d; %d rank(s); GB/s = 10^9 bytes/s, CUDA-event timed\n\n",
                device, prop.name, nccl_version, world);
    std::printf("| size | cudaMemcpy D2D | NCCL self send/recv | NCCL rank 0 -> 1 |\n");
    std::printf("|---:|---:|---:|---:|\n");
  }
  for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes <<= 2) {
    double copy = 0, to_self = 0, across = 0;
    if (rank == 0) {
      copy = gbps(self, device, s, bytes, "cudaMemcpy D2D", [&] {
        WD_CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, s));
      });
      to_self = gbps(self, device, s, bytes, "NCCL self send/recv", [&] {
        self.group_start();
        self.send(src.data, bytes, 0, s);
        self.recv(dst.data, bytes, 0, s);
        self.group_end();
      });
    }
    if (link) {
      WD_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
      across = gbps(*link, device, s, bytes, "NCCL send/recv 0 -> 1", [&] {
        if (rank == 0) link->send(src.data, bytes, 1, s);
        if (rank == 1) link->recv(dst.data, bytes, 0, s);
      });
      // The receiver's time is the transfer's: its events bracket the arrivals.
      WD_CHECK_MPI(MPI_Bcast(&across, 1, MPI_DOUBLE, 1, MPI_COMM_WORLD));
    }
    if (rank == 0) {
      char pair_text[32] = "-";
      if (link) std::snprintf(pair_text, sizeof pair_text, "%.1f", across);
      std::printf("| %zu MiB | %.1f | %.1f | %s |\n", bytes >> 20, copy, to_self, pair_text);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  try {
    wd::comm::MpiRuntime mpi(&argc, &argv);
    const int rc = wd::bench::run(mpi.rank(), mpi.size());
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_bandwidth: %s\n", e.what());
    return 1;
  }
}
