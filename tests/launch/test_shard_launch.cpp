// student.shard optimizer (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3) against plain
// data-parallel training: the same loss curve on 2, 3 and 4 students (slices that cross
// parameters, a padded last slice, several buckets reduce-scattered from the backward), with the
// global-norm clip, gradient accumulation and bf16-mixed; checkpoints resumed on the same student
// count bit for bit and on other counts (2 -> 4 -> 3) exactly as an unsharded resume; the dmd
// critic; what each rank holds; refusals.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "launch_util.hpp"

namespace wd::test_shard_launch {
namespace {

namespace fs = std::filesystem;

const fs::path& root() {
  static const fs::path dir = test::fresh_dir("shard");
  return dir;
}

// ffn 101, freq 66: 144458 parameters, which 3 and 4 students split with a padded last slice.
// eval_samples 24: a multiple of the global batch of 2, 3 and 4 students. teacher.compute fp32:
// `auto` times bf16 against fp32 matmuls at start-up, and under load two runs can choose apart
// (other targets from the first step on: seen in CI).
const std::string kBase = " --train.log_every 1 --student.ffn_dim 101 --student.freq_dim 66 --train.eval_samples 24"
                          " --teacher.compute fp32";
const std::string kJob = kBase + " --train.steps 12";
// student.shard gradients with buckets of 0.1 MB: the student's 0.58 MB of fp32 gradients in 6
// buckets, so reduce-scatters start inside the backward.
const std::string kGradients = " --student.shard gradients --comm.bucket_mb 0.1";
// student.shard parameters gathers a block again for its recomputation: every block checkpointed.
const std::string kAll = " --student.checkpointing all";
const std::string kParameters = " --student.shard parameters --comm.bucket_mb 0.1" + kAll;
constexpr std::int64_t kParams = 144458;  // the student's trainable parameters (kBase's dims)

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The weights bytes of every student rank in the run's last memory report.
std::vector<std::uint64_t> student_weight_bytes(const fs::path& run) {
  std::vector<std::uint64_t> out;
  nlohmann::json last;
  for (const auto& m : test::read_metrics(run / "metrics.jsonl")) {
    if (m.contains("memory_step")) last = m;
  }
  if (last.is_null()) return out;
  for (const auto& r : last["ranks"]) {
    if (r["role"] == "student") out.push_back(r["weights_bytes"].get<std::uint64_t>());
  }
  return out;
}

std::string run_dir(const std::string& name) { return " --run-dir " + (root() / name).string(); }

// Each student count against its unsharded twin: the loss curves agree to 1e-6 relative per step
// (the same AdamW arithmetic on each element, so on one host they are in fact equal).
TEST(Shard, OptimizerAndGradientShardingTrainLikeDataParallelOnTwoThreeAndFourStudents) {
  for (const int students : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(students) + " students");
    const std::string n = std::to_string(students);
    auto plain = test::launch_train(students + 1, run_dir("plain-" + n) + kJob);
    ASSERT_EQ(plain.code, 0) << plain.output;
    auto sharded = test::launch_train(students + 1, run_dir("sharded-" + n) + kJob + " --student.shard optimizer");
    ASSERT_EQ(sharded.code, 0) << sharded.output;
    EXPECT_NE(sharded.output.find("student.shard optimizer: each of " + n + " students keeps AdamW moments for "),
              std::string::npos)
        << sharded.output;
    test::expect_close_losses(root() / ("plain-" + n), root() / ("sharded-" + n), 12);
    auto scattered = test::launch_train(students + 1, run_dir("scattered-" + n) + kJob + kGradients);
    ASSERT_EQ(scattered.code, 0) << scattered.output;
    EXPECT_NE(scattered.output.find("student.shard gradients: each of " + n +
                                    " students keeps AdamW moments and gradients for "),
              std::string::npos)
        << scattered.output;
    // Every bucket left from the backward's hooks; nothing was left to send after it.
    EXPECT_NE(scattered.output.find("6 bucket send(s) from the backward's hooks, 0 after it (6 buckets)"),
              std::string::npos)
        << scattered.output;
    test::expect_close_losses(root() / ("plain-" + n), root() / ("scattered-" + n), 12);
  }
  // 144458 = 3 x 48153 - 1 = 4 x 36115 - 2: the last slice padded.
  for (const auto& [students, line] : {std::pair{3, "for 48153 of 144458 parameters (the last slice 1 padding)"},
                                       std::pair{4, "for 36115 of 144458 parameters (the last slice 2 padding)"}}) {
    const auto r = test::launch_train(students + 1, run_dir("sharded-" + std::to_string(students) + "-again") + kBase +
                                                        " --student.shard optimizer --train.steps 1");
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
}

// student.shard parameters (ZeRO-3): each block's weights are all-gathered for its forward and
// again for its recomputation, and let go after. With every block checkpointed it does the
// arithmetic of student.shard gradients (the same reduce-scatter, AdamW on the same slices, the
// same recomputation): the students written are the same bytes, and the curve is the unsharded
// one within 1e-6. Between steps a student holds its slice of every parameter and the parameters
// outside the blocks whole: the memory report's weights are 4 bytes x (slice + those).
TEST(Shard, ParameterShardingTrainsAsGradientShardingAndHoldsItsSliceBetweenUses) {
  const std::string job = kJob + " --memory.report_every 4";
  for (const int students : {2, 3}) {
    SCOPED_TRACE(std::to_string(students) + " students");
    const std::string n = std::to_string(students);
    auto plain = test::launch_train(students + 1, run_dir("all-plain-" + n) + job + kAll);
    ASSERT_EQ(plain.code, 0) << plain.output;
    auto scattered = test::launch_train(students + 1, run_dir("all-scattered-" + n) + job + kGradients + kAll);
    ASSERT_EQ(scattered.code, 0) << scattered.output;
    auto gathered = test::launch_train(students + 1, run_dir("gathered-" + n) + job + kParameters);
    ASSERT_EQ(gathered.code, 0) << gathered.output;
    EXPECT_NE(gathered.output.find("student.shard parameters: each of " + n +
                                   " students keeps AdamW moments, gradients and weights for "),
              std::string::npos)
        << gathered.output;
    test::expect_close_losses(root() / ("all-plain-" + n), root() / ("gathered-" + n), 12);
    const auto written = [&](const std::string& run) {
      return file_bytes(root() / run / "student" / "diffusion_pytorch_model.safetensors");
    };
    EXPECT_FALSE(written("gathered-" + n).empty());
    EXPECT_TRUE(written("gathered-" + n) == written("all-scattered-" + n)) << "the students differ";

    const std::string said = "blocks gathered for each use (forward and recomputation); between uses each student "
                             "holds its slice and the ";
    const auto at = gathered.output.find(said);
    ASSERT_NE(at, std::string::npos) << gathered.output;
    const std::int64_t outside = std::stoll(gathered.output.substr(at + said.size()));
    EXPECT_GT(outside, 0);
    // Embeddings and head: a third of this tiny student (its text embedding), a few percent of a real DiT.
    EXPECT_LT(outside, kParams / 2);
    const std::int64_t slice = (kParams + students - 1) / students;
    const auto held = student_weight_bytes(root() / ("gathered-" + n));
    ASSERT_EQ(held.size(), static_cast<std::size_t>(students));
    for (const auto bytes : held) EXPECT_EQ(bytes, static_cast<std::uint64_t>(4 * (slice + outside)));
    for (const auto bytes : student_weight_bytes(root() / ("all-scattered-" + n))) {
      EXPECT_EQ(bytes, static_cast<std::uint64_t>(4 * kParams));
    }
  }
}

// Accumulated micro-batches, a tight clip (the global norm over every slice clips each step) and
// bf16 compute with fp32 masters: still the unsharded curve. With sharded gradients each
// micro-batch's backward sends every bucket (12 sends in 6 buckets), bf16-mixed too (the hook
// sits on the bf16 compute copy; the send folds its grad into the fp32 master's). fp32: within
// 1e-6. bf16-mixed with sharded gradients: within 1e-4, not 1e-6. A reduce-scatter sums the 3
// ranks in another order than the all-reduce, and the clip's norm is summed from slices: the fp32
// gradients differ in their last bit (fp32 curves agree to 1e-8), and bf16 rounds the refreshed
// compute copy apart where a weight sits on a rounding edge (measured: 3e-5 by step 12).
TEST(Shard, AccumulationClippingAndMixedPrecisionTrainAlike) {
  const std::string accum = kJob + " --train.grad_accum 2 --train.grad_clip 0.05";
  const std::string mixed = accum + " --student.precision bf16-mixed";
  auto plain = test::launch_train(4, run_dir("mixed-plain") + mixed);
  ASSERT_EQ(plain.code, 0) << plain.output;
  auto sharded = test::launch_train(4, run_dir("mixed-sharded") + mixed + " --student.shard optimizer");
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  test::expect_close_losses(root() / "mixed-plain", root() / "mixed-sharded", 12);
  auto scattered = test::launch_train(4, run_dir("mixed-scattered") + mixed + kGradients);
  ASSERT_EQ(scattered.code, 0) << scattered.output;
  EXPECT_NE(scattered.output.find("12 bucket send(s) from the backward's hooks, 0 after it (6 buckets)"),
            std::string::npos)
      << scattered.output;
  test::expect_close_losses(root() / "mixed-plain", root() / "mixed-scattered", 12, 1e-4);

  auto accum_plain = test::launch_train(4, run_dir("accum-plain") + accum);
  ASSERT_EQ(accum_plain.code, 0) << accum_plain.output;
  auto accum_scattered = test::launch_train(4, run_dir("accum-scattered") + accum + kGradients);
  ASSERT_EQ(accum_scattered.code, 0) << accum_scattered.output;
  EXPECT_NE(accum_scattered.output.find("12 bucket send(s) from the backward's hooks, 0 after it (6 buckets)"),
            std::string::npos)
      << accum_scattered.output;
  test::expect_close_losses(root() / "accum-plain", root() / "accum-scattered", 12);
}

// Each student writes its slice of the AdamW moments into the checkpoint (optimizer.safetensors
// keeps the step counts and the flat layout): resumed on the same count it continues bit for bit;
// on 4 and then 3 students it re-slices and continues exactly as the unsharded run resumed from
// the same checkpoint (which reads the slices whole). A missing slice is refused by name.
TEST(Shard, ResumesOnTheSameCountExactlyAndReslicesOnAnother) {
  const std::string args = kJob + " --student.shard optimizer --checkpoint.every 4 --checkpoint.keep 0";
  auto straight = test::launch_train(3, run_dir("straight") + args);
  ASSERT_EQ(straight.code, 0) << straight.output;
  const auto step4 = root() / "straight" / "checkpoints" / "step-00000004";
  for (const char* slice : {"optimizer-slice-00000-of-00002.safetensors", "optimizer-slice-00001-of-00002.safetensors"}) {
    EXPECT_TRUE(fs::exists(step4 / slice)) << slice;
  }
  auto same = test::launch_train(3, run_dir("same") + args + " --resume " + step4.string());
  ASSERT_EQ(same.code, 0) << same.output;
  test::expect_resumed_exactly(root() / "straight", root() / "same", 12, 4);

  // A slice gone: the resume stops before training and names the file.
  const auto broken = root() / "broken";
  fs::create_directories(broken);
  fs::copy(step4, broken / "step-00000004", fs::copy_options::recursive);
  fs::remove(broken / "step-00000004" / "optimizer-slice-00001-of-00002.safetensors");
  auto refused = test::launch_train(3, run_dir("refused-resume") + args + " --resume " +
                                           (broken / "step-00000004").string());
  EXPECT_NE(refused.code, 0) << refused.output;
  EXPECT_NE(refused.output.find("optimizer-slice-00001-of-00002.safetensors"), std::string::npos) << refused.output;

  // 2 -> 4 students at step 4, then 4 -> 3 at step 8; each leg against its unsharded twin.
  for (const auto& [name, from, ranks] : {std::tuple{std::string("four"), step4, 5},
                                          std::tuple{std::string("three"),
                                                     root() / "four-sharded" / "checkpoints" / "step-00000008", 4}}) {
    SCOPED_TRACE(name);
    // The checkpoint is the same whatever the sharding: a gradients run resumes it too.
    for (const std::string mode : {"sharded", "plain", "scattered", "gathered"}) {
      const std::string shard = mode == "sharded"     ? " --student.shard optimizer"
                                : mode == "scattered" ? kGradients
                                : mode == "gathered"  ? kParameters
                                                      : "";
      const auto r = test::launch_train(ranks, run_dir(name + "-" + mode) + kJob + " --checkpoint.every 4 --resume " +
                                                   from.string() + shard);
      ASSERT_EQ(r.code, 0) << r.output;
    }
    const auto b = test::losses(root() / (name + "-plain"));
    ASSERT_FALSE(b.empty());
    for (const std::string mode : {"sharded", "scattered", "gathered"}) {
      const auto a = test::losses(root() / (name + "-" + mode));
      ASSERT_EQ(a.size(), b.size()) << mode;
      for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << mode << " step " << i;
    }
  }
  // student.shard gradients and parameters resumed on their own count: bit for bit (parameters:
  // the checkpoint gathers the whole student for its writer, the resume reads it whole and each
  // student takes its slice again).
  for (const auto& [name, shard] : {std::pair{std::string("scattered"), kGradients},
                                    std::pair{std::string("gathered"), kParameters}}) {
    const std::string args = kJob + shard + " --checkpoint.every 4 --checkpoint.keep 0";
    auto straight = test::launch_train(3, run_dir(name + "-straight") + args);
    ASSERT_EQ(straight.code, 0) << straight.output;
    auto again = test::launch_train(3, run_dir(name + "-same") + args + " --resume " +
                                           (root() / (name + "-straight") / "checkpoints" / "step-00000004").string());
    ASSERT_EQ(again.code, 0) << again.output;
    test::expect_resumed_exactly(root() / (name + "-straight"), root() / (name + "-same"), 12, 4);
  }
}

// train.objective dmd: the critic shards with the student (the same code), and a run resumed
// mid-cycle from a sharded checkpoint continues bit for bit.
TEST(Shard, TheDmdCriticShardsWithTheStudentAndResumesMidCycle) {
  const std::string args = " --train.objective dmd --train.log_every 1 --train.steps 12 --checkpoint.every 6"
                           " --checkpoint.keep 0 --teacher.compute fp32";
  auto plain = test::launch_train(3, run_dir("dmd-plain") + args);
  ASSERT_EQ(plain.code, 0) << plain.output;
  auto sharded = test::launch_train(3, run_dir("dmd-sharded") + args + " --student.shard optimizer");
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  EXPECT_NE(sharded.output.find("(the last slice 0 padding) of the dmd critic"), std::string::npos) << sharded.output;
  test::expect_close_losses(root() / "dmd-plain", root() / "dmd-sharded", 12);
  const auto step6 = root() / "dmd-sharded" / "checkpoints" / "step-00000006";  // inside the second cycle
  EXPECT_TRUE(fs::exists(step6 / "critic" / "optimizer-slice-00001-of-00002.safetensors"));
  auto resumed = test::launch_train(3, run_dir("dmd-resumed") + args + " --student.shard optimizer --resume " +
                                           step6.string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  test::expect_resumed_exactly(root() / "dmd-sharded", root() / "dmd-resumed", 12, 6);
  // Sharded gradients: the critic's reduce-scatter runs while the generator's hooks stay quiet
  // (the generator's loss runs through the critic, whose grads then are not the critic's step's).
  auto scattered = test::launch_train(3, run_dir("dmd-scattered") + args + kGradients);
  ASSERT_EQ(scattered.code, 0) << scattered.output;
  test::expect_close_losses(root() / "dmd-plain", root() / "dmd-scattered", 12);
  // Sharded weights: generator and critic gather their blocks for each use (the generator's loss
  // runs through the critic's, gathered again in its backward); the same students as sharded
  // gradients write, and a resume mid-cycle continues bit for bit.
  auto scattered_all = test::launch_train(3, run_dir("dmd-scattered-all") + args + kGradients + kAll);
  ASSERT_EQ(scattered_all.code, 0) << scattered_all.output;
  auto gathered = test::launch_train(3, run_dir("dmd-gathered") + args + kParameters);
  ASSERT_EQ(gathered.code, 0) << gathered.output;
  EXPECT_NE(gathered.output.find("gradients and weights for 75648 of 151296 parameters (the last slice 0 padding) of "
                                 "the dmd critic"),
            std::string::npos)
      << gathered.output;
  const auto student = [&](const std::string& run) {
    return file_bytes(root() / run / "student" / "diffusion_pytorch_model.safetensors");
  };
  EXPECT_FALSE(student("dmd-gathered").empty());
  EXPECT_TRUE(student("dmd-gathered") == student("dmd-scattered-all")) << "the students differ";
  auto gathered_resumed = test::launch_train(3, run_dir("dmd-gathered-resumed") + args + kParameters + " --resume " +
                                                    (root() / "dmd-gathered" / "checkpoints" / "step-00000006").string());
  ASSERT_EQ(gathered_resumed.code, 0) << gathered_resumed.output;
  test::expect_resumed_exactly(root() / "dmd-gathered", root() / "dmd-gathered-resumed", 12, 6);
}

// DMD2's GAN term with sharded weights: the realism classifier runs the critic's gathered blocks
// in the critic's update (real and fake) and, with its graph into x̂0 only, in the generator's;
// its two linears are critic tensors, sliced with the blocks. The students and critics equal the
// sharded-gradients run's, which differ from the unsharded run's only by reduction order.
TEST(Shard, TheDmdGanTermTrainsWithAGatheredCritic) {
  const std::string args = " --train.objective dmd --train.log_every 1 --train.steps 10 --checkpoint.every 10"
                           " --checkpoint.keep 0 --teacher.compute fp32 --critic.gan_weight 1e-2 --train.gan_weight 5e-2";
  auto plain = test::launch_train(3, run_dir("gan-plain") + args);
  ASSERT_EQ(plain.code, 0) << plain.output;
  auto scattered = test::launch_train(3, run_dir("gan-scattered-all") + args + kGradients + kAll);
  ASSERT_EQ(scattered.code, 0) << scattered.output;
  auto gathered = test::launch_train(3, run_dir("gan-gathered") + args + kParameters);
  ASSERT_EQ(gathered.code, 0) << gathered.output;
  EXPECT_NE(gathered.output.find("dmd GAN term (DMD2)"), std::string::npos) << gathered.output;
  test::expect_close_losses(root() / "gan-plain", root() / "gan-gathered", 10);
  const auto bytes = [&](const std::string& run, const std::string& file) {
    return file_bytes(root() / run / "checkpoints" / "step-00000010" / file);
  };
  for (const std::string file : {"student/diffusion_pytorch_model.safetensors", "critic/trainable.safetensors"}) {
    EXPECT_FALSE(bytes("gan-gathered", file).empty()) << file;
    EXPECT_TRUE(bytes("gan-gathered", file) == bytes("gan-scattered-all", file)) << file << " differs";
  }
}

TEST(Shard, RefusesWhatItDoesNotDo) {
  auto r = test::launch_refused(3, run_dir("refused") + kJob + " --student.shard weights");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("student.shard(weights) must be one of none, optimizer, gradients, parameters"), std::string::npos)
      << r.output;
  // student.shard parameters: what it needs, said before anything trains.
  for (const auto& [extra, said] :
       {std::pair{std::string(" --student.shard parameters"), "it needs student.checkpointing all, not off"},
        std::pair{kParameters + " --student.precision bf16-mixed", "student.precision(bf16-mixed) is not built with it"},
        std::pair{kParameters + " --train.ema_decay 0.9", "train.ema_decay with student.shard parameters"},
        std::pair{kParameters + " --train.sample_every 4", "train.sample_every with student.shard parameters"}}) {
    r = test::launch_refused(3, run_dir("refused-parameters") + kJob + extra);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(said), std::string::npos) << extra << "\n" << r.output;
  }
  // One student: nothing to split, said once, trained as unsharded.
  r = test::launch_train(2, run_dir("one") + kBase + " --student.shard optimizer --train.steps 2");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("student.shard optimizer: one student, nothing to split"), std::string::npos) << r.output;
  r = test::launch_train(2, run_dir("one-gradients") + kBase + kGradients + " --train.steps 2");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("student.shard gradients: one student, nothing to split"), std::string::npos) << r.output;
  r = test::launch_train(2, run_dir("one-parameters") + kBase + kParameters + " --train.steps 2");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("student.shard parameters: one student, nothing to split"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace wd::test_shard_launch
