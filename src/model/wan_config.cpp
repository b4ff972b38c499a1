// WanConfig presets, validation, config.json parsing (native and diffusers) and the
// parameter list of the official state_dict.
#include "model/wan_config.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <map>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/config.hpp"
#include "core/errors.hpp"

namespace wd {

using nlohmann::json;

void WanConfig::validate(const std::string& source) const {
  ConfigProblems p;
  const auto v = [](auto x) { return "(" + std::to_string(x) + ")"; };
  p.check(model_type == "t2v" || model_type == "i2v" || model_type == "ti2v",
          "model_type(" + model_type + ") must be t2v, i2v or ti2v");
  for (auto s : patch_size) p.check(s >= 1, "patch_size entries must be >= 1, got " + std::to_string(s));
  p.check(dim >= 1, "dim" + v(dim) + " must be >= 1");
  p.check(num_heads >= 1, "num_heads" + v(num_heads) + " must be >= 1");
  if (dim >= 1 && num_heads >= 1) {
    p.check(dim % num_heads == 0,
            "dim" + v(dim) + " must be divisible by num_heads" + v(num_heads));
    p.check(dim % num_heads != 0 || head_dim() % 2 == 0,
            "head_dim = dim/num_heads" + v(head_dim()) + " must be even (RoPE pairs channels)");
  }
  p.check(ffn_dim >= 1, "ffn_dim" + v(ffn_dim) + " must be >= 1");
  p.check(freq_dim >= 2 && freq_dim % 2 == 0, "freq_dim" + v(freq_dim) + " must be even and >= 2");
  p.check(num_layers >= 0, "num_layers" + v(num_layers) + " must be >= 0");
  p.check(in_dim >= 1, "in_dim" + v(in_dim) + " must be >= 1");
  p.check(out_dim >= 1, "out_dim" + v(out_dim) + " must be >= 1");
  p.check(text_dim >= 1, "text_dim" + v(text_dim) + " must be >= 1");
  p.check(text_len >= 1, "text_len" + v(text_len) + " must be >= 1");
  p.check(eps > 0, "eps must be > 0");
  // Wan 2.2 uses global attention everywhere; windowed attention is a Wan 2.1 leftover.
  p.check(window_size[0] == -1 && window_size[1] == -1,
          "window_size(" + std::to_string(window_size[0]) + "," + std::to_string(window_size[1]) +
              ") must be (-1,-1): only global attention is implemented");
  p.throw_if_any("model config " + source);
}

std::vector<std::string> WanConfig::preset_names() {
  return {"tiny", "wan22-ti2v-5b", "wan22-t2v-a14b", "wan22-i2v-a14b"};
}

WanConfig WanConfig::preset(const std::string& name) {
  WanConfig c;
  if (name == "tiny") {
    c.model_type = "t2v";
    c.dim = 128;
    c.ffn_dim = 256;
    c.freq_dim = 64;
    c.num_heads = 4;
    c.num_layers = 4;
    c.in_dim = 16;
    c.out_dim = 16;
    c.text_dim = 64;
    c.text_len = 16;
  } else if (name == "wan22-ti2v-5b") {
    c.model_type = "ti2v";
    c.dim = 3072;
    c.ffn_dim = 14336;
    c.freq_dim = 256;
    c.num_heads = 24;
    c.num_layers = 30;
    c.in_dim = 48;
    c.out_dim = 48;
  } else if (name == "wan22-t2v-a14b" || name == "wan22-i2v-a14b") {
    c.model_type = name == "wan22-t2v-a14b" ? "t2v" : "i2v";
    c.dim = 5120;
    c.ffn_dim = 13824;
    c.freq_dim = 256;
    c.num_heads = 40;
    c.num_layers = 40;
    c.in_dim = name == "wan22-t2v-a14b" ? 16 : 36;
    c.out_dim = 16;
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : "|") + n;
    throw ConfigError("unknown model preset '" + name + "'; expected one of " + names);
  }
  c.text_len = name == "tiny" ? c.text_len : 512;
  c.text_dim = name == "tiny" ? c.text_dim : 4096;
  return c;
}

namespace {

template <typename T>
T field(const json& j, const char* key, const T& fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw DataError(source, key, "has the wrong type: " + j.at(key).dump());
  }
}

WanConfig from_diffusers(const json& j, const std::string& source) {
  WanConfig c;
  const auto heads = field<std::int64_t>(j, "num_attention_heads", 40, source);
  const auto head_dim = field<std::int64_t>(j, "attention_head_dim", 128, source);
  c.num_heads = heads;
  c.dim = heads * head_dim;
  c.in_dim = field<std::int64_t>(j, "in_channels", 16, source);
  c.out_dim = field<std::int64_t>(j, "out_channels", 16, source);
  c.text_dim = field<std::int64_t>(j, "text_dim", 4096, source);
  c.freq_dim = field<std::int64_t>(j, "freq_dim", 256, source);
  c.ffn_dim = field<std::int64_t>(j, "ffn_dim", 13824, source);
  c.num_layers = field<std::int64_t>(j, "num_layers", 40, source);
  c.cross_attn_norm = field<bool>(j, "cross_attn_norm", true, source);
  c.eps = field<double>(j, "eps", 1e-6, source);
  // diffusers' WanAttention has norm_q / norm_k and applies them whatever this field says.
  const auto qk = field<std::string>(j, "qk_norm", "rms_norm_across_heads", source);
  WD_CHECK_DATA(qk == "rms_norm_across_heads", source, "qk_norm",
                "is '" + qk + "'; only rms_norm_across_heads (the Wan 2.2 norm) is supported");
  c.qk_norm = true;
  if (j.contains("patch_size")) c.patch_size = field<std::array<std::int64_t, 3>>(j, "patch_size", c.patch_size, source);
  for (const char* wan21 : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"}) {
    WD_CHECK_DATA(field<json>(j, wan21, json(), source).is_null(), source, wan21,
                  "is set: the Wan 2.1 image branch does not exist in Wan 2.2");
  }
  // diffusers has no model_type: the input channels tell the Wan 2.2 variants apart, unless
  // our own writer recorded it (to_diffusers_json).
  const auto inferred = c.in_dim == 36 ? "i2v" : (c.in_dim == 48 ? "ti2v" : "t2v");
  c.model_type = field<std::string>(j, "_wan_model_type", inferred, source);
  // diffusers pads prompts to max_sequence_length = 512 in the pipeline.
  c.text_len = field<std::int64_t>(j, "_wan_text_len", 512, source);
  return c;
}

}  // namespace

WanConfig WanConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw DataError(source, "", std::string("is not valid JSON: ") + e.what());
  }
  WD_CHECK_DATA(j.is_object(), source, "", "must hold a JSON object");
  WanConfig c;
  if (j.contains("num_attention_heads") || j.value("_class_name", "") == "WanTransformer3DModel") {
    c = from_diffusers(j, source);
  } else {
    const WanConfig d;
    c.model_type = field<std::string>(j, "model_type", d.model_type, source);
    c.patch_size = field<std::array<std::int64_t, 3>>(j, "patch_size", d.patch_size, source);
    c.text_len = field<std::int64_t>(j, "text_len", d.text_len, source);
    c.in_dim = field<std::int64_t>(j, "in_dim", d.in_dim, source);
    c.dim = field<std::int64_t>(j, "dim", d.dim, source);
    c.ffn_dim = field<std::int64_t>(j, "ffn_dim", d.ffn_dim, source);
    c.freq_dim = field<std::int64_t>(j, "freq_dim", d.freq_dim, source);
    c.text_dim = field<std::int64_t>(j, "text_dim", d.text_dim, source);
    c.out_dim = field<std::int64_t>(j, "out_dim", d.out_dim, source);
    c.num_heads = field<std::int64_t>(j, "num_heads", d.num_heads, source);
    c.num_layers = field<std::int64_t>(j, "num_layers", d.num_layers, source);
    c.window_size = field<std::array<std::int64_t, 2>>(j, "window_size", d.window_size, source);
    c.qk_norm = field<bool>(j, "qk_norm", d.qk_norm, source);
    c.cross_attn_norm = field<bool>(j, "cross_attn_norm", d.cross_attn_norm, source);
    c.eps = field<double>(j, "eps", d.eps, source);
  }
  c.validate(source);
  return c;
}

WanConfig WanConfig::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(path, "", "cannot be opened (model config.json expected)");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

namespace {

template <typename T>
std::string field_text(const T& v) {
  std::ostringstream s;
  s << std::setprecision(12) << v;
  return s.str();
}

template <typename T, std::size_t N>
std::string field_text(const std::array<T, N>& v) {
  std::string out = "(";
  for (std::size_t i = 0; i < N; ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + ")";
}

std::string field_text(bool v) { return v ? "true" : "false"; }

}  // namespace

std::vector<WanConfig::Difference> WanConfig::differences(const WanConfig& other) const {
  std::vector<Difference> out;
  const auto cmp = [&](const char* field, const auto& a, const auto& b) {
    if (!(a == b)) out.push_back({field, field_text(a), field_text(b)});
  };
  cmp("model_type", model_type, other.model_type);
  cmp("patch_size", patch_size, other.patch_size);
  cmp("text_len", text_len, other.text_len);
  cmp("in_dim", in_dim, other.in_dim);
  cmp("dim", dim, other.dim);
  cmp("ffn_dim", ffn_dim, other.ffn_dim);
  cmp("freq_dim", freq_dim, other.freq_dim);
  cmp("text_dim", text_dim, other.text_dim);
  cmp("out_dim", out_dim, other.out_dim);
  cmp("num_heads", num_heads, other.num_heads);
  cmp("num_layers", num_layers, other.num_layers);
  cmp("window_size", window_size, other.window_size);
  cmp("qk_norm", qk_norm, other.qk_norm);
  cmp("cross_attn_norm", cross_attn_norm, other.cross_attn_norm);
  cmp("eps", eps, other.eps);
  return out;
}

std::string WanConfig::to_json() const {
  // ordered_json keeps the official field order, which makes diffs against real files readable.
  nlohmann::ordered_json j;
  j["_class_name"] = "WanModel";
  j["model_type"] = model_type;
  j["patch_size"] = patch_size;
  j["text_len"] = text_len;
  j["in_dim"] = in_dim;
  j["dim"] = dim;
  j["ffn_dim"] = ffn_dim;
  j["freq_dim"] = freq_dim;
  j["text_dim"] = text_dim;
  j["out_dim"] = out_dim;
  j["num_heads"] = num_heads;
  j["num_layers"] = num_layers;
  j["window_size"] = window_size;
  j["qk_norm"] = qk_norm;
  j["cross_attn_norm"] = cross_attn_norm;
  j["eps"] = eps;
  return j.dump(2) + "\n";
}

std::string WanConfig::to_diffusers_json() const {
  if (!qk_norm) {
    throw ConfigError("qk_norm(false) cannot be written as a diffusers config: diffusers' "
                      "WanTransformer3DModel always normalises q and k (norm_q, norm_k)");
  }
  // nlohmann::json keeps keys sorted, as diffusers' save_pretrained writes them.
  json j;
  j["_class_name"] = "WanTransformer3DModel";
  j["_diffusers_version"] = kDiffusersVersion;
  j["_wan_model_type"] = model_type;
  j["_wan_text_len"] = text_len;
  j["added_kv_proj_dim"] = nullptr;
  j["attention_head_dim"] = head_dim();
  j["cross_attn_norm"] = cross_attn_norm;
  j["eps"] = eps;
  j["ffn_dim"] = ffn_dim;
  j["freq_dim"] = freq_dim;
  j["image_dim"] = nullptr;
  j["in_channels"] = in_dim;
  j["num_attention_heads"] = num_heads;
  j["num_layers"] = num_layers;
  j["out_channels"] = out_dim;
  j["patch_size"] = patch_size;
  j["pos_embed_seq_len"] = nullptr;
  j["qk_norm"] = "rms_norm_across_heads";
  j["rope_max_seq_len"] = 1024;  // the official rope_params(1024, ...) table (spec §3.3)
  j["text_dim"] = text_dim;
  return j.dump(2) + "\n";
}

std::string WanConfig::summary() const {
  std::ostringstream os;
  os << model_type << " dim " << dim << " ffn " << ffn_dim << " heads " << num_heads << " layers "
     << num_layers << " in " << in_dim << " out " << out_dim << " text " << text_dim << "x"
     << text_len << " freq " << freq_dim;
  return os.str();
}

std::int64_t ParamSpec::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<ParamSpec> wan_param_specs(const WanConfig& c) {
  const std::int64_t D = c.dim;
  std::vector<ParamSpec> s;
  const auto linear = [&](const std::string& name, std::int64_t out, std::int64_t in) {
    s.push_back({name + ".weight", {out, in}, ParamKind::kWeight});
    s.push_back({name + ".bias", {out}, ParamKind::kBias});
  };
  s.push_back({"patch_embedding.weight",
               {D, c.in_dim, c.patch_size[0], c.patch_size[1], c.patch_size[2]},
               ParamKind::kWeight});
  s.push_back({"patch_embedding.bias", {D}, ParamKind::kBias});
  linear("text_embedding.0", D, c.text_dim);
  linear("text_embedding.2", D, D);
  linear("time_embedding.0", D, c.freq_dim);
  linear("time_embedding.2", D, D);
  linear("time_projection.1", 6 * D, D);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    s.push_back({b + "modulation", {1, 6, D}, ParamKind::kModulation});
    for (const char* attn : {"self_attn", "cross_attn"}) {
      if (std::string(attn) == "cross_attn" && c.cross_attn_norm) {
        s.push_back({b + "norm3.weight", {D}, ParamKind::kNormGain});
        s.push_back({b + "norm3.bias", {D}, ParamKind::kBias});
      }
      for (const char* proj : {"q", "k", "v", "o"}) linear(b + attn + "." + proj, D, D);
      if (c.qk_norm) {
        s.push_back({b + attn + ".norm_q.weight", {D}, ParamKind::kNormGain});
        s.push_back({b + attn + ".norm_k.weight", {D}, ParamKind::kNormGain});
      }
    }
    linear(b + "ffn.0", c.ffn_dim, D);
    linear(b + "ffn.2", D, c.ffn_dim);
  }
  s.push_back({"head.modulation", {1, 2, D}, ParamKind::kModulation});
  linear("head.head", c.patch_volume() * c.out_dim, D);
  return s;
}

std::int64_t wan_param_count(const WanConfig& config) {
  std::int64_t n = 0;
  for (const auto& p : wan_param_specs(config)) n += p.numel();
  return n;
}

std::vector<std::string> lora_target_linears(const std::string& list, std::int64_t num_layers, const std::string& key) {
  static const std::vector<std::string> kAll = {"self_attn.q",  "self_attn.k",  "self_attn.v",  "self_attn.o",
                                                "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o",
                                                "ffn.0",        "ffn.2"};
  std::vector<bool> chosen(kAll.size(), false);
  const auto pick = [&](const std::function<bool(const std::string&)>& take) {
    for (std::size_t j = 0; j < kAll.size(); ++j) chosen[j] = chosen[j] || take(kAll[j]);
  };
  std::stringstream in(list);
  std::string word;
  bool any = false;
  while (std::getline(in, word, ',')) {
    word.erase(0, word.find_first_not_of(" \t"));
    word.erase(word.find_last_not_of(" \t") + 1);
    if (word.empty()) continue;
    any = true;
    const auto starts = [](const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; };
    if (word == "all") {
      pick([](const std::string&) { return true; });
    } else if (word == "attn") {
      pick([&](const std::string& n) { return starts(n, "self_attn.") || starts(n, "cross_attn."); });
    } else if (word == "self_attn" || word == "cross_attn" || word == "ffn") {
      pick([&](const std::string& n) { return starts(n, word + "."); });
    } else if (word == "q" || word == "k" || word == "v" || word == "o") {
      pick([&](const std::string& n) { return n == "self_attn." + word || n == "cross_attn." + word; });
    } else if (std::find(kAll.begin(), kAll.end(), word) != kAll.end()) {
      pick([&](const std::string& n) { return n == word; });
    } else {
      throw ConfigError(key + "(" + list + "): unknown target '" + word +
                        "'; expected a comma list of all, attn, self_attn, cross_attn, ffn, q, k, v, o or an in-block "
                        "linear name (self_attn.q, cross_attn.o, ffn.0, ffn.2, ...)");
    }
  }
  WD_CHECK_AS(ConfigError, any, key << " is empty; expected e.g. attn,ffn");
  std::vector<std::string> out;
  for (std::int64_t i = 0; i < num_layers; ++i) {
    for (std::size_t j = 0; j < kAll.size(); ++j) {
      if (chosen[j]) out.push_back("blocks." + std::to_string(i) + "." + kAll[j]);
    }
  }
  return out;
}

std::map<std::string, std::pair<std::int64_t, std::int64_t>> block_linear_shapes(const WanConfig& config) {
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> out;
  const std::string weight = ".weight";
  for (const auto& p : wan_param_specs(config)) {
    if (p.name.rfind("blocks.", 0) != 0 || p.shape.size() != 2 || p.name.size() <= weight.size() ||
        p.name.compare(p.name.size() - weight.size(), weight.size(), weight) != 0) {
      continue;
    }
    out[p.name.substr(0, p.name.size() - weight.size())] = {p.shape[0], p.shape[1]};
  }
  return out;
}

std::int64_t lora_param_count(const WanConfig& config, const LoraSpec& spec) {
  const auto shapes = block_linear_shapes(config);
  std::int64_t total = 0;
  for (const auto& t : spec.targets) {
    const auto it = shapes.find(t);
    WD_CHECK_AS(ConfigError, it != shapes.end(), "LoRA target " << t << " is no block linear of this model");
    total += spec.rank * (it->second.first + it->second.second);
  }
  return total;
}

}  // namespace wd
