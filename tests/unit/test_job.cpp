// The job library's start-up stages in one process: the config errors `train` stops on before
// training (each named in one error, with the value it expected), the layout and placement
// decisions, and the devices `layout` shows. That every rank agrees on such an error and exits
// 2 within 5 s is tested once, launched (launch.train.Train.TheLauncherReturnsAtOnce...).
#include <gtest/gtest.h>

#include "data/synthetic_dataset.hpp"

#include <fstream>
#include <sstream>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "data/dataset_info.hpp"
#include "job/run_config.hpp"
#include "job/startup.hpp"
#include "job/plan_input.hpp"
#include "plan/speed.hpp"
#include "run_config_words.hpp"
#include "test_util.hpp"

namespace wd::test_job {
namespace {

using job::RunConfig;

/// A run config as `train` parses these words.
RunConfig config(const std::string& words) { return test::run_config(words); }

/// The builtin tiny teacher and data set, made once by the stage `train` runs first.
const test::TempDir& builtin() {
  static test::TempDir dir("job-builtin");
  static const bool made = [] {
    job::prepare_run_dir(config("--run-dir " + dir.str()));
    return true;
  }();
  static_cast<void>(made);
  return dir;
}

/// The tiny job on the builtin assets, pinned to the host like every launched test.
std::string tiny(const std::string& more = "") {
  return "--run-dir " + builtin().str("run") + " --teacher.checkpoint " + builtin().str("cache/tiny-teacher") +
         " --data.path " + builtin().str("cache/tiny-data.h5") + " --student.device cpu --teacher.device cpu " + more;
}

/// What `train`'s stages decide up to the cross-section checks, as world rank 0 of `world`
/// ranks on one node runs them.
comm::Layout start_as_train(const RunConfig& cfg, int world) {
  cfg.validate();
  const auto placement = job::choose_placement(cfg, world);
  const auto layout = job::make_layout(cfg, placement.placement, world, {});
  const auto experts = job::open_teacher(cfg);
  job::check_job(cfg, experts.config(), layout);
  static_cast<void>(job::check_data(cfg, experts.config()));
  return layout;
}

/// The message of the `E` that `f` throws ("" when it throws none).
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(JobStartup, TheTinyDefaultPassesEveryStage) {
  const auto cfg = config(tiny("--teacher.placement cpu"));
  const auto layout = start_as_train(cfg, 3);
  EXPECT_EQ(layout.teacher_ranks, 1);
  EXPECT_EQ(layout.student_ranks, 2);
  EXPECT_EQ(job::per_replica_batch(cfg, layout), 2 * cfg.train.batch_size);
  EXPECT_EQ(job::global_batch(cfg, layout), 2 * cfg.train.batch_size);
}

TEST(JobStartup, ABadValueIsNamedWithWhatItMustBe) {
  const auto message = error_of<ConfigError>([] { config(tiny("--train.lr -1")).validate(); });
  EXPECT_TRUE(test::contains(message, "train.lr(-1) must be > 0")) << message;
}

TEST(JobStartup, TeacherRanksThatLeaveNoStudentIsAConfigError) {
  const auto message = error_of<ConfigError>([] { start_as_train(config(tiny("--teacher.ranks 3")), 3); });
  EXPECT_TRUE(test::contains(message, "teacher.ranks(3)")) << message;
}

TEST(JobStartup, TheHeldOutSetMustDivideByTheGlobalBatch) {
  const auto message = error_of<ConfigError>([] { start_as_train(config(tiny("--train.eval_samples 6")), 3); });
  EXPECT_TRUE(test::contains(message, "train.eval_samples(6) must be a multiple of the global batch 4")) << message;
}

TEST(JobStartup, EveryInvalidCombinationIsNamedInOneError) {
  const auto message = error_of<ConfigError>([] {
    start_as_train(config(tiny("--train.steps 10 --train.eval_samples 6 --student.features 9:9 --inject-fault "
                               "oom@student:5:1 --checkpoint.every 20 --resume /nonexistent/ckpt")),
                   3);
  });
  for (const char* part : {"train.eval_samples(6) must be a multiple of the global batch 4",
                           "student.features(9:9) pairs student block 9 with teacher block 9",
                           "inject-fault(oom@student:5:1) needs RANK < 2 student ranks",
                           "checkpoint.every(20) exceeds train.steps(10)",
                           "resume(/nonexistent/ckpt) must be auto, empty, or an existing checkpoint directory"}) {
    EXPECT_TRUE(test::contains(message, part)) << part << "\n" << message;
  }
}

TEST(JobStartup, StudentFeaturesPastTheTeachersBlocksAreNamed) {
  const auto message = error_of<ConfigError>([] { start_as_train(config(tiny("--student.features 0:9")), 3); });
  EXPECT_TRUE(test::contains(message, "teacher block 9")) << message;
}

TEST(JobStartup, ABadShardMapIsNamedWithTheRangeItExpected) {
  const auto message = error_of<ConfigError>([] {
    start_as_train(config(tiny("--teacher.placement shard --teacher.ranks 2 --teacher.shard_map 0-1,3-3")), 4);
  });
  EXPECT_TRUE(test::contains(message, "teacher.shard_map(0-1,3-3): range '3-3' starts at 3, not 2")) << message;
}

TEST(JobStartup, MoreStagesThanTheTeacherHasBlocksIsAConfigError) {
  const auto message =
      error_of<ConfigError>([] { start_as_train(config(tiny("--teacher.placement shard --teacher.ranks 5")), 7); });
  EXPECT_TRUE(test::contains(message, "teacher.stages(5) exceeds the teacher's 4 blocks")) << message;
}

TEST(JobStartup, GpuPlacementWithoutAGpuIsRefused) {
  if (compat::cuda_available()) GTEST_SKIP() << "this machine has a usable GPU";
  // Without teacher.device the `gpu` teacher asks for cuda:<local rank>.
  auto cfg = config(tiny("--teacher.placement gpu"));
  cfg.teacher.device.clear();
  const auto message = error_of<ConfigError>([&] { job::choose_placement(cfg, 3); });
  // A CPU build and a CUDA build on a machine without a GPU say which of the two is missing.
  EXPECT_TRUE(test::contains(message, "teacher.placement(gpu) needs a GPU: this build's LibTorch has no CUDA") ||
              test::contains(message, "teacher.placement(gpu) needs a GPU: this rank sees none"))
      << message;
}

TEST(JobStartup, StudentDeviceCudaWithoutAGpuIsRefused) {
  if (compat::cuda_available()) GTEST_SKIP() << "this machine has a usable GPU";
  const auto cfg = config(tiny("--teacher.placement cpu")) ;
  auto cuda = cfg;
  cuda.student.device = DeviceChoice::kCuda;
  const auto message =
      error_of<ConfigError>([&] { job::rank_device(cuda, plan::Placement::kCpu, Role::kStudent, 0); });
  EXPECT_TRUE(test::contains(message, "student.device(cuda): this build's LibTorch has no CUDA") ||
              test::contains(message, "student.device(cuda): this rank sees no GPU"))
      << message;
  // A colocated student's teacher computes where the student does.
  EXPECT_TRUE(job::rank_device(cfg, plan::Placement::kCpu, Role::kStudent, 0).is_cpu());
}

TEST(JobStartup, ABadDataSetIsADataErrorNamingTheFile) {
  test::TempDir dir("job-bad-data");
  const auto bad = dir.str("not-hdf5.h5");
  std::ofstream(bad) << "this is not an HDF5 file";
  const auto teacher = job::open_teacher(config(tiny())).config();
  const auto with_data = [](const std::string& path) {
    auto cfg = config(tiny());
    cfg.data.path = path;
    return cfg;
  };
  auto message = error_of<DataError>([&] { job::check_data(with_data(bad), teacher); });
  EXPECT_TRUE(test::contains(message, bad)) << message;
  message = error_of<DataError>([&] { job::check_data(with_data("/nonexistent/data.h5"), teacher); });
  EXPECT_TRUE(test::contains(message, "/nonexistent/data.h5")) << message;
  // A data set with no sample left for training once the held-out ones are set aside.
  message = error_of<DataError>([&] { job::check_data(config(tiny("--train.eval_samples 4096")), teacher); });
  EXPECT_TRUE(test::contains(message, "leaves none for training")) << message;
  // Contexts only (no latents): trajectory trains from them; every other objective is refused.
  data::SyntheticDatasetSpec spec;
  spec.output = dir.str("contexts.h5");
  spec.samples = 20;
  spec.latent = {teacher.in_dim, 1, 8, 8};
  spec.text_len = teacher.text_len;
  spec.text_dim = teacher.text_dim;
  spec.contexts_only = true;
  data::write_synthetic_dataset(spec);
  for (const char* objective : {"velocity", "guided"}) {
    auto cfg = with_data(spec.output);
    cfg.train.objective = objective;
    message = error_of<DataError>([&] { job::check_data(cfg, teacher); });
    EXPECT_TRUE(test::contains(message, spec.output + ": /latents: is missing: the file holds contexts only")) << message;
    EXPECT_TRUE(test::contains(message, std::string("train.objective ") + objective + " needs the latents")) << message;
  }
  auto cfg = with_data(spec.output);
  cfg.train.objective = "trajectory";
  EXPECT_EQ(job::check_data(cfg, teacher).samples, 20);
}

TEST(JobStartup, ALayoutChoiceIsWrittenAsTheKeysAUserWouldGive) {
  auto teacher = config(tiny()).teacher;
  job::apply_layout({true, 4, 1, 2}, teacher);
  EXPECT_EQ(teacher.placement, TeacherPlacement::kColocated);
  EXPECT_EQ(teacher.micro_batch, "2");
  teacher = config(tiny("--teacher.placement cpu --teacher.micro_batch 3")).teacher;
  job::apply_layout({false, 4, 2, 1}, teacher);
  EXPECT_EQ(teacher.placement, TeacherPlacement::kShard);
  EXPECT_EQ(teacher.ranks, 4);
  EXPECT_EQ(teacher.stages, 2);
  EXPECT_EQ(teacher.micro_batch, "3") << "a micro-batch given as samples stays";
  teacher = config(tiny("--teacher.placement cpu")).teacher;
  job::apply_layout({false, 2, 1, 0}, teacher);
  EXPECT_EQ(teacher.placement, TeacherPlacement::kCpu) << "whole teachers keep the placement given";
  EXPECT_EQ(teacher.stages, 0);
}

TEST(JobStartup, ColocatedHasNoTeacherRanks) {
  const auto cfg = config(tiny("--teacher.placement colocated"));
  const auto placement = job::choose_placement(cfg, 3);
  EXPECT_EQ(placement.placement, plan::Placement::kCpu) << "a student on the host holds its teacher there";
  const auto layout = job::make_layout(cfg, placement.placement, 3, {});
  EXPECT_TRUE(layout.colocated());
  EXPECT_EQ(layout.student_ranks, 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(layout.role_of(r), Role::kStudent);
}

TEST(JobStartup, PlannedGpusFollowTrainsDeviceRules) {
  const auto gpu = [](const std::string& words, plan::Placement p, Role role, int local) {
    auto cfg = config(words);
    return job::planned_gpu(cfg, p, role, local, 4);
  };
  EXPECT_EQ(gpu("--teacher.placement gpu", plan::Placement::kGpu, Role::kTeacher, 5), 1);
  EXPECT_EQ(gpu("--teacher.placement cpu", plan::Placement::kCpu, Role::kTeacher, 1), -1);
  EXPECT_EQ(gpu("--teacher.device cuda:3", plan::Placement::kStream, Role::kTeacher, 0), 3);
  EXPECT_EQ(gpu("--teacher.device cpu", plan::Placement::kShard, Role::kTeacher, 0), -1);
  EXPECT_EQ(gpu("--student.device cpu", plan::Placement::kGpu, Role::kStudent, 2), -1);
  EXPECT_EQ(gpu("", plan::Placement::kGpu, Role::kStudent, 2), 2);
  EXPECT_EQ(gpu("--teacher.placement colocated --student.device cpu", plan::Placement::kCpu, Role::kStudent, 0), -1);
}

TEST(JobStartup, FlowTrainsWithoutATeacherAndEveryOtherObjectiveNeedsOne) {
  auto message = error_of<ConfigError>([] { config(tiny("--train.objective flow")).validate(); });
  EXPECT_TRUE(test::contains(message, "train.objective flow trains without a teacher: set teacher.ranks 0, not 1"))
      << message;
  message = error_of<ConfigError>([] { config(tiny("--teacher.ranks 0")).validate(); });
  EXPECT_TRUE(test::contains(message, "train.objective(velocity) needs teacher.ranks >= 1")) << message;
  message = error_of<ConfigError>([] { config(tiny("--train.cond_dropout 0.1")).validate(); });
  EXPECT_TRUE(test::contains(message, "train.cond_dropout(0.1) drops contexts of the data: it needs train.objective "
                                      "flow, not velocity"))
      << message;
  message = error_of<ConfigError>([] {
    config(tiny("--train.objective flow --teacher.ranks 0 --student.features 0:1 --teacher.layout auto "
                "--train.cond_dropout 1"))
        .validate();
  });
  for (const char* part : {"student.features(0:1) matches teacher blocks", "teacher.layout(auto) must be given",
                           "train.cond_dropout(1) must be in [0, 1)"}) {
    EXPECT_TRUE(test::contains(message, part)) << part << "\n" << message;
  }
}

TEST(JobStartup, FlowMakesEveryRankAStudentAndItsModelFromTheData) {
  const auto cfg = config(tiny("--train.objective flow --teacher.ranks 0 --train.eval_samples 6"));
  cfg.validate();
  EXPECT_FALSE(cfg.has_teacher());
  const auto placement = job::choose_placement(cfg, 3);
  EXPECT_EQ(placement.placement, plan::Placement::kCpu);
  EXPECT_FALSE(placement.compute.has_value());
  const auto layout = job::make_layout(cfg, placement.placement, 3, {});
  EXPECT_TRUE(layout.colocated());
  EXPECT_EQ(layout.student_ranks, 3);
  const auto info = data::validate_dataset(cfg.data_path(), {});
  const auto model = job::model_for_data(info);
  EXPECT_EQ(model.in_dim, info.latent_shape[0]);
  EXPECT_EQ(model.out_dim, info.latent_shape[0]);
  EXPECT_EQ(model.text_dim, info.text_dim);
  EXPECT_EQ(model.text_len, info.context_len);
  job::check_job(cfg, model, layout);
  EXPECT_EQ(job::check_data(cfg, model).samples, info.samples);
}

TEST(JobStartup, GuidedNeedsTheWholeTeacherAndAReadableNegative) {
  auto message = error_of<ConfigError>([] {
    start_as_train(config(tiny("--train.objective guided --teacher.placement shard --teacher.ranks 2")), 4);
  });
  EXPECT_TRUE(test::contains(message, "train.objective guided runs the conditional and negative forwards of the whole "
                                      "teacher on one rank"))
      << message;
  message = error_of<ConfigError>([] { config(tiny("--train.objective guided --teacher.guidance 0")).validate(); });
  EXPECT_TRUE(test::contains(message, "teacher.guidance(0) must be a guidance scale g > 0")) << message;
  message = error_of<ConfigError>([] { config(tiny("--train.objective guided --teacher.guidance 3,x")).validate(); });
  EXPECT_TRUE(test::contains(message, "teacher.guidance(3,x) must be a guidance scale g > 0, or two, LOW,HIGH")) << message;
  test::TempDir dir("job-negative");
  std::ofstream(dir.str("neg.safetensors")) << "not safetensors";
  message = error_of<DataError>([&] {
    start_as_train(config(tiny("--train.objective guided --teacher.placement cpu --teacher.negative " +
                               dir.str("neg.safetensors"))),
                   3);
  });
  EXPECT_TRUE(test::contains(message, dir.str("neg.safetensors"))) << message;
  // Whole teachers pass: resident, streamed, colocated.
  for (const char* placement : {"cpu", "stream", "colocated"}) {
    EXPECT_NO_THROW(start_as_train(config(tiny(std::string("--train.eval_samples 12 --train.objective guided --teacher.placement ") + placement)),
                                   3))
        << placement;
  }
}

TEST(JobStartup, TrajectoryNeedsTheWholeTeacherAndAlignedSchedules) {
  auto message = error_of<ConfigError>([] {
    start_as_train(config(tiny("--train.objective trajectory --teacher.placement shard --teacher.ranks 2")), 4);
  });
  EXPECT_TRUE(test::contains(message, "train.objective trajectory samples with the whole teacher on one rank"))
      << message;
  message = error_of<ConfigError>([] {
    config(tiny("--train.objective trajectory --teacher.steps 10 --student.steps 4")).validate();
  });
  EXPECT_TRUE(test::contains(message, "teacher.steps(10) must be a multiple of student.steps(4)")) << message;
  // A solver outside the table stops the parse.
  message = error_of<ConfigError>([] { config(tiny("--train.objective trajectory --teacher.solver heun")); });
  EXPECT_TRUE(test::contains(message, "teacher.solver(heun) must be one of euler, unipc")) << message;
  // The teacher's forwards a trained sample: guided 2 x 40 / 4; unguided 40 / 4; guided objective 2.
  EXPECT_DOUBLE_EQ(config(tiny("--train.objective trajectory --teacher.guidance 3")).teacher_forwards(), 20.0);
  EXPECT_DOUBLE_EQ(config(tiny("--train.objective trajectory --teacher.guidance 1 --student.steps 2")).teacher_forwards(),
                   20.0);
  EXPECT_DOUBLE_EQ(config(tiny("--train.objective guided")).teacher_forwards(), 2.0);
  EXPECT_DOUBLE_EQ(config(tiny("")).teacher_forwards(), 1.0);
  for (const char* placement : {"cpu", "stream", "colocated"}) {
    EXPECT_NO_THROW(start_as_train(
        config(tiny(std::string("--train.eval_samples 12 --train.objective trajectory --teacher.placement ") + placement)), 3))
        << placement;
  }
}

TEST(JobStartup, DmdCountsItsCriticsForwardsAtTheCriticsSize) {
  // k = 4 simulate, R = 5: the generator's 4 + 6 / 5, the critic's 3 + 1 / 5, less the step's 3.
  const auto dmd = config(tiny("--train.objective dmd --student.steps 4 --train.critic_ratio 5"));
  EXPECT_NEAR(dmd.objective().student_extra_forwards(dmd.keys(), 1.0), 4 + 1.2 + 3.2 - 3, 1e-12);
  EXPECT_NEAR(dmd.objective().student_extra_forwards(dmd.keys(), 2.5), 4 + 1.2 + 2.5 * 3.2 - 3, 1e-12);
  // A critic of the student's dims costs a student forward; one of the teacher's (critic.init
  // teacher) a teacher forward, whatever the student's dims.
  auto teacher = WanConfig::preset("tiny");
  teacher.dim = 128;
  teacher.ffn_dim = 512;
  teacher.num_heads = 4;
  teacher.num_layers = 4;
  const auto words = std::string("--train.objective dmd --student.dim 64 --student.ffn_dim 256 --student.num_heads 2 ");
  const auto own = config(tiny(words + "--student.num_layers 2"));
  const auto as_teacher = config(tiny(words + "--student.num_layers 2 --critic.init teacher"));
  plan::PlanInput in;  // what make_plan_input fills for these two configs
  in.student = job::dit_shape(own.student.model_config(teacher), 1);
  in.tokens = 256;
  in.context_len = 32;
  in.critic = job::dit_shape(job::dmd_critic_config(own, teacher), 1);
  EXPECT_DOUBLE_EQ(job::dmd_critic_cost(in), 1.0);
  const double ratio = plan::dit_forward_flops(job::dit_shape(teacher, 1), 256, 32) /
                       plan::dit_forward_flops(in.student, 256, 32);
  EXPECT_GT(ratio, 6.0);  // twice the width (4x the products) and twice the blocks
  in.critic = job::dit_shape(job::dmd_critic_config(as_teacher, teacher), 1);
  EXPECT_DOUBLE_EQ(job::dmd_critic_cost(in), ratio);
}

TEST(JobStartup, ANewRunResumesAtStepZero) {
  test::TempDir dir("job-resume");
  const auto cfg = config(tiny("--checkpoint.dir " + dir.str("ckpt") + " --resume auto"));
  CheckpointStore store(cfg.checkpoint_root(), 2);
  const auto at = job::find_resume_point(cfg, store);
  EXPECT_EQ(at.step, 0);
  EXPECT_TRUE(at.path.empty());
}

}  // namespace
}  // namespace wd::test_job
