// Student construction and export.
#include "student/student_model.hpp"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "core/errors.hpp"

namespace wd::student {

namespace {

/// student.init weights:PATH: every tensor of the student from the checkpoint at PATH, whose
/// config must be the student's (the student.* keys, 0 = the teacher's) field for field.
void copy_checkpoint(WanDiT& model, const StudentConfig& config, const std::string& role) {
  const auto path = config.init_weights();
  const auto source = WanCheckpoint::open(path);
  std::string differ;
  for (const auto& d : source.config().differences(model->config())) {
    differ += fmt::format("{}{} {} (the student's: {})", differ.empty() ? "" : ", ", d.field, d.mine, d.other);
  }
  WD_CHECK_AS(ConfigError, differ.empty(),
              "student.init(" << config.init << "): " << source.config_path()
                              << " is not a model of the student's dims: " << differ
                              << "; set the student.* keys to its dims (0 = the teacher's)");
  torch::NoGradGuard no_grad;
  std::size_t copied = 0;
  for (auto& p : model->named_parameters()) {
    if (!source.contains(p.key())) {
      throw DataError(path, p.key(), "missing: student.init(" + config.init + ") needs every tensor of the student");
    }
    const auto& shape = source.info(p.key()).shape;
    if (p.value().sizes().vec() != shape) {
      throw DataError(path, p.key(),
                      fmt::format("shape {}, the student's is {} (student.init({}))", fmt::join(shape, "x"),
                                  fmt::join(p.value().sizes().vec(), "x"), config.init));
    }
    p.value().copy_(source.tensor(p.key(), torch::kFloat));
    ++copied;
  }
  spdlog::info("{} initialised from {} (all {} tensors)", role, source.path(), copied);
}

}  // namespace

WanDiT build_student(const WanConfig& student, const StudentConfig& config,
                     const WanCheckpoint* teacher, std::uint64_t seed, const std::string& role) {
  WanDiT model(student, WanInit::kRandom, torch::kFloat, seed);
  if (!config.init_weights().empty()) {
    copy_checkpoint(model, config, role);
    return model;
  }
  const auto blocks = config.teacher_blocks();
  if (blocks.empty()) return model;
  WD_CHECK_AS(ConfigError, teacher != nullptr,
              "student.init(" << config.init << ") copies teacher blocks, and this job has no teacher");
  const auto& tc = teacher->config();
  WD_CHECK_AS(ConfigError, static_cast<std::int64_t>(blocks.size()) == student.num_layers,
              "student.init(" << config.init << ") lists " << blocks.size()
                              << " blocks, student.num_layers is " << student.num_layers);
  WD_CHECK_AS(ConfigError, tc.dim == student.dim && tc.ffn_dim == student.ffn_dim &&
                               tc.num_heads == student.num_heads,
              "student.init(" << config.init << ") needs the teacher's block dims: teacher dim "
                              << tc.dim << " ffn_dim " << tc.ffn_dim << " num_heads " << tc.num_heads
                              << ", student " << student.dim << "/" << student.ffn_dim << "/"
                              << student.num_heads);
  torch::NoGradGuard no_grad;
  auto params = model->named_parameters();
  std::size_t copied = 0;
  for (auto& p : params) {
    std::string source = p.key();
    if (source.rfind("blocks.", 0) == 0) {
      const auto dot = source.find('.', 7);
      const auto j = std::stoll(source.substr(7, dot - 7));
      WD_CHECK_AS(ConfigError, blocks[j] >= 0 && blocks[j] < tc.num_layers,
                  "student.init(" << config.init << ") names block " << blocks[j]
                                  << "; the teacher has blocks 0.." << tc.num_layers - 1);
      source = "blocks." + std::to_string(blocks[j]) + source.substr(dot);
    }
    if (!teacher->contains(source)) continue;
    const auto& shape = teacher->info(source).shape;
    if (p.value().sizes().vec() != shape) continue;  // e.g. a head for other out_dim
    p.value().copy_(teacher->tensor(source, torch::kFloat));
    ++copied;
  }
  spdlog::info("{} initialised from teacher blocks {} ({} of {} tensors copied)", role,
               config.init.substr(15), copied, params.size());
  return model;
}

void save_student(WanDiT& model, const std::string& dir) {
  std::filesystem::create_directories(dir);
  write_file_atomically((std::filesystem::path(dir) / "config.json").string(), model->config().to_json());
  TensorMap tensors;
  for (const auto& p : model->named_parameters()) tensors[p.key()] = p.value().detach();
  write_sharded_safetensors(dir, "diffusion_pytorch_model", tensors, 4'000'000'000ULL,
                            {{"format", "pt"}, {"producer", "wan-distill train"}});
}

}  // namespace wd::student
