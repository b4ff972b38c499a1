// Gradient buckets: the fp32 buffers a gradient all-reduce works on, shared by the MPI and the
// NCCL reducers so both pack, average and unpack alike.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace wd::comm {

/// Consecutive parameters (indices into the reducer's list) and their flattened fp32 grads.
struct GradBucket {
  std::vector<std::size_t> params;
  torch::Tensor flat;  ///< on the parameters' device (the MPI reducer's host params: the host)
  /// The MPI reducer of device gradients: `flat`'s pinned host twin, which MPI reduces (one
  /// copy each way per bucket); undefined otherwise.
  torch::Tensor host;
};

/// The parameter indices of each bucket: `params` in order, cut where the next parameter would
/// take the bucket past `bucket_bytes` of fp32 (a larger parameter gets a bucket of its own).
/// make_grad_buckets and the sharded reduce-scatter (student::GradientScatter) cut alike.
std::vector<std::vector<std::size_t>> bucket_groups(const std::vector<torch::Tensor>& params,
                                                    std::uint64_t bucket_bytes);

/// Splits `params` in order into buckets of at most `bucket_bytes` of fp32 (a larger parameter
/// gets a bucket of its own). Parameter order is the same on every student, so bucket b holds
/// the same parameters everywhere and one all-reduce per bucket lines up across ranks. All
/// buckets are consecutive views of one buffer allocated once with `options`, padded with zeros
/// to a multiple of `pad_to` elements (the student group's size: a sharded optimizer cuts it
/// into equal slices); `*whole` (if given) receives that buffer. Throws wd::Error for an
/// undefined parameter.
std::vector<GradBucket> make_grad_buckets(const std::vector<torch::Tensor>& params,
                                          std::uint64_t bucket_bytes, const torch::TensorOptions& options,
                                          std::int64_t pad_to = 1, torch::Tensor* whole = nullptr);

/// Makes each of the bucket's parameters' .grad a view of its slice of `bucket.flat` (a grad it
/// already had is copied in first), so the backward accumulates straight into the bucket and the
/// gradients exist once, not also as a packed copy. A parameter whose dtype, device or layout
/// differs from the bucket's keeps a grad of its own (packed and unpacked as before). Whoever
/// resets grads must then zero them in place, never drop or replace them.
void bind_grads(std::vector<torch::Tensor>& params, GradBucket& bucket);

/// Copies the bucket's parameters' grads into `bucket.flat` (a missing grad counts as zeros); a
/// grad bound to its slice (bind_grads) is already there.
void pack_grads(const std::vector<torch::Tensor>& params, GradBucket& bucket);

/// Divides the summed bucket by `group_size` and copies it back into the grads (creating them
/// where missing); a bound grad already is its slice.
void unpack_grads(std::vector<torch::Tensor>& params, GradBucket& bucket, int group_size);

}  // namespace wd::comm
