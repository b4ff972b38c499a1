// CheckpointStore: crash-safe checkpoint directories (write to a temporary directory, checksum
// every file into manifest.json, fsync, atomic rename), verification, pruning, and the newest
// checkpoint that verifies.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace wd {

/// One file listed in a checkpoint's manifest.json.
struct ManifestFile {
  std::string path;  ///< relative to the checkpoint directory, '/'-separated
  std::uint64_t bytes = 0;
  std::string xxh64;  ///< 16 lowercase hex digits
};

/// The parsed manifest.json of a checkpoint.
struct Manifest {
  static constexpr const char* kFormat = "wan-distill-checkpoint";
  static constexpr int kVersion = 1;
  std::int64_t step = 0;
  std::string created;  ///< ISO 8601 UTC
  std::vector<ManifestFile> files;
};

/// The checkpoints of one run under `root`, named step-00000100 (8+ digits, zero-padded).
/// One process writes to a root at a time (the leader); readers may be anywhere.
class CheckpointStore {
 public:
  struct Entry {
    std::int64_t step = 0;
    std::string path;
  };

  /// Creates `root` if needed and removes what crashed saves left (logged as warnings).
  /// `keep` = how many checkpoints save() leaves (the newest); 0 keeps all.
  explicit CheckpointStore(std::string root, std::size_t keep = 0);

  const std::string& root() const noexcept { return root_; }

  /// Writes checkpoint `step`: `write_files(tmp)` fills a temporary directory, then every file
  /// is checksummed into manifest.json, everything is fsynced, and the directory is renamed to
  /// step-<step> (replacing one of the same step atomically). Then prunes older checkpoints
  /// down to `keep`. Returns the final path. If write_files throws, nothing is left behind.
  std::string save(std::int64_t step, const std::function<void(const std::string& dir)>& write_files);

  /// The checkpoints present (complete or not), newest step first.
  std::vector<Entry> list() const;

  /// Removes checkpoint `step` (atomically: renamed away first); no-op when absent.
  void remove(std::int64_t step);

  /// Checks `dir` against its manifest: every listed file present with its size and XXH64.
  /// Throws wd::DataError naming the file, the item and expected vs found.
  static Manifest verify(const std::string& dir);

  /// The newest checkpoint that verifies; each one refused is logged as a warning with why.
  std::optional<Entry> latest_good() const;

  /// The directory name of checkpoint `step` ("step-00000100").
  static std::string dir_name(std::int64_t step);

 private:
  void remove_leftovers() const;
  void prune(std::int64_t saved_step);

  std::string root_;
  std::size_t keep_;
};

}  // namespace wd
