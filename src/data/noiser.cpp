// FlowMatchingNoiser and its [noise] config: σ sampling, shift, x_t and per-token timesteps.
#include "data/noiser.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/errors.hpp"
#include "data/splitmix64.hpp"

namespace wd::data {
namespace {

// Independent draw streams per (seed, step, sample); SampleSchedule uses stream 1.
constexpr std::uint64_t kSigmaStream = 2;
constexpr std::uint64_t kNoiseStream = 3;
constexpr std::uint64_t kCleanFrameStream = 4;

std::string show(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::uint64_t key(std::uint64_t seed, std::uint64_t stream, std::int64_t step,
                  std::int64_t sample) {
  return hash_keys(seed, stream, static_cast<std::uint64_t>(step),
                   static_cast<std::uint64_t>(sample));
}

}  // namespace

void NoiseConfig::bind(OptionTable& table) {
  table.bind("noise.sampler", sampler,
             "σ distribution for training inputs: uniform (σ ~ U(0,1)) | logit-normal "
             "(σ = sigmoid(N(logit_mean, logit_std)))");
  table.bind("noise.logit_mean", logit_mean, "logit-normal sampler: mean of the normal");
  table.bind("noise.logit_std", logit_std, "logit-normal sampler: std of the normal");
  table.bind("noise.shift", shift,
             "timestep shift s applied after sampling: σ' = s·σ / (1 + (s−1)·σ); 1 = none");
  table.bind("noise.sigma_min", sigma_min, "σ is clamped to [sigma_min, sigma_max] after shift");
  table.bind("noise.sigma_max", sigma_max, "upper end of the σ clamp");
  table.bind("noise.first_frame_clean", first_frame_clean,
             "per-token (ti2v) timesteps: probability that a sample's first latent frame is "
             "clean (t = 0, x_t = x0), as Wan's masks_like; 0 = never");
}

void NoiseConfig::validate(ConfigProblems& problems) const {
  problems.check(std::isfinite(logit_mean),
                 "noise.logit_mean(" + show(logit_mean) + ") must be finite");
  problems.check(logit_std > 0 && std::isfinite(logit_std),
                 "noise.logit_std(" + show(logit_std) + ") must be > 0");
  problems.check(shift > 0 && std::isfinite(shift), "noise.shift(" + show(shift) + ") must be > 0");
  problems.check(sigma_min >= 0 && sigma_min <= 1,
                 "noise.sigma_min(" + show(sigma_min) + ") must be in [0, 1]");
  problems.check(sigma_max >= 0 && sigma_max <= 1,
                 "noise.sigma_max(" + show(sigma_max) + ") must be in [0, 1]");
  problems.check(!(sigma_min > sigma_max), "noise.sigma_min(" + show(sigma_min) +
                                               ") must be <= noise.sigma_max(" + show(sigma_max) +
                                               ")");
  problems.check(first_frame_clean >= 0 && first_frame_clean <= 1,
                 "noise.first_frame_clean(" + show(first_frame_clean) + ") must be in [0, 1]");
}

bool TimestepRange::contains(double t) const {
  if (side == kAll) return true;
  return (std::trunc(t) >= boundary_timestep) == (side == kHigh);
}

std::string TimestepRange::describe() const {
  if (side == kAll) return "every t";
  return std::string(side == kHigh ? "t >= " : "t < ") + show(boundary_timestep);
}

FlowMatchingNoiser::FlowMatchingNoiser(NoiseConfig config, std::uint64_t seed, TimestepRange range)
    : config_(std::move(config)), seed_(seed), range_(range) {
  ConfigProblems problems;
  config_.validate(problems);
  problems.throw_if_any("noise config");
  if (range_.side == TimestepRange::kAll) return;
  // A range the sampler (after shift and clamp) almost never reaches would spin: refuse it here,
  // with the keys that make it so, rather than in the middle of a run.
  std::int64_t hits = 0;
  for (std::int64_t sample = 0; sample < 256; ++sample) {
    SplitMix64 rng(key(seed_, kSigmaStream, 0, sample));
    hits += range_.contains(1000.0f * static_cast<float>(draw(rng))) ? 1 : 0;
  }
  WD_CHECK_AS(ConfigError, hits >= 3,
              "the σ distribution (noise.sampler " << config_.sampler << ", shift " << show(config_.shift)
                  << ", σ in [" << show(config_.sigma_min) << ", " << show(config_.sigma_max) << "]) puts only "
                  << hits << " of 256 draws in " << range_.describe()
                  << ", the range of student.expert: move noise.shift, noise.logit_mean or the σ clamp toward it");
}

double FlowMatchingNoiser::draw(SplitMix64& rng) const {
  double s = 0;
  if (config_.sampler == NoiseSampler::kUniform) {
    s = rng.uniform();
  } else {
    const double z = config_.logit_mean + config_.logit_std * rng.normal();
    s = 1.0 / (1.0 + std::exp(-z));
  }
  s = config_.shift * s / (1.0 + (config_.shift - 1.0) * s);
  return std::clamp(s, config_.sigma_min, config_.sigma_max);
}

double FlowMatchingNoiser::sigma(std::int64_t step, std::int64_t sample) const {
  SplitMix64 rng(key(seed_, kSigmaStream, step, sample));
  for (std::int64_t attempt = 0;; ++attempt) {
    const double s = draw(rng);  // the first draw is the σ of an unrestricted noiser
    // t as apply computes it: fp32 σ times 1000 in fp32.
    if (range_.contains(1000.0f * static_cast<float>(s))) return s;
    WD_CHECK(attempt < 100000, "noiser: no σ in " << range_.describe() << " after " << attempt << " draws");
  }
}

NoisyBatch FlowMatchingNoiser::apply(const torch::Tensor& x0,
                                     const std::vector<std::int64_t>& indices, std::int64_t step,
                                     std::int64_t per_token_seq_len,
                                     const std::array<std::int64_t, 3>& patch) const {
  WD_CHECK(x0.dim() == 5 && x0.scalar_type() == torch::kFloat,
           "noiser: x0 must be [B,C,F,H,W] float32, got " << x0.sizes() << " " << x0.scalar_type());
  const std::int64_t batch = x0.size(0);
  WD_CHECK(static_cast<std::int64_t>(indices.size()) == batch,
           "noiser: " << indices.size() << " sample indices for a batch of " << batch);
  const auto sample_shape = x0.sizes().slice(1);

  std::vector<float> sigmas(static_cast<std::size_t>(batch));
  std::vector<torch::Tensor> noise(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t sample = indices[static_cast<std::size_t>(b)];
    sigmas[static_cast<std::size_t>(b)] = static_cast<float>(sigma(step, sample));
    // A generator per (step, sample) makes ε independent of batch composition and order.
    auto gen = at::detail::createCPUGenerator(key(seed_, kNoiseStream, step, sample));
    noise[static_cast<std::size_t>(b)] =
        torch::randn(sample_shape, gen, torch::TensorOptions().dtype(torch::kFloat));
  }

  NoisyBatch out;
  out.noise = torch::stack(noise).to(x0.device());
  out.sigma = torch::tensor(sigmas, torch::kFloat).to(x0.device());
  const auto s = out.sigma.view({batch, 1, 1, 1, 1});
  out.x_t = x0 * (1 - s) + out.noise * s;
  out.t = out.sigma * 1000;
  if (per_token_seq_len <= 0) return out;

  // Per-token timesteps (spec §5, TI2V): tokens in (f, h, w) order over the patch grid,
  // right-padded with the sample's t up to S.
  const std::int64_t frames = x0.size(2), height = x0.size(3), width = x0.size(4);
  WD_CHECK(patch[0] >= 1 && patch[1] >= 1 && patch[2] >= 1 && frames % patch[0] == 0 &&
               height % patch[1] == 0 && width % patch[2] == 0,
           "noiser: latent [F,H,W] = [" << frames << "," << height << "," << width
                                        << "] is not divisible by the patch [" << patch[0] << ","
                                        << patch[1] << "," << patch[2] << "]");
  const std::int64_t frame_tokens = (height / patch[1]) * (width / patch[2]);
  const std::int64_t tokens = (frames / patch[0]) * frame_tokens;
  WD_CHECK(tokens <= per_token_seq_len, "noiser: the latent has " << tokens
                                                                  << " tokens, more than seq_len "
                                                                  << per_token_seq_len);
  out.t = out.t.view({batch, 1}).expand({batch, per_token_seq_len}).contiguous();
  for (std::int64_t b = 0; b < batch; ++b) {
    SplitMix64 rng(key(seed_, kCleanFrameStream, step, indices[static_cast<std::size_t>(b)]));
    // uniform() is in [0, 1): probability 0 never and probability 1 always fires.
    if (rng.uniform() >= config_.first_frame_clean) continue;
    // Wan samples its mask with the patch stride, so the whole first token frame gets t = 0;
    // the clean latent is frame 0 (Wan's patch is 1 frame deep, so the two coincide).
    out.t[b].narrow(0, 0, frame_tokens).zero_();
    out.x_t[b].select(1, 0).copy_(x0[b].select(1, 0));
  }
  return out;
}

}  // namespace wd::data
