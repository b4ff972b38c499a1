// `wan-distill forward`: runs the DiT on an inputs safetensors file (or random inputs).
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <sstream>

#include "app/commands.hpp"
#include "core/logging.hpp"
#include "model/wan_checkpoint.hpp"

namespace wd::app {

namespace {

struct ForwardConfig {
  std::string weights;
  std::string model_config;
  std::string inputs;
  std::string output;
  DtypeChoice dtype = DtypeChoice::kAuto;
  std::string latent = "1,3,16,16";
  std::uint64_t seed = 0;
  std::int64_t timestep = 500;
  LogConfig log;
  RuntimeConfig runtime;

  void bind(OptionTable& t) {
    t.require("weights", weights,
              "checkpoint directory (native or diffusers names; a diffusers pipeline folder is "
              "read through its transformer/) or .safetensors file")
        .bind("model-config", model_config,
              "config.json to use (default: the one in / beside --weights)")
        .bind("inputs", inputs,
              "inputs safetensors (x, t or t_tokens, context, context_lens, seq_len[, y]); "
              "empty = random inputs of shape --latent")
        .bind("output", output, "write `out` (or out.0, out.1, ...) to this safetensors file")
        .bind("dtype", dtype, "weight dtype (auto: as stored)")
        .bind("latent", latent, "random inputs only: B,F,H,W of the latent (C = in_dim)")
        .bind("seed", seed, "random inputs only: generator seed")
        .bind("timestep", timestep, "random inputs only: timestep t in [0, 1000]");
    log.bind(t);
    runtime.bind(t);
  }

  void validate() const {
    ConfigProblems p;
    p.check(timestep >= 0 && timestep <= 1000,
            "timestep(" + std::to_string(timestep) + ") must be in [0, 1000]");
    log.validate(p);
    runtime.validate(p);
    p.throw_if_any("forward");
  }
};

/// Collects `key` or `key.0`, `key.1`, ... from an inputs file.
std::vector<torch::Tensor> sample_list(const SafetensorsFile& f, const std::string& key) {
  std::vector<torch::Tensor> out;
  if (f.contains(key)) {
    auto t = f.tensor(key);
    for (std::int64_t b = 0; b < t.size(0); ++b) out.push_back(t[b]);
    return out;
  }
  for (int b = 0; f.contains(key + "." + std::to_string(b)); ++b) {
    out.push_back(f.tensor(key + "." + std::to_string(b)));
  }
  return out;
}

WanInputs read_inputs(const std::string& path, const WanConfig& config) {
  const auto f = SafetensorsFile::open(path);
  WanInputs in;
  in.x = sample_list(f, "x");
  WD_CHECK_DATA(!in.x.empty(), path, "x", "missing: expected x [B,C,F,H,W] or x.0, x.1, ...");
  const auto B = static_cast<std::int64_t>(in.x.size());
  in.y = sample_list(f, "y");
  WD_CHECK_DATA(config.model_type != "i2v" || in.y.size() == in.x.size(), path, "y",
                "needs one entry per sample for an i2v model (mask + image latent channels)");
  if (f.contains("t_tokens")) {
    in.t = f.tensor("t_tokens", torch::kFloat);
  } else {
    WD_CHECK_DATA(f.contains("t"), path, "t", "missing: expected t [B] or t_tokens [B,S]");
    in.t = f.tensor("t", torch::kFloat);
  }
  WD_CHECK_DATA(f.contains("context"), path, "context", "missing: expected [B,L,text_dim]");
  const auto ctx = f.tensor("context");
  WD_CHECK_DATA(ctx.dim() == 3 && ctx.size(0) == B, path, "context",
                "must be [B=" + std::to_string(B) + ",L,text_dim]");
  torch::Tensor lens;
  if (f.contains("context_lens")) lens = f.tensor("context_lens", torch::kLong);
  WD_CHECK_DATA(!lens.defined() || lens.numel() == B, path, "context_lens",
                "must have " + std::to_string(B) + " entries");
  for (std::int64_t b = 0; b < B; ++b) {
    const auto len = lens.defined() ? lens[b].item<std::int64_t>() : ctx.size(1);
    WD_CHECK_DATA(len >= 0 && len <= ctx.size(1), path, "context_lens",
                  "entry " + std::to_string(b) + " = " + std::to_string(len) + " is outside 0.." +
                      std::to_string(ctx.size(1)));
    in.context.push_back(ctx[b].slice(0, 0, len));
  }
  if (f.contains("seq_len")) in.seq_len = f.tensor("seq_len", torch::kLong).item<std::int64_t>();
  return in;
}

WanInputs random_inputs(const ForwardConfig& cfg, const WanConfig& config) {
  const auto d = parse_dims(cfg.latent, 4, "latent");
  auto gen = at::detail::createCPUGenerator(cfg.seed);
  const auto y_ch = config.model_type == "i2v" ? config.in_dim - config.out_dim : 0;
  WanInputs in;
  for (std::int64_t b = 0; b < d[0]; ++b) {
    in.x.push_back(torch::randn({config.in_dim - y_ch, d[1], d[2], d[3]}, gen));
    if (y_ch > 0) in.y.push_back(torch::randn({y_ch, d[1], d[2], d[3]}, gen));
    in.context.push_back(torch::randn({config.text_len, config.text_dim}, gen));
  }
  in.t = torch::full({d[0]}, static_cast<float>(cfg.timestep));
  return in;
}

}  // namespace

int run_forward(const std::vector<std::string>& args) {
  ForwardConfig cfg;
  OptionTable table("forward options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    print_help("wan-distill forward --weights PATH [--inputs FILE] [--output FILE] [options]",
               "Runs the Wan DiT once and reports (and optionally writes) its output.", table);
    return kExitOk;
  }
  cfg.validate();
  init_logging(Topology::single_process(), cfg.log.level);
  cfg.runtime.apply();

  const auto ck = WanCheckpoint::open(cfg.weights, cfg.model_config);
  const auto dtype = dtype_of(cfg.dtype);
  auto model = load_wan_dit(ck, dtype);
  spdlog::info("model: {} ({} layout)", ck.config().summary(), layout_name(ck.layout()));

  const auto inputs = cfg.inputs.empty() ? random_inputs(cfg, ck.config()) : read_inputs(cfg.inputs, ck.config());
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const auto out = model->forward(inputs);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::int64_t tokens = 0;
  bool same_shape = true;
  for (const auto& o : out) {
    tokens += o.numel() / (ck.config().out_dim * ck.config().patch_volume());
    same_shape = same_shape && o.sizes() == out.front().sizes();
  }
  for (std::size_t b = 0; b < out.size(); ++b) {
    spdlog::info("out[{}]: shape {} mean {:.6f} std {:.6f} max|.| {:.6f}", b,
                 c10::str(out[b].sizes()), out[b].mean().item<double>(),
                 out[b].std().item<double>(), out[b].abs().max().item<double>());
  }
  spdlog::info("forward: {} sample(s), {} tokens in {:.3f} s ({:.0f} tokens/s, weights {})",
               out.size(), tokens, secs, tokens / secs, dtype_name(model->dtype()));
  if (!cfg.output.empty()) {
    TensorMap tensors;
    if (same_shape) {
      tensors["out"] = torch::stack(out);
    } else {
      for (std::size_t b = 0; b < out.size(); ++b) tensors["out." + std::to_string(b)] = out[b];
    }
    write_safetensors(cfg.output, tensors,
                      {{"weights", cfg.weights}, {"dtype", dtype_name(model->dtype())}});
    spdlog::info("wrote {}", cfg.output);
  }
  return kExitOk;
}

}  // namespace wd::app
