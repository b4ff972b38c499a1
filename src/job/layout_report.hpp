// The rank layout as `layout` prints it before a job and `train` logs it at start-up: one
// function, so the two cannot disagree on what they show.
#pragma once

#include <string>
#include <vector>

#include "comm/backend_choice.hpp"
#include "comm/process_groups.hpp"

namespace wd::job {

/// Where one world rank runs: its device (host name, CUDA index or -1) and node-local rank.
struct RankPlace {
  comm::RankDevice device;
  int local_rank = 0;
};

/// The headline (ranks, nodes, teachers in replicas, students per replica, where the replicas
/// sit), one row a world rank (node, local rank, device, role, replica, slot), then which
/// library carries each teacher -> student link, each link between shard stages and the
/// gradient all-reduce, and why (comm::choose_backend with comm.backend `backend`). `places`
/// has one entry per world rank; a node is named by its ranks' host.
std::string describe_layout(const comm::Layout& layout, const std::vector<RankPlace>& places,
                            CommBackend backend);

}  // namespace wd::job
