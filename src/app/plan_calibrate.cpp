// Times the job's teacher forward and student step on this host or its GPU, and builds the
// speed model's input (plan, train --teacher.layout auto).
#include "app/plan_calibrate.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "comm/transport.hpp"
#include "model/wan_dit.hpp"
#include "student/checkpointing.hpp"
#include "student/student_parts.hpp"
#include "teacher/compute_dtype.hpp"

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
                            std::int64_t tokens, std::int64_t context_len, std::int64_t batch, int threads,
                            const c10::Device& device) {
  const int before = torch::get_num_threads();
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  const auto [C, F, H, W] = latent;
  const auto on = torch::TensorOptions().device(device);
  const auto x_t = torch::randn({batch, C, F, H, W}, on);
  const auto t = torch::rand({batch}, on) * 1000;
  const auto context = torch::randn({batch, context_len, teacher.text_dim}, on);
  const auto lens = torch::full({batch}, context_len, on.dtype(torch::kLong));
  const auto y = teacher.in_dim > C ? torch::randn({batch, teacher.in_dim - C, F, H, W}, on) : torch::Tensor();
  Calibration c;
  c.threads = threads;

  comm::TensorDict message{{"x_t", x_t}, {"t", t}, {"context", context}, {"context_lens", lens}};
  const auto pairs = cfg.student.feature_pairs();
  {
    WanDiT dit(teacher, WanInit::kRandom, weights, 0);
    dit->to(device);
    dit->eval();
    dit->set_compute_dtype(compute);
    torch::NoGradGuard no_grad;
    const auto inputs = WanInputs::batched(x_t, t, context, lens, 0, y);
    std::vector<torch::Tensor> out;
    // .item() waits for a GPU's kernels.
    c.teacher_s_per_sample = median_run([&] {
                               out = dit->forward(inputs);
                               static_cast<void>(out.back().sum().item<float>());
                             }) /
                             static_cast<double>(batch);
    message["teacher_out"] = torch::stack(out).to(torch::kFloat);
    for (const auto& [s, j] : pairs) message["feat." + std::to_string(j)] = torch::randn({batch, tokens, teacher.dim}, on);
  }

  student::PartsSetup setup;
  setup.teacher_in_channels = C;
  setup.teacher_out_channels = message.at("teacher_out").size(1);
  setup.teacher_dim = teacher.dim;
  setup.feature_pairs = pairs;
  setup.feature_weight = cfg.student.feature_weight;
  setup.train_projections = cfg.student.projection == "trained";
  setup.mixed_bf16 = cfg.student.precision == "bf16-mixed";
  setup.device = device;
  student::StudentParts parts(WanDiT(cfg.student.model_config(teacher), WanInit::kRandom, torch::kFloat, 1), setup);
  torch::optim::AdamW optimizer(parts.trainable(), torch::optim::AdamWOptions(cfg.train.lr));
  const auto policy = student::CheckpointPolicy::parse(cfg.student.checkpointing);
  c.student_s_per_sample = median_run([&] {
                             parts.zero_grad();
                             parts.micro_step(message, 1.0, policy);
                             if (cfg.train.grad_clip > 0) torch::nn::utils::clip_grad_norm_(parts.trainable(), cfg.train.grad_clip);
                             optimizer.step();
                             parts.after_optimizer_step();
                             static_cast<void>(parts.trainable().front().sum().item<float>());
                           }) /
                           static_cast<double>(batch);
  torch::set_num_threads(before);
  return c;
}

std::optional<memory::SpeedInput> speed_input(const RunConfig& cfg, const memory::PlanInput& in, const WanConfig& tc,
                                              c10::ScalarType weights, const std::array<std::int64_t, 4>& latent,
                                              int world, std::optional<c10::Device> device, int cores,
                                              double teacher_gflops, double student_gflops,
                                              const std::string& calibrate) {
  memory::SpeedInput s;
  s.teacher = in.teacher;
  s.student = in.student;
  s.tokens = in.tokens;
  s.context_len = in.context_len;
  s.batch = in.batch;
  s.recomputed_blocks = in.checkpointed_blocks;
  s.ranks = world;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool host = device && device->is_cpu();
  s.cores = cores >= 0 ? cores : (host ? hw : 0);
  s.teacher_gflops = teacher_gflops;
  s.student_gflops = student_gflops;
  if (teacher_gflops > 0 && student_gflops > 0) return s;
  if (!device) return std::nullopt;
  // What a rank of the job gets: the host's cores shared out over the ranks (train's rule); a
  // GPU rank keeps its process's threads.
  const int threads = host ? std::max(1, (s.cores > 0 ? s.cores : hw) / std::max(1, world)) : torch::get_num_threads();
  const int before = torch::get_num_threads();
  torch::set_num_threads(threads);
  const auto compute = teacher::choose_compute(cfg.teacher.compute, weights, *device);
  const double matmul = teacher::matmul_gflops(compute.dtype.value_or(weights), *device);
  const double fp32 = teacher::matmul_gflops(torch::kFloat, *device);
  torch::set_num_threads(before);
  if (teacher_gflops <= 0) s.teacher_gflops = memory::kForwardEfficiency * matmul;
  if (student_gflops <= 0) s.student_gflops = memory::kTrainEfficiency * fp32;
  const double batch_forward_s =
      memory::dit_forward_flops(in.teacher, in.tokens, in.context_len) * static_cast<double>(in.batch) /
      (s.teacher_gflops * 1e9);
  if (calibrate == "yes" || (calibrate == "auto" && batch_forward_s < 60)) {
    spdlog::info("timing the teacher forward and the student step of this job on {} ({} thread(s))", device->str(),
                 threads);
    const auto c = calibrate_speed(cfg, tc, weights, compute.dtype, latent, in.tokens, in.context_len, in.batch,
                                   threads, *device);
    s.teacher_measured_s = c.teacher_s_per_sample;
    s.student_measured_s = c.student_s_per_sample;
  }
  return s;
}

}  // namespace wd::app
