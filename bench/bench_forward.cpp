// bench_forward: forward throughput (tokens/s, GFLOP/s) of the Wan DiT on CPU at two sizes,
// with fp32 and bf16 weights, over a sweep of thread counts; with --profile-top, the first
// point's kernels under Kineto and its blocks timed one by one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_profile.hpp"
#include "core/threads.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"
#include "core/torch_compat.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_config.hpp"
#include "model/wan_dit.hpp"

namespace wd::bench {
namespace {

struct ForwardBenchConfig {
  std::string sizes = "small,medium";
  std::string dtypes = "fp32,bf16";
  std::string threads = "1,2";
  std::string batches = "1";
  int runs = 3;
  int warmup = 1;
  int frames = 4;   ///< latent frames; with the (1,2,2) patch, 4×32×32 is 1024 tokens
  int height = 32;
  int width = 32;
  std::uint64_t seed = 0;
  std::string device = "cpu";
  double peak_tflops = 0;  ///< the device's dense peak for the MFU column; 0: no MFU
  int profile_top = 0;     ///< kernels listed from the first point's Kineto profile; 0: none
  std::string profile_trace;  ///< the Chrome trace of that forward; empty: not written
  LogConfig log;

  ForwardBenchConfig() { log.level = "warn"; }

  void bind(OptionTable& t) {
    t.bind("sizes", sizes, "comma list: small, medium, or a WanConfig preset name")
        .bind("dtypes", dtypes, "comma list of weight dtypes: fp32, bf16, fp16")
        .bind("threads", threads, "comma list of thread counts (LibTorch and OpenBLAS both)")
        .bind("batches", batches, "comma list of batch sizes")
        .bind("runs", runs, "timed forwards per point (median reported)")
        .bind("warmup", warmup, "untimed forwards before the timed ones")
        .bind("frames", frames, "latent frames F of each sample [C,F,H,W] (C: the model's in_dim)")
        .bind("height", height, "latent height H")
        .bind("width", width, "latent width W")
        .bind("seed", seed, "seed of the random weights and inputs")
        .bind("device", device,
              "cpu | cuda | cuda:N: where the model and inputs live; every timed forward ends "
              "with a device synchronisation")
        .bind("peak-tflops", peak_tflops,
              "the device's dense peak TFLOP/s in the benchmarked dtype, for the MFU column "
              "(e.g. 989 for an H100 SXM in bf16); 0 leaves MFU out")
        .bind("profile-top", profile_top,
              "after the first point: one more forward under LibTorch's Kineto profiler, its top N kernels "
              "(CUDA; on the host, aten ops) and their time by category, and each block's time on its own; "
              "0: no profile")
        .bind("profile-trace", profile_trace, "with --profile-top: write that forward's Chrome trace here");
    log.bind(t);
  }
  void validate() const {
    ConfigProblems p;
    p.check(runs >= 1, "runs(" + std::to_string(runs) + ") must be >= 1");
    p.check(warmup >= 0, "warmup(" + std::to_string(warmup) + ") must be >= 0");
    p.check(frames >= 1 && height >= 2 && width >= 2,
            "frames(" + std::to_string(frames) + "), height(" + std::to_string(height) +
                "), width(" + std::to_string(width) + ") must be >= 1, 2, 2");
    p.check(!split_list(sizes).empty(), "sizes(" + sizes + ") must name at least one size");
    p.check(!split_list(dtypes).empty(), "dtypes(" + dtypes + ") must name at least one dtype");
    p.check(peak_tflops >= 0, "peak-tflops must be >= 0");
    try {
      const c10::Device d(device);
      p.check(d.is_cpu() || compat::cuda_available(), "device(" + device + "): no usable CUDA device here");
    } catch (const c10::Error&) {
      p.check(false, "device(" + device + ") must be cpu, cuda or cuda:N");
    }
    log.validate(p);
    p.throw_if_any("bench_forward");
  }
};

/// The two benchmark sizes; any other name is a WanConfig preset.
WanConfig bench_size(const std::string& name) {
  WanConfig c;
  if (name == "small") {
    c.dim = 512;
    c.num_layers = 8;
    c.num_heads = 8;
    c.ffn_dim = 2048;
    c.text_dim = 512;
    c.text_len = 64;
  } else if (name == "medium") {
    c.dim = 1024;
    c.num_layers = 12;
    c.num_heads = 16;
    c.ffn_dim = 4096;
    c.text_dim = 1024;
    c.text_len = 128;
  } else {
    c = WanConfig::preset(name);
  }
  c.validate("bench size " + name);
  return c;
}

/// Matmul FLOPs of one forward of `batch` samples of `S` tokens (2 per multiply-add), following
/// the forward in wan_dit.cpp. Elementwise work (norms, RoPE, GELU, modulation) is left out.
/// The time MLP runs once per sample: the bench's t is [B], and wan_dit.cpp's embed_time runs the
/// MLP on one row a sample where the official code expands t to [B, S] (per-token t, TI2V's
/// image mode, would run it on S rows). Before 2026-11-28 it was counted per token, ~1% of a
/// TI2V-5B forward's count at 8190 tokens.
double forward_flops(const WanConfig& c, double S, double batch) {
  const double D = static_cast<double>(c.dim), F = static_cast<double>(c.ffn_dim);
  const double L = static_cast<double>(c.text_len);  // contexts are padded to text_len
  const double patch = static_cast<double>(c.in_dim * c.patch_volume());
  const double head = static_cast<double>(c.out_dim * c.patch_volume());
  const double time_rows = 1;                                    // per-sample t
  double f = 2 * S * patch * D                                   // patch embedding
             + 2 * time_rows * (c.freq_dim * D + D * D + D * 6 * D)  // time MLP + projection
             + 2 * L * (c.text_dim * D + D * D)                  // text embedding
             + 2 * S * D * head;                                 // head
  const double block = 2 * S * 4 * D * D + 4 * S * S * D         // self-attn: q,k,v,o; QKᵀ, PV
                       + 2 * S * 2 * D * D + 2 * L * 2 * D * D   // cross-attn: q,o; k,v on text
                       + 4 * S * L * D                           // cross-attn: QKᵀ, PV
                       + 2 * S * 2 * D * F;                      // FFN
  f += static_cast<double>(c.num_layers) * block;
  return f * batch;
}

struct Inputs {
  std::vector<torch::Tensor> x, context;
  torch::Tensor t;
  WanInputs view() const { return WanInputs{x, {}, t, context, 0}; }
};

/// The first point's profile: each block timed on its own (host clock between device
/// synchronisations: the block's kernels, not its launch), then one forward under Kineto.
void profile_point(WanDiT& model, const Inputs& in, const WanConfig& c, const c10::Device& device,
                   const ForwardBenchConfig& cfg) {
  std::vector<double> block_ms;
  auto state = model->embed(in.view());
  compat::synchronize_device(device);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const auto start = Clock::now();
    model->run_block(i, state);
    compat::synchronize_device(device);
    block_ms.push_back(seconds_since(start) * 1e3);
  }
  std::printf("\n### Blocks timed one by one (host clock between device synchronisations)\n\n");
  std::printf("%lld blocks: median %.3f ms, min %.3f ms, max %.3f ms, sum %.3f ms\n",
              static_cast<long long>(c.num_layers), median(block_ms), min_of(block_ms),
              *std::max_element(block_ms.begin(), block_ms.end()),
              std::accumulate(block_ms.begin(), block_ms.end(), 0.0));
  double wall_ms = 0;
  try {
    const auto rows = profile_kernels(
        [&] {
          const auto start = Clock::now();
          model->forward(in.view());
          compat::synchronize_device(device);
          wall_ms = seconds_since(start) * 1e3;
        },
        device.is_cuda(), cfg.profile_trace);
    print_kernel_tables(rows, cfg.profile_top, static_cast<int>(c.num_layers), wall_ms, device.is_cuda());
    if (!cfg.profile_trace.empty()) std::printf("trace: %s\n", cfg.profile_trace.c_str());
  } catch (const std::exception& e) {
    std::printf("\nKineto profile unavailable in this LibTorch (%s): %s\n", compat::torch_version(), e.what());
  }
  std::fflush(stdout);
}

Inputs make_inputs(const WanConfig& c, const ForwardBenchConfig& cfg, int batch, const c10::Device& device) {
  Inputs in;
  for (int b = 0; b < batch; ++b) {
    in.x.push_back(torch::randn({c.in_dim, cfg.frames, cfg.height, cfg.width}).to(device));
    in.context.push_back(torch::randn({c.text_len, c.text_dim}).to(device));
  }
  // Spread timesteps so a batch is not one sample repeated.
  in.t = torch::linspace(300, 700, batch).to(device);
  return in;
}

int run(const std::vector<std::string>& args) {
  ForwardBenchConfig cfg;
  OptionTable table("bench_forward options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    std::cout << "Usage: bench_forward [options]\n" << table.description();
    return 0;
  }
  cfg.validate();
  const auto thread_counts = parse_int_list("threads", cfg.threads);
  const auto batch_sizes = parse_int_list("batches", cfg.batches);
  std::vector<c10::ScalarType> dtypes;
  for (const auto& d : split_list(cfg.dtypes)) dtypes.push_back(parse_dtype(d));
  std::vector<std::pair<std::string, WanConfig>> sizes;
  for (const auto& s : split_list(cfg.sizes)) sizes.emplace_back(s, bench_size(s));
  init_logging(Topology::single_process(), cfg.log.level);
  torch::NoGradGuard no_grad;

  std::printf("## bench_forward\n\n");
  std::printf("- LibTorch %s; BLAS: %s\n", compat::torch_version(), blas_config().c_str());
  const c10::Device device(cfg.device);
  std::printf("- device %s; latent per sample [C, %d, %d, %d]; warm-up %d, then median of %d forwards\n",
              device.str().c_str(), cfg.frames, cfg.height, cfg.width, cfg.warmup, cfg.runs);
  for (const auto& [name, c] : sizes) {
    std::printf("- %s: %s, %.1f M parameters\n", name.c_str(), c.summary().c_str(),
                static_cast<double>(wan_param_count(c)) / 1e6);
  }
  std::printf("\n| size | weights | threads | batch | tokens | ms/forward | min ms | tokens/s "
              "| GFLOP/forward | GFLOP/s | MFU |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);

  bool profiled = cfg.profile_top <= 0;
  for (const auto& [name, c] : sizes) {
    const auto& p = c.patch_size;
    const double S = static_cast<double>((cfg.frames / p[0]) * (cfg.height / p[1]) * (cfg.width / p[2]));
    for (const auto dtype : dtypes) {
      WanDiT model(c, WanInit::kRandom, dtype, cfg.seed);
      model->to(device);
      model->eval();
      for (const int threads : thread_counts) {
        set_intra_op_threads(threads);  // LibTorch's pool and OpenBLAS's
        for (const int batch : batch_sizes) {
          torch::manual_seed(cfg.seed);
          const auto in = make_inputs(c, cfg, batch, device);
          for (int i = 0; i < cfg.warmup; ++i) model->forward(in.view());
          compat::synchronize_device(device);
          std::vector<double> secs;
          for (int i = 0; i < cfg.runs; ++i) {
            const auto start = Clock::now();
            const auto out = model->forward(in.view());
            compat::synchronize_device(device);  // a CUDA forward returns before it has run
            secs.push_back(seconds_since(start));
            WD_CHECK(out.front().isfinite().all().item<bool>(),
                     name << " " << dtype_name(dtype) << ": forward produced non-finite values");
          }
          const double med = median(secs), tokens = S * batch;
          const double gflop = forward_flops(c, S, batch) / 1e9;
          char mfu[32] = "-";
          if (cfg.peak_tflops > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100 * gflop / med / (cfg.peak_tflops * 1e3));
          std::printf("| %s | %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %s |\n",
                      name.c_str(), dtype_name(dtype), threads, batch, tokens, med * 1e3,
                      min_of(secs) * 1e3, tokens / med, gflop, gflop / med, mfu);
          std::fflush(stdout);
          if (!profiled) {
            profiled = true;
            profile_point(model, in, c, device, cfg);
          }
        }
      }
    }
  }
  std::printf("\nGFLOP counts matmul work only (2 per multiply-add): linear layers on S tokens "
              "(text embedding and cross-attention k/v on text_len rows), self-attention "
              "4·S²·D and cross-attention 4·S·text_len·D per layer, and the time MLP once a sample.\n");
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  return wd::bench::bench_main("bench_forward", wd::bench::run, argc, argv);
}
