// dump_trajectory: train.objective trajectory's batches on the official-layout fixture teacher
// tests/fixtures/wan-tiny-a, written for tests/python/test_trajectory_reference.py to recompute
// with diffusers (WanTransformer3DModel guided by hand, its flow-match schedulers stepping the same
// noise): one round of 2 trajectories, 6 guided teacher steps cut into 3 student intervals, shift
// 3, once with the UniPC sampler and once with Euler. For each solver S the file holds S.x, S.t,
// S.v (every pair of the round, in deal order), S.traj and S.interval (whose pair each is),
// S.teacher_sigmas and S.student_sigmas; and the round's context, context_lens and guidance.
// With `i2v`, the teacher is a random i2v model of the fixture's dims (in_dim 2·out_dim + 4,
// written to WORK_DIR/trajectory-i2v-teacher in the official layout) and the data set has image
// conditions: every pair's y is in S.y as well. With `ti2v`, a random ti2v model of the fixture's
// dims (per-token timesteps, WORK_DIR/trajectory-ti2v-teacher) and a data set with each video's
// first latent frame as its image: the states keep it as their clean first frame, t is per token.
// With `experts`, a two-expert teacher (two random models of the fixture's dims,
// WORK_DIR/trajectory-experts-teacher/{high,low}_noise_model, boundary 0.875) guided per expert
// with 3 (low-noise) and 4 (high-noise), as the official T2V-A14B sampler; `guidance` holds both
// and `boundary` the boundary timestep.
// Usage: dump_trajectory FIXTURE_DIR WORK_DIR OUT_FILE [i2v|ti2v|experts]
#include <torch/torch.h>

#include <iostream>
#include <optional>

#include "comm/stream_plan.hpp"
#include "data/dataset_info.hpp"
#include "data/dataset_reader.hpp"
#include "data/synthetic_dataset.hpp"
#include "model/image_condition.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_experts.hpp"
#include "teacher/trajectory.hpp"

int main(int argc, char** argv) {
  using namespace wd;
  const std::string kind = argc == 5 ? argv[4] : "t2v";
  if (argc < 4 || argc > 5 || (kind != "t2v" && kind != "i2v" && kind != "ti2v" && kind != "experts")) {
    std::cerr << "usage: dump_trajectory FIXTURE_DIR WORK_DIR OUT_FILE [i2v|ti2v|experts]\n";
    return 2;
  }
  const std::string fixture = argv[1], work = argv[2];
  const bool i2v = kind == "i2v", ti2v = kind == "ti2v";
  const auto pair_dir = work + "/trajectory-experts-teacher";
  if (kind == "experts") {
    const auto c = WanCheckpoint::open(fixture + "/weights.safetensors", fixture + "/config.json").config();
    write_random_wan_checkpoint(pair_dir + "/" + WanExperts::kHighDir, c, torch::kFloat, 1ull << 30, 6);
    write_random_wan_checkpoint(pair_dir + "/" + WanExperts::kLowDir, c, torch::kFloat, 1ull << 30, 7);
  }
  std::optional<WanExperts> pair;
  if (kind == "experts") pair = WanExperts::open(pair_dir);
  constexpr double kGuidance = 3.5;
  constexpr std::int64_t kB = 2, kTeacherSteps = 6, kK = 3;
  auto ck = WanCheckpoint::open(fixture + "/weights.safetensors", fixture + "/config.json");
  if (i2v || ti2v) {
    WanConfig c = ck.config();
    c.model_type = kind;
    if (i2v) c.in_dim = 2 * c.out_dim + kI2vMaskChannels;
    const auto dir = work + "/trajectory-" + kind + "-teacher";
    write_random_wan_checkpoint(dir, c, torch::kFloat, 1ull << 30, 5);
    ck = WanCheckpoint::open(dir);
  }
  const auto& cfg = ck.config();
  // Contexts from a data set of the fixture's shapes (the teacher's math is what is checked).
  data::SyntheticDatasetSpec spec;
  spec.output = work + "/trajectory-" + kind + "-data.h5";  // one file per kind: ctest may run them at once
  spec.samples = 6;
  spec.latent = {cfg.out_dim, 3, 8, 8};
  spec.text_len = 8;
  spec.text_dim = cfg.text_dim;
  spec.seed = 4;
  spec.condition = image_condition_of(cfg);
  data::write_synthetic_dataset(spec);
  data::DatasetExpectations expect;
  if (i2v || ti2v) expect = {cfg.out_dim, cfg.text_dim, cfg.text_len, cfg.patch_size, spec.condition};
  const auto info = data::validate_dataset(spec.output, expect);
  data::DatasetReader reader(info);
  const data::SampleSchedule schedule(4, kB, 1, 3);
  comm::StreamPlan plan;
  plan.batch_per_student = kB;
  plan.latent = info.latent_shape;
  if (ti2v) plan.per_token_seq_len = 3 * (8 / cfg.patch_size[1]) * (8 / cfg.patch_size[2]);
  teacher::StageLoad how;
  how.dtype = torch::kFloat;
  how.blocks = {0, cfg.num_layers};
  std::vector<teacher::StageModel> models;
  teacher::Router router;
  if (pair) {
    for (const auto& e : pair->experts()) models.push_back(teacher::load_stage_model(e, how));
    router = [&pair](const torch::Tensor& t) { return pair->route(t); };
  } else {
    models.push_back(teacher::load_stage_model(ck, how));
  }
  teacher::TeacherStage stage(std::move(models), router, how.blocks, {});
  const GuidanceScale guidance = pair ? GuidanceScale(3.0, 4.0) : GuidanceScale(kGuidance);
  stage.set_guidance(guidance);  // zeros as the negative context
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const std::string solver : {"unipc", "euler"}) {
    const teacher::TrajectorySpec s{parse_choice<Solver>("solver", solver), kTeacherSteps, kK, 3.0};
    teacher::TrajectoryRounds rounds({&stage, reader, schedule, plan, s, 0, 1, kB, 4, 3});
    std::vector<torch::Tensor> x, t, v, y;
    std::vector<std::int64_t> traj, interval;
    for (std::int64_t slot = 0; slot < kK; ++slot) {
      const auto b = rounds.make(slot, false);
      x.push_back(b.x_t);
      t.push_back(b.t);
      v.push_back(b.out);
      if (i2v) y.push_back(b.y);
      for (std::int64_t j = 0; j < kB; ++j) {
        const auto [tr, i] = rounds.pair_at(0, false, slot * kB + j);
        traj.push_back(tr);
        interval.push_back(i);
      }
    }
    out.emplace_back(solver + ".x", torch::cat(x));
    out.emplace_back(solver + ".t", torch::cat(t));
    out.emplace_back(solver + ".v", torch::cat(v));
    if (i2v) out.emplace_back(solver + ".y", torch::cat(y));
    out.emplace_back(solver + ".traj", torch::tensor(traj, torch::kLong));
    out.emplace_back(solver + ".interval", torch::tensor(interval, torch::kLong));
    out.emplace_back(solver + ".teacher_sigmas", torch::tensor(s.teacher_sigmas(), torch::kDouble));
    out.emplace_back(solver + ".student_sigmas", torch::tensor(s.student_sigmas(), torch::kDouble));
  }
  const auto round = reader.read(schedule.indices(0, 0));
  out.emplace_back("context", round.context);
  out.emplace_back("context_lens", round.context_lens);
  out.emplace_back("guidance", pair ? torch::tensor({guidance.low, guidance.high}) : torch::tensor({kGuidance}));
  if (pair) out.emplace_back("boundary", torch::tensor({pair->boundary_timestep()}));
  std::map<std::string, torch::Tensor> tensors(out.begin(), out.end());
  write_safetensors(argv[3], tensors, {{"producer", "dump_trajectory"}});
  std::cout << "wrote " << argv[3] << "\n";
  return 0;
}
