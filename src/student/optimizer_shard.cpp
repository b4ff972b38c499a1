// OptimizerShard: ZeRO-1 over the gradient reducer's flat buffer.
#include "student/optimizer_shard.hpp"

#include <algorithm>
#include <limits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"

namespace wd::student {

ShardMode parse_shard_mode(const std::string& text) {
  if (text == "none") return ShardMode::kNone;
  if (text == "optimizer") return ShardMode::kOptimizer;
  throw ConfigError("student.shard(" + text +
                    ") must be none or optimizer (ZeRO-1: AdamW moments of 1/N of the parameters per student "
                    "rank); gradients and parameters sharding are not built yet");
}

OptimizerShard::OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, torch::Tensor whole,
                               double timeout_s, int world_rank, comm::HealthChannel* health)
    : comm_(students),
      params_(std::move(params)),
      whole_(std::move(whole)),
      timeout_(timeout_s),
      world_rank_(world_rank),
      health_(health) {
  WD_CHECK(comm_ != MPI_COMM_NULL, "student.shard works in the student group; rank " << world_rank << " is not in it");
  WD_CHECK_MPI(MPI_Comm_size(comm_, &group_size_));
  WD_CHECK_MPI(MPI_Comm_rank(comm_, &group_rank_));
  WD_CHECK(whole_.defined() && whole_.dim() == 1 && whole_.scalar_type() == torch::kFloat,
           "student.shard needs the gradient reducer's flat fp32 buffer (a group of more than one student)");
  WD_CHECK(whole_.numel() % group_size_ == 0,
           "the gradient buffer (" << whole_.numel() << " elements) does not divide into " << group_size_ << " slices");
  peers_ = comm::world_ranks_of(comm_);
  peers_.erase(std::remove(peers_.begin(), peers_.end(), world_rank), peers_.end());
  slice_ = whole_.numel() / group_size_;
  begin_ = slice_ * group_rank_;
  const std::int64_t end = begin_ + slice_;
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    WD_CHECK(p.grad().defined() && p.grad().data_ptr() == whole_[offset].data_ptr(),
             "parameter " << i << "'s .grad is not its view of the gradient buffer: student.shard needs bound "
                                 "gradients (a parameter of another dtype, device or layout?)");
    offsets_.push_back(offset);
    const std::int64_t first = std::max(offset, begin_);
    const std::int64_t last = std::min(offset + p.numel(), end);
    if (first < last) {
      Segment s{i, first - offset, last - first, first};
      // A view of the parameter's storage (detached: the optimizer's in-place update is the
      // parameter's) whose grad is the matching view of the bound grad.
      auto view = p.detach().view({-1}).narrow(0, s.offset, s.length);
      view.set_requires_grad(true);
      view.mutable_grad() = p.grad().view({-1}).narrow(0, s.offset, s.length);
      segments_.push_back(s);
      views_.push_back(view);
    }
    offset += p.numel();
  }
  if (!whole_.is_cpu()) {
    host_ = torch::empty({whole_.numel()}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
  }
  WD_CHECK(slice_ <= std::numeric_limits<int>::max(),
           "a parameter slice of " << slice_ << " elements exceeds MPI's int count");
}

void OptimizerShard::gather(std::int64_t step) {
  torch::NoGradGuard no_grad;
  // The grads are spent: the buffer now carries the parameters, this rank's slice first.
  whole_.narrow(0, begin_, slice_).zero_();
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    whole_.narrow(0, segments_[k].global, segments_[k].length).copy_(views_[k]);
  }
  torch::Tensor& buffer = host_.defined() ? host_ : whole_;
  if (host_.defined()) host_.narrow(0, begin_, slice_).copy_(whole_.narrow(0, begin_, slice_));
  MPI_Request request;
  WD_CHECK_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data_ptr<float>(), static_cast<int>(slice_),
                              MPI_FLOAT, comm_, &request));
  std::vector<MPI_Request> requests{request};
  try {
    comm::run_fault_hook(fault_hook_, health_, "allgather parameters", step);
    comm::wait_all_with_deadline(requests,
                                 comm::WaitInfo{"allgather parameters", step,
                                                static_cast<std::uint64_t>(buffer.numel()) * sizeof(float), peers_},
                                 timeout_, world_rank_, health_);
  } catch (...) {
    comm::keep_until_exit(buffer);
    throw;
  }
  if (host_.defined()) whole_.copy_(host_);
  std::vector<torch::Tensor> to, from;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    to.push_back(params_[i].detach().view({-1}));
    from.push_back(whole_.narrow(0, offsets_[i], params_[i].numel()));
  }
  compat::copy_all(to, from);
  whole_.zero_();
}

TensorMap OptimizerShard::gather_moments(const torch::optim::AdamW& optimizer, const std::vector<std::string>& names,
                                         std::int64_t step) {
  // This rank's slice of each moment (zeros where it has no state yet) and its step count.
  const auto host = torch::TensorOptions().dtype(torch::kFloat);
  auto mine = torch::zeros({2, slice_}, host);
  std::int64_t steps = 0;
  for (std::size_t k = 0; k < views_.size(); ++k) {
    const auto it = optimizer.state().find(compat::optimizer_state_key(views_[k]));
    if (it == optimizer.state().end()) continue;
    const auto* state = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
    WD_CHECK(state != nullptr, "optimizer state of a slice of " << names[segments_[k].param] << " is not AdamW state");
    const auto at = segments_[k].global - begin_;
    mine[0].narrow(0, at, segments_[k].length).copy_(state->exp_avg());
    mine[1].narrow(0, at, segments_[k].length).copy_(state->exp_avg_sq());
    steps = std::max<std::int64_t>(steps, state->step());
  }
  auto packed = torch::cat({mine.view({-1}), torch::full({1}, static_cast<float>(steps), host)});
  auto all = torch::empty({group_size_, packed.numel()}, host);
  const int count = static_cast<int>(packed.numel());
  MPI_Request request;
  WD_CHECK_MPI(MPI_Igather(packed.data_ptr<float>(), count, MPI_FLOAT, all.data_ptr<float>(), count, MPI_FLOAT, 0,
                           comm_, &request));
  try {
    comm::wait_with_deadline(request,
                             {"gather optimizer slices", step, static_cast<std::uint64_t>(packed.nbytes()), peers_},
                             timeout_, world_rank_, health_);
  } catch (...) {
    comm::keep_until_exit(all);
    comm::keep_until_exit(packed);
    throw;
  }
  TensorMap out;
  if (group_rank_ != 0) return out;
  // Rank r's row: [exp_avg slice, exp_avg_sq slice, steps]; the slices in order are the flat layout.
  const auto rows = all.narrow(1, 0, 2 * slice_).view({group_size_, 2, slice_});
  const auto exp_avg = rows.select(1, 0).reshape({-1});
  const auto exp_avg_sq = rows.select(1, 1).reshape({-1});
  const auto max_steps = all.select(1, 2 * slice_).max().item<float>();
  if (max_steps <= 0) return out;  // no step yet: nothing to resume (as the unsharded optimizer)
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto n = params_[i].numel();
    out[names[i] + ".exp_avg"] = exp_avg.narrow(0, offsets_[i], n).view(params_[i].sizes()).clone();
    out[names[i] + ".exp_avg_sq"] = exp_avg_sq.narrow(0, offsets_[i], n).view(params_[i].sizes()).clone();
    out[names[i] + ".step"] = torch::full({1}, static_cast<std::int64_t>(max_steps), torch::kLong);
  }
  return out;
}

}  // namespace wd::student
