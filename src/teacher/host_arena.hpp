// HostArena: one copy per node of a streamed teacher's blocks, in its compute dtype, in a POSIX
// shared-memory segment that the node's teacher ranks map (and pin with cudaHostRegister where
// they stream to a GPU), so that each block is one DMA from it (docs/placement.md, "The pinned arena").
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace wd::teacher {

/// A mapped segment shared by a node's teacher ranks. The node's first rank creates and fills
/// it; the others map it once it is filled; the name is unlinked as soon as every rank has it
/// mapped, so no /dev/shm entry outlives the load, whatever happens later. Move-only owner of
/// the mapping (and of its CUDA registration).
class HostArena {
 public:
  /// Writes the arena's contents at `data` (the node's first rank only).
  using Fill = std::function<void(std::uint8_t* data)>;

  /// Collective over the ranks of `group` (MPI_COMM_NULL: this rank alone) that share this
  /// node (MPI_Comm_split_type SHARED). The node's first rank decides, and every rank of the
  /// node takes its decision: no arena when `bytes` exceeds `limit`, or when making it failed
  /// there (no space in /dev/shm, a failed fill); then null is returned and `why` says why (the
  /// same text on every rank). `tag` tells the segments of one job apart (the expert); the name
  /// is /wd-<job id>-<pid of the node's first rank>-<tag>. Waits at most `timeout_s` for the
  /// node's first rank.
  static std::unique_ptr<HostArena> create(MPI_Comm group, const std::string& tag, std::uint64_t bytes,
                                           std::uint64_t limit, const Fill& fill, double timeout_s,
                                           std::string& why);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  std::uint8_t* data() const noexcept { return data_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// The segment's name (unlinked once every rank of the node mapped it).
  const std::string& name() const noexcept { return name_; }
  /// The segment's inode: the same on every rank of a node (one copy).
  ino_t inode() const noexcept { return inode_; }
  /// This rank created and filled the segment (the node's first rank); the others only mapped it.
  bool filled_here() const noexcept { return filled_here_; }
  /// Ranks of the node that share it.
  int node_ranks() const noexcept { return node_ranks_; }
  /// Registers the mapping with CUDA (cudaHostRegister, each rank its own address) so that
  /// copies from it are DMA at full speed; false, with `why`, where that fails or the build
  /// has no CUDA toolkit (copies then run from pageable memory). Unregistered on destruction.
  bool pin_for_cuda(std::string& why);
  bool pinned() const noexcept { return pinned_; }

  /// A name for segments of this job: SLURM_JOB_ID, else Open MPI's / PMIx's job, else "nojob",
  /// reduced to [A-Za-z0-9_.-].
  static std::string job_id();

 private:
  HostArena(std::string name, std::uint8_t* data, std::uint64_t bytes, ino_t inode, bool filled_here);
  void unlink() noexcept;

  std::string name_;
  std::uint8_t* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  ino_t inode_ = 0;
  bool filled_here_ = false;
  bool linked_ = false;  ///< the name still exists in /dev/shm (the creator unlinks it)
  bool pinned_ = false;
  int node_ranks_ = 1;
};

}  // namespace wd::teacher
