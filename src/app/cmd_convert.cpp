// `wan-distill convert`: rewrites a DiT checkpoint once in another dtype (bf16 for teachers) and
// layout (native, diffusers for WanTransformer3DModel.from_pretrained, a diffusers pipeline folder,
// or a LoRA student's LoRA files); a two-expert model (an A14B teacher, a LoRA pair merged) whole.
#include <spdlog/spdlog.h>

#include "app/commands.hpp"
#include "core/logging.hpp"
#include "model/wan_convert.hpp"
#include "model/wan_experts.hpp"
#include "model/wan_lora.hpp"

#include <unistd.h>

#include <filesystem>
#include <optional>

namespace wd::app {

namespace {

/// convert --layout: what the output folder is.
enum class ConvertLayout {
  kNative,     ///< the official Wan key names and config.json
  kDiffusers,  ///< a WanTransformer3DModel folder (diffusers' key names and config.json)
  kPipeline,   ///< a diffusers pipeline folder: model_index.json and the diffusers DiT in transformer/
  kLora,       ///< a LoRA student's adapters as the diffusers and ComfyUI LoRA files
};

const std::vector<std::pair<ConvertLayout, const char*>>& choices(ConvertLayout) {
  static const std::vector<std::pair<ConvertLayout, const char*>> names{{ConvertLayout::kNative, "native"},
                                                                        {ConvertLayout::kDiffusers, "diffusers"},
                                                                        {ConvertLayout::kPipeline, "pipeline"},
                                                                        {ConvertLayout::kLora, "lora"}};
  return names;
}

struct ConvertConfig {
  std::string input;
  std::string output;
  std::string model_config;
  std::string dtype = "bf16";
  std::string layout = "native";  // a ConvertLayout, parsed in validate() to name every bad value at once
  std::string shard_size = "5GB";
  double boundary = 0.0;  // 0: the teacher's
  bool keep_fp32 = true;
  bool force = false;
  LogConfig log;

  void bind(OptionTable& t) {
    t.require("input", input,
              "checkpoint to read: directory (index + shards, or one file) or a .safetensors "
              "file; native, diffusers or ComfyUI-prefixed key names")
        .require("output", output, "directory to create (must not exist unless --force)")
        .bind("model-config", model_config, "config.json of the input (default: in / beside it)")
        .bind("dtype", dtype, "dtype to write: bf16 | fp16 | fp32")
        .bind("layout", layout,
              "what to write: native (official Wan) | diffusers "
              "(WanTransformer3DModel.from_pretrained(DIR) loads it) | pipeline (a diffusers pipeline folder: "
              "model_index.json and the diffusers DiT in DIR/transformer/; WanImageToVideoPipeline for an i2v "
              "model, expand_timesteps for a ti2v one; a two-expert input or LoRA pair: transformer/ the high-noise "
              "expert, transformer_2/ the low-noise one, and boundary_ratio) | lora (the input a LoRA student folder: DIR/" +
                  std::string(kDiffusersLoraFile) + " for diffusers' load_lora_weights and DIR/" + kComfyLoraFile +
                  " for ComfyUI's LoRA loader; any other layout writes the merged model)")
        .bind("shard-size", shard_size, "largest shard file, e.g. 5GB, 512MB, 2GiB")
        .bind("boundary", boundary,
              "a two-expert input with --layout pipeline: the boundary_ratio model_index.json records (0 = the "
              "teacher's: its pipeline's boundary_ratio, else its model type's, t2v 0.875, i2v 0.9)")
        .bind("keep-fp32", keep_fp32,
              "keep fp32 the tensors the model only uses in fp32 (time MLP, time projection, "
              "modulations, cross-attn LayerNorms, head); false = everything in --dtype")
        .bind("force", force, "replace an existing --output (swapped in atomically when done)");
    log.bind(t);
  }

  /// --layout as its choice; a ConfigError naming the value and the choices.
  ConvertLayout layout_choice() const { return parse_choice<ConvertLayout>("layout", layout); }

  /// Every bad value, named with its value, in one error.
  ConvertOptions validate() const {
    ConfigProblems problems;
    ConvertOptions options;
    options.keep_fp32 = keep_fp32;
    options.force = force;
    try {
      options.dtype = parse_dtype(dtype);
    } catch (const ConfigError& e) {
      problems.check(false, e.what());
    }
    try {
      const auto kind = layout_choice();
      options.layout = kind == ConvertLayout::kNative ? KeyLayout::kNative : KeyLayout::kDiffusers;
      options.pipeline = kind == ConvertLayout::kPipeline;
    } catch (const ConfigError& e) {
      problems.check(false, e.what());
    }
    try {
      options.shard_bytes = parse_size(shard_size, "shard-size");
      problems.check(options.shard_bytes > 0, "shard-size(" + shard_size + ") must be > 0");
    } catch (const ConfigError& e) {
      problems.check(false, e.what());
    }
    problems.check(boundary >= 0 && boundary < 1, fmt::format("boundary({}) must be in [0, 1)", boundary));
    log.validate(problems);
    problems.throw_if_any("convert");
    return options;
  }
};

/// --layout lora: the adapters of a LoRA student folder in the ecosystem's two layouts, written
/// into a temporary directory renamed to `output` when complete. A two-expert LoRA pair (the
/// folders of a student.expert high and a low run, as high_noise_model/ and low_noise_model/)
/// gives the pair: the same two files in OUTPUT/high_noise_model/ and OUTPUT/low_noise_model/.
void export_lora(const ConvertConfig& cfg, c10::ScalarType dtype) {
  const bool pair = is_lora_pair(cfg.input);
  WD_CHECK_AS(ConfigError, pair || is_lora_folder(cfg.input),
              "convert --layout lora reads a LoRA student folder (RUN_DIR/student of a run with student.lora_rank > 0) "
              "or a two-expert LoRA pair (" << WanExperts::kHighDir << "/ and " << WanExperts::kLowDir
                                            << "/ LoRA folders); " << cfg.input << " has no " << kLoraJson);
  namespace fs = std::filesystem;
  WD_CHECK_AS(ConfigError, cfg.force || !fs::exists(cfg.output),
              "--output " << cfg.output << " exists; pass --force to replace it");
  std::vector<std::pair<std::string, LoraFolder>> parts;  // (subfolder of the output, LoRA)
  if (pair) {
    auto both = read_lora_pair(cfg.input);
    parts.emplace_back(WanExperts::kHighDir, std::move(both[1]));
    parts.emplace_back(WanExperts::kLowDir, std::move(both[0]));
  } else {
    parts.emplace_back("", read_lora_folder(cfg.input));
  }
  const auto tmp = cfg.output + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  for (const auto& [sub, lora] : parts) {
    const auto dir = (fs::path(tmp) / sub).string();
    fs::create_directories(dir);
    write_lora_exports(lora, dir, dtype);
  }
  if (fs::exists(cfg.output)) fs::remove_all(cfg.output);
  fs::rename(tmp, cfg.output);
  for (const auto& [sub, lora] : parts) {
    const auto dir = (fs::path(cfg.output) / sub).string();
    spdlog::info("convert: LoRA of {} (rank {}, alpha {}, {} linears, base {}) -> {}/{} (diffusers) and {}/{} "
                 "(ComfyUI), {}, the scale alpha/rank folded into the up matrices",
                 lora.dir, lora.spec.rank, lora.spec.alpha, lora.adapters.size(), lora.base, dir, kDiffusersLoraFile,
                 dir, kComfyLoraFile, dtype_name(dtype));
  }
}

/// A two-expert input (an A14B teacher, or a LoRA pair: each expert its base with its adapters
/// merged in fp32) as one folder of both experts: --layout pipeline (transformer/ the high-noise
/// expert, transformer_2/ the low-noise one, model_index.json with the boundary) or native.
void convert_experts(const ConvertConfig& cfg, const ConvertOptions& options) {
  const auto experts = WanExperts::open(cfg.input, cfg.boundary > 0 ? std::optional<double>(cfg.boundary) : std::nullopt,
                                         cfg.model_config);
  const auto* high = experts.expert(WanExperts::kHigh).lora();
  const auto* low = experts.expert(WanExperts::kLow).lora();
  if (high && low) {
    spdlog::info("convert: {} is a LoRA pair: writing each expert's base ({}, {}) with its adapters merged",
                 cfg.input, high->base, low->base);
  }
  spdlog::info("convert: two experts, boundary {} ({})", experts.boundary(),
               cfg.boundary > 0 ? "--boundary" : experts.boundary_origin());
  const auto results = convert_wan_experts(experts, cfg.output, options);
  for (std::size_t i : {WanExperts::kHigh, WanExperts::kLow}) {
    if (results[i].kept_fp32 == 0) continue;
    spdlog::info("convert: {}: {} of {} tensors kept in fp32 ({} of input); the rest are {}", experts.expert_name(i),
                 results[i].kept_fp32, results[i].tensors,
                 format_bytes(static_cast<double>(results[i].kept_fp32_bytes)), dtype_name(options.dtype));
  }
}

}  // namespace

int run_convert(const std::vector<std::string>& args) {
  ConvertConfig cfg;
  OptionTable table("convert options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    print_help(
        "wan-distill convert --input PATH --output DIR [--dtype bf16] [--layout native|diffusers|pipeline] "
        "[--shard-size 5GB] [--force]\n"
        "       wan-distill convert --input A14B|LORA_PAIR --output DIR --layout pipeline|native [--boundary B]\n"
        "       wan-distill convert --input RUN_DIR/student|LORA_PAIR --output DIR --layout lora [--dtype fp32]",
        "Rewrites a Wan DiT checkpoint (e.g. the official fp32 one, or a trained student's\n"
        "RUN_DIR/student) in another dtype and key layout, once: bf16 so that teachers map\n"
        "weights straight from the file; --layout diffusers for diffusers, whose\n"
        "WanTransformer3DModel.from_pretrained(DIR) loads the result (config.json in its field\n"
        "names, its key names); --layout pipeline for a diffusers pipeline folder (model_index.json,\n"
        "the DiT in DIR/transformer/): WanImageToVideoPipeline.from_pretrained(DIR, vae=..., ...)\n"
        "for an i2v model. Writes config.json, safetensors shards and, when sharded, their\n"
        "index, one shard at a time (memory stays about one shard), into a temporary directory\n"
        "renamed to DIR when complete. By default the tensors the model uses only in fp32 stay\n"
        "fp32 (spec section 6; docs/placement.md). A LoRA student folder (student.lora_rank) is\n"
        "written merged (base + adapters, merged in fp32), or with --layout lora as the LoRA files\n"
        "diffusers and ComfyUI load on top of the base (docs/lora.md).\n"
        "A two-expert input (an A14B teacher, or a LoRA pair: high_noise_model/ and\n"
        "low_noise_model/ LoRA folders, as a LoRA pair run writes RUN_DIR/student) is written whole:\n"
        "--layout pipeline as Wan2.2-T2V/I2V-A14B-Diffusers, transformer/ the high-noise expert,\n"
        "transformer_2/ the low-noise one, each merged with its adapters, and model_index.json with\n"
        "the teacher's boundary_ratio (WanPipeline / WanImageToVideoPipeline.from_pretrained(DIR));\n"
        "--layout native as the official high_noise_model/ and low_noise_model/; --layout lora as\n"
        "one folder of LoRA files per expert. Exit codes: 2 bad options, existing output or a\n"
        "model the layout cannot express, 3 bad input checkpoint.",
        table);
    return kExitOk;
  }
  const auto options = cfg.validate();
  init_logging(Topology::single_process(), cfg.log.level);
  const auto layout = cfg.layout_choice();
  if (layout == ConvertLayout::kLora) {
    export_lora(cfg, options.dtype);
    return kExitOk;
  }
  if (WanExperts::is_two_expert_dir(cfg.input)) {
    convert_experts(cfg, options);
    return kExitOk;
  }
  const auto input = WanCheckpoint::open(cfg.input, cfg.model_config);
  if (input.lora()) {
    spdlog::info("convert: {} is a LoRA student folder: writing its base {} with the adapters merged", cfg.input,
                 input.lora()->base);
  }
  if (layout == ConvertLayout::kDiffusers && input.config().model_type != "t2v") {
    spdlog::info("convert: {} is model_type {}; --layout pipeline writes it as a diffusers pipeline folder, whose "
                 "model_index.json tells diffusers how to sample it ({})", cfg.input, input.config().model_type,
                 input.config().model_type == "i2v" ? "WanImageToVideoPipeline" : "expand_timesteps: true");
  }
  const auto result = convert_wan_checkpoint(input, cfg.output, options);
  if (result.kept_fp32 > 0) {
    spdlog::info("convert: {} of {} tensors kept in fp32 ({} of input); the rest are {}",
                 result.kept_fp32, result.tensors,
                 format_bytes(static_cast<double>(result.kept_fp32_bytes)), dtype_name(options.dtype));
  }
  return kExitOk;
}

}  // namespace wd::app
