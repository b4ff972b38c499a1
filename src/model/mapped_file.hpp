// MappedFile: a move-only RAII owner of a read-only (copy-on-write) memory mapping of a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wd {

/// Maps a whole file into memory with MAP_PRIVATE. Pages come from the page cache and are
/// shared with every other process mapping the same file; a write to a page (which the program
/// never does on purpose) gives this process a private copy and never reaches the file.
/// Nothing is read until it is touched.
class MappedFile {
 public:
  /// Opens and maps `path`; throws wd::SystemError naming the path and the failed call.
  static std::shared_ptr<MappedFile> open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&&) noexcept;
  MappedFile& operator=(MappedFile&&) noexcept;

  const std::uint8_t* data() const noexcept { return data_; }
  std::uint8_t* mutable_data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  /// Hints the kernel that [offset, offset+length) will be read soon (madvise WILLNEED).
  void prefetch(std::size_t offset, std::size_t length) const noexcept;
  /// Drops this process's pages of [offset, offset+length) (madvise DONTNEED): they leave the
  /// resident set and stay in the page cache; a later read maps them again. Used by streaming
  /// readers so that reading a whole checkpoint does not grow the resident set by its size.
  void release(std::size_t offset, std::size_t length) const noexcept;

 private:
  MappedFile(std::string path, std::uint8_t* data, std::size_t size);
  std::string path_;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace wd
