// The objectives' bench data: a `classes` data set's labels and patterns, and the classifier,
// which finds each sample's class wherever its pattern sits and however strong it is, and gives
// noise no class with confidence.
#include <gtest/gtest.h>

#include "data/classes.hpp"
#include "data/dataset_info.hpp"
#include "data/dataset_reader.hpp"
#include "data/synthetic_dataset.hpp"
#include "test_util.hpp"

namespace wd::test_classes {
namespace {

data::SyntheticDatasetSpec classes_spec(const test::TempDir& dir) {
  data::SyntheticDatasetSpec spec;
  spec.output = dir.str("classes.h5");
  spec.kind = DatasetKind::kClasses;
  spec.classes = 5;
  spec.samples = 40;
  spec.latent = {4, 2, 16, 16};
  spec.text_len = 6;
  spec.text_dim = 8;
  spec.seed = 9;
  return spec;
}

TEST(Classes, EverySampleIsFoundInItsOwnClassStrictly) {
  test::TempDir dir("classes");
  const auto spec = classes_spec(dir);
  data::write_synthetic_dataset(spec);
  const auto info = data::validate_dataset(spec.output, {});
  const auto classes = data::read_dataset_classes(spec.output);
  ASSERT_TRUE(classes.present());
  EXPECT_EQ(classes.patterns.sizes(), (std::vector<std::int64_t>{5, 4, 2, 16, 16}));
  ASSERT_EQ(classes.labels.size(), 40u);
  std::vector<std::int64_t> all(40);
  for (std::int64_t i = 0; i < 40; ++i) {
    all[static_cast<std::size_t>(i)] = i;
    EXPECT_EQ(classes.labels[static_cast<std::size_t>(i)], i % 5);
  }
  data::DatasetReader reader(info);
  const auto batch = reader.read(all);
  const auto got = data::classify_latents(batch.latents, classes.patterns);
  const auto acc = data::class_accuracy(got, classes.labels);
  EXPECT_EQ(acc.class_accuracy, 1.0);
  EXPECT_EQ(acc.strict_accuracy, 1.0) << "lowest cosine " << got.cosine.min().item<double>();
  // One context per class, all rows valid.
  EXPECT_TRUE(torch::equal(batch.context[0], batch.context[5]));
  EXPECT_FALSE(torch::equal(batch.context[0], batch.context[1]));
  EXPECT_EQ(batch.context_lens.min().item<std::int64_t>(), 6);
}

TEST(Classes, TheClassifierIgnoresPlaceAndStrengthButNotShape) {
  auto gen = at::detail::createCPUGenerator(3);
  const auto patterns = torch::randn({3, 2, 1, 12, 12}, gen, torch::TensorOptions().dtype(torch::kFloat));
  // Class 2's pattern moved and weakened, class 0's strengthened; then pure noise.
  const auto moved = torch::roll(patterns[2], {5, -3}, {2, 3}) * 0.3;
  const auto strong = patterns[0] * 7.0;
  const auto noise = torch::randn({2, 1, 12, 12}, gen, torch::TensorOptions().dtype(torch::kFloat));
  const auto got = data::classify_latents(torch::stack({moved, strong, noise}), patterns);
  EXPECT_EQ(got.label[0].item<std::int64_t>(), 2);
  EXPECT_EQ(got.label[1].item<std::int64_t>(), 0);
  EXPECT_NEAR(got.cosine[0].item<double>(), 1.0, 1e-4);
  EXPECT_NEAR(got.cosine[1].item<double>(), 1.0, 1e-4);
  EXPECT_LT(got.cosine[2].item<double>(), 0.6) << "noise looks like a class";
  const auto acc = data::class_accuracy(got, {2, 0, 1});
  EXPECT_NEAR(acc.strict_accuracy, 2.0 / 3.0, 1e-9);
}

// The bench's condition_accuracy: the data's own videos continue their first frames; a video
// whose later frames are of another class, or jump away from where the image put the pattern,
// does not.
TEST(Classes, TheDataContinuesItsImagesAndVideosThatDoNotAreCounted) {
  test::TempDir dir("classes-condition");
  auto spec = classes_spec(dir);
  spec.latent = {4, 4, 16, 16};
  spec.condition = ImageCondition::kTi2v;
  data::write_synthetic_dataset(spec);
  const auto info = data::validate_dataset(spec.output, {});
  const auto classes = data::read_dataset_classes(spec.output);
  std::vector<std::int64_t> all(40);
  for (std::int64_t i = 0; i < 40; ++i) all[static_cast<std::size_t>(i)] = i;
  const auto batch = data::DatasetReader(info).read(all);
  ASSERT_TRUE(batch.condition.defined());
  const auto image = data::classify_frames(batch.condition, classes.patterns.narrow(2, 0, 1));
  const auto frames = data::classify_frames(batch.latents, classes.patterns);
  EXPECT_EQ(frames.label.sizes(), torch::IntArrayRef({40, 4}));
  EXPECT_TRUE(torch::equal(image.label.select(1, 0), torch::arange(40, torch::kLong).remainder(5)));
  EXPECT_EQ(data::condition_accuracy(frames, image), 1.0) << "lowest cosine " << frames.cosine.min().item<double>();
  // Sample 0's later frames from sample 1 (another class); sample 2's frames 1-3 moved 4 columns.
  auto other = batch.latents.clone();
  other[0].narrow(1, 1, 3).copy_(batch.latents[1].narrow(1, 1, 3));
  other[2].narrow(1, 1, 3).copy_(torch::roll(batch.latents[2].narrow(1, 1, 3), {4}, {3}));
  const auto broken = data::classify_frames(other, classes.patterns);
  EXPECT_NEAR(data::condition_accuracy(broken, image), 38.0 / 40.0, 1e-12);
  EXPECT_EQ(broken.label[2][1].item<std::int64_t>(), 2);  // sample 2 keeps its class: only the jump counts
}

TEST(Classes, ASmoothDataSetHasNoClasses) {
  test::TempDir dir("no-classes");
  auto spec = classes_spec(dir);
  spec.kind = DatasetKind::kSmooth;
  data::write_synthetic_dataset(spec);
  EXPECT_FALSE(data::read_dataset_classes(spec.output).present());
}

}  // namespace
}  // namespace wd::test_classes
