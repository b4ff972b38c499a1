// The sampling commands' teacher in a placement (sampling_teacher.hpp).
#include "teacher/sampling_teacher.hpp"

#include <spdlog/spdlog.h>

#include <memory>

#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "teacher/placement.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::teacher {

const std::vector<std::pair<SamplingPlacementChoice, const char*>>& choices(SamplingPlacementChoice) {
  static const std::vector<std::pair<SamplingPlacementChoice, const char*>> names{
      {SamplingPlacementChoice::kAuto, "auto"},
      {SamplingPlacementChoice::kGpu, "gpu"},
      {SamplingPlacementChoice::kCpu, "cpu"},
      {SamplingPlacementChoice::kStream, "stream"}};
  return names;
}

void SamplingPlacement::bind(OptionTable& t) {
  t.bind("teacher.placement", placement,
         "where the teacher computes: gpu (every weight on --device), cpu (on the host, whatever --device), "
         "stream (blocks stay mapped on the host and are copied to --device ahead of use: a teacher larger "
         "than the GPU), auto (gpu on a CUDA --device, else cpu); shard and colocated are train's")
      .bind("teacher.stream_ahead", stream_ahead, "stream: blocks copied ahead of the one computing");
}

void SamplingPlacement::validate(ConfigProblems& p, const std::string& device) const {
  p.check(stream_ahead >= 1, "teacher.stream_ahead(" + std::to_string(stream_ahead) + ") must be >= 1");
  p.check(placement != SamplingPlacementChoice::kGpu || device.rfind("cuda", 0) == 0,
          "teacher.placement(gpu) needs a CUDA --device (device is " + device + "); cpu or stream here");
}

plan::Placement SamplingPlacement::resolve(const c10::Device& device) const {
  switch (placement) {
    case SamplingPlacementChoice::kGpu:
      return plan::Placement::kGpu;
    case SamplingPlacementChoice::kStream:
      return plan::Placement::kStream;
    case SamplingPlacementChoice::kCpu:
      return plan::Placement::kCpu;
    case SamplingPlacementChoice::kAuto:
      break;
  }
  return device.is_cuda() ? plan::Placement::kGpu : plan::Placement::kCpu;
}

SamplingModel load_sampling_teacher(const SamplingTeacherLoad& how) {
  WD_CHECK_AS(ConfigError, how.placement != plan::Placement::kShard,
              "teacher.placement(shard): sampling holds the whole teacher on one process (gpu, cpu or stream)");
  SamplingModel teacher;
  teacher.experts = WanExperts::open(how.path, how.boundary > 0 ? std::optional<double>(how.boundary) : std::nullopt);
  const auto& tc = teacher.experts->config();
  StageLoad load;
  load.placement = how.placement;
  load.dtype = how.dtype;
  load.device = how.placement == plan::Placement::kCpu ? c10::Device(torch::kCPU) : how.device;
  load.blocks = {0, tc.num_layers};
  load.stream_ahead = how.stream_ahead;
  std::vector<StageModel> models;
  for (const auto& e : teacher.experts->experts()) {
    load.arena_tag = "expert" + std::to_string(models.size());  // stream: each expert its own arena
    models.push_back(load_stage_model(e, load));
  }
  Router router;
  if (teacher.experts->two_experts()) {
    // The experts outlive the stage: both are held by the returned model's forward.
    auto experts = std::make_shared<WanExperts>(*teacher.experts);
    router = [experts](const torch::Tensor& t) { return experts->route(t); };
  }
  auto stage = std::make_shared<TeacherStage>(std::move(models), router, load.blocks, std::vector<std::int64_t>{});
  teacher.forward = [stage](const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                            const torch::Tensor& lens, const torch::Tensor& y) {
    StageBatch batch;
    batch.x_t = x;
    batch.t = t;
    batch.context = context;
    batch.context_lens = lens;
    batch.y = y;
    stage->run(batch);
    return batch.out.to(x.device(), torch::kFloat);
  };
  spdlog::info("teacher: {}; placement {} on {}", tc.summary(), plan::placement_name(how.placement), load.device.str());
  return teacher;
}

}  // namespace wd::teacher
