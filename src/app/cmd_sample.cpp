// `wan-distill sample`: the teacher's and a student's flow-matching trajectories from the same
// noise and context, their error per step and a collapse check on the student's latents.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/commands.hpp"
#include "eval/conditions.hpp"
#include "eval/sampler_defaults.hpp"
#include "data/classes.hpp"
#include "model/negative_context.hpp"
#include "job/plan_input.hpp"
#include "core/logging.hpp"
#include "data/dataset_reader.hpp"
#include "data/flow_sampler.hpp"
#include "data/splitmix64.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/sampling_model.hpp"
#include "model/wan_experts.hpp"
#include "teacher/sampling_teacher.hpp"

namespace wd::app {

namespace {

namespace fs = std::filesystem;

struct SampleConfig {
  std::string teacher;
  double boundary = 0.0;
  std::string student;
  std::string data_path;
  std::string samples = "0";
  std::string latent = "1,4,4";
  std::int64_t count = 1;
  std::uint64_t seed = 0;
  std::int64_t steps = 40;
  double shift = 12.0;
  Solver solver = Solver::kUnipc;
  GuidanceScale guidance = 1.0;
  std::string negative;
  double collapse_ratio = 0.1;
  std::string output;
  bool trajectory = false;
  DtypeChoice dtype = DtypeChoice::kFp32;
  std::string device = "cpu";
  teacher::SamplingPlacement placement;
  LogConfig log;
  RuntimeConfig runtime;

  void bind(OptionTable& t) {
    t.require("teacher.checkpoint", teacher,
              "teacher checkpoint: a folder WanCheckpoint reads, or a two-expert (A14B) folder")
        .bind("teacher.boundary", boundary, "two-expert teacher: boundary ratio (0 = the folder's or the model type's)")
        .bind("student", student, "a student folder (RUN_DIR/student); empty = the teacher alone")
        .bind("data.path", data_path,
              "HDF5 data set whose contexts (and latent shape, and image conditions for an i2v or ti2v teacher) "
              "are used; empty = random contexts")
        .bind("samples", samples, "data set sample indices, e.g. 0,3,7 or 100-291")
        .bind("latent", latent, "random contexts only: F,H,W of the latent (C = the teacher's out_dim)")
        .bind("count", count, "random contexts only: number of samples")
        .bind("seed", seed, "seed of the noise (per sample index) and of random contexts")
        .bind("steps", steps,
              "sampling steps; unset: the official sampler's for a teacher shaped as one (T2V-A14B and I2V-A14B "
              "40, TI2V-5B 50), else this")
        .bind("shift", shift,
              "σ shift: σ' = shift·σ / (1 + (shift−1)·σ); unset: the official sampler's for a teacher shaped as one "
              "(T2V-A14B 12, I2V-A14B 5, TI2V-5B 5), else this")
        .bind("solver", solver, "Euler steps, or UniPC (bh2, order 2, as the official sampler)");
    bind_guidance(t, "guidance", guidance,
                  "classifier-free guidance scale g of both models: v_neg + g·(v − v_neg); 1 = off, whatever the "
                  "teacher (a guidance-distilled student samples unguided); LOW,HIGH: each expert of a two-expert "
                  "teacher its own (the official T2V-A14B: 3,4), the student at σ as the teacher's expert there")
        .bind("negative", negative,
              "safetensors with `context` [L,text_dim] or [1,L,text_dim]: the negative context; empty = zeros")
        .bind("collapse-ratio", collapse_ratio,
              "the student is flagged when a channel's std falls below this fraction of the teacher's")
        .bind("output", output, "directory for latents.safetensors, report.json (and trajectory.safetensors)")
        .bind("trajectory", trajectory, "also write every step's latents of both models")
        .bind("dtype", dtype, "weight dtype of both models (auto: as stored)")
        .bind("device", device, "cpu | cuda | cuda:N");
    placement.bind(t);
    log.bind(t);
    runtime.bind(t);
  }

  void validate() const {
    ConfigProblems p;
    auto show = [](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    p.check(steps >= 1, "steps(" + std::to_string(steps) + ") must be >= 1");
    p.check(shift > 0, "shift(" + show(shift) + ") must be > 0");
    p.check(collapse_ratio > 0 && collapse_ratio < 1, "collapse-ratio(" + show(collapse_ratio) + ") must be in (0, 1)");
    p.check(count >= 1, "count(" + std::to_string(count) + ") must be >= 1");
    p.check(boundary >= 0 && boundary < 1, "teacher.boundary(" + show(boundary) + ") must be in [0, 1)");
    placement.validate(p, device);
    log.validate(p);
    runtime.validate(p);
    p.throw_if_any("sample");
  }
};

nlohmann::json stats_json(const data::ChannelStats& s) { return {{"mean", s.mean}, {"std", s.std}}; }

std::string show_channels(const std::vector<double>& v) {
  std::ostringstream os;
  os.precision(4);
  for (std::size_t c = 0; c < v.size(); ++c) os << (c ? " " : "") << v[c];
  return os.str();
}

/// The teacher (one or two experts) and, with --student, the student with its projections.
std::pair<SamplingModel, std::optional<SamplingModel>> load_models(const SampleConfig& cfg, const c10::Device& device) {
  const auto dtype = dtype_of(cfg.dtype);
  auto teacher = teacher::load_sampling_teacher(
      {cfg.teacher, cfg.boundary, dtype, device, cfg.placement.resolve(device), cfg.placement.stream_ahead});
  if (cfg.student.empty()) return {std::move(teacher), std::nullopt};
  // A two-expert student (a LoRA pair) routes at the teacher's boundary.
  const auto boundary = teacher.experts->two_experts() ? std::optional<double>(teacher.experts->boundary()) : std::nullopt;
  auto student = load_sampling_student(cfg.student, dtype, device, boundary);
  return {std::move(teacher), std::move(student)};
}

/// Compares the student's final latents with the teacher's, logs the statistics and the
/// collapse verdict (a banner when collapsed) and records them in `report`.
void check_collapse(const SampleConfig& cfg, const eval::SamplingConditions& cond, const torch::Tensor& xt, const torch::Tensor& xs,
                    nlohmann::json& report) {
  // What the sampler added to the noise: a student that predicts no velocity leaves the noise
  // in place (final latents with the noise's std) and shows up here instead.
  const auto t_stats = data::channel_stats(xt), t_moved = data::channel_stats(xt - cond.noise);
  const auto s_stats = data::channel_stats(xs), s_moved = data::channel_stats(xs - cond.noise);
  const double err = data::relative_mse(xs, xt);
  const auto flat = data::collapsed_channels(s_stats, t_stats, cfg.collapse_ratio);
  const auto still = data::collapsed_channels(s_moved, t_moved, cfg.collapse_ratio);
  const bool collapsed = !flat.empty() || !still.empty();
  spdlog::info("student final latents: mean [{}] std [{}]", show_channels(s_stats.mean), show_channels(s_stats.std));
  spdlog::info("final student-vs-teacher relative MSE {:.6f}", err);
  report["student"] = {{"final", stats_json(s_stats)}, {"displacement", stats_json(s_moved)}};
  report["rel_mse_final"] = err;
  report["collapse"] = {{"ratio", cfg.collapse_ratio}, {"collapsed", collapsed},
                        {"flat_channels", flat}, {"static_channels", still}};
  if (collapsed) {
    spdlog::error("****************************************************************");
    spdlog::error("*** COLLAPSED STUDENT: per-channel std below {} x the teacher's", cfg.collapse_ratio);
    spdlog::error("*** final latents, channels [{}]; added to the noise, channels [{}]",
                  fmt::join(flat, ","), fmt::join(still, ","));
    spdlog::error("****************************************************************");
  } else {
    spdlog::info("collapse check passed: every channel's std >= {} x the teacher's", cfg.collapse_ratio);
  }
}

/// With a `classes` data set (make-dataset --kind classes): how many of each model's final
/// latents show their sample's class, and strictly (best-shift cosine >= 0.95), logged and in
/// `report`.
void report_classes(const SampleConfig& cfg, const eval::SamplingConditions& cond, const TensorMap& finals, nlohmann::json& report) {
  if (cfg.data_path.empty()) return;
  const auto classes = data::read_dataset_classes(cfg.data_path);
  if (!classes.present()) return;
  std::vector<std::int64_t> wanted;
  for (const auto i : cond.indices) wanted.push_back(classes.labels[static_cast<std::size_t>(i)]);
  for (const auto& name : {"teacher", "student"}) {
    if (!finals.count(name)) continue;
    const auto acc = data::class_accuracy(data::classify_latents(finals.at(name), classes.patterns), wanted);
    spdlog::info("{}: class accuracy {:.1f}%, strict (cosine >= 0.95) {:.1f}% of {} samples", name,
                 100 * acc.class_accuracy, 100 * acc.strict_accuracy, wanted.size());
    report[name]["class_accuracy"] = acc.class_accuracy;
    report[name]["strict_accuracy"] = acc.strict_accuracy;
  }
}

}  // namespace

int run_sample(const std::vector<std::string>& args) {
  SampleConfig cfg;
  OptionTable table("sample options");
  cfg.bind(table);
  const auto parsed = parse_options(args, table);
  if (parsed.help) {
    print_help("wan-distill sample --teacher.checkpoint PATH [--student RUN_DIR/student] "
               "[--data.path FILE --samples i,j] [--output DIR] [options]",
               "Samples with the Wan flow-matching sampler (shifted σ schedule, Euler or UniPC, optional "
               "classifier-free guidance) from the same seeded noise and context with the teacher and a "
               "student; reports the student's relative MSE to the teacher per step and at the end, the "
               "per-channel mean/std of both final latents and of what each sampler added to the noise, "
               "and flags a collapsed student.",
               table);
    return kExitOk;
  }
  cfg.validate();
  init_logging(Topology::single_process(), cfg.log.level);
  cfg.runtime.apply();
  const c10::Device device(cfg.device);
  auto [teacher, student] = load_models(cfg, device);
  // One guidance for both models: a guidance-distilled student would be guided twice by an
  // official scale, so `guidance` keeps 1 whatever the teacher.
  eval::take_official_defaults(*teacher.experts, parsed.given, {"sample", "steps", &cfg.steps, "shift", &cfg.shift});
  const auto cond = eval::make_conditions({cfg.data_path, cfg.samples, cfg.latent, cfg.count, cfg.seed, cfg.negative},
                                         teacher.experts->config(), device);
  const auto sigmas = data::sampling_sigmas(cfg.steps, cfg.shift);
  const auto guided = [&](SamplingModel& model, const torch::Tensor& x, double sigma) {
    return model.guided(x, sigma, cond.context, cond.negative, cond.lens, teacher.scale_at(cfg.guidance, sigma),
                        cond.image);
  };

  // Both trajectories side by side from the same noise, one step of each at a time.
  data::FlowSampler teacher_sampler(cfg.solver, sigmas), student_sampler(cfg.solver, sigmas);
  // A ti2v teacher's image mode starts, and stays after every step, with the image as frame 0.
  torch::Tensor xt = cond.image.keep(cond.noise), xs = xt;
  TensorMap trajectory{{"teacher.0", xt}};
  if (student) trajectory["student.0"] = xs;
  nlohmann::json report{{"solver", name_of(cfg.solver)}, {"steps", cfg.steps}, {"shift", cfg.shift}, {"guidance", cfg.guidance},
                        {"sigmas", sigmas}, {"samples", cond.indices}};
  for (std::int64_t i = 0; i < cfg.steps; ++i) {
    const double sigma = sigmas[static_cast<std::size_t>(i)];
    xt = cond.image.keep(teacher_sampler.step(i, xt, guided(teacher, xt, sigma)));
    if (cfg.trajectory) trajectory["teacher." + std::to_string(i + 1)] = xt;
    if (!student) continue;
    xs = cond.image.keep(student_sampler.step(i, xs, guided(*student, xs, sigma)));
    if (cfg.trajectory) trajectory["student." + std::to_string(i + 1)] = xs;
    const double err = data::relative_mse(xs, xt);
    report["rel_mse_per_step"].push_back(err);
    spdlog::info("step {}/{}: σ {:.4f} -> {:.4f}, t {:.1f}, student-vs-teacher relative MSE {:.6f}", i + 1,
                 cfg.steps, sigma, sigmas[static_cast<std::size_t>(i + 1)], 1000 * sigma, err);
  }

  const auto t_stats = data::channel_stats(xt), t_moved = data::channel_stats(xt - cond.noise);
  spdlog::info("teacher final latents: mean [{}] std [{}]", show_channels(t_stats.mean), show_channels(t_stats.std));
  report["teacher"] = {{"final", stats_json(t_stats)}, {"displacement", stats_json(t_moved)}};
  TensorMap latents{{"noise", cond.noise}, {"teacher", xt}};
  if (student) {
    check_collapse(cfg, cond, xt, xs, report);
    latents["student"] = xs;
  }
  report_classes(cfg, cond, latents, report);
  if (!cfg.output.empty()) {
    fs::create_directories(cfg.output);
    const std::map<std::string, std::string> meta{{"producer", "wan-distill sample"}, {"solver", name_of(cfg.solver)}};
    write_safetensors((fs::path(cfg.output) / "latents.safetensors").string(), latents, meta);
    if (cfg.trajectory) write_safetensors((fs::path(cfg.output) / "trajectory.safetensors").string(), trajectory, meta);
    std::ofstream((fs::path(cfg.output) / "report.json").string()) << report.dump(2) << "\n";
    spdlog::info("wrote {}", cfg.output);
  }
  return kExitOk;
}

}  // namespace wd::app
