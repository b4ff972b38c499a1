// Saving and restoring a student's training state bit for bit (see train_state.hpp).
#include "student/train_state.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "model/safetensors.hpp"

namespace wd::student {

void CheckpointConfig::bind(OptionTable& t) {
  t.bind("checkpoint.every", every,
         "steps between checkpoints (weights, optimizer, RNG, step; 0 = only at the end and on SIGUSR1)")
      .bind("checkpoint.keep", keep, "newest checkpoints to keep (0 = all)")
      .bind("checkpoint.dir", dir, "checkpoint directory (empty: <run-dir>/checkpoints)")
      .bind("resume", resume,
            "auto: continue from the newest checkpoint that verifies (start fresh if none); PATH: "
            "continue from that checkpoint; empty: start fresh");
}

void CheckpointConfig::validate(ConfigProblems& p) const {
  p.check(every >= 0, "checkpoint.every(" + std::to_string(every) + ") must be >= 0");
  p.check(keep >= 0, "checkpoint.keep(" + std::to_string(keep) + ") must be >= 0");
}

namespace {

constexpr const char* kFormat = "wan-distill-train-state";
constexpr int kVersion = 1;

std::string join(const std::string& dir, const char* name) { return (std::filesystem::path(dir) / name).string(); }

/// Decimal text that reads back as the same double.
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

std::string to_hex(const torch::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  const auto t = bytes.contiguous();
  const auto* p = t.data_ptr<std::uint8_t>();
  std::string out;
  out.reserve(static_cast<std::size_t>(t.numel()) * 2);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 0xF];
  }
  return out;
}

torch::Tensor from_hex(const std::string& hex, const std::string& file, const std::string& item) {
  WD_CHECK_DATA(hex.size() % 2 == 0, file, item, "odd number of hex digits (" << hex.size() << ")");
  auto out = torch::empty({static_cast<std::int64_t>(hex.size() / 2)}, torch::kUInt8);
  auto* p = out.data_ptr<std::uint8_t>();
  const auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw DataError(file, item, std::string("not a hex digit: '") + c + "'");
  };
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    p[i / 2] = static_cast<std::uint8_t>(nibble(hex[i]) << 4 | nibble(hex[i + 1]));
  }
  return out;
}

const torch::optim::AdamWOptions& adamw_options(const torch::optim::AdamW& optimizer) {
  WD_CHECK(optimizer.param_groups().size() == 1,
           "train state supports one AdamW parameter group, the optimizer has " << optimizer.param_groups().size());
  return static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups().front().options());
}

/// A copy of `src` shaped, typed and placed like `param` (so optimizer state sits beside it).
torch::Tensor like_param(const torch::Tensor& param, const torch::Tensor& src) {
  return torch::empty_like(param, torch::MemoryFormat::Preserve).copy_(src);
}

/// A positive integer of `file`'s metadata, or a DataError naming the key.
std::int64_t meta_int(const SafetensorsFile& file, const std::string& key) {
  const auto it = file.metadata().find(key);
  WD_CHECK_DATA(it != file.metadata().end(), file.path(), "__metadata__." + key, "missing");
  std::size_t used = 0;
  std::int64_t v = -1;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  WD_CHECK_DATA(used == it->second.size() && v >= 0, file.path(), "__metadata__." + key,
                "expected a non-negative integer, found \"" << it->second << "\"");
  return v;
}

/// The AdamW moments of a checkpoint, saved whole in optimizer.safetensors or in slices of the
/// flat layout (student.shard), read by range of the flat layout either way.
class SavedMoments {
 public:
  SavedMoments(const std::string& dir, const SafetensorsFile& index, const std::vector<std::string>& names,
               const std::vector<torch::Tensor>& params)
      : index_(index), names_(names) {
    std::int64_t offset = 0;
    for (const auto& p : params) {
      offsets_.push_back(offset);
      offset += p.numel();
    }
    if (!index.metadata().count("slices")) return;
    const auto count = meta_int(index, "slices");
    slice_ = meta_int(index, "slice_size");
    const auto padded = meta_int(index, "padded");
    WD_CHECK_DATA(count >= 1 && count <= 1 << 20 && padded == count * slice_ && padded >= offset, index.path(),
                  "__metadata__.padded", "expected " << count << " slices of " << slice_ << " elements covering the "
                                                     << offset << " of the student, found " << padded);
    nlohmann::json order;
    try {
      order = nlohmann::json::parse(index.metadata().at("flat_order"));
    } catch (const std::exception& e) {
      throw DataError(index.path(), "__metadata__.flat_order", std::string("not a JSON list of names: ") + e.what());
    }
    WD_CHECK_DATA(order == nlohmann::json(names), index.path(), "__metadata__.flat_order",
                  "expected the current student's " << names.size() << " trainable tensors in order, found another "
                                                                          "list ("
                                                    << (order.is_array() ? order.size() : 0) << " names)");
    for (int r = 0; r < count; ++r) {
      const auto path = (std::filesystem::path(dir) / moment_slice_file(r, static_cast<int>(count))).string();
      WD_CHECK_DATA(std::filesystem::exists(path), path, "", "is missing: the checkpoint's moments are in " << count
                                                                 << " slices (" << TrainStateFiles::kOptimizer << ")");
      auto file = SafetensorsFile::open(path);
      const std::pair<const char*, std::int64_t> expected[] = {
          {"slice", r}, {"slices", count}, {"begin", r * slice_}, {"size", slice_}, {"padded", padded}};
      for (const auto& [key, value] : expected) {
        WD_CHECK_DATA(meta_int(file, key) == value, path, std::string("__metadata__.") + key,
                      "expected " << value << ", found " << meta_int(file, key));
      }
      for (const char* name : {"exp_avg", "exp_avg_sq"}) expect_saved_tensor(file, name, torch::zeros({slice_}));
      files_.push_back(std::move(file));
    }
  }

  bool sliced() const { return !files_.empty(); }

  /// Whether tensor i was stepped (its ".step" is saved) and its step count.
  bool has(std::size_t i) const { return index_.contains(names_[i] + ".step"); }

  /// `which` ("exp_avg", "exp_avg_sq") of tensor i, elements [offset, offset + length) of it flattened.
  torch::Tensor read(const std::string& which, std::size_t i, std::int64_t offset, std::int64_t length) const {
    if (!sliced()) return index_.tensor(names_[i] + "." + which).reshape({-1}).narrow(0, offset, length);
    const std::int64_t begin = offsets_[i] + offset;
    std::vector<torch::Tensor> pieces;
    for (std::int64_t at = begin; at < begin + length;) {
      const auto r = static_cast<std::size_t>(at / slice_);
      const auto take = std::min(begin + length, static_cast<std::int64_t>(r + 1) * slice_) - at;
      pieces.push_back(files_[r].tensor(which).narrow(0, at - static_cast<std::int64_t>(r) * slice_, take));
      at += take;
    }
    return pieces.size() == 1 ? pieces.front() : torch::cat(pieces);
  }

 private:
  const SafetensorsFile& index_;
  const std::vector<std::string>& names_;
  std::vector<std::int64_t> offsets_;
  std::vector<SafetensorsFile> files_;
  std::int64_t slice_ = 0;
};

/// student.shard: each of the shard's views gets its slice of the saved moments.
void restore_shard_moments(const OptimizerShard& shard, const SafetensorsFile& index, const SavedMoments& saved,
                           const std::vector<std::string>& names, const std::vector<bool>& has_state, bool amsgrad,
                           torch::optim::AdamW& optimizer) {
  WD_CHECK_DATA(!amsgrad, index.path(), "__metadata__.amsgrad", "student.shard does not support amsgrad");
  torch::NoGradGuard no_grad;
  const auto& views = shard.views();
  for (std::size_t k = 0; k < views.size(); ++k) {
    const auto& seg = shard.segments()[k];
    const auto key = compat::optimizer_state_key(views[k]);
    if (!has_state[seg.param]) {
      optimizer.state().erase(key);
      continue;
    }
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(index.tensor(names[seg.param] + ".step").item<std::int64_t>());
    state->exp_avg(like_param(views[k], saved.read("exp_avg", seg.param, seg.offset, seg.length)));
    state->exp_avg_sq(like_param(views[k], saved.read("exp_avg_sq", seg.param, seg.offset, seg.length)));
    optimizer.state()[key] = std::move(state);
  }
}

}  // namespace

void expect_saved_tensor(const SafetensorsFile& file, const std::string& name, const torch::Tensor& like) {
  WD_CHECK_DATA(file.contains(name), file.path(), name,
                "missing: the checkpoint was written for a student with other tensors");
  const auto& info = file.info(name);
  const auto dtype = scalar_type_to_safetensors(like.scalar_type());
  WD_CHECK_DATA(info.dtype == dtype, file.path(), name, "dtype mismatch: expected " << dtype << ", found " << info.dtype);
  WD_CHECK_DATA(like.sizes().vec() == info.shape, file.path(), name,
                "shape mismatch: expected " << shape_text(like.sizes()) << ", found " << shape_text(info.shape));
}

std::string moment_slice_file(int index, int count) {
  char name[64];
  std::snprintf(name, sizeof(name), "optimizer-slice-%05d-of-%05d.safetensors", index, count);
  return name;
}

void write_moment_slice(const std::string& dir, const MomentSlice& slice) {
  write_safetensors((std::filesystem::path(dir) / moment_slice_file(slice.index, slice.count)).string(),
                    TensorMap{{"exp_avg", slice.exp_avg}, {"exp_avg_sq", slice.exp_avg_sq}},
                    {{"format", kFormat},
                     {"version", std::to_string(kVersion)},
                     {"slice", std::to_string(slice.index)},
                     {"slices", std::to_string(slice.count)},
                     {"begin", std::to_string(slice.begin)},
                     {"size", std::to_string(slice.size)},
                     {"padded", std::to_string(slice.padded)},
                     {"steps", std::to_string(slice.steps)}});
}

void save_train_state(const std::string& dir, const StudentParts& parts, const torch::optim::AdamW& optimizer,
                      const TrainCursor& cursor, const std::string& config_ini, bool export_student,
                      const MomentSlice* slice) {
  const auto& params = parts.trainable();
  const auto& names = parts.trainable_names();
  const auto& options = adamw_options(optimizer);

  TensorMap weights;
  TensorMap moments;
  for (std::size_t i = 0; i < params.size(); ++i) {
    weights[names[i]] = params[i].detach();
    if (slice) {
      // The moments are in the slice files; each tensor's step count stays here.
      if (slice->steps > 0) moments[names[i] + ".step"] = torch::full({1}, slice->steps, torch::kLong);
      continue;
    }
    const auto it = optimizer.state().find(compat::optimizer_state_key(params[i]));
    if (it == optimizer.state().end()) continue;  // not stepped yet (no gradient so far)
    const auto* state = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
    WD_CHECK(state != nullptr, "optimizer state of " << names[i] << " is not AdamW state");
    moments[names[i] + ".exp_avg"] = state->exp_avg();
    moments[names[i] + ".exp_avg_sq"] = state->exp_avg_sq();
    if (state->max_exp_avg_sq().defined()) moments[names[i] + ".max_exp_avg_sq"] = state->max_exp_avg_sq();
    moments[names[i] + ".step"] = torch::full({1}, state->step(), torch::kLong);
  }
  const std::map<std::string, std::string> common = {
      {"format", kFormat}, {"version", std::to_string(kVersion)}, {"step", std::to_string(cursor.step)}};
  write_safetensors(join(dir, TrainStateFiles::kTrainable), weights, common);
  auto optimizer_meta = common;
  optimizer_meta.insert({{"optimizer", "AdamW"},
                         {"lr", exact(options.lr())},
                         {"beta1", exact(std::get<0>(options.betas()))},
                         {"beta2", exact(std::get<1>(options.betas()))},
                         {"eps", exact(options.eps())},
                         {"weight_decay", exact(options.weight_decay())},
                         {"amsgrad", options.amsgrad() ? "true" : "false"}});
  if (slice) {
    // The flat layout the slices cut: the tensors in this order, padded to `padded` elements.
    optimizer_meta.insert({{"slices", std::to_string(slice->count)},
                           {"slice_size", std::to_string(slice->size)},
                           {"padded", std::to_string(slice->padded)},
                           {"flat_order", nlohmann::json(names).dump()}});
    write_moment_slice(dir, *slice);
  }
  write_safetensors(join(dir, TrainStateFiles::kOptimizer), moments, optimizer_meta);

  const auto rng = compat::rng_snapshot(params.empty() ? torch::Device(torch::kCPU) : params.front().device());
  nlohmann::ordered_json trainer = {{"format", kFormat},
                                    {"version", kVersion},
                                    {"step", cursor.step},
                                    {"trainable_tensors", params.size()},
                                    {"cpu_generator_state", to_hex(rng.cpu_state)}};
  if (rng.device_state.defined()) {
    trainer["device_generator"] = rng.device.str();
    trainer["device_generator_state"] = to_hex(rng.device_state.cpu());
  }
  write_file_atomically(join(dir, TrainStateFiles::kTrainer), trainer.dump(2) + "\n");
  write_file_atomically(join(dir, TrainStateFiles::kConfig), config_ini);
  if (export_student) parts.save(join(dir, TrainStateFiles::kStudent));
}

namespace {

/// trainer.json: the step and the random generators' states (the device's for a CUDA student).
std::pair<TrainCursor, compat::RngSnapshot> read_trainer_file(const std::string& dir,
                                                              const std::vector<torch::Tensor>& params) {
  const auto trainer_path = join(dir, TrainStateFiles::kTrainer);
  nlohmann::json trainer;
  try {
    std::ifstream in(trainer_path);
    WD_CHECK_DATA(in.good(), trainer_path, "", "cannot open");
    trainer = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(trainer_path, "", std::string("not valid JSON: ") + e.what());
  }
  TrainCursor cursor;
  compat::RngSnapshot rng;
  try {
    WD_CHECK_DATA(trainer.at("format").get<std::string>() == kFormat && trainer.at("version").get<int>() == kVersion,
                  trainer_path, "format", "expected " << kFormat << " version " << kVersion << ", found "
                                                      << trainer.at("format") << " version " << trainer.at("version"));
    cursor.step = trainer.at("step").get<std::int64_t>();
    rng.cpu_state = from_hex(trainer.at("cpu_generator_state").get<std::string>(), trainer_path, "cpu_generator_state");
    if (trainer.contains("device_generator_state") && !params.empty() && params.front().device().is_cuda()) {
      rng.device = params.front().device();
      rng.device_state =
          from_hex(trainer.at("device_generator_state").get<std::string>(), trainer_path, "device_generator_state");
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(trainer_path, "", std::string("malformed: ") + e.what());
  }
  return {cursor, rng};
}

}  // namespace

TrainCursor load_train_state(const std::string& dir, StudentParts& parts, torch::optim::AdamW& optimizer,
                             const OptimizerShard* shard) {
  const auto& params = parts.trainable();
  const auto& names = parts.trainable_names();
  auto& options = static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups().front().options());
  adamw_options(optimizer);  // checks there is one group

  // Everything is checked first, so a refused checkpoint leaves parts and optimizer untouched.
  const auto weights = SafetensorsFile::open(join(dir, TrainStateFiles::kTrainable));
  for (std::size_t i = 0; i < params.size(); ++i) expect_saved_tensor(weights, names[i], params[i]);
  if (weights.tensors().size() != params.size()) {
    for (const auto& t : weights.tensors()) {
      WD_CHECK_DATA(std::find(names.begin(), names.end(), t.name) != names.end(), weights.path(), t.name,
                    "not a trainable tensor of the current student (" << params.size() << " tensors)");
    }
  }

  const auto moments = SafetensorsFile::open(join(dir, TrainStateFiles::kOptimizer));
  const auto meta = [&](const std::string& key) {
    const auto it = moments.metadata().find(key);
    WD_CHECK_DATA(it != moments.metadata().end(), moments.path(), "__metadata__." + key, "missing");
    return it->second;
  };
  const bool saved_amsgrad = meta("amsgrad") == "true";
  WD_CHECK_DATA(saved_amsgrad || !options.amsgrad(), moments.path(), "__metadata__.amsgrad",
                "expected true (the optimizer uses amsgrad), found false: there is no max_exp_avg_sq to resume");
  if (saved_amsgrad && !options.amsgrad()) {
    spdlog::warn("resuming without amsgrad; the checkpoint's max_exp_avg_sq is dropped");
  }
  const SavedMoments saved(dir, moments, names, params);
  WD_CHECK_DATA(!saved.sliced() || !options.amsgrad(), moments.path(), "__metadata__.slices",
                "moments saved in slices (student.shard) have no max_exp_avg_sq for amsgrad");
  std::vector<bool> has_state(params.size(), false);
  const auto step_like = torch::zeros({1}, torch::kLong);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!saved.has(i)) continue;
    has_state[i] = true;
    expect_saved_tensor(moments, names[i] + ".step", step_like);
    if (saved.sliced()) continue;  // the slice files were checked whole
    expect_saved_tensor(moments, names[i] + ".exp_avg", params[i]);
    expect_saved_tensor(moments, names[i] + ".exp_avg_sq", params[i]);
    if (options.amsgrad()) expect_saved_tensor(moments, names[i] + ".max_exp_avg_sq", params[i]);
  }
  const std::pair<const char*, double> current[] = {{"beta1", std::get<0>(options.betas())},
                                                    {"beta2", std::get<1>(options.betas())},
                                                    {"eps", options.eps()},
                                                    {"weight_decay", options.weight_decay()}};
  for (const auto& [key, value] : current) {
    if (meta(key) != exact(value)) {
      spdlog::warn("resuming with AdamW {} = {} (the checkpoint was trained with {})", key, exact(value), meta(key));
    }
  }
  double saved_lr = 0;
  try {
    saved_lr = std::stod(meta("lr"));
  } catch (const std::exception&) {
    throw DataError(moments.path(), "__metadata__.lr", "not a number: \"" + meta("lr") + "\"");
  }

  const auto [cursor, rng] = read_trainer_file(dir, params);
  WD_CHECK_DATA(weights.metadata().count("step") && weights.metadata().at("step") == std::to_string(cursor.step),
                weights.path(), "__metadata__.step",
                "expected " << cursor.step << " (" << TrainStateFiles::kTrainer << "), found "
                            << (weights.metadata().count("step") ? weights.metadata().at("step") : "none"));

  // All checked: copy in place (the optimizer, the reducer and the bf16 pairs hold these tensors).
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto param = params[i];
      param.copy_(weights.tensor(names[i]));
      if (shard) continue;
      const auto key = compat::optimizer_state_key(param);
      if (!has_state[i]) {
        optimizer.state().erase(key);
        continue;
      }
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(moments.tensor(names[i] + ".step").item<std::int64_t>());
      state->exp_avg(like_param(param, saved.read("exp_avg", i, 0, param.numel()).view(param.sizes())));
      state->exp_avg_sq(like_param(param, saved.read("exp_avg_sq", i, 0, param.numel()).view(param.sizes())));
      if (options.amsgrad()) state->max_exp_avg_sq(like_param(param, moments.tensor(names[i] + ".max_exp_avg_sq")));
      optimizer.state()[key] = std::move(state);
    }
  }
  if (shard) restore_shard_moments(*shard, moments, saved, names, has_state, options.amsgrad(), optimizer);
  options.lr(saved_lr);
  compat::rng_restore(rng);
  parts.after_optimizer_step();
  return cursor;
}

void Trainable::restore(const std::string& dir, std::int64_t step, const std::string& whose) const {
  WholeWeights whole(optimizer.shard());  // student.shard parameters: the load writes whole tensors
  const auto cursor = load_train_state(dir, parts, optimizer.adamw(), optimizer.shard());
  whole.adopt();
  WD_CHECK_DATA(cursor.step == step, dir, TrainStateFiles::kTrainer,
                "step " << cursor.step << " differs from " << whose << " step " << step);
}

TrainableSave::TrainableSave(const Trainable& trainable, std::int64_t steps_done)
    : trainable_(trainable),
      steps_done_(steps_done),
      whole_(trainable.optimizer.shard()),
      slice_(trainable.optimizer.shard()
                 ? std::optional(trainable.optimizer.shard()->moment_slice(trainable.optimizer.adamw(), steps_done))
                 : std::nullopt) {}

void TrainableSave::write(const std::string& dir, const std::string& config_ini, bool export_student) const {
  save_train_state(dir, trainable_.parts, trainable_.optimizer.adamw(), {steps_done_}, config_ini, export_student,
                   slice_ ? &*slice_ : nullptr);
}

void TrainableSave::write_slice(const std::string& dir) const {
  if (slice_) write_moment_slice(dir, *slice_);
}

}  // namespace wd::student
