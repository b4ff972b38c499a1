// Topology: this process's place in the job (rank, world size, local rank, role), passed by value.
#pragma once

#include <string>

namespace wd {

/// What a rank does in the distillation job.
enum class Role { kTeacher, kStudent };

const char* role_name(Role role);

/// The GPU of node-local rank `local_rank` on a node with `gpus` GPUs: ranks take the GPUs in
/// order and wrap round, so ranks share a GPU only when the node has more ranks than GPUs.
int gpu_of_local_rank(int local_rank, int gpus);

/// Rank and role as plain values (never globals), so per-rank logic can be tested for several
/// ranks side by side in one process.
struct Topology {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  ///< rank among the processes on the same node
  int local_size = 1;
  Role role = Role::kTeacher;

  /// A one-process job (tools such as `forward` and `inspect`).
  static Topology single_process(Role role = Role::kTeacher);

  /// "rank 3/16 student", the tag every log line carries.
  std::string describe() const;
};

}  // namespace wd
