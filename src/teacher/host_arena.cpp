// HostArena: the node's shared segment (shm_open, fallocate, mmap), its decision broadcast by the
// node's first rank, and the unlink once every rank has it mapped.
#include "teacher/host_arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"
#include "teacher/cuda_host.hpp"

namespace wd::teacher {

namespace {

/// The node's ranks of a group: MPI_Comm_split_type SHARED, freed on scope exit. A null group
/// is this rank alone (no MPI call: the single-process commands need no MPI).
class NodeRanks {
 public:
  explicit NodeRanks(MPI_Comm group) {
    if (group == MPI_COMM_NULL) return;
    WD_CHECK_MPI(MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &comm_));
    WD_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    WD_CHECK_MPI(MPI_Comm_size(comm_, &size_));
    WD_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  }
  ~NodeRanks() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  NodeRanks(const NodeRanks&) = delete;
  NodeRanks& operator=(const NodeRanks&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Broadcasts `buffer` from the node's first rank, waiting at most `timeout_s`.
  void broadcast(void* buffer, int bytes, double timeout_s) {
    if (comm_ == MPI_COMM_NULL) return;
    MPI_Request request = MPI_REQUEST_NULL;
    WD_CHECK_MPI(MPI_Ibcast(buffer, bytes, MPI_BYTE, 0, comm_, &request));
    wait(request, "teacher arena: the node's decision", timeout_s);
  }
  /// Returns once every rank of the node got here, waiting at most `timeout_s`.
  void barrier(double timeout_s) {
    if (comm_ == MPI_COMM_NULL) return;
    MPI_Request request = MPI_REQUEST_NULL;
    WD_CHECK_MPI(MPI_Ibarrier(comm_, &request));
    wait(request, "teacher arena: every rank mapped it", timeout_s);
  }

 private:
  void wait(MPI_Request& request, const char* op, double timeout_s) {
    comm::wait_with_deadline(request, comm::WaitInfo{op, 0, 0, comm::world_ranks_of(comm_)},
                             std::chrono::duration<double>(timeout_s), world_rank_, nullptr);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
};

/// The node's first rank's word to the others: the segment's name, or why there is none.
struct Decision {
  std::int32_t made = 0;
  char text[508] = {};
  void set(const std::string& s) { std::snprintf(text, sizeof text, "%s", s.c_str()); }
};

std::string sanitized(const std::string& s) {
  std::string out;
  for (const char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  return out.substr(0, 64);
}

}  // namespace

std::string HostArena::job_id() {
  for (const char* var : {"SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return sanitized(v);
  }
  return "nojob";
}

HostArena::HostArena(std::string name, std::uint8_t* data, std::uint64_t bytes, ino_t inode, bool filled_here)
    : name_(std::move(name)), data_(data), bytes_(bytes), inode_(inode), filled_here_(filled_here),
      linked_(filled_here) {}

HostArena::~HostArena() {
  if (pinned_) cuda_host_unregister(data_);
  if (data_ != nullptr) ::munmap(data_, bytes_);
  unlink();
}

void HostArena::unlink() noexcept {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

bool HostArena::pin_for_cuda(std::string& why) {
  if (!pinned_) pinned_ = cuda_host_register(data_, bytes_, why);
  return pinned_;
}

namespace {

/// Opens (`create`: creates, reserves and fills) the segment `name` and maps it.
std::unique_ptr<HostArena> map_segment(const std::string& name, std::uint64_t bytes, bool create,
                                       const HostArena::Fill* fill,
                                       std::unique_ptr<HostArena> (*make)(std::string, std::uint8_t*, std::uint64_t,
                                                                           ino_t, bool)) {
  const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) throw SystemError(detail::errno_message("shm_open(" + name + ")"));
  // The owner exists from here on: any failure below unmaps and (creator) unlinks the name.
  std::unique_ptr<HostArena> arena;
  struct stat st {};
  try {
    if (create) {
      // Reserves the pages now: tmpfs would otherwise fail a write past its size with SIGBUS.
      const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) {
        ::shm_unlink(name.c_str());
        errno = rc;
        throw SystemError(detail::errno_message("posix_fallocate(" + name + ", " + format_bytes(static_cast<double>(bytes)) + ")"));
      }
    }
    WD_CHECK_SYS(::fstat(fd, &st), name);
    void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      if (create) ::shm_unlink(name.c_str());
      throw SystemError(detail::errno_message("mmap(" + name + ")"));
    }
    arena = make(name, static_cast<std::uint8_t*>(addr), bytes, st.st_ino, create);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // the mapping keeps the segment
  WD_CHECK(static_cast<std::uint64_t>(st.st_size) == bytes,
           "teacher arena " << name << " holds " << st.st_size << " bytes, expected " << bytes);
  if (create) (*fill)(arena->data());
  return arena;
}

}  // namespace

std::unique_ptr<HostArena> HostArena::create(MPI_Comm group, const std::string& tag, std::uint64_t bytes,
                                             std::uint64_t limit, const Fill& fill, double timeout_s,
                                             std::string& why) {
  WD_CHECK(bytes > 0, "a teacher arena needs a size");
  NodeRanks node(group);
  const auto make = [](std::string n, std::uint8_t* d, std::uint64_t b, ino_t i, bool f) {
    return std::unique_ptr<HostArena>(new HostArena(std::move(n), d, b, i, f));
  };
  std::unique_ptr<HostArena> arena;
  Decision decision;
  if (node.rank() == 0) {
    const auto name = "/wd-" + job_id() + "-" + std::to_string(::getpid()) + "-" + sanitized(tag);
    if (bytes > limit) {
      decision.set("its " + format_bytes(static_cast<double>(bytes)) + " exceed the limit of " +
                   format_bytes(static_cast<double>(limit)));
    } else {
      try {
        arena = map_segment(name, bytes, true, &fill, make);
        decision.made = 1;
        decision.set(name);
      } catch (const std::exception& e) {
        arena.reset();  // unmaps and unlinks
        decision.set(std::string("making it failed: ") + e.what());
      }
    }
  }
  node.broadcast(&decision, static_cast<int>(sizeof decision), timeout_s);
  if (decision.made == 0) {
    why = decision.text;
    return nullptr;
  }
  if (node.rank() != 0) arena = map_segment(decision.text, bytes, false, nullptr, make);
  node.barrier(timeout_s);
  arena->unlink();  // every rank has it mapped: the name is no longer needed (no leak past here)
  arena->node_ranks_ = node.size();
  return arena;
}

}  // namespace wd::teacher
