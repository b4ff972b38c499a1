// The layouts of TokenHeadExchange around the raw all-to-all, and their autograd.
#include "core/token_head_exchange.hpp"

#include <sstream>

#include "core/errors.hpp"
#include "core/logging.hpp"

namespace wd {

namespace {

void check_heads(std::int64_t heads, int n) {
  WD_CHECK_AS(ConfigError, heads % n == 0,
              "sequence parallelism over " << n << " ranks splits the " << heads
                                           << " attention heads evenly; sizes that divide them: "
                                           << sequence_parallel_sizes(heads));
}

/// [B, Sl, H, d] -> [B, N·Sl, H/N, d]: chunk j (heads of rank j) goes to rank j; chunk i back
/// holds rank i's tokens, which come i-th in the sequence.
torch::Tensor heads_raw(TokenHeadExchange& ex, const torch::Tensor& x) {
  WD_CHECK(x.dim() == 4, "to_heads takes [B, S_local, H, d], got " << format_shape(x.sizes()));
  const auto n = ex.size();
  const auto B = x.size(0), Sl = x.size(1), H = x.size(2), d = x.size(3);
  check_heads(H, n);
  const auto send = x.reshape({B, Sl, n, H / n, d}).permute({2, 0, 1, 3, 4}).contiguous();
  return ex.all_to_all(send).permute({1, 0, 2, 3, 4}).reshape({B, n * Sl, H / n, d});
}

/// [B, N·Sl, Hn, d] -> [B, Sl, N·Hn, d]: chunk j (rank j's tokens) goes to rank j; chunk i
/// back holds head group i.
torch::Tensor tokens_raw(TokenHeadExchange& ex, const torch::Tensor& x) {
  WD_CHECK(x.dim() == 4, "to_tokens takes [B, S, H/N, d], got " << format_shape(x.sizes()));
  const auto n = ex.size();
  const auto B = x.size(0), S = x.size(1), Hn = x.size(2), d = x.size(3);
  WD_CHECK(S % n == 0, "to_tokens: " << S << " tokens do not split evenly over " << n << " ranks");
  const auto send = x.reshape({B, n, S / n, Hn, d}).permute({1, 0, 2, 3, 4}).contiguous();
  return ex.all_to_all(send).permute({1, 2, 0, 3, 4}).reshape({B, S / n, n * Hn, d});
}

TokenHeadExchange* exchange_of(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<TokenHeadExchange*>(ctx->saved_data["exchange"].toInt());
}

/// to_heads with to_tokens as its backward (the all-to-all is a permutation across the group,
/// so its adjoint is the inverse permutation).
struct ToHeads : torch::autograd::Function<ToHeads> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, std::int64_t ex) {
    ctx->saved_data["exchange"] = ex;
    return heads_raw(*reinterpret_cast<TokenHeadExchange*>(ex), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {tokens_raw(*exchange_of(ctx), grads[0]), torch::Tensor()};
  }
};

struct ToTokens : torch::autograd::Function<ToTokens> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, std::int64_t ex) {
    ctx->saved_data["exchange"] = ex;
    return tokens_raw(*reinterpret_cast<TokenHeadExchange*>(ex), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {heads_raw(*exchange_of(ctx), grads[0]), torch::Tensor()};
  }
};

std::int64_t handle(TokenHeadExchange* ex) { return reinterpret_cast<std::int64_t>(ex); }

}  // namespace

TokenHeadExchange::TokenHeadExchange(int rank, int size) : rank_(rank), size_(size) {
  WD_CHECK(size >= 1 && rank >= 0 && rank < size,
           "a sequence-parallel group needs 0 <= rank < size, got rank " << rank << " of " << size);
}

torch::Tensor TokenHeadExchange::to_heads(const torch::Tensor& x) { return ToHeads::apply(x, handle(this)); }

torch::Tensor TokenHeadExchange::to_tokens(const torch::Tensor& x) { return ToTokens::apply(x, handle(this)); }

torch::Tensor TokenHeadExchange::gather_tokens(const torch::Tensor& x) {
  WD_CHECK(x.dim() == 3, "gather_tokens takes [B, S_local, X], got " << format_shape(x.sizes()));
  const auto B = x.size(0), Sl = x.size(1), X = x.size(2);
  // Every "head" a copy of this rank's rows: after to_heads each rank holds one, from every rank.
  return to_heads(x.unsqueeze(2).expand({B, Sl, size_, X})).view({B, size_ * Sl, X});
}

torch::Tensor TokenHeadExchange::sum(const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  auto shape = x.sizes().vec();
  shape.insert(shape.begin(), size_);
  return all_to_all(x.detach().unsqueeze(0).expand(shape).contiguous()).sum(0);
}

TokenSpan token_span(int rank, int size, std::int64_t S) {
  if (size <= 1) return {0, S, S};
  const std::int64_t n = size;
  const auto local = (S + n - 1) / n;
  return {rank * local, (rank + 1) * local, local * n};
}

std::string sequence_parallel_sizes(std::int64_t num_heads) {
  std::ostringstream out;
  for (std::int64_t n = 1; n <= num_heads; ++n) {
    if (num_heads % n == 0) out << (n == 1 ? "" : ", ") << n;
  }
  return out.str();
}

}  // namespace wd
