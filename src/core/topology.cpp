// Topology helpers.
#include "core/topology.hpp"

namespace wd {

const char* role_name(Role role) {
  switch (role) {
    case Role::kTeacher:
      return "teacher";
    case Role::kStudent:
      return "student";
  }
  return "unknown";
}

int gpu_of_local_rank(int local_rank, int gpus) { return gpus > 0 ? local_rank % gpus : 0; }

Topology Topology::single_process(Role role) {
  Topology t;
  t.role = role;
  return t;
}

std::string Topology::describe() const {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " " + role_name(role);
}

}  // namespace wd
