// GradientScatter: ZeRO-2's bucketed reduce-scatter, started from the backward's gradient hooks.
#include "student/gradient_scatter.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "comm/grad_buckets.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "student/mixed_grads.hpp"

namespace wd::student {

namespace {
using Clock = std::chrono::steady_clock;
const auto kHostFloat = torch::TensorOptions().dtype(torch::kFloat);
}  // namespace

GradientScatter::GradientScatter(MPI_Comm students, std::vector<torch::Tensor> params, Layout layout,
                                 std::uint64_t bucket_bytes, torch::Tensor slice, std::chrono::duration<double> timeout,
                                 int world_rank, std::vector<int> peers, comm::HealthChannel* health,
                                 std::vector<torch::Tensor> sources, std::shared_ptr<comm::ShardCollectives> collectives)
    : comm_(students),
      collectives_(collectives ? std::move(collectives) : comm::make_mpi_shard_collectives(students, world_rank, health)),
      params_(std::move(params)),
      sources_(sources.empty() ? params_ : std::move(sources)),
      layout_(std::move(layout)),
      slice_(std::move(slice)),
      main_thread_(std::this_thread::get_id()),
      timeout_(timeout),
      world_rank_(world_rank),
      peers_(std::move(peers)),
      health_(health) {
  WD_CHECK(sources_.size() == params_.size(),
           "gradient scatter: " << sources_.size() << " gradient sources for " << params_.size() << " parameters");
  WD_CHECK(layout_.offsets.size() == params_.size(), "gradient scatter: " << layout_.offsets.size()
                                                                          << " offsets for " << params_.size()
                                                                          << " parameters");
  // Sizes as at start-up: student.shard parameters lets go of a block's tensors between uses.
  for (const auto& p : params_) numels_.push_back(p.numel());
  // Buckets as the all-reduce makes them (comm::bucket_groups), each a range of the flat layout.
  for (auto& group : comm::bucket_groups(params_, bucket_bytes)) {
    Bucket bucket;
    bucket.params = std::move(group);
    bucket.begin = layout_.offsets[bucket.params.front()];
    const auto last = bucket.params.back();
    bucket.end = layout_.offsets[last] + params_[last].numel();
    buckets_.push_back(std::move(bucket));
  }
  bucket_of_.resize(params_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    WD_CHECK(bucket.end - bucket.begin <= std::numeric_limits<int>::max(),
             "a gradient bucket of " << bucket.end - bucket.begin << " elements exceeds MPI's int count");
    // Rank r receives the bucket's elements inside its slice [r·S, (r+1)·S), this rank at `at`.
    std::vector<std::int64_t> counts(layout_.group_size, 0);
    layout_.count_in_slices(bucket.begin, bucket.end, counts);
    bucket.counts.assign(counts.begin(), counts.end());
    bucket.at = std::max<std::int64_t>(0, bucket.begin - layout_.slice_begin);
    bucket.seen.assign(bucket.params.size(), 0);
    for (const auto i : bucket.params) bucket_of_[i] = b;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) hooks_.emplace_back(sources_[i], [this, i] { on_ready(i); });
}

GradientScatter::~GradientScatter() {
  for (const auto& f : flight_) {
    comm::keep_until_exit(f.send);
    comm::keep_until_exit(f.recv);
  }
}

void GradientScatter::begin_step() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  for (auto& p : sources_) p.mutable_grad() = torch::Tensor();
  slice_.zero_();
  for (auto& bucket : buckets_) {
    std::fill(bucket.seen.begin(), bucket.seen.end(), 0);
    bucket.seen_count = 0;
    bucket.sends = 0;
  }
  sent_in_backward_ = sent_after_backward_ = 0;
  armed_ = true;
}

void GradientScatter::fold(std::size_t param) {
  if (sources_[param].unsafeGetTensorImpl() == params_[param].unsafeGetTensorImpl()) return;
  fold_compute_grad(params_[param], sources_[param]);
}

void GradientScatter::on_ready(std::size_t param) {
  if (!armed_) return;  // another objective's backward (a dmd critic inside the generator's loss)
  Bucket& bucket = buckets_[bucket_of_[param]];
  const auto k = static_cast<std::size_t>(std::find(bucket.params.begin(), bucket.params.end(), param) -
                                          bucket.params.begin());
  if (!bucket.seen[k]) {
    bucket.seen[k] = 1;
    ++bucket.seen_count;
  }
  if (bucket.seen_count < bucket.params.size()) return;
  // Every parameter of the bucket has its gradient: send it now, free the grads.
  std::fill(bucket.seen.begin(), bucket.seen.end(), 0);
  bucket.seen_count = 0;
  ++sent_in_backward_;
  auto packed = pack(bucket);
  if (std::this_thread::get_id() == main_thread_) {
    post(bucket_of_[param], std::move(packed));
    progress();
  } else if (collectives_->posts_from_any_thread()) {
    post(bucket_of_[param], std::move(packed));  // NCCL: started from the engine's thread and stream
  } else {
    staged_.emplace_back(bucket_of_[param], std::move(packed));
  }
}

torch::Tensor GradientScatter::pack(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  auto send = torch::empty({bucket.end - bucket.begin}, kHostFloat.device(collectives_->buffer_device()));
  for (const auto i : bucket.params) {
    // bf16-mixed: folded as StudentParts::backward folds, once per send (the uses of one backward
    // summed in bf16 first, as without sharding).
    fold(i);
    auto part = send.narrow(0, layout_.offsets[i] - bucket.begin, numels_[i]);
    torch::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined()) {
      part.copy_(grad.reshape({-1}));
    } else {
      part.zero_();
    }
    grad = torch::Tensor();
  }
  ++bucket.sends;
  return send;
}

void GradientScatter::post(std::size_t b, torch::Tensor send) {
  Bucket& bucket = buckets_[b];
  InFlight f;
  f.send = std::move(send);
  f.recv = torch::empty({std::max(1, bucket.counts[layout_.group_rank])},
                        kHostFloat.device(collectives_->buffer_device()))
               .narrow(0, 0, bucket.counts[layout_.group_rank]);
  f.at = bucket.at;
  f.pending = collectives_->reduce_scatter(f.send, f.recv, bucket.counts);
  flight_.push_back(std::move(f));
}

void GradientScatter::collect(InFlight& f) {
  torch::NoGradGuard no_grad;
  if (f.recv.numel() > 0) slice_.narrow(0, f.at, f.recv.numel()).add_(f.recv.to(slice_.device()));
  f.send = f.recv = torch::Tensor();
}

void GradientScatter::progress() {
  std::vector<InFlight> left;
  for (auto& f : flight_) {
    if (f.pending->done()) {
      collect(f);
    } else {
      left.push_back(std::move(f));
    }
  }
  flight_ = std::move(left);
}

std::vector<int> GradientScatter::agree(std::int64_t step) {
  // Per bucket: does this rank hold gradients not yet sent, and how many sends did it make.
  // MAX over the group of [pending, sends, −sends] says which buckets everyone sends once more
  // and whether the ranks' backwards sent alike.
  const auto n = static_cast<std::int64_t>(buckets_.size());
  auto flags = torch::zeros({3 * n}, torch::kInt);
  auto* f = flags.data_ptr<int>();
  for (std::int64_t b = 0; b < n; ++b) {
    const auto& bucket = buckets_[static_cast<std::size_t>(b)];
    for (const auto i : bucket.params) f[b] |= params_[i].grad().defined() || sources_[i].grad().defined() ? 1 : 0;
    f[n + b] = bucket.sends;
    f[2 * n + b] = -bucket.sends;
  }
  MPI_Request request;
  WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, f, static_cast<int>(3 * n), MPI_INT, MPI_MAX, comm_, &request));
  try {
    comm::wait_with_deadline(request,
                             {"reduce-scatter grads: agree", step, static_cast<std::uint64_t>(flags.nbytes()), peers_},
                             timeout_, world_rank_, health_);
  } catch (...) {
    comm::keep_until_exit(flags);
    throw;
  }
  std::vector<int> pending(f, f + n);
  for (std::int64_t b = 0; b < n; ++b) {
    WD_CHECK(f[n + b] == -f[2 * n + b],
             "student.shard gradients: the students' backwards sent bucket "
                 << b << " between " << -f[2 * n + b] << " and " << f[n + b] << " times in step " << step + 1
                 << " (rank " << world_rank_ << " sent it " << buckets_[static_cast<std::size_t>(b)].sends
                 << "); every student must run the same backward");
  }
  return pending;
}

void GradientScatter::reduce(std::int64_t step, const std::function<void()>& posted) {
  armed_ = false;
  for (auto& [b, packed] : staged_) post(b, std::move(packed));
  staged_.clear();
  const auto pending = agree(step);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (!pending[b]) continue;
    ++sent_after_backward_;
    post(b, pack(buckets_[b]));
  }
  std::uint64_t bytes = 0;
  std::vector<comm::ShardCollectives::Pending*> in_flight;
  for (const auto& f : flight_) {
    in_flight.push_back(f.pending.get());
    bytes += static_cast<std::uint64_t>(f.send.nbytes());
  }
  const auto start = Clock::now();
  try {
    if (posted) posted();
    collectives_->wait_all(in_flight, comm::WaitInfo{"reduce-scatter grads", step, bytes, peers_}, timeout_);
  } catch (...) {
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
    // Abandoned, not finished: MPI may still read and write these buffers.
    for (const auto& f : flight_) {
      comm::keep_until_exit(f.send);
      comm::keep_until_exit(f.recv);
    }
    throw;
  }
  wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& f : flight_) collect(f);
  flight_.clear();
  if (step == 0 && layout_.group_rank == 0) {
    spdlog::info("gradient reduce-scatter of step 1: {} bucket send(s) from the backward's hooks, {} after it "
                 "({} buckets)",
                 sent_in_backward_, sent_after_backward_, buckets_.size());
  }
  torch::NoGradGuard no_grad;
  slice_.div_(static_cast<double>(layout_.group_size));
}

}  // namespace wd::student
