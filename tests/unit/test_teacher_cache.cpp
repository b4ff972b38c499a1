// The teacher cache's shards, index and source: what a source made reads back bit for bit, per
// stream and past the end (cycling); the index waits for every shard; an altered or truncated
// shard is a DataError naming the file and the message; other keys are refused naming each; a
// shard cut short is redone; a recorder (a train writing the cache as it streams) writes the same
// shards, completing on resume the shard it stopped inside. The source here is flow's targets (the data alone, no teacher): the
// cache stores whatever message a source makes.
#include <gtest/gtest.h>

#include <fstream>

#include "comm/stream_plan.hpp"
#include "data/dataset_info.hpp"
#include "data/dataset_reader.hpp"
#include "data/h5_file.hpp"
#include "data/synthetic_dataset.hpp"
#include "job/run_config.hpp"
#include "teacher/cache_recorder.hpp"
#include "teacher/flow_targets.hpp"
#include "teacher/teacher_cache.hpp"
#include "test_util.hpp"

namespace wd::test_teacher_cache {
namespace {

namespace fs = std::filesystem;

/// A small data set and the layout of a cache of 2 streams: 1 held-out message, 5 training
/// messages in shards of 2 (2 + 2 + 1).
struct Fixture {
  test::TempDir dir{"teacher-cache"};
  data::DatasetInfo info;
  comm::StreamPlan plan;
  data::NoiseConfig noise;
  teacher::CacheLayout layout{2, 2, 1, 5, 2};
  std::string cache = dir.str("cache");

  Fixture() {
    data::SyntheticDatasetSpec spec;
    spec.output = dir.str("data.h5");
    spec.samples = 24;
    spec.latent = {4, 1, 8, 8};
    spec.text_len = 6;
    spec.text_dim = 8;
    spec.seed = 3;
    data::write_synthetic_dataset(spec);
    info = data::validate_dataset(spec.output, {});
    plan.batch_per_student = 2;
    plan.eval_messages = 1;
    plan.train_steps = 5;
    plan.latent = info.latent_shape;
  }
};

/// Flow's targets of stream `student` of `fx`'s layout (each its own replica of 2 samples).
struct Stream {
  data::DatasetReader reader;
  data::SampleSchedule schedule;
  data::FlowMatchingNoiser noiser, eval_noiser;
  teacher::FlowTargets targets;

  Stream(const Fixture& fx, int student)
      : reader(fx.info),
        schedule(20, 2, fx.layout.students, 11),
        noiser(fx.noise, 11),
        eval_noiser(fx.noise, 12),
        targets({{reader, schedule, noiser, eval_noiser, student, fx.layout.students, 2, 20}, fx.plan, {1, 2, 2}, 0.0,
                 11}) {}
};

/// Writes every shard of `fx`'s layout (or those `keep` accepts) and, when all are there, the index.
bool generate(const Fixture& fx, const std::function<bool(const teacher::ShardId&)>& keep = nullptr) {
  fs::create_directories(fx.cache);
  for (const auto& id : teacher::cache_shards(fx.layout)) {
    if (keep && !keep(id)) continue;
    Stream s(fx, id.student);
    teacher::write_shard(fx.cache, id, s.targets, fx.layout.batch);
  }
  return teacher::write_index_if_complete(fx.cache, {{"teacher.shift", "5"}}, fx.layout);
}

void expect_same_batch(const teacher::StageBatch& a, const teacher::StageBatch& b, const std::string& where) {
  EXPECT_TRUE(torch::equal(a.x_t, b.x_t)) << where;
  EXPECT_TRUE(torch::equal(a.t, b.t)) << where;
  EXPECT_TRUE(torch::equal(a.context, b.context)) << where;
  EXPECT_TRUE(torch::equal(a.context_lens, b.context_lens)) << where;
  EXPECT_TRUE(torch::equal(a.out, b.out)) << where;
}

/// The file offset of row `row` of the contiguous dataset `name` in the HDF5 file `path`.
std::uint64_t row_offset(const std::string& path, const char* name, std::int64_t row) {
  const auto file = data::h5_open_read_only(path);
  const data::H5Dataset set(H5Dopen2(file.get(), name, H5P_DEFAULT));
  const auto dims = data::h5_dims(set.get(), path, name);
  std::uint64_t row_bytes = 4;
  for (std::size_t i = 1; i < dims.size(); ++i) row_bytes *= static_cast<std::uint64_t>(dims[i]);
  return H5Dget_offset(set.get()) + row_bytes * static_cast<std::uint64_t>(row);
}

TEST(TeacherCache, ReadsBackExactlyWhatTheSourceMadeAndCyclesOrStopsPastTheEnd) {
  Fixture fx;
  ASSERT_TRUE(generate(fx));
  const auto index = teacher::read_cache_index(fx.cache);
  EXPECT_EQ(index.shards.size(), 8u);  // per stream: 1 held-out + 3 training shards
  EXPECT_EQ(index.identity.at("teacher.shift"), "5");
  EXPECT_TRUE(index.layout == fx.layout);
  for (int student = 0; student < 2; ++student) {
    teacher::verify_stream(fx.cache, index, student);
    Stream online(fx, student);
    teacher::CacheSource cached(fx.cache, index, student, /*cycle=*/true);
    const auto where = "stream " + std::to_string(student);
    expect_same_batch(cached.make(0, true), online.targets.make(0, true), where + " held-out 0");
    for (std::int64_t p = 0; p < 5; ++p) {
      expect_same_batch(cached.make(p, false), online.targets.make(p, false), where + " position " + std::to_string(p));
    }
    // Past the end: position 7 is the cache's position 2.
    expect_same_batch(cached.make(7, false), online.targets.make(2, false), where + " position 7 (cycled)");
  }
  // The two streams are different replicas: other samples.
  teacher::CacheSource a(fx.cache, index, 0, true), b(fx.cache, index, 1, true);
  EXPECT_FALSE(torch::equal(a.make(0, false).x_t, b.make(0, false).x_t));
  // data.teacher_cache_end stop: the last position reads, the one past it is an error, not a cycle.
  teacher::CacheSource stop(fx.cache, index, 0, /*cycle=*/false);
  const auto last = fx.layout.positions - 1;
  expect_same_batch(stop.make(last, false), a.make(last, false), "the last position, stop");
  EXPECT_THROW(stop.make(last + 1, false), Error);
}

TEST(TeacherCache, TheIndexWaitsForEveryShard) {
  Fixture fx;
  EXPECT_FALSE(generate(fx, [](const teacher::ShardId& id) { return id.student == 0; }));
  try {
    teacher::read_cache_index(fx.cache);
    FAIL() << "an incomplete cache was read";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), (fs::path(fx.cache) / "index.json").string());
    EXPECT_NE(std::string(e.what()).find("not a complete teacher cache"), std::string::npos) << e.what();
  }
  // The rest of the shards complete it.
  EXPECT_TRUE(generate(fx, [](const teacher::ShardId& id) { return id.student == 1; }));
  EXPECT_EQ(teacher::read_cache_index(fx.cache).shards.size(), 8u);
}

TEST(TeacherCache, AnAlteredMessageIsADataErrorNamingTheFileAndTheMessage) {
  Fixture fx;
  ASSERT_TRUE(generate(fx));
  const teacher::ShardId id{0, false, 2, 2};
  const auto path = (fs::path(fx.cache) / id.file_name()).string();
  const auto at = row_offset(path, "teacher_out", 1);  // training message 3 of stream 0
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at + 16));
    const char bad[4] = {0x12, 0x34, 0x56, 0x78};
    f.write(bad, 4);
  }
  const auto index = teacher::read_cache_index(fx.cache);
  teacher::verify_stream(fx.cache, index, 1);  // the other stream is sound
  try {
    teacher::verify_stream(fx.cache, index, 0);
    FAIL() << "the altered shard passed";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("training message 3 of stream 0 (sample 1 of this shard) does not match its "
                                         "checksum"),
              std::string::npos)
        << e.what();
  }
}

TEST(TeacherCache, ATruncatedShardIsADataErrorNamingTheFileAndItsMessages) {
  Fixture fx;
  ASSERT_TRUE(generate(fx));
  const teacher::ShardId id{1, false, 4, 1};
  const auto path = (fs::path(fx.cache) / id.file_name()).string();
  fs::resize_file(path, fs::file_size(path) / 2);
  try {
    teacher::verify_stream(fx.cache, teacher::read_cache_index(fx.cache), 1);
    FAIL() << "the truncated shard passed";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("the shard of training message 4 of stream 1 to 4 is truncated or corrupt"),
              std::string::npos)
        << e.what();
  }
}

TEST(TeacherCache, OtherKeysAreRefusedNamingEachKey) {
  const teacher::CacheIdentity cache{{"teacher.shift", "5"}, {"teacher", "xxh64 aa"}, {"train.seed", "0"}};
  const teacher::CacheIdentity run{{"teacher.shift", "3"}, {"teacher", "xxh64 aa"}, {"student.steps", "4"}};
  teacher::check_identity("data.teacher_cache(c)", cache, cache, "this train");  // the same keys pass
  try {
    teacher::check_identity("data.teacher_cache(c)", cache, run, "this train");
    FAIL() << "other keys passed";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("data.teacher_cache(c) was generated for other keys"), std::string::npos) << what;
    EXPECT_NE(what.find("teacher.shift: the cache has '5', this train has '3'"), std::string::npos) << what;
    EXPECT_NE(what.find("train.seed: the cache has 0, this train has none"), std::string::npos) << what;
    EXPECT_NE(what.find("student.steps: the cache has none, this train has '4'"), std::string::npos) << what;
    EXPECT_EQ(what.find("teacher:"), std::string::npos) << "the same teacher was named: " << what;
  }
}

TEST(TeacherCache, AShardCutShortIsRedoneAndAResumedCacheIsTheSame) {
  Fixture fx;
  const teacher::CacheIdentity identity{{"teacher.shift", "5"}};
  teacher::claim_cache_dir(fx.cache, identity, fx.layout);
  ASSERT_TRUE(generate(fx));
  const auto straight = teacher::read_cache_index(fx.cache);
  const teacher::ShardId id{0, false, 0, 2};
  EXPECT_TRUE(teacher::shard_complete(fx.cache, id, true));
  // A kill after the file's rename, before its entry: not complete; an altered file neither.
  const auto entry = fs::path(fx.cache) / (id.file_name() + ".json");
  fs::remove(entry);
  EXPECT_FALSE(teacher::shard_complete(fx.cache, id, true));
  Stream s(fx, 0);
  teacher::write_shard(fx.cache, id, s.targets, 2);
  EXPECT_TRUE(teacher::shard_complete(fx.cache, id, true));
  std::ofstream(fs::path(fx.cache) / id.file_name(), std::ios::app) << "x";
  EXPECT_FALSE(teacher::shard_complete(fx.cache, id, true));
  teacher::write_shard(fx.cache, id, s.targets, 2);
  ASSERT_TRUE(teacher::write_index_if_complete(fx.cache, identity, fx.layout));
  EXPECT_EQ(teacher::read_cache_index(fx.cache).xxh64, straight.xxh64);  // the same files, byte for byte
  // Resuming with other keys or another layout is refused.
  EXPECT_THROW(teacher::claim_cache_dir(fx.cache, {{"teacher.shift", "3"}}, fx.layout), ConfigError);
  auto other = fx.layout;
  other.shard_positions = 3;
  EXPECT_THROW(teacher::claim_cache_dir(fx.cache, identity, other), ConfigError);
  teacher::claim_cache_dir(fx.cache, identity, fx.layout);  // the same: resumed
}

/// RunConfig::validate's message for `cfg` ("" when it passes).
std::string problems(const job::RunConfig& cfg) {
  try {
    cfg.validate();
    return "";
  } catch (const ConfigError& e) {
    return e.what();
  }
}

TEST(TeacherCacheKeys, ACacheStandsForTheTeacherRanksOfTheObjectivesThatStreamTargets) {
  job::RunConfig cfg;
  cfg.data.teacher_cache = "cache";
  cfg.teacher.ranks = 0;
  for (const char* objective : {"trajectory", "guided", "velocity"}) {
    cfg.train.objective = objective;
    EXPECT_EQ(problems(cfg), "") << objective;
    EXPECT_TRUE(cfg.students_only()) << objective;
    EXPECT_TRUE(cfg.cache_only()) << objective;
  }
  cfg.teacher.ranks = 1;
  EXPECT_NE(problems(cfg).find("data.teacher_cache: the students read the teacher's batches from the cache, with no "
                               "teacher rank: set teacher.ranks 0, not 1"),
            std::string::npos)
      << problems(cfg);
  // dmd: the cache holds its regression term's batches, and a live teacher answers its real score.
  cfg.teacher.ranks = 0;
  cfg.train.objective = "dmd";
  EXPECT_NE(problems(cfg).find("train.objective dmd and train.dmd_regression_weight(0): without the regression term "
                               "its training batches carry the data alone"),
            std::string::npos)
      << problems(cfg);
  cfg.dmd.regression_weight = 0.5;
  EXPECT_NE(problems(cfg).find("data.teacher_cache with train.objective dmd: the cache holds the training batches, the "
                               "real score needs a live teacher answering the students' own samples: set teacher.ranks "
                               ">= 1 (ranks that answer the real score alone) or teacher.placement colocated, not "
                               "teacher.ranks 0"),
            std::string::npos)
      << problems(cfg);
  cfg.teacher.ranks = 1;
  EXPECT_EQ(problems(cfg), "");
  EXPECT_FALSE(cfg.students_only());  // teacher ranks beside the students
  EXPECT_FALSE(cfg.cache_only());
  cfg.teacher.placement = TeacherPlacement::kColocated;
  EXPECT_EQ(problems(cfg), "");
  EXPECT_TRUE(cfg.students_only());  // each student's own teacher
  cfg.teacher.placement = TeacherPlacement::kAuto;
  cfg.dmd.regression_weight = 0;
  cfg.teacher.ranks = 0;
  cfg.train.objective = "flow";
  EXPECT_NE(problems(cfg).find("train.objective flow: it trains on the data alone, there is no teacher to cache"),
            std::string::npos)
      << problems(cfg);
  cfg.train.objective = "guided";
  cfg.student.features = "1:2";
  EXPECT_NE(problems(cfg).find("student.features(1:2): the cache holds no teacher features yet"), std::string::npos)
      << problems(cfg);
  // Without the cache, teacher.ranks 0 is flow's alone (and says the cache is the other way).
  cfg.student.features.clear();
  cfg.data.teacher_cache.clear();
  EXPECT_NE(problems(cfg).find("needs teacher.ranks >= 1 (or data.teacher_cache)"), std::string::npos)
      << problems(cfg);
}

TEST(TeacherCache, ARecorderWritesTheGeneratedShardsAndCompletesOnResumeTheShardItStoppedInside) {
  Fixture generated;
  ASSERT_TRUE(generate(generated));
  Fixture fx;
  const teacher::CacheIdentity identity{{"teacher.shift", "5"}};
  teacher::claim_cache_dir(fx.cache, identity, fx.layout, "data.teacher_cache_write(" + fx.cache + ")", "this train");
  const auto record = [&](int student, const std::vector<std::int64_t>& positions) {
    Stream plain(fx, student);
    auto inner = std::make_unique<Stream>(fx, student);
    struct Own final : teacher::TargetSource {  // the recorder owns its source
      std::unique_ptr<Stream> s;
      teacher::StageBatch make(std::int64_t p, bool eval) override { return s->targets.make(p, eval); }
    };
    auto own = std::make_unique<Own>();
    own->s = std::move(inner);
    teacher::CacheRecorder recorder(std::move(own), fx.cache, student, 1, fx.layout.batch);
    expect_same_batch(recorder.make(0, true), plain.targets.make(0, true), "held-out 0");
    for (const auto p : positions) {
      expect_same_batch(recorder.make(p, false), plain.targets.make(p, false), "position " + std::to_string(p));
    }
  };
  // Stream 0 stops after position 2, inside its second shard ([2, 4)): that shard is dropped.
  record(0, {0, 1, 2});
  EXPECT_TRUE(teacher::shard_complete(fx.cache, {0, false, 0, 2}, true));
  EXPECT_FALSE(fs::exists(fs::path(fx.cache) / teacher::ShardId{0, false, 2, 2}.file_name()));
  EXPECT_FALSE(fs::exists(fs::path(fx.cache) / (teacher::ShardId{0, false, 2, 2}.file_name() + ".tmp")));
  // Resumed at position 3: position 2 is made again first; then the last shard, and stream 1.
  record(0, {3, 4});
  EXPECT_FALSE(fs::exists(fs::path(fx.cache) / "index.json"));  // stream 1 is missing
  record(1, {0, 1, 2, 3, 4});
  ASSERT_TRUE(fs::exists(fs::path(fx.cache) / "index.json"));
  const auto a = teacher::read_cache_index(fx.cache), b = teacher::read_cache_index(generated.cache);
  EXPECT_EQ(a.xxh64, b.xxh64);  // the same files, shard for shard
  EXPECT_EQ(a.layout, b.layout);
}

}  // namespace
}  // namespace wd::test_teacher_cache
