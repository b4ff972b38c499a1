// train.objective launched for real under mpirun: `flow` trains a DiT on the data alone (no
// teacher ranks), its held-out error falls, its result loads as a teacher, and a resumed run is
// bit-identical to a straight one; `guided` trains on the guided target from a teacher rank and
// from colocated teachers alike, and resumes exactly; `trajectory` trains from a teacher rank and
// from colocated teachers, and a run resumed mid-round is bit-identical to a straight one; `dmd`
// answers its students' real-score requests from a teacher rank as colocated teachers do, on
// 2, 3 and 4 ranks, and resumes bit-exactly from inside a cycle.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch_util.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"

namespace wd::test_objectives_launch {
namespace {

namespace fs = std::filesystem;

const fs::path& root() {
  static const fs::path dir = test::fresh_dir("objectives");
  return dir;
}

/// Flow-matching on the builtin data set: 3 ranks, all students, no teacher.
const std::string kFlow = " --train.objective flow --teacher.ranks 0 --train.cond_dropout 0.1 --train.log_every 1"
                          " --student.dim 64 --student.num_layers 2";

using test::losses;

TEST(Flow, TrainsWithoutATeacherAndItsResultLoadsAsOne) {
  const auto dir = root() / "flow";
  const auto r = test::launch_train(3, "--run-dir " + dir.string() + kFlow + " --train.steps 40 --train.eval_every 40 --train.eval_samples 6");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.objective flow: 3 student rank(s)"), std::string::npos) << r.output;
  EXPECT_EQ(test::count_of(r.output, " teacher]"), 0) << "a rank logged as a teacher:\n" << r.output;
  double before = -1, after = -1;
  for (const auto& m : test::read_metrics(dir / "metrics.jsonl")) {
    if (m.contains("rel_mse_before")) {
      before = m["rel_mse_before"].get<double>();
      after = m["rel_mse"].get<double>();
    }
  }
  ASSERT_GT(before, 0) << r.output;
  EXPECT_LT(after, 0.8 * before) << "the held-out flow error barely fell: " << before << " -> " << after;
  EXPECT_FALSE(fs::exists(dir / "cache" / "tiny-teacher")) << "no teacher is made for flow";
  // The trained model is the teacher of a distillation run.
  const auto d = test::launch_train(3, "--run-dir " + (root() / "distil").string() + " --teacher.checkpoint " +
                                           (dir / "student").string() + " --data.path " +
                                           (dir / "cache" / "tiny-data.h5").string() + " --train.steps 2");
  EXPECT_EQ(d.code, 0) << d.output;
}

TEST(Flow, AResumedRunIsBitIdenticalToAStraightOne) {
  const auto straight = root() / "straight";
  auto r = test::launch_train(2, "--run-dir " + straight.string() + kFlow + " --train.steps 8 --checkpoint.every 4");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto resumed = root() / "resumed";
  r = test::launch_train(2, "--run-dir " + resumed.string() + kFlow + " --train.steps 8 --data.path " +
                                (straight / "cache" / "tiny-data.h5").string() + " --resume " +
                                (straight / "checkpoints" / "step-00000004").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 8, 4);
}

// The bench's conditioned teachers: student.model_type i2v (y from /condition) and ti2v (its
// image mode), trained on the builtin data with images; each is then the teacher of a
// distillation run on its data.
TEST(Flow, AnImageConditionedModelTrainsFromTheDataSetsImagesAndTeaches) {
  for (const std::string kind : {"i2v", "ti2v"}) {
    const auto dir = root() / ("flow-" + kind);
    auto r = test::launch_train(2, "--run-dir " + dir.string() + kFlow + " --train.steps 4 --student.model_type " + kind);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto config = nlohmann::json::parse(std::ifstream(dir / "student" / "config.json"));
    EXPECT_EQ(config.at("model_type"), kind);
    EXPECT_EQ(config.at("in_dim"), kind == "i2v" ? 36 : 16);
    r = test::launch_train(3, "--run-dir " + (root() / ("distil-" + kind)).string() + " --teacher.checkpoint " +
                                  (dir / "student").string() + " --data.path " +
                                  (dir / "cache" / "tiny-data.h5").string() + " --train.steps 2");
    EXPECT_EQ(r.code, 0) << r.output;
  }
  // A distilled student takes its teacher's type.
  const auto r = test::launch_train(3, "--run-dir " + (root() / "typed-student").string() +
                                           " --train.steps 2 --student.model_type i2v");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("student.model_type(i2v) sets the type of a student trained without a teacher"),
            std::string::npos)
      << r.output;
}

// train.ema_decay: the run's student/ is the weight average (the checkpoint's ema.safetensors),
// not the trained weights, and a resumed run averages exactly as the straight one did.
TEST(Ema, TheStudentIsTheAverageAndAResumedRunAveragesExactly) {
  const auto straight = root() / "ema-straight", resumed = root() / "ema-resumed";
  const std::string ema = kFlow + " --train.steps 8 --train.ema_decay 0.8";
  auto r = test::launch_train(2, "--run-dir " + straight.string() + ema + " --checkpoint.every 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("student (its weight average, train.ema_decay) saved to"), std::string::npos) << r.output;
  r = test::launch_train(2, "--run-dir " + resumed.string() + ema + " --data.path " +
                                (straight / "cache" / "tiny-data.h5").string() + " --resume " +
                                (straight / "checkpoints" / "step-00000004").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 8, 4);
  const auto open = [](const fs::path& file) { return SafetensorsFile::open(file.string()); };
  const auto last = straight / "checkpoints" / "step-00000008";
  const auto average = open(last / "ema.safetensors"), trained = open(last / "trainable.safetensors");
  const auto a = open(straight / "student" / "diffusion_pytorch_model.safetensors");
  const auto b = open(resumed / "student" / "diffusion_pytorch_model.safetensors");
  const auto in_checkpoint = open(last / "student" / "diffusion_pytorch_model.safetensors");
  ASSERT_FALSE(a.tensors().empty());
  int differ = 0;
  for (const auto& info : a.tensors()) {
    const auto t = a.tensor(info.name, torch::kFloat);
    EXPECT_TRUE(torch::equal(t, b.tensor(info.name, torch::kFloat))) << info.name;
    EXPECT_TRUE(torch::equal(t, in_checkpoint.tensor(info.name, torch::kFloat))) << info.name;
    ASSERT_TRUE(average.contains(info.name)) << info.name;
    EXPECT_TRUE(torch::equal(t, average.tensor(info.name, torch::kFloat))) << info.name;
    differ += torch::equal(t, trained.tensor(info.name, torch::kFloat)) ? 0 : 1;
  }
  EXPECT_GT(differ, 0);  // the average is not the last step's weights
}

/// The builtin teacher and data set, made once by a first short run.
std::string builtin_assets() {
  static const std::string args = [] {
    const auto dir = root() / "assets";
    const auto r = test::launch_train(3, "--run-dir " + dir.string() + " --train.steps 1 --log.level warn");
    EXPECT_EQ(r.code, 0) << r.output;
    return " --teacher.checkpoint " + (dir / "cache" / "tiny-teacher").string() + " --data.path " +
           (dir / "cache" / "tiny-data.h5").string();
  }();
  return args;
}

// The teacher in fp32 (as the placement tests), so both layouts compute the same target.
const std::string kGuided = " --train.objective guided --teacher.guidance 4 --teacher.compute fp32 --train.steps 12"
                            " --train.log_every 1 --train.seed 5";

TEST(Guided, ATeacherRankAndColocatedTeachersTrainAlike) {
  const auto dedicated = root() / "guided-dedicated", colocated = root() / "guided-colocated";
  auto r = test::launch_train(3, "--run-dir " + dedicated.string() + builtin_assets() + kGuided);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.objective guided: the teacher's velocity is v_neg + 4*(v_cond - v_neg)"), std::string::npos)
      << r.output;
  r = test::launch_train(2, "--run-dir " + colocated.string() + builtin_assets() + kGuided +
                                " --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  // Each colocated rank computes 2 samples (4 forwards) where the teacher rank computes 4 (8):
  // the BLAS may sum in another order, so 1e-6 relative, as the placement tests.
  test::expect_close_losses(dedicated, colocated, 12);
  // The guided target is not the plain one: the same job with velocity trains differently.
  r = test::launch_train(3, "--run-dir " + (root() / "velocity").string() + builtin_assets() +
                                " --teacher.compute fp32 --train.steps 12 --train.log_every 1 --train.seed 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(losses(root() / "velocity"), losses(dedicated));
}

TEST(Guided, AResumedRunIsBitIdenticalToAStraightOne) {
  const auto straight = root() / "guided-straight", resumed = root() / "guided-resumed";
  auto r = test::launch_train(3, "--run-dir " + straight.string() + builtin_assets() + kGuided + " --checkpoint.every 6");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(3, "--run-dir " + resumed.string() + builtin_assets() + kGuided + " --resume " +
                                (straight / "checkpoints" / "step-00000006").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 12, 6);
}

/// A tiny teacher of model type `kind` made by `init-teacher ... init_args` in ASSETS/kind-assets,
/// and its builtin data set, which holds each sample's image (/condition), made by a first short
/// run: the --teacher.checkpoint and --data.path arguments of a job on them.
std::string conditioned_assets(const std::string& kind, const std::string& init_args) {
  const auto dir = root() / (kind + "-assets");
  const auto teacher = (dir / "teacher").string();
  const auto made = test::run_captured(std::string(WD_CLI) + " init-teacher --preset tiny --model-type " + kind + " " +
                                       init_args + " --dtype bf16 --seed 4 --output " + teacher + " 2>&1");
  EXPECT_EQ(made.code, 0) << made.output;
  const auto r = test::launch_train(3, "--run-dir " + dir.string() + " --teacher.checkpoint " + teacher +
                                           " --train.steps 1 --log.level warn");
  EXPECT_EQ(r.code, 0) << r.output;
  return " --teacher.checkpoint " + teacher + " --data.path " + (dir / "cache" / "tiny-data.h5").string();
}

/// A tiny i2v teacher (in_dim 36 = 16 noisy + 4 mask + 16 image latent channels) and its data, made once.
std::string i2v_assets() {
  static const std::string args = conditioned_assets("i2v", "--in-dim 36 --out-dim 16");
  return args;
}

TEST(I2v, ATeacherWithImageConditionsTeachesVelocityAndGuidedStudentsOnEveryPath) {
  const std::string steps = " --teacher.compute fp32 --train.steps 12 --train.log_every 1 --train.seed 5";
  const auto dedicated = root() / "i2v-velocity", colocated = root() / "i2v-velocity-colocated";
  auto r = test::launch_train(3, "--run-dir " + dedicated.string() + i2v_assets() + steps);
  ASSERT_EQ(r.code, 0) << r.output;
  // The image condition goes with every message: y beside x_t, the same in the colocated job.
  r = test::launch_train(2, "--run-dir " + colocated.string() + i2v_assets() + steps + " --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_close_losses(dedicated, colocated, 12);
  // Pipeline stages: the first embeds [x_t; y], y travels on with the hidden state to the last,
  // which sends it to the students.
  const auto shard = root() / "i2v-velocity-shard";
  r = test::launch_train(4, "--run-dir " + shard.string() + i2v_assets() + steps +
                                " --teacher.placement shard --teacher.ranks 2 --log.level info");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("teacher stage 2/2 of replica 0"), std::string::npos) << r.output;
  test::expect_close_losses(dedicated, shard, 12);
  const auto student = nlohmann::json::parse(std::ifstream(dedicated / "student" / "config.json"));
  EXPECT_EQ(student.at("model_type"), "i2v");
  EXPECT_EQ(student.at("in_dim"), 36);
  // Guided: the negative forward takes the image too; in teacher micro-batches of 1 as well.
  r = test::launch_train(3, "--run-dir " + (root() / "i2v-guided").string() + i2v_assets() + steps +
                                " --train.objective guided --teacher.guidance 4 --teacher.micro_batch 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(losses(root() / "i2v-guided"), losses(dedicated));
}

TEST(I2v, ATeacherWithImageConditionsTeachesAFewStepStudentItsConditionedTrajectories) {
  // The teacher samples each path with its sample's image (y at every forward); the student
  // learns the jumps with y, rolls out with it, and the sampling probe samples with it.
  const std::string trajectory = " --train.objective trajectory --teacher.steps 4 --student.steps 2 --teacher.shift 3"
                                 " --teacher.compute fp32 --train.steps 6 --train.log_every 1 --train.seed 5"
                                 " --train.eval_samples 4";
  const auto dedicated = root() / "i2v-trajectory", colocated = root() / "i2v-trajectory-colocated";
  auto r = test::launch_train(3, "--run-dir " + dedicated.string() + i2v_assets() + trajectory +
                                     " --train.trajectory_rollout 0.5 --train.sample_every 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("sample probe"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(per interval: "), std::string::npos) << r.output;
  // Colocated, each student samples its own paths (another deal of the rounds: another curve).
  r = test::launch_train(2, "--run-dir " + colocated.string() + i2v_assets() + trajectory +
                                " --train.trajectory_rollout 0.5 --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(losses(colocated).size(), 6u);
  // A LoRA student: adapters over the i2v teacher's own frozen weights, y in its every forward.
  const auto lora = root() / "i2v-trajectory-lora";
  r = test::launch_train(3, "--run-dir " + lora.string() + i2v_assets() + trajectory +
                                " --student.lora_rank 4 --student.lora_alpha 8 --train.lr 2e-3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(lora / "student" / "lora.json")) << r.output;
}

TEST(I2v, DataAnI2vTeacherDoesNotTakeIsRefusedByName) {
  auto r = test::launch_train(3, "--run-dir " + (root() / "i2v-ignoring").string() + i2v_assets() +
                                     " --data.ignore_condition true --train.steps 2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("data.ignore_condition true cannot leave them out"), std::string::npos) << r.output;
  // A t2v teacher on the conditioned data: refused, naming the dataset, unless data.ignore_condition.
  const auto data = (root() / "i2v-assets" / "cache" / "tiny-data.h5").string();
  r = test::launch_train(3, "--run-dir " + (root() / "t2v-on-i2v").string() + " --data.path " + data +
                                " --train.steps 2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(data + ": /condition: holds image conditions"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("set data.ignore_condition true"), std::string::npos) << r.output;
  r = test::launch_train(3, "--run-dir " + (root() / "t2v-ignoring").string() + " --data.path " + data +
                                " --data.ignore_condition true --train.steps 2");
  EXPECT_EQ(r.code, 0) << r.output;
}

/// A tiny ti2v teacher (TI2V-5B's type: per-token timesteps, in_dim = out_dim) and its data, whose
/// images are each sample's first latent frame, made once.
std::string ti2v_assets() {
  static const std::string args = conditioned_assets("ti2v", "");
  return args;
}

TEST(Ti2v, ATeacherTrainsItsImageModeFromTheDataSetsImagesOnEveryPath) {
  const std::string steps = " --teacher.compute fp32 --train.steps 8 --train.log_every 1 --train.seed 5";
  const auto dedicated = root() / "ti2v-velocity", colocated = root() / "ti2v-velocity-colocated";
  auto r = test::launch_train(3, "--run-dir " + dedicated.string() + ti2v_assets() + steps);
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(2, "--run-dir " + colocated.string() + ti2v_assets() + steps + " --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_close_losses(dedicated, colocated, 8);
  // data.ignore_condition: the text-to-video mode, another curve.
  r = test::launch_train(3, "--run-dir " + (root() / "ti2v-t2v-mode").string() + ti2v_assets() + steps +
                                " --data.ignore_condition true");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(losses(root() / "ti2v-t2v-mode"), losses(dedicated));
  // Trajectories keep the image as their clean first frame; a rolled-out student keeps it too.
  r = test::launch_train(3, "--run-dir " + (root() / "ti2v-trajectory").string() + ti2v_assets() + steps +
                                " --train.objective trajectory --teacher.steps 4 --student.steps 2 --teacher.shift 3"
                                " --train.trajectory_rollout 0.5 --train.sample_every 4 --train.eval_samples 4");
  ASSERT_EQ(r.code, 0) << r.output;
}

// 6 guided UniPC teacher steps cut into 3 student intervals: a round is 3 transport steps.
const std::string kTrajectory = " --train.objective trajectory --teacher.guidance 3 --teacher.steps 6 --student.steps 3"
                                " --teacher.shift 3 --teacher.compute fp32 --train.steps 8 --train.log_every 1"
                                " --train.seed 5 --train.eval_samples 12";

TEST(Trajectory, AResumedRunIsBitIdenticalToAStraightOneFromMidRound) {
  const auto straight = root() / "trajectory-straight", resumed = root() / "trajectory-resumed";
  auto r = test::launch_train(3, "--run-dir " + straight.string() + builtin_assets() + kTrajectory +
                                     " --checkpoint.every 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.objective trajectory: the teacher samples 6 unipc steps (shift 3) from seeded noise; "
                          "the student learns the jumps between its 3 σ, 4 teacher forwards a trained sample"),
            std::string::npos)
      << r.output;
  // Without student.expert every interval is trained and no run of one expert is announced.
  EXPECT_EQ(r.output.find("student.expert"), std::string::npos) << r.output;
  // The held-out error per student interval, in the log and in metrics.jsonl.
  EXPECT_NE(r.output.find("eval after training: relative MSE "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(per interval: "), std::string::npos) << r.output;
  {
    std::ifstream metrics(straight / "metrics.jsonl");
    std::string line;
    int evals = 0;
    while (std::getline(metrics, line)) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("eval_step")) continue;
      ++evals;
      ASSERT_TRUE(j.contains("rel_mse_interval")) << line;
      EXPECT_EQ(j["rel_mse_interval"].size(), 3u) << line;
      for (const auto& [i, v] : j["rel_mse_interval"].items()) EXPECT_GT(v.get<double>(), 0.0) << line;
    }
    EXPECT_EQ(evals, 2);  // before and after training
  }
  // Step 4 is the second position of a round (rounds of 3): the resumed teacher recomputes it.
  r = test::launch_train(3, "--run-dir " + resumed.string() + builtin_assets() + kTrajectory + " --resume " +
                                (straight / "checkpoints" / "step-00000004").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 8, 4);
}

// train.trajectory_rollout: the teacher sends each path's noise and half of each batch starts
// from the student's own jumps: other losses than the plain run's, and a resume mid-round is exact
// (the roll-out uses the restored weights).
TEST(Trajectory, RolledOutSamplesTrainOtherwiseAndResumeExactly) {
  const auto plain = root() / "rollout-plain", straight = root() / "rollout-straight",
             resumed = root() / "rollout-resumed";
  auto r = test::launch_train(3, "--run-dir " + plain.string() + builtin_assets() + kTrajectory);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string rollout = kTrajectory + " --train.trajectory_rollout 0.5";
  r = test::launch_train(3, "--run-dir " + straight.string() + builtin_assets() + rollout + " --checkpoint.every 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.trajectory_rollout 0.5: the first 1 of each student's 2 samples start from"),
            std::string::npos)
      << r.output;
  const auto a = test::losses(plain), b = test::losses(straight);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  std::size_t differ = 0;
  for (std::size_t i = 1; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_GE(differ, 6u) << "the rolled-out run trained on the plain run's targets";
  r = test::launch_train(3, "--run-dir " + resumed.string() + builtin_assets() + rollout + " --resume " +
                                (straight / "checkpoints" / "step-00000004").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 8, 4);
  // Only with the trajectory objective.
  r = test::launch_refused(1, "--run-dir " + (root() / "rollout-refused").string() + builtin_assets() +
                                  " --train.objective guided --train.trajectory_rollout 0.5 --train.steps 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.trajectory_rollout(0.5) rolls the student out along teacher trajectories: it needs "
                          "train.objective trajectory, not guided"),
            std::string::npos)
      << r.output;
}

TEST(Trajectory, ColocatedTeachersTrainOnTheirOwnTrajectoriesFromContextsAlone) {
  const auto dir = root() / "trajectory-colocated";
  // Prompts without videos: a contexts-only data set for the builtin teacher (16 channels, 64-wide text).
  fs::create_directories(root());
  const auto contexts = (root() / "contexts.h5").string();
  const auto made = test::run_captured(std::string(WD_CLI) + " make-dataset --contexts-only --output " + contexts +
                                       " --samples 40 --latent 16,1,8,8 --text-len 16 --text-dim 64 2>&1");
  ASSERT_EQ(made.code, 0) << made.output;
  static_cast<void>(builtin_assets());  // makes the teacher
  auto r = test::launch_train(2, "--run-dir " + dir.string() + " --teacher.checkpoint " +
                                     (root() / "assets" / "cache" / "tiny-teacher").string() + " --data.path " + contexts +
                                     kTrajectory + " --teacher.placement colocated --train.sample_every 8");
  ASSERT_EQ(r.code, 0) << r.output;
  // The sampling probe samples the student as it will be used: its 3 Euler steps on teacher.shift's schedule.
  EXPECT_NE(r.output.find("sample probe at step 8 (3 Euler steps, shift 3)"), std::string::npos) << r.output;
  const auto l = losses(dir);
  ASSERT_EQ(l.size(), 8u) << r.output;
  for (double x : l) EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
  // The trajectory target is not the velocity one: the same job with velocity trains differently.
  r = test::launch_train(2, "--run-dir " + (root() / "trajectory-velocity").string() + builtin_assets() +
                                " --teacher.compute fp32 --train.steps 8 --train.log_every 1 --train.seed 5"
                                " --train.eval_samples 12 --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(losses(root() / "trajectory-velocity"), l);
}

// train.objective dmd: cycles of 5 steps (the generator updates after steps 5 and 10), the
// teacher in fp32 so that a teacher rank and colocated teachers answer alike.
const std::string kDmd = " --train.objective dmd --teacher.guidance 3 --student.steps 2 --teacher.shift 3"
                         " --teacher.compute fp32 --train.steps 10 --train.log_every 1 --train.seed 5";

/// The teacher's "real-score service: N samples answered" count, or -1.
long answered(const std::string& output) {
  const std::string key = "teacher real-score service: ";
  const auto at = output.find(key);
  return at == std::string::npos ? -1 : std::stol(output.substr(at + key.size()));
}

// Requests and answers on 2, 3 and 4 ranks: one teacher rank batching the requests of 1, 2 and 3
// students trains as the same students with colocated teachers answering on the spot.
TEST(Dmd, ATeacherRankAnswersItsStudentsAsColocatedTeachersDo) {
  for (const int students : {1, 2, 3}) {
    const auto dedicated = root() / ("dmd-dedicated-" + std::to_string(students));
    const auto colocated = root() / ("dmd-colocated-" + std::to_string(students));
    auto r = test::launch_train(students + 1, "--run-dir " + dedicated.string() + builtin_assets() + kDmd +
                                                  " --teacher.ranks 1 --train.eval_samples 12");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("train.objective dmd: the generator samples in 2 Euler steps (train.dmd_start simulate); "
                            "5 critic updates per generator update; the replica's teacher rank answers"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("training batches carry the data alone (no teacher forward)"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("eval after training: relative MSE "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("transport: mpi on the real-score answers of replica 0 to " + std::to_string(students)),
              std::string::npos)
        << r.output;
    // Two generator updates, each asking for the student's 2 samples.
    EXPECT_EQ(answered(r.output), 2L * 2 * students) << r.output;
    EXPECT_NE(r.output.find("dmd step 10: generator loss "), std::string::npos) << r.output;
    r = test::launch_train(students, "--run-dir " + colocated.string() + builtin_assets() + kDmd +
                                         " --teacher.placement colocated --train.eval_samples 12");
    ASSERT_EQ(r.code, 0) << r.output;
    test::expect_close_losses(dedicated, colocated, 10);
  }
}

// A checkpoint inside a cycle holds the critic and every student's request inputs of the cycle:
// the resumed students ask again and train bit for bit as the straight run.
TEST(Dmd, AResumedRunIsBitIdenticalToAStraightOneFromMidCycle) {
  const auto straight = root() / "dmd-straight", resumed = root() / "dmd-resumed";
  auto r = test::launch_train(3, "--run-dir " + straight.string() + builtin_assets() + kDmd + " --checkpoint.every 3 --checkpoint.keep 0");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto step3 = straight / "checkpoints" / "step-00000003";
  EXPECT_TRUE(fs::exists(step3 / "critic" / "trainable.safetensors"));
  EXPECT_TRUE(fs::exists(step3 / "dmd_pending.safetensors"));
  r = test::launch_train(3, "--run-dir " + resumed.string() + builtin_assets() + kDmd + " --resume " + step3.string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 10, 3);
  // The generator changes with its updates only: the dmd target is not the guided one.
  r = test::launch_train(3, "--run-dir " + (root() / "dmd-guided").string() + builtin_assets() +
                                " --train.objective guided --teacher.guidance 3 --teacher.compute fp32 --train.steps 10"
                                " --train.log_every 1 --train.seed 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(losses(root() / "dmd-guided"), losses(straight));
}

// train.dmd_regression_weight: the teacher streams trajectory batches (from contexts), the
// generator's loss adds the trajectory target of the step's batch; resumed mid-cycle exactly.
TEST(Dmd, ARegressionTermTrainsOnTheTeachersTrajectoriesAndResumesExactly) {
  const auto straight = root() / "dmd-regression", resumed = root() / "dmd-regression-resumed";
  const std::string args = kDmd + " --train.dmd_regression_weight 0.5 --teacher.steps 4 --train.eval_samples 12";
  auto r = test::launch_train(3, "--run-dir " + straight.string() + builtin_assets() + args +
                                     " --checkpoint.every 3 --checkpoint.keep 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.objective dmd: the teacher samples 4 unipc steps (shift 3) from seeded noise"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(per interval: "), std::string::npos) << r.output;
  EXPECT_NE(losses(straight), losses(root() / "dmd-straight"));
  r = test::launch_train(3, "--run-dir " + resumed.string() + builtin_assets() + args + " --resume " +
                                (straight / "checkpoints" / "step-00000003").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 10, 3);
}

// DMD2's GAN term: the critic's realism classifier trains with the critic (its tensors in the
// critic's checkpoint), the generator adds its GAN loss, and a resume from mid-cycle (the request
// batch's t kept for the generator's term) is bit-identical.
TEST(Dmd, AGanTermTrainsTheCriticsClassifierAndResumesExactly) {
  const auto straight = root() / "dmd-gan", resumed = root() / "dmd-gan-resumed";
  const std::string args = kDmd + " --critic.gan_weight 0.01 --train.gan_weight 0.003 --critic.gan_block 0";
  auto r = test::launch_train(3, "--run-dir " + straight.string() + builtin_assets() + args +
                                     " --checkpoint.every 3 --checkpoint.keep 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dmd GAN term (DMD2): the critic's realism classifier after its 0 block"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dmd step 10: generator loss "), std::string::npos) << r.output;
  const auto step3 = straight / "checkpoints" / "step-00000003";
  const auto critic = SafetensorsFile::open((step3 / "critic" / "trainable.safetensors").string());
  for (const char* name : {"distill_heads.gan_in.weight", "distill_heads.gan_out.bias"}) {
    EXPECT_TRUE(critic.contains(name)) << name;
  }
  EXPECT_TRUE(SafetensorsFile::open((step3 / "dmd_pending.safetensors").string()).contains("t"));
  r = test::launch_train(3, "--run-dir " + resumed.string() + builtin_assets() + args + " --resume " + step3.string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 10, 3);
  // Without a classifier there is nothing to train against: refused before training.
  r = test::launch_refused(1, "--run-dir " + (root() / "dmd-gan-refused").string() + builtin_assets() + kDmd +
                                  " --train.gan_weight 0.003");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.gan_weight(0.003) needs the critic's classifier: set critic.gan_weight > 0"),
            std::string::npos)
      << r.output;
  r = test::launch_train(2, "--run-dir " + (root() / "dmd-gan-refused").string() + builtin_assets() + kDmd +
                                " --critic.gan_weight 0.01 --critic.gan_block 7");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("critic.gan_block(7) names a block the critic lacks"), std::string::npos) << r.output;
}

// critic.dim, ffn_dim, num_heads, num_layers: a critic smaller than the generator trains beside it
// (its checkpoint holds its own shapes); its dims with critic.init student, or over a LoRA base,
// are refused before training.
TEST(Dmd, ACriticOfItsOwnDimsTrainsBesideTheGenerator) {
  const auto run = root() / "dmd-critic-dims";
  const std::string dims = " --critic.dim 32 --critic.ffn_dim 64 --critic.num_heads 2 --critic.num_layers 1";
  auto r = test::launch_train(2, "--run-dir " + run.string() + builtin_assets() + kDmd + " --critic.init random" + dims +
                                     " --critic.gan_weight 0.01 --train.gan_weight 0.003 --checkpoint.every 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dmd critic of its own dims: dim 32, ffn 64, 2 heads, 1 blocks"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dmd step 10: generator loss "), std::string::npos) << r.output;
  const auto critic = SafetensorsFile::open((run / "checkpoints" / "step-00000005" / "critic" / "trainable.safetensors").string());
  EXPECT_EQ(critic.info("blocks.0.self_attn.q.weight").shape, (std::vector<std::int64_t>{32, 32}));
  EXPECT_FALSE(critic.contains("blocks.1.self_attn.q.weight"));
  EXPECT_EQ(critic.info("distill_heads.gan_in.weight").shape, (std::vector<std::int64_t>{32, 32}));
  r = test::launch_refused(1, "--run-dir " + (root() / "dmd-critic-dims-refused").string() + builtin_assets() + kDmd +
                                  dims);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("critic.init(student) starts it as the generator starts, with the student's dims: set "
                          "critic.init random"),
            std::string::npos)
      << r.output;
  r = test::launch_refused(1, "--run-dir " + (root() / "dmd-critic-dims-refused").string() + builtin_assets() + kDmd +
                                  " --critic.init random --student.lora_rank 4" + dims);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("a LoRA critic (critic.lora_rank, or a LoRA student's) is the teacher's architecture"),
            std::string::npos)
      << r.output;
}

// An i2v teacher's dmd: the generator samples with each batch's image (y at every jump), the
// critic learns them with it, and the teacher's real score takes it in the request: a teacher rank
// answers as colocated teachers do. The GAN term's real samples and the regression term's
// conditioned trajectories carry it too.
TEST(I2v, ADmdGeneratorSamplesWithTheImagesAndTheTeachersScoreTakesThem) {
  const auto dedicated = root() / "i2v-dmd", colocated = root() / "i2v-dmd-colocated";
  auto r = test::launch_train(3, "--run-dir " + dedicated.string() + i2v_assets() + kDmd + " --train.eval_samples 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(answered(r.output), 2L * 2 * 2) << r.output;
  r = test::launch_train(2, "--run-dir " + colocated.string() + i2v_assets() + kDmd +
                                " --teacher.placement colocated --train.eval_samples 4");
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_close_losses(dedicated, colocated, 10);
  const auto terms = root() / "i2v-dmd-terms";
  r = test::launch_train(3, "--run-dir " + terms.string() + i2v_assets() + kDmd +
                                " --critic.gan_weight 0.01 --train.gan_weight 0.003 --train.dmd_regression_weight 0.5"
                                " --teacher.steps 4 --train.eval_samples 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dmd step 10: generator loss "), std::string::npos) << r.output;
  EXPECT_NE(losses(terms), losses(dedicated));
}

// An I2V-A14B-shaped LoRA pair (two i2v experts, boundary 0.9) by dmd: one adapter set per
// expert for the generator and for its critic, each forward with its batch's y.
TEST(I2v, ALoraExpertPairTrainsByDmdWithTheImages) {
  const auto pair = (root() / "i2v-a14b-dmd-teacher").string();
  const auto made = test::run_captured(std::string(WD_CLI) + " init-teacher --preset tiny --experts 2 --model-type i2v "
                                       "--in-dim 36 --out-dim 16 --dtype bf16 --seed 3 --output " + pair + " 2>&1");
  ASSERT_EQ(made.code, 0) << made.output;
  const auto data = (root() / "i2v-assets" / "cache" / "tiny-data.h5").string();
  static_cast<void>(i2v_assets());  // the data set with its images
  const auto run = root() / "i2v-pair-dmd";
  const auto r = test::launch_train(3, "--run-dir " + run.string() + " --teacher.checkpoint " + pair + " --data.path " +
                                           data + kDmd + " --student.lora_rank 4 --student.lora_alpha 8"
                                           " --train.lr 2e-3 --train.eval_samples 4 --log.level info");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA pair: one adapter set per expert of " + pair), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dmd step 10: generator loss "), std::string::npos) << r.output;
  for (const auto* expert : {"high_noise_model", "low_noise_model"}) {
    EXPECT_TRUE(fs::exists(run / "student" / expert / "lora.json")) << expert;
  }
}

// TI2V-5B's image mode under dmd: each generator sample, re-noised sample and fake sample keeps
// the batch's image as its clean first frame (per-token t at 0 there); a checkpoint inside a
// cycle keeps the request batch's x_t and t (the images) and the resumed run is bit-identical.
TEST(Ti2v, ADmdGeneratorKeepsTheImageAndResumesExactlyFromMidCycle) {
  const auto straight = root() / "ti2v-dmd", resumed = root() / "ti2v-dmd-resumed";
  const std::string args = kDmd + " --critic.gan_weight 0.01 --train.gan_weight 0.003 --train.eval_samples 4";
  auto r = test::launch_train(3, "--run-dir " + straight.string() + ti2v_assets() + args +
                                     " --checkpoint.every 3 --checkpoint.keep 0");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto step3 = straight / "checkpoints" / "step-00000003";
  const auto pending = SafetensorsFile::open((step3 / "dmd_pending.safetensors").string());
  EXPECT_TRUE(pending.contains("x_t") && pending.contains("t"));
  r = test::launch_train(3, "--run-dir " + resumed.string() + ti2v_assets() + args + " --resume " + step3.string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 10, 3);
  const auto colocated = root() / "ti2v-dmd-colocated";
  r = test::launch_train(2, "--run-dir " + colocated.string() + ti2v_assets() + args + " --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_close_losses(straight, colocated, 10);
}

/// Equal but for what a learning rate of 1e-30 moves: only a weight that is exactly 0 (AdamW's
/// step is at most ~lr per element; every other fp32 weight absorbs it).
bool unmoved(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::allclose(a, b, /*rtol=*/0, /*atol=*/1e-28);
}

/// Every tensor of `files` but the distillation heads is `start`'s of the same name, unmoved;
/// returns how many were compared.
std::size_t expect_unmoved(const std::vector<SafetensorsFile>& files, const WanCheckpoint& start) {
  std::size_t compared = 0;
  for (const auto& file : files) {
    for (const auto& info : file.tensors()) {
      if (info.name.rfind("distill_heads", 0) == 0) continue;
      EXPECT_TRUE(start.contains(info.name)) << file.path() << ": " << info.name;
      if (!start.contains(info.name)) continue;
      EXPECT_TRUE(unmoved(file.tensor(info.name, torch::kFloat), start.tensor(info.name, torch::kFloat)))
          << file.path() << ": " << info.name;
      ++compared;
    }
  }
  return compared;
}

// student.init weights:PATH and critic.init teacher: a dmd generator starts as an earlier run's
// trajectory student (the student's dims), its critic as the teacher (the teacher's dims, larger
// here; the two-stage recipe: an ODE-distilled student, then distribution matching); a flow run
// fine-tunes a checkpoint. At a learning rate of 1e-30
// the trained results are their starting points (unmoved: a step moves only exact zeros, by 1e-30).
TEST(Dmd, AGeneratorStartsFromATrajectoryStudentAndItsCriticFromTheTeacher) {
  const auto trajectory = root() / "init-trajectory";
  auto r = test::launch_train(2, "--run-dir " + trajectory.string() + builtin_assets() +
                                     " --train.objective trajectory --teacher.guidance 3 --teacher.steps 6 --student.steps 2"
                                     " --teacher.compute fp32 --teacher.placement colocated --train.steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto weights = " --student.init weights:" + (trajectory / "student").string();
  const std::string frozen = " --train.lr 1e-30 --train.min_lr 0 --train.warmup_steps 0";
  const auto dmd = root() / "init-dmd";
  r = test::launch_train(2, "--run-dir " + dmd.string() + builtin_assets() + kDmd + weights + " --critic.init teacher" +
                                frozen + " --teacher.placement colocated --checkpoint.every 10");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("student initialised from " + (trajectory / "student").string() + " (all "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dmd critic initialised from teacher blocks 0,1,2,3 ("), std::string::npos) << r.output;
  const auto start = WanCheckpoint::open((trajectory / "student").string());
  EXPECT_GT(expect_unmoved(WanCheckpoint::open((dmd / "student").string()).files(), start), 20u);
  const auto teacher = WanCheckpoint::open((root() / "assets" / "cache" / "tiny-teacher").string());
  const auto critic = dmd / "checkpoints" / "step-00000010" / "critic" / "trainable.safetensors";
  EXPECT_GT(expect_unmoved({SafetensorsFile::open(critic.string())}, teacher), 40u);
  // Flow fine-tunes the trajectory student (no teacher).
  const auto flow = root() / "init-flow";
  r = test::launch_train(1, "--run-dir " + flow.string() + kFlow + weights + frozen + " --train.steps 2 --data.path " +
                                (root() / "assets" / "cache" / "tiny-data.h5").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_GT(expect_unmoved(WanCheckpoint::open((flow / "student").string()).files(), start), 20u);
  // A checkpoint of other dims, a teacher critic given other dims: refused.
  r = test::launch_refused(1, "--run-dir " + (root() / "init-refused").string() + builtin_assets() + kDmd + weights +
                                  " --teacher.placement colocated --student.dim 32 --student.num_heads 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a model of the student's dims: dim 64 (the student's: 32)"), std::string::npos)
      << r.output;
  r = test::launch_refused(1, "--run-dir " + (root() / "init-refused").string() + builtin_assets() + kDmd +
                                  " --teacher.placement colocated --critic.init teacher --critic.dim 64");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("but critic.init(teacher) starts it as the teacher, with the teacher's dims: set critic.init "
                          "random"),
            std::string::npos)
      << r.output;
}

TEST(Dmd, RefusesWhatItCannotTrain) {
  auto r = test::launch_refused(1, "--run-dir " + (root() / "dmd-refused").string() + builtin_assets() + kDmd +
                                       " --train.grad_accum 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.objective dmd takes one micro-batch a step: train.grad_accum(2) must be 1"),
            std::string::npos)
      << r.output;
  r = test::launch_refused(1, "--run-dir " + (root() / "dmd-refused").string() + builtin_assets() +
                                  " --train.objective guided --train.dmd_regression_weight 0.5 --train.steps 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.dmd_regression_weight(0.5) weighs a term of the dmd generator loss: it needs "
                          "train.objective dmd, not guided"),
            std::string::npos)
      << r.output;
  r = test::launch_refused(3, "--run-dir " + (root() / "dmd-refused").string() + builtin_assets() +
                                  " --train.steps 2 --inject-fault throw@teacher:0:2:serve");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("strikes in a real-score answer, which only teacher ranks of train.objective dmd give"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace wd::test_objectives_launch
