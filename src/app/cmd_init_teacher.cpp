// `wan-distill init-teacher`: writes a randomly initialised DiT (or an A14B pair of experts) in
// the official on-disk layout.
#include <spdlog/spdlog.h>

#include <filesystem>

#include "app/commands.hpp"
#include "core/logging.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_experts.hpp"

namespace wd::app {

namespace {

namespace fs = std::filesystem;

struct InitTeacherConfig {
  std::string preset = "tiny";
  std::string output;
  std::string shard_size = "2GB";
  std::string dtype = "bf16";
  std::string layout = "native";
  std::uint64_t seed = 0;
  int experts = 1;
  bool overwrite = false;
  // Overrides of the preset; 0 / empty keeps the preset's value.
  std::string model_type;
  std::int64_t dim = 0, ffn_dim = 0, num_heads = 0, num_layers = 0, in_dim = 0, out_dim = 0,
               text_dim = 0, text_len = 0, freq_dim = 0;
  LogConfig log;

  void bind(OptionTable& t) {
    std::string presets;
    for (const auto& n : WanConfig::preset_names()) presets += (presets.empty() ? "" : "|") + n;
    t.bind("preset", preset, "model preset: " + presets)
        .require("output", output, "directory to create (config.json, shards, index)")
        .bind("shard-size", shard_size, "largest shard file, e.g. 2GB, 512MB, 5GiB")
        .bind("dtype", dtype, "tensor dtype on disk: fp32 | bf16 | fp16")
        .bind("layout", layout,
              "key names and config.json: native (official Wan) | diffusers (WanTransformer3DModel; "
              "with --experts 2 a pipeline folder)")
        .bind("seed", seed, "seed of the random initialisation (the high-noise expert uses seed+1)")
        .bind("experts", experts, "1: one DiT in --output; 2: the A14B layout, low_noise_model/ and "
                                  "high_noise_model/ with different weights")
        .bind("overwrite", overwrite, "replace an existing checkpoint in --output")
        .bind("model-type", model_type, "override: t2v | i2v | ti2v")
        .bind("dim", dim, "override: hidden size (0 = preset's)")
        .bind("ffn-dim", ffn_dim, "override: FFN hidden size (0 = preset's)")
        .bind("num-heads", num_heads, "override: attention heads (0 = preset's)")
        .bind("num-layers", num_layers, "override: blocks (0 = preset's)")
        .bind("in-dim", in_dim, "override: latent input channels (0 = preset's)")
        .bind("out-dim", out_dim, "override: output channels (0 = preset's)")
        .bind("text-dim", text_dim, "override: text feature size (0 = preset's)")
        .bind("text-len", text_len, "override: text tokens (0 = preset's)")
        .bind("freq-dim", freq_dim, "override: sinusoid size (0 = preset's)");
    log.bind(t);
  }

  WanConfig model_config() const {
    WanConfig c = WanConfig::preset(preset);
    if (!model_type.empty()) c.model_type = model_type;
    const auto set = [](std::int64_t& field, std::int64_t v) {
      if (v != 0) field = v;
    };
    set(c.dim, dim);
    set(c.ffn_dim, ffn_dim);
    set(c.num_heads, num_heads);
    set(c.num_layers, num_layers);
    set(c.in_dim, in_dim);
    set(c.out_dim, out_dim);
    set(c.text_dim, text_dim);
    set(c.text_len, text_len);
    set(c.freq_dim, freq_dim);
    c.validate("preset " + preset + " with overrides");
    return c;
  }
};

}  // namespace

int run_init_teacher(const std::vector<std::string>& args) {
  InitTeacherConfig cfg;
  OptionTable table("init-teacher options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    print_help("wan-distill init-teacher --output DIR [--preset NAME] [overrides] [options]",
               "Writes a randomly initialised Wan DiT (config.json, safetensors shards and index)\n"
               "in the official or the diffusers layout, one tensor at a time, so even the 14B\n"
               "presets never sit in memory. --experts 2 writes the Wan 2.2 A14B layout:\n"
               "low_noise_model/ and high_noise_model/, each a complete checkpoint with its own\n"
               "config.json; with --layout diffusers a pipeline folder instead: transformer_2/\n"
               "(low-noise), transformer/ (high-noise) and model_index.json (boundary_ratio).",
               table);
    return kExitOk;
  }
  ConfigProblems problems;
  cfg.log.validate(problems);
  problems.check(cfg.experts == 1 || cfg.experts == 2,
                 "experts(" + std::to_string(cfg.experts) + ") must be 1 or 2");
  problems.throw_if_any("init-teacher");
  init_logging(Topology::single_process(), cfg.log.level);
  const auto dtype = parse_dtype(cfg.dtype);
  const auto layout = parse_layout(cfg.layout);
  const auto shard_bytes = parse_size(cfg.shard_size, "shard-size");
  const auto config = cfg.model_config();

  const fs::path dir(cfg.output);
  const bool two = cfg.experts == 2;
  if ((fs::exists(dir / "config.json") || WanExperts::is_two_expert_dir(cfg.output)) && !cfg.overwrite) {
    throw ConfigError("output(" + cfg.output +
                      ") already holds a checkpoint; pass --overwrite to replace it");
  }
  const auto bytes = static_cast<std::uint64_t>(wan_param_count(config)) * c10::elementSize(dtype) *
                     static_cast<std::uint64_t>(cfg.experts);
  fs::create_directories(dir);
  const auto space = fs::space(dir);
  if (space.available < bytes) {
    throw Error("output(" + cfg.output + ") has " + format_bytes(space.available) +
                " free, the checkpoint needs " + format_bytes(bytes));
  }
  spdlog::info("init-teacher: {}{} ({} params, {} as {}) -> {}", two ? "2 experts of " : "",
               config.summary(), wan_param_count(config), format_bytes(bytes), dtype_name(dtype),
               cfg.output);
  if (two) {
    if (!default_expert_boundary(config.model_type)) {
      spdlog::warn("model_type {} has no Wan 2.2 boundary; opening {} as a teacher needs an explicit "
                   "boundary", config.model_type, cfg.output);
    }
    const auto r = write_random_wan_experts(cfg.output, config, dtype, shard_bytes, cfg.seed, layout);
    const auto names = WanExperts::folders(cfg.output)->names;
    spdlog::info("wrote {}/ ({} file(s), low-noise) and {}/ ({} file(s), high-noise) to {}",
                 names[0], r.low.shard_files.size(), names[1], r.high.shard_files.size(), cfg.output);
    return kExitOk;
  }
  const auto result = write_random_wan_checkpoint(cfg.output, config, dtype, shard_bytes, cfg.seed, layout);
  spdlog::info("wrote config.json, {} safetensors file(s){} to {}", result.shard_files.size(),
               result.index_file.empty() ? "" : " and " + result.index_file, cfg.output);
  return kExitOk;
}

}  // namespace wd::app
