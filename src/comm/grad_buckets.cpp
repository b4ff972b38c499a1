// Packing gradients into fp32 buckets and back.
#include "comm/grad_buckets.hpp"

#include "core/errors.hpp"

namespace wd::comm {

std::vector<std::vector<std::size_t>> bucket_groups(const std::vector<torch::Tensor>& params,
                                                    std::uint64_t bucket_bytes) {
  std::vector<std::vector<std::size_t>> groups;
  std::vector<std::size_t> current;
  std::uint64_t current_bytes = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    WD_CHECK(params[i].defined(), "parameter " << i << " given to the gradient reducer is undefined");
    const std::uint64_t bytes = static_cast<std::uint64_t>(params[i].numel()) * sizeof(float);
    if (!current.empty() && current_bytes + bytes > bucket_bytes) {
      groups.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  if (!current.empty()) groups.push_back(std::move(current));
  return groups;
}

std::vector<GradBucket> make_grad_buckets(const std::vector<torch::Tensor>& params,
                                          std::uint64_t bucket_bytes, const torch::TensorOptions& options,
                                          std::int64_t pad_to, torch::Tensor* whole) {
  WD_CHECK(pad_to >= 1, "gradient buffer padding must be >= 1, got " << pad_to);
  std::vector<GradBucket> buckets;
  std::vector<std::int64_t> sizes;
  for (auto& group : bucket_groups(params, bucket_bytes)) {
    std::int64_t numel = 0;
    for (const auto i : group) numel += params[i].numel();
    sizes.push_back(numel);
    buckets.push_back(GradBucket{std::move(group), {}, {}});
  }
  std::int64_t total = 0;
  for (const auto size : sizes) total += size;
  const auto buffer = torch::zeros({(total + pad_to - 1) / pad_to * pad_to}, options);
  std::int64_t offset = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    buckets[b].flat = buffer.narrow(0, offset, sizes[b]);
    offset += sizes[b];
  }
  if (whole) *whole = buffer;
  return buckets;
}

namespace {
/// True when `grad` is the bucket slice starting at `slice` (bound by bind_grads).
bool is_bound(const torch::Tensor& grad, const torch::Tensor& slice) {
  return grad.defined() && grad.data_ptr() == slice.data_ptr() && grad.numel() == slice.numel();
}
}  // namespace

void bind_grads(std::vector<torch::Tensor>& params, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (const std::size_t i : bucket.params) {
    torch::Tensor& p = params[i];
    auto slice = bucket.flat.narrow(0, offset, p.numel());
    offset += p.numel();
    if (p.scalar_type() != bucket.flat.scalar_type() || p.device() != bucket.flat.device() ||
        !p.is_contiguous()) {
      continue;
    }
    torch::Tensor& grad = p.mutable_grad();
    if (is_bound(grad, slice)) continue;
    if (grad.defined()) {
      slice.copy_(grad.reshape({-1}));
    } else {
      slice.zero_();
    }
    grad = slice.view(p.sizes());
  }
}

void pack_grads(const std::vector<torch::Tensor>& params, GradBucket& bucket) {
  std::int64_t offset = 0;
  for (const std::size_t i : bucket.params) {
    const torch::Tensor& p = params[i];
    auto slice = bucket.flat.narrow(0, offset, p.numel());
    const torch::Tensor& grad = p.grad();
    if (is_bound(grad, slice)) {
      // accumulated in place by the backward
    } else if (grad.defined()) {
      slice.copy_(grad.reshape({-1}));
    } else {
      slice.zero_();
    }
    offset += p.numel();
  }
}

void unpack_grads(std::vector<torch::Tensor>& params, GradBucket& bucket, int group_size) {
  bucket.flat.div_(static_cast<double>(group_size));
  std::int64_t offset = 0;
  for (const std::size_t i : bucket.params) {
    torch::Tensor& p = params[i];
    const auto slice = bucket.flat.narrow(0, offset, p.numel()).view(p.sizes());
    torch::Tensor& grad = p.mutable_grad();
    if (is_bound(grad, slice)) {
      // the division above was the whole unpacking
    } else if (grad.defined()) {
      grad.copy_(slice);
    } else {
      grad = slice.to(p.options(), /*non_blocking=*/false, /*copy=*/true);
    }
    offset += p.numel();
  }
}

}  // namespace wd::comm
