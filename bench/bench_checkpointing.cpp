// bench_checkpointing: activation memory (peak RSS, or the CUDA allocator's peak, over the step's
// baseline) and step time of one student forward + backward with gradient checkpointing off /
// every:2 / all, on the CPU or a CUDA device.
#include <malloc.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_device.hpp"
#include "core/threads.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"
#include "core/torch_compat.hpp"
#include "memory/host_memory.hpp"
#include "model/wan_dit.hpp"
#include "student/checkpointing.hpp"

namespace wd::bench {
namespace {

struct CheckpointBenchConfig {
  std::string policies = "off,every:2,all";
  std::int64_t layers = 8;
  std::int64_t dim = 512;
  std::int64_t heads = 8;
  std::int64_t ffn = 2048;
  std::int64_t text_dim = 512;
  std::int64_t text_len = 64;
  int batch = 4;
  int frames = 4;  ///< latent [16,F,H,W]; with the (1,2,2) patch, 4×32×32 is 1024 tokens
  int height = 32;
  int width = 32;
  int runs = 3;
  int threads = 1;
  int mmap_threshold_kib = 256;
  std::uint64_t seed = 0;
  std::string device = "cpu";
  LogConfig log;

  CheckpointBenchConfig() { log.level = "warn"; }

  void bind(OptionTable& t) {
    t.bind("policies", policies, "comma list of student.checkpointing values")
        .bind("layers", layers, "student blocks")
        .bind("dim", dim, "hidden size")
        .bind("heads", heads, "attention heads")
        .bind("ffn", ffn, "FFN size")
        .bind("text-dim", text_dim, "text embedding input size")
        .bind("text-len", text_len, "text tokens")
        .bind("batch", batch, "samples per step")
        .bind("frames", frames, "latent frames F of each sample [16,F,H,W]")
        .bind("height", height, "latent height H")
        .bind("width", width, "latent width W")
        .bind("runs", runs, "timed steps per policy (median reported), after one warm-up each")
        .bind("threads", threads, "LibTorch and OpenBLAS threads")
        .bind("mmap-threshold-kib", mmap_threshold_kib,
              "glibc M_MMAP_THRESHOLD: larger blocks are mmapped and returned to the kernel when "
              "freed, so RSS follows the live tensors (0 = glibc's adaptive default)")
        .bind("seed", seed, "seed of the random weights, inputs and target")
        .bind("device", device,
              "cpu | cuda | cuda:N: where the student, inputs and target live; on CUDA the "
              "activation memory is the caching allocator's peak and each phase ends with a "
              "device synchronisation");
    log.bind(t);
  }
  void validate() const {
    ConfigProblems p;
    p.check(runs >= 1, "runs(" + std::to_string(runs) + ") must be >= 1");
    p.check(batch >= 1, "batch(" + std::to_string(batch) + ") must be >= 1");
    p.check(threads >= 1, "threads(" + std::to_string(threads) + ") must be >= 1");
    p.check(mmap_threshold_kib >= 0,
            "mmap-threshold-kib(" + std::to_string(mmap_threshold_kib) + ") must be >= 0");
    p.check(!split_list(policies).empty(), "policies(" + policies + ") must name at least one");
    check_bench_device(p, device);
    log.validate(p);
    p.throw_if_any("bench_checkpointing");
  }
};

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

/// One measured step: seconds of forward and backward, and the peak memory above what was in
/// use just before the step (weights, grads, inputs and target are already resident then): the
/// process's RSS on the CPU, the CUDA caching allocator's allocated bytes on a GPU.
struct StepSample {
  double forward_s = 0, backward_s = 0;
  std::int64_t peak_extra_bytes = 0;
};

StepSample measure_step(WanDiT& model, const WanInputs& in, const std::vector<torch::Tensor>& target,
                        const CheckpointPolicy& policy, const c10::Device& device) {
  for (auto& p : model->parameters()) {
    if (p.grad().defined()) p.grad().zero_();  // keep the buffers: they belong to the baseline
  }
  const bool cuda = device.is_cuda();
  std::int64_t before = 0;
  if (cuda) {
    compat::synchronize_device(device);  // the zeroing above is queued, not done
    compat::reset_device_peak(device);
    before = static_cast<std::int64_t>(compat::device_memory(device).allocated_bytes);
  } else {
    malloc_trim(0);
    before = static_cast<std::int64_t>(memory::host_memory().rss_bytes);
    WD_CHECK_AS(SystemError, memory::reset_peak_rss(),
                "writing 5 to /proc/self/clear_refs failed: " << std::strerror(errno));
  }
  StepSample s;
  auto start = Clock::now();
  auto out = student::student_forward(model, in, policy);
  auto loss = torch::zeros({}, torch::TensorOptions().device(device));
  for (std::size_t b = 0; b < out.size(); ++b) loss = loss + torch::mse_loss(out[b], target[b]);
  compat::synchronize_device(device);  // a CUDA forward returns before it has run
  s.forward_s = seconds_since(start);
  start = Clock::now();
  loss.backward();
  compat::synchronize_device(device);
  s.backward_s = seconds_since(start);
  WD_CHECK(std::isfinite(loss.item<double>()), "policy " << policy.str() << ": non-finite loss");
  const auto peak = cuda ? compat::device_memory(device).peak_allocated_bytes
                         : memory::host_memory().peak_rss_bytes;
  s.peak_extra_bytes = static_cast<std::int64_t>(peak) - before;
  return s;
}

int run(const std::vector<std::string>& args) {
  CheckpointBenchConfig cfg;
  OptionTable table("bench_checkpointing options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    std::cout << "Usage: bench_checkpointing [options]\n" << table.description();
    return 0;
  }
  cfg.validate();
  std::vector<CheckpointPolicy> policies;
  for (const auto& p : split_list(cfg.policies)) policies.push_back(CheckpointPolicy::parse(p));
  init_logging(Topology::single_process(), cfg.log.level);
  // glibc otherwise raises its mmap threshold to the largest block freed so far (up to 32 MiB),
  // keeping freed activations in the heap, where RSS would count them after they died.
  if (cfg.mmap_threshold_kib > 0) mallopt(M_MMAP_THRESHOLD, cfg.mmap_threshold_kib * 1024);
  set_intra_op_threads(cfg.threads);  // LibTorch's pool and OpenBLAS's

  WanConfig c;
  c.num_layers = cfg.layers;
  c.dim = cfg.dim;
  c.num_heads = cfg.heads;
  c.ffn_dim = cfg.ffn;
  c.text_dim = cfg.text_dim;
  c.text_len = cfg.text_len;
  c.validate("bench_checkpointing");
  const auto device = bench_device(cfg.device);
  WanDiT model(c, WanInit::kRandom, torch::kFloat, cfg.seed);
  model->to(device);
  // Drawn on the host and copied, so a CUDA run sees the same numbers as a CPU one.
  torch::manual_seed(cfg.seed);
  WanInputs in;
  for (int b = 0; b < cfg.batch; ++b) {
    in.x.push_back(torch::randn({c.in_dim, cfg.frames, cfg.height, cfg.width}).to(device));
    in.context.push_back(torch::randn({c.text_len, c.text_dim}).to(device));
  }
  in.t = torch::linspace(300, 700, cfg.batch).to(device);
  std::vector<torch::Tensor> target;
  for (int b = 0; b < cfg.batch; ++b) {
    target.push_back(torch::randn({c.out_dim, cfg.frames, cfg.height, cfg.width}).to(device));
  }
  const auto& p = c.patch_size;
  const auto tokens = (cfg.frames / p[0]) * (cfg.height / p[1]) * (cfg.width / p[2]);

  std::printf("## bench_checkpointing\n\n");
  std::printf("- LibTorch %s; BLAS: %s; %d thread(s); device %s\n", compat::torch_version(),
              blas_config().c_str(), cfg.threads, device.str().c_str());
  std::printf("- student: %s, %.1f M parameters (fp32)\n", c.summary().c_str(),
              static_cast<double>(wan_param_count(c)) / 1e6);
  std::printf("- batch %d × latent [%lld, %d, %d, %d] = %lld tokens each; loss: MSE to a random "
              "target; one forward + backward per step\n",
              cfg.batch, static_cast<long long>(c.in_dim), cfg.frames, cfg.height, cfg.width,
              static_cast<long long>(tokens));
  std::printf("- per policy one warm-up step, then %d timed steps interleaved across policies; "
              "medians reported\n",
              cfg.runs);
  if (device.is_cuda()) {
    std::printf("- activation memory = the CUDA caching allocator's peak allocated bytes during the "
                "step − its allocated bytes just before it (peak reset per step); forward and "
                "backward each end with a device synchronisation\n");
  } else {
    std::printf("- activation memory = VmHWM after the step − VmRSS just before it (peak reset "
                "through /proc/self/clear_refs; weights and grads are resident before); "
                "M_MMAP_THRESHOLD %d KiB\n",
                cfg.mmap_threshold_kib);
  }
  std::fflush(stdout);

  for (const auto& policy : policies) measure_step(model, in, target, policy, device);  // warm-up
  const auto baseline = memory::host_memory();
  const auto device_baseline = compat::device_memory(device);
  std::vector<std::vector<StepSample>> samples(policies.size());
  for (int r = 0; r < cfg.runs; ++r) {
    for (std::size_t i = 0; i < policies.size(); ++i) {
      samples[i].push_back(measure_step(model, in, target, policies[i], device));
    }
  }
  std::printf("- RSS before a step (weights, grads, inputs, LibTorch): %.0f MiB\n",
              mib(static_cast<std::int64_t>(baseline.rss_bytes)));
  if (device_baseline.available) {
    std::printf("- on %s before a step: %.0f MiB allocated, %.0f MiB reserved\n", device.str().c_str(),
                mib(static_cast<std::int64_t>(device_baseline.allocated_bytes)),
                mib(static_cast<std::int64_t>(device_baseline.reserved_bytes)));
  }
  std::printf("\n");

  std::printf("| policy | checkpointed blocks | activation MiB (median) | min–max MiB | vs off "
              "| step s (median) | forward s | backward s | vs off |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  double off_mem = 0, off_time = 0;
  for (std::size_t i = 0; i < policies.size(); ++i) {
    std::vector<double> mem, step, fwd, bwd;
    for (const auto& s : samples[i]) {
      mem.push_back(mib(s.peak_extra_bytes));
      step.push_back(s.forward_s + s.backward_s);
      fwd.push_back(s.forward_s);
      bwd.push_back(s.backward_s);
    }
    std::int64_t checkpointed = 0;
    for (std::int64_t b = 0; b < c.num_layers; ++b) checkpointed += policies[i].applies(b);
    const double m = median(mem), t = median(step);
    if (i == 0) {
      off_mem = m;
      off_time = t;
    }
    std::printf("| %s | %lld / %lld | %.0f | %.0f–%.0f | %+.1f%% | %.2f | %.2f | %.2f | %+.1f%% |\n",
                policies[i].str().c_str(), static_cast<long long>(checkpointed),
                static_cast<long long>(c.num_layers), m, min_of(mem),
                *std::max_element(mem.begin(), mem.end()), 100 * (m / off_mem - 1), t, median(fwd),
                median(bwd), 100 * (t / off_time - 1));
  }
  std::printf("\n\"vs off\" compares with the first policy listed.\n");
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  return wd::bench::bench_main("bench_checkpointing", wd::bench::run, argc, argv);
}
