// LoRA student folders, ecosystem LoRA files, import.
#include "model/wan_lora.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.hpp"
#include "model/diffusers_pipeline.hpp"
#include "model/safetensors.hpp"
#include "model/wan_experts.hpp"
#include "model/wan_keys.hpp"

namespace wd {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kLoraFormat = "wan-distill-lora";
constexpr int kLoraVersion = 1;

bool lora_ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// A key of a LoRA file split into the native linear and which half: "down", "up" or "alpha".
struct KeyParts {
  std::string linear, half;
};

std::optional<KeyParts> split_lora_key(const std::string& key) {
  static const std::vector<std::pair<std::string, std::string>> kSuffixes = {
      {".lora_down", "down"},        {".lora_up", "up"},              // ours
      {".lora_A.weight", "down"},    {".lora_B.weight", "up"},        // diffusers / peft
      {".lora_A.default.weight", "down"}, {".lora_B.default.weight", "up"},  // peft with its adapter name
      {".lora_down.weight", "down"}, {".lora_up.weight", "up"},       // ComfyUI / kohya
      {".alpha", "alpha"}};
  for (const auto& [suffix, half] : kSuffixes) {
    if (!lora_ends_with(key, suffix)) continue;
    std::string stem = key.substr(0, key.size() - suffix.size());
    for (const char* prefix : {"transformer.", "diffusion_model.", "model.diffusion_model.", "base_model.model."}) {
      if (stem.rfind(prefix, 0) == 0) {
        stem = stem.substr(std::string(prefix).size());
        break;
      }
    }
    if (looks_like_diffusers(stem + ".weight")) {
      const auto native = diffusers_to_native(stem + ".weight");
      if (!native) return std::nullopt;
      stem = native->substr(0, native->size() - 7);
    }
    return KeyParts{stem, half};
  }
  return std::nullopt;
}

}  // namespace

torch::Tensor LoraFolder::merged(const std::string& linear, const torch::Tensor& weight) const {
  const auto& [down, up] = adapters.at(linear);
  return weight.to(torch::kFloat) + spec.scale() * torch::mm(up.to(torch::kFloat), down.to(torch::kFloat));
}

bool is_lora_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / kLoraJson, ec);
}

void write_lora_folder(const WanDiTImpl& model, const std::string& dir, const std::string& base) {
  const auto& spec = model.lora();
  WD_CHECK(spec.rank > 0, "write_lora_folder: the model has no adapters");
  fs::create_directories(dir);
  TensorMap tensors;
  for (const auto& [name, t] : model.lora_parameters()) tensors[name] = t.detach().to(torch::kFloat).cpu();
  write_safetensors((fs::path(dir) / kLoraAdapters).string(), tensors,
                    {{"format", "pt"}, {"producer", "wan-distill train"}});
  json meta = {{"format", kLoraFormat},        {"version", kLoraVersion},   {"base", fs::absolute(base).string()},
               {"rank", spec.rank},        {"alpha", spec.alpha},   {"targets", spec.targets},
               {"adapters", kLoraAdapters}, {"model", json::parse(model.config().to_json())}};
  write_file_atomically((fs::path(dir) / kLoraJson).string(), meta.dump(2) + "\n");
}

bool is_lora_pair(const std::string& dir) {
  const auto sub = WanExperts::folders(dir);
  if (!sub) return false;
  const fs::path p(dir);
  return is_lora_folder((p / sub->names[0]).string()) && is_lora_folder((p / sub->names[1]).string());
}

void check_lora_pair(const LoraFolder& low, const LoraFolder& high, const std::string& dir) {
  const auto clean = [](const std::string& path) {
    auto p = fs::path(path).lexically_normal();
    return p.has_filename() ? p : p.parent_path();
  };
  const auto bl = clean(low.base), bh = clean(high.base);
  const auto json = [](const LoraFolder& f) { return (fs::path(f.dir) / kLoraJson).string(); };
  if (bl.parent_path() != bh.parent_path()) {
    throw DataError(json(high), "base",
                    "is " + bh.string() + " and " + json(low) + "'s is " + bl.string() + ": the LoRA pair " + dir +
                        " must adapt the two experts of one two-expert teacher folder");
  }
  const auto is = [](const fs::path& p, const char* a, const char* b) { return p.filename() == a || p.filename() == b; };
  if (!is(bh, WanExperts::kHighDir, DiffusersPipeline::kTransformer)) {
    throw DataError(json(high), "base",
                    "is " + bh.string() + ", not the high-noise expert (" + WanExperts::kHighDir + "/ or " +
                        DiffusersPipeline::kTransformer + "/) that the pair's high-noise subfolder of " + dir + " adapts");
  }
  if (!is(bl, WanExperts::kLowDir, DiffusersPipeline::kTransformer2)) {
    throw DataError(json(low), "base",
                    "is " + bl.string() + ", not the low-noise expert (" + WanExperts::kLowDir + "/ or " +
                        DiffusersPipeline::kTransformer2 + "/) that the pair's low-noise subfolder of " + dir + " adapts");
  }
}

std::array<LoraFolder, 2> read_lora_pair(const std::string& dir) {
  const auto sub = WanExperts::folders(dir);
  const fs::path p(dir);
  WD_CHECK_AS(ConfigError,
              sub && is_lora_folder((p / sub->names[0]).string()) && is_lora_folder((p / sub->names[1]).string()),
              dir << " is no LoRA pair: it needs two LoRA folders as " << WanExperts::kHighDir << "/ and "
                  << WanExperts::kLowDir << "/ (docs/lora.md#two-expert-teachers)");
  std::array<LoraFolder, 2> out{read_lora_folder((p / sub->names[0]).string()),
                                read_lora_folder((p / sub->names[1]).string())};
  check_lora_pair(out[0], out[1], dir);
  return out;
}

LoraFolder read_lora_folder(const std::string& dir) {
  const auto path = (fs::path(dir) / kLoraJson).string();
  json meta;
  try {
    std::ifstream in(path);
    meta = json::parse(in);
  } catch (const std::exception& e) {
    throw DataError(path, "", std::string("is not valid JSON: ") + e.what());
  }
  const auto field = [&](const char* name) -> const json& {
    WD_CHECK_DATA(meta.is_object() && meta.contains(name), path, name, "missing");
    return meta.at(name);
  };
  WD_CHECK_DATA(field("format") == kLoraFormat, path, "format", "expected \"" << kLoraFormat << "\", found " << field("format"));
  WD_CHECK_DATA(field("version") == kLoraVersion, path, "version", "expected " << kLoraVersion << ", found " << field("version"));
  LoraFolder out;
  out.dir = dir;
  WD_CHECK_DATA(field("base").is_string(), path, "base", "expected the base checkpoint's path (a string)");
  out.base = field("base").get<std::string>();
  WD_CHECK_DATA(field("rank").is_number_integer() && field("rank").get<std::int64_t>() > 0, path, "rank",
                "expected an integer > 0, found " << field("rank"));
  WD_CHECK_DATA(field("alpha").is_number() && field("alpha").get<double>() > 0, path, "alpha",
                "expected a number > 0, found " << field("alpha"));
  WD_CHECK_DATA(field("targets").is_array() && !field("targets").empty(), path, "targets",
                "expected a non-empty list of block linears");
  out.spec.rank = field("rank").get<std::int64_t>();
  out.spec.alpha = field("alpha").get<double>();
  out.spec.targets = field("targets").get<std::vector<std::string>>();
  const auto file = SafetensorsFile::open((fs::path(dir) / kLoraAdapters).string());
  for (const auto& linear : out.spec.targets) {
    auto read = [&](const std::string& name, std::int64_t rows_or_cols, bool down) {
      WD_CHECK_DATA(file.contains(name), file.path(), name, "missing (lora.json lists " << linear << ")");
      auto t = file.tensor(name, torch::kFloat, torch::kCPU);
      WD_CHECK_DATA(t.dim() == 2 && (down ? t.size(0) : t.size(1)) == rows_or_cols, file.path(), name,
                    "expected rank " << out.spec.rank << (down ? " rows" : " columns") << ", found shape "
                                     << t.sizes());
      return t;
    };
    out.adapters[linear] = {read(linear + ".lora_down", out.spec.rank, true),
                            read(linear + ".lora_up", out.spec.rank, false)};
  }
  return out;
}

void write_lora_exports(const LoraFolder& lora, const std::string& dir, c10::ScalarType dtype) {
  TensorMap diffusers, comfy;
  const double scale = lora.spec.scale();
  for (const auto& [linear, pair] : lora.adapters) {
    const auto& [down, up] = pair;
    const auto scaled_up = (up.to(torch::kFloat) * scale).to(dtype).contiguous();
    const auto down_out = down.to(dtype).contiguous();
    auto d = native_to_diffusers(linear + ".weight");
    d = "transformer." + d.substr(0, d.size() - 7);
    diffusers[d + ".lora_A.weight"] = down_out;
    diffusers[d + ".lora_B.weight"] = scaled_up;
    // ComfyUI (kohya's convention): the factors as trained and the true alpha; its loader merges
    // W + (alpha / rank) · up · down (comfy/weight_adapter/lora.py).
    const auto c = "diffusion_model." + linear;
    comfy[c + ".lora_down.weight"] = down_out;
    comfy[c + ".lora_up.weight"] = up.to(dtype).contiguous();
    comfy[c + ".alpha"] = torch::full({}, lora.spec.alpha, torch::kFloat);
  }
  write_safetensors((fs::path(dir) / kDiffusersLoraFile).string(), diffusers,
                    {{"format", "pt"}, {"producer", "wan-distill convert --layout lora"}});
  write_safetensors((fs::path(dir) / kComfyLoraFile).string(), comfy, {{"format", "pt"}});
}

ImportedLora read_lora_file(const std::string& path, const WanConfig& config) {
  ImportedLora out;
  if (is_lora_folder(path)) {
    const auto folder = read_lora_folder(path);
    out.rank = folder.spec.rank;
    for (const auto& [linear, pair] : folder.adapters) {
      out.adapters[linear] = {pair.first, pair.second * folder.spec.scale()};
    }
    return out;
  }
  const auto file = SafetensorsFile::open(path);
  const auto shapes = block_linear_shapes(config);
  std::map<std::string, torch::Tensor> downs, ups, alphas;
  std::map<std::string, std::string> names;  // linear -> a key of it (messages)
  for (const auto& info : file.tensors()) {
    const auto parts = split_lora_key(info.name);
    WD_CHECK_DATA(parts && shapes.count(parts->linear), path, info.name,
                  "is not a LoRA adapter of one of the model's block linears (expected e.g. "
                  "transformer.blocks.0.attn1.to_q.lora_A.weight, diffusion_model.blocks.0.self_attn.q.lora_down.weight)");
    auto t = file.tensor(info.name, torch::kFloat, torch::kCPU);
    auto& slot = parts->half == "down" ? downs : parts->half == "up" ? ups : alphas;
    slot[parts->linear] = t;
    names[parts->linear] = info.name;
  }
  WD_CHECK_DATA(!downs.empty(), path, "", "holds no LoRA adapters");
  // diffusers' training scripts record the peft config (r, lora_alpha) in the metadata; without
  // it (and without .alpha tensors) diffusers assumes alpha = rank, and so do we.
  std::optional<double> metadata_scale;
  if (const auto m = file.metadata().find("lora_adapter_metadata"); m != file.metadata().end()) {
    try {
      const auto j = json::parse(m->second);
      const auto get = [&](const char* key) -> std::optional<double> {
        if (j.contains(std::string("transformer.") + key)) return j.at(std::string("transformer.") + key).get<double>();
        if (j.contains("transformer") && j["transformer"].contains(key)) return j["transformer"][key].get<double>();
        if (j.contains(key)) return j.at(key).get<double>();
        return std::nullopt;
      };
      const auto r = get("r"), a = get("lora_alpha");
      if (r && a && *r > 0) metadata_scale = *a / *r;
    } catch (const std::exception& e) {
      throw DataError(path, "__metadata__.lora_adapter_metadata", std::string("is not the JSON diffusers writes: ") + e.what());
    }
  }
  for (const auto& [linear, down] : downs) {
    const auto [o, i] = shapes.at(linear);
    const auto up_it = ups.find(linear);
    WD_CHECK_DATA(up_it != ups.end(), path, names[linear], "has a down (A) matrix and no up (B) matrix for " << linear);
    const auto& up = up_it->second;
    const auto rank = down.size(0);
    WD_CHECK_DATA(down.dim() == 2 && down.size(1) == i && up.dim() == 2 && up.size(0) == o && up.size(1) == rank,
                  path, names[linear],
                  "shapes down " << down.sizes() << ", up " << up.sizes() << " do not fit " << linear << " (" << o
                                 << "x" << i << ")");
    WD_CHECK_DATA(out.rank == 0 || out.rank == rank, path, names[linear],
                  "rank " << rank << " differs from the file's other adapters (" << out.rank << ")");
    out.rank = rank;
    double scale = metadata_scale.value_or(1.0);
    if (const auto a = alphas.find(linear); a != alphas.end()) scale = a->second.item<double>() / static_cast<double>(rank);
    out.adapters[linear] = {down, up * scale};
  }
  for (const auto& [linear, up] : ups) {
    WD_CHECK_DATA(downs.count(linear), path, names[linear], "has an up (B) matrix and no down (A) matrix for " << linear);
  }
  return out;
}

void load_lora_into(WanDiTImpl& model, const ImportedLora& lora, const std::string& path) {
  const auto& spec = model.lora();
  WD_CHECK_AS(ConfigError, spec.rank == lora.rank,
              path << " holds rank-" << lora.rank << " adapters; student.lora_rank is " << spec.rank);
  std::map<std::string, torch::Tensor> params;
  for (const auto& [name, t] : model.lora_parameters()) params[name] = t;
  torch::NoGradGuard no_grad;
  for (const auto& [linear, pair] : lora.adapters) {
    WD_CHECK_AS(ConfigError, params.count(linear + ".lora_down"),
                path << " adapts " << linear << ", which student.lora_targets does not include");
    params[linear + ".lora_down"].copy_(pair.first);
    params[linear + ".lora_up"].copy_(pair.second / spec.scale());
  }
}

}  // namespace wd
