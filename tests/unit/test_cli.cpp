// The wan-distill executable end to end: forward on the golden inputs, init-teacher + inspect +
// forward, plan and plan --generate, and the exit codes and messages of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/safetensors.hpp"
#include "test_util.hpp"

namespace wd::test_cli {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = WD_FIXTURES;
const std::string kCli = WD_CLI;

test::CommandResult run(const std::string& args) { return test::run_command(kCli + " " + args); }

fs::path temp_dir(const std::string& name) {
  auto p = fs::temp_directory_path() / ("wd-cli-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p;
}

TEST(Cli, ForwardReproducesTheGoldenOutput) {
  const auto out = temp_dir("golden.safetensors").string();
  const auto r = run("forward --weights " + kFixtures + "/wan-tiny-a/weights.safetensors --inputs " +
                     kFixtures + "/wan-tiny-a/inputs.safetensors --output " + out + " --dtype fp32");
  ASSERT_EQ(r.code, 0) << r.output;
  auto got = SafetensorsFile::open(out).tensor("out");
  auto want = SafetensorsFile::open(kFixtures + "/wan-tiny-a/expected.safetensors").tensor("out");
  EXPECT_LE((got - want).abs().max().item<float>(), 2e-5);
  fs::remove(out);
}

TEST(Cli, ForwardWritesOneTensorPerSampleWhenShapesDiffer) {
  const auto out = temp_dir("b.safetensors").string();
  const auto r = run("forward --weights " + kFixtures + "/wan-tiny-b/weights.safetensors --inputs " +
                     kFixtures + "/wan-tiny-b/inputs.safetensors --output " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  auto got = SafetensorsFile::open(out);
  auto want = SafetensorsFile::open(kFixtures + "/wan-tiny-b/expected.safetensors");
  for (const char* k : {"out.0", "out.1"}) {
    EXPECT_LE((got.tensor(k) - want.tensor(k)).abs().max().item<float>(), 2e-5) << k;
  }
  fs::remove(out);
}

TEST(Cli, InitTeacherInspectForward) {
  const auto dir = temp_dir("tiny");
  auto r = run("init-teacher --preset tiny --output " + dir.string() + " --shard-size 1MB");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir / "diffusion_pytorch_model-00001-of-00002.safetensors"));

  r = run("inspect " + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("format:      native"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("BF16 x123"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("problems:    none"), std::string::npos) << r.output;

  const auto out = (dir / "out.safetensors").string();
  r = run("forward --weights " + dir.string() + " --latent 2,3,8,12 --output " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  auto o = SafetensorsFile::open(out).tensor("out");
  EXPECT_EQ(o.sizes(), (std::vector<std::int64_t>{2, 16, 3, 8, 12}));
  EXPECT_TRUE(torch::isfinite(o).all().item<bool>());

  // Nothing is lost by accident: an existing checkpoint is not overwritten.
  r = run("init-teacher --preset tiny --output " + dir.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--overwrite"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Cli, ConvertInspectForwardAndRefusals) {
  const auto dir = temp_dir("convert");
  const auto out = (dir / "bf16").string();
  const auto weights = kFixtures + "/wan-tiny-a/weights.safetensors";
  auto r = run("convert --input " + weights + " --output " + out + " --dtype bf16 --shard-size 20KB");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(out) / "diffusion_pytorch_model.safetensors.index.json"));

  r = run("inspect " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("format:      native"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("BF16 x54"), std::string::npos) << r.output;  // 69 - 15 fp32 islands
  EXPECT_NE(r.output.find("F32 x15"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("problems:    none"), std::string::npos) << r.output;

  const auto result = (dir / "out.safetensors").string();
  r = run("forward --weights " + out + " --inputs " + kFixtures + "/wan-tiny-a/inputs.safetensors --output " +
          result);
  ASSERT_EQ(r.code, 0) << r.output;
  auto got = SafetensorsFile::open(result).tensor("out");
  auto want = SafetensorsFile::open(kFixtures + "/wan-tiny-a/expected.safetensors").tensor("out");
  EXPECT_LE((got - want).norm().item<double>() / want.norm().item<double>(), 1e-2);

  // An existing output is kept unless --force; then it is replaced.
  r = run("convert --input " + weights + " --output " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  r = run("convert --input " + weights + " --output " + out + " --force --dtype fp16 --keep-fp32 false");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("inspect " + out);
  EXPECT_NE(r.output.find("dtypes:      F16 x69"), std::string::npos) << r.output;

  // Usage errors name every bad value at once; bad input is exit 3 and names the file.
  r = run("convert --input " + weights + " --output " + (dir / "x").string() +
          " --dtype fp8 --layout sideways --shard-size lots");
  EXPECT_EQ(r.code, 2) << r.output;
  for (const char* part : {"dtype(fp8)", "sideways", "shard-size"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  // The diffusers layout: its names and config.json, read back by inspect.
  r = run("convert --input " + weights + " --output " + (dir / "d").string() + " --layout diffusers");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("inspect " + (dir / "d").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("format:      diffusers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dim 64 ffn 128 heads 4 layers 2 in 16 out 16 text 32x8"), std::string::npos)
      << r.output;
  // A diffusers pipeline folder: model_index.json, the DiT in transformer/, read back whole by inspect.
  r = run("convert --input " + weights + " --output " + (dir / "p").string() + " --layout pipeline");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "p" / "model_index.json") && fs::exists(dir / "p" / "transformer" / "config.json"));
  r = run("inspect " + (dir / "p").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("path:        " + (dir / "p" / "transformer").string()), std::string::npos) << r.output;
  r = run("convert --input /nonexistent/ckpt --output " + (dir / "x").string());
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/ckpt"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "x"));
  r = run("convert --output " + (dir / "x").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("input"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Cli, BadInputGetsExitCodeAndNamesTheFile) {
  auto r = run("forward --weights /nonexistent/ckpt");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/ckpt"), std::string::npos) << r.output;

  const auto bad = temp_dir("bad.safetensors");
  { std::ofstream(bad) << "not a safetensors file at all"; }
  r = run("inspect " + bad.string() + " --model-config " + kFixtures + "/wan-tiny-a/config.json");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find(bad.string()), std::string::npos) << r.output;
  fs::remove(bad);

  r = run("forward --weights " + kFixtures + "/wan-tiny-a/weights.safetensors --inputs " + kFixtures +
          "/wan-tiny-a/config.json");
  EXPECT_EQ(r.code, 3) << r.output;
}

TEST(Cli, UsageErrorsAndHelp) {
  auto r = run("forward --dtype fp8 --weights x");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("dtype(fp8)"), std::string::npos) << r.output;
  r = run("frobnicate");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run("forward");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("weights"), std::string::npos) << r.output;
  for (const char* cmd : {"convert", "forward", "init-teacher", "inspect"}) {
    r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("usage: wan-distill " + std::string(cmd)), std::string::npos);
  }
  r = run("init-teacher --help");
  EXPECT_NE(r.output.find("--shard-size arg (=2GB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--dtype arg (=bf16)"), std::string::npos) << r.output;
  r = run("convert --help");
  EXPECT_NE(r.output.find("--shard-size arg (=5GB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("native (official Wan) |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("WanTransformer3DModel.from_pretrained(DIR) loads"), std::string::npos) << r.output;
  // generate: train's table (the cache's key among them), then its own three.
  r = run("generate --help");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("usage: mpirun -np N wan-distill generate --output DIR"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--data.teacher_cache arg"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--teacher.steps arg (=40)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--students arg (=1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--shard-positions arg (=64)"), std::string::npos) << r.output;
  r = run("generate --train.steps 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("generate needs --output DIR"), std::string::npos) << r.output;
  r = run("generate --output x --train.objective dmd");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.objective dmd and train.dmd_regression_weight(0): without the regression term"),
            std::string::npos)
      << r.output;
  r = run("plan --cpu --teacher.ranks 0 --data.teacher_cache x --train.objective trajectory");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("with data.teacher_cache(x) every rank is a student reading the cache"), std::string::npos)
      << r.output;
}

TEST(Cli, TinyIniIsTheBuiltinDefaultAndExampleConfigsParse) {
  const std::string configs = WD_CONFIGS;
  const auto defaults = run("train --print-config");
  ASSERT_EQ(defaults.code, 0) << defaults.output;
  EXPECT_NE(defaults.output.find("[teacher]\ncheckpoint = builtin:tiny"), std::string::npos)
      << defaults.output;
  const auto tiny = run("train --config " + configs + "/tiny.ini --print-config");
  ASSERT_EQ(tiny.code, 0) << tiny.output;
  EXPECT_EQ(tiny.output, defaults.output);  // configs/tiny.ini spells out the defaults
  for (const char* name : {"wan22-ti2v-5b.ini", "wan22-t2v-a14b.ini"}) {
    const auto r = run("train --config " + configs + "/" + name + " --print-config");
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("dtype = bf16"), std::string::npos) << r.output;
  }
  // What --print-config prints, --config reads back to the same values; flags still win.
  const auto file = temp_dir("printed.ini");
  { std::ofstream(file) << tiny.output; }
  const auto again = run("train --config " + file.string() + " --print-config --train.steps 7");
  EXPECT_NE(again.output.find("steps = 7"), std::string::npos) << again.output;
  fs::remove(file);
}

TEST(Cli, PlanPrintsEveryPlacementAndRecommendsOne) {
  const std::string configs = WD_CONFIGS;
  auto r = run("plan --help");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--gpu-memory arg (=180GiB)"), std::string::npos) << r.output;
  r = run("plan --config " + configs + "/wan22-ti2v-5b.ini --preset wan22-ti2v-5b --latent 48,31,44,80");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* p : {"placement gpu", "placement cpu", "placement stream", "placement shard",
                        "recommended: teacher.placement = gpu"}) {
    EXPECT_NE(r.output.find(p), std::string::npos) << p << "\n" << r.output;
  }
  // The example's checkpoint is not on this machine: the error says how to plan without it.
  r = run("plan --config " + configs + "/wan22-t2v-a14b.ini");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--preset NAME"), std::string::npos) << r.output;
  r = run("plan --gpu-memory lots");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("gpu-memory(lots)"), std::string::npos) << r.output;
}

TEST(Cli, PlanGeneratePrintsItsRanksTheCachesSizeAndItsTime) {
  // 2 streams of 1 held-out and 12 training messages, shards of 4: 8 shards on 2 ranks, the
  // busiest (shards 1, 3, 5, 7) writing 16 messages.
  const std::string keys = "plan --generate --cpu --np 2 --students 2 --shard-positions 4 --train.objective trajectory "
                           "--teacher.guidance 3 --teacher.steps 8 --student.steps 4 --train.steps 12 "
                           "--train.batch_size 2 --train.eval_samples 4 --teacher-gflops 10 --student-gflops 10";
  auto r = run(keys);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* p : {"generate: 2 rank(s) on one host (CPU job), each a whole teacher, no student; 2 stream(s) of 1 "
                        "held-out and 12 training messages of 2 sample(s), 8 shard(s) of up to 4",
                        "placement cpu: fits", "per generating rank", "cache on disk: 26 messages x ",
                        "time: ", "the busiest rank's 16 messages of 2 sample(s)", "(4 teacher forward(s) per sample",
                        "recommended: cpu (a CPU job)"}) {
    EXPECT_NE(r.output.find(p), std::string::npos) << p << "\n" << r.output;
  }
  EXPECT_EQ(r.output.find("student dev"), std::string::npos) << r.output;
  r = run(keys + " --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(j["generate"]["messages"], 26);
  EXPECT_EQ(j["generate"]["cache_bytes"].get<std::int64_t>(), 26 * j["generate"]["message_bytes"].get<std::int64_t>());
  EXPECT_GT(j["generate"]["seconds"].get<double>(), 0);
  EXPECT_EQ(j["recommended"], "cpu");
  // A train writing the same cache as it streams (data.teacher_cache_write): 2 student ranks
  // beside 1 teacher, the same 26 messages on disk.
  r = run("plan --cpu --np 3 --train.objective trajectory --teacher.guidance 3 --teacher.steps 8 --student.steps 4 "
          "--train.steps 12 --train.batch_size 2 --train.eval_samples 4 --data.teacher_cache_write c --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto w = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(w["teacher_cache_write"]["messages"], 26);
  EXPECT_EQ(w["teacher_cache_write"]["cache_bytes"], j["generate"]["cache_bytes"]);
  // The 2 students as one sequence-parallel group write one stream: 2 held-out and 12 messages.
  r = run("plan --cpu --np 3 --train.objective trajectory --teacher.guidance 3 --teacher.steps 8 --student.steps 4 "
          "--train.steps 12 --train.batch_size 2 --train.eval_samples 4 --data.teacher_cache_write c "
          "--student.sequence_parallel 2 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output.substr(r.output.find('{')))["teacher_cache_write"]["messages"], 14);
  // --keep all: rounds of whole trajectories, 1 held-out and 12 / 4 = 3 training ones a stream
  // (one shard each), every 8-step trajectory's 9 states in fp32, 8 · 2 forwards a trajectory.
  r = run(keys + " --keep all");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* p : {"2 stream(s) of 1 held-out and 3 training trajectory rounds of 2 sample(s), 4 shard(s) of up "
                        "to 4", "cache on disk: 8 trajectory rounds x ", "(each round's 9 states of 2 trajectories, fp32",
                        "the busiest rank's 6 trajectory rounds of 2 sample(s)", "(16 teacher forward(s) per sample"}) {
    EXPECT_NE(r.output.find(p), std::string::npos) << p << "\n" << r.output;
  }
  r = run(keys + " --keep all --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto k = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(k["generate"]["keep"], 8);
  EXPECT_EQ(k["generate"]["messages"], 8);
  const auto round_bytes = k["generate"]["message_bytes"].get<std::int64_t>();
  EXPECT_EQ(round_bytes % (9 * 2 * 4), 0);
  EXPECT_EQ(k["generate"]["cache_bytes"].get<std::int64_t>(), 8 * round_bytes);
  r = run(keys + " --keep 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("generate --keep(3) must be all or a number of intervals K that divides teacher.steps(8)"),
            std::string::npos)
      << r.output;
  r = run("plan --cpu --students 2");  // generate's option without --generate
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("are generate's: plan them with --generate"), std::string::npos) << r.output;
  // What generate refuses, plan --generate refuses alike.
  r = run("plan --generate --cpu --train.objective dmd");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.objective dmd and train.dmd_regression_weight(0): without the regression term"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace wd::test_cli
