// LoRA students (student.lora_rank) as `train` runs them: the teacher's frozen base plus adapters,
// trained by the guided and dmd objectives (the dmd critic adapters over the same base), saved as
// a LoRA folder that `convert` merges or exports; resumed bit for bit; with sharded gradients,
// checkpointed blocks and accumulation the same curve; bad combinations refused before training.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "launch_util.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"

namespace wd::test_lora_launch {
namespace {

namespace fs = std::filesystem;

const fs::path& root() {
  static const fs::path dir = test::fresh_dir("lora");
  return dir;
}

std::string run_dir(const std::string& name) { return " --run-dir " + (root() / name).string(); }

// The builtin tiny teacher (dim 128, 4 blocks, bf16): rank 4, alpha 8 on attn and ffn (40
// linears, 45056 adapter parameters). guided: a target the teacher itself misses (g = 5), so the
// adapters have something to learn. eval_samples 8: a multiple of 1, 2 and 4 students' batch.
const std::string kLora = " --student.lora_rank 4 --student.lora_alpha 8 --train.objective guided --train.lr 2e-3"
                          " --train.log_every 1 --train.eval_samples 8";
const std::string kJob = kLora + " --train.steps 12";

/// The number after `label` in a run's log (the first student's line).
double held_out_error(const std::string& log, const std::string& label) {
  const auto at = log.find(label);
  EXPECT_NE(at, std::string::npos) << label << "\n" << log;
  return at == std::string::npos ? -1.0 : std::stod(log.substr(at + label.size()));
}

TEST(Lora, AGuidedLoraStudentLearnsSavesAFolderAndResumesExactly) {
  const std::string args = kJob + " --checkpoint.every 4 --checkpoint.keep 0";
  auto straight = test::launch_train(3, run_dir("straight") + args);
  ASSERT_EQ(straight.code, 0) << straight.output;
  EXPECT_NE(straight.output.find("LoRA student: rank 4 alpha 8 on 40 linears (45056 trainable parameters) over the "
                                 "frozen bf16 base of "),
            std::string::npos)
      << straight.output;
  const auto losses = test::losses(root() / "straight");
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  // RUN/student: the adapters and where the base is; no copy of the base.
  const auto student = root() / "straight" / "student";
  EXPECT_TRUE(fs::exists(student / "lora.json"));
  EXPECT_TRUE(fs::exists(student / "adapters.safetensors"));
  EXPECT_FALSE(fs::exists(student / "diffusion_pytorch_model.safetensors"));
  // A checkpoint's trainable tensors are the 80 adapters alone.
  const auto step4 = root() / "straight" / "checkpoints" / "step-00000004";
  const auto trainable = SafetensorsFile::open((step4 / "trainable.safetensors").string());
  EXPECT_EQ(trainable.tensors().size(), 80u);
  auto resumed = test::launch_train(3, run_dir("resumed") + args + " --resume " + step4.string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  test::expect_resumed_exactly(root() / "straight", root() / "resumed", 12, 4);

  // The folder opens as the merged model (every consumer of a checkpoint: convert, sample,
  // evaluate, teacher.checkpoint): the base's untouched tensors equal, adapted ones moved.
  const auto merged = WanCheckpoint::open(student.string());
  ASSERT_NE(merged.lora(), nullptr);
  const auto base = WanCheckpoint::open(merged.lora()->base);
  EXPECT_TRUE(torch::equal(merged.tensor("blocks.0.modulation"), base.tensor("blocks.0.modulation")));
  EXPECT_FALSE(torch::equal(merged.tensor("blocks.0.self_attn.q.weight"), base.tensor("blocks.0.self_attn.q.weight")));
  const auto converted = test::run_captured(std::string(WD_CLI) + " convert --input " + student.string() +
                                            " --output " + (root() / "merged").string() + " --dtype fp32 2>&1");
  ASSERT_EQ(converted.code, 0) << converted.output;
  EXPECT_NE(converted.output.find("is a LoRA student folder: writing its base"), std::string::npos) << converted.output;
  // `sample` reads the folder the same way: teacher and LoRA student from one noise.
  const auto sampled = test::run_captured(std::string(WD_CLI) + " sample --teacher.checkpoint " + merged.lora()->base +
                                          " --student " + student.string() + " --steps 4 --runtime.threads 1 2>&1");
  ASSERT_EQ(sampled.code, 0) << sampled.output;
  EXPECT_NE(sampled.output.find("relative MSE"), std::string::npos) << sampled.output;
  const auto exported = test::run_captured(std::string(WD_CLI) + " convert --input " + student.string() +
                                           " --output " + (root() / "exported").string() + " --layout lora 2>&1");
  ASSERT_EQ(exported.code, 0) << exported.output;
  EXPECT_TRUE(fs::exists(root() / "exported" / "pytorch_lora_weights.safetensors"));
  EXPECT_TRUE(fs::exists(root() / "exported" / "wan_lora_comfyui.safetensors"));
  const auto refused = test::run_captured(std::string(WD_CLI) + " convert --input " + merged.lora()->base +
                                          " --output " + (root() / "not-lora").string() + " --layout lora 2>&1");
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("has no lora.json"), std::string::npos) << refused.output;

  // Started from the exported diffusers file: the adapters the straight run ended with, so its
  // held-out error before any step is the straight run's after training.
  auto from_file = test::launch_train(
      3, run_dir("from-file") + kLora + " --train.steps 1 --student.lora_init " +
             (root() / "exported" / "pytorch_lora_weights.safetensors").string());
  ASSERT_EQ(from_file.code, 0) << from_file.output;
  EXPECT_NE(from_file.output.find("adapters from "), std::string::npos) << from_file.output;
  const double trained = held_out_error(straight.output, "eval after training: relative MSE ");
  const double started = held_out_error(from_file.output, "eval at step 0: relative MSE ");
  EXPECT_NEAR(started, trained, 1e-3 * trained);
  EXPECT_LT(trained, 0.95 * held_out_error(straight.output, "eval at step 0: relative MSE "));
}

// Two students with sharded gradients, checkpointed blocks and two micro-batches: the adapters'
// curve of plain data parallel (the base takes no part in any of them). Recomputed blocks repeat
// the forward exactly. The reduce-scatter sums the two students in another order than the
// all-reduce and the tiny teacher's base computes in bf16, which carries a last-bit difference of
// the adapters into the loss: within 1e-4 (measured 3e-5 by step 12), as for bf16-mixed students.
TEST(Lora, ShardingCheckpointingAndAccumulationTrainAlike) {
  auto plain = test::launch_train(3, run_dir("plain") + kJob);
  ASSERT_EQ(plain.code, 0) << plain.output;
  auto recomputed = test::launch_train(3, run_dir("recomputed") + kJob + " --student.checkpointing all");
  ASSERT_EQ(recomputed.code, 0) << recomputed.output;
  test::expect_close_losses(root() / "plain", root() / "recomputed", 12);
  auto sharded = test::launch_train(3, run_dir("sharded") + kJob + " --student.shard gradients --comm.bucket_mb 0.05");
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  EXPECT_NE(sharded.output.find("keeps AdamW moments and gradients for 22528 of 45056 parameters"), std::string::npos)
      << sharded.output;
  test::expect_close_losses(root() / "plain", root() / "sharded", 12, 1e-4);
  // bf16-mixed: the base is bf16 (the tiny teacher's file already is), the adapters fp32; the
  // same curve as the fp32 setting, whose base also computes in bf16.
  auto mixed = test::launch_train(3, run_dir("mixed") + kJob + " --student.precision bf16-mixed");
  ASSERT_EQ(mixed.code, 0) << mixed.output;
  EXPECT_NE(mixed.output.find("over the frozen bf16 base"), std::string::npos) << mixed.output;
  test::expect_close_losses(root() / "plain", root() / "mixed", 12);
  auto accumulated = test::launch_train(2, run_dir("accumulated") + kLora +
                                               " --train.steps 6 --train.batch_size 1 --train.grad_accum 2");
  ASSERT_EQ(accumulated.code, 0) << accumulated.output;
  EXPECT_EQ(test::losses(root() / "accumulated").size(), 6u);
}

// dmd: generator and critic are adapters over one base (each checkpoints its 80 adapters alone),
// and a resume in the middle of a critic phase continues bit for bit.
TEST(Lora, DmdTrainsLoraGeneratorAndCriticOverOneBase) {
  const std::string args = " --student.lora_rank 4 --train.objective dmd --train.steps 10 --train.log_every 1"
                           " --train.eval_samples 8 --checkpoint.every 3 --checkpoint.keep 0";
  auto straight = test::launch_train(2, run_dir("dmd") + args);
  ASSERT_EQ(straight.code, 0) << straight.output;
  const auto step3 = root() / "dmd" / "checkpoints" / "step-00000003";
  // The generator's and the critic's trainable tensors: 80 adapters each, no base tensor.
  EXPECT_EQ(SafetensorsFile::open((step3 / "trainable.safetensors").string()).tensors().size(), 80u);
  EXPECT_EQ(SafetensorsFile::open((step3 / "critic" / "trainable.safetensors").string()).tensors().size(), 80u);
  EXPECT_TRUE(fs::exists(step3 / "student" / "lora.json"));
  auto resumed = test::launch_train(2, run_dir("dmd-resumed") + args + " --resume " + step3.string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  test::expect_resumed_exactly(root() / "dmd", root() / "dmd-resumed", 10, 3);
}

// A two-expert (A14B-like) teacher: one LoRA run per expert (student.expert), each over its own
// expert's base and on its own side of the boundary (t 875 for t2v): the high run's trajectory
// intervals are the two that start at t >= 875 (t = 1000, 937.5 of the 4-step shift-5 grid),
// held-out intervals outside it unscored; the low run (guided) learns below it. The two folders
// as a pair sample with the teacher's routing, and export as the A14B pair of files; a pair put
// together the wrong way round is refused, as are the combinations not built (a pair with
// feature matching; dmd, rollouts and sampling probes of one expert).
/// A tiny two-expert teacher (two different random experts, t2v: boundary t 875) in `name`: one
/// per test (ctest may run the cases of this file side by side).
std::string a14b_teacher(const std::string& name) {
  const auto a14b = (root() / name).string();
  const auto made = test::run_captured(std::string(WD_CLI) + " init-teacher --preset tiny --experts 2 --dtype bf16 "
                                       "--seed 3 --output " + a14b + " 2>&1");
  EXPECT_EQ(made.code, 0) << made.output;
  return a14b;
}

TEST(Lora, TwoExpertTeacherTrainsOneAdapterSetPerExpertOnItsOwnTRange) {
  const auto a14b = a14b_teacher("a14b");
  const std::string common = " --teacher.checkpoint " + a14b + " --student.lora_rank 4 --student.lora_alpha 8"
                             " --train.lr 2e-3 --train.log_every 1 --train.eval_samples 8";
  auto high = test::launch_train(3, run_dir("high") + common + " --student.expert high --train.objective trajectory"
                                                               " --teacher.steps 8 --train.steps 8");
  ASSERT_EQ(high.code, 0) << high.output;
  EXPECT_NE(high.output.find("over the frozen bf16 base of " + a14b + "/high_noise_model"), std::string::npos)
      << high.output;
  EXPECT_NE(high.output.find("the student learns intervals 0, 1 of 4 (those starting at t >= 875)"), std::string::npos)
      << high.output;
  EXPECT_NE(high.output.find(", -, -)"), std::string::npos) << high.output;  // intervals 2 and 3: no held-out sample
  auto low = test::launch_train(3, run_dir("low") + common + " --student.expert low --train.objective guided"
                                                             " --train.steps 8");
  ASSERT_EQ(low.code, 0) << low.output;
  EXPECT_NE(low.output.find("over the frozen bf16 base of " + a14b + "/low_noise_model"), std::string::npos)
      << low.output;
  EXPECT_NE(low.output.find("trained on t < 875 only"), std::string::npos) << low.output;
  // guided never reaches the high expert: the teacher rank loads the low one alone; a trajectory
  // run samples across the boundary and loads both.
  EXPECT_NE(low.output.find("the teacher loads its low expert alone (" + a14b + "/low_noise_model)"), std::string::npos)
      << low.output;
  EXPECT_EQ(high.output.find("expert alone"), std::string::npos) << high.output;
  const auto low_losses = test::losses(root() / "low");
  ASSERT_EQ(low_losses.size(), 8u);
  EXPECT_LT(low_losses.back(), low_losses.front());

  // The pair: the two RUN/student folders as high_noise_model/ and low_noise_model/.
  const auto pair = root() / "pair", swapped = root() / "swapped";
  fs::create_directories(pair);
  fs::create_directories(swapped);
  fs::create_directory_symlink(root() / "high" / "student", pair / "high_noise_model");
  fs::create_directory_symlink(root() / "low" / "student", pair / "low_noise_model");
  fs::create_directory_symlink(root() / "low" / "student", swapped / "high_noise_model");
  fs::create_directory_symlink(root() / "high" / "student", swapped / "low_noise_model");
  const auto sampled = test::run_captured(std::string(WD_CLI) + " sample --teacher.checkpoint " + a14b + " --student " +
                                          pair.string() + " --steps 4 --runtime.threads 1 2>&1");
  ASSERT_EQ(sampled.code, 0) << sampled.output;
  EXPECT_NE(sampled.output.find("student: two experts, high_noise_model/ for t >= 875 and low_noise_model/ below (a "
                                "LoRA pair"),
            std::string::npos)
      << sampled.output;
  const auto exported = test::run_captured(std::string(WD_CLI) + " convert --input " + pair.string() + " --output " +
                                           (root() / "pair-export").string() + " --layout lora 2>&1");
  ASSERT_EQ(exported.code, 0) << exported.output;
  for (const auto* expert : {"high_noise_model", "low_noise_model"}) {
    for (const auto* file : {"pytorch_lora_weights.safetensors", "wan_lora_comfyui.safetensors"}) {
      EXPECT_TRUE(fs::exists(root() / "pair-export" / expert / file)) << expert << "/" << file;
    }
  }
  // Each expert's file holds its own run's adapters (the high run's moved only where it trained).
  const auto high_file = SafetensorsFile::open((root() / "pair-export" / "high_noise_model" / "wan_lora_comfyui.safetensors").string());
  const auto high_adapters = SafetensorsFile::open((root() / "high" / "student" / "adapters.safetensors").string());
  EXPECT_TRUE(torch::equal(high_file.tensor("diffusion_model.blocks.0.self_attn.q.lora_down.weight", torch::kFloat),
                           high_adapters.tensor("blocks.0.self_attn.q.lora_down", torch::kFloat).to(torch::kBFloat16).to(torch::kFloat)));
  // Put together the wrong way round: refused, naming the lora.json and its base.
  const auto swapped_export = test::run_captured(std::string(WD_CLI) + " convert --layout lora --input " +
                                                 swapped.string() + " --output " + (root() / "swapped-export").string() +
                                                 " 2>&1");
  EXPECT_NE(swapped_export.code, 0) << swapped_export.output;
  EXPECT_NE(swapped_export.output.find("not the high-noise expert"), std::string::npos) << swapped_export.output;
  EXPECT_FALSE(fs::exists(root() / "swapped-export"));
  const auto swapped_sample = test::run_captured(std::string(WD_CLI) + " sample --teacher.checkpoint " + a14b +
                                                 " --student " + swapped.string() + " --steps 2 2>&1");
  EXPECT_NE(swapped_sample.code, 0) << swapped_sample.output;
  EXPECT_NE(swapped_sample.output.find("lora.json: base"), std::string::npos) << swapped_sample.output;

  struct Case {
    std::string args, message;
  };
  const Case refused[] = {
      {" --train.objective guided --student.features 1:1", "student.features with a LoRA student of the two-expert"},
      {" --student.expert high --train.objective dmd", "with train.objective dmd: the generator samples across"},
      {" --student.expert high --train.objective guided --train.sample_every 2", "with train.sample_every > 0"},
      {" --student.expert low --train.objective trajectory --student.steps 1 --teacher.steps 8",
       "none of the student's student.steps(1) intervals"},
      {" --student.expert high --train.objective guided --noise.sigma_max 0.5", "puts only 0 of 256 draws in t >= 875"},
  };
  for (const auto& c : refused) {
    SCOPED_TRACE(c.args);
    auto r = test::launch_refused(3, run_dir("refused-expert") + common + " --train.steps 2" + c.args);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
  // A colocated teacher of one expert lends the LoRA student that expert's tensors.
  auto colocated = test::launch_train(2, run_dir("colocated-low") + common + " --student.expert low"
                                                                          " --train.objective guided --train.steps 2"
                                                                          " --teacher.placement colocated");
  ASSERT_EQ(colocated.code, 0) << colocated.output;
  EXPECT_NE(colocated.output.find("the teacher loads its low expert alone"), std::string::npos) << colocated.output;
  EXPECT_NE(colocated.output.find("tensors are the colocated teacher's own"), std::string::npos) << colocated.output;
  EXPECT_EQ(colocated.output.find("; 0 of its"), std::string::npos) << colocated.output;
  // A full (not LoRA) student of one expert: its copied blocks are that expert's.
  auto full = test::launch_train(3, run_dir("full-high") + " --teacher.checkpoint " + a14b +
                                        " --student.expert high --train.objective guided --noise.shift 5"
                                        " --student.dim 128 --student.ffn_dim 256 --student.num_heads 4"
                                        " --student.num_layers 2 --student.init teacher-blocks:0,3 --train.steps 3"
                                        " --train.eval_samples 8");
  ASSERT_EQ(full.code, 0) << full.output;
  EXPECT_NE(full.output.find("the teacher loads its high expert alone"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("a student of the teacher's high expert (" + a14b + "/high_noise_model), trained on "
                             "t >= 875 only"),
            std::string::npos)
      << full.output;
}

// A two-expert teacher without student.expert: one job trains both experts' adapters (a LoRA
// pair), each sample through the expert the teacher routes it to. Every trajectory interval is
// scored; RUN/student is the pair's two folders, which sample and convert read as a pair, each
// over its own expert; a resume continues bit for bit. dmd trains a pair generator and a pair
// critic, a colocated teacher lends each expert's tensors, and the pair starts from a pair.
TEST(Lora, ATwoExpertTeacherTrainsALoraPairInOneJob) {
  const auto a14b = a14b_teacher("a14b-pair");
  const std::string common = " --teacher.checkpoint " + a14b + " --student.lora_rank 4 --student.lora_alpha 8"
                             " --train.lr 2e-3 --train.log_every 1 --train.eval_samples 8 --train.objective trajectory"
                             " --teacher.steps 8";
  const std::string args = common + " --train.steps 8 --checkpoint.every 4 --checkpoint.keep 0";
  auto straight = test::launch_train(3, run_dir("pair-job") + args);
  ASSERT_EQ(straight.code, 0) << straight.output;
  EXPECT_NE(straight.output.find("LoRA pair: one adapter set per expert of " + a14b), std::string::npos)
      << straight.output;
  for (const auto* expert : {"high", "low"}) {
    EXPECT_NE(straight.output.find(std::string("LoRA student (") + expert + " expert of the pair): rank 4 alpha 8 on 40 "
                                   "linears (45056 trainable parameters) over the frozen bf16 base of " + a14b + "/" +
                                   expert + "_noise_model"),
              std::string::npos)
        << straight.output;
  }
  EXPECT_EQ(straight.output.find("student.expert"), std::string::npos) << straight.output;
  EXPECT_EQ(straight.output.find(", -"), std::string::npos) << straight.output;  // every interval scored
  const auto losses = test::losses(root() / "pair-job");
  ASSERT_EQ(losses.size(), 8u);
  // The checkpoint's trainable tensors: both experts' 80 adapters, under their folders' names.
  const auto step4 = root() / "pair-job" / "checkpoints" / "step-00000004";
  const auto trainable = SafetensorsFile::open((step4 / "trainable.safetensors").string());
  EXPECT_EQ(trainable.tensors().size(), 160u);
  EXPECT_NO_THROW(trainable.tensor("high_noise_model.blocks.0.self_attn.q.lora_up", torch::kFloat));
  EXPECT_NO_THROW(trainable.tensor("low_noise_model.blocks.0.self_attn.q.lora_up", torch::kFloat));
  // Both experts learned: their up matrices left zero.
  const auto student = root() / "pair-job" / "student";
  for (const auto* expert : {"high_noise_model", "low_noise_model"}) {
    const auto adapters = SafetensorsFile::open((student / expert / "adapters.safetensors").string());
    EXPECT_GT(adapters.tensor("blocks.0.self_attn.q.lora_up", torch::kFloat).abs().max().item<double>(), 0) << expert;
    const auto base = WanCheckpoint::open((student / expert).string());
    ASSERT_NE(base.lora(), nullptr) << expert;
    EXPECT_EQ(fs::path(base.lora()->base).filename(), expert);
  }
  auto resumed = test::launch_train(3, run_dir("pair-resumed") + args + " --resume " + step4.string());
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  test::expect_resumed_exactly(root() / "pair-job", root() / "pair-resumed", 8, 4);
  const auto sampled = test::run_captured(std::string(WD_CLI) + " sample --teacher.checkpoint " + a14b + " --student " +
                                          student.string() + " --steps 4 --runtime.threads 1 2>&1");
  ASSERT_EQ(sampled.code, 0) << sampled.output;
  EXPECT_NE(sampled.output.find("(a LoRA pair"), std::string::npos) << sampled.output;
  const auto exported = test::run_captured(std::string(WD_CLI) + " convert --input " + student.string() + " --output " +
                                           (root() / "pair-job-export").string() + " --layout lora 2>&1");
  ASSERT_EQ(exported.code, 0) << exported.output;
  EXPECT_TRUE(fs::exists(root() / "pair-job-export" / "low_noise_model" / "pytorch_lora_weights.safetensors"));

  // Started from the trained pair: its held-out error before any step is the trained one's.
  auto from_pair = test::launch_train(3, run_dir("pair-from-pair") + common + " --train.steps 1"
                                                                        " --student.lora_init " + student.string());
  ASSERT_EQ(from_pair.code, 0) << from_pair.output;
  EXPECT_NEAR(held_out_error(from_pair.output, "eval at step 0: relative MSE "),
              held_out_error(straight.output, "eval after training: relative MSE "), 1e-4);
  // One expert's folder is no start for a pair: refused at start-up, naming it.
  auto one_folder = test::launch_train(3, run_dir("pair-from-one") + common + " --train.steps 1 --student.lora_init " +
                                              (student / "high_noise_model").string());
  EXPECT_EQ(one_folder.code, 2) << one_folder.output;
  EXPECT_NE(one_folder.output.find((student / "high_noise_model").string() + " is no LoRA pair"), std::string::npos)
      << one_folder.output;

  // dmd: the generator and the critic are pairs (80 adapters per expert each).
  const std::string dmd = " --teacher.checkpoint " + a14b + " --student.lora_rank 4 --train.objective dmd"
                          " --train.steps 6 --train.log_every 1 --train.eval_samples 8 --checkpoint.every 3"
                          " --checkpoint.keep 0";
  auto dmd_run = test::launch_train(3, run_dir("pair-dmd") + dmd);
  ASSERT_EQ(dmd_run.code, 0) << dmd_run.output;
  const auto dmd3 = root() / "pair-dmd" / "checkpoints" / "step-00000003";
  EXPECT_EQ(SafetensorsFile::open((dmd3 / "trainable.safetensors").string()).tensors().size(), 160u);
  EXPECT_EQ(SafetensorsFile::open((dmd3 / "critic" / "trainable.safetensors").string()).tensors().size(), 160u);
  EXPECT_TRUE(fs::exists(dmd3 / "student" / "high_noise_model" / "lora.json"));
  // A colocated teacher holds both experts: each of the pair's bases is its expert's tensors.
  auto colocated = test::launch_train(2, run_dir("pair-colocated") + common + " --train.steps 2"
                                                                        " --teacher.placement colocated");
  ASSERT_EQ(colocated.code, 0) << colocated.output;
  EXPECT_NE(colocated.output.find(a14b + "/high_noise_model; 123 of its 123 tensors are the colocated teacher's own"),
            std::string::npos)
      << colocated.output;
  EXPECT_NE(colocated.output.find(a14b + "/low_noise_model; 123 of its 123 tensors are the colocated teacher's own"),
            std::string::npos)
      << colocated.output;
}

// teacher.placement colocated: the student's frozen base is the colocated teacher's own tensors
// (bound, not loaded again: one copy for teacher and student, and a LoRA critic binds the
// student's). Sharing changes nothing: a colocated teacher converted to fp32 (teacher.dtype fp32:
// no tensor in the bf16 base's dtype, nothing shared) gives the same curve to the last bit, its
// fp32 weights being the bf16 ones widened and the teacher computing in fp32 either way. A
// dedicated teacher rank gives the same curve within 1e-4: its micro-batches differ, so the
// target differs in the last bits (1e-6, as the objectives' colocated tests), and the bf16 base
// carries that into the adapters' updates (measured up to 2.5e-5 relative in 12 steps).
TEST(Lora, AColocatedTeacherLendsTheStudentItsTensorsAndTrainsAsWithoutSharing) {
  const std::string colocated = kJob + " --teacher.compute fp32 --teacher.placement colocated";
  auto shared = test::launch_train(2, run_dir("colocated") + colocated);
  ASSERT_EQ(shared.code, 0) << shared.output;
  const std::string tail = " tensors are the colocated teacher's own (one copy)";
  const auto at = shared.output.find(tail);
  ASSERT_NE(at, std::string::npos) << shared.output;
  // "...; N of its M tensors are ...": every tensor (N = M).
  const auto head = shared.output.rfind("; ", at);
  const auto counts = shared.output.substr(head + 2, at - head - 2);
  const auto of = counts.find(" of its ");
  ASSERT_NE(of, std::string::npos) << counts;
  EXPECT_EQ(counts.substr(0, of), counts.substr(of + 8)) << counts;
  EXPECT_NE(counts.substr(0, of), "0") << counts;
  auto apart = test::launch_train(2, run_dir("colocated-fp32") + colocated + " --teacher.dtype fp32");
  ASSERT_EQ(apart.code, 0) << apart.output;
  EXPECT_NE(apart.output.find("; 0 of its"), std::string::npos) << apart.output;
  const auto a = test::losses(root() / "colocated"), b = test::losses(root() / "colocated-fp32");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  auto dedicated = test::launch_train(3, run_dir("dedicated") + kJob + " --teacher.compute fp32");
  ASSERT_EQ(dedicated.code, 0) << dedicated.output;
  EXPECT_EQ(dedicated.output.find("colocated teacher's own"), std::string::npos) << dedicated.output;
  test::expect_close_losses(root() / "dedicated", root() / "colocated", 12, 1e-4);
}

TEST(Lora, BadCombinationsAreRefusedBeforeTraining) {
  // A rank-4 ComfyUI-layout LoRA of the tiny teacher's first query (128 x 128).
  fs::create_directories(root());
  const auto rank4 = (root() / "rank4.safetensors").string();
  write_safetensors(rank4, {{"diffusion_model.blocks.0.self_attn.q.lora_down.weight", torch::zeros({4, 128})},
                            {"diffusion_model.blocks.0.self_attn.q.lora_up.weight", torch::zeros({128, 4})}});
  struct Case {
    int ranks;
    std::string args, message;
  };
  const Case cases[] = {
      {2, " --student.lora_rank 4 --student.init teacher-blocks:0,1", "exclude each other"},
      {2, " --student.lora_rank 4 --student.lora_targets attn,mlp --train.objective guided", "unknown target 'mlp'"},
      {2, " --student.lora_init " + rank4, "needs student.lora_rank > 0"},
      {1, " --student.lora_rank 4 --train.objective flow --teacher.ranks 0", "needs a teacher.checkpoint as its base"},
      {2, " --student.lora_rank 4 --train.objective guided --student.expert high", "needs a two-expert (A14B) teacher"},
      {2, " --student.lora_rank 8 --train.objective guided --student.lora_init " + rank4,
       "holds rank-4 adapters; student.lora_rank is 8"},
      {2, " --student.lora_rank 4", "with train.objective velocity: a LoRA student starts as the teacher"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = test::launch_refused(c.ranks, run_dir("refused") + " --train.steps 2" + c.args);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

// An I2V-A14B-shaped pair (tiny dims, two i2v experts, boundary 0.9): one job trains both experts'
// adapters on the teacher's conditioned trajectories (y in every forward), the pair samples with
// the data set's images and exports per expert.
TEST(Lora, AnI2vExpertPairLearnsConditionedTrajectoriesSamplesAndExports) {
  const auto pair = (root() / "i2v-a14b").string();
  const auto made = test::run_captured(std::string(WD_CLI) + " init-teacher --preset tiny --experts 2 --model-type i2v "
                                       "--in-dim 36 --out-dim 16 --dtype bf16 --seed 3 --output " + pair + " 2>&1");
  ASSERT_EQ(made.code, 0) << made.output;
  const auto r = test::launch_train(3, run_dir("i2v-pair-job") + " --teacher.checkpoint " + pair +
                                           " --student.lora_rank 4 --student.lora_alpha 8 --train.lr 2e-3"
                                           " --train.log_every 1 --train.eval_samples 8 --train.objective trajectory"
                                           " --teacher.steps 8 --train.steps 4 --log.level info");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA pair: one adapter set per expert of " + pair), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("for t >= 900"), std::string::npos) << r.output;  // I2V-A14B's boundary 0.9
  const auto student = (root() / "i2v-pair-job" / "student").string();
  const auto data = (root() / "i2v-pair-job" / "cache" / "tiny-data.h5").string();
  const auto sampled = test::run_captured(std::string(WD_CLI) + " sample --teacher.checkpoint " + pair + " --student " +
                                          student + " --data.path " + data + " --samples 0,1 --steps 2"
                                          " --runtime.threads 1 2>&1");
  EXPECT_EQ(sampled.code, 0) << sampled.output;
  const auto exported = (root() / "i2v-pair-export").string();
  const auto converted = test::run_captured(std::string(WD_CLI) + " convert --input " + student + " --output " +
                                            exported + " --layout lora 2>&1");
  ASSERT_EQ(converted.code, 0) << converted.output;
  for (const auto* expert : {"high_noise_model", "low_noise_model"}) {
    EXPECT_TRUE(fs::exists(fs::path(exported) / expert / "pytorch_lora_weights.safetensors")) << expert;
  }
}

}  // namespace
}  // namespace wd::test_lora_launch
