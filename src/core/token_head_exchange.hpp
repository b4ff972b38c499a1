// TokenHeadExchange: the all-to-all of a sequence-parallel group (Ulysses), independent of the
// library that carries it; the model calls it, src/comm implements it over MPI.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace wd {

/// The collective of a sequence-parallel group of N ranks that share each sample, rank r
/// holding the r-th of N equal runs of its tokens. Around self-attention it trades that token
/// split for a head split (rank r then holds heads [r·H/N, (r+1)·H/N) of every token) and back
/// (DeepSpeed-Ulysses). to_heads, to_tokens and gather_tokens are differentiable: the backward
/// of one direction is the other. An implementation supplies only the raw all-to-all of N equal
/// chunks; the layouts and the autograd live here, so every backend runs the same code above
/// the collective. Every rank of the group makes the same calls in the same order.
class TokenHeadExchange {
 public:
  virtual ~TokenHeadExchange() = default;
  TokenHeadExchange(const TokenHeadExchange&) = delete;
  TokenHeadExchange& operator=(const TokenHeadExchange&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// [B, S_local, H, d] on each rank -> [B, N·S_local, H/N, d]: every token, this rank's heads.
  /// H must be divisible by N (ConfigError naming the group sizes that divide it).
  torch::Tensor to_heads(const torch::Tensor& x);
  /// The inverse: [B, N·S_local, H/N, d] -> [B, S_local, H, d].
  torch::Tensor to_tokens(const torch::Tensor& x);
  /// [B, S_local, X] -> [B, N·S_local, X], every rank's tokens in rank order on every rank (an
  /// all-gather through to_heads, N·S_local·X elements sent by each rank); the backward sums
  /// the group's gradients of this rank's rows.
  torch::Tensor gather_tokens(const torch::Tensor& x);

  /// The raw collective: `send` is [N, ...] contiguous on any device, send[j] for rank j; the
  /// answer has its shape, dtype and device, row i being what rank i sent to this one. Not
  /// differentiable; throws on failure (naming the operation, bytes, rank and peers).
  virtual torch::Tensor all_to_all(const torch::Tensor& send) = 0;
  /// "mpi" (or "nccl", later), for the log.
  virtual const char* backend() const = 0;

 protected:
  TokenHeadExchange(int rank, int size);

 private:
  int rank_, size_;
};

/// "1, 2, 4" for 4: the sequence-parallel sizes that divide `num_heads`, for error messages.
std::string sequence_parallel_sizes(std::int64_t num_heads);

}  // namespace wd
