// The teacher cache launched for real: `generate` writes what a trajectory student (k = 4) would
// receive, and `train --data.teacher_cache` with no teacher rank trains bit for bit as the online
// run (1 teacher + 1 student) does, losses and weights (guided, velocity and i2v students too), resumes exactly,
// rolls out from the cached start states, and cycles past the cache's end (or, asked to stop, is
// refused before training); other keys are refused naming each; an altered shard stops the run
// before training naming the file and the message; 1, 2 and 4 generating ranks write the same
// cache, which 2 student ranks train from as from 2 teacher replicas; a generate killed mid-way
// resumes to the same cache. A cache of whole trajectories (generate --keep) trains students of
// other student.steps bit for bit as their online runs. A train that streams to its students writes the same cache as it goes
// (data.teacher_cache_write), unchanged in its own training; one whose teacher serves 2 students
// writes their 2 streams, which 2 student ranks train from as the writing run trained; one stopped
// for a requeue completes the cache when it resumes. A dmd student with the regression term (and the GAN term) reads its
// batches from the cache while a teacher rank, or its colocated teacher, answers its real score
// alone, bit for bit as online; dmd without the regression term, or with no live teacher, is refused.
// A sequence-parallel group writes and reads one stream, bit for bit as online.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch_util.hpp"

namespace wd::test_cache_launch {
namespace {

namespace fs = std::filesystem;

const fs::path& root() {
  static const fs::path dir = test::shared_dir("cache");
  return dir;
}

/// The builtin teacher and data set, made once: every run reads the same files.
std::string assets() {
  const auto dir = root() / "assets";
  return " --teacher.checkpoint " + (dir / "cache" / "tiny-teacher").string() + " --data.path " +
         (dir / "cache" / "tiny-data.h5").string();
}

/// A k = 4 trajectory student of the guided tiny teacher (8 teacher steps), fp32 throughout.
const std::string kTrajectory = " --train.objective trajectory --teacher.guidance 3 --teacher.steps 8 --student.steps 4"
                                " --teacher.shift 3 --teacher.compute fp32 --train.log_every 1 --train.seed 5"
                                " --train.eval_samples 4 --train.eval_every 6";
const std::string kSteps = " --train.steps 12";

test::LaunchResult generate(int ranks, const fs::path& out, const std::string& extra = "") {
  return test::launch_command(ranks, "generate", "--run-dir " + (out.string() + "-run") + assets() + kTrajectory +
                                                     kSteps + " --output " + out.string() + extra);
}

/// The shards' checksums of the cache at `dir`, by file name (the content, whatever rank wrote it).
std::map<std::string, std::string> shard_sums(const fs::path& dir) {
  const auto index = nlohmann::json::parse(std::ifstream(dir / "index.json"));
  std::map<std::string, std::string> out;
  for (const auto& s : index["shards"]) out[s["file"].get<std::string>()] = s["xxh64"].get<std::string>();
  return out;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Cache, SetupTheOnlineRunAndItsCache) {
  fs::remove_all(root());  // a cache left by an earlier run would be resumed, not generated
  fs::create_directories(root());
  auto r = test::launch_train(2, "--run-dir " + (root() / "assets").string() + " --train.steps 1 --log.level warn");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(2, "--run-dir " + (root() / "online").string() + assets() + kTrajectory + kSteps +
                                " --teacher.ranks 1");
  ASSERT_EQ(r.code, 0) << r.output;
  r = generate(1, root() / "cache");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("generate: 1 stream(s) of 2 held-out and 12 training messages of 2 sample(s), 2 shard(s)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ETA"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is complete (index.json written)"), std::string::npos) << r.output;
}

TEST(Cache, AStudentFromTheCacheTrainsBitForBitAsTheOnlineOne) {
  const auto dir = root() / "from-cache";
  const auto r = test::launch_train(1, "--run-dir " + dir.string() + assets() + kTrajectory + kSteps +
                                           " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train: data.teacher_cache"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every shard's checksum verified"), std::string::npos) << r.output;
  const auto online = test::losses(root() / "online"), cached = test::losses(dir);
  ASSERT_EQ(online.size(), 12u);
  ASSERT_EQ(cached.size(), 12u);
  for (std::size_t i = 0; i < online.size(); ++i) EXPECT_EQ(cached[i], online[i]) << "step " << i + 1;
  // The held-out evaluations (the cache's held-out messages) agree too.
  std::vector<double> a, b;
  for (const auto& j : test::read_metrics(root() / "online" / "metrics.jsonl")) {
    if (j.contains("eval_step")) a.push_back(j["rel_mse"].get<double>());
  }
  for (const auto& j : test::read_metrics(dir / "metrics.jsonl")) {
    if (j.contains("eval_step")) b.push_back(j["rel_mse"].get<double>());
  }
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  // The weights: the saved students are the same bytes.
  const auto weights = [](const fs::path& run) { return file_bytes(run / "student" / "diffusion_pytorch_model.safetensors"); };
  ASSERT_FALSE(weights(dir).empty());
  EXPECT_EQ(weights(dir), weights(root() / "online"));
}

/// A tiny i2v teacher (in_dim 36: 16 noisy + 4 mask + 16 image latent channels) and the data set
/// train makes for it (each sample with its image), made once.
std::string i2v_assets() {
  static const std::string args = [] {
    const auto dir = root() / "i2v-assets";
    const auto teacher = (dir / "teacher").string();
    const auto made = test::run_captured(std::string(WD_CLI) +
                                         " init-teacher --preset tiny --model-type i2v --in-dim 36 --out-dim 16"
                                         " --dtype bf16 --seed 4 --output " + teacher + " 2>&1");
    EXPECT_EQ(made.code, 0) << made.output;
    const auto r = test::launch_train(2, "--run-dir " + dir.string() + " --teacher.checkpoint " + teacher +
                                             " --train.steps 1 --log.level warn");
    EXPECT_EQ(r.code, 0) << r.output;
    return " --teacher.checkpoint " + teacher + " --data.path " + (dir / "cache" / "tiny-data.h5").string();
  }();
  return args;
}

// The guided target from the data and the teacher's forward (StageTargets), the velocity target
// (the same source unguided), and an i2v teacher's trajectories (y stored with every message and
// given to the student's forward), each through the cache.
TEST(Cache, GuidedVelocityAndI2vStudentsFromTheCacheTrainBitForBitAsTheOnlineOnes) {
  const std::string common = " --teacher.compute fp32 --train.steps 10 --train.log_every 1 --train.seed 5"
                             " --train.eval_samples 4";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"guided", assets() + " --train.objective guided --teacher.guidance 4"},
      {"velocity", assets() + " --train.objective velocity"},
      {"i2v-trajectory", i2v_assets() + " --train.objective trajectory --teacher.guidance 3 --teacher.steps 4"
                                        " --student.steps 2 --teacher.shift 3"},
  };
  for (const auto& [name, keys] : cases) {
    SCOPED_TRACE(name);
    const auto online = root() / (name + "-online"), cache = root() / (name + "-cache"),
               cached = root() / (name + "-cached");
    auto r = test::launch_train(2, "--run-dir " + online.string() + keys + common);
    ASSERT_EQ(r.code, 0) << r.output;
    r = test::launch_command(1, "generate", "--run-dir " + online.string() + "-gen" + keys + common + " --output " +
                                                cache.string());
    ASSERT_EQ(r.code, 0) << r.output;
    r = test::launch_train(1, "--run-dir " + cached.string() + keys + common + " --teacher.ranks 0 --data.teacher_cache " +
                                  cache.string());
    ASSERT_EQ(r.code, 0) << r.output;
    const auto a = test::losses(online), b = test::losses(cached);
    ASSERT_EQ(a.size(), 10u);
    EXPECT_EQ(a, b);
    EXPECT_EQ(file_bytes(cached / "student" / "diffusion_pytorch_model.safetensors"),
              file_bytes(online / "student" / "diffusion_pytorch_model.safetensors"));
  }
  // The i2v cache holds each message's image condition.
  const auto index = nlohmann::json::parse(std::ifstream(root() / "i2v-trajectory-cache" / "index.json"));
  EXPECT_NE(index.dump().find("\"y\""), std::string::npos) << index.dump().substr(0, 2000);
}

// dmd with the regression term and DMD2's GAN term (cycles of 5 steps: the generator updates
// after steps 5 and 10); the teacher in fp32.
const std::string kDmd = " --train.objective dmd --teacher.guidance 3 --student.steps 2 --teacher.steps 4"
                         " --teacher.shift 3 --teacher.compute fp32 --train.steps 10 --train.log_every 1"
                         " --train.seed 5 --train.eval_samples 4 --train.dmd_regression_weight 0.5"
                         " --critic.gan_weight 0.01 --critic.gan_block 0 --train.gan_weight 0.003";

/// The lines a dmd run logs for its generator updates and held-out errors, without their times.
std::vector<std::string> dmd_lines(const std::string& output) {
  std::vector<std::string> out;
  for (const std::string key : {"dmd step ", "eval at step ", "eval after training"}) {
    for (auto at = output.find(key); at != std::string::npos; at = output.find(key, at + 1)) {
      out.push_back(output.substr(at, output.find('\n', at) - at));
    }
  }
  return out;
}

/// The held-out relative MSE of each evaluation in a run's metrics.
std::vector<double> held_out(const fs::path& run) {
  std::vector<double> out;
  for (const auto& j : test::read_metrics(run / "metrics.jsonl")) {
    if (j.contains("eval_step")) out.push_back(j["rel_mse"].get<double>());
  }
  return out;
}

TEST(Cache, ADmdStudentWithItsRegressionTermFromTheCacheTrainsBitForBitAsTheOnlineOne) {
  // The cache holds the regression term's trajectories (dmd's batch stream); a teacher rank
  // beside it answers the real score alone, sending no batch.
  // The online run writes its batch stream too (data.teacher_cache_write): generate's cache again.
  const auto online = root() / "dmd-online", cache = root() / "dmd-cache", cached = root() / "dmd-cached";
  const auto written = root() / "dmd-written";
  auto on = test::launch_train(2, "--run-dir " + online.string() + assets() + kDmd +
                                      " --teacher.ranks 1 --data.teacher_cache_write " + written.string());
  ASSERT_EQ(on.code, 0) << on.output;
  auto r = test::launch_command(1, "generate", "--run-dir " + cache.string() + "-run" + assets() + kDmd + " --output " +
                                                   cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(shard_sums(written), shard_sums(cache));
  const auto from_cache = " --teacher.ranks 1 --data.teacher_cache " + cache.string();
  r = test::launch_train(2, "--run-dir " + cached.string() + assets() + kDmd + from_cache +
                                " --checkpoint.every 3 --checkpoint.keep 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("each reading its stream of the teacher's batches from the cache; the real score answered by "
                          "1 teacher rank(s), which send no batches"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("teacher real-score service: 4 samples answered"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("teacher done: 0 samples"), std::string::npos) << r.output;  // no batch streamed
  ASSERT_EQ(test::losses(online).size(), 10u);
  EXPECT_EQ(test::losses(cached), test::losses(online));
  const auto lines = dmd_lines(on.output);
  EXPECT_EQ(lines.size(), 4u) << on.output;  // two generator updates, two evaluations
  EXPECT_EQ(dmd_lines(r.output), lines);
  EXPECT_FALSE(held_out(online).empty());
  EXPECT_EQ(held_out(cached), held_out(online));
  // The weights: the saved student and the last checkpoint's critic, classifier included.
  for (const auto* file : {"student/diffusion_pytorch_model.safetensors",
                           "checkpoints/step-00000010/critic/trainable.safetensors"}) {
    ASSERT_FALSE(file_bytes(online / file).empty()) << file;
    EXPECT_EQ(file_bytes(cached / file), file_bytes(online / file)) << file;
  }
  // Resumed mid-cycle (the pending request's inputs in the checkpoint), it reads on from step 3.
  const auto resumed = root() / "dmd-cached-resumed";
  const auto res = test::launch_train(2, "--run-dir " + resumed.string() + assets() + kDmd + from_cache + " --resume " +
                                             (cached / "checkpoints" / "step-00000003").string());
  ASSERT_EQ(res.code, 0) << res.output;
  test::expect_resumed_exactly(cached, resumed, 10, 3);
  // Colocated: each student's own teacher answers its real score, the batches from the cache.
  const auto colocated = root() / "dmd-colocated", colocated_cached = root() / "dmd-colocated-cached";
  r = test::launch_train(1, "--run-dir " + colocated.string() + assets() + kDmd + " --teacher.placement colocated");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(1, "--run-dir " + colocated_cached.string() + assets() + kDmd +
                                " --teacher.placement colocated --data.teacher_cache " + cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the real score answered by each student's colocated teacher"), std::string::npos)
      << r.output;
  EXPECT_EQ(test::losses(colocated_cached), test::losses(colocated));
  EXPECT_EQ(test::losses(colocated_cached).size(), 10u);
  EXPECT_EQ(file_bytes(colocated_cached / "student" / "diffusion_pytorch_model.safetensors"),
            file_bytes(colocated / "student" / "diffusion_pytorch_model.safetensors"));
}

TEST(Cache, TwoDmdStudentsFromTheCacheShareOneTeacherRankForTheirRealScore) {
  // A cache of 2 streams: 2 students read them beside one teacher rank answering both (their
  // requests as one batch), against 2 teacher replicas of one student each online.
  const auto online = root() / "dmd2-online", cache = root() / "dmd2-cache", cached = root() / "dmd2-cached";
  auto r = test::launch_train(4, "--run-dir " + online.string() + assets() + kDmd + " --teacher.ranks 2");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_command(1, "generate", "--run-dir " + cache.string() + "-run" + assets() + kDmd + " --output " +
                                              cache.string() + " --students 2");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(3, "--run-dir " + cached.string() + assets() + kDmd + " --teacher.ranks 1 --data.teacher_cache " +
                                cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("teacher real-score service: 8 samples answered"), std::string::npos) << r.output;
  // One forward of 4 samples against two of 2: the BLAS may sum in another order.
  test::expect_close_losses(online, cached, 10);
  // Before training the held-out error is the cache's targets against the same student: equal.
  const auto a = held_out(online), b = held_out(cached);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b.front(), a.front());
  EXPECT_NEAR(b.back(), a.back(), 1e-6 * a.back());
}

TEST(Cache, DmdFromTheCacheIsRefusedWithoutItsRegressionTermOrALiveTeacher) {
  const std::string pure = " --train.objective dmd --teacher.guidance 3 --student.steps 2 --teacher.shift 3"
                           " --teacher.compute fp32 --train.steps 10 --train.eval_samples 4";
  const std::string why = "a teacher cache (data.teacher_cache, generate) with train.objective dmd and "
                          "train.dmd_regression_weight(0): without the regression term its training batches carry "
                          "the data alone and its real score needs a live teacher";
  auto r = test::launch_command(1, "generate", "--run-dir " + (root() / "dmd-pure-gen").string() + assets() + pure +
                                                   " --output " + (root() / "dmd-pure-cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root() / "dmd-pure-cache" / "index.json"));
  r = test::launch_refused(2, "--run-dir " + (root() / "dmd-pure").string() + assets() + pure +
                                  " --data.teacher_cache " + (root() / "dmd-cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  // With the regression term but no teacher to answer the real score.
  r = test::launch_refused(1, "--run-dir " + (root() / "dmd-no-teacher").string() + assets() + kDmd +
                                  " --teacher.ranks 0 --data.teacher_cache " + (root() / "dmd-cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("data.teacher_cache with train.objective dmd: the cache holds the training batches, the real "
                          "score needs a live teacher answering the students' own samples: set teacher.ranks >= 1"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1 "), std::string::npos) << "it trained: " << r.output;
}

TEST(Cache, AStudentFromTheCacheResumesExactlyAndRollsOutFromItsStartStates) {
  // A resume from step 6 reads the cache from there on, as the straight run did.
  const auto straight = root() / "resume-straight", resumed = root() / "resume-resumed";
  const auto cached = " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string();
  auto r = test::launch_train(1, "--run-dir " + straight.string() + assets() + kTrajectory + kSteps + cached +
                                     " --checkpoint.every 6");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(1, "--run-dir " + resumed.string() + assets() + kTrajectory + kSteps + cached + " --resume " +
                                (straight / "checkpoints" / "step-00000006").string());
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_resumed_exactly(straight, resumed, 12, 6);
  // train.trajectory_rollout: the cache holds each path's noise (x_start) and the roll-outs
  // start from it as from the teacher's stream.
  const std::string rollout = kTrajectory + " --train.steps 6 --train.trajectory_rollout 0.5";
  const auto online = root() / "rollout-online", cache = root() / "rollout-cache", from = root() / "rollout-cached";
  r = test::launch_train(2, "--run-dir " + online.string() + assets() + rollout);
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_command(1, "generate", "--run-dir " + cache.string() + "-run" + assets() + rollout + " --output " +
                                              cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto index = nlohmann::json::parse(std::ifstream(cache / "index.json"));
  EXPECT_NE(index["tensors"].dump().find("x_start"), std::string::npos) << index["tensors"].dump();
  r = test::launch_train(1, "--run-dir " + from.string() + assets() + rollout + " --teacher.ranks 0 --data.teacher_cache " +
                                cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(test::losses(from), test::losses(online));
  EXPECT_EQ(test::losses(from).size(), 6u);
}

TEST(Cache, PastItsEndTheRunCyclesTheCache) {
  const auto dir = root() / "cycling";
  const auto r = test::launch_train(1, "--run-dir " + dir.string() + assets() + kTrajectory + " --train.steps 15" +
                                           " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the cache holds 12 training batches per student; from batch 12 on the run reads them again "
                          "from the start (cycling)"),
            std::string::npos)
      << r.output;
  const auto cached = test::losses(dir), online = test::losses(root() / "online");
  ASSERT_EQ(cached.size(), 15u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(cached[i], online[i]) << "step " << i + 1;
}

TEST(Cache, AskedToStopATrainPastItsEndIsRefusedBeforeTraining) {
  const auto r = test::launch_refused(1, "--run-dir " + (root() / "stop").string() + assets() + kTrajectory +
                                             " --train.steps 15 --teacher.ranks 0 --data.teacher_cache " +
                                             (root() / "cache").string() + " --data.teacher_cache_end stop");
  EXPECT_EQ(r.code, 2) << r.output;  // a config error
  EXPECT_NE(r.output.find("data.teacher_cache(" + (root() / "cache").string() + ") holds 12 training batches per "
                          "student; this train needs 15 (train.steps(15) x train.grad_accum(1)) and "
                          "data.teacher_cache_end is stop"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1 "), std::string::npos) << "it trained: " << r.output;
}

TEST(Cache, OtherKeysAreRefusedNamingEachKey) {
  const auto r = test::launch_refused(1, "--run-dir " + (root() / "refused").string() + assets() +
                                             " --train.objective trajectory --teacher.guidance 3 --teacher.steps 8"
                                             " --student.steps 2 --teacher.shift 5 --teacher.compute fp32"
                                             " --train.log_every 1 --train.seed 5 --train.eval_samples 4" + kSteps +
                                             " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("was generated for other keys"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("teacher.shift: the cache has '3', this train has '5'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("student.steps: the cache has '4', this train has '2'"), std::string::npos) << r.output;
  // A teacher rank beside the cache is refused too.
  const auto t = test::launch_refused(2, "--run-dir " + (root() / "refused-ranks").string() + assets() + kTrajectory +
                                             kSteps + " --data.teacher_cache " + (root() / "cache").string());
  EXPECT_EQ(t.code, 2) << t.output;
  EXPECT_NE(t.output.find("data.teacher_cache: the students read the teacher's batches from the cache, with no teacher "
                          "rank: set teacher.ranks 0, not 1"),
            std::string::npos)
      << t.output;
}

TEST(Cache, AnAlteredShardStopsTheRunBeforeTrainingNamingTheFileAndTheMessage) {
  const auto copy = root() / "altered";
  fs::remove_all(copy);
  fs::copy(root() / "cache", copy, fs::copy_options::recursive);
  // Bytes in the middle of the training shard: inside a message's tensors.
  const auto shard = copy / "s00000-train-000000000.h5";
  const auto size = fs::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size * 3 / 4));
    f.write("\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", 8);
  }
  const auto r = test::launch_refused(1, "--run-dir " + (root() / "altered-run").string() + assets() + kTrajectory +
                                             kSteps + " --teacher.ranks 0 --data.teacher_cache " + copy.string());
  EXPECT_EQ(r.code, 3) << r.output;  // a data error
  EXPECT_NE(r.output.find(shard.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training message "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1 "), std::string::npos) << "it trained: " << r.output;
}

TEST(Cache, OneTwoAndFourGeneratingRanksWriteTheSameCache) {
  const auto one = root() / "students2-on-1", two = root() / "students2-on-2", four = root() / "students2-on-4";
  auto r = generate(1, one, " --students 2 --shard-positions 4");
  ASSERT_EQ(r.code, 0) << r.output;
  r = generate(2, two, " --students 2 --shard-positions 4");
  ASSERT_EQ(r.code, 0) << r.output;
  // 4 ranks: more than the global batch divides train.eval_samples by; the reading train's counts.
  r = generate(4, four, " --students 2 --shard-positions 4");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto a = shard_sums(one);
  EXPECT_EQ(a.size(), 8u);  // per stream: 1 held-out + 3 training shards
  EXPECT_EQ(shard_sums(two), a);
  EXPECT_EQ(shard_sums(four), a);
  // Read by 2 student ranks, it trains as 2 teacher replicas streaming to one student each.
  r = test::launch_train(4, "--run-dir " + (root() / "two-online").string() + assets() + kTrajectory + kSteps +
                                " --teacher.ranks 2");
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(2, "--run-dir " + (root() / "two-cached").string() + assets() + kTrajectory + kSteps +
                                " --teacher.ranks 0 --data.teacher_cache " + two.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(test::losses(root() / "two-cached"), test::losses(root() / "two-online"));
  EXPECT_EQ(test::losses(root() / "two-cached").size(), 12u);
  // A cache of 2 streams is read by 2 student ranks, not 1.
  r = test::launch_refused(1, "--run-dir " + (root() / "two-streams").string() + assets() + kTrajectory + kSteps +
                                  " --teacher.ranks 0 --data.teacher_cache " + one.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds the streams of 2 student rank(s); this train has 1"), std::string::npos) << r.output;
}

/// kTrajectory's keys for a student of `k` steps.
std::string trajectory_of(int k) {
  auto keys = kTrajectory;
  const std::string four = "--student.steps 4";
  return keys.replace(keys.find(four), four.size(), "--student.steps " + std::to_string(k));
}

// A cache of whole trajectories (generate --keep all: each 8-step trajectory's 9 states) serves
// students of every student.steps dividing 8: the k = 4 student of the online run and a k = 2
// student, each bit for bit as its own online run (losses, held-out errors, weights), whatever
// number of ranks wrote it; --keep values that serve no student, or an objective without
// trajectories, are refused, and a student whose σ are not points of the stored ones.
TEST(Cache, ACacheOfWholeTrajectoriesTrainsStudentsOfEveryStudentStepsBitForBit) {
  const auto cache = root() / "keep-all", on_two = root() / "keep-all-on-2";
  // 6 training rounds: 24 batches of k = 4, 12 of k = 2 (12 steps each).
  const std::string keep = " --train.steps 24 --keep all --shard-positions 4";
  auto r = test::launch_command(1, "generate", "--run-dir " + cache.string() + "-run" + assets() + kTrajectory + keep +
                                                   " --output " + cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("generate: 1 stream(s) of 2 held-out and 6 training trajectory rounds of 2 sample(s), 3 "
                          "shard(s)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(--keep 8: each trajectory's 9 states, one every 1 of its 8 teacher steps, for students of "
                          "any student.steps dividing 8)"),
            std::string::npos)
      << r.output;
  r = test::launch_command(2, "generate", "--run-dir " + on_two.string() + "-run" + assets() + kTrajectory + keep +
                                              " --output " + on_two.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(shard_sums(on_two), shard_sums(cache));
  const auto index = nlohmann::json::parse(std::ifstream(cache / "index.json"));
  EXPECT_EQ(index["layout"]["keep"], 8) << index.dump().substr(0, 2000);
  EXPECT_EQ(index["identity"].count("student.steps"), 0u) << index.dump().substr(0, 2000);
  const auto weights = [](const fs::path& run) { return file_bytes(run / "student" / "diffusion_pytorch_model.safetensors"); };
  for (const int k : {4, 2}) {
    SCOPED_TRACE("student.steps " + std::to_string(k));
    const auto online = k == 4 ? root() / "online" : root() / "keep-online-2";
    const auto cached = root() / ("keep-cached-" + std::to_string(k));
    if (k != 4) {
      r = test::launch_train(2, "--run-dir " + online.string() + assets() + trajectory_of(k) + kSteps +
                                    " --teacher.ranks 1");
      ASSERT_EQ(r.code, 0) << r.output;
    }
    r = test::launch_train(1, "--run-dir " + cached.string() + assets() + trajectory_of(k) + kSteps +
                                  " --teacher.ranks 0 --data.teacher_cache " + cache.string() +
                                  " --data.teacher_cache_end stop");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("(dealt from 6 rounds of whole trajectories, 9 states each)"), std::string::npos)
        << r.output;
    ASSERT_EQ(test::losses(online).size(), 12u);
    EXPECT_EQ(test::losses(cached), test::losses(online));
    EXPECT_FALSE(held_out(online).empty());
    EXPECT_EQ(held_out(cached), held_out(online));
    ASSERT_FALSE(weights(online).empty());
    EXPECT_EQ(weights(cached), weights(online));
  }
  // Refused before any teacher runs: --keep 3 (8 steps do not split into 3), --keep with velocity.
  r = test::launch_command(1, "generate", "--run-dir " + (root() / "keep-3").string() + assets() + kTrajectory +
                                              " --train.steps 2 --keep 3 --output " +
                                              (root() / "keep-3-cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("generate --keep(3) must be all or a number of intervals K that divides teacher.steps(8) "
                          "and that student.steps(4) divides"),
            std::string::npos)
      << r.output;
  r = test::launch_command(1, "generate", "--run-dir " + (root() / "keep-velocity").string() + assets() +
                                              " --train.objective velocity --train.steps 2 --keep all --output " +
                                              (root() / "keep-velocity-cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("generate --keep(all) stores whole teacher trajectories; train.objective velocity samples "
                          "none"),
            std::string::npos)
      << r.output;
  // 2 stored intervals (a cache for students of 2 and 1 steps): a student of 4 is refused.
  const auto two = root() / "keep-2";
  r = test::launch_command(1, "generate", "--run-dir " + two.string() + "-run" + assets() + trajectory_of(2) +
                                              " --train.steps 1 --keep 2 --output " + two.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_refused(1, "--run-dir " + (root() / "keep-2-refused").string() + assets() + kTrajectory +
                                  " --train.steps 1 --teacher.ranks 0 --data.teacher_cache " + two.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds trajectories at 3 points (generate --keep 2); student.steps(4) must divide 2"),
            std::string::npos)
      << r.output;
}

TEST(Cache, AGenerateKilledMidWayResumesToTheSameCache) {
  const auto straight = root() / "kill-straight", killed = root() / "kill-resumed";
  const std::string more = " --shard-positions 1";
  fs::remove_all(killed);
  auto r = generate(1, straight, more);
  ASSERT_EQ(r.code, 0) << r.output;
  // One process (an MPI singleton), killed with SIGKILL once 3 shards are in: the one it was
  // writing is left half done.
  const std::string args = "--run-dir " + killed.string() + "-run" + assets() + kTrajectory + kSteps + " --output " +
                           killed.string() + more;
  // The kernels mpirun's ranks are pinned to (test::kPinnedKernels), as environment variables.
  std::string env = test::kPinnedKernels;
  for (auto at = env.find("-x "); at != std::string::npos; at = env.find("-x ")) env.erase(at, 3);
  const std::string cmd = "( OMP_NUM_THREADS=1 " + env + std::string(WD_CLI) + " generate " + test::pinned_args(args) +
                          " > " + killed.string() + ".log 2>&1 & pid=$!; for i in $(seq 1200); do n=$(ls " +
                          killed.string() + "/*.h5.json 2>/dev/null | wc -l); [ \"$n\" -ge 3 ] && break; "
                          "kill -0 $pid 2>/dev/null || break; sleep 0.05; done; kill -9 $pid; wait $pid; "
                          "echo killed after $n shards )";
  r = test::run_captured(cmd);
  ASSERT_NE(r.output.find("killed after "), std::string::npos) << r.output;
  ASSERT_EQ(r.output.find("killed after 0 "), std::string::npos) << r.output << file_bytes(killed.string() + ".log");
  ASSERT_FALSE(fs::exists(killed / "index.json")) << "it finished before the kill";
  r = generate(1, killed, more);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_GE(test::count_of(r.output, "is complete already (a previous run's), kept"), 3) << r.output;
  EXPECT_EQ(shard_sums(killed), shard_sums(straight));
}

TEST(Cache, ATrainWritesTheCacheItStreamsAndLaterTrainsReadIt) {
  // 1 teacher rank serving 1 student: the online run, unchanged, writes the cache generate wrote.
  const auto writing = root() / "writing", written = root() / "written";
  auto r = test::launch_train(2, "--run-dir " + writing.string() + assets() + kTrajectory + kSteps +
                                     " --teacher.ranks 1 --data.teacher_cache_write " + written.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("data.teacher_cache_write: the cache " + written.string() + " is complete (index.json "
                          "written)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(test::losses(writing), test::losses(root() / "online"));
  EXPECT_EQ(shard_sums(written), shard_sums(root() / "cache"));
  // A colocated teacher writes its student's stream: the same cache again.
  const auto colocated = root() / "written-colocated";
  r = test::launch_train(1, "--run-dir " + (root() / "writing-colocated").string() + assets() + kTrajectory + kSteps +
                                " --teacher.placement colocated --data.teacher_cache_write " + colocated.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(shard_sums(colocated), shard_sums(root() / "cache"));
  // 1 teacher rank serving 2 students deals its samples over both: the cache holds their two
  // streams, and 2 student ranks with no teacher train from it as the writing run trained.
  const auto dealing = root() / "writing-dealt", dealt = root() / "written-dealt";
  r = test::launch_train(3, "--run-dir " + dealing.string() + assets() + kTrajectory + kSteps +
                                " --teacher.ranks 1 --data.teacher_cache_shard_positions 4 --data.teacher_cache_write " +
                                dealt.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1 teacher replica(s) deal the samples of 2 streams"), std::string::npos) << r.output;
  EXPECT_EQ(shard_sums(dealt).size(), 8u);  // per stream: 1 held-out + 3 training shards
  const auto reading = root() / "reading-dealt";
  r = test::launch_train(2, "--run-dir " + reading.string() + assets() + kTrajectory + kSteps +
                                " --teacher.ranks 0 --data.teacher_cache " + dealt.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(test::losses(reading).size(), 12u);
  EXPECT_EQ(test::losses(reading), test::losses(dealing));
  // generate deals one replica per stream: it refuses to complete or extend such a cache.
  r = generate(1, dealt, " --students 2 --shard-positions 4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("was begun with another layout"), std::string::npos) << r.output;
}

TEST(Cache, AWritingTrainStoppedForARequeueCompletesTheCacheWhenItResumes) {
  // Student 0 is told to stop after step 3 (SIGUSR1: a checkpoint, exit 75); the teacher has made
  // at most prefetch_depth batches more, so the one training shard (12 messages) is unfinished
  // and dropped. The resumed run remakes messages 0-2 before its own and completes the cache.
  const auto run = root() / "write-requeue", cache = root() / "written-requeue";
  const auto args = "--run-dir " + run.string() + assets() + kTrajectory + kSteps +
                    " --teacher.ranks 1 --data.teacher_cache_write " + cache.string();
  auto r = test::launch_train(2, args + " --inject-fault sigusr1@student:0:3");
  ASSERT_EQ(r.code, 75) << r.output;
  EXPECT_FALSE(fs::exists(cache / "index.json"));
  EXPECT_FALSE(fs::exists(cache / "s00000-train-000000000.h5")) << "an unfinished shard was kept";
  r = test::launch_train(2, args + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("s00000-eval-000000000.h5 is complete already (a previous run's), kept"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("making messages 0-2 again (a run resumed inside it)"), std::string::npos) << r.output;
  EXPECT_EQ(shard_sums(cache), shard_sums(root() / "cache"));
  EXPECT_EQ(test::losses(run), test::losses(root() / "online"));
}

// student.sequence_parallel 2: a group of 2 student ranks shares its samples, so it writes and
// reads one stream. The online run (1 teacher rank, one group) writes the cache generate wrote
// for 1 student (and writes given the group's keys); 2 student ranks with no teacher read generate's cache as one group and train bit
// for bit as the online group did (losses, held-out errors, weights), and a dmd group with its
// regression term from the cache beside a teacher rank answering its real score does too. A
// cache of 1 stream is refused by 2 groups, naming the ranks that read it.
TEST(Cache, ASequenceParallelGroupWritesAndReadsOneStreamBitForBit) {
  const auto online = root() / "sp-online", written = root() / "sp-written", cached = root() / "sp-cached";
  const std::string sp = " --student.sequence_parallel 2";
  auto r = test::launch_train(3, "--run-dir " + online.string() + assets() + kTrajectory + kSteps + sp +
                                     " --teacher.ranks 1 --data.teacher_cache_write " + written.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("data.teacher_cache_write " + written.string() + ": 1 stream(s) of 2 held-out and 12"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(shard_sums(written), shard_sums(root() / "cache"));
  // generate given the group's keys writes it too: the split decides nothing the teacher makes.
  r = generate(1, root() / "sp-generated", sp);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(shard_sums(root() / "sp-generated"), shard_sums(root() / "cache"));
  r = test::launch_train(2, "--run-dir " + cached.string() + assets() + kTrajectory + kSteps + sp +
                                " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 student rank(s) in 1 sequence-parallel group(s) of 2, each reading its stream"),
            std::string::npos)
      << r.output;
  ASSERT_EQ(test::losses(online).size(), 12u);
  EXPECT_EQ(test::losses(cached), test::losses(online));
  EXPECT_FALSE(held_out(online).empty());
  EXPECT_EQ(held_out(cached), held_out(online));
  const auto weights = [](const fs::path& run) { return file_bytes(run / "student" / "diffusion_pytorch_model.safetensors"); };
  ASSERT_FALSE(weights(online).empty());
  EXPECT_EQ(weights(cached), weights(online));
  // dmd: the group's regression batches from the cache, its real score from a teacher rank.
  const auto dmd_online = root() / "sp-dmd-online", dmd_cached = root() / "sp-dmd-cached";
  const auto dmd_cache = root() / "sp-dmd-written";
  r = test::launch_train(3, "--run-dir " + dmd_online.string() + assets() + kDmd + sp +
                                " --teacher.ranks 1 --data.teacher_cache_write " + dmd_cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = test::launch_train(3, "--run-dir " + dmd_cached.string() + assets() + kDmd + sp +
                                " --teacher.ranks 1 --data.teacher_cache " + dmd_cache.string());
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(test::losses(dmd_online).size(), 10u);
  EXPECT_EQ(test::losses(dmd_cached), test::losses(dmd_online));
  EXPECT_EQ(weights(dmd_cached), weights(dmd_online));
  r = test::launch_refused(4, "--run-dir " + (root() / "sp-refused").string() + assets() + kTrajectory + kSteps + sp +
                                  " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds the streams of 1 student rank(s); this train has 2 sequence-parallel group(s) of 2 "
                          "ranks, a stream each (run it on 2 ranks, or generate with --students 2)"),
            std::string::npos)
      << r.output;
}

TEST(Cache, WhatAWritingTrainCannotDoIsRefusedBeforeTraining) {
  const auto base = "--run-dir " + (root() / "write-refused").string() + assets() + kTrajectory + kSteps;
  const auto out = " --data.teacher_cache_write " + (root() / "write-refused-cache").string();
  auto r = test::launch_refused(3, base + out + " --teacher.ranks 1 --comm.mode broadcast");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("data.teacher_cache_write with comm.mode broadcast (every student gets one batch) is not "
                          "built yet"),
            std::string::npos)
      << r.output;
  r = test::launch_refused(1, base + out + " --teacher.ranks 0 --data.teacher_cache " + (root() / "cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("a train reads a cache or writes one, not both"), std::string::npos) << r.output;
  // A folder begun for other keys (here generate's cache) is refused, naming them.
  r = test::launch_refused(2, base + " --teacher.ranks 1 --train.trajectory_rollout 0.5 --data.teacher_cache_write " +
                                  (root() / "cache").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("data.teacher_cache_write(" + (root() / "cache").string() + ") was generated for other keys: "
                          "train.trajectory_rollout: the cache has '"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1 "), std::string::npos) << "it trained: " << r.output;
}

}  // namespace
}  // namespace wd::test_cache_launch
