// bench_stream: the cost of teacher.placement = stream against a resident teacher on the same
// device: on the host (cpu) the "device" is the host memory; on a CUDA device (--device cuda) the
// blocks come from the node's pinned arena (one DMA a block) or, past --arena-limit, from the
// mapped checkpoint through the copy threads, and the resident teacher is placement gpu. One
// forward per batch over a checkpoint on disk (a random one of real block dims with --preset):
// median time per forward, the time compute waited for copies, per block the staging and upload
// times, the copy volume; the pinned host-to-device bandwidth; plan's predicted ratio beside
// the measured one.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_device.hpp"
#include "core/config.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"
#include "core/torch_compat.hpp"
#include "model/wan_checkpoint.hpp"
#include "plan/planner.hpp"
#include "plan/speed.hpp"
#include "teacher/cuda_host.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::bench {
namespace {

struct StreamBenchConfig {
  std::string checkpoint;  ///< empty: a random d1024 x 8-block bf16 teacher in a temp dir
  std::string preset;      ///< a random bf16 teacher of this WanConfig preset's dims, `blocks` blocks
  int blocks = 6;
  std::string arena_limit;  ///< teacher.arena_limit: empty = the default (a share of MemAvailable)
  int copy_threads = 4;
  std::string aheads = "1,2";
  std::string device = "cpu";
  int runs = 5;
  int batch = 2;
  int frames = 2, height = 16, width = 16;
  LogConfig log;
  StreamBenchConfig() { log.level = "warn"; }
  void bind(OptionTable& t) {
    t.bind("checkpoint", checkpoint, "teacher checkpoint; empty = a random dim-1024, 8-block bf16 one")
        .bind("preset", preset,
              "instead of --checkpoint: a random bf16 teacher of this preset's block dims (wan22-ti2v-5b: dim "
              "3072, ffn 14336; wan22-t2v-a14b: dim 5120, ffn 13824) with --blocks blocks, written to /tmp once")
        .bind("blocks", blocks, "blocks of the --preset teacher")
        .bind("arena-limit", arena_limit,
              "teacher.arena_limit: the node arena's limit (0: none, the copy threads stage from the mapped "
              "checkpoint); empty = 80% of MemAvailable")
        .bind("copy-threads", copy_threads, "teacher.copy_threads: staging threads without the arena")
        .bind("aheads", aheads, "comma list of teacher.stream_ahead values")
        .bind("device", device,
              "cpu | cuda | cuda:N: the stream target (cuda: the CUDA copy engine, compared with "
              "the whole teacher resident on the device); each timed forward is bracketed by "
              "device synchronisations")
        .bind("runs", runs, "timed forwards per point (median reported)")
        .bind("batch", batch, "samples per forward")
        .bind("frames", frames, "latent frames")
        .bind("height", height, "latent height")
        .bind("width", width, "latent width");
    log.bind(t);
  }
  void validate() const {
    ConfigProblems p;
    p.check(runs >= 1, "runs(" + std::to_string(runs) + ") must be >= 1");
    p.check(batch >= 1, "batch(" + std::to_string(batch) + ") must be >= 1");
    p.check(blocks >= 2, "blocks(" + std::to_string(blocks) + ") must be >= 2");
    p.check(copy_threads >= 1, "copy-threads(" + std::to_string(copy_threads) + ") must be >= 1");
    p.check(preset.empty() || checkpoint.empty(), "give --preset or --checkpoint, not both");
    p.check(frames >= 1 && height >= 2 && width >= 2,
            "frames(" + std::to_string(frames) + "), height(" + std::to_string(height) + "), width(" +
                std::to_string(width) + ") must be >= 1, 2, 2");
    check_bench_device(p, device);
    log.validate(p);
    p.throw_if_any("bench_stream");
  }
};

/// The teacher to stream: --checkpoint, or a random bf16 one (--preset's block dims, or dim 1024
/// x 8 blocks) written to /tmp once; `made` names it when this run wrote it.
std::string teacher_path(const StreamBenchConfig& cfg, std::string& made) {
  if (!cfg.checkpoint.empty()) return cfg.checkpoint;
  WanConfig c = WanConfig::preset("tiny");
  std::string path = "/tmp/wd-bench-stream-teacher";
  if (!cfg.preset.empty()) {
    c = WanConfig::preset(cfg.preset);
    c.num_layers = cfg.blocks;
    path = "/tmp/wd-bench-stream-" + cfg.preset + "-" + std::to_string(cfg.blocks);
  } else {
    c.dim = 1024;
    c.ffn_dim = 4096;
    c.num_heads = 8;
    c.num_layers = 8;
  }
  if (!std::filesystem::exists(path + "/config.json")) {
    write_random_wan_checkpoint(path, c, torch::kBFloat16, 1ull << 30, 1);
    made = path;
  }
  return path;
}

struct Point {
  double seconds = 0;             ///< median per forward
  double waited = 0;              ///< compute waited for copies, in all the forwards
  std::uint64_t copied = 0;       ///< bytes copied in all the forwards
  std::uint64_t buffers = 0;      ///< the streamer's device slots
  std::uint64_t device_peak = 0;  ///< the CUDA allocator's peak (0 on the host)
  std::uint64_t block_bytes = 0;
  teacher::CopyStats stats;       ///< staging and upload times, in all the forwards
  std::string source;             ///< where the blocks came from
};

/// `runs` + 1 forwards (the first untimed) of `inputs` with the teacher placed as `p`.
Point time_stage(const WanCheckpoint& ck, const StreamBenchConfig& cfg, const c10::Device& device,
                 const teacher::StageBatch& inputs, plan::Placement p, int ahead) {
  compat::reset_device_peak(device);
  const teacher::BlockRange all{0, ck.config().num_layers};
  teacher::StageLoad how;
  how.placement = p;
  how.device = device;
  how.blocks = all;
  how.stream_ahead = ahead;
  how.copy_threads = cfg.copy_threads;
  how.arena_tag = "bench";
  if (cfg.arena_limit == "0") {
    how.arena_limit = 0;
  } else if (!cfg.arena_limit.empty()) {
    how.arena_limit = parse_size(cfg.arena_limit, "arena-limit");
  }
  std::vector<teacher::StageModel> models;
  models.push_back(teacher::load_stage_model(ck, how));
  Point pt;
  pt.source = models.front().stream_source;
  teacher::TeacherStage stage(std::move(models), nullptr, all, {});
  std::vector<double> times;
  for (int r = 0; r < cfg.runs + 1; ++r) {
    teacher::StageBatch b = inputs;
    compat::synchronize_device(device);
    const auto t0 = Clock::now();
    stage.run(b);
    compat::synchronize_device(device);  // a CUDA forward returns once it is queued
    if (r > 0) times.push_back(seconds_since(t0));  // the first forward warms caches up
  }
  pt.seconds = median(times);
  const auto& s = stage.experts().front().streamer;
  if (s) {
    pt.waited = s->wait_seconds();
    pt.copied = s->copied_bytes();
    pt.buffers = s->buffer_bytes();
    pt.block_bytes = s->block_bytes();
    pt.stats = s->copy_stats();
  }
  pt.device_peak = compat::device_memory(device).peak_allocated_bytes;
  return pt;
}

/// plan's prediction for a stream point: the longer of the resident forward and the copies of
/// its blocks, at the measured host-to-device rate from an arena, at the copy threads' rate
/// without (plan::stream_gbps).
double predicted_ratio(const Point& p, double resident_s, std::int64_t blocks, double h2d_gbps, int copy_threads) {
  plan::StreamCost cost;
  cost.on = true;
  cost.block_bytes = static_cast<double>(p.block_bytes);
  cost.blocks = blocks;
  const bool arena = p.source.find("arena /wd-") != std::string::npos && p.source.find("not pinned") == std::string::npos;
  cost.gbps = plan::stream_gbps(h2d_gbps, arena, copy_threads);
  return plan::streamed_forward_seconds(resident_s, cost) / resident_s;
}

int run(const std::vector<std::string>& args) {
  StreamBenchConfig cfg;
  OptionTable table("bench_stream options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    std::cout << "bench_stream [--checkpoint DIR | --preset NAME --blocks N] [--aheads 1,2] [--device cpu|cuda] "
                 "[--arena-limit SIZE] [--copy-threads 4] [--runs 5] [--batch 2]\n"
              << table.description() << "\n";
    return 0;
  }
  cfg.validate();
  init_logging(Topology::single_process(), cfg.log.level);
  torch::set_num_threads(1);
  const auto device = bench_device(cfg.device);
  std::string made;
  const auto path = teacher_path(cfg, made);
  const auto ck = WanCheckpoint::open(path);
  const auto& c = ck.config();
  torch::manual_seed(0);
  // The inputs stay on the host, as the teacher loop reads them; the embedding moves them.
  teacher::StageBatch inputs;
  inputs.x_t = torch::randn({cfg.batch, c.in_dim, cfg.frames, cfg.height, cfg.width});
  inputs.t = torch::full({cfg.batch}, 500.f);
  inputs.context = torch::randn({cfg.batch, c.text_len, c.text_dim});
  inputs.context_lens = torch::full({cfg.batch}, c.text_len, torch::kLong);
  // The machine's pinned host-to-device rate: the arena's copies cannot beat it.
  const double h2d = device.is_cuda() ? teacher::measure_h2d_gbps(device, 1ull << 30, 5) : 0;
  const auto peak_text = [&](const Point& p) {
    return device.is_cuda() ? format_bytes(static_cast<double>(p.device_peak)) : std::string("-");
  };
  // The resident reference on the same device: the host copy (cpu) or the whole teacher on the GPU.
  const auto resident_placement = device.is_cuda() ? plan::Placement::kGpu : plan::Placement::kCpu;
  const auto resident = time_stage(ck, cfg, device, inputs, resident_placement, 0);
  const auto resident_name = plan::placement_name(resident_placement);
  const auto tokens = (cfg.frames / c.patch_size[0]) * (cfg.height / c.patch_size[1]) * (cfg.width / c.patch_size[2]);
  std::printf("teacher %s: %s, batch %d, latent %lldx%dx%dx%d (%lld tokens), device %s, one LibTorch thread\n",
              path.c_str(), c.summary().c_str(), cfg.batch, static_cast<long long>(c.in_dim), cfg.frames, cfg.height,
              cfg.width, static_cast<long long>(tokens), device.str().c_str());
  if (device.is_cuda()) std::printf("pinned host-to-device: %.1f GB/s (1 GiB from cudaHostAlloc, best of 5)\n", h2d);
  std::printf("\n| placement | ahead | forward ms (median of %d) | vs %s | compute waited for copies ms/forward "
              "| copied per forward | device buffers | device peak | staging ms/block | upload ms/block "
              "| plan's ratio |\n",
              cfg.runs, resident_name.c_str());
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %s | - | %.1f | 1.00 | - | - | - | %s | - | - | - |\n", resident_name.c_str(), resident.seconds * 1e3,
              peak_text(resident).c_str());
  std::fflush(stdout);
  std::string source;
  for (const auto& a : split_list(cfg.aheads)) {
    const int ahead = std::stoi(a);
    const auto p = time_stage(ck, cfg, device, inputs, plan::Placement::kStream, ahead);
    source = p.source;
    const double blocks_copied = static_cast<double>(p.copied) / static_cast<double>(std::max<std::uint64_t>(1, p.block_bytes));
    const auto per_block = [&](double seconds, double count) {
      return count > 0 && seconds > 0 ? fmt::format("{:.2f}", 1e3 * seconds / count) : std::string("-");
    };
    std::printf("| stream | %d | %.1f | %.2f | %.1f | %s | %s | %s | %s | %s | %s |\n", ahead, p.seconds * 1e3,
                p.seconds / resident.seconds, p.waited * 1e3 / (cfg.runs + 1),
                format_bytes(static_cast<double>(p.copied) / (cfg.runs + 1)).c_str(),
                format_bytes(static_cast<double>(p.buffers)).c_str(), peak_text(p).c_str(),
                per_block(p.stats.staging_s, blocks_copied).c_str(),
                per_block(p.stats.upload_s, static_cast<double>(p.stats.uploads_timed)).c_str(),
                device.is_cuda()
                    ? fmt::format("{:.2f}", predicted_ratio(p, resident.seconds, c.num_layers, h2d, cfg.copy_threads)).c_str()
                    : "-");
    std::fflush(stdout);
  }
  std::printf("\nblocks from the %s\n", source.c_str());
  if (!made.empty()) std::printf("(teacher written to %s for this run)\n", made.c_str());
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  return wd::bench::bench_main("bench_stream", wd::bench::run, argc, argv);
}
