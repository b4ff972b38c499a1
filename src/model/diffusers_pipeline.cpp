// Reading and writing the model_index.json of a diffusers Wan pipeline folder.
#include "model/diffusers_pipeline.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.hpp"
#include "model/safetensors.hpp"

namespace wd {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTransformerClass = "WanTransformer3DModel";

/// The class a component entry names: ["diffusers", "WanTransformer3DModel"]; empty for an
/// absent component (no entry, null, or [null, null] as save_pretrained writes it).
std::string component_class(const json& index, const char* name, const std::string& file) {
  if (!index.contains(name) || index[name].is_null()) return "";
  const auto& entry = index[name];
  WD_CHECK_DATA(entry.is_array() && entry.size() == 2, file, name,
                "must be [library, class] or null, got " << entry.dump());
  if (entry[1].is_null()) return "";
  WD_CHECK_DATA(entry[1].is_string(), file, name, "must name a class, got " << entry.dump());
  return entry[1].get<std::string>();
}

}  // namespace

bool DiffusersPipeline::is_pipeline_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kIndexName, ec);
}

DiffusersPipeline DiffusersPipeline::read(const std::string& path) {
  const auto file = (fs::path(path) / kIndexName).string();
  std::ifstream in(file);
  if (!in) throw DataError(file, "", "cannot be opened");
  json index;
  try {
    index = json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError(file, "", std::string("is not valid JSON: ") + e.what());
  }
  WD_CHECK_DATA(index.is_object(), file, "", "must hold a JSON object");
  DiffusersPipeline p;
  p.path = path;
  p.class_name = index.value("_class_name", "");
  const auto first = component_class(index, kTransformer, file);
  WD_CHECK_DATA(first == kTransformerClass, file, kTransformer,
                "names " << (first.empty() ? std::string("no model") : first) << "; a Wan pipeline's "
                         << kTransformer << " must be a " << kTransformerClass);
  const auto second = component_class(index, kTransformer2, file);
  WD_CHECK_DATA(second.empty() || second == kTransformerClass, file, kTransformer2,
                "names " << second << "; the low-noise expert must be a " << kTransformerClass);
  p.two_experts = !second.empty();
  if (index.contains("boundary_ratio") && !index["boundary_ratio"].is_null()) {
    const auto& b = index["boundary_ratio"];
    WD_CHECK_DATA(b.is_number() && b.get<double>() > 0.0 && b.get<double>() < 1.0, file,
                  "boundary_ratio", "must be a number in (0, 1) or null, got " << b.dump());
    p.boundary_ratio = b.get<double>();
  }
  return p;
}

std::string DiffusersPipeline::transformer_dir() const {
  return (fs::path(path) / kTransformer).string();
}

std::string DiffusersPipeline::transformer_2_dir() const {
  return (fs::path(path) / kTransformer2).string();
}

void write_diffusers_model_index(const std::string& dir, const WanConfig& config, bool two_experts,
                                 std::optional<double> boundary_ratio) {
  const json dit = json::array({"diffusers", kTransformerClass});
  json index;  // sorted keys, as diffusers writes them
  index["_class_name"] = config.model_type == "i2v" ? "WanImageToVideoPipeline" : "WanPipeline";
  index["_diffusers_version"] = kDiffusersVersion;
  index["boundary_ratio"] = boundary_ratio ? json(*boundary_ratio) : json(nullptr);
  index["expand_timesteps"] = config.model_type == "ti2v";  // per-token timesteps (TI2V-5B)
  index[DiffusersPipeline::kTransformer] = dit;
  index[DiffusersPipeline::kTransformer2] = two_experts ? dit : json::array({nullptr, nullptr});
  fs::create_directories(dir);
  write_file_atomically((fs::path(dir) / DiffusersPipeline::kIndexName).string(),
                        index.dump(2) + "\n");
}

}  // namespace wd
