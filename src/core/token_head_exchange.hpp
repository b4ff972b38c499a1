// TokenHeadExchange: the all-to-all of a sequence-parallel group (Ulysses), independent of the
// library that carries it; the model calls it, src/comm implements it over MPI.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace wd {

/// The tokens of each sample one rank of a sequence-parallel group holds: [begin, end) of
/// `total`, the sample's S tokens right-padded to a multiple of N so that every rank holds
/// total / N (the padding is masked as a short sample's is). Without a group: all S.
struct TokenSpan {
  std::int64_t begin = 0, end = 0, total = 0;
  std::int64_t local() const { return end - begin; }
  /// This rank's tokens that are real (below S), not padding.
  std::int64_t real(std::int64_t S) const { return std::max<std::int64_t>(0, std::min(end, S) - begin); }
};
/// Rank `rank`'s span of S tokens in a group of `size` (size 1: [0, S)).
TokenSpan token_span(int rank, int size, std::int64_t S);

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
  /// The sum over the group of `x` (same shape on every rank), added in rank order so every rank
  /// gets the same values; not differentiable (N·x.numel() elements sent by each rank).
  torch::Tensor sum(const torch::Tensor& x);
  /// This rank's span of a sample of S tokens.
  TokenSpan span(std::int64_t S) const { return token_span(rank_, size_, S); }

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
