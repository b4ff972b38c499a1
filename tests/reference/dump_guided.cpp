// dump_guided: train.objective guided's teacher target on the official-layout fixture teacher
// tests/fixtures/wan-tiny-a, written for tests/python/test_guided_reference.py to recompute with
// diffusers: the teacher stage with guidance (one batched [cond; neg] forward, in micro-batches
// of 2 to take that path too) on the fixture's inputs and a random 3-row negative context.
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
  batch.x_t = inputs.tensor("x", torch::kFloat);
  batch.t = inputs.tensor("t", torch::kFloat);
  batch.context = inputs.tensor("context", torch::kFloat);
  batch.context_lens = inputs.tensor("context_lens", torch::kLong);
  stage.run(batch);
  write_safetensors(argv[2],
                    {{"x", batch.x_t}, {"t", batch.t}, {"context", batch.context}, {"context_lens", batch.context_lens},
                     {"negative", negative}, {"out", batch.out}, {"guidance", torch::tensor({kGuidance})}},
                    {{"producer", "dump_guided"}});
  std::cout << "wrote " << argv[2] << " (" << batch.out.size(0) << " samples)\n";
  return 0;
}
