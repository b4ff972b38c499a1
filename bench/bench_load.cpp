// bench_load: times loading a ~1 GB sharded bf16 checkpoint as zero-copy CPU tensors against
// reading the same bytes (cat, read()), with the resident memory each step adds.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_config.hpp"
#include "model/wan_dit.hpp"

namespace fs = std::filesystem;

namespace wd::bench {
namespace {

struct LoadBenchConfig {
  std::string dir = "/tmp/wd-bench-ckpt";
  int layers = 14;      ///< 14 layers of dim 1536 is ~0.54 G parameters, ~1.0 GiB in bf16
  int shard_mb = 256;
  int runs = 5;
  int fp32_runs = 3;
  int threads = 1;      ///< cat and read() are single-threaded; so is the fp32 conversion then
  std::uint64_t seed = 7;
  LogConfig log;

  LoadBenchConfig() { log.level = "warn"; }  // the loader's info lines would drown the table

  void bind(OptionTable& t) {
    t.bind("dir", dir, "checkpoint directory; written first when it holds no checkpoint")
        .bind("layers", layers, "DiT blocks of the generated checkpoint (dim 1536, ffn 6144)")
        .bind("shard-mb", shard_mb, "largest shard of the generated checkpoint, MiB")
        .bind("runs", runs, "timed runs of cat, read() and the zero-copy load (median reported)")
        .bind("fp32-runs", fp32_runs, "timed runs of the load converted to fp32")
        .bind("threads", threads, "LibTorch intra-op threads (the fp32 conversion uses them)")
        .bind("seed", seed, "seed of the generated checkpoint");
    log.bind(t);
  }
  void validate() const {
    ConfigProblems p;
    p.check(!dir.empty(), "dir must not be empty");
    p.check(layers >= 1, "layers(" + std::to_string(layers) + ") must be >= 1");
    p.check(shard_mb >= 1, "shard-mb(" + std::to_string(shard_mb) + ") must be >= 1");
    p.check(runs >= 1, "runs(" + std::to_string(runs) + ") must be >= 1");
    p.check(fp32_runs >= 0, "fp32-runs(" + std::to_string(fp32_runs) + ") must be >= 0");
    p.check(threads >= 1, "threads(" + std::to_string(threads) + ") must be >= 1");
    log.validate(p);
    p.throw_if_any("bench_load");
  }
};

/// The benchmark checkpoint: Wan-like widths (a 1.3B-sized block with the real T5 text width),
/// fewer layers so that it is about 1 GB.
WanConfig bench_model(int layers) {
  WanConfig c;
  c.dim = 1536;
  c.ffn_dim = 6144;
  c.num_heads = 12;
  c.num_layers = layers;
  c.text_dim = 4096;
  c.text_len = 512;
  return c;
}

/// Writes the checkpoint unless `dir` already holds one with the same config. A different
/// config is an error rather than an overwrite, because stale shards of another layout would
/// be left behind in a directory the user chose.
void ensure_checkpoint(const LoadBenchConfig& cfg, const WanConfig& model) {
  const fs::path dir(cfg.dir);
  const auto config_file = dir / "config.json";
  if (fs::exists(dir / "diffusion_pytorch_model.safetensors.index.json") && fs::exists(config_file)) {
    const auto existing = WanConfig::load(config_file.string());
    if (existing.to_json() != model.to_json()) {
      throw ConfigError("dir(" + cfg.dir + ") holds a different checkpoint (" + existing.summary() +
                        "); remove it or pass another --dir");
    }
    std::printf("Reusing the checkpoint in %s.\n\n", cfg.dir.c_str());
    return;
  }
  std::printf("Writing a random checkpoint to %s ...\n", cfg.dir.c_str());
  std::fflush(stdout);
  const auto start = Clock::now();
  const auto result = write_random_wan_checkpoint(
      cfg.dir, model, torch::kBFloat16, static_cast<std::uint64_t>(cfg.shard_mb) << 20, cfg.seed);
  std::printf("  %zu shards, %s, in %.1f s.\n\n", result.shard_files.size(),
              format_bytes(static_cast<double>(result.total_bytes)).c_str(), seconds_since(start));
}

/// Reads every file through a 1 MiB buffer; returns the byte count. This is what cat does,
/// without the process start.
std::uint64_t read_files(const std::vector<std::string>& paths) {
  std::vector<char> buffer(1 << 20);
  std::uint64_t total = 0;
  for (const auto& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    WD_CHECK_SYS(fd, path);
    for (;;) {
      const ssize_t n = ::read(fd, buffer.data(), buffer.size());
      if (n < 0) {
        const auto msg = detail::errno_message("read [" + path + "]");
        ::close(fd);
        throw SystemError(msg);
      }
      if (n == 0) break;
      total += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
  }
  return total;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Parameters whose storage lies inside one of the checkpoint's mappings, i.e. were not copied.
std::size_t zero_copy_count(const WanCheckpoint& ck, WanDiT& model) {
  std::size_t n = 0;
  for (const auto& p : model->parameters()) {
    const auto* ptr = static_cast<const std::uint8_t*>(p.data_ptr());
    for (const auto& f : ck.files()) {
      const auto& m = f.mapping();
      if (ptr >= m.data() && ptr < m.data() + m.size()) {
        ++n;
        break;
      }
    }
  }
  return n;
}

struct Row {
  std::string step;
  std::vector<double> seconds;
  std::optional<double> bytes_read;  ///< for a throughput column; none when nothing is read
  std::optional<Rss> growth;
};

std::string kib_str(std::int64_t kib) {
  return (kib < 0 ? "-" : "") + format_bytes(static_cast<double>(std::llabs(kib)) * 1024.0);
}

void print_table(const std::vector<Row>& rows) {
  std::printf("| step | median | min | runs | throughput | RSS growth (anon / file) |\n");
  std::printf("|---|---:|---:|---:|---:|---|\n");
  for (const auto& r : rows) {
    const double med = median(r.seconds);
    std::string rate = "—";
    if (r.bytes_read && med > 0) rate = format_bytes(*r.bytes_read / med) + "/s";
    std::string rss = "—";
    if (r.growth) rss = kib_str(r.growth->anon_kib) + " / " + kib_str(r.growth->file_kib);
    std::printf("| %s | %.1f ms | %.1f ms | %zu | %s | %s |\n", r.step.c_str(), med * 1e3,
                min_of(r.seconds) * 1e3, r.seconds.size(), rate.c_str(), rss.c_str());
  }
}

int run(const std::vector<std::string>& args) {
  LoadBenchConfig cfg;
  OptionTable table("bench_load options");
  cfg.bind(table);
  if (parse_options(args, table).help) {
    std::cout << "Usage: bench_load [options]\n" << table.description();
    return 0;
  }
  cfg.validate();
  init_logging(Topology::single_process(), cfg.log.level);
  torch::set_num_threads(cfg.threads);
  torch::NoGradGuard no_grad;

  const auto model_cfg = bench_model(cfg.layers);
  std::printf("## bench_load\n\n");
  ensure_checkpoint(cfg, model_cfg);

  // The files the loader opens: shards, index and config.json.
  std::vector<std::string> paths;
  std::uint64_t tensor_bytes = 0;
  std::size_t tensors = 0;
  {
    const auto ck = WanCheckpoint::open(cfg.dir);
    for (const auto& f : ck.files()) paths.push_back(f.path());
    paths.push_back((fs::path(cfg.dir) / "diffusion_pytorch_model.safetensors.index.json").string());
    paths.push_back(ck.config_path());
    tensor_bytes = ck.total_bytes();
    tensors = ck.tensor_count();
  }
  std::string cat_cmd = "cat --";
  for (const auto& p : paths) cat_cmd += " " + shell_quote(p);
  cat_cmd += " > /dev/null";

  // Warm the page cache so every step below reads from memory, not the disk.
  const auto file_bytes = static_cast<double>(read_files(paths));

  std::printf("checkpoint: %s\n\n", cfg.dir.c_str());
  std::printf("- model: %s, %.3f G parameters, %zu tensors\n", model_cfg.summary().c_str(),
              static_cast<double>(wan_param_count(model_cfg)) / 1e9, tensors);
  std::printf("- files: %zu shards + index + config.json, %s on disk (%s of bf16 tensor data)\n",
              paths.size() - 2, format_bytes(file_bytes).c_str(),
              format_bytes(static_cast<double>(tensor_bytes)).c_str());
  std::printf("- LibTorch threads: %d; page cache warmed by one read of every file\n\n", cfg.threads);
  std::fflush(stdout);

  std::vector<Row> rows;
  Row cat{"(a) `cat` all files > /dev/null (incl. process start)", {}, file_bytes, std::nullopt};
  for (int i = 0; i < cfg.runs; ++i) {
    const auto start = Clock::now();
    const int status = std::system(cat_cmd.c_str());
    cat.seconds.push_back(seconds_since(start));
    WD_CHECK(status == 0, "`" << cat_cmd << "` exited with status " << status);
  }
  rows.push_back(cat);

  Row rd{"(a') read() all files, 1 MiB buffer, in process", {}, file_bytes, std::nullopt};
  for (int i = 0; i < cfg.runs; ++i) {
    const auto start = Clock::now();
    read_files(paths);
    rd.seconds.push_back(seconds_since(start));
  }
  rows.push_back(rd);

  // The growth reported is the largest over the runs, measured while the model is alive.
  Row zero{"(b) WanCheckpoint::open + load_wan_dit, bf16 as stored (zero-copy)", {}, std::nullopt, Rss{}};
  std::size_t zero_copy = 0, params = 0;
  for (int i = 0; i < cfg.runs; ++i) {
    const auto before = Rss::now();
    const auto start = Clock::now();
    const auto ck = WanCheckpoint::open(cfg.dir);
    auto model = load_wan_dit(ck, std::nullopt);
    zero.seconds.push_back(seconds_since(start));
    const auto growth = Rss::now() - before;
    if (growth.total_kib > zero.growth->total_kib) zero.growth = growth;
    zero_copy = zero_copy_count(ck, model);
    params = model->parameters().size();
  }
  rows.push_back(zero);

  // What the mapping costs once the weights are used: every page is read on first touch.
  // Each run maps afresh, so each run faults every page in again.
  Row touch{"(b') then touch every weight once (sum), after (b)", {},
            static_cast<double>(tensor_bytes), Rss{}};
  for (int i = 0; i < cfg.runs; ++i) {
    const auto ck = WanCheckpoint::open(cfg.dir);
    auto model = load_wan_dit(ck, std::nullopt);
    const auto before = Rss::now();
    const auto start = Clock::now();
    double checksum = 0;
    for (const auto& p : model->parameters()) checksum += p.sum().item<double>();
    touch.seconds.push_back(seconds_since(start));
    const auto growth = Rss::now() - before;
    if (growth.total_kib > touch.growth->total_kib) touch.growth = growth;
    WD_CHECK(std::isfinite(checksum), "the checkpoint's weights sum to " << checksum);
  }
  rows.push_back(touch);

  Row conv{"(c) WanCheckpoint::open + load_wan_dit converted to fp32", {},
           static_cast<double>(tensor_bytes), Rss{}};
  for (int i = 0; i < cfg.fp32_runs; ++i) {
    const auto before = Rss::now();
    const auto start = Clock::now();
    const auto ck = WanCheckpoint::open(cfg.dir);
    auto model = load_wan_dit(ck, torch::kFloat);
    conv.seconds.push_back(seconds_since(start));
    const auto growth = Rss::now() - before;
    if (growth.total_kib > conv.growth->total_kib) conv.growth = growth;
  }
  if (cfg.fp32_runs > 0) rows.push_back(conv);

  // A floor for (c): the converted weights are fresh anonymous memory, and faulting in and
  // zeroing that many pages costs time before any conversion happens.
  Row fresh{"(c') for scale: allocate + first-touch an fp32 buffer of (c)'s size (fill_(0))", {},
            2.0 * static_cast<double>(tensor_bytes), Rss{}};
  for (int i = 0; i < cfg.fp32_runs; ++i) {
    const auto before = Rss::now();
    const auto start = Clock::now();
    auto buffer = torch::empty({static_cast<std::int64_t>(tensor_bytes / 2)}, torch::kFloat);
    buffer.fill_(0);
    fresh.seconds.push_back(seconds_since(start));
    const auto growth = Rss::now() - before;
    if (growth.total_kib > fresh.growth->total_kib) fresh.growth = growth;
  }
  if (cfg.fp32_runs > 0) rows.push_back(fresh);

  print_table(rows);
  const double load = median(zero.seconds);
  std::printf("\n- zero-copy parameters after (b): %zu of %zu\n", zero_copy, params);
  std::printf("- ratio (b) / (a) load / cat: %.4f\n", load / median(cat.seconds));
  std::printf("- ratio (b) / (a') load / read(): %.4f\n", load / median(rd.seconds));
  if (cfg.fp32_runs > 0) {
    std::printf("- ratio (c) / (a) fp32 load / cat: %.2f\n", median(conv.seconds) / median(cat.seconds));
  }
  return 0;
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  return wd::bench::bench_main("bench_load", wd::bench::run, argc, argv);
}
