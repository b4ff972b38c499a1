// Opening, validating and loading Wan DiT checkpoints; writing random ones.
#include "model/wan_checkpoint.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "model/diffusers_pipeline.hpp"

namespace wd {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexName = "diffusion_pytorch_model.safetensors.index.json";
json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw DataError(path.string(), "", "cannot be opened");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError(path.string(), "", std::string("is not valid JSON: ") + e.what());
  }
}

}  // namespace

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "f32") return torch::kFloat;
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "f16") return torch::kHalf;
  throw ConfigError("dtype(" + name + ") must be fp32, bf16 or fp16");
}

std::optional<c10::ScalarType> dtype_of(DtypeChoice choice) {
  switch (choice) {
    case DtypeChoice::kBf16:
      return torch::kBFloat16;
    case DtypeChoice::kFp16:
      return torch::kHalf;
    case DtypeChoice::kFp32:
      return torch::kFloat;
    case DtypeChoice::kAuto:
      break;
  }
  return std::nullopt;
}

const char* dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat:
      return "fp32";
    case torch::kBFloat16:
      return "bf16";
    case torch::kHalf:
      return "fp16";
    default:
      return c10::toString(dtype);
  }
}

WanCheckpoint WanCheckpoint::open_lora(const std::string& path, const std::string& config_path) {
  auto folder = std::make_shared<LoraFolder>(read_lora_folder(path));
  WanCheckpoint ck;
  try {
    ck = open(folder->base, config_path);
  } catch (const DataError& e) {
    throw DataError((fs::path(path) / kLoraJson).string(), "base",
                    std::string("names a base checkpoint that does not open: ") + e.what());
  }
  for (const auto& linear : folder->spec.targets) {
    const auto key = linear + ".weight";
    WD_CHECK_DATA(ck.contains(key), (fs::path(path) / kLoraJson).string(), "targets",
                  "adapts " << linear << ", which the base " << folder->base << " does not have");
    const auto& shape = ck.info(key).shape;
    const auto& [down, up] = folder->adapters.at(linear);
    WD_CHECK_DATA(shape.size() == 2 && up.size(0) == shape[0] && down.size(1) == shape[1],
                  (fs::path(path) / kLoraAdapters).string(), linear,
                  "adapters of " << up.size(0) << "x" << down.size(1) << " for a base weight of shape "
                                 << c10::IntArrayRef(shape));
    ck.merged_[key] = linear;
  }
  ck.lora_ = std::move(folder);
  return ck;
}

void WanCheckpoint::add_indexed_shards(const std::string& path) {
  const fs::path p(path);
  const auto index_path = (p / kIndexName).string();
  const json index = read_json(p / kIndexName);
  WD_CHECK_DATA(index.is_object() && index.contains("weight_map") &&
                    index["weight_map"].is_object(),
                index_path, "weight_map", "must be an object mapping tensor names to shard files");
  std::vector<std::string> shards;
  std::map<std::string, std::string> wanted;  // tensor -> shard named by the index
  for (const auto& [key, value] : index["weight_map"].items()) {
    WD_CHECK_DATA(value.is_string(), index_path, "weight_map/" + key,
                  "must name a shard file (a string), got " + value.dump());
    const auto shard = value.get<std::string>();
    wanted[key] = shard;
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
  }
  std::sort(shards.begin(), shards.end());
  for (const auto& shard : shards) {
    WD_CHECK_DATA(fs::exists(p / shard), index_path, "weight_map",
                  "names shard " + shard + ", which does not exist in " + path);
    add_file(SafetensorsFile::open((p / shard).string()));
  }
  for (const auto& [key, shard] : wanted) {
    bool found = false;
    for (const auto& f : files_) {
      if (fs::path(f.path()).filename() == shard && f.contains(key)) found = true;
    }
    WD_CHECK_DATA(found, index_path, "weight_map/" + key,
                  "says the tensor is in " + shard + ", but that file does not hold it");
  }
  if (index.contains("metadata") && index["metadata"].contains("total_size")) {
    const auto declared = index["metadata"]["total_size"];
    if (declared.is_number_unsigned() && declared.get<std::uint64_t>() != total_bytes()) {
      spdlog::warn("{}: metadata.total_size {} differs from the shards' {} tensor bytes",
                   index_path, declared.get<std::uint64_t>(), total_bytes());
    }
  }
}

WanCheckpoint WanCheckpoint::open(const std::string& path, const std::string& config_path) {
  if (is_lora_folder(path)) return open_lora(path, config_path);
  WanCheckpoint ck;
  ck.path_ = path;
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw DataError(path, "", "does not exist");

  fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  if (dir.empty()) dir = ".";
  if (fs::is_directory(p)) {
    if (!fs::exists(p / kIndexName) &&
        (fs::is_directory(p / "high_noise_model") || fs::is_directory(p / "low_noise_model"))) {
      // WanCheckpoint is one expert; the pair, its boundary and routing live in WanExperts.
      throw DataError(path, "", "is a two-expert (A14B) checkpoint: open it with WanExperts (as "
                                "teacher.checkpoint it is accepted whole), or pass "
                                "high_noise_model/ or low_noise_model/ for one expert");
    }
    if (!fs::exists(p / kIndexName) && DiffusersPipeline::is_pipeline_dir(path)) {
      // A diffusers pipeline folder: its DiT is transformer/ (e.g. Wan 2.2 TI2V-5B).
      const auto pipeline = DiffusersPipeline::read(path);
      if (pipeline.two_experts) {
        throw DataError(path, "", "is a two-expert (A14B) diffusers pipeline: open it with "
                                  "WanExperts (as teacher.checkpoint it is accepted whole), or pass "
                                  "transformer/ (high-noise) or transformer_2/ (low-noise) for one "
                                  "expert");
      }
      return open(pipeline.transformer_dir(), config_path);
    }
    if (fs::exists(p / kIndexName)) {
      ck.add_indexed_shards(path);
    } else {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.path().extension() == ".safetensors") found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
      if (found.size() != 1) {
        std::string names;
        for (const auto& f : found) names += " " + f.filename().string();
        throw DataError(path, "", "holds " + std::to_string(found.size()) +
                                      " .safetensors files and no " + kIndexName +
                                      (names.empty() ? "" : ":" + names) +
                                      "; expected an index or exactly one file");
      }
      ck.add_file(SafetensorsFile::open(found[0].string()));
    }
  } else {
    ck.add_file(SafetensorsFile::open(path));
  }

  ck.index_keys();
  ck.config_path_ = config_path.empty() ? (dir / "config.json").string() : config_path;
  if (!fs::exists(ck.config_path_)) {
    throw DataError(ck.config_path_, "", "not found: a checkpoint needs its config.json (give "
                                         "--model-config FILE for a file without one beside it)");
  }
  ck.config_ = WanConfig::load(ck.config_path_);
  return ck;
}

void WanCheckpoint::add_file(SafetensorsFile file) { files_.push_back(std::move(file)); }

void WanCheckpoint::index_keys() {
  // The layout is a property of the whole checkpoint: a diffusers key such as
  // blocks.0.norm2.weight only maps correctly once we know every key is a diffusers one.
  std::string native_example, diffusers_example;
  for (const auto& f : files_) {
    for (const auto& t : f.tensors()) {
      const auto key = strip_comfy_prefix(t.name);
      if (key != t.name) prefixed_ = true;
      (looks_like_diffusers(key) ? diffusers_example : native_example) = t.name;
    }
  }
  layout_ = diffusers_example.empty() ? KeyLayout::kNative : KeyLayout::kDiffusers;
  const bool native_only_name =
      !native_example.empty() && diffusers_example.size() &&
      !diffusers_to_native(strip_comfy_prefix(native_example)) &&
      strip_comfy_prefix(native_example).rfind("patch_embedding.", 0) != 0;
  if (native_only_name) {
    throw DataError(path_, native_example, "is a native Wan name, but " + diffusers_example +
                                               " is a diffusers name: the checkpoint mixes layouts");
  }
  for (std::size_t i = 0; i < files_.size(); ++i) {
    for (const auto& t : files_[i].tensors()) {
      const auto key = strip_comfy_prefix(t.name);
      const auto native = layout_ == KeyLayout::kDiffusers ? diffusers_to_native(key)
                                                           : std::optional<std::string>(key);
      if (!native) {
        unmapped_.push_back(t.name);
        continue;
      }
      if (entries_.count(*native)) {
        throw DataError(files_[i].path(), t.name,
                        "is stored twice (also in " + files_[entries_[*native].file].path() + ")");
      }
      entries_[*native] = Entry{i, t.name};
    }
  }
}

std::uint64_t WanCheckpoint::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& f : files_) n += f.data_bytes();
  return n;
}

std::map<std::string, std::pair<std::size_t, std::uint64_t>> WanCheckpoint::dtype_summary() const {
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> out;
  for (const auto& f : files_) {
    for (const auto& t : f.tensors()) {
      auto& slot = out[t.dtype];
      slot.first += 1;
      slot.second += t.nbytes();
    }
  }
  return out;
}

std::vector<std::string> WanCheckpoint::problems() const {
  std::vector<std::string> out;
  std::map<std::string, bool> expected;
  for (const auto& spec : wan_param_specs(config_)) {
    expected[spec.name] = true;
    auto it = entries_.find(spec.name);
    if (it == entries_.end()) {
      out.push_back("missing " + spec.name + " " + format_shape(spec.shape));
      continue;
    }
    const auto& info = files_[it->second.file].info(it->second.stored_name);
    if (info.shape != spec.shape) {
      out.push_back("mis-shaped " + it->second.stored_name + ": " + format_shape(info.shape) +
                    ", config " + config_path_ + " expects " + format_shape(spec.shape));
    }
    if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16") {
      out.push_back("unsupported dtype " + info.dtype + " for " + it->second.stored_name +
                    " (F32, BF16 or F16 expected)");
    }
  }
  for (const auto& [name, entry] : entries_) {
    if (!expected.count(name)) out.push_back("unexpected " + entry.stored_name);
  }
  for (const auto& name : unmapped_) out.push_back("unexpected " + name);
  return out;
}

void WanCheckpoint::check() const {
  const auto list = problems();
  if (list.empty()) return;
  std::string msg = std::to_string(list.size()) + " problem(s) against " + config_.summary() + ":";
  for (const auto& p : list) msg += "\n  - " + p;
  throw DataError(path_, "", msg);
}

const TensorInfo& WanCheckpoint::info(const std::string& native_key) const {
  auto it = entries_.find(native_key);
  if (it == entries_.end()) throw DataError(path_, native_key, "not in the checkpoint");
  return files_[it->second.file].info(it->second.stored_name);
}

std::pair<std::string, std::string> WanCheckpoint::location(const std::string& native_key) const {
  auto it = entries_.find(native_key);
  if (it == entries_.end()) throw DataError(path_, native_key, "not in the checkpoint");
  return {files_[it->second.file].path(), it->second.stored_name};
}

void WanCheckpoint::release(const std::string& native_key) const {
  auto it = entries_.find(native_key);
  if (it == entries_.end()) return;
  files_[it->second.file].release(it->second.stored_name);
}

torch::Tensor WanCheckpoint::tensor(const std::string& native_key,
                                    std::optional<c10::ScalarType> dtype,
                                    const torch::Device& device) const {
  auto it = entries_.find(native_key);
  if (it == entries_.end()) throw DataError(path_, native_key, "not in the checkpoint");
  const auto& file = files_[it->second.file];
  if (const auto m = merged_.find(native_key); m != merged_.end()) {
    // LoRA folder: the base weight with its adapters merged, in the stored (or asked) dtype.
    const auto base = file.tensor(it->second.stored_name);
    return lora_->merged(m->second, base).to(dtype ? *dtype : base.scalar_type()).to(device);
  }
  if (!dtype) return file.tensor(it->second.stored_name).to(device);
  return file.tensor(it->second.stored_name, *dtype, device);
}

std::int64_t wan_block_of(const std::string& key) {
  if (key.rfind("blocks.", 0) != 0) return -1;
  return std::stoll(key.substr(7, key.find('.', 7) - 7));
}

WanDiT load_wan_dit(const WanCheckpoint& ck, std::optional<c10::ScalarType> dtype,
                    const torch::Device& device,
                    std::optional<std::pair<std::int64_t, std::int64_t>> blocks) {
  ck.check();
  auto specs = wan_param_specs(ck.config());
  if (blocks) {
    specs.erase(std::remove_if(specs.begin(), specs.end(),
                               [&](const ParamSpec& p) {
                                 const auto b = wan_block_of(p.name);
                                 return b >= 0 && (b < blocks->first || b >= blocks->second);
                               }),
                specs.end());
  }
  const auto target = dtype ? *dtype : safetensors_to_scalar_type(ck.info(specs.front().name).dtype);
  // Without a requested dtype each tensor keeps its own: the forward casts the fp32 islands
  // (time MLP, modulation, LayerNorms, head) itself, so a mixed file needs no conversion.
  const auto wanted = [&](const std::string& name) {
    return dtype ? *dtype : safetensors_to_scalar_type(ck.info(name).dtype);
  };
  const auto converts = [&](const std::string& name) {
    return ck.info(name).dtype != scalar_type_to_safetensors(wanted(name)) || !device.is_cpu();
  };
  WanDiT model(ck.config(), WanInit::kEmpty, target);
  std::uint64_t converted = 0;
  for (const auto& spec : specs) {
    if (converts(spec.name)) converted += ck.info(spec.name).nbytes();
  }
  // Zero-copy binding is instant; only conversions and device copies read the weights.
  Progress progress("loading " + ck.path(), static_cast<double>(converted), "bytes");
  for (const auto& spec : specs) {
    auto t = ck.tensor(spec.name, wanted(spec.name), device);
    if (converts(spec.name)) progress.advance(static_cast<double>(ck.info(spec.name).nbytes()));
    model->bind_parameter(spec.name, t);
  }
  progress.finish();
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  std::int64_t params = 0;
  for (const auto& spec : specs) params += spec.numel();
  spdlog::info("loaded {} ({} tensors{}, {} params, {} on {}, {} converted)", ck.path(), specs.size(),
               blocks ? " of blocks " + std::to_string(blocks->first) + "-" + std::to_string(blocks->second - 1) : "",
               params, dtype_name(target), device.str(), format_bytes(static_cast<double>(converted)));
  return model;
}

std::string wan_config_json(const WanConfig& config, KeyLayout layout) {
  return layout == KeyLayout::kNative ? config.to_json() : config.to_diffusers_json();
}

ShardedWriteResult write_random_wan_checkpoint(const std::string& dir, const WanConfig& config,
                                               c10::ScalarType dtype, std::uint64_t shard_bytes,
                                               std::uint64_t seed, KeyLayout layout) {
  config.validate("init-teacher");
  const auto config_json = wan_config_json(config, layout);
  fs::create_directories(dir);
  write_file_atomically((fs::path(dir) / "config.json").string(), config_json);
  const auto specs = wan_param_specs(config);
  const auto elem = c10::elementSize(dtype);
  std::vector<TensorSource> sources;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto bytes = static_cast<std::uint64_t>(specs[i].numel()) * elem;
    total += bytes;
    sources.push_back({layout == KeyLayout::kNative ? specs[i].name : native_to_diffusers(specs[i].name),
                       bytes, [&specs, i, seed, dtype] {
                         return wan_random_parameter(specs[i], i, seed, dtype);
                       }});
  }
  Progress progress("writing " + dir, static_cast<double>(total), "bytes");
  auto result = write_sharded_safetensors(
      dir, kCheckpointStem, sources, shard_bytes, {{"format", "pt"}},
      [&progress](std::uint64_t bytes) { progress.advance(static_cast<double>(bytes)); });
  progress.finish();
  return result;
}

}  // namespace wd
