// The one place that knows LibTorch versions apart (Debian's 1.13 CPU build vs 2.x CUDA builds).
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <optional>

#if TORCH_VERSION_MAJOR >= 2
#define WD_TORCH_HAS_SDPA 1
#else
#define WD_TORCH_HAS_SDPA 0
#endif

namespace wd::compat {

/// True when this LibTorch has the fused scaled-dot-product attention.
constexpr bool kHasFusedAttention = WD_TORCH_HAS_SDPA;

/// "1.13.0" etc.
inline const char* torch_version() { return TORCH_VERSION; }

/// The plain formula, available in every build so tests can compare it with `attention`.
inline torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v,
                                         const std::optional<torch::Tensor>& key_mask = std::nullopt) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q, k.transpose(-2, -1)).to(torch::kFloat).mul_(scale);
  if (key_mask) scores.masked_fill_(key_mask->logical_not(), -std::numeric_limits<float>::infinity());
  auto probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(probs, v);
}

/// softmax(q·kᵀ/√d)·v over [B, heads, S, d] tensors. `key_mask`, when given, is a boolean
/// [B, 1, 1, S_k] tensor, true for keys that take part. Uses the fused kernel where LibTorch
/// has one; otherwise plain attention with an fp32 softmax (the fused kernels also keep the
/// softmax in fp32 for half inputs), so both paths agree in fp32 up to summation order.
inline torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v,
                               const std::optional<torch::Tensor>& key_mask = std::nullopt) {
#if WD_TORCH_HAS_SDPA
  return at::scaled_dot_product_attention(
      q, k, v, key_mask ? c10::optional<at::Tensor>(*key_mask) : c10::nullopt);
#else
  return attention_reference(q, k, v, key_mask);
#endif
}

/// True when LibTorch has fp16/bf16 matmul kernels on `device`. Debian's 1.13 CPU build has
/// bf16 (oneDNN) but no fp16 matmul on the host; 2.x builds have both.
inline bool half_matmul_supported(c10::ScalarType dtype, const c10::Device& device) {
  if (device.is_cuda() || dtype != c10::kHalf) return true;
  return TORCH_VERSION_MAJOR >= 2;
}

/// True when a CUDA device is usable by this process.
inline bool cuda_available() { return torch::cuda::is_available(); }

}  // namespace wd::compat
