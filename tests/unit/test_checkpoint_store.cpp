// CheckpointStore: round trip, pruning, corruption found and skipped, and a save killed midway.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/checkpoint_store.hpp"
#include "core/checksum.hpp"
#include "core/errors.hpp"
#include "test_util.hpp"

namespace wd::test_checkpoint_store {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& content) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << content;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A checkpoint of two files, one in a subdirectory, whose content depends on `step`.
std::function<void(const std::string&)> files_for(std::int64_t step) {
  return [step](const std::string& dir) {
    write(fs::path(dir) / "weights.bin", std::string(1000 + step, static_cast<char>('a' + step % 26)));
    write(fs::path(dir) / "student" / "config.json", "{\"step\": " + std::to_string(step) + "}");
  };
}

std::vector<std::int64_t> steps(const CheckpointStore& store) {
  std::vector<std::int64_t> out;
  for (const auto& e : store.list()) out.push_back(e.step);
  return out;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Runs `f` and returns the DataError it throws (fails the test when it throws none).
DataError data_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e;
  }
  ADD_FAILURE() << "no DataError thrown";
  return DataError("", "", "");
}

TEST(CheckpointStore, SaveWritesManifestAndVerifies) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str("checkpoints"));
  const auto path = store.save(100, files_for(100));
  EXPECT_EQ(path, (fs::path(tmp.str("checkpoints")) / "step-00000100").string());
  EXPECT_EQ(names_in(tmp.str("checkpoints")), std::vector<std::string>{"step-00000100"});  // no leftovers
  EXPECT_EQ(read(fs::path(path) / "student" / "config.json"), "{\"step\": 100}");

  const auto m = CheckpointStore::verify(path);
  EXPECT_EQ(m.step, 100);
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[0].path, "student/config.json");
  EXPECT_EQ(m.files[1].path, "weights.bin");
  EXPECT_EQ(m.files[1].bytes, 1100u);
  EXPECT_EQ(m.files[1].xxh64, file_xxh64_hex(path + "/weights.bin"));
  EXPECT_EQ(m.created.size(), 20u);  // 2024-01-02T03:04:05Z

  const auto json = nlohmann::json::parse(read(fs::path(path) / "manifest.json"));
  EXPECT_EQ(json.at("format"), "wan-distill-checkpoint");
  EXPECT_EQ(json.at("version"), 1);
  EXPECT_EQ(json.at("step"), 100);

  const auto latest = store.latest_good();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 100);
  EXPECT_EQ(latest->path, path);
}

TEST(CheckpointStore, KeepsTheNewestK) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str(), 2);
  for (std::int64_t s : {10, 20, 30, 40}) store.save(s, files_for(s));
  EXPECT_EQ(steps(store), (std::vector<std::int64_t>{40, 30}));
  EXPECT_EQ(names_in(tmp.str()), (std::vector<std::string>{"step-00000030", "step-00000040"}));

  test::TempDir all("wd-ckpt");
  CheckpointStore keep_all(all.str(), 0);
  for (std::int64_t s : {1, 2, 3}) keep_all.save(s, files_for(s));
  EXPECT_EQ(steps(keep_all), (std::vector<std::int64_t>{3, 2, 1}));
  keep_all.remove(2);
  EXPECT_EQ(steps(keep_all), (std::vector<std::int64_t>{3, 1}));
}

TEST(CheckpointStore, SavingAnOlderStepNeverPrunesItNorNewerOnes) {
  // A run resumed from step 20 saves 30 while an abandoned step-50 exists: the new one stays.
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str(), 1);
  store.save(20, files_for(20));
  store.save(50, files_for(50));
  store.save(30, files_for(30));
  EXPECT_EQ(steps(store), (std::vector<std::int64_t>{50, 30}));
}

TEST(CheckpointStore, ListIgnoresOtherNames) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str());
  store.save(7, files_for(7));
  fs::create_directories(tmp.path() / "step-abc");
  fs::create_directories(tmp.path() / "notes");
  write(tmp.path() / "step-00000009", "a file, not a checkpoint");
  EXPECT_EQ(steps(store), std::vector<std::int64_t>{7});
}

TEST(CheckpointStore, CorruptByteIsNamedAndSkipped) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str());
  store.save(1, files_for(1));
  const auto newest = store.save(2, files_for(2));
  const auto victim = newest + "/weights.bin";
  const auto before = file_xxh64_hex(victim);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('#');
  }
  const auto e = data_error([&] { CheckpointStore::verify(newest); });
  EXPECT_EQ(e.file(), victim);
  EXPECT_EQ(e.item(), "weights.bin");
  EXPECT_TRUE(test::contains(e.what(), "checksum mismatch: expected xxh64 " + before + ", found " +
                                           file_xxh64_hex(victim)))
      << e.what();
  const auto latest = store.latest_good();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 1);
}

TEST(CheckpointStore, TruncatedOrMissingFileIsNamed) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str());
  const auto path = store.save(3, files_for(3));
  fs::resize_file(path + "/weights.bin", 10);
  auto e = data_error([&] { CheckpointStore::verify(path); });
  EXPECT_EQ(e.file(), path + "/weights.bin");
  EXPECT_TRUE(test::contains(e.what(), "size mismatch: expected 1003 bytes, found 10")) << e.what();

  fs::remove(path + "/student/config.json");
  e = data_error([&] { CheckpointStore::verify(path); });
  EXPECT_EQ(e.item(), "student/config.json");
  EXPECT_TRUE(test::contains(e.what(), "missing")) << e.what();
  EXPECT_FALSE(store.latest_good().has_value());
}

TEST(CheckpointStore, MissingOrGarbledManifestIsADataError) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str());
  store.save(1, files_for(1));
  const auto path = store.save(2, files_for(2));
  const auto manifest = path + "/manifest.json";
  write(manifest, "{\"format\": \"wan-distill-checkpoint\", \"version\": 1, \"step\": 2, \"files\": [");
  auto e = data_error([&] { CheckpointStore::verify(path); });
  EXPECT_EQ(e.file(), manifest);
  EXPECT_TRUE(test::contains(e.what(), "not valid JSON")) << e.what();

  write(manifest, "{\"format\": \"wan-distill-checkpoint\", \"version\": 1, \"step\": 3, \"files\": []}");
  e = data_error([&] { CheckpointStore::verify(path); });
  EXPECT_EQ(e.item(), "step");  // the directory says 2

  write(manifest, "{\"format\": \"other\", \"version\": 1, \"step\": 2, \"files\": []}");
  EXPECT_EQ(data_error([&] { CheckpointStore::verify(path); }).item(), "format");

  write(manifest, "{\"format\": \"wan-distill-checkpoint\", \"version\": 1, \"step\": 2, \"files\": "
                  "[{\"path\": \"../escape\", \"bytes\": 1, \"xxh64\": \"0000000000000000\"}]}");
  EXPECT_EQ(data_error([&] { CheckpointStore::verify(path); }).item(), "../escape");

  fs::remove(manifest);
  e = data_error([&] { CheckpointStore::verify(path); });
  EXPECT_EQ(e.file(), manifest);
  EXPECT_TRUE(test::contains(e.what(), "missing")) << e.what();
  EXPECT_EQ(store.latest_good()->step, 1);
}

TEST(CheckpointStore, FailedWriterLeavesNothing) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str());
  EXPECT_THROW(store.save(5,
                          [](const std::string& dir) {
                            write(fs::path(dir) / "half.bin", "x");
                            throw std::runtime_error("disk full");
                          }),
               std::runtime_error);
  EXPECT_TRUE(names_in(tmp.str()).empty());
  EXPECT_THROW(store.save(6, [](const std::string& dir) { write(fs::path(dir) / "manifest.json", "{}"); }), Error);
  EXPECT_TRUE(names_in(tmp.str()).empty());
}

TEST(CheckpointStore, SavingTheSameStepReplacesIt) {
  test::TempDir tmp("wd-ckpt");
  CheckpointStore store(tmp.str());
  store.save(4, files_for(4));
  const auto path = store.save(4, [](const std::string& dir) { write(fs::path(dir) / "other.bin", "new"); });
  EXPECT_EQ(names_in(tmp.str()), std::vector<std::string>{"step-00000004"});
  const auto m = CheckpointStore::verify(path);
  ASSERT_EQ(m.files.size(), 1u);
  EXPECT_EQ(m.files[0].path, "other.bin");
}

TEST(CheckpointStore, InterruptedReplaceIsUndoneOnOpen) {
  // The non-RENAME_EXCHANGE path moves the old checkpoint aside first; if the process dies
  // before the new one is in place, opening the store puts the old one back.
  test::TempDir tmp("wd-ckpt");
  {
    CheckpointStore store(tmp.str());
    store.save(8, files_for(8));
  }
  fs::rename(tmp.path() / "step-00000008", tmp.path() / ".old-step-00000008-4242");
  CheckpointStore reopened(tmp.str());
  EXPECT_EQ(names_in(tmp.str()), std::vector<std::string>{"step-00000008"});
  EXPECT_EQ(CheckpointStore::verify(tmp.str("step-00000008")).step, 8);
}

TEST(CheckpointStore, SaveKilledMidwayLeavesThePreviousCheckpointIntact) {
  test::TempDir tmp("wd-ckpt");
  const auto root = tmp.str("checkpoints");
  const auto previous = CheckpointStore(root, 2).save(10, files_for(10));

  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    // Only file I/O here: the child dies by SIGKILL, as an OOM kill or node failure would.
    try {
      CheckpointStore store(root, 2);
      store.save(20, [](const std::string& dir) {
        write(fs::path(dir) / "weights.bin", std::string(1 << 20, 'w'));
        write(fs::path(dir) / "student" / "half.bin", std::string(100, 'h'));
        std::raise(SIGKILL);
      });
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(1);  // not reached when the kill works
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  const auto stale = ".tmp-step-00000020-" + std::to_string(child);
  EXPECT_EQ(names_in(root), (std::vector<std::string>{stale, "step-00000010"}));
  EXPECT_EQ(CheckpointStore::verify(previous).step, 10);
  EXPECT_EQ(read(fs::path(previous) / "student" / "config.json"), "{\"step\": 10}");

  CheckpointStore reopened(root, 2);  // removes the stale temporary directory
  EXPECT_EQ(names_in(root), std::vector<std::string>{"step-00000010"});
  const auto latest = reopened.latest_good();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->path, previous);
  reopened.save(20, files_for(20));
  EXPECT_EQ(steps(reopened), (std::vector<std::int64_t>{20, 10}));
}

}  // namespace
}  // namespace wd::test_checkpoint_store
