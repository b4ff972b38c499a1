// Times the job's teacher forward and student step on this host (plan --calibrate).
#include "app/plan_calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "comm/transport.hpp"
#include "model/wan_dit.hpp"
#include "student/checkpointing.hpp"
#include "student/student_parts.hpp"

namespace wd::app {
namespace {

/// The median of timed runs after an untimed one (allocator, kernel choice): at least 3 runs,
/// more while they add up to under a second (a millisecond step varies by tens of percent).
double median_run(const std::function<void()>& run) {
  run();
  std::vector<double> seconds;
  double total = 0;
  while (seconds.size() < 3 || (total < 1.0 && seconds.size() < 50)) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    total += seconds.back();
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

Calibration calibrate_speed(const RunConfig& cfg, const WanConfig& teacher, c10::ScalarType weights,
                            std::optional<c10::ScalarType> compute, const std::array<std::int64_t, 4>& latent,
                            std::int64_t tokens, std::int64_t context_len, std::int64_t batch, int threads) {
  const int before = torch::get_num_threads();
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  const auto [C, F, H, W] = latent;
  const auto x_t = torch::randn({batch, C, F, H, W});
  const auto t = torch::rand({batch}) * 1000;
  const auto context = torch::randn({batch, context_len, teacher.text_dim});
  const auto lens = torch::full({batch}, context_len, torch::kLong);
  const auto y = teacher.in_dim > C ? torch::randn({batch, teacher.in_dim - C, F, H, W}) : torch::Tensor();
  Calibration c;
  c.threads = threads;

  comm::TensorDict message{{"x_t", x_t}, {"t", t}, {"context", context}, {"context_lens", lens}};
  const auto pairs = cfg.student.feature_pairs();
  {
    WanDiT dit(teacher, WanInit::kRandom, weights, 0);
    dit->eval();
    dit->set_compute_dtype(compute);
    torch::NoGradGuard no_grad;
    const auto inputs = WanInputs::batched(x_t, t, context, lens, 0, y);
    std::vector<torch::Tensor> out;
    c.teacher_s_per_sample = median_run([&] { out = dit->forward(inputs); }) / static_cast<double>(batch);
    message["teacher_out"] = torch::stack(out).to(torch::kFloat);
    for (const auto& [s, j] : pairs) message["feat." + std::to_string(j)] = torch::randn({batch, tokens, teacher.dim});
  }

  student::PartsSetup setup;
  setup.teacher_in_channels = C;
  setup.teacher_out_channels = message.at("teacher_out").size(1);
  setup.teacher_dim = teacher.dim;
  setup.feature_pairs = pairs;
  setup.feature_weight = cfg.student.feature_weight;
  setup.train_projections = cfg.student.projection == "trained";
  setup.mixed_bf16 = cfg.student.precision == "bf16-mixed";
  student::StudentParts parts(WanDiT(cfg.student.model_config(teacher), WanInit::kRandom, torch::kFloat, 1), setup);
  torch::optim::AdamW optimizer(parts.trainable(), torch::optim::AdamWOptions(cfg.train.lr));
  const auto policy = student::CheckpointPolicy::parse(cfg.student.checkpointing);
  c.student_s_per_sample = median_run([&] {
                             parts.zero_grad();
                             parts.micro_step(message, 1.0, policy);
                             if (cfg.train.grad_clip > 0) torch::nn::utils::clip_grad_norm_(parts.trainable(), cfg.train.grad_clip);
                             optimizer.step();
                             parts.after_optimizer_step();
                           }) /
                           static_cast<double>(batch);
  torch::set_num_threads(before);
  return c;
}

}  // namespace wd::app
