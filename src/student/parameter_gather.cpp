// ParameterGather: a block's parameters all-gathered from the ranks' slices for each use.
#include "student/parameter_gather.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "memory/host_memory.hpp"

namespace wd::student {

ParameterGather::ParameterGather(MPI_Comm comm, std::vector<torch::Tensor> params, Layout layout,
                                 const std::vector<std::vector<std::size_t>>& blocks, torch::Tensor owned,
                                 std::chrono::duration<double> timeout, int world_rank, std::vector<int> peers,
                                 comm::HealthChannel* health, std::shared_ptr<comm::ShardCollectives> collectives)
    : collectives_(collectives ? std::move(collectives) : comm::make_mpi_shard_collectives(comm, world_rank, health)),
      params_(std::move(params)),
      layout_(std::move(layout)),
      owned_(std::move(owned)),
      timeout_(timeout),
      world_rank_(world_rank),
      peers_(std::move(peers)),
      health_(health) {
  WD_CHECK(layout_.offsets.size() == params_.size(),
           "parameter gather: " << layout_.offsets.size() << " offsets for " << params_.size() << " parameters");
  WD_CHECK(owned_.is_cpu() && owned_.scalar_type() == torch::kFloat && owned_.numel() == layout_.slice_size,
           "parameter gather: the owned slice must be " << layout_.slice_size << " fp32 elements on the host");
  WD_CHECK(collectives_->buffer_device().is_cpu(),
           "student.shard parameters gathers on the host; its collectives work on " << collectives_->buffer_device());
  std::vector<char> in_block(params_.size(), 0);
  for (const auto& p : params_) {
    WD_CHECK(p.is_cpu() && p.scalar_type() == torch::kFloat && p.is_contiguous(),
             "student.shard parameters needs contiguous fp32 parameters on the host; got " << p.scalar_type()
                                                                                          << " on " << p.device());
    shapes_.push_back(p.sizes().vec());
  }
  for (const auto& block : blocks) {
    for (const auto i : block) {
      WD_CHECK(i < params_.size() && !in_block[i], "parameter gather: block parameter " << i << " out of range or "
                                                                                            "in two blocks");
      in_block[i] = 1;
    }
    blocks_.push_back(make_unit(block));
  }
  std::vector<std::size_t> root;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!in_block[i]) root.push_back(i);
  }
  root_ = make_unit(std::move(root));
}

ParameterGather::~ParameterGather() = default;

ParameterGather::Unit ParameterGather::make_unit(std::vector<std::size_t> params) const {
  std::sort(params.begin(), params.end(),
            [&](std::size_t a, std::size_t b) { return layout_.offsets[a] < layout_.offsets[b]; });
  Unit u;
  u.params = std::move(params);
  std::vector<std::int64_t> counts(layout_.group_size, 0);
  const auto S = layout_.slice_size;
  for (const auto i : u.params) {
    const std::int64_t lo = layout_.offsets[i];
    const std::int64_t hi = lo + params_[i].numel();
    u.total += hi - lo;
    layout_.count_in_slices(lo, hi, counts);
    // The part in this rank's slice; consecutive parameters make one piece (a block inside the
    // slice is sent without a copy).
    const auto a = std::max(lo, layout_.slice_begin), b = std::min(hi, layout_.slice_begin + S);
    if (b <= a) continue;
    if (!u.mine.empty() && u.mine.back().first + u.mine.back().second == a - layout_.slice_begin) {
      u.mine.back().second += b - a;
    } else {
      u.mine.emplace_back(a - layout_.slice_begin, b - a);
    }
  }
  WD_CHECK(u.total <= std::numeric_limits<int>::max(),
           "a unit of " << u.total << " parameters exceeds MPI's int count");
  std::int64_t at = 0;
  for (const auto c : counts) {
    u.counts.push_back(static_cast<int>(c));
    u.displs.push_back(static_cast<int>(at));
    at += c;
  }
  return u;
}

torch::Tensor ParameterGather::gather(const Unit& unit, const char* op) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> pieces;
  for (const auto& [at, n] : unit.mine) pieces.push_back(owned_.narrow(0, at, n));
  // One contiguous piece is sent from the slice itself; several (a root around the blocks) packed.
  auto send = pieces.size() == 1 ? pieces.front() : pieces.empty() ? torch::empty({0}) : torch::cat(pieces);
  auto recv = torch::empty({unit.total}, torch::kFloat);
  const auto pending = collectives_->all_gather(send, recv, unit.counts, unit.displs);
  try {
    collectives_->wait_all({pending.get()},
                           {op, step_, static_cast<std::uint64_t>(unit.total) * sizeof(float), peers_}, timeout_);
  } catch (...) {
    comm::keep_until_exit(send);
    comm::keep_until_exit(recv);
    throw;
  }
  ++gathers_;
  return recv;
}

void ParameterGather::hold(Unit& unit) {
  if (unit.held) return;
  const auto whole = gather(unit, "allgather block parameters");
  std::int64_t at = 0;
  for (const auto i : unit.params) {
    const auto n = c10::multiply_integers(shapes_[i]);
    // A view of the one gathered buffer: the block's tensors go when the last of them lets go.
    params_[i].set_data(whole.narrow(0, at, n).view(shapes_[i]));
    at += n;
  }
  unit.held = true;
}

void ParameterGather::release(Unit& unit) {
  if (!unit.held) return;
  for (const auto i : unit.params) params_[i].set_data(torch::empty({0}, torch::kFloat));
  unit.held = false;
}

void ParameterGather::enter(std::int64_t block) {
  WD_CHECK(block >= 0 && block < static_cast<std::int64_t>(blocks_.size()),
           "parameter gather: block " << block << " of " << blocks_.size());
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    if (static_cast<std::int64_t>(b) != block) release(blocks_[b]);
  }
  hold(blocks_[block]);
}

void ParameterGather::leave(std::int64_t block) { release(blocks_.at(block)); }

void ParameterGather::rest() {
  for (auto& unit : blocks_) release(unit);
}

void ParameterGather::gather_all() {
  for (auto& unit : blocks_) hold(unit);
}

void ParameterGather::gather_root() {
  const auto whole = gather(root_, "allgather root parameters");
  torch::NoGradGuard no_grad;
  std::int64_t at = 0;
  for (const auto i : root_.params) {
    const auto n = params_[i].numel();
    params_[i].view({-1}).copy_(whole.narrow(0, at, n));  // the root keeps its own tensors
    at += n;
  }
}

void ParameterGather::adopt() {
  torch::NoGradGuard no_grad;
  const auto begin = layout_.slice_begin, end = begin + layout_.slice_size;
  owned_.zero_();  // the padding after the last parameter stays zero
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto lo = layout_.offsets[i], hi = lo + c10::multiply_integers(shapes_[i]);
    const auto a = std::max(lo, begin), b = std::min(hi, end);
    if (a >= b) continue;
    WD_CHECK(params_[i].numel() == hi - lo, "parameter gather: parameter " << i << " is not whole to adopt");
    owned_.narrow(0, a - begin, b - a).copy_(params_[i].detach().view({-1}).narrow(0, a - lo, b - a));
  }
  rest_and_trim();
}

void ParameterGather::rest_and_trim() {
  rest();
  // Every block whole was the largest thing this rank held: back to the kernel, not kept for reuse
  // (memory::keep_freed_host_memory keeps freed heap mapped otherwise).
  memory::release_free_host_memory();
}

std::uint64_t ParameterGather::resting_bytes() const {
  return static_cast<std::uint64_t>(owned_.nbytes() + root_.total * static_cast<std::int64_t>(sizeof(float)));
}

}  // namespace wd::student
