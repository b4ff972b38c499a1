// MappedFile: open, map, prefetch and unmap a whole file.
#include "model/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "core/errors.hpp"

namespace wd {
namespace {

/// Closes a file descriptor on scope exit; the mapping outlives the descriptor.
class FdGuard {
 public:
  explicit FdGuard(int fd) noexcept : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SystemError(detail::errno_message("open(" + path + ")"));
  FdGuard guard(fd);

  struct stat st {};
  WD_CHECK_SYS(::fstat(fd, &st), path);
  // open() succeeds on a directory, and mmap on one fails with an obscure ENODEV.
  if (!S_ISREG(st.st_mode)) {
    throw SystemError(path + ": not a regular file, cannot be mapped");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    // mmap rejects a zero length; an empty file is still a valid (empty) mapping.
    return std::shared_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  }

  // PROT_WRITE + MAP_PRIVATE: torch tensors over the mapping are mutable types, and a stray
  // write must copy the page rather than fault or reach the file. MAP_NORESERVE keeps the
  // kernel's overcommit heuristic from charging the whole file as private memory, which would
  // refuse to map a checkpoint shard larger than RAM + swap.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  if (addr == MAP_FAILED) {
    throw SystemError(
        detail::errno_message("mmap(" + std::to_string(size) + " bytes) [" + path + "]"));
  }
  return std::shared_ptr<MappedFile>(new MappedFile(path, static_cast<std::uint8_t*>(addr), size));
}

MappedFile::MappedFile(std::string path, std::uint8_t* data, std::size_t size)
    : path_(std::move(path)), data_(data), size_(size) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::prefetch(std::size_t offset, std::size_t length) const noexcept {
  if (data_ == nullptr || offset >= size_ || length == 0) return;
  if (length > size_ - offset) length = size_ - offset;
  // madvise needs a page-aligned start; widen the range down to the page boundary.
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const std::size_t page = page_size > 0 ? static_cast<std::size_t>(page_size) : 4096;
  const std::size_t start = offset - offset % page;
  // A failed hint only costs speed, so its result is ignored.
  (void)::madvise(data_ + start, length + (offset - start), MADV_WILLNEED);
}

void MappedFile::release(std::size_t offset, std::size_t length) const noexcept {
  if (data_ == nullptr || offset >= size_ || length == 0) return;
  if (length > size_ - offset) length = size_ - offset;
  // Only whole pages inside the range are dropped: a page shared with a neighbouring tensor
  // that is still in use stays. The mapping is never written, so nothing can be lost.
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const std::size_t page = page_size > 0 ? static_cast<std::size_t>(page_size) : 4096;
  const std::size_t start = (offset + page - 1) / page * page;
  const std::size_t end = (offset + length) / page * page;
  if (end <= start) return;
  (void)::madvise(data_ + start, end - start, MADV_DONTNEED);
}

}  // namespace wd
