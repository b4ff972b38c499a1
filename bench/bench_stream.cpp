// bench_stream: the cost of teacher.placement = stream against a resident teacher on the same
// device: on the host (cpu) the "device" is the host memory; on a CUDA device (--device cuda) the
// blocks go through the CUDA copy engine and the resident teacher is placement gpu. One forward
// per batch over a checkpoint on disk: median time per forward, the time compute waited for
// copies, the copy volume.
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
#include "teacher/teacher_stage.hpp"

namespace wd::bench {
namespace {

struct StreamBenchConfig {
  std::string checkpoint;  ///< empty: a random d1024 x 8-block bf16 teacher in a temp dir
  std::string aheads = "1,2";
  std::string device = "cpu";
  int runs = 5;
  int batch = 2;
  int frames = 2, height = 16, width = 16;
  LogConfig log;
  StreamBenchConfig() { log.level = "warn"; }
  void bind(OptionTable& t) {
    t.bind("checkpoint", checkpoint, "teacher checkpoint; empty = a random dim-1024, 8-block bf16 one")
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
    p.check(frames >= 1 && height >= 2 && width >= 2,
            "frames(" + std::to_string(frames) + "), height(" + std::to_string(height) + "), width(" +
                std::to_string(width) + ") must be >= 1, 2, 2");
    check_bench_device(p, device);
    log.validate(p);
    p.throw_if_any("bench_stream");
  }
};

int run(const std::vector<std::string>& args) {
  StreamBenchConfig cfg;
  OptionTable table("bench_stream options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    std::cout << "bench_stream [--checkpoint DIR] [--aheads 1,2] [--device cpu|cuda] [--runs 5] [--batch 2]\n"
              << table.description() << "\n";
    return 0;
  }
  cfg.validate();
  init_logging(Topology::single_process(), cfg.log.level);
  torch::set_num_threads(1);
  const auto device = bench_device(cfg.device);
  std::string path = cfg.checkpoint;
  std::string made;
  if (path.empty()) {
    path = "/tmp/wd-bench-stream-teacher";
    auto c = WanConfig::preset("tiny");
    c.dim = 1024;
    c.ffn_dim = 4096;
    c.num_heads = 8;
    c.num_layers = 8;
    if (!std::filesystem::exists(path + "/config.json")) {
      write_random_wan_checkpoint(path, c, torch::kBFloat16, 1ull << 30, 1);
      made = path;
    }
  }
  const auto ck = WanCheckpoint::open(path);
  const auto& c = ck.config();
  torch::manual_seed(0);
  // The inputs stay on the host, as the teacher loop reads them; the embedding moves them.
  teacher::StageBatch inputs;
  inputs.x_t = torch::randn({cfg.batch, c.in_dim, cfg.frames, cfg.height, cfg.width});
  inputs.t = torch::full({cfg.batch}, 500.f);
  inputs.context = torch::randn({cfg.batch, c.text_len, c.text_dim});
  inputs.context_lens = torch::full({cfg.batch}, c.text_len, torch::kLong);
  const teacher::BlockRange all{0, c.num_layers};

  struct Point {
    double seconds = 0;           ///< median per forward
    double waited = 0;            ///< compute waited for copies, in all the forwards
    std::uint64_t copied = 0;     ///< bytes copied in all the forwards
    std::uint64_t buffers = 0;    ///< the streamer's device slots
    std::uint64_t device_peak = 0;  ///< the CUDA allocator's peak (0 on the host)
  };
  const auto time_stage = [&](plan::Placement p, int ahead) {
    compat::reset_device_peak(device);
    teacher::StageLoad how;
    how.placement = p;
    how.device = device;
    how.blocks = all;
    how.stream_ahead = ahead;
    std::vector<teacher::StageModel> models;
    models.push_back(teacher::load_stage_model(ck, how));
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
    Point pt;
    pt.seconds = median(times);
    const auto& s = stage.experts().front().streamer;
    pt.waited = s ? s->wait_seconds() : 0;
    pt.copied = s ? s->copied_bytes() : 0;
    pt.buffers = s ? s->buffer_bytes() : 0;
    pt.device_peak = compat::device_memory(device).peak_allocated_bytes;
    return pt;
  };
  const auto peak_text = [&](const Point& p) {
    return device.is_cuda() ? format_bytes(static_cast<double>(p.device_peak)) : std::string("-");
  };
  // The resident reference on the same device: the host copy (cpu) or the whole teacher on the GPU.
  const auto resident_placement = device.is_cuda() ? plan::Placement::kGpu : plan::Placement::kCpu;
  const auto resident = time_stage(resident_placement, 0);
  const auto resident_name = plan::placement_name(resident_placement);
  std::printf("teacher %s: %s, batch %d, latent %lldx%dx%dx%d, device %s, one LibTorch thread\n\n", path.c_str(),
              c.summary().c_str(), cfg.batch, static_cast<long long>(c.in_dim), cfg.frames, cfg.height, cfg.width,
              device.str().c_str());
  std::printf("| placement | ahead | forward ms (median of %d) | vs %s | compute waited for copies ms/forward "
              "| copied per forward | device buffers | device peak |\n",
              cfg.runs, resident_name.c_str());
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::printf("| %s | - | %.1f | 1.00 | - | - | - | %s |\n", resident_name.c_str(), resident.seconds * 1e3,
              peak_text(resident).c_str());
  std::fflush(stdout);
  for (const auto& a : split_list(cfg.aheads)) {
    const int ahead = std::stoi(a);
    const auto p = time_stage(plan::Placement::kStream, ahead);
    std::printf("| stream | %d | %.1f | %.2f | %.1f | %s | %s | %s |\n", ahead, p.seconds * 1e3,
                p.seconds / resident.seconds, p.waited * 1e3 / (cfg.runs + 1),
                format_bytes(static_cast<double>(p.copied) / (cfg.runs + 1)).c_str(),
                format_bytes(static_cast<double>(p.buffers)).c_str(), peak_text(p).c_str());
    std::fflush(stdout);
  }
  if (!made.empty()) std::printf("\n(teacher written to %s for this run)\n", made.c_str());
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  return wd::bench::bench_main("bench_stream", wd::bench::run, argc, argv);
}
