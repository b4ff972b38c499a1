// `wan-distill sample` on the tiny job: a trained student's final latents are closer to the
// teacher's than the untrained student's, and a student whose output head is zeroed is flagged
// as collapsed; train.sample_every's probes in the log and metrics.jsonl.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <utility>
#include <nlohmann/json.hpp>

#include "launch_util.hpp"
#include "model/safetensors.hpp"

namespace wd::test_sample_launch {
namespace {

namespace fs = std::filesystem;

struct SampleRun {
  int code = -1;
  std::string output;
  nlohmann::json report;
};

/// stdout and stderr of `wan-distill <args>`, and its exit code.
std::pair<int, std::string> cli(const std::string& args) {
  const auto r = test::run_captured(std::string(WD_CLI) + " " + args + " 2>&1");
  return {r.code, r.output};
}

/// Runs `wan-distill sample` with the tiny job's teacher and data on samples 0-3, on the host with
/// one thread whatever the machine (as launch_train pins its jobs).
SampleRun sample(const fs::path& run, const fs::path& student, const fs::path& out) {
  const std::string args = "sample --teacher.checkpoint " + (run / "cache" / "tiny-teacher").string() +
                          " --data.path " + (run / "cache" / "tiny-data.h5").string() + " --samples 0,1,2,3" +
                          " --student " + student.string() + " --output " + out.string() +
                          " --runtime.threads 1 --device cpu";
  SampleRun r;
  std::tie(r.code, r.output) = cli(args);
  std::ifstream in(out / "report.json");
  if (in) r.report = nlohmann::json::parse(in);
  return r;
}

/// A copy of `student` whose output head (head.head.weight and .bias) is zero: its velocity is
/// zero everywhere, so sampling leaves the noise where it was.
fs::path zero_head_copy(const fs::path& student, const fs::path& dir) {
  fs::copy(student, dir, fs::copy_options::recursive);
  const auto file = dir / "diffusion_pytorch_model.safetensors";
  TensorMap tensors;
  {
    const auto f = SafetensorsFile::open(file.string());
    for (const auto& info : f.tensors()) tensors[info.name] = f.tensor(info.name).clone();
  }
  int zeroed = 0;
  for (auto& [name, t] : tensors) {
    if (name.rfind("head.head.", 0) == 0) {
      t.zero_();
      ++zeroed;
    }
  }
  EXPECT_EQ(zeroed, 2);
  write_safetensors(file.string(), tensors, {{"format", "pt"}});
  return dir;
}

TEST(SampleLaunch, HelpShowsTheDefaultsAndBadValuesAreRefused) {
  const auto [code, help] = cli("sample --help");
  EXPECT_EQ(code, 0) << help;
  for (const char* option : {"--teacher.checkpoint", "--student", "--steps", "--shift", "--solver", "--guidance",
                             "--negative", "--collapse-ratio", "--trajectory", "--samples"}) {
    EXPECT_NE(help.find(option), std::string::npos) << option << "\n" << help;
  }
  EXPECT_NE(help.find("unipc"), std::string::npos) << help;
  // A name outside a closed choice stops the parse; values are checked together after it.
  auto [bad, message] = cli("sample --teacher.checkpoint x --solver heun");
  EXPECT_EQ(bad, 2) << message;
  EXPECT_NE(message.find("solver(heun) must be one of euler, unipc"), std::string::npos) << message;
  std::tie(bad, message) = cli("sample --teacher.checkpoint x --steps 0 --shift 0");
  EXPECT_EQ(bad, 2) << message;
  EXPECT_NE(message.find("steps(0)"), std::string::npos) << message;
  EXPECT_NE(message.find("shift(0)"), std::string::npos) << message;
}

TEST(SampleLaunch, AClassesDataSetScoresEachModelsSamplesByClass) {
  const auto dir = test::fresh_dir("sample-classes");
  fs::create_directories(dir);
  const auto data = (dir / "classes.h5").string();
  auto [code, out] = cli("make-dataset --output " + data +
                         " --kind classes --classes 3 --samples 12 --latent 16,1,8,8 --text-len 4 --text-dim 64");
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) = cli("init-teacher --output " + (dir / "teacher").string());
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) = cli("sample --teacher.checkpoint " + (dir / "teacher").string() + " --data.path " + data +
                            " --samples 0-5,9 --steps 3 --guidance 2 --output " + (dir / "out").string() +
                            " --runtime.threads 1 --device cpu");
  ASSERT_EQ(code, 0) << out;
  const auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_EQ(report["samples"], nlohmann::json({0, 1, 2, 3, 4, 5, 9}));
  // A random teacher draws no class: whatever it scores, the fields are there and in range.
  const auto acc = report["teacher"]["class_accuracy"].get<double>();
  const auto strict = report["teacher"]["strict_accuracy"].get<double>();
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 1.0);
  EXPECT_LE(strict, acc);
  EXPECT_NE(out.find("teacher: class accuracy"), std::string::npos) << out;
  std::tie(code, out) = cli("sample --teacher.checkpoint " + (dir / "teacher").string() + " --data.path " + data +
                            " --samples 5-3 --steps 1");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("samples(5-3): range '5-3' runs backwards"), std::string::npos) << out;
}

// `evaluate` with the teacher as its own "student" at the reference's settings: every row is
// wired to the model, steps, solver and guidance it names, so the student row equals the
// reference exactly, teacher_at_k (Euler at k) equals it when the reference is Euler at k too,
// the reference's Fréchet distance is the floor, and the class scores and the report are there.
TEST(EvaluateLaunch, EachRowSamplesWhatItNamesAndTheReportHasEveryMeasure) {
  const auto dir = test::fresh_dir("evaluate");
  fs::create_directories(dir);
  const auto data = (dir / "classes.h5").string();
  auto [code, out] = cli("make-dataset --output " + data +
                         " --kind classes --classes 3 --samples 14 --latent 16,1,8,8 --text-len 4 --text-dim 64");
  ASSERT_EQ(code, 0) << out;
  const auto teacher = (dir / "teacher").string();
  std::tie(code, out) = cli("init-teacher --output " + teacher);
  ASSERT_EQ(code, 0) << out;
  const std::string common = "evaluate --teacher.checkpoint " + teacher + " --student " + teacher + " --data.path " +
                             data + " --count 6 --teacher.guidance 2 --teacher.shift 3 --batch 4 --runtime.threads 1";
  std::tie(code, out) = cli(common + " --teacher.steps 3 --teacher.solver euler --student.steps 3 --student.guidance 2"
                                     " --output " + (dir / "out").string());
  ASSERT_EQ(code, 0) << out;
  const auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_EQ(report["samples"], nlohmann::json({8, 9, 10, 11, 12, 13}));  // the last 6: held out
  const auto& rows = report["rows"];
  for (const char* row : {"reference", "teacher_unguided", "teacher_at_k", "student"}) {
    ASSERT_TRUE(rows.contains(row)) << row << "\n" << report.dump(2);
    for (const char* key : {"paired_rel_mse", "paired_rel_mse_median", "frechet", "class_accuracy", "strict_accuracy",
                            "collapsed"}) {
      EXPECT_TRUE(rows[row].contains(key)) << row << "." << key;
    }
  }
  EXPECT_EQ(rows["student"]["paired_rel_mse"].get<double>(), 0.0);
  EXPECT_EQ(rows["teacher_at_k"]["paired_rel_mse"].get<double>(), 0.0);
  EXPECT_GT(rows["teacher_unguided"]["paired_rel_mse"].get<double>(), 1e-4);  // guidance changes the path
  EXPECT_DOUBLE_EQ(rows["reference"]["frechet"].get<double>(), report["frechet_floor"].get<double>());
  EXPECT_GT(report["frechet_floor"].get<double>(), 0.0);  // other noise, other samples
  EXPECT_TRUE(rows.contains("reference_other_noise"));
  const auto latents = SafetensorsFile::open((dir / "out" / "latents.safetensors").string());
  EXPECT_EQ(latents.tensor("student").size(0), 6);
  // --reuse takes the teacher rows of that run: the same report; with other settings, refused.
  std::tie(code, out) = cli(common + " --teacher.steps 3 --teacher.solver euler --student.steps 3 --student.guidance 2"
                                     " --reuse " + (dir / "out").string() + " --output " + (dir / "again").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("reuse: the teacher rows of"), std::string::npos) << out;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir / "again" / "report.json"))["rows"], rows);
  std::tie(code, out) = cli(common + " --teacher.steps 4 --teacher.solver euler --student.steps 3 --reuse " + (dir / "out").string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("its teacher_steps is 3, this evaluation's is 4; the teacher rows must be sampled alike"), std::string::npos) << out;
  // A student at fewer steps than the reference is no longer the reference.
  std::tie(code, out) = cli(common + " --teacher.steps 4 --student.steps 2 --output " + (dir / "k2").string());
  ASSERT_EQ(code, 0) << out;
  const auto k2 = nlohmann::json::parse(std::ifstream(dir / "k2" / "report.json"));
  EXPECT_GT(k2["rows"]["teacher_at_k"]["paired_rel_mse"].get<double>(), 1e-4);
  std::tie(code, out) = cli("evaluate --teacher.checkpoint " + teacher + " --data.path " + data + " --count 1 --batch 0");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("count(1) must be >= 2"), std::string::npos) << out;
  EXPECT_NE(out.find("batch(0) must be >= 1"), std::string::npos) << out;
}

// Image-conditioned sampling: a ti2v teacher's image mode keeps each sample's image as its first
// frame in every row (first_frame_rel_mse exactly 0); an i2v teacher takes y at every forward,
// its rows scored against the image too; both get condition_accuracy on a classes data set.
TEST(EvaluateLaunch, ImageConditionedRowsAreScoredOnHowTheyContinueTheirImage) {
  const auto dir = test::fresh_dir("evaluate-conditioned");
  fs::create_directories(dir);
  for (const std::string kind : {"ti2v", "i2v"}) {
    const auto data = (dir / (kind + ".h5")).string();
    auto [code, out] = cli("make-dataset --output " + data + " --kind classes --classes 3 --samples 10 --latent "
                           "16,3,8,8 --text-len 4 --text-dim 64 --image-condition " + kind);
    ASSERT_EQ(code, 0) << out;
    const auto teacher = (dir / (kind + "-teacher")).string();
    std::tie(code, out) = cli("init-teacher --model-type " + kind + (kind == "i2v" ? " --in-dim 36 --out-dim 16" : "") +
                              " --output " + teacher);
    ASSERT_EQ(code, 0) << out;
    std::tie(code, out) = cli("evaluate --teacher.checkpoint " + teacher + " --student " + teacher + " --data.path " +
                              data + " --count 4 --teacher.steps 3 --teacher.solver euler --student.steps 3"
                              " --teacher.guidance 2 --student.guidance 2 --batch 2 --runtime.threads 1 --output " +
                              (dir / kind).string());
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("cond %"), std::string::npos) << out;
    const auto report = nlohmann::json::parse(std::ifstream(dir / kind / "report.json"));
    for (const char* row : {"reference", "reference_other_noise", "teacher_unguided", "teacher_at_k", "student"}) {
      const auto& r = report["rows"][row];
      ASSERT_TRUE(r.contains("condition_accuracy") && r.contains("first_frame_rel_mse")) << kind << " " << row;
      EXPECT_GE(r["condition_accuracy"].get<double>(), 0.0);
      EXPECT_LE(r["condition_accuracy"].get<double>(), 1.0);
      if (kind == "ti2v") {
        EXPECT_EQ(r["first_frame_rel_mse"].get<double>(), 0.0) << row;
      } else {  // a random i2v teacher does not reproduce its image
        EXPECT_GT(r["first_frame_rel_mse"].get<double>(), 0.0) << row;
      }
    }
    EXPECT_EQ(report["rows"]["student"]["paired_rel_mse"].get<double>(), 0.0) << kind;
    // `sample` of the first two held-out samples, 2 UniPC steps: a ti2v teacher's first frames
    // are the images the evaluation's rows kept, whatever their steps and guidance.
    std::tie(code, out) = cli("sample --teacher.checkpoint " + teacher + " --data.path " + data +
                              " --samples 6,7 --steps 2 --output " + (dir / (kind + "-sample")).string() +
                              " --runtime.threads 1 --device cpu");
    ASSERT_EQ(code, 0) << out;
    // The shift left unset: a ti2v model is shaped as TI2V-5B and samples at its official 5; one
    // i2v model is no official shape (I2V-A14B is a pair) and keeps sample's own 12.
    const auto sample_report = nlohmann::json::parse(std::ifstream(dir / (kind + "-sample") / "report.json"));
    EXPECT_EQ(sample_report["shift"].get<double>(), kind == "ti2v" ? 5.0 : 12.0) << kind;
    EXPECT_NE(out.find(kind == "ti2v" ? "sample: shift 5 (unset: the official TI2V-5B (model_type ti2v, one model) "
                                        "sampler's)"
                                      : "sample: shift 12 (unset: sample's own defaults; the teacher (model_type i2v, 1 "
                                        "expert(s)) is none of Wan 2.2's official models)"),
              std::string::npos)
        << out;
    const auto sampled = SafetensorsFile::open((dir / (kind + "-sample") / "latents.safetensors").string());
    const auto rows = SafetensorsFile::open((dir / kind / "latents.safetensors").string());
    const auto first = [](const torch::Tensor& x) { return x.narrow(0, 0, 2).narrow(2, 0, 1); };
    const auto reference = rows.tensor("reference");
    EXPECT_EQ(torch::equal(first(sampled.tensor("teacher")), first(reference)), kind == "ti2v") << kind;
    EXPECT_EQ(torch::equal(first(rows.tensor("teacher_unguided")), first(reference)), kind == "ti2v") << kind;
    EXPECT_FALSE(torch::equal(rows.tensor("teacher_unguided").narrow(2, 1, 2), reference.narrow(2, 1, 2))) << kind;
    // No data set: an i2v teacher has no image to sample from.
    if (kind == "i2v") {
      std::tie(code, out) = cli("sample --teacher.checkpoint " + teacher + " --steps 1 --runtime.threads 1");
      EXPECT_NE(code, 0) << out;
      EXPECT_NE(out.find("the teacher (model_type i2v) samples from an image: give --data.path"), std::string::npos)
          << out;
    }
  }
}

/// The `teacher` tensor of a sample run's latents.safetensors.
torch::Tensor teacher_latents(const fs::path& out) {
  return SafetensorsFile::open((out / "latents.safetensors").string()).tensor("teacher").clone();
}

TEST(SampleLaunch, GuidanceWithATwoExpertTeacher) {
  const auto dir = test::fresh_dir("sample-cfg");
  const auto teacher = dir / "a14b";
  const auto [init_code, init_out] =
      cli("init-teacher --preset tiny --experts 2 --dtype fp32 --output " + teacher.string());
  ASSERT_EQ(init_code, 0) << init_out;
  const auto run = [&](const std::string& guidance) {
    const auto out = dir / ("g" + guidance);
    const auto [code, output] = cli("sample --teacher.checkpoint " + teacher.string() + " --teacher.boundary 0.9" +
                                    " --count 2 --latent 2,4,4 --steps 8 --guidance " + guidance + " --output " +
                                    out.string());
    EXPECT_EQ(code, 0) << output;
    return teacher_latents(out);
  };
  const auto plain = run("1"), batched = run("1.000001"), guided = run("4");
  // g = 1 skips the negative half; a g just above 1 runs [cond; uncond] as one batch and must
  // give the same trajectory up to g's own difference.
  const double scale = plain.abs().max().item<double>();
  EXPECT_LT((batched - plain).abs().max().item<double>(), 1e-4 * scale);
  EXPECT_GT((guided - plain).abs().max().item<double>(), 1e-2 * scale);
  fs::remove_all(dir);
}

// `sample` and `evaluate` take train's teacher placements: a teacher whose blocks stay mapped on
// the host and are copied ahead of use (stream; on this host the copies go host to host) samples
// exactly what the same teacher computing on the host does, two experts and guidance included;
// gpu without a CUDA device and train-only placements are refused before anything loads.
TEST(SampleLaunch, AStreamedTeacherSamplesWhatTheHostTeacherDoes) {
  const auto dir = test::fresh_dir("sample-stream");
  fs::create_directories(dir);
  const auto teacher = (dir / "a14b").string();
  auto [code, out] = cli("init-teacher --preset tiny --experts 2 --output " + teacher);  // bf16, as shipped
  ASSERT_EQ(code, 0) << out;
  const auto run = [&](const std::string& placement) {
    const auto to = dir / placement;
    const auto [rc, output] = cli("sample --teacher.checkpoint " + teacher + " --teacher.boundary 0.9 --count 3" +
                                  " --latent 2,4,4 --steps 6 --guidance 3 --runtime.threads 1 --teacher.placement " +
                                  placement + " --teacher.stream_ahead 1 --output " + to.string());
    EXPECT_EQ(rc, 0) << output;
    EXPECT_NE(output.find("placement " + (placement == "auto" ? std::string("cpu") : placement)), std::string::npos)
        << output;
    if (placement == "stream") {
      // Both experts from their arena (one rank: each its own segment, filled here).
      EXPECT_NE(output.find("stream: blocks 0-3 from the host arena /wd-"), std::string::npos) << output;
      EXPECT_NE(output.find("-expert1 of "), std::string::npos) << output;
    }
    return teacher_latents(to);
  };
  const auto host = run("cpu"), streamed = run("stream");
  EXPECT_TRUE(torch::equal(host, streamed)) << (host - streamed).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(host, run("auto")));  // auto on a CPU device: cpu

  // evaluate: the same rows whichever placement, the teacher checkpoint as its own student.
  const auto data = (dir / "classes.h5").string();
  std::tie(code, out) = cli("make-dataset --output " + data +
                            " --kind classes --classes 2 --samples 6 --latent 16,1,4,4 --text-len 4 --text-dim 64");
  ASSERT_EQ(code, 0) << out;
  const auto single = (dir / "teacher").string();
  std::tie(code, out) = cli("init-teacher --output " + single);
  ASSERT_EQ(code, 0) << out;
  const auto evaluate = [&](const std::string& placement) {
    const auto to = dir / ("eval-" + placement);
    const auto [rc, output] = cli("evaluate --teacher.checkpoint " + single + " --data.path " + data +
                                  " --count 4 --teacher.steps 4 --student.steps 2 --teacher.guidance 2 --batch 3"
                                  " --runtime.threads 1 --teacher.placement " + placement + " --output " + to.string());
    EXPECT_EQ(rc, 0) << output;
    return SafetensorsFile::open((to / "latents.safetensors").string());
  };
  const auto a = evaluate("cpu"), b = evaluate("stream");
  for (const char* row : {"reference", "reference_other_noise", "teacher_unguided", "teacher_at_k"}) {
    EXPECT_TRUE(torch::equal(a.tensor(row), b.tensor(row))) << row;
  }

  std::tie(code, out) = cli("sample --teacher.checkpoint " + teacher + " --teacher.placement gpu --device cpu");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("teacher.placement(gpu) needs a CUDA --device (device is cpu)"), std::string::npos) << out;
  // Train's placements that split or share the teacher are not sampling's: refused at parse.
  std::tie(code, out) = cli("evaluate --teacher.checkpoint " + single + " --data.path " + data +
                            " --teacher.placement shard");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("teacher.placement(shard) must be one of auto, gpu, cpu, stream"), std::string::npos) << out;
  std::tie(code, out) = cli("evaluate --teacher.checkpoint " + single + " --data.path " + data +
                            " --teacher.stream_ahead 0");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("teacher.stream_ahead(0) must be >= 1"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(SampleLaunch, TrainingLowersTheErrorAndAZeroHeadIsFlagged) {
  const auto dir = test::fresh_dir("sample");
  const auto trained = dir / "trained", untrained = dir / "untrained";
  // The tiny job with its builtin defaults, shortened, with a sampling probe every 50 steps.
  const auto t = test::launch_train(3, "--run-dir " + trained.string() + " --train.steps 150 --train.sample_every 50");
  ASSERT_EQ(t.code, 0) << t.output;
  std::vector<std::int64_t> probed;
  for (const auto& line : test::read_metrics(trained / "metrics.jsonl")) {
    if (!line.contains("sample_step")) continue;
    probed.push_back(line.at("sample_step"));
    EXPECT_FALSE(line.at("collapsed").get<bool>()) << line.dump();
    EXPECT_GT(line.at("moved_std_ratio").get<double>(), 0.1) << line.dump();
  }
  EXPECT_EQ(probed, (std::vector<std::int64_t>{50, 100, 150}));
  EXPECT_EQ(test::count_of(t.output, "sample probe at step"), 3) << t.output;
  // The untrained student: the same job (same seed, so the same initial weights), one step
  // at a learning rate that leaves every weight where it started.
  const auto u = test::launch_train(3, "--run-dir " + untrained.string() + " --teacher.checkpoint " +
                                           (trained / "cache" / "tiny-teacher").string() + " --data.path " +
                                           (trained / "cache" / "tiny-data.h5").string() +
                                           " --train.steps 1 --train.lr 1e-20 --train.min_lr 0");
  ASSERT_EQ(u.code, 0) << u.output;

  const auto after = sample(trained, trained / "student", dir / "after");
  const auto before = sample(trained, untrained / "student", dir / "before");
  ASSERT_EQ(after.code, 0) << after.output;
  ASSERT_EQ(before.code, 0) << before.output;
  const double err_after = after.report.at("rel_mse_final"), err_before = before.report.at("rel_mse_final");
  std::printf("final relative MSE to the teacher: trained %.4f, untrained %.4f\n", err_after, err_before);
  EXPECT_LT(err_after, 0.5 * err_before) << "trained " << err_after << ", untrained " << err_before;
  EXPECT_EQ(after.report.at("rel_mse_per_step").size(), 40u);
  EXPECT_FALSE(after.report.at("collapse").at("collapsed").get<bool>()) << after.output;
  EXPECT_TRUE(fs::exists(dir / "after" / "latents.safetensors"));

  const auto collapsed = sample(trained, zero_head_copy(trained / "student", dir / "collapsed"), dir / "zero");
  ASSERT_EQ(collapsed.code, 0) << collapsed.output;
  EXPECT_TRUE(collapsed.report.at("collapse").at("collapsed").get<bool>()) << collapsed.output;
  // Every channel stays at the noise: nothing was added to it.
  EXPECT_EQ(collapsed.report.at("collapse").at("static_channels").size(), 16u) << collapsed.output;
  EXPECT_NE(collapsed.output.find("COLLAPSED STUDENT"), std::string::npos) << collapsed.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wd::test_sample_launch
