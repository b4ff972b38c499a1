// student.sequence_parallel as `train` runs it: groups of 2 and 4 student ranks that share each
// sample, each holding its tokens through every block, train as one rank does over the same
// batches (velocity, trajectory with roll-outs, dmd with its GAN and regression terms,
// checkpointed blocks, bf16-mixed, a LoRA student and a LoRA pair, sharded gradients, i2v and ti2v teachers, a
// token count the group does not divide); a checkpoint written by groups of 2 resumes on 1 and 4;
// what is not built is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>

#include "launch_util.hpp"

namespace wd::test_sequence_parallel_launch {
namespace {

namespace fs = std::filesystem;

const fs::path& root() {
  static const fs::path dir = test::fresh_dir("sequence-parallel");
  return dir;
}

std::string run_dir(const std::string& name) { return " --run-dir " + (root() / name).string(); }

// eval_samples 8: a multiple of every global batch here (1 or 2 groups of train.batch_size 2...).
// teacher.compute fp32: auto's timing could choose apart between two runs (another target).
const std::string kBase = " --train.log_every 1 --train.eval_samples 8 --teacher.compute fp32";

// dmd with DMD2's GAN term and the regression term on (a generator update every 5 steps).
const std::string kDmd = " --train.objective dmd --teacher.guidance 3 --student.steps 2 --teacher.shift 3"
                         " --train.seed 5 --critic.gan_weight 0.01 --train.gan_weight 0.003 --critic.gan_block 0"
                         " --train.dmd_regression_weight 0.5 --teacher.steps 4";

/// Trains `args` over `groups` data-parallel groups at sequence-parallel sizes 1 and each of `sizes`
/// (one teacher rank), and expects every curve within `relative` of size 1's, step by step, and
/// the held-out error before and after training too.
void expect_groups_train_alike(const std::string& name, const std::string& args, std::size_t steps,
                               std::initializer_list<int> sizes, double relative, int groups = 1) {
  const auto one = root() / (name + "-1");
  auto r = test::launch_train(1 + groups, " --run-dir " + one.string() + kBase + args);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const int n : sizes) {
    SCOPED_TRACE(name + ": groups of " + std::to_string(n));
    const auto run = root() / (name + "-" + std::to_string(n));
    r = test::launch_train(1 + groups * n, " --run-dir " + run.string() + kBase + args +
                                               " --student.sequence_parallel " + std::to_string(n));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("sequence parallelism: " + std::to_string(groups) + " group(s) of " + std::to_string(n) +
                            " student ranks"),
              std::string::npos)
        << r.output;
    test::expect_close_losses(one, run, steps, relative);
    std::vector<double> a, b;
    for (const auto& m : test::read_metrics(one / "metrics.jsonl")) {
      if (m.contains("rel_mse")) a.push_back(m["rel_mse"].get<double>());
    }
    for (const auto& m : test::read_metrics(run / "metrics.jsonl")) {
      if (m.contains("rel_mse")) b.push_back(m["rel_mse"].get<double>());
    }
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], relative * a[i]) << "held-out error " << i;
  }
}

// The tiny default (192 tokens a sample, 4 heads): velocity over 100 steps, one group and two.
TEST(SequenceParallel, GroupsOfTwoAndFourTrainAsOneRankOverOneHundredSteps) {
  expect_groups_train_alike("velocity", " --train.steps 100", 100, {2, 4}, 1e-5);
  expect_groups_train_alike("velocity-dp2", " --train.steps 20", 20, {2}, 1e-5, 2);
}

TEST(SequenceParallel, TrajectoryRolloutsCheckpointedBlocksAndMixedPrecisionTrainAlike) {
  // The roll-outs' jumps are whole-output forwards (gathered) on every rank of the group.
  expect_groups_train_alike("trajectory",
                            " --train.objective trajectory --teacher.steps 4 --student.steps 2 --teacher.shift 3"
                            " --train.trajectory_rollout 0.5 --student.checkpointing all --train.steps 20",
                            20, {2}, 1e-5);
  // bf16-mixed: each rank's weight gradients are its tokens' partial sums rounded to bf16 before
  // they are added, as each data-parallel rank's are. The same global batch split over two
  // data-parallel ranks instead of one moves this curve by up to 9.5e-5 in 20 steps; groups of 2
  // move it by up to 1.8e-4 (bench/results/sequence-parallel.md): 5e-4 bounds that noise.
  expect_groups_train_alike("bf16", " --student.precision bf16-mixed --student.checkpointing every:2 --train.steps 20"
                                    " --train.grad_accum 2",
                            20, {2}, 5e-4);
}

TEST(SequenceParallel, ALoraStudentALoraPairAndShardedGradientsTrainAlike) {
  // An fp32 teacher: a LoRA student computes in its base's dtype (the builtin teacher's bf16 would
  // add bf16's noise, as above). A LoRA pair over an fp32 two-expert teacher: each rank of a group
  // routes the group's samples to the same experts, each expert's forward splitting their tokens.
  fs::create_directories(root());
  const std::pair<std::string, std::string> teachers[] = {{"lora", "--seed 4"}, {"lora-pair", "--experts 2 --seed 3"}};
  for (const auto& [name, flags] : teachers) {
    const auto teacher = (root() / (name + "-fp32-teacher")).string();
    const auto init = test::run_captured(std::string(WD_CLI) + " init-teacher --preset tiny --dtype fp32 " + flags +
                                         " --output " + teacher + " 2>&1");
    ASSERT_EQ(init.code, 0) << init.output;
    expect_groups_train_alike(name,
                              " --teacher.checkpoint " + teacher +
                                  " --student.lora_rank 4 --student.lora_alpha 8 --train.objective guided --train.lr 2e-3"
                                  " --train.steps 12",
                              12, {2}, 1e-5);
  }
  // ZeRO-2 over every student rank: 4 ranks in 2 groups against 2 ranks.
  expect_groups_train_alike("gradients", " --student.shard gradients --comm.bucket_mb 0.1 --train.steps 12", 12, {2},
                            1e-5, 2);
}

TEST(SequenceParallel, ATokenCountTheGroupDoesNotDivideAndImageConditionedTeachersTrainAlike) {
  // 3 x 7 x 7 = 147 tokens a sample: padded to 148 for 2 and 4 ranks, the padding in no key set.
  fs::create_directories(root());
  const auto data = (root() / "odd.h5").string();
  const auto made = test::run_captured(std::string(WD_CLI) + " make-dataset --output " + data +
                                       " --samples 24 --latent 16,3,14,14 --text-len 16 --text-dim 64 2>&1");
  ASSERT_EQ(made.code, 0) << made.output;
  expect_groups_train_alike("odd", " --data.path " + data + " --train.steps 12 --student.checkpointing all", 12, {2, 4},
                            1e-5);
  for (const std::string kind : {"i2v", "ti2v"}) {
    SCOPED_TRACE(kind);
    const auto dir = root() / (kind + "-assets");
    const auto teacher = (dir / "teacher").string();
    const auto init = test::run_captured(std::string(WD_CLI) + " init-teacher --preset tiny --model-type " + kind +
                                         (kind == "i2v" ? " --in-dim 36 --out-dim 16" : "") +
                                         " --dtype bf16 --seed 4 --output " + teacher + " 2>&1");
    ASSERT_EQ(init.code, 0) << init.output;
    auto r = test::launch_train(2, " --run-dir " + dir.string() + " --teacher.checkpoint " + teacher +
                                       " --train.steps 1 --log.level warn");
    ASSERT_EQ(r.code, 0) << r.output;
    const auto assets = " --teacher.checkpoint " + teacher + " --data.path " + (dir / "cache" / "tiny-data.h5").string();
    // ti2v's image mode: per-token t, the clean first frame out of the loss on every rank.
    expect_groups_train_alike(kind, assets + " --train.steps 12", 12, {2}, 1e-5);
    // dmd keeps the image in every sample it makes (ti2v: the clean first frame; i2v: y).
    if (kind == "ti2v") expect_groups_train_alike("ti2v-dmd", assets + kDmd + " --train.steps 10", 10, {2}, 1e-5);
  }
}

TEST(SequenceParallel, ACheckpointOfGroupsOfTwoResumesOnOneAndFourRanks) {
  const std::string job = kBase + " --train.steps 12 --checkpoint.every 6 --checkpoint.keep 0";
  const auto straight = root() / "resume-straight";
  auto r = test::launch_train(3, " --run-dir " + straight.string() + job + " --student.sequence_parallel 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto from = (straight / "checkpoints" / "step-00000006").string();
  for (const int n : {1, 4}) {
    SCOPED_TRACE("resumed on " + std::to_string(n));
    const auto resumed = root() / ("resume-" + std::to_string(n));
    r = test::launch_train(1 + n, " --run-dir " + resumed.string() + job + " --resume " + from +
                                      " --student.sequence_parallel " + std::to_string(n));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto all = test::losses(straight), tail = test::losses(resumed);
    ASSERT_EQ(all.size(), 12u);
    ASSERT_EQ(tail.size(), 6u);
    for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_NEAR(tail[i], all[i + 6], 1e-6 * all[i + 6]) << "step " << i + 7;
  }
}

// dmd with its GAN and regression terms: the generator's k-step samples and the critic's forwards
// split the tokens of each sample over the group (the classifier's mean over tokens summed across
// it), the teacher answers one request a group, and a checkpoint inside a cycle (its request
// inputs kept once a group) resumes on 1 and 4 ranks a group.
TEST(SequenceParallel, DmdWithItsGanAndRegressionTermsTrainsAlikeAndResumesOnOtherGroupSizes) {
  const std::string dmd = kDmd + " --train.steps 12";
  expect_groups_train_alike("dmd", dmd + " --checkpoint.every 3 --checkpoint.keep 0", 12, {2}, 1e-5);
  const auto straight = root() / "dmd-2";
  EXPECT_TRUE(fs::exists(straight / "checkpoints" / "step-00000003" / "dmd_pending.safetensors"));
  for (const int n : {1, 4}) {
    SCOPED_TRACE("resumed on " + std::to_string(n));
    const auto resumed = root() / ("dmd-resume-" + std::to_string(n));
    const auto r = test::launch_train(1 + n, " --run-dir " + resumed.string() + kBase + dmd + " --resume " +
                                                 (straight / "checkpoints" / "step-00000003").string() +
                                                 " --student.sequence_parallel " + std::to_string(n));
    ASSERT_EQ(r.code, 0) << r.output;
    // One real-score forward a group: 2 samples in each of the two updates after the resume.
    EXPECT_NE(r.output.find("teacher real-score service: 4 samples answered"), std::string::npos) << r.output;
    const auto all = test::losses(straight), tail = test::losses(resumed);
    ASSERT_EQ(tail.size(), 9u);
    for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_NEAR(tail[i], all[i + 3], 1e-6 * all[i + 3]) << "step " << i + 4;
  }
}

TEST(SequenceParallel, BadCombinationsAreRefusedBeforeTraining) {
  fs::create_directories(root());
  const auto one_token = (root() / "one-token.h5").string();
  const auto made = test::run_captured(std::string(WD_CLI) + " make-dataset --output " + one_token +
                                       " --samples 16 --latent 16,1,2,2 --text-len 16 --text-dim 64 2>&1");
  ASSERT_EQ(made.code, 0) << made.output;
  struct Case {
    int ranks;
    std::string args, message;
  };
  const Case cases[] = {
      {4, " --student.sequence_parallel 3", "must divide the student's num_heads (4); sizes that work: 1, 2, 4"},
      {4, " --student.sequence_parallel 2", "must divide the student ranks of each teacher replica: 3 student rank(s)"},
      {5, " --student.sequence_parallel 4 --train.objective dmd --critic.init random --critic.dim 32"
          " --critic.ffn_dim 64 --critic.num_heads 2 --critic.num_layers 1",
       "must divide the dmd critic's num_heads (2); sizes that work: 1, 2"},
      {2, " --student.sequence_parallel 2 --train.objective dmd --teacher.placement colocated",
       "with teacher.placement colocated"},
      {2, " --student.sequence_parallel 2 --teacher.placement colocated", "with teacher.placement colocated"},
      {3, " --student.sequence_parallel 2 --student.features 1:1", "with student.features is not built yet"},
      {3, " --student.sequence_parallel 2 --student.out_dim 8", "whose channels differ from the teacher's"},
      {3, " --student.sequence_parallel 2 --data.path " + one_token, "is larger than the 1 tokens of a sample"},
      {3, " --student.sequence_parallel 0", "student.sequence_parallel(0) must be >= 1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = test::launch_refused(c.ranks, run_dir("refused") + " --train.steps 2" + c.args);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace wd::test_sequence_parallel_launch
