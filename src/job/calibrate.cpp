// Times the job's teacher forward and student step on this host or its GPU, and builds the
// speed model's input (plan, train --teacher.layout auto).
#include "job/calibrate.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "comm/message_spec.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "core/threads.hpp"
#include "job/parts_setup.hpp"
#include "model/wan_dit.hpp"
#include "student/checkpointing.hpp"
#include "student/distill_objective.hpp"
#include "student/student_parts.hpp"
#include "student/train_step.hpp"
#include "teacher/compute_dtype.hpp"
#include "teacher/cuda_host.hpp"
#include "teacher/matmul_probe.hpp"

namespace wd::job {
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

/// Random inputs of the job's shapes on `device` (seeded: every call sees the same values).
struct TeacherInputs {
  torch::Tensor x_t, t, context, lens, y;
};

TeacherInputs random_inputs(const WanConfig& teacher, const std::array<std::int64_t, 4>& latent,
                            std::int64_t context_len, std::int64_t batch, const c10::Device& device) {
  torch::manual_seed(0);
  const auto [C, F, H, W] = latent;
  const auto on = torch::TensorOptions().device(device);
  TeacherInputs in;
  in.x_t = torch::randn({batch, C, F, H, W}, on);
  in.t = torch::rand({batch}, on) * 1000;
  in.context = torch::randn({batch, context_len, teacher.text_dim}, on);
  in.lens = torch::full({batch}, context_len, on.dtype(torch::kLong));
  if (teacher.in_dim > C) in.y = torch::randn({batch, teacher.in_dim - C, F, H, W}, on);
  return in;
}

/// The teacher of `teacher` with random weights in `weights`, matmuls in `compute`, on `device`.
WanDiT random_teacher(const WanConfig& teacher, c10::ScalarType weights, std::optional<c10::ScalarType> compute,
                      const c10::Device& device) {
  WanDiT dit(teacher, WanInit::kRandom, weights, 0);
  dit->to(device);
  dit->eval();
  dit->set_compute_dtype(compute);
  return dit;
}

/// Seconds per sample of `dit`'s no-grad forward over `in`, `slice` samples a forward (as
/// TeacherStage runs a micro-batch: slices of the batch, the last one shorter); the last
/// forward's output, concatenated, goes to `out` when given.
double forward_seconds_per_sample(WanDiT& dit, const TeacherInputs& in, std::int64_t slice, torch::Tensor* out) {
  torch::NoGradGuard no_grad;
  const auto batch = in.x_t.size(0);
  const auto part = [](const torch::Tensor& x, std::int64_t lo, std::int64_t hi) {
    return x.defined() ? x.slice(0, lo, hi) : x;
  };
  std::vector<torch::Tensor> pieces;
  const double s = median_run([&] {
    pieces.clear();
    for (std::int64_t lo = 0; lo < batch; lo += slice) {
      const auto hi = std::min(batch, lo + slice);
      const auto inputs = WanInputs::batched(part(in.x_t, lo, hi), part(in.t, lo, hi), part(in.context, lo, hi),
                                             part(in.lens, lo, hi), 0, part(in.y, lo, hi));
      pieces.push_back(torch::stack(dit->forward(inputs)));
      static_cast<void>(pieces.back().sum().item<float>());  // waits for a GPU's kernels
    }
  });
  if (out) *out = torch::cat(pieces, 0).to(torch::kFloat);
  return s / static_cast<double>(batch);
}

}  // namespace

MicroBatchChoice choose_micro_batch(const WanConfig& teacher, c10::ScalarType weights,
                                    std::optional<c10::ScalarType> compute, const std::array<std::int64_t, 4>& latent,
                                    std::int64_t context_len, std::int64_t batch, const c10::Device& device) {
  const auto in = random_inputs(teacher, latent, context_len, batch, device);
  auto dit = random_teacher(teacher, weights, compute, device);
  std::vector<std::pair<std::int64_t, double>> by_size;
  std::string timings;
  for (const auto slice : plan::teacher_forward_sizes(batch)) {
    by_size.emplace_back(slice, forward_seconds_per_sample(dit, in, slice, nullptr));
    timings += fmt::format("{}{} a forward {:.3g} s/sample", timings.empty() ? "" : ", ", slice, by_size.back().second);
  }
  const auto pick = plan::fastest_forward(by_size, batch);
  MicroBatchChoice choice;
  choice.samples = pick.micro_batch;
  choice.seconds_per_sample = pick.seconds_per_sample;
  choice.reason = fmt::format("teacher.micro_batch auto: {} ({}; {} thread(s) on {})",
                              choice.samples == 0 ? "the whole batch of " + std::to_string(batch) + " at once"
                                                  : std::to_string(choice.samples) + " sample(s) a forward",
                              timings, torch::get_num_threads(), device.str());
  return choice;
}

Calibration calibrate_speed(const RunConfig& cfg, const WanConfig& teacher, c10::ScalarType weights,
                            std::optional<c10::ScalarType> compute, const std::array<std::int64_t, 4>& latent,
                            std::int64_t tokens, std::int64_t context_len, std::int64_t batch,
                            const std::vector<std::int64_t>& teacher_sizes, int threads,
                            const c10::Device& device) {
  WD_CHECK(!teacher_sizes.empty(), "calibrate_speed needs at least one teacher forward size");
  const ScopedIntraOpThreads pools(threads);
  const auto largest = std::max(batch, teacher_sizes.front());
  const auto in = random_inputs(teacher, latent, context_len, largest, device);
  const auto C = latent[0];
  Calibration c;
  c.threads = threads;

  const auto first = [&](const torch::Tensor& x) { return x.slice(0, 0, batch); };
  comm::TensorDict message{{"x_t", first(in.x_t)}, {"t", first(in.t)}, {"context", first(in.context)},
                           {"context_lens", first(in.lens)}};
  if (in.y.defined()) message["y"] = first(in.y);  // an i2v teacher's image condition, as the stream sends it
  const auto pairs = cfg.student.feature_pairs();
  {
    auto dit = random_teacher(teacher, weights, compute, device);
    torch::Tensor out;
    for (const auto n : teacher_sizes) {
      c.teacher_by_size.emplace_back(n, forward_seconds_per_sample(dit, in, n, n == largest ? &out : nullptr));
    }
    c.teacher_s_per_sample = c.teacher_by_size.front().second;
    if (!out.defined()) forward_seconds_per_sample(dit, in, largest, &out);
    message["teacher_out"] = first(out);
    const auto on = torch::TensorOptions().device(device);
    for (const auto& [s, j] : pairs) message["feat." + std::to_string(j)] = torch::randn({batch, tokens, teacher.dim}, on);
  }

  // The training students' set-up (their seed too; a LoRA base is not needed for the timing).
  const auto setup = parts_setup(cfg, C + (in.y.defined() ? in.y.size(1) : 0), message.at("teacher_out").size(1),
                                 teacher.dim, device);
  student::StudentParts parts(WanDiT(cfg.student.model_config(teacher), WanInit::kRandom, torch::kFloat, 1), setup);
  student::TrainOptimizer optimizer(parts.trainable(), student::TrainOptimizer::options(cfg.train.lr, cfg.train));
  student::DistillObjective objective(parts, cfg.student.checkpointing);
  student::FixedBatches batches({message});
  student::StepContext step{objective, optimizer, nullptr, cfg.train.grad_clip};
  c.student_s_per_sample = median_run([&] {
                             student::train_step(step, 0, cfg.train.lr, batches);
                             static_cast<void>(parts.trainable().front().sum().item<float>());
                           }) /
                           static_cast<double>(batch);
  return c;
}

namespace {

/// teacher.placement stream (given, or auto where the plan recommends it): what each teacher
/// forward copies, at teacher.pcie_gbps, else the host-to-device rate measured on `device` (a
/// GPU), else plan::kPcieGbps.
plan::StreamCost planned_stream(const RunConfig& cfg, const plan::PlanInput& in, std::optional<c10::Device> device) {
  if (in.cpu_job) return {};
  const auto p = cfg.teacher.placement;
  const bool streams = p == TeacherPlacement::kStream ||
                       (p == TeacherPlacement::kAuto && plan::make_plan(in).recommended == plan::Placement::kStream);
  if (!streams) return {};
  double gbps = cfg.teacher.pcie_gbps;
  std::string how = "teacher.pcie_gbps";
  if (gbps <= 0 && device && device->is_cuda()) {
    gbps = teacher::measure_h2d_gbps(*device, 256ull << 20, 3);
    how = "measured on " + device->str() + ", pinned, 256 MiB";
  }
  if (gbps <= 0) {
    gbps = plan::kPcieGbps;
    how = "plan::kPcieGbps, PCIe 5 x16 pinned; none measured";
  }
  spdlog::info("stream: host-to-device {:.1f} GB/s ({})", gbps, how);
  return plan::stream_cost(in, gbps);
}

}  // namespace

std::optional<plan::SpeedInput> speed_input(const RunConfig& cfg, const plan::PlanInput& in, const WanConfig& tc,
                                              c10::ScalarType weights, const std::array<std::int64_t, 4>& latent,
                                              int world, std::optional<c10::Device> device, int cores,
                                              double teacher_gflops, double student_gflops,
                                              Calibrate calibrate) {
  plan::SpeedInput s;
  s.teacher = in.teacher;
  s.student = in.student;
  s.tokens = in.tokens;
  s.teacher_forwards = cfg.teacher_forwards();  // guided: [cond; neg]; trajectory: teacher.steps / student.steps
  s.whole_teacher = in.whole_teacher;  // no shard stages (check_job)
  s.student_extra_forwards = cfg.objective().student_extra_forwards(cfg.keys(), dmd_critic_cost(in));
  s.context_len = in.context_len;
  s.batch = in.batch;
  s.prefetch_depth = in.prefetch_depth;
  s.recomputed_blocks = in.checkpointed_blocks;
  s.ranks = world;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool host = device && device->is_cpu();
  s.cores = cores >= 0 ? cores : (host ? hw : 0);
  s.teacher_gflops = teacher_gflops;
  s.student_gflops = student_gflops;
  s.stream = planned_stream(cfg, in, device);
  if (teacher_gflops > 0 && student_gflops > 0) return s;
  if (!device) return std::nullopt;
  // What a rank of the job gets: runtime.threads where set, else the host's cores shared out over
  // the ranks (train's rule, set_threads); a GPU rank keeps its process's threads. Timed with more
  // threads than the job's ranks run, a forward on a loaded 2-core host came out 3-40x slower than
  // the job's own (plan --generate predicted 384-8622 s for a 377 s generate at runtime.threads 1).
  const int shared = std::max(1, (s.cores > 0 ? s.cores : hw) / std::max(1, world));
  const int threads = !host ? torch::get_num_threads() : cfg.runtime.threads > 0 ? cfg.runtime.threads : shared;
  const ScopedIntraOpThreads pools(threads);  // rates and timings as one rank of the job sees them
  compat::set_current_device(*device);        // time on that device, not on GPU 0 by default
  const auto compute = teacher::choose_compute(cfg.teacher.compute, weights, *device);
  // On a GPU the probe times large products with CUDA events: the host's small product would
  // time launch latency there and make `auto` skip calibration (gpu-review C5).
  const auto teacher_dtype = compute.dtype.value_or(weights);
  const auto matmul = teacher::measure_matmul_rate(teacher_dtype, *device);
  const auto fp32 = teacher::measure_matmul_rate(torch::kFloat, *device);
  spdlog::info("matmul rate on {}: {:.1f} GFLOP/s ({}), fp32 {:.1f} GFLOP/s", device->str(), matmul.gflops,
               matmul.describe(teacher_dtype), fp32.gflops);
  if (teacher_gflops <= 0) s.teacher_gflops = plan::kForwardEfficiency * matmul.gflops;
  if (student_gflops <= 0) s.student_gflops = plan::kTrainEfficiency * fp32.gflops;
  const double batch_forward_s =
      plan::dit_forward_flops(in.teacher, in.tokens, in.context_len) * static_cast<double>(in.batch) /
      (s.teacher_gflops * 1e9);
  if (calibrate == Calibrate::kYes || (calibrate == Calibrate::kAuto && batch_forward_s < 60)) {
    spdlog::info("timing the teacher forward and the student step of this job on {} ({} thread(s))", device->str(),
                 threads);
    // The largest replica batch of the layouts: one teacher rank feeding every other rank's
    // students, at most four students' worth (larger batches rarely change the per-sample time
    // and cost calibration time and memory).
    const auto largest = in.batch * std::clamp<std::int64_t>(world - 1, 1, 4);
    const auto c = calibrate_speed(cfg, tc, weights, compute.dtype, latent, in.tokens, in.context_len, in.batch,
                                   plan::teacher_forward_sizes(largest), threads, *device);
    s.teacher_measured_s = c.teacher_s_per_sample;
    s.teacher_measured_by_size = c.teacher_by_size;
    s.student_measured_s = c.student_s_per_sample;
  }
  return s;
}

}  // namespace wd::job
