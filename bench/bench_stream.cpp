// bench_stream: the cost of teacher.placement = stream against a resident teacher (cpu) on this
// machine, where the "device" is the host: one forward per batch over a checkpoint on disk,
// median time per forward, the time compute waited for copies, and the copy volume.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "core/config.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"
#include "model/wan_checkpoint.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::bench {
namespace {

struct StreamBenchConfig {
  std::string checkpoint;  ///< empty: a random d1024 x 8-block bf16 teacher in a temp dir
  std::string aheads = "1,2";
  int runs = 5;
  int batch = 2;
  int frames = 2, height = 16, width = 16;
  LogConfig log;
  StreamBenchConfig() { log.level = "warn"; }
  void bind(OptionTable& t) {
    t.bind("checkpoint", checkpoint, "teacher checkpoint; empty = a random dim-1024, 8-block bf16 one")
        .bind("aheads", aheads, "comma list of teacher.stream_ahead values")
        .bind("runs", runs, "timed forwards per point (median reported)")
        .bind("batch", batch, "samples per forward")
        .bind("frames", frames, "latent frames")
        .bind("height", height, "latent height")
        .bind("width", width, "latent width");
    log.bind(t);
  }
};

int run(int argc, char** argv) {
  StreamBenchConfig cfg;
  OptionTable table("bench_stream options");
  cfg.bind(table);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (parse_options(args, table).help) {
    std::cout << "bench_stream [--checkpoint DIR] [--aheads 1,2] [--runs 5] [--batch 2]\n"
              << table.description() << "\n";
    return 0;
  }
  init_logging(Topology::single_process(), cfg.log.level);
  torch::set_num_threads(1);
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
  teacher::StageBatch inputs;
  inputs.x_t = torch::randn({cfg.batch, c.in_dim, cfg.frames, cfg.height, cfg.width});
  inputs.t = torch::full({cfg.batch}, 500.f);
  inputs.context = torch::randn({cfg.batch, c.text_len, c.text_dim});
  inputs.context_lens = torch::full({cfg.batch}, c.text_len, torch::kLong);
  const teacher::BlockRange all{0, c.num_layers};

  const auto time_stage = [&](memory::Placement p, int ahead, double& waited, std::uint64_t& copied,
                              std::uint64_t& buffers) {
    teacher::StageLoad how;
    how.placement = p;
    how.blocks = all;
    how.stream_ahead = ahead;
    std::vector<teacher::StageModel> models;
    models.push_back(teacher::load_stage_model(ck, how));
    teacher::TeacherStage stage(std::move(models), nullptr, all, {});
    std::vector<double> times;
    for (int r = 0; r < cfg.runs + 1; ++r) {
      teacher::StageBatch b = inputs;
      const auto t0 = Clock::now();
      stage.run(b);
      if (r > 0) times.push_back(seconds_since(t0));  // the first forward warms caches up
    }
    const auto& s = stage.experts().front().streamer;
    waited = s ? s->wait_seconds() : 0;
    copied = s ? s->copied_bytes() : 0;
    buffers = s ? s->buffer_bytes() : 0;
    return median(times);
  };
  double w = 0;
  std::uint64_t cp = 0, buf = 0;
  const double resident = time_stage(memory::Placement::kCpu, 0, w, cp, buf);
  std::printf("teacher %s: %s, batch %d, latent %lldx%dx%dx%d, one LibTorch thread\n\n", path.c_str(),
              c.summary().c_str(), cfg.batch, static_cast<long long>(c.in_dim), cfg.frames, cfg.height, cfg.width);
  std::printf("| placement | ahead | forward ms (median of %d) | vs cpu | compute waited for copies ms/forward | copied per forward | device buffers |\n",
              cfg.runs);
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| cpu | - | %.1f | 1.00 | - | - | - |\n", resident * 1e3);
  for (const auto& a : split_list(cfg.aheads)) {
    const int ahead = std::stoi(a);
    const double t = time_stage(memory::Placement::kStream, ahead, w, cp, buf);
    std::printf("| stream | %d | %.1f | %.2f | %.1f | %s | %s |\n", ahead, t * 1e3, t / resident,
                w * 1e3 / (cfg.runs + 1), format_bytes(static_cast<double>(cp) / (cfg.runs + 1)).c_str(),
                format_bytes(static_cast<double>(buf)).c_str());
  }
  if (!made.empty()) std::printf("\n(teacher written to %s for this run)\n", made.c_str());
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  try {
    return wd::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_stream: %s\n", e.what());
    return 1;
  }
}
