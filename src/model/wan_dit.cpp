// The Wan 2.2 DiT forward pass (spec §3-§6), staged as embed → blocks → unembed.
#include "model/wan_dit.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <tuple>

#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "core/logging.hpp"
#include "core/torch_compat.hpp"

namespace wd {

namespace {

constexpr std::int64_t kRopePositions = 1024;  // the official table covers positions 0..1023

/// cos/sin of the official `rope_params(1024, width)`: angle p·10000^(−2j/width), in float64.
std::pair<torch::Tensor, torch::Tensor> rope_axis(std::int64_t width) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  auto freqs = 1.0 / torch::pow(10000.0, torch::arange(0, width, 2, f64).div(width));
  auto angles = torch::outer(torch::arange(kRopePositions, f64), freqs);
  return {angles.cos(), angles.sin()};
}

/// The B context lengths as host integers (`full` each when `lens` is undefined). Teachers and
/// students hold them on the host, so reading them costs no device synchronisation; a device
/// tensor is moved once, and that wait is counted.
std::vector<std::int64_t> context_lens_on_host(const torch::Tensor& lens, std::int64_t B, std::int64_t full) {
  if (!lens.defined()) return std::vector<std::int64_t>(B, full);
  WD_CHECK(lens.numel() == B, "context_lens has " << lens.numel() << " entries, batch is " << B);
  auto host = lens;
  if (!host.device().is_cpu()) {
    note_host_sync("WanInputs::batched context_lens");
    host = host.to(torch::kCPU);
  }
  host = host.to(torch::kLong).contiguous();
  const auto* p = host.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(p, p + B);
}

/// True when `batch` is defined and every list entry still is `batch[b]` (the same memory, shape
/// and strides), or with `leading_rows` its first rows: the list is then a view of the batch and
/// the batch can be moved in one copy.
bool list_views_batch(const std::vector<torch::Tensor>& list, const torch::Tensor& batch,
                      bool leading_rows = false) {
  if (!batch.defined() || batch.dim() < 1 || batch.size(0) != static_cast<std::int64_t>(list.size())) return false;
  for (std::size_t b = 0; b < list.size(); ++b) {
    const auto whole = batch[static_cast<std::int64_t>(b)];
    const auto& e = list[b];
    if (!e.defined() || e.device() != whole.device() || e.dim() != whole.dim() || e.data_ptr() != whole.data_ptr() ||
        e.strides() != whole.strides()) {
      return false;
    }
    const auto rows_ok = leading_rows ? e.size(0) <= whole.size(0) : e.size(0) == whole.size(0);
    if (!rows_ok || e.sizes().slice(1) != whole.sizes().slice(1)) return false;
  }
  return true;
}

/// `t` on `device` in `dtype`. Asynchronous with respect to the host: a pageable host source is
/// staged by the driver before the call returns, a pinned one is read by the copy engine later.
torch::Tensor upload(const torch::Tensor& t, const c10::Device& device, c10::ScalarType dtype) {
  return t.to(device, dtype, /*non_blocking=*/true);
}

using Grid = std::array<std::int64_t, 3>;

/// Each sample's patch grid (f,h,w) from the host-side shapes of x (+ y), checked against the
/// config: in_dim channels, divisible by the patch size, within the RoPE table.
std::vector<Grid> patch_grids(const WanConfig& c, const WanInputs& in) {
  const auto& p = c.patch_size;
  std::vector<Grid> grids;
  for (std::int64_t b = 0; b < static_cast<std::int64_t>(in.x.size()); ++b) {
    const auto& xs = in.x[b];
    auto shape = xs.sizes().vec();
    if (!in.y.empty()) {
      const auto& ys = in.y[b];
      WD_CHECK(xs.dim() == 4 && ys.dim() == 4 && xs.sizes().slice(1) == ys.sizes().slice(1),
               "sample " << b << ": x " << format_shape(xs.sizes()) << " and y " << format_shape(ys.sizes())
                         << " must both be [C,F,H,W] with the same F,H,W");
      shape[0] += ys.size(0);
    }
    WD_CHECK(shape.size() == 4 && shape[0] == c.in_dim,
             "sample " << b << ": latent (x" << (in.y.empty() ? "" : " + y") << ") must be [in_dim="
                       << c.in_dim << ",F,H,W], got " << format_shape(shape));
    Grid grid{};
    for (int a = 0; a < 3; ++a) {
      WD_CHECK(shape[a + 1] % p[a] == 0,
               "sample " << b << ": latent " << format_shape(shape) << " is not divisible by patch size ("
                         << p[0] << "," << p[1] << "," << p[2] << ")");
      grid[a] = shape[a + 1] / p[a];
      WD_CHECK(grid[a] <= kRopePositions, "sample " << b << ": patch grid axis " << a << " is "
                                                    << grid[a] << ", the RoPE table covers 1024");
    }
    grids.push_back(grid);
  }
  return grids;
}

/// S, the tokens every sample is padded to: `seq_len` when set (it must hold the largest
/// sample), else the largest sample's token count.
std::int64_t padded_length(const std::vector<Grid>& grids, std::int64_t seq_len) {
  std::int64_t max_tokens = 0;
  for (const auto& g : grids) max_tokens = std::max(max_tokens, g[0] * g[1] * g[2]);
  const auto S = seq_len > 0 ? seq_len : max_tokens;
  WD_CHECK(max_tokens <= S, "seq_len " << S << " is smaller than the largest sample's "
                                       << max_tokens << " tokens");
  return S;
}

/// Latents on the device: one copy of the batch tensor when the list views one
/// (WanInputs::batched), else one per sample; neither waits for the device.
std::vector<torch::Tensor> upload_latents(const std::vector<torch::Tensor>& list, const torch::Tensor& batch,
                                          const c10::Device& device, c10::ScalarType dtype) {
  std::vector<torch::Tensor> out;
  if (list_views_batch(list, batch)) {
    const auto moved = upload(batch, device, dtype);
    for (std::int64_t b = 0; b < static_cast<std::int64_t>(list.size()); ++b) out.push_back(moved[b]);
  } else {
    for (const auto& e : list) out.push_back(upload(e, device, dtype));
  }
  return out;
}

/// [B,1,1,S] true on each sample's real tokens; undefined when no sample is padded, because
/// SDPA takes no flash kernel with a mask.
torch::Tensor key_mask(const std::vector<Grid>& grids, std::int64_t S, const c10::Device& device) {
  const bool padded = std::any_of(grids.begin(), grids.end(), [&](const auto& g) { return g[0] * g[1] * g[2] < S; });
  if (!padded) return {};
  const auto B = static_cast<std::int64_t>(grids.size());
  auto mask = torch::zeros({B, 1, 1, S}, torch::TensorOptions().dtype(torch::kBool).device(device));
  for (std::int64_t b = 0; b < B; ++b) {
    const auto [f, h, w] = grids[b];
    mask[b].slice(-1, 0, f * h * w).fill_(true);
  }
  return mask;
}

/// All S tokens without sequence parallelism; with a group, this rank's run of S padded to a
/// multiple of N (TokenSpan). Throws ConfigError where the group cannot split.
TokenSpan token_span(const TokenHeadExchange* sp, const WanConfig& c, std::int64_t S) {
  if (!sp) return {0, S, S};
  const std::int64_t n = sp->size();
  WD_CHECK_AS(ConfigError, c.num_heads % n == 0,
              "sequence parallelism over " << n << " ranks needs num_heads (" << c.num_heads
                                           << ") divisible by it; sizes that work: "
                                           << sequence_parallel_sizes(c.num_heads));
  WD_CHECK_AS(ConfigError, S >= n,
              "sequence parallelism over " << n << " ranks needs at least " << n << " tokens, the batch has " << S);
  return sp->span(S);
}

/// Per-token t [B,S] cut to the span (zeros on padding past S); per-sample t as it is.
torch::Tensor timesteps_of_span(const torch::Tensor& t, std::int64_t B, std::int64_t S, const TokenSpan& span) {
  if (t.dim() != 2 || (span.begin == 0 && span.end == S)) return t;
  WD_CHECK(t.size(0) == B && t.size(1) == S,
           "per-token t must be [B=" << B << ",S=" << S << "], got " << format_shape(t.sizes()));
  const auto padded = span.total == S ? t : torch::cat({t, torch::zeros({B, span.total - S}, t.options())}, 1);
  return padded.slice(1, span.begin, span.end);
}

}  // namespace

torch::Tensor wan_patchify(const torch::Tensor& latent, const std::array<std::int64_t, 3>& p) {
  const auto C = latent.size(0), F = latent.size(1), H = latent.size(2), W = latent.size(3);
  const auto f = F / p[0], h = H / p[1], w = W / p[2];
  // Conv3d with kernel == stride is a matmul over non-overlapping patches; doing it as one
  // keeps a single code path for every dtype (LibTorch 1.13 has no bf16 conv3d on the host).
  return latent.reshape({C, f, p[0], h, p[1], w, p[2]})
      .permute({1, 3, 5, 0, 2, 4, 6})
      .reshape({f * h * w, C * p[0] * p[1] * p[2]});
}

torch::Tensor wan_random_parameter(const ParamSpec& spec, std::size_t index, std::uint64_t seed,
                                   c10::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ULL + index + 1);
  auto n = torch::randn(spec.shape, gen, torch::TensorOptions().dtype(torch::kFloat));
  switch (spec.kind) {
    case ParamKind::kModulation:
      n.mul_(0.1);
      break;
    case ParamKind::kBias:
      n.mul_(0.05);
      break;
    case ParamKind::kNormGain:
      n.mul_(0.1).add_(1.0);
      break;
    case ParamKind::kWeight: {
      std::int64_t fan_in = 1;
      for (std::size_t i = 1; i < spec.shape.size(); ++i) fan_in *= spec.shape[i];
      n.div_(std::sqrt(static_cast<double>(fan_in)));
      break;
    }
  }
  return n.to(dtype);
}

WanInputs WanInputs::batched(const torch::Tensor& x, const torch::Tensor& t,
                             const torch::Tensor& context, const torch::Tensor& context_lens,
                             std::int64_t seq_len, const torch::Tensor& y) {
  WD_CHECK(x.dim() == 5, "batched x must be [B,C,F,H,W], got " << format_shape(x.sizes()));
  WD_CHECK(context.dim() == 3, "batched context must be [B,L,text_dim], got " << format_shape(context.sizes()));
  const auto B = x.size(0);
  WD_CHECK(context.size(0) == B, "context batch " << context.size(0) << " != x batch " << B);
  WanInputs in;
  in.t = t;
  in.seq_len = seq_len;
  in.x_batch = x;
  in.y_batch = y;
  in.context_batch = context;
  const auto lens = context_lens_on_host(context_lens, B, context.size(1));
  for (std::int64_t b = 0; b < B; ++b) {
    in.x.push_back(x[b]);
    if (y.defined()) in.y.push_back(y[b]);
    const auto len = lens[b];
    WD_CHECK(len >= 0 && len <= context.size(1),
             "context_lens[" << b << "] = " << len << " outside 0.." << context.size(1));
    in.context.push_back(context[b].slice(0, 0, len));
  }
  return in;
}

WanDiTImpl::WanDiTImpl(WanConfig config, WanInit init, c10::ScalarType dtype, std::uint64_t seed)
    : config_(std::move(config)) {
  config_.validate("WanDiT");
  const auto specs = wan_param_specs(config_);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto value = init == WanInit::kRandom
                     ? wan_random_parameter(specs[i], i, seed, dtype)
                     : torch::empty({0}, torch::TensorOptions().dtype(dtype));
    register_native(specs[i].name, value);
  }
  const auto P = [&](const std::string& n) {
    auto it = params_.find(n);
    return it == params_.end() ? torch::Tensor() : it->second;
  };
  const auto L = [&](const std::string& n) { return Linear{P(n + ".weight"), P(n + ".bias")}; };
  patch_weight_ = P("patch_embedding.weight");
  patch_bias_ = P("patch_embedding.bias");
  text0_ = L("text_embedding.0");
  text2_ = L("text_embedding.2");
  time0_ = L("time_embedding.0");
  time2_ = L("time_embedding.2");
  time_proj_ = L("time_projection.1");
  head_modulation_ = P("head.modulation");
  head_ = L("head.head");
  for (std::int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const auto A = [&](const std::string& a) {
      return Attention{L(b + a + ".q"), L(b + a + ".k"), L(b + a + ".v"), L(b + a + ".o"),
                       P(b + a + ".norm_q.weight"), P(b + a + ".norm_k.weight")};
    };
    blocks_.push_back(Block{P(b + "modulation"), A("self_attn"), A("cross_attn"),
                            P(b + "norm3.weight"), P(b + "norm3.bias"), L(b + "ffn.0"),
                            L(b + "ffn.2")});
  }
  // RoPE table (spec §4): frame, height, width groups, each with its own frequency ladder.
  const auto d = config_.head_dim();
  const auto hw = 2 * (d / 6);
  auto [fc, fs] = rope_axis(d - 2 * hw);
  auto [hc, hs] = rope_axis(hw);
  auto [wc, ws] = rope_axis(hw);
  rope_cos_ = torch::cat({fc, hc, wc}, 1);
  rope_sin_ = torch::cat({fs, hs, ws}, 1);
}

void WanDiTImpl::register_native(const std::string& name, const torch::Tensor& value) {
  torch::nn::Module* node = this;
  std::size_t start = 0;
  for (auto dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
    const auto part = name.substr(start, dot - start);
    auto children = node->named_children();
    if (auto* found = children.find(part)) {
      node = found->get();
    } else {
      node = node->register_module(part, std::make_shared<torch::nn::Module>()).get();
    }
    start = dot + 1;
  }
  params_[name] = node->register_parameter(name.substr(start), value);
}

void WanDiTImpl::bind_parameter(const std::string& name, const torch::Tensor& value) {
  auto it = params_.find(name);
  WD_CHECK(it != params_.end(), "WanDiT has no parameter named '" << name << "'");
  // Same TensorImpl, new storage: every handle (Block members, named_parameters) sees it.
  torch::NoGradGuard no_grad;
  it->second.set_data(value);
}

WanDiTImpl::Linear& WanDiTImpl::block_linear(const std::string& name) {
  const auto fail = [&] {
    return std::string("'") + name + "' is not a block linear (blocks.<i>.<self_attn|cross_attn>.<q|k|v|o> or "
           "blocks.<i>.ffn.<0|2>, i < " + std::to_string(config_.num_layers) + ")";
  };
  WD_CHECK_AS(ConfigError, name.rfind("blocks.", 0) == 0, fail());
  const auto dot = name.find('.', 7);
  WD_CHECK_AS(ConfigError, dot != std::string::npos, fail());
  std::int64_t i = -1;
  try {
    i = std::stoll(name.substr(7, dot - 7));
  } catch (const std::exception&) {
    throw ConfigError(fail());
  }
  WD_CHECK_AS(ConfigError, i >= 0 && i < static_cast<std::int64_t>(blocks_.size()), fail());
  auto& b = blocks_[static_cast<std::size_t>(i)];
  const auto rest = name.substr(dot + 1);
  for (auto* a : {&b.self_attn, &b.cross_attn}) {
    const std::string prefix = a == &b.self_attn ? "self_attn." : "cross_attn.";
    if (rest == prefix + "q") return a->q;
    if (rest == prefix + "k") return a->k;
    if (rest == prefix + "v") return a->v;
    if (rest == prefix + "o") return a->o;
  }
  if (rest == "ffn.0") return b.ffn0;
  if (rest == "ffn.2") return b.ffn2;
  throw ConfigError(fail());
}

void WanDiTImpl::add_lora(const LoraSpec& spec, std::uint64_t seed) {
  WD_CHECK(lora_.rank == 0, "add_lora: this DiT already has adapters");
  WD_CHECK_AS(ConfigError, spec.rank > 0, "a LoRA needs a rank > 0, got " << spec.rank);
  WD_CHECK_AS(ConfigError, spec.alpha > 0, "a LoRA needs alpha > 0, got " << spec.alpha);
  WD_CHECK_AS(ConfigError, !spec.targets.empty(), "a LoRA needs at least one target linear");
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < spec.targets.size(); ++k) {
    auto& l = block_linear(spec.targets[k]);
    WD_CHECK_AS(ConfigError, !l.down.defined(), "LoRA target '" << spec.targets[k] << "' is listed twice");
    WD_CHECK(l.weight.numel() > 0, "LoRA target '" << spec.targets[k] << "' has no weight loaded");
    const auto out = l.weight.size(0), in = l.weight.size(1);
    WD_CHECK_AS(ConfigError, spec.rank <= std::min(in, out),
                "LoRA rank " << spec.rank << " exceeds " << spec.targets[k] << "'s " << out << "x" << in);
    // A generator per adapter: the draw depends only on (seed, position in the target list).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + k);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    auto down = torch::empty({spec.rank, in}, torch::kFloat).uniform_(-bound, bound, gen);
    const auto device = l.weight.device();
    register_native(spec.targets[k] + ".lora_down", down.to(device));
    register_native(spec.targets[k] + ".lora_up", torch::zeros({out, spec.rank}, torch::TensorOptions().device(device)));
    l.down = params_.at(spec.targets[k] + ".lora_down");
    l.up = params_.at(spec.targets[k] + ".lora_up");
    l.scale = spec.scale();
  }
  lora_ = spec;
}

std::vector<std::pair<std::string, torch::Tensor>> WanDiTImpl::lora_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& t : lora_.targets) {
    out.emplace_back(t + ".lora_down", params_.at(t + ".lora_down"));
    out.emplace_back(t + ".lora_up", params_.at(t + ".lora_up"));
  }
  return out;
}

bool WanDiTImpl::is_lora_name(const std::string& name) {
  const auto ends = [&](const std::string& tail) {
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".lora_down") || ends(".lora_up");
}

c10::ScalarType WanDiTImpl::dtype() const { return patch_weight_.scalar_type(); }

c10::ScalarType WanDiTImpl::compute_dtype() const {
  if (compute_override_) return *compute_override_;
  const auto w = dtype();
  return compat::half_matmul_supported(w, patch_weight_.device()) ? w : torch::kFloat;
}

torch::Tensor WanDiTImpl::linear(const torch::Tensor& x, const Linear& l) const {
  const auto c = compute_dtype();
  // Weights are converted only on the fallback path (fp16 weights without fp16 kernels) or
  // under a compute override.
  const auto xc = x.to(c);
  auto y = l.weight.scalar_type() == c ? at::linear(xc, l.weight, l.bias)
                                       : at::linear(xc, l.weight.to(c), l.bias.to(c));
  if (!l.down.defined()) return y;
  // LoRA: the adapters (fp32 masters) in the compute dtype; their casts carry the gradient.
  return y + at::linear(at::linear(xc, l.down.to(c)), l.up.to(c)) * l.scale;
}

torch::Tensor WanDiTImpl::linear_f32(const torch::Tensor& x, const Linear& l) const {
  return at::linear(x.to(torch::kFloat), l.weight.to(torch::kFloat), l.bias.to(torch::kFloat));
}

torch::Tensor WanDiTImpl::rms_norm(const torch::Tensor& x, const torch::Tensor& weight) const {
  if (!weight.defined()) return x;  // qk_norm off: the official norm is an Identity
  // x·rsqrt(mean(x²) + eps) in fp32: one fused kernel where the LibTorch has one.
  const auto normed = compat::rms_norm(x.to(torch::kFloat), config_.eps);
  // Official: `_norm(x.float()).type_as(x) * weight`, so the product runs in x's dtype.
  return normed.to(x.scalar_type()) * weight.to(x.scalar_type());
}

torch::Tensor WanDiTImpl::layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                                     const torch::Tensor& bias) const {
  // Official WanLayerNorm: normalise in fp32, cast back to the input dtype (`type_as`).
  const auto w = weight.defined() ? c10::optional<at::Tensor>(weight.to(torch::kFloat)) : c10::nullopt;
  const auto b = bias.defined() ? c10::optional<at::Tensor>(bias.to(torch::kFloat)) : c10::nullopt;
  return at::layer_norm(x.to(torch::kFloat), {config_.dim}, w, b, config_.eps).to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> WanDiTImpl::rope_tables_on(const c10::Device& device) const {
  std::lock_guard<std::mutex> lock(rope_mutex_);
  for (const auto& [d, tables] : rope_on_device_) {
    if (d == device) return tables;
  }
  // The float64 angles' cos and sin, each rounded once to fp32 (6e-8 relative).
  auto tables = std::make_pair(rope_cos_.to(torch::kFloat).to(device), rope_sin_.to(torch::kFloat).to(device));
  rope_on_device_.emplace_back(device, tables);
  return tables;
}

torch::Tensor WanDiTImpl::apply_rope(const torch::Tensor& x, const WanState& s) const {
  // x [B,S,n,d]: adjacent channel pairs (a, b) rotated by their angle, (a cos − b sin, a sin + b cos),
  // in fp32 as x·cos + swap(x)·(−sin, sin) with the tables interleaved per channel (token_rope): one
  // product and one fused multiply-add, no float64 copies (the official rotates in float64; the
  // difference is fp32 rounding, tests/unit/test_wan_dit.cpp's golden checks).
  const auto shape = x.sizes().vec();
  const auto xf = x.to(torch::kFloat);
  const auto swapped = xf.reshape({shape[0], shape[1], shape[2], shape[3] / 2, 2}).flip(-1).reshape(shape);
  return torch::addcmul(xf * s.rope_cos, swapped, s.rope_sin);
}

torch::Tensor WanDiTImpl::attention_qkv(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const WanState* masked_by) const {
  // The official attention always runs in the half dtype; with fp32 weights it is fp32.
  const auto c = compute_dtype();
  const auto B = q.size(0), S = q.size(1);
  const auto width = q.size(2) * q.size(3);  // all heads, or a sequence-parallel rank's share
  const auto qh = q.to(c).transpose(1, 2), kh = k.to(c).transpose(1, 2), vh = v.to(c).transpose(1, 2);
  const auto mask = masked_by && masked_by->key_mask.defined() ? std::optional<torch::Tensor>(masked_by->key_mask)
                                                               : std::nullopt;
  static std::once_flag logged;  // which kernel the first self-attention of the process runs
  if (masked_by) {
    std::call_once(logged, [&] {
      spdlog::info("attention: {} for [{}, {}, {}, {}] {} on {}", compat::attention_backend(qh, kh, vh, mask),
                   qh.size(0), qh.size(1), qh.size(2), qh.size(3), c10::toString(c), qh.device().str());
    });
  }
  auto out = compat::attention(qh, kh, vh, mask);
  return out.transpose(1, 2).reshape({B, S, width});
}

torch::Tensor WanDiTImpl::self_attention(const torch::Tensor& x, const Attention& a,
                                         const WanState& s) const {
  const auto B = x.size(0), S = x.size(1), n = config_.num_heads, d = config_.head_dim();
  auto q = rms_norm(linear(x, a.q), a.norm_q).view({B, S, n, d});
  auto k = rms_norm(linear(x, a.k), a.norm_k).view({B, S, n, d});
  auto v = linear(x, a.v).view({B, S, n, d});
  if (s.sequence_parallel) return linear(split_self_attention(apply_rope(q, s), apply_rope(k, s), v, s), a.o);
  return linear(attention_qkv(apply_rope(q, s), apply_rope(k, s), v, &s), a.o);
}

torch::Tensor WanDiTImpl::split_self_attention(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v, const WanState& s) const {
  auto& group = *s.sequence_parallel;
  const auto c = compute_dtype();
  const auto B = q.size(0), S_local = q.size(1), n = q.size(2), d = q.size(3);
  // One all-to-all carries q, k and v: stacked per head as [B,S_local,n,3·d], each head's three
  // travel together to the rank that owns the head.
  const auto qkv = group.to_heads(torch::stack({q.to(c), k.to(c), v.to(c)}, 3).view({B, S_local, n, 3 * d}));
  const auto heads = qkv.view({B, qkv.size(1), qkv.size(2), 3, d});
  const auto out = attention_qkv(heads.select(3, 0), heads.select(3, 1), heads.select(3, 2), &s);
  return group.to_tokens(out.view({B, out.size(1), n / group.size(), d})).reshape({B, S_local, n * d});
}

torch::Tensor WanDiTImpl::cross_attention(const torch::Tensor& x, const Attention& a,
                                          const WanState& s) const {
  const auto B = x.size(0), S = x.size(1), n = config_.num_heads, d = config_.head_dim();
  const auto Lt = s.context.size(1);
  auto q = rms_norm(linear(x, a.q), a.norm_q).view({B, S, n, d});
  auto k = rms_norm(linear(s.context, a.k), a.norm_k).view({B, Lt, n, d});
  auto v = linear(s.context, a.v).view({B, Lt, n, d});
  // No RoPE and no key mask: padded text rows are attended, as in the official model.
  return linear(attention_qkv(q, k, v, nullptr), a.o);
}

WanState WanDiTImpl::embed(const WanInputs& in, WanTrace* trace) {
  const auto B = static_cast<std::int64_t>(in.x.size());
  WD_CHECK(B >= 1, "forward needs at least one sample");
  WD_CHECK(in.context.size() == in.x.size(),
           "forward got " << in.context.size() << " contexts for " << B << " samples");
  WD_CHECK(in.y.empty() || in.y.size() == in.x.size(),
           "forward got " << in.y.size() << " y tensors for " << B << " samples");
  WD_CHECK(config_.model_type != "i2v" || !in.y.empty(),
           "model_type i2v needs y (mask + image latent channels) for every sample");

  WanState s;
  s.grids = patch_grids(config_, in);  // before anything moves to the device
  const auto S = padded_length(s.grids, in.seq_len);
  const auto span = token_span(in.sequence_parallel, config_, S);
  s.sequence_parallel = in.sequence_parallel;
  s.token_begin = span.begin;
  s.tokens_total = span.total;
  s.x = embed_patches(in, span.begin, span.end);
  std::tie(s.rope_cos, s.rope_sin) = token_rope(s.grids, span.total);
  if (s.sequence_parallel) {
    s.rope_cos = s.rope_cos.slice(1, span.begin, span.end);
    s.rope_sin = s.rope_sin.slice(1, span.begin, span.end);
  }
  s.key_mask = key_mask(s.grids, span.total, patch_weight_.device());
  std::tie(s.e, s.e0) = embed_time(timesteps_of_span(in.t, B, S, span), B, span.end - span.begin);
  s.context = embed_text(in);

  if (trace) {
    const auto D = config_.dim;
    const auto S_local = s.x.size(1);
    trace->patch_tokens = s.x;
    trace->time_emb_e = s.e.expand({B, S_local, D});
    trace->time_proj_e0 = s.e0.expand({B, S_local, 6, D});
    trace->context_emb = s.context;
  }
  return s;
}

torch::Tensor WanDiTImpl::embed_patches(const WanInputs& in, std::int64_t begin, std::int64_t end) const {
  const auto B = static_cast<std::int64_t>(in.x.size());
  const auto D = config_.dim;
  const auto device = patch_weight_.device();
  const auto cdt = compute_dtype();
  const auto xs = upload_latents(in.x, in.x_batch, device, cdt);
  const auto ys = in.y.empty() ? std::vector<torch::Tensor>() : upload_latents(in.y, in.y_batch, device, cdt);

  // Tokens [begin, end) of each sample right-padded with zeros (the masks and RoPE rows follow
  // each sample's length); all of them without sequence parallelism.
  auto x = torch::zeros({B, end - begin, D}, torch::TensorOptions().dtype(cdt).device(device));
  for (std::int64_t b = 0; b < B; ++b) {
    const auto xb = ys.empty() ? xs[b] : torch::cat({xs[b], ys[b]}, 0);
    const auto patches = wan_patchify(xb, config_.patch_size);
    const auto L = patches.size(0);
    const auto rows = patches.slice(0, std::min(begin, L), std::min(end, L));
    if (rows.size(0) == 0) continue;  // this rank's part of the sample is all padding
    x[b].slice(0, 0, rows.size(0)).copy_(linear(rows, Linear{patch_weight_.view({D, -1}), patch_bias_}));
  }
  return x;
}

std::pair<torch::Tensor, torch::Tensor> WanDiTImpl::token_rope(const std::vector<std::array<std::int64_t, 3>>& grids,
                                                               std::int64_t S) const {
  const auto B = static_cast<std::int64_t>(grids.size());
  const auto device = patch_weight_.device();
  const auto half_d = config_.head_dim() / 2;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  // The frame axis takes what the two spatial axes (a third each) leave of the head's pairs.
  const auto cf = half_d - 2 * (half_d / 3), ch = half_d / 3;
  const auto tables = rope_tables_on(device);
  const auto rope_rows = [&](const torch::Tensor& table, const std::array<std::int64_t, 3>& grid) {
    const auto [f, h, w] = grid;
    return torch::cat({table.slice(1, 0, cf).slice(0, 0, f).view({f, 1, 1, cf}).expand({f, h, w, cf}),
                       table.slice(1, cf, cf + ch).slice(0, 0, h).view({1, h, 1, ch}).expand({f, h, w, ch}),
                       table.slice(1, cf + ch, half_d).slice(0, 0, w).view({1, 1, w, ch}).expand({f, h, w, ch})},
                      -1)
        .reshape({f * h * w, 1, half_d});
  };
  // Padded to S rows: cos 1 and sin 0 past the sample's tokens, a rotation by zero. Interleaved per
  // channel for apply_rope: cos as (cos, cos) a pair, sin as (−sin, sin).
  const auto padded_rows = [&](const torch::Tensor& table, const std::array<std::int64_t, 3>& grid, double pad) {
    auto rows = rope_rows(table, grid);
    if (rows.size(0) != S) {
      auto out = torch::full({S, 1, half_d}, pad, f32);
      out.slice(0, 0, rows.size(0)).copy_(rows);
      rows = out;
    }
    const auto pairs = pad == 1.0 ? torch::stack({rows, rows}, -1) : torch::stack({-rows, rows}, -1);
    return pairs.reshape({S, 1, 2 * half_d});
  };
  const bool same_grid = std::all_of(grids.begin(), grids.end(), [&](const auto& g) { return g == grids[0]; });
  if (same_grid) {
    // The usual fixed-shape batch: one table, broadcast over the samples.
    return {padded_rows(tables.first, grids[0], 1.0).unsqueeze(0).expand({B, S, 1, 2 * half_d}),
            padded_rows(tables.second, grids[0], 0.0).unsqueeze(0).expand({B, S, 1, 2 * half_d})};
  }
  std::vector<torch::Tensor> cos_rows, sin_rows;
  for (const auto& g : grids) {
    cos_rows.push_back(padded_rows(tables.first, g, 1.0));
    sin_rows.push_back(padded_rows(tables.second, g, 0.0));
  }
  return {torch::stack(cos_rows), torch::stack(sin_rows)};
}

std::pair<torch::Tensor, torch::Tensor> WanDiTImpl::embed_time(const torch::Tensor& timesteps, std::int64_t B,
                                                               std::int64_t S) const {
  const auto& c = config_;
  const auto device = patch_weight_.device();
  // Spec §5: t is [B] per sample, [B,S] per token (TI2V). The official code expands a
  // per-sample t to every token and runs the time MLP on B·S identical rows; here it runs once
  // per sample and e [B,1,D] / e0 [B,1,6,D] broadcast over the tokens: the same values without
  // S-fold the MLP's FLOPs and the [B,S,6,D] modulation tensors of every block.
  torch::Tensor t = timesteps.to(torch::TensorOptions().device(device), /*non_blocking=*/true);
  if (t.dim() == 0) t = t.view({1});
  if (t.dim() == 1) {
    WD_CHECK(t.size(0) == B, "t has " << t.size(0) << " entries for " << B << " samples");
    t = t.view({B, 1});
  } else {
    WD_CHECK(t.dim() == 2 && t.size(0) == B && t.size(1) == S,
             "per-token t must be [B=" << B << ",S=" << S << "], got " << format_shape(timesteps.sizes()));
  }
  const auto rows = t.size(1);
  const auto half = c.freq_dim / 2;
  auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto omega = torch::pow(10000.0, -torch::arange(half, f64).div(half));
  auto sinusoid = torch::outer(t.reshape({-1}).to(torch::kDouble), omega);
  auto freq = torch::cat({sinusoid.cos(), sinusoid.sin()}, 1).view({B, rows, c.freq_dim}).to(torch::kFloat);
  auto e = linear_f32(torch::silu(linear_f32(freq, time0_)), time2_);
  auto e0 = linear_f32(torch::silu(e), time_proj_).view({B, rows, 6, c.dim});
  return {e, e0};
}

torch::Tensor WanDiTImpl::embed_text(const WanInputs& in) const {
  // Spec §3.6: zero-pad each context to text_len, embed, never mask.
  const auto& c = config_;
  const auto B = static_cast<std::int64_t>(in.context.size());
  const auto device = patch_weight_.device();
  const auto cdt = compute_dtype();
  for (std::int64_t b = 0; b < B; ++b) {
    const auto& cb = in.context[b];
    WD_CHECK(cb.dim() == 2 && cb.size(1) == c.text_dim && cb.size(0) <= c.text_len,
             "sample " << b << ": context must be [L<=" << c.text_len << "," << c.text_dim
                       << "], got " << format_shape(cb.sizes()));
  }
  torch::Tensor ctx;
  if (list_views_batch(in.context, in.context_batch, /*leading_rows=*/true)) {
    const auto moved = upload(in.context_batch, device, cdt);
    const bool full = moved.size(1) == c.text_len &&
                      std::all_of(in.context.begin(), in.context.end(),
                                  [&](const torch::Tensor& cb) { return cb.size(0) == c.text_len; });
    if (full) {
      ctx = moved.contiguous();
    } else {
      ctx = torch::zeros({B, c.text_len, c.text_dim}, torch::TensorOptions().dtype(cdt).device(device));
      for (std::int64_t b = 0; b < B; ++b) {
        const auto len = in.context[b].size(0);
        ctx[b].slice(0, 0, len).copy_(moved[b].slice(0, 0, len));
      }
    }
  } else {
    ctx = torch::zeros({B, c.text_len, c.text_dim}, torch::TensorOptions().dtype(cdt).device(device));
    for (std::int64_t b = 0; b < B; ++b) {
      const auto& cb = in.context[b];
      ctx[b].slice(0, 0, cb.size(0)).copy_(cb, /*non_blocking=*/true);
    }
  }
  return linear(torch::gelu(linear(ctx, text0_), "tanh"), text2_);
}

void WanDiTImpl::run_block(std::int64_t index, WanState& s) {
  WD_CHECK(index >= 0 && index < static_cast<std::int64_t>(blocks_.size()),
           "block index " << index << " outside 0.." << blocks_.size());
  const auto& blk = blocks_[index];
  // modulation + e0 in fp32 -> shift/scale/gate for attention (0-2) and FFN (3-5).
  auto m = blk.modulation.to(torch::kFloat).unsqueeze(0) + s.e0;
  const auto mod = [&](int j) { return m.select(2, j); };
  // shift + norm(x)·(1 + scale), and x + y·gate, each one fused multiply-add in fp32.
  const auto modulate = [&](const torch::Tensor& normed, int shift, int scale) {
    return torch::addcmul(mod(shift), normed.to(torch::kFloat), 1 + mod(scale));
  };
  auto x = s.x;
  x = torch::addcmul(x, self_attention(modulate(layer_norm(x), 0, 1), blk.self_attn, s), mod(2));  // fp32 from here
  auto cross_in = blk.norm3_weight.defined() ? layer_norm(x, blk.norm3_weight, blk.norm3_bias) : x;
  x = x + cross_attention(cross_in, blk.cross_attn, s);
  const auto hidden = torch::gelu(linear(modulate(layer_norm(x), 3, 4), blk.ffn0), "tanh");
  s.x = torch::addcmul(x, linear(hidden, blk.ffn2), mod(5));
}

std::vector<torch::Tensor> WanDiTImpl::block_parameters(std::int64_t index) const {
  WD_CHECK(index >= 0 && index < static_cast<std::int64_t>(blocks_.size()),
           "block index " << index << " outside 0.." << blocks_.size());
  const auto& blk = blocks_[index];
  std::vector<torch::Tensor> out;
  const auto add = [&](const torch::Tensor& t) {
    if (t.defined()) out.push_back(t);  // norm_q/k and norm3 are absent when their norm is off
  };
  const auto add_attn = [&](const Attention& a) {
    for (const auto* l : {&a.q, &a.k, &a.v, &a.o}) {
      add(l->weight);
      add(l->bias);
      add(l->down);
      add(l->up);
    }
    add(a.norm_q);
    add(a.norm_k);
  };
  add(blk.modulation);
  add_attn(blk.self_attn);
  add_attn(blk.cross_attn);
  add(blk.norm3_weight);
  add(blk.norm3_bias);
  for (const auto* l : {&blk.ffn0, &blk.ffn2}) {
    add(l->weight);
    add(l->bias);
    add(l->down);
    add(l->up);
  }
  return out;
}

torch::Tensor WanDiTImpl::unembed_tokens(const WanState& s, WanTrace* trace) {
  // Head (spec §3.10): e (not e0), fp32 throughout.
  auto m = head_modulation_.to(torch::kFloat).unsqueeze(0) + s.e.unsqueeze(2);
  auto x = s.x.to(torch::kFloat);
  auto out = linear_f32(layer_norm(x) * (1 + m.select(2, 1)) + m.select(2, 0), head_);
  if (trace) trace->head_out = out;
  return out;
}

std::vector<torch::Tensor> WanDiTImpl::unembed(const WanState& s, WanTrace* trace) {
  auto out = unembed_tokens(s, trace);
  if (s.sequence_parallel) out = s.sequence_parallel->gather_tokens(out);
  const auto& p = config_.patch_size;
  const auto C = config_.out_dim;
  std::vector<torch::Tensor> result;
  for (std::size_t b = 0; b < s.grids.size(); ++b) {
    const auto [f, h, w] = s.grids[b];
    // rows ordered (f,h,w), features (pt,ph,pw,C) -> [C, f·pt, h·ph, w·pw]
    result.push_back(out[b]
                         .slice(0, 0, f * h * w)
                         .reshape({f, h, w, p[0], p[1], p[2], C})
                         .permute({6, 0, 3, 1, 4, 2, 5})
                         .reshape({C, f * p[0], h * p[1], w * p[2]})
                         .to(torch::kFloat));
  }
  return result;
}

std::vector<torch::Tensor> WanDiTImpl::forward(const WanInputs& inputs, WanTrace* trace) {
  auto state = embed(inputs, trace);
  for (std::int64_t i = 0; i < config_.num_layers; ++i) {
    run_block(i, state);
    if (trace && i == 0) trace->block0_out = state.x;
  }
  return unembed(state, trace);
}

torch::Tensor WanDiTImpl::forward_tokens(const WanInputs& inputs) {
  auto state = embed(inputs);
  for (std::int64_t i = 0; i < config_.num_layers; ++i) run_block(i, state);
  return unembed_tokens(state);
}

}  // namespace wd
