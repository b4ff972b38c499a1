// Opening and checking a two-expert (A14B) teacher, routing samples by timestep, the reference
// MoE forward, and writing random two-expert checkpoints.
#include "model/wan_experts.hpp"

#include "model/wan_lora.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "model/diffusers_pipeline.hpp"
#include "model/official_samplers.hpp"

namespace wd {

namespace fs = std::filesystem;

namespace {

std::string format_indices(const std::vector<std::int64_t>& v) {
  std::string out;
  for (const auto i : v) out += (out.empty() ? "" : ",") + std::to_string(i);
  return "[" + out + "]";
}

}  // namespace

std::optional<double> default_expert_boundary(const std::string& model_type) {
  const auto* official = official_sampler(model_type, 2);
  return official ? official->boundary : std::nullopt;
}

void check_same_architecture(const WanConfig& low, const std::string& low_path,
                             const WanConfig& high, const std::string& high_path) {
  const auto diffs = low.differences(high);
  if (diffs.empty()) return;
  std::string msg = "the experts must share one architecture, but " + low_path + " and " +
                    high_path + " differ in " + std::to_string(diffs.size()) +
                    " field(s) (low vs high):";
  for (const auto& d : diffs) msg += "\n  - " + d.field + " " + d.mine + " vs " + d.other;
  throw DataError(low_path, "", msg);
}

std::optional<WanExperts::Folders> WanExperts::folders(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::is_directory(p, ec)) return std::nullopt;
  if (fs::is_directory(p / kHighDir, ec) || fs::is_directory(p / kLowDir, ec)) {
    return Folders{{kLowDir, kHighDir}, std::nullopt};
  }
  if (!DiffusersPipeline::is_pipeline_dir(path)) return std::nullopt;
  const auto pipeline = DiffusersPipeline::read(path);
  if (!pipeline.two_experts) return std::nullopt;
  return Folders{{DiffusersPipeline::kTransformer2, DiffusersPipeline::kTransformer},
                 pipeline.boundary_ratio};
}

bool WanExperts::is_two_expert_dir(const std::string& path) { return folders(path).has_value(); }

WanExperts WanExperts::open(const std::string& path, std::optional<double> boundary,
                            const std::string& config_path) {
  const auto sub = folders(path);
  if (!sub) {
    std::vector<WanCheckpoint> one;
    one.push_back(WanCheckpoint::open(path, config_path));
    return from_checkpoints(std::move(one), boundary, path);
  }
  const auto& [low, high] = sub->names;
  if (!config_path.empty()) {
    throw ConfigError("model_config(" + config_path + ") cannot be used with the two-expert folder " +
                      path + ": each expert reads its own " + low + "/config.json and " + high +
                      "/config.json");
  }
  const fs::path p(path);
  for (const auto& name : sub->names) {
    if (!fs::is_directory(p / name)) {
      throw DataError(path, name,
                      "is missing: a two-expert (A14B) checkpoint needs both " + low + "/ and " +
                          high + "/ (found only " + (name == low ? high : low) + "/)");
    }
  }
  std::vector<WanCheckpoint> both;
  both.push_back(WanCheckpoint::open((p / low).string()));
  both.push_back(WanCheckpoint::open((p / high).string()));
  // A LoRA pair (one student.expert run per expert): each must adapt the expert whose place it takes.
  auto recorded = sub->boundary;
  std::string recorded_in = path;
  if (both[0].lora() && both[1].lora()) {
    check_lora_pair(*both[0].lora(), *both[1].lora(), path);
    // Its boundary is its teacher's, the folder holding both bases, when that records one.
    auto base = fs::path(both[kHigh].lora()->base).lexically_normal();
    if (!base.has_filename()) base = base.parent_path();
    const auto teacher = folders(base.parent_path().string());
    if (!recorded && teacher && teacher->boundary) {
      recorded = teacher->boundary;
      recorded_in = base.parent_path().string();
    }
  }
  auto out = from_checkpoints(std::move(both), boundary ? boundary : recorded, path);
  out.names_ = sub->names;
  if (!boundary && recorded) out.boundary_origin_ = "the boundary_ratio of " + recorded_in + "/model_index.json";
  return out;
}

WanExperts WanExperts::from_checkpoints(std::vector<WanCheckpoint> experts,
                                        std::optional<double> boundary, const std::string& path) {
  WD_CHECK_AS(ConfigError, experts.size() == 1 || experts.size() == 2,
              path << ": a teacher has 1 or 2 experts, got " << experts.size());
  if (boundary) {
    WD_CHECK_AS(ConfigError, *boundary > 0.0 && *boundary < 1.0,
                "boundary(" << *boundary << ") for " << path << " must lie in (0, 1)");
  }
  WanExperts out;
  out.path_ = path;
  out.experts_ = std::move(experts);
  const auto& type = out.experts_.front().config().model_type;
  if (out.two_experts()) {
    check_same_architecture(out.experts_[kLow].config(), out.experts_[kLow].config_path(),
                            out.experts_[kHigh].config(), out.experts_[kHigh].config_path());
    const auto fallback = default_expert_boundary(type);
    if (!boundary && !fallback) {
      throw ConfigError("boundary of the two-expert checkpoint " + path +
                        " is not set: model_type(" + type +
                        ") has no Wan 2.2 default (t2v 0.875, i2v 0.9); set teacher.boundary "
                        "explicitly (0 < boundary < 1)");
    }
    out.boundary_ = boundary ? *boundary : *fallback;
    out.boundary_origin_ = boundary ? "set explicitly" : "the official " + describe(*official_sampler(type, 2)) + "'s";
  } else {
    // One expert serves every timestep; the value is only reported.
    out.boundary_ = boundary ? *boundary : default_expert_boundary(type).value_or(0.0);
  }
  return out;
}

std::string WanExperts::expert_name(std::size_t i) const {
  if (!two_experts()) return "model";
  return names_.at(i);
}

std::size_t WanExperts::expert_for(double t) const {
  if (!two_experts()) return 0;
  WD_CHECK_AS(ConfigError, std::isfinite(t) && t >= 0.0,
              "timestep " << t << " for the experts of " << path_ << " must be finite and >= 0");
  // The official sampler hands the model int64(σ'·1000) and compares that with boundary·1000;
  // truncating here makes t = 874.9 go to the low-noise expert exactly as it does there.
  return std::trunc(t) >= boundary_timestep() ? kHigh : kLow;
}

std::vector<std::vector<std::int64_t>> WanExperts::route(const torch::Tensor& t) const {
  WD_CHECK_AS(
      ConfigError, t.defined() && (t.dim() == 1 || t.dim() == 2),
      "routing needs t as [B] or [B,S], got " << (t.defined() ? format_shape(t.sizes()) : "none"));
  const auto B = t.size(0);
  std::vector<std::vector<std::int64_t>> out(size());
  if (!two_experts()) {
    for (std::int64_t b = 0; b < B; ++b) out[0].push_back(b);
    return out;
  }
  auto tt = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  if (tt.dim() == 2) {
    WD_CHECK_AS(ConfigError, tt.size(1) >= 1,
                "per-token t " << format_shape(t.sizes()) << " has no tokens");
    const auto varies = (tt != tt.select(1, 0).unsqueeze(1)).any(1);
    for (std::int64_t b = 0; b < B; ++b) {
      WD_CHECK_AS(
          ConfigError, !varies[b].item<bool>(),
          "sample " << b
                    << " has per-token timesteps that vary across its tokens; the "
                       "two-expert teacher "
                    << path_
                    << " routes whole samples by one timestep (the A14B "
                       "pipelines pass one t per sample, per-token t is TI2V-5B's, a dense model)");
    }
    tt = tt.select(1, 0).contiguous();
  }
  const auto* v = tt.data_ptr<double>();
  for (std::int64_t b = 0; b < B; ++b) out[expert_for(v[b])].push_back(b);
  return out;
}

WanInputs select_samples(const WanInputs& in, const std::vector<std::int64_t>& samples,
                         const std::array<std::int64_t, 3>& patch) {
  const auto B = static_cast<std::int64_t>(in.x.size());
  WD_CHECK(in.context.size() == in.x.size() && (in.y.empty() || in.y.size() == in.x.size()),
           "inputs hold " << in.x.size() << " latents, " << in.context.size() << " contexts and "
                          << in.y.size() << " y tensors");
  WD_CHECK(in.t.defined() && in.t.size(0) == B,
           "t " << (in.t.defined() ? format_shape(in.t.sizes()) : "none") << " does not have the "
                << B << " rows of the batch");
  WanInputs out;
  out.seq_len = in.seq_len;
  out.sequence_parallel = in.sequence_parallel;  // a group routes its samples alike on every rank
  if (out.seq_len == 0) {
    // The full batch pads every sample to its largest token count; a subset must pad the same
    // way, or its samples would not equal their rows of the full batch.
    for (const auto& x : in.x) {
      std::int64_t tokens = 1;
      for (int a = 0; a < 3; ++a) tokens *= x.size(a + 1) / patch[a];
      out.seq_len = std::max(out.seq_len, tokens);
    }
  }
  for (const auto s : samples) {
    WD_CHECK(s >= 0 && s < B, "sample index " << s << " is outside the batch of " << B);
    out.x.push_back(in.x[s]);
    if (!in.y.empty()) out.y.push_back(in.y[s]);
    out.context.push_back(in.context[s]);
  }
  const auto index = torch::tensor(samples, torch::kLong).to(in.t.device());
  out.t = in.t.index_select(0, index);
  return out;
}

namespace {

/// Checks that `routes` partition 0..batch-1 (each index once).
void check_partition(const std::vector<std::vector<std::int64_t>>& routes, std::int64_t batch) {
  std::vector<int> seen(static_cast<std::size_t>(batch), 0);
  for (std::size_t e = 0; e < routes.size(); ++e) {
    for (const auto i : routes[e]) {
      WD_CHECK(i >= 0 && i < batch, "expert " << e << " route " << format_indices(routes[e])
                                              << " names sample " << i << " of a batch of "
                                              << batch);
      WD_CHECK(++seen[static_cast<std::size_t>(i)] == 1,
               "sample " << i << " is routed to more than one expert");
    }
  }
  for (std::int64_t i = 0; i < batch; ++i) {
    WD_CHECK(seen[static_cast<std::size_t>(i)] == 1, "sample " << i << " is routed to no expert");
  }
}

}  // namespace

std::vector<torch::Tensor> merge_expert_outputs(
    const std::vector<std::vector<std::int64_t>>& routes,
    const std::vector<std::vector<torch::Tensor>>& outputs, std::int64_t batch) {
  WD_CHECK(routes.size() == outputs.size(),
           routes.size() << " routes but outputs of " << outputs.size() << " experts");
  check_partition(routes, batch);
  std::vector<torch::Tensor> merged(static_cast<std::size_t>(batch));
  for (std::size_t e = 0; e < routes.size(); ++e) {
    WD_CHECK(routes[e].size() == outputs[e].size(),
             "expert " << e << " returned " << outputs[e].size() << " outputs for its "
                       << routes[e].size() << " samples");
    for (std::size_t j = 0; j < routes[e].size(); ++j) {
      merged[static_cast<std::size_t>(routes[e][j])] = outputs[e][j];
    }
  }
  return merged;
}

torch::Tensor merge_expert_batches(const std::vector<std::vector<std::int64_t>>& routes,
                                   const std::vector<torch::Tensor>& outputs, std::int64_t batch) {
  WD_CHECK(routes.size() == outputs.size(),
           routes.size() << " routes but outputs of " << outputs.size() << " experts");
  check_partition(routes, batch);
  torch::Tensor merged;
  for (std::size_t e = 0; e < routes.size(); ++e) {
    if (routes[e].empty()) continue;
    const auto& o = outputs[e];
    WD_CHECK(
        o.defined() && o.dim() >= 1 && o.size(0) == static_cast<std::int64_t>(routes[e].size()),
        "expert " << e << " output " << (o.defined() ? format_shape(o.sizes()) : "none")
                  << " does not have its " << routes[e].size() << " samples as rows");
    if (!merged.defined()) {
      auto shape = o.sizes().vec();
      shape[0] = batch;
      merged = torch::empty(shape, o.options());
    }
    WD_CHECK(o.sizes().slice(1) == merged.sizes().slice(1) && o.dtype() == merged.dtype(),
             "expert " << e << " output " << format_shape(o.sizes())
                       << " differs in shape or dtype "
                       << "from the other expert's " << format_shape(merged.sizes()));
    merged.index_copy_(0, torch::tensor(routes[e], torch::kLong).to(o.device()), o);
  }
  return merged;
}

std::vector<WanDiT> load_wan_experts(const WanExperts& experts,
                                     std::optional<c10::ScalarType> dtype,
                                     const torch::Device& device) {
  std::vector<WanDiT> models;
  for (const auto& ck : experts.experts()) models.push_back(load_wan_dit(ck, dtype, device));
  return models;
}

std::vector<torch::Tensor> routed_forward(const std::vector<std::vector<std::int64_t>>& routes,
                                          const WanInputs& inputs, const std::array<std::int64_t, 3>& patch,
                                          const ExpertForward& forward) {
  std::vector<std::vector<torch::Tensor>> outputs(routes.size());
  for (std::size_t e = 0; e < routes.size(); ++e) {
    if (!routes[e].empty()) outputs[e] = forward(e, select_samples(inputs, routes[e], patch));
  }
  return merge_expert_outputs(routes, outputs, static_cast<std::int64_t>(inputs.x.size()));
}

std::vector<torch::Tensor> experts_forward(std::vector<WanDiT>& models, const WanExperts& experts,
                                           const WanInputs& inputs) {
  WD_CHECK(models.size() == experts.size(), models.size() << " models for the " << experts.size()
                                                          << " experts of " << experts.path());
  return routed_forward(experts.route(inputs.t), inputs, experts.config().patch_size,
                        [&](std::size_t e, const WanInputs& in) { return models[e]->forward(in); });
}

ExpertsWriteResult write_random_wan_experts(const std::string& dir, const WanConfig& config,
                                            c10::ScalarType dtype, std::uint64_t shard_bytes,
                                            std::uint64_t seed, KeyLayout layout) {
  const fs::path p(dir);
  const bool diffusers = layout == KeyLayout::kDiffusers;
  ExpertsWriteResult r;
  r.low = write_random_wan_checkpoint(
      (p / (diffusers ? DiffusersPipeline::kTransformer2 : WanExperts::kLowDir)).string(), config,
      dtype, shard_bytes, seed, layout);
  r.high = write_random_wan_checkpoint(
      (p / (diffusers ? DiffusersPipeline::kTransformer : WanExperts::kHighDir)).string(), config,
      dtype, shard_bytes, seed + 1, layout);
  // Last, so that the folder is recognised as a pipeline only once both experts are in it.
  if (diffusers) {
    write_diffusers_model_index(dir, config, true, default_expert_boundary(config.model_type));
  }
  return r;
}

}  // namespace wd
