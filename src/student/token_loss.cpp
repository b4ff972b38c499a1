// The sequence-parallel distillation loss (token_loss.hpp).
#include "student/token_loss.hpp"

#include "core/errors.hpp"

namespace wd::student {

std::int64_t latent_tokens(const torch::Tensor& latent, const std::array<std::int64_t, 3>& p) {
  return latent.size(2) / p[0] * (latent.size(3) / p[1]) * (latent.size(4) / p[2]);
}

torch::Tensor latent_token_rows(const torch::Tensor& latent, const std::array<std::int64_t, 3>& p,
                                std::int64_t begin, std::int64_t end) {
  WD_CHECK(latent.dim() == 5, "token rows need a latent [B,C,F,H,W], got " << latent.sizes());
  const auto B = latent.size(0), C = latent.size(1), F = latent.size(2), H = latent.size(3), W = latent.size(4);
  WD_CHECK(F % p[0] == 0 && H % p[1] == 0 && W % p[2] == 0,
           "latent " << latent.sizes() << " is not a whole number of patches " << p[0] << "x" << p[1] << "x" << p[2]);
  const auto f = F / p[0], h = H / p[1], w = W / p[2];
  const auto L = f * h * w;
  WD_CHECK(0 <= begin && begin <= end, "token rows [" << begin << ", " << end << ") are not a span");
  // [B,C,f,pt,h,ph,w,pw] -> [B, f,h,w, pt,ph,pw, C]: the head's order (WanDiT::unembed's inverse).
  auto rows = latent.reshape({B, C, f, p[0], h, p[1], w, p[2]})
                  .permute({0, 2, 4, 6, 3, 5, 7, 1})
                  .reshape({B, L, p[0] * p[1] * p[2] * C});
  const auto real_end = std::min(end, L);
  auto out = torch::zeros({B, end - begin, rows.size(2)}, latent.options());
  if (begin < real_end) out.slice(1, 0, real_end - begin).copy_(rows.slice(1, begin, real_end));
  return out;
}

torch::Tensor token_distill_loss(const torch::Tensor& rows, const torch::Tensor& teacher_out,
                                 const torch::Tensor& weights, const std::array<std::int64_t, 3>& patch,
                                 const TokenHeadExchange& group) {
  const auto n = static_cast<std::int64_t>(group.size());
  const auto L = latent_tokens(teacher_out, patch);
  const auto span = group.span(L);  // WanDiT's: L padded to a multiple of N, N equal runs
  const auto local = span.local();
  WD_CHECK(rows.size(0) == teacher_out.size(0) && rows.size(1) == local,
           "sequence-parallel rows " << rows.sizes() << " do not hold rank " << group.rank() << "'s " << local
                                     << " tokens of " << L << " (group of " << n << ") for teacher_out "
                                     << teacher_out.sizes());
  const auto begin = span.begin;
  const auto target = latent_token_rows(teacher_out.to(rows.scalar_type()), patch, begin, begin + local);
  // Weights are 1 (or the frame's weight) on real tokens and 0 on the padding.
  const auto full = weights.defined() ? weights.to(rows.scalar_type()).expand_as(teacher_out)
                                      : torch::ones({1, 1, 1, 1, 1}, rows.options()).expand_as(teacher_out);
  const auto w = latent_token_rows(full, patch, begin, begin + local);
  // distill_loss' normaliser: the element count (mse_loss' mean), or the weights' sum (at least 1).
  const auto sum = ((rows - target).pow(2) * w).sum();
  const auto share = weights.defined() ? sum / full.sum().clamp_min(1) : sum / static_cast<double>(teacher_out.numel());
  return share * static_cast<double>(n);
}

}  // namespace wd::student
