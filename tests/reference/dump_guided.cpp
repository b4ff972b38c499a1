// dump_guided: train.objective guided's teacher target on an official-layout fixture teacher
// (tests/fixtures/wan-tiny-a, or wan-tiny-i2v with its image condition y), written for
// tests/python/test_guided_reference.py to recompute with diffusers: the teacher stage with
// guidance (one batched [cond; neg] forward, in micro-batches of 2 to take that path too) on the
// fixture's inputs and a random 3-row negative context.
// Usage: dump_guided FIXTURE_DIR OUT_FILE
#include <torch/torch.h>

#include <iostream>

#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "teacher/teacher_stage.hpp"

int main(int argc, char** argv) {
  using namespace wd;
  if (argc != 3) {
    std::cerr << "usage: dump_guided FIXTURE_DIR OUT_FILE\n";
    return 2;
  }
  const std::string fixture = argv[1];
  constexpr double kGuidance = 3.5;
  const auto ck = WanCheckpoint::open(fixture + "/weights.safetensors", fixture + "/config.json");
  const auto inputs = SafetensorsFile::open(fixture + "/inputs.safetensors");
  teacher::StageLoad how;
  how.dtype = torch::kFloat;
  how.blocks = {0, ck.config().num_layers};
  std::vector<teacher::StageModel> models;
  models.push_back(teacher::load_stage_model(ck, how));
  teacher::TeacherStage stage(std::move(models), nullptr, how.blocks, {});
  torch::manual_seed(5);
  const auto negative = torch::randn({3, ck.config().text_dim});
  stage.set_guidance(kGuidance, negative);
  stage.set_micro_batch(2);
  teacher::StageBatch batch;
  // A fixture's inputs are one batch (x) or a list of samples (x.0, x.1, ... and an i2v model's y.0, ...).
  const auto stacked = [&](const std::string& name) {
    if (inputs.contains(name)) return inputs.tensor(name, torch::kFloat);
    std::vector<torch::Tensor> rows;
    for (int i = 0; inputs.contains(name + "." + std::to_string(i)); ++i) {
      rows.push_back(inputs.tensor(name + "." + std::to_string(i), torch::kFloat));
    }
    return rows.empty() ? torch::Tensor() : torch::stack(rows);
  };
  batch.x_t = stacked("x");
  batch.y = stacked("y");
  batch.t = inputs.tensor("t", torch::kFloat);
  batch.context = inputs.tensor("context", torch::kFloat);
  batch.context_lens = inputs.tensor("context_lens", torch::kLong);
  stage.run(batch);
  std::map<std::string, torch::Tensor> dump{
      {"x", batch.x_t}, {"t", batch.t},     {"context", batch.context},           {"context_lens", batch.context_lens},
      {"negative", negative}, {"out", batch.out}, {"guidance", torch::tensor({kGuidance})}};
  if (batch.y.defined()) dump["y"] = batch.y;
  write_safetensors(argv[2], dump, {{"producer", "dump_guided"}});
  std::cout << "wrote " << argv[2] << " (" << batch.out.size(0) << " samples)\n";
  return 0;
}
