// The MPI backend of ZeRO's collectives, and the choice between it and NCCL.
#include "comm/shard_collectives.hpp"

#include <spdlog/spdlog.h>

#include "comm/backend_choice.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {

class MpiPending final : public ShardCollectives::Pending {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  bool done() override {
    if (request == MPI_REQUEST_NULL) return true;
    int flag = 0;
    WD_CHECK_MPI(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }
};

/// Host buffers only (MPI reads host memory; a GPU student's shard stages through pinned host
/// memory above this).
void check_host_floats(const torch::Tensor& t, const char* what) {
  WD_CHECK(t.is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous(),
           "the MPI " << what << " takes contiguous fp32 host buffers; got " << t.scalar_type() << " on "
                      << t.device());
}

class MpiShardCollectives final : public ShardCollectives {
 public:
  MpiShardCollectives(MPI_Comm students, int world_rank, HealthChannel* health)
      : comm_(students), world_rank_(world_rank), health_(health) {
    WD_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  }

  c10::Device buffer_device() const override { return c10::Device(torch::kCPU); }
  bool posts_from_any_thread() const override { return false; }

  std::unique_ptr<Pending> reduce_scatter(const torch::Tensor& send, const torch::Tensor& recv,
                                          const std::vector<int>& counts) override {
    check_host_floats(send, "reduce-scatter");
    check_host_floats(recv, "reduce-scatter");
    auto pending = std::make_unique<MpiPending>();
    WD_CHECK_MPI(MPI_Ireduce_scatter(send.data_ptr<float>(), recv.data_ptr<float>(), counts.data(), MPI_FLOAT,
                                     MPI_SUM, comm_, &pending->request));
    return pending;
  }

  std::unique_ptr<Pending> all_gather(const torch::Tensor& send, const torch::Tensor& recv,
                                      const std::vector<int>& counts, const std::vector<int>& displs) override {
    check_host_floats(recv, "all-gather");
    const auto r = static_cast<std::size_t>(rank_);
    // This rank's part already in place in `recv`: MPI_IN_PLACE (MPI forbids aliased buffers).
    const bool in_place = send.numel() == counts[r] && send.data_ptr() == recv.data_ptr<float>() + displs[r];
    if (!in_place) check_host_floats(send, "all-gather");
    auto pending = std::make_unique<MpiPending>();
    WD_CHECK_MPI(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send.data_ptr(), in_place ? 0 : counts[r],
                                 in_place ? MPI_DATATYPE_NULL : MPI_FLOAT, recv.data_ptr<float>(), counts.data(),
                                 displs.data(), MPI_FLOAT, comm_, &pending->request));
    return pending;
  }

  void wait_all(const std::vector<Pending*>& pending, const WaitInfo& info,
                std::chrono::duration<double> timeout) override {
    std::vector<MPI_Request> requests;
    for (auto* p : pending) requests.push_back(static_cast<MpiPending*>(p)->request);
    wait_all_with_deadline(requests, info, timeout, world_rank_, health_);
    for (auto* p : pending) static_cast<MpiPending*>(p)->request = MPI_REQUEST_NULL;
  }

  const char* backend() const override { return "mpi"; }

 private:
  MPI_Comm comm_;
  int rank_ = 0;  ///< this rank's place in `comm_`
  int world_rank_;
  HealthChannel* health_;
};

}  // namespace

std::shared_ptr<ShardCollectives> make_mpi_shard_collectives(MPI_Comm students, int world_rank,
                                                             HealthChannel* health) {
  return std::make_shared<MpiShardCollectives>(students, world_rank, health);
}

std::shared_ptr<ShardCollectives> make_shard_collectives(MPI_Comm students, const c10::Device& device,
                                                         CommBackend backend, double timeout_s, int world_rank,
                                                         HealthChannel* health) {
  const auto ends = gather_devices(students, world_rank, device, timeout_s, "student.shard's collectives", health);
  const auto choice =
      choose_backend(backend, ends, nccl_built(), "student.shard's reduce-scatter and all-gather");
  if (ends.front().world_rank == world_rank) {
    spdlog::info("student.shard's reduce-scatter and all-gather: {} over {} student(s) ({})",
                 backend_name(choice.backend), ends.size(), choice.reason);
  }
  if (choice.backend == Backend::kNccl) {
    return make_nccl_shard_collectives(students, device, timeout_s, world_rank, health);
  }
  return make_mpi_shard_collectives(students, world_rank, health);
}

}  // namespace wd::comm
