// Student-side pieces that need no MPI: configs, the LR schedule, the loss, building and saving.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/errors.hpp"
#include "student/student_loop.hpp"
#include "student/student_model.hpp"
#include "test_util.hpp"

namespace wd::student::test_student {
namespace {

namespace fs = std::filesystem;

TEST(TrainConfigTest, WarmupThenCosineToMinLr) {
  TrainConfig t;
  t.steps = 110;
  t.warmup_steps = 10;
  t.lr = 1.0;
  t.min_lr = 0.1;
  EXPECT_NEAR(t.lr_at(0), 1.0 / 11, 1e-12);
  EXPECT_NEAR(t.lr_at(9), 10.0 / 11, 1e-12);
  EXPECT_NEAR(t.lr_at(10), 1.0, 1e-12);                       // peak right after warmup
  EXPECT_NEAR(t.lr_at(60), 0.1 + 0.5 * 0.9, 1e-12);           // half way: cos(pi/2) = 0
  EXPECT_NEAR(t.lr_at(110), 0.1, 1e-12);                      // the end
  for (std::int64_t s = 11; s < 110; ++s) EXPECT_LT(t.lr_at(s), t.lr_at(s - 1));
}

TEST(TrainConfigTest, ValidateNamesEveryBadValue) {
  TrainConfig t;
  t.steps = 0;
  t.lr = -1;
  t.beta2 = 1.5;
  ConfigProblems p;
  t.validate(p);
  ASSERT_EQ(p.list().size(), 4u);  // steps, lr, min_lr > lr, betas
  EXPECT_NE(p.list()[0].find("train.steps(0)"), std::string::npos);
  EXPECT_NE(p.list()[1].find("train.lr(-1)"), std::string::npos);
}

TEST(StudentConfigTest, TeacherBlocksAndDerivedConfig) {
  StudentConfig s;
  s.init = "teacher-blocks:0,2";
  EXPECT_EQ(s.teacher_blocks(), (std::vector<std::int64_t>{0, 2}));
  s.init = "teacher-blocks:x";
  ConfigProblems p;
  s.validate(p);
  EXPECT_FALSE(p.empty());
  const auto teacher = WanConfig::preset("tiny");
  StudentConfig d;
  const auto c = d.model_config(teacher);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.in_dim, teacher.in_dim);  // 0 = the teacher's
  EXPECT_EQ(c.text_dim, teacher.text_dim);
}

TEST(DistillLoss, IsTheMeanSquaredErrorInThePredictionsDtype) {
  auto pred = torch::tensor({1.f, 2.f, 3.f});
  auto target = torch::tensor({1.0, 0.0, 5.0}, torch::kDouble);
  auto loss = distill_loss(pred, target);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_FLOAT_EQ(loss.item<float>(), (0.f + 4.f + 4.f) / 3.f);
}

using test::TempDir;

TEST(StudentModel, InitFromTeacherBlocksCopiesThemAndSavesAsACheckpoint) {
  TempDir tmp;
  const auto teacher_cfg = WanConfig::preset("tiny");
  write_random_wan_checkpoint((tmp.path() / "teacher").string(), teacher_cfg, torch::kFloat, 1ULL << 30, 3);
  const auto teacher = WanCheckpoint::open((tmp.path() / "teacher").string());
  StudentConfig s;
  s.dim = teacher_cfg.dim;
  s.ffn_dim = teacher_cfg.ffn_dim;
  s.num_heads = teacher_cfg.num_heads;
  s.num_layers = 2;
  s.init = "teacher-blocks:1,3";
  auto model = build_student(s.model_config(teacher_cfg), s, &teacher, 0);
  auto params = model->named_parameters();
  EXPECT_TRUE(torch::equal(params["blocks.0.ffn.0.weight"], teacher.tensor("blocks.1.ffn.0.weight")));
  EXPECT_TRUE(torch::equal(params["blocks.1.self_attn.q.weight"], teacher.tensor("blocks.3.self_attn.q.weight")));
  EXPECT_TRUE(torch::equal(params["head.head.weight"], teacher.tensor("head.head.weight")));
  EXPECT_TRUE(params["blocks.0.ffn.0.weight"].requires_grad());

  save_student(model, (tmp.path() / "student").string());
  const auto saved = WanCheckpoint::open((tmp.path() / "student").string());
  EXPECT_TRUE(saved.problems().empty());
  EXPECT_TRUE(torch::equal(saved.tensor("blocks.1.self_attn.q.weight"), params["blocks.1.self_attn.q.weight"]));

  s.init = "teacher-blocks:0";  // one block for a two-block student
  EXPECT_THROW(build_student(s.model_config(teacher_cfg), s, &teacher, 0), ConfigError);
  s.dim = 64;
  s.init = "teacher-blocks:0,1";
  EXPECT_THROW(build_student(s.model_config(teacher_cfg), s, &teacher, 0), ConfigError);
}

// student.init weights:PATH: every tensor from a saved student of the same dims (a teacher is
// not needed); other dims are refused naming the fields, a bad spelling at validation.
TEST(StudentModel, InitFromWeightsCopiesEveryTensorOfACheckpointOfTheStudentsDims) {
  TempDir tmp;
  const auto teacher_cfg = WanConfig::preset("tiny");
  StudentConfig s;
  const auto sc = s.model_config(teacher_cfg);
  auto first = build_student(sc, s, nullptr, 7);
  save_student(first, (tmp.path() / "first").string());
  s.init = "weights:" + (tmp.path() / "first").string();
  EXPECT_EQ(s.init_weights(), (tmp.path() / "first").string());
  EXPECT_TRUE(s.teacher_blocks().empty());
  auto second = build_student(sc, s, nullptr, 8);  // another seed: every tensor still the first's
  const auto a = first->named_parameters(), b = second->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  EXPECT_TRUE(b["blocks.0.ffn.0.weight"].requires_grad());

  StudentConfig other = s;
  other.dim = 32;
  other.num_heads = 2;
  try {
    build_student(other.model_config(teacher_cfg), other, nullptr, 0);
    ADD_FAILURE() << "a checkpoint of other dims was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a model of the student's dims: dim 64 (the student's: 32)"),
              std::string::npos)
        << e.what();
  }
  StudentConfig blocks;
  blocks.init = "teacher-blocks:0,1";
  EXPECT_THROW(build_student(sc, blocks, nullptr, 0), ConfigError);  // no teacher to copy from
  for (const std::string bad : {"weights:", "weight:x", "teacher:"}) {
    StudentConfig c;
    c.init = bad;
    ConfigProblems p;
    c.validate(p);
    EXPECT_FALSE(p.empty()) << bad;
  }
}

}  // namespace
}  // namespace wd::student::test_student
