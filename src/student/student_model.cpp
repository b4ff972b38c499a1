// Student construction and export.
#include "student/student_model.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "core/errors.hpp"

namespace wd::student {

WanDiT build_student(const WanConfig& student, const StudentConfig& config,
                     const WanCheckpoint& teacher, std::uint64_t seed) {
  WanDiT model(student, WanInit::kRandom, torch::kFloat, seed);
  const auto blocks = config.teacher_blocks();
  if (blocks.empty()) return model;
  const auto& tc = teacher.config();
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
    if (!teacher.contains(source)) continue;
    const auto& shape = teacher.info(source).shape;
    if (p.value().sizes().vec() != shape) continue;  // e.g. a head for other out_dim
    p.value().copy_(teacher.tensor(source, torch::kFloat));
    ++copied;
  }
  spdlog::info("student initialised from teacher blocks {} ({} of {} tensors copied)",
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
