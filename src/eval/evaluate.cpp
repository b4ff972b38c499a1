// The evaluation rows: sampling, scoring, the report (evaluate.hpp).
#include "eval/evaluate.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "data/classes.hpp"
#include "data/dataset_info.hpp"
#include "data/flow_sampler.hpp"
#include "eval/conditions.hpp"
#include "eval/metrics.hpp"
#include "eval/sampler_defaults.hpp"
#include "model/safetensors.hpp"
#include "model/sampling_model.hpp"
#include "teacher/sampling_teacher.hpp"

namespace wd::eval {

namespace fs = std::filesystem;

void EvaluateConfig::bind(OptionTable& t) {
  t.require("teacher.checkpoint", teacher, "the teacher: a folder WanCheckpoint reads, or a two-expert folder")
      .bind("teacher.boundary", boundary, "two-expert teacher: boundary ratio (0 = the folder's or the model type's)")
      .bind("student", student, "a student folder (RUN_DIR/student); empty = the teacher's rows only")
      .require("data.path", data_path, "HDF5 data set whose contexts (and latent shape) are used")
      .bind("samples", samples,
            "data set sample indices, e.g. 4096-4287; empty = the last --count samples (what train holds out "
            "with train.eval_samples >= count: never trained on)")
      .bind("count", count, "samples per row when --samples is empty (192 or more: the paired error is heavy-tailed)")
      .bind("seed", seed, "seed of the rows' noise (per sample index); the reference's second set uses seed + 1")
      .bind("teacher.steps", teacher_steps,
            "the reference's sampling steps; unset: the official sampler's for a teacher shaped as one (T2V-A14B "
            "and I2V-A14B 40, TI2V-5B 50), else this")
      .bind("teacher.solver", teacher_solver, "the reference's sampler");
  bind_guidance(t, "teacher.guidance", teacher_guidance,
                "the reference's guidance scale g (teacher_at_k's too); LOW,HIGH: each expert of a two-expert "
                "teacher its own; unset: the official sampler's for a teacher shaped as one (T2V-A14B 3,4, "
                "I2V-A14B 3.5, TI2V-5B 5), else this")
      .bind("teacher.shift", shift,
            "σ shift of every row's schedule; unset: the official sampler's for a teacher shaped as one (T2V-A14B "
            "12, I2V-A14B 5, TI2V-5B 5), else this")
      .bind("student.steps", student_steps, "k: the Euler steps of teacher_at_k and of the student")
      .bind("student.guidance", student_guidance, "the student's guidance scale (1 = none: a guidance-distilled student)")
      .bind("student.solver", student_solver, "the student's sampler (euler: a few-step student)")
      .bind("reuse", reuse,
            "an earlier evaluate's --output: its teacher rows (reference, its other-noise set, teacher_unguided, and "
            "teacher_at_k at the same student.steps) are read instead of sampled again; its teacher settings must "
            "equal these")
      .bind("negative", negative, "safetensors with `context` [L,text_dim]: the negative context; empty = zeros")
      .bind("batch", batch, "samples per sampler batch")
      .bind("collapse-ratio", collapse_ratio,
            "a row is flagged collapsed when a channel's std falls below this fraction of the reference's")
      .bind("output", output, "directory for report.json and latents.safetensors")
      .bind("dtype", dtype, "weight dtype of the models (auto: as stored)")
      .bind("device", device, "cpu | cuda | cuda:N");
  placement.bind(t);
  log.bind(t);
  runtime.bind(t);
}

void EvaluateConfig::validate() const {
  ConfigProblems p;
  const auto show = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  p.check(count >= 2, "count(" + std::to_string(count) + ") must be >= 2 (a Fréchet distance needs two samples)");
  p.check(teacher_steps >= 1, "teacher.steps(" + std::to_string(teacher_steps) + ") must be >= 1");
  p.check(student_steps >= 1, "student.steps(" + std::to_string(student_steps) + ") must be >= 1");
  p.check(student_guidance > 0, "student.guidance(" + show(student_guidance) + ") must be > 0");
  p.check(shift > 0, "teacher.shift(" + show(shift) + ") must be > 0");
  p.check(batch >= 1, "batch(" + std::to_string(batch) + ") must be >= 1");
  p.check(collapse_ratio > 0 && collapse_ratio < 1, "collapse-ratio(" + show(collapse_ratio) + ") must be in (0, 1)");
  p.check(boundary >= 0 && boundary < 1, "teacher.boundary(" + show(boundary) + ") must be in [0, 1)");
  placement.validate(p, device);
  log.validate(p);
  runtime.validate(p);
  p.throw_if_any("evaluate");
}

namespace {

/// One row: which model samples how.
struct RowSpec {
  std::string name;
  SamplingModel* model;
  std::int64_t steps;
  Solver solver;
  GuidanceScale guidance;
  const SamplingConditions* cond;
};

/// The row's final latents, batch by batch, with progress and an ETA.
torch::Tensor sample_row(const RowSpec& row, double shift, std::int64_t batch) {
  const auto sigmas = data::sampling_sigmas(row.steps, shift);
  const auto n = row.cond->noise.size(0);
  std::vector<torch::Tensor> out;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t lo = 0; lo < n; lo += batch) {
    const auto part = row.cond->slice(lo, std::min(n, lo + batch));
    out.push_back(data::sample_flow(
                      row.solver, sigmas, part.noise,
                      [&](const torch::Tensor& x, double sigma) {
                        return row.model->guided(x, sigma, part.context, part.negative, part.lens,
                                                 row.model->scale_at(row.guidance, sigma),
                                                 part.image);
                      },
                      [&](const torch::Tensor& x) { return part.image.keep(x); })
                      .to(torch::kFloat)
                      .cpu());
    const auto done = std::min(n, lo + batch);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("{}: {}/{} samples ({} {} steps, g {}), {:.0f} s, ETA {:.0f} s", row.name, done, n, row.steps,
                 name_of(row.solver), row.guidance.str(), s, s / static_cast<double>(done) * static_cast<double>(n - done));
  }
  return torch::cat(out);
}

std::vector<std::int64_t> wanted_classes(const data::DatasetClasses& classes, const std::vector<std::int64_t>& idx) {
  std::vector<std::int64_t> wanted;
  for (const auto i : idx) wanted.push_back(classes.labels.at(static_cast<std::size_t>(i)));
  return wanted;
}

/// A row's `diversity` in report.json: per class its values over the reference's (a class the
/// reference shows no spread in counts 1: nothing to lose), and the lowest of each over classes.
nlohmann::json diversity_ratios(const ClassDiversity& row, const ClassDiversity& ref) {
  WD_CHECK(row.classes.size() == ref.classes.size(), "diversity: " << row.classes.size() << " classes against the "
                                                                   << "reference's " << ref.classes.size());
  const auto over = [](double x, double r) { return r > 0 ? x / r : 1.0; };
  nlohmann::json per_class = nlohmann::json::array();
  double positions = 1, amplitude = 1, pair = 1;
  for (std::size_t i = 0; i < row.classes.size(); ++i) {
    const auto& c = row.classes[i];
    const auto& r = ref.classes[i];
    WD_CHECK(c.label == r.label && c.samples == r.samples, "diversity: class " << c.label << " (" << c.samples
                                                                               << " samples) against the reference's "
                                                                               << r.label << " (" << r.samples << ")");
    const double p = over(static_cast<double>(c.positions), static_cast<double>(r.positions));
    const double a = over(c.amplitude_std, r.amplitude_std);
    const double d = over(c.pair_distance, r.pair_distance);
    per_class.push_back({{"class", c.label}, {"samples", c.samples}, {"positions", p}, {"amplitude", a},
                         {"pair_distance", d}});
    positions = i == 0 ? p : std::min(positions, p);
    amplitude = i == 0 ? a : std::min(amplitude, a);
    pair = i == 0 ? d : std::min(pair, d);
  }
  return {{"positions", positions}, {"amplitude", amplitude}, {"pair_distance", pair}, {"per_class", per_class}};
}

/// The rows' table in the log (report.json has it all), the Fréchet floor, and what pos, amp and
/// pair mean.
void log_table(const nlohmann::json& report, bool classes) {
  spdlog::info("{:<22} {:>14} {:>8} {:>9} {:>8} {:>9} {:>10} {:>5} {:>5} {:>5} {:>7} {:>11}", "row", "paired rel MSE",
               "median", "Fréchet", "class %", "strict %", "collapsed", "pos", "amp", "pair", "cond %", "frame 0 err");
  for (const auto& [name, r] : report["rows"].items()) {
    if (!r.contains("paired_rel_mse")) continue;
    const auto percent = [&r](const char* key) {
      return r.contains(key) ? fmt::format("{:.1f}", 100 * r[key].get<double>()) : std::string("-");
    };
    const auto ratio = [&r](const char* key) {
      return r.contains("diversity") ? fmt::format("{:.2f}", r["diversity"][key].get<double>()) : std::string("-");
    };
    const auto first_frame = r.contains("first_frame_rel_mse")
                                 ? fmt::format("{:.2e}", r["first_frame_rel_mse"].get<double>())
                                 : std::string("-");
    spdlog::info("{:<22} {:>14.4f} {:>8.4f} {:>9.4f} {:>8} {:>9} {:>10} {:>5} {:>5} {:>5} {:>7} {:>11}", name,
                 r["paired_rel_mse"].get<double>(), r["paired_rel_mse_median"].get<double>(),
                 r["frechet"].get<double>(), percent("class_accuracy"), percent("strict_accuracy"),
                 r["collapsed"].get<bool>() ? "yes" : "no", ratio("positions"), ratio("amplitude"),
                 ratio("pair_distance"), percent("condition_accuracy"), first_frame);
  }
  spdlog::info("Fréchet floor (the reference against its own other-noise set): {:.4f} ± {:.4f} (the bootstrap "
               "spread of a Fréchet distance at this count; report.json has each row's)",
               report["frechet_floor"].get<double>(), report["frechet_floor_spread"].get<double>());
  if (classes) {
    spdlog::info("pos, amp, pair: the lowest over classes of the row's / the reference's distinct positions, "
                 "amplitude std and mean within-class pair distance (below 1: less varied than the reference; "
                 "per class in report.json)");
  }
}

/// The measures of image-conditioned rows: how near each row's first frames are to the images,
/// and on a classes data set how well its videos continue them (docs/objectives.md#evaluate).
class ConditionScores {
 public:
  ConditionScores(const ImageInput& image, const data::DatasetClasses& classes) : classes_(classes) {
    if (!image.defined()) return;
    first_frames_ = image.image.narrow(2, 0, 1).to(torch::kFloat).cpu();
    if (classes.present()) images_ = data::classify_frames(first_frames_, classes.patterns.narrow(2, 0, 1));
  }
  /// Adds first_frame_rel_mse and condition_accuracy of latents `x` to row `r` (nothing without images).
  void operator()(const torch::Tensor& x, nlohmann::json& r) const {
    if (!first_frames_.defined()) return;
    r["first_frame_rel_mse"] = data::relative_mse(x.narrow(2, 0, 1), first_frames_);
    if (classes_.present()) {
      r["condition_accuracy"] = data::condition_accuracy(data::classify_frames(x, classes_.patterns), images_);
    }
  }

 private:
  const data::DatasetClasses& classes_;
  torch::Tensor first_frames_;  ///< [B,C,1,H,W] the images' latents (undefined: none)
  data::FrameClasses images_;   ///< their classes and positions
};

/// --reuse: the teacher rows of an earlier evaluation, whose settings must be `settings`.
void take_teacher_rows(const std::string& dir, const nlohmann::json& settings, TensorMap& latents) {
  const auto report_path = (fs::path(dir) / "report.json").string();
  std::ifstream in(report_path);
  WD_CHECK_DATA(in.good(), report_path, "", "cannot be read (reuse(" << dir << ") must be an evaluate --output)");
  nlohmann::json earlier;
  try {
    earlier = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(report_path, "", std::string("not JSON (") + e.what() + ")");
  }
  for (const auto& [key, value] : settings.items()) {
    if (key == "student_steps") continue;  // teacher_at_k's only: below
    WD_CHECK_AS(ConfigError, earlier.contains(key) && earlier[key] == value,
                "reuse(" << dir << "): its " << key << " is " << (earlier.contains(key) ? earlier[key].dump() : "absent")
                         << ", this evaluation's is " << value.dump() << "; the teacher rows must be sampled alike");
  }
  const auto file = SafetensorsFile::open((fs::path(dir) / "latents.safetensors").string());
  for (const char* row : {"reference", "reference_other_noise", "teacher_unguided"}) {
    latents[row] = file.tensor(row, torch::kFloat).clone();
  }
  // teacher_at_k is the teacher at the student's k: taken when k is the same.
  const bool same_k = earlier.contains("student_steps") && earlier["student_steps"] == settings["student_steps"];
  if (same_k) latents["teacher_at_k"] = file.tensor("teacher_at_k", torch::kFloat).clone();
  spdlog::info("reuse: the teacher rows of {}{}", dir, same_k ? "" : " (teacher_at_k sampled again: another k)");
}

}  // namespace

nlohmann::json run_evaluation(const EvaluateConfig& options) {
  auto cfg = options;
  const c10::Device device(cfg.device);
  const auto dtype = dtype_of(cfg.dtype);
  auto teacher = teacher::load_sampling_teacher(
      {cfg.teacher, cfg.boundary, dtype, device, cfg.placement.resolve(device), cfg.placement.stream_ahead});
  take_official_defaults(*teacher.experts, cfg.given,
                         {"evaluate", "teacher.steps", &cfg.teacher_steps, "teacher.shift", &cfg.shift,
                          "teacher.guidance", &cfg.teacher_guidance});
  std::optional<SamplingModel> student;
  // A two-expert student (a LoRA pair) routes at the teacher's boundary.
  const auto boundary = teacher.experts->two_experts() ? std::optional<double>(teacher.experts->boundary()) : std::nullopt;
  if (!cfg.student.empty()) student = load_sampling_student(cfg.student, dtype, device, boundary);
  const auto& tc = teacher.experts->config();
  auto samples = cfg.samples;
  if (samples.empty()) {
    const auto info = data::validate_dataset(cfg.data_path, {});
    WD_CHECK_AS(ConfigError, info.samples >= cfg.count,
                "count(" << cfg.count << ") exceeds the " << info.samples << " samples of " << cfg.data_path);
    samples = std::to_string(info.samples - cfg.count) + "-" + std::to_string(info.samples - 1);
  }
  const auto cond = make_conditions({cfg.data_path, samples, "", 0, cfg.seed, cfg.negative}, tc, device);
  const auto other = make_conditions({cfg.data_path, samples, "", 0, cfg.seed + 1, cfg.negative}, tc, device);
  const auto k = cfg.student_steps;
  const auto& g = cfg.teacher_guidance;
  std::vector<RowSpec> rows{{"reference", &teacher, cfg.teacher_steps, cfg.teacher_solver, g, &cond},
                            {"reference_other_noise", &teacher, cfg.teacher_steps, cfg.teacher_solver, g, &other},
                            {"teacher_unguided", &teacher, cfg.teacher_steps, cfg.teacher_solver, 1.0, &cond},
                            {"teacher_at_k", &teacher, k, Solver::kEuler, g, &cond}};
  if (student) rows.push_back({"student", &*student, k, cfg.student_solver, cfg.student_guidance, &cond});

  TensorMap latents{{"noise", cond.noise.cpu()}};
  nlohmann::json settings{{"samples", cond.indices}, {"seed", cfg.seed}, {"shift", cfg.shift},
                          {"teacher_steps", cfg.teacher_steps}, {"teacher_solver", name_of(cfg.teacher_solver)},
                          {"teacher_guidance", g}, {"student_steps", k}, {"teacher", cfg.teacher},
                          {"negative", cfg.negative}};
  if (!cfg.reuse.empty()) take_teacher_rows(cfg.reuse, settings, latents);
  for (const auto& row : rows) {
    if (!latents.count(row.name)) latents[row.name] = sample_row(row, cfg.shift, cfg.batch);
  }
  const auto classes = data::read_dataset_classes(cfg.data_path);
  const auto features = [&](const torch::Tensor& x) { return latent_features(x, classes.patterns); };
  const auto& ref = latents.at("reference");
  const auto other_features = features(latents.at("reference_other_noise"));
  nlohmann::json report = settings;
  report["count"] = cond.indices.size();
  report["student_guidance"] = cfg.student_guidance;
  report["student_solver"] = name_of(cfg.student_solver);
  const auto ref_features = features(ref);
  report["frechet_floor"] = frechet_distance(ref_features, other_features);
  report["frechet_floor_spread"] = frechet_spread(ref_features, other_features);
  std::vector<std::int64_t> wanted;
  ClassDiversity ref_diversity;
  if (classes.present()) {
    wanted = wanted_classes(classes, cond.indices);
    ref_diversity = class_diversity(ref, data::classify_latents(ref, classes.patterns), classes.patterns, wanted);
  }
  const ConditionScores score_condition(cond.image, classes);
  for (const auto& row : rows) {
    if (row.name == "reference_other_noise") continue;
    const auto& x = latents.at(row.name);
    const auto paired = paired_error(x, ref);
    const auto flat = collapsed_channels(x, ref, cfg.collapse_ratio);
    const auto x_features = features(x);
    nlohmann::json r{{"steps", row.steps}, {"solver", name_of(row.solver)}, {"guidance", row.guidance},
                     {"paired_rel_mse", paired.rel_mse}, {"paired_rel_mse_median", paired.median},
                     {"frechet", frechet_distance(x_features, other_features)},
                     {"frechet_spread", frechet_spread(x_features, other_features)},
                     {"collapsed", !flat.empty()}, {"collapsed_channels", flat}};
    if (classes.present()) {
      const auto got = data::classify_latents(x, classes.patterns);
      const auto acc = data::class_accuracy(got, wanted);
      r["class_accuracy"] = acc.class_accuracy;
      r["strict_accuracy"] = acc.strict_accuracy;
      // The reference against itself: ratios of 1, from the very values the other rows divide by.
      r["diversity"] = diversity_ratios(
          row.name == "reference" ? ref_diversity : class_diversity(x, got, classes.patterns, wanted), ref_diversity);
    }
    score_condition(x, r);
    report["rows"][row.name] = r;
  }
  if (classes.present()) {
    const auto acc =
        data::class_accuracy(data::classify_latents(latents.at("reference_other_noise"), classes.patterns), wanted);
    report["rows"]["reference_other_noise"] = {{"class_accuracy", acc.class_accuracy},
                                               {"strict_accuracy", acc.strict_accuracy}};
    score_condition(latents.at("reference_other_noise"), report["rows"]["reference_other_noise"]);
  }
  log_table(report, classes.present());
  if (!cfg.output.empty()) {
    fs::create_directories(cfg.output);
    write_safetensors((fs::path(cfg.output) / "latents.safetensors").string(), latents,
                      {{"producer", "wan-distill evaluate"}});
    std::ofstream((fs::path(cfg.output) / "report.json").string()) << report.dump(2) << "\n";
    spdlog::info("wrote {}", cfg.output);
  }
  return report;
}

}  // namespace wd::eval
