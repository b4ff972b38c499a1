// CheckpointStore: the save protocol (temporary directory → manifest → fsync → rename → fsync of
// the root), verification against the manifest, pruning, and clean-up after crashed saves.
#include "core/checkpoint_store.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checksum.hpp"
#include "core/errors.hpp"

namespace wd {

namespace fs = std::filesystem;

namespace {

// Names in the root that are not checkpoints. Everything starting with ".tmp-" is garbage by
// construction: an unfinished save, an old checkpoint swapped out, or one being deleted.
constexpr const char* kTmpPrefix = ".tmp-";
// A checkpoint moved aside while its replacement is renamed in (only where the filesystem
// lacks RENAME_EXCHANGE); it is the good copy until the replacement is in place.
constexpr const char* kOldPrefix = ".old-";
constexpr const char* kManifest = "manifest.json";

void throw_fs(const std::error_code& ec, const std::string& what) {
  throw SystemError(what + " failed: " + ec.message() + " (errno " + std::to_string(ec.value()) + ")");
}

/// fsync of a file or directory by path. Some filesystems refuse fsync on directories (EINVAL);
/// there is nothing stronger to do then, so that case is not an error.
void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  WD_CHECK_SYS(fd, path);
  if (::fsync(fd) != 0 && !(directory && errno == EINVAL)) {
    const auto message = detail::errno_message("fsync(" + path + ")");
    ::close(fd);
    throw SystemError(message);
  }
  ::close(fd);
}

void rename_path(const fs::path& from, const fs::path& to) {
  WD_CHECK_SYS(::rename(from.c_str(), to.c_str()), from.string() + " -> " + to.string());
}

/// Removes a tree; failures are logged, not thrown: it is clean-up of something already unused.
void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) spdlog::warn("could not remove {}: {}", path.string(), ec.message());
}

std::string utc_now_iso() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// Step of a directory named step-<digits>, or -1 for any other name.
std::int64_t parse_step_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 || name.rfind(prefix, 0) != 0) {
    return -1;
  }
  const auto digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(digits);
}

/// Checksums and fsyncs every file under `dir`, writes manifest.json, fsyncs every directory.
void seal(const fs::path& dir, std::int64_t step) {
  std::vector<std::string> files;
  std::vector<fs::path> dirs{dir};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto status = it->symlink_status(ec);
    if (ec) break;
    const auto rel = it->path().lexically_relative(dir).generic_string();
    if (fs::is_directory(status)) {
      dirs.push_back(it->path());
    } else if (fs::is_regular_file(status)) {
      WD_CHECK(rel != kManifest, "checkpoint writer created " << kManifest << ", a name the store reserves");
      files.push_back(rel);
    } else {
      // A link or device would not survive a copy of the checkpoint as the same bytes.
      throw Error("checkpoint writer created " + it->path().string() + ", which is not a regular file");
    }
  }
  if (ec) throw_fs(ec, "listing " + dir.string());
  std::sort(files.begin(), files.end());

  nlohmann::ordered_json listed = nlohmann::ordered_json::array();
  for (const auto& rel : files) {
    const auto path = (dir / rel).string();
    const auto bytes = fs::file_size(path, ec);
    if (ec) throw_fs(ec, "size of " + path);
    listed.push_back({{"path", rel}, {"bytes", bytes}, {"xxh64", file_xxh64_hex(path)}});
    fsync_path(path, false);
  }
  const nlohmann::ordered_json manifest = {{"format", Manifest::kFormat},
                                           {"version", Manifest::kVersion},
                                           {"step", step},
                                           {"files", listed},
                                           {"created", utc_now_iso()}};
  const auto manifest_path = (dir / kManifest).string();
  {
    std::ofstream out(manifest_path, std::ios::binary | std::ios::trunc);
    out << manifest.dump(2) << "\n";
    out.close();
    WD_CHECK_AS(SystemError, out, "writing " << manifest_path << " failed");
  }
  fsync_path(manifest_path, false);
  // Deepest first, so each directory's entries are durable before its parent's.
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) fsync_path(it->string(), true);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  WD_CHECK_AS(SystemError, in, "cannot open " << path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool is_hex16(const std::string& s) {
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// A relative path that stays inside the checkpoint (no "..", not absolute, not the manifest).
bool is_safe_relative(const std::string& rel) {
  const fs::path p(rel);
  if (rel.empty() || p.is_absolute() || rel == kManifest) return false;
  return std::none_of(p.begin(), p.end(), [](const fs::path& part) { return part == ".." || part == "."; });
}

}  // namespace

CheckpointStore::CheckpointStore(std::string root, std::size_t keep) : root_(std::move(root)), keep_(keep) {
  std::error_code ec;
  const bool created = fs::create_directories(root_, ec);
  if (ec) throw_fs(ec, "creating " + root_);
  // The root's own entry must be durable too, or a crash could lose every checkpoint in it.
  if (created) fsync_path(fs::canonical(root_).parent_path().string(), true);
  remove_leftovers();
}

std::string CheckpointStore::dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

void CheckpointStore::remove_leftovers() const {
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0) {
      spdlog::warn("removing {} left by an interrupted checkpoint save", it->path().string());
      remove_tree(it->path());
    } else if (name.rfind(kOldPrefix, 0) == 0) {
      // .old-step-N-<pid>: the previous step-N, moved aside by a replace that did not finish.
      const auto original = name.substr(std::string(kOldPrefix).size(), name.rfind('-') - std::string(kOldPrefix).size());
      const fs::path target = fs::path(root_) / original;
      if (parse_step_name(original) >= 0 && !fs::exists(target)) {
        spdlog::warn("restoring {} from {} (a replace of it was interrupted)", target.string(), name);
        rename_path(it->path(), target);
      } else {
        spdlog::warn("removing {} left by an interrupted checkpoint replace", it->path().string());
        remove_tree(it->path());
      }
    }
  }
  if (ec) throw_fs(ec, "listing " + root_);
}

std::string CheckpointStore::save(std::int64_t step,
                                  const std::function<void(const std::string& dir)>& write_files) {
  WD_CHECK(step >= 0, "checkpoint step must be >= 0, got " << step);
  remove_leftovers();
  const fs::path root(root_);
  const auto name = dir_name(step);
  const auto pid = std::to_string(::getpid());
  const fs::path tmp = root / (kTmpPrefix + name + "-" + pid);
  const fs::path final_path = root / name;

  std::error_code ec;
  fs::create_directory(tmp, ec);
  if (ec) throw_fs(ec, "creating " + tmp.string());
  try {
    write_files(tmp.string());
    seal(tmp, step);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }

  if (!fs::exists(final_path)) {
    rename_path(tmp, final_path);
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    // Swapped in one step: the old checkpoint now sits at `tmp`, a name clean-up removes.
    spdlog::warn("replaced existing checkpoint {}", final_path.string());
    fsync_path(root_, true);
    remove_tree(tmp);
  } else if (const int err = errno; err != EINVAL && err != ENOSYS && err != EOPNOTSUPP) {
    errno = err;
    throw SystemError(detail::errno_message("renameat2(" + tmp.string() + ", " + final_path.string() +
                                            ", RENAME_EXCHANGE)"));
  } else {
    // No atomic swap on this filesystem: move the old one aside under a name that clean-up
    // restores if we die before the new one is in place.
    const fs::path old = root / (kOldPrefix + name + "-" + pid);
    rename_path(final_path, old);
    rename_path(tmp, final_path);
    fsync_path(root_, true);
    spdlog::warn("replaced existing checkpoint {}", final_path.string());
    remove_tree(old);
  }
  fsync_path(root_, true);
  prune(step);
  return final_path.string();
}

void CheckpointStore::prune(std::int64_t saved_step) {
  if (keep_ == 0) return;
  std::size_t kept = 0;
  for (const auto& e : list()) {
    if (e.step > saved_step) {
      // Left by a run this one resumed before; never deleted here (the caller decides).
      spdlog::warn("checkpoint {} is newer than the one just saved (step {}); keeping it", e.path, saved_step);
      continue;
    }
    if (++kept > keep_) {
      spdlog::info("pruning checkpoint {} (keeping the newest {})", e.path, keep_);
      remove(e.step);
    }
  }
}

void CheckpointStore::remove(std::int64_t step) {
  const fs::path path = fs::path(root_) / dir_name(step);
  if (!fs::exists(path)) return;
  // Renamed first, so a crash mid-delete leaves garbage, never a half checkpoint named step-N.
  const fs::path doomed = fs::path(root_) / (kTmpPrefix + std::string("del-") + dir_name(step) + "-" +
                                             std::to_string(::getpid()));
  rename_path(path, doomed);
  fsync_path(root_, true);
  remove_tree(doomed);
}

std::vector<CheckpointStore::Entry> CheckpointStore::list() const {
  std::vector<Entry> out;
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    const auto step = parse_step_name(it->path().filename().string());
    if (step >= 0 && it->is_directory(ec)) out.push_back({step, it->path().string()});
  }
  if (ec) throw_fs(ec, "listing " + root_);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step > b.step; });
  return out;
}

Manifest CheckpointStore::verify(const std::string& dir) {
  const auto manifest_path = (fs::path(dir) / kManifest).string();
  std::error_code ec;
  WD_CHECK_DATA(fs::is_regular_file(manifest_path, ec), manifest_path, kManifest,
                "missing: the checkpoint was not completed or is not a checkpoint");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(manifest_path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(manifest_path, kManifest, std::string("not valid JSON: ") + e.what());
  }
  Manifest m;
  try {
    WD_CHECK_DATA(j.is_object(), manifest_path, kManifest, "expected a JSON object");
    const auto format = j.at("format").get<std::string>();
    WD_CHECK_DATA(format == Manifest::kFormat, manifest_path, "format",
                  "expected \"" << Manifest::kFormat << "\", found \"" << format << "\"");
    const auto version = j.at("version").get<int>();
    WD_CHECK_DATA(version == Manifest::kVersion, manifest_path, "version",
                  "expected " << Manifest::kVersion << ", found " << version);
    m.step = j.at("step").get<std::int64_t>();
    m.created = j.value("created", "");
    for (const auto& f : j.at("files")) {
      ManifestFile file{f.at("path").get<std::string>(), f.at("bytes").get<std::uint64_t>(),
                        f.at("xxh64").get<std::string>()};
      WD_CHECK_DATA(is_safe_relative(file.path), manifest_path, file.path, "not a path inside the checkpoint");
      WD_CHECK_DATA(is_hex16(file.xxh64), manifest_path, file.path,
                    "xxh64 must be 16 lowercase hex digits, found \"" << file.xxh64 << "\"");
      m.files.push_back(std::move(file));
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(manifest_path, kManifest, std::string("malformed: ") + e.what());
  }
  const auto named_step = parse_step_name(fs::path(dir).lexically_normal().filename().string());
  WD_CHECK_DATA(named_step < 0 || named_step == m.step, manifest_path, "step",
                "expected " << named_step << " (the directory's name), found " << m.step);

  for (const auto& f : m.files) {
    const auto path = (fs::path(dir) / f.path).string();
    const auto status = fs::status(path, ec);
    WD_CHECK_DATA(fs::exists(status), path, f.path, "missing (listed in the manifest with " << f.bytes << " bytes)");
    WD_CHECK_DATA(fs::is_regular_file(status), path, f.path, "not a regular file");
    const auto bytes = fs::file_size(path, ec);
    if (ec) throw_fs(ec, "size of " + path);
    WD_CHECK_DATA(bytes == f.bytes, path, f.path,
                  "size mismatch: expected " << f.bytes << " bytes, found " << bytes);
    const auto found = file_xxh64_hex(path);
    WD_CHECK_DATA(found == f.xxh64, path, f.path,
                  "checksum mismatch: expected xxh64 " << f.xxh64 << ", found " << found);
  }
  return m;
}

std::optional<CheckpointStore::Entry> CheckpointStore::latest_good() const {
  for (const auto& e : list()) {
    try {
      verify(e.path);
      return e;
    } catch (const Error& err) {
      spdlog::warn("checkpoint {} refused: {}", e.path, err.what());
    }
  }
  return std::nullopt;
}

}  // namespace wd
