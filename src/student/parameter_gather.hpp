// ParameterGather (`student.shard parameters`, ZeRO-3): between uses a student rank holds only its
// 1/N slice of the DiT blocks' parameters; a block's are all-gathered just before the block runs
// (its forward, and its recomputation in the backward) and let go after.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/health_channel.hpp"
#include "comm/shard_collectives.hpp"
#include "student/checkpointing.hpp"
#include "student/slice_layout.hpp"

namespace wd::student {

/// The parameters in flat-layout order, padded to N slices, group rank r owning elements
/// [r·S, (r+1)·S) (OptimizerShard's layout). `owned` holds this rank's slice: the master weights
/// the optimizer steps. Each DiT block is a unit; every other parameter (embeddings, head, the
/// distillation heads) is the root unit, held whole always and refreshed after each step.
/// Gathering a unit is one all-gather (MPI_Iallgatherv through comm::ShardCollectives): rank r
/// sends the unit's elements inside its slice,
/// and because slices are consecutive ranges the received parts, in rank order, are the unit's
/// elements in flat order; each parameter then becomes a view of that one buffer, and letting go
/// points it at an empty tensor (the module keeps its parameter objects, the autograd graph its
/// accumulators). Waits have the deadline and poll `health`. MPI is funneled: every call is from
/// the thread that drives the backward, so host students only.
class ParameterGather final : public BlockGate {
 public:
  using Layout = SliceLayout;

  /// `params` whole (as built), `blocks[i]` the indices of block i's parameters. Not collective.
  ParameterGather(MPI_Comm comm, std::vector<torch::Tensor> params, Layout layout,
                  const std::vector<std::vector<std::size_t>>& blocks, torch::Tensor owned,
                  std::chrono::duration<double> timeout, int world_rank, std::vector<int> peers,
                  comm::HealthChannel* health, std::shared_ptr<comm::ShardCollectives> collectives = nullptr);
  ~ParameterGather() override;
  ParameterGather(const ParameterGather&) = delete;
  ParameterGather& operator=(const ParameterGather&) = delete;

  /// Lets go of every other block, gathers block `block` unless held. Collective.
  void enter(std::int64_t block) override;
  void leave(std::int64_t block) override;
  void rest() override;
  /// The step the waits name (begin of each step).
  void set_step(std::int64_t step) { step_ = step; }
  /// rest(), then the freed heap back to the kernel: after every block was whole.
  void rest_and_trim();
  /// Every block whole (a checkpoint's write, a resume's read), until rest(). Collective.
  void gather_all();
  /// After the optimizer stepped `owned`: the root parameters from every rank's slice. Collective.
  void gather_root();
  /// `owned` from the whole parameters (as built, or as a resume loaded them), then every block
  /// let go. Not collective.
  void adopt();
  /// Bytes this rank holds between uses: its slice and the root parameters.
  std::uint64_t resting_bytes() const;
  /// Parameters outside the blocks (held whole), and the number of blocks.
  std::int64_t root_parameters() const { return root_.total; }
  std::size_t block_count() const { return blocks_.size(); }
  /// Unit gathers so far (tests: a step of k blocks gathers each twice, forward and backward).
  std::int64_t gathers() const { return gathers_; }

 private:
  struct Unit {
    std::vector<std::size_t> params;  ///< in flat order
    std::vector<int> counts, displs;  ///< elements from each group rank, where they land
    std::vector<std::pair<std::int64_t, std::int64_t>> mine;  ///< (offset in owned, elements)
    std::int64_t total = 0;
    bool held = true;  ///< whole at start-up
  };
  Unit make_unit(std::vector<std::size_t> params) const;
  /// The unit's elements, all-gathered into one buffer in flat order.
  torch::Tensor gather(const Unit& unit, const char* op);
  void hold(Unit& unit);
  void release(Unit& unit);

  std::shared_ptr<comm::ShardCollectives> collectives_;  ///< host buffers (MPI)
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<std::int64_t>> shapes_;
  Layout layout_;
  std::vector<Unit> blocks_;
  Unit root_;
  torch::Tensor owned_;
  std::int64_t step_ = 0, gathers_ = 0;
  std::chrono::duration<double> timeout_;
  int world_rank_;
  std::vector<int> peers_;
  comm::HealthChannel* health_;
};

}  // namespace wd::student
