// OptimizerShard: ZeRO-1 over the gradient reducer's flat buffer.
#include "student/optimizer_shard.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"

namespace wd::student {

OptimizerShard::OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, torch::Tensor whole,
                               double timeout_s, int world_rank, comm::HealthChannel* health,
                               std::shared_ptr<comm::ShardCollectives> collectives)
    : comm_(students),
      collectives_(std::move(collectives)),
      params_(std::move(params)),
      whole_(std::move(whole)),
      timeout_(timeout_s),
      world_rank_(world_rank),
      health_(health) {
  join_group();
  WD_CHECK(whole_.defined() && whole_.dim() == 1 && whole_.scalar_type() == torch::kFloat,
           "student.shard needs the gradient reducer's flat fp32 buffer (a group of more than one student)");
  WD_CHECK(whole_.numel() % group_size_ == 0,
           "the gradient buffer (" << whole_.numel() << " elements) does not divide into " << group_size_ << " slices");
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    WD_CHECK(params_[i].grad().defined() && params_[i].grad().data_ptr() == whole_[offset].data_ptr(),
             "parameter " << i << "'s .grad is not its view of the gradient buffer: student.shard needs bound "
                                 "gradients (a parameter of another dtype, device or layout?)");
    offset += params_[i].numel();
  }
  lay_out(whole_.numel());
  if (!whole_.is_cpu() && collectives_->buffer_device().is_cpu()) {
    host_ = torch::empty({whole_.numel()}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
  }
}

OptimizerShard::OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, std::uint64_t bucket_bytes,
                               double timeout_s, int world_rank, comm::HealthChannel* health,
                               std::vector<torch::Tensor> sources, std::shared_ptr<comm::ShardCollectives> collectives)
    : comm_(students),
      collectives_(std::move(collectives)),
      params_(std::move(params)),
      timeout_(timeout_s),
      world_rank_(world_rank),
      health_(health) {
  scatter_gradients(bucket_bytes, std::move(sources), nullptr);
}

OptimizerShard::OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, std::uint64_t bucket_bytes,
                               double timeout_s, int world_rank, comm::HealthChannel* health,
                               const std::vector<std::vector<std::size_t>>& blocks)
    : comm_(students), params_(std::move(params)), timeout_(timeout_s), world_rank_(world_rank), health_(health) {
  scatter_gradients(bucket_bytes, {}, &blocks);
}

void OptimizerShard::scatter_gradients(std::uint64_t bucket_bytes, std::vector<torch::Tensor> sources,
                                       const std::vector<std::vector<std::size_t>>* blocks) {
  join_group();
  const char* mode = blocks ? "parameters" : "gradients";
  WD_CHECK(!params_.empty(), "student.shard " << mode << " needs trainable parameters");
  std::int64_t total = 0;
  for (const auto& p : params_) {
    // parameters: the gathers run from the backward, on the thread MPI was initialised on.
    WD_CHECK(p.scalar_type() == torch::kFloat && p.is_contiguous() && p.device() == params_.front().device() &&
                 (!blocks || p.is_cpu()),
             "student.shard " << mode << " needs contiguous fp32 trainable tensors on one device"
                              << (blocks ? " (the host)" : "") << "; got " << p.scalar_type() << " on "
                              << p.device());
    total += p.numel();
  }
  const std::int64_t padded = (total + group_size_ - 1) / group_size_ * group_size_;
  grad_slice_ = torch::zeros({padded / group_size_}, params_.front().options().requires_grad(false));
  if (blocks) owned_ = torch::zeros({padded / group_size_}, torch::kFloat);
  lay_out(padded);
  if (!params_.front().is_cpu() && collectives_->buffer_device().is_cpu()) {
    host_ = torch::empty({padded}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
  }
  // parameters: the hooks go on while every parameter is whole, so their accumulators keep the
  // full shapes; the gate lets go of the blocks after.
  const SliceLayout layout{offsets_, begin_, slice_, group_size_, group_rank_};
  scatter_ = std::make_unique<GradientScatter>(comm_, params_, layout, bucket_bytes, grad_slice_, timeout_, world_rank_,
                                               peers_, health_, std::move(sources), collectives_);
  if (!blocks) return;
  gate_ = std::make_unique<ParameterGather>(comm_, params_, layout, *blocks, owned_, timeout_, world_rank_, peers_,
                                            health_, collectives_);
  gate_->adopt();
}

void OptimizerShard::join_group() {
  WD_CHECK(comm_ != MPI_COMM_NULL, "student.shard works in the student group; rank " << world_rank_ << " is not in it");
  WD_CHECK_MPI(MPI_Comm_size(comm_, &group_size_));
  WD_CHECK_MPI(MPI_Comm_rank(comm_, &group_rank_));
  if (!collectives_) collectives_ = comm::make_mpi_shard_collectives(comm_, world_rank_, health_);
  peers_ = comm::world_ranks_of(comm_);
  peers_.erase(std::remove(peers_.begin(), peers_.end(), world_rank_), peers_.end());
}

void OptimizerShard::lay_out(std::int64_t padded) {
  slice_ = padded / group_size_;
  begin_ = slice_ * group_rank_;
  padded_ = padded;
  const std::int64_t end = begin_ + slice_;
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    offsets_.push_back(offset);
    const std::int64_t first = std::max(offset, begin_);
    const std::int64_t last = std::min(offset + p.numel(), end);
    if (first < last) {
      Segment s{i, first - offset, last - first, first};
      // A view of the parameter's storage (detached: the optimizer's in-place update is the
      // parameter's) whose grad is the matching view of the bound grad (optimizer) or of this
      // rank's gradient slice (gradients).
      // parameters: a view of this rank's owned slice, which the gate gathers from.
      auto view = owned_.defined() ? owned_.narrow(0, first - begin_, s.length)
                                   : p.detach().view({-1}).narrow(0, s.offset, s.length);
      view.set_requires_grad(true);
      view.mutable_grad() = grad_slice_.defined() ? grad_slice_.narrow(0, first - begin_, s.length)
                                                  : p.grad().view({-1}).narrow(0, s.offset, s.length);
      segments_.push_back(s);
      views_.push_back(view);
    }
    offset += p.numel();
  }
  total_ = offset;
  WD_CHECK(slice_ <= std::numeric_limits<int>::max(),
           "a parameter slice of " << slice_ << " elements exceeds MPI's int count");
}

OptimizerShard::~OptimizerShard() = default;

void OptimizerShard::begin_step() {
  if (scatter_) scatter_->begin_step();
}

std::uint64_t OptimizerShard::weight_bytes() const {
  if (gate_) return gate_->resting_bytes();
  std::uint64_t bytes = 0;
  for (const auto& p : params_) bytes += static_cast<std::uint64_t>(p.nbytes());
  return bytes;
}

void OptimizerShard::reduce(std::int64_t step, const std::function<void()>& posted) {
  WD_CHECK(scatter_, "OptimizerShard::reduce is student.shard gradients' (the optimizer mode's reducer all-reduces)");
  scatter_->reduce(step, posted);
}

torch::Tensor OptimizerShard::clip_grad_norm(double max_norm, std::int64_t step) {
  torch::NoGradGuard no_grad;
  // The global norm: this rank's sum of squares (its slice; padding is zero), summed over the group.
  auto squares = grad_slice_.to(torch::kDouble).pow(2).sum().reshape({1}).cpu();
  MPI_Request request;
  WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, squares.data_ptr<double>(), 1, MPI_DOUBLE, MPI_SUM, comm_, &request));
  try {
    comm::wait_with_deadline(request, {"allreduce grad norm", step, sizeof(double), peers_}, timeout_, world_rank_,
                             health_);
  } catch (...) {
    comm::keep_until_exit(squares);
    throw;
  }
  const double total = std::sqrt(squares.item<double>());
  // LibTorch's clip_grad_norm_ factor: max_norm / (total + 1e-6), at most 1.
  const double factor = std::min(1.0, max_norm / (total + 1e-6));
  if (factor < 1.0) grad_slice_.mul_(factor);
  return torch::full({}, total, torch::kDouble);
}

std::uint64_t OptimizerShard::gradient_bytes() const {
  return grad_slice_.defined() ? static_cast<std::uint64_t>(grad_slice_.nbytes()) : 0;
}

void OptimizerShard::gather(std::int64_t step) {
  torch::NoGradGuard no_grad;
  if (gate_) {
    // parameters: the blocks are gathered from the updated slices at their next use.
    comm::run_fault_hook(fault_hook_, health_, "allgather root parameters", step);
    gate_->set_step(step);
    gate_->gather_root();
    gate_->set_step(step + 1);  // what the next step's gathers name
    return;
  }
  // The flat layout to gather in: the reducer's buffer (optimizer: the grads are spent), its
  // pinned host twin for device parameters over MPI, or a buffer of this step (gradients) where
  // the collectives work.
  torch::Tensor flat = host_.defined()    ? host_
                       : whole_.defined() ? whole_
                                          : torch::empty({padded_}, torch::TensorOptions()
                                                                        .dtype(torch::kFloat)
                                                                        .device(collectives_->buffer_device()));
  flat.narrow(0, begin_, slice_).zero_();
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    flat.narrow(0, segments_[k].global, segments_[k].length).copy_(views_[k]);
  }
  const std::vector<int> counts(static_cast<std::size_t>(group_size_), static_cast<int>(slice_));
  std::vector<int> displs;
  for (int r = 0; r < group_size_; ++r) displs.push_back(r * static_cast<int>(slice_));
  const auto pending = collectives_->all_gather(flat.narrow(0, begin_, slice_), flat, counts, displs);
  try {
    comm::run_fault_hook(fault_hook_, health_, "allgather parameters", step);
    collectives_->wait_all({pending.get()},
                           comm::WaitInfo{"allgather parameters", step,
                                          static_cast<std::uint64_t>(flat.numel()) * sizeof(float), peers_},
                           timeout_);
  } catch (...) {
    comm::keep_until_exit(flat);
    throw;
  }
  if (whole_.defined() && host_.defined()) whole_.copy_(host_);
  const auto& source = whole_.defined() ? whole_ : flat;
  std::vector<torch::Tensor> to, from;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    to.push_back(params_[i].detach().view({-1}));
    from.push_back(source.narrow(0, offsets_[i], params_[i].numel()));
  }
  if (source.device() == params_.front().device()) {
    compat::copy_all(to, from);
  } else {
    for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);  // host twin → device, no device-size buffer
  }
  if (whole_.defined()) whole_.zero_();
}

MomentSlice OptimizerShard::moment_slice(const torch::optim::AdamW& optimizer, std::int64_t step) const {
  // This rank's slice of each moment (zeros where it has no state yet, and in the padding).
  MomentSlice out{group_rank_, group_size_, begin_, slice_, padded_, 0, torch::zeros({slice_}, torch::kFloat),
                  torch::zeros({slice_}, torch::kFloat)};
  auto steps = torch::zeros({1}, torch::kLong);
  for (std::size_t k = 0; k < views_.size(); ++k) {
    const auto it = optimizer.state().find(compat::optimizer_state_key(views_[k]));
    if (it == optimizer.state().end()) continue;
    const auto* state = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
    WD_CHECK(state != nullptr, "optimizer state of slice " << k << " of rank " << world_rank_ << " is not AdamW state");
    const auto at = segments_[k].global - begin_;
    out.exp_avg.narrow(0, at, segments_[k].length).copy_(state->exp_avg());
    out.exp_avg_sq.narrow(0, at, segments_[k].length).copy_(state->exp_avg_sq());
    steps[0] = std::max<std::int64_t>(steps[0].item<std::int64_t>(), state->step());
  }
  // A rank whose views have no state yet (none stepped) still writes the group's count.
  MPI_Request request;
  WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, steps.data_ptr<std::int64_t>(), 1, MPI_INT64_T, MPI_MAX, comm_, &request));
  try {
    comm::wait_with_deadline(request, {"agree optimizer steps", step, sizeof(std::int64_t), peers_}, timeout_,
                             world_rank_, health_);
  } catch (...) {
    comm::keep_until_exit(steps);
    throw;
  }
  out.steps = steps[0].item<std::int64_t>();
  return out;
}

std::uint64_t kept_weight_bytes(const std::vector<torch::Tensor>& params, const OptimizerShard* shard) {
  return shard ? shard->weight_bytes() : memory::tensor_bytes(params);
}

memory::ModelMemory model_memory(const std::vector<torch::Tensor>& params, const OptimizerShard* shard,
                                 const torch::optim::Optimizer& optimizer) {
  return {kept_weight_bytes(params, shard), memory::grad_bytes(params) + (shard ? shard->gradient_bytes() : 0),
          memory::optimizer_state_bytes(optimizer)};
}

}  // namespace wd::student
