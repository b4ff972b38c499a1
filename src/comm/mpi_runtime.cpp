// MpiRuntime, the MPI error formatter behind WD_CHECK_MPI, and the polling waits with deadlines.
#include "comm/mpi_runtime.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace wd::comm {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::string mpi_error_message(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  std::string reason;
  if (MPI_Error_string(code, text, &len) == MPI_SUCCESS && len > 0) {
    reason.assign(text, static_cast<std::size_t>(len));
  } else {
    reason = "MPI error code " + std::to_string(code);
  }
  return std::string(call) + " failed: " + reason + " " + call_site(file, line);
}

std::pair<int, int> rank_and_size(MPI_Comm comm, const char* what) {
  WD_CHECK(comm != MPI_COMM_NULL, what << " needs a communicator; this rank is in none");
  int rank = 0, size = 0;
  WD_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  WD_CHECK_MPI(MPI_Comm_size(comm, &size));
  return {rank, size};
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  WD_CHECK_MPI(MPI_Comm_size(comm, &size));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  WD_CHECK_MPI(MPI_Comm_group(comm, &group));
  WD_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> local(static_cast<std::size_t>(size)), out(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) local[static_cast<std::size_t>(i)] = i;
  const int rc = MPI_Group_translate_ranks(group, size, local.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  WD_CHECK_MPI(rc);
  return out;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  WD_CHECK_MPI(MPI_Initialized(&initialized));
  if (initialized) {
    // Someone else (a test harness, an embedding program) owns MPI: use it, never finalize it.
    owner_ = false;
  } else {
    int provided = 0;
    WD_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      throw MpiError("MPI_Init_thread provided thread level " + std::to_string(provided) +
                     ", below MPI_THREAD_FUNNELED");
    }
  }
  // Failures come back as return codes, which WD_CHECK_MPI turns into exceptions that name the
  // call and rank, instead of MPI killing the job with its own terse message.
  WD_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  WD_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  WD_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Comm node = MPI_COMM_NULL;
  WD_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  const int rc_rank = MPI_Comm_rank(node, &local_rank_);
  const int rc_size = MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  WD_CHECK_MPI(rc_rank);
  WD_CHECK_MPI(rc_size);
}

MpiRuntime::MpiRuntime(MpiRuntime&& other) noexcept
    : owner_(other.owner_),
      rank_(other.rank_),
      size_(other.size_),
      local_rank_(other.local_rank_),
      local_size_(other.local_size_) {
  other.owner_ = false;
}

MpiRuntime::~MpiRuntime() {
  if (!owner_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiRuntime::abort(int code) {
  owner_ = false;
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever does.
}

void MpiRuntime::exit_without_finalize(int code) {
  owner_ = false;
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

bool cancel_and_settle(std::vector<MPI_Request*> requests) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return true;
  for (MPI_Request* r : requests) {
    if (*r == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (!done && *r != MPI_REQUEST_NULL) MPI_Cancel(r);
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  for (;;) {
    bool pending = false;
    for (MPI_Request* r : requests) {
      if (*r == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) *r = MPI_REQUEST_NULL;
      pending = pending || *r != MPI_REQUEST_NULL;
    }
    if (!pending) return true;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (MPI_Request* r : requests) {
    if (*r != MPI_REQUEST_NULL) MPI_Request_free(r);
  }
  return false;
}

void keep_until_exit(const torch::Tensor& buffer) noexcept {
  try {
    static_cast<void>(new torch::Tensor(buffer));  // deliberately never freed
  } catch (...) {
  }
}

void wait_with_deadline(MPI_Request& request, const WaitInfo& info,
                        std::chrono::duration<double> timeout, int my_rank, HealthChannel* health) {
  const bool done = poll_until(timeout, [&] {
    int finished = 0;
    WD_CHECK_MPI(MPI_Test(&request, &finished, MPI_STATUS_IGNORE));
    if (!finished) watch_health(health, info.op);
    return finished != 0;
  });
  if (!done) throw_timeout(info, timeout, my_rank, info.peers);
}

void wait_all_with_deadline(std::vector<MPI_Request>& requests, const WaitInfo& info,
                            std::chrono::duration<double> timeout, int my_rank, HealthChannel* health) {
  if (requests.empty()) return;
  const int count = static_cast<int>(requests.size());
  const bool done = poll_until(timeout, [&] {
    int finished = 0;
    WD_CHECK_MPI(MPI_Testall(count, requests.data(), &finished, MPI_STATUSES_IGNORE));
    if (!finished) watch_health(health, info.op);
    return finished != 0;
  });
  if (done) return;
  // With one peer per request, name only the peers still missing (like horovod's "missing
  // ranks"); MPI_Testsome retires the finished requests and leaves the rest as they are, so
  // the caller may still wait for or cancel them.
  std::vector<int> missing = info.peers;
  if (info.peer_per_request && info.peers.size() == requests.size()) {
    std::vector<int> indices(requests.size());
    int finished = 0;
    WD_CHECK_MPI(MPI_Testsome(count, requests.data(), &finished, indices.data(), MPI_STATUSES_IGNORE));
    missing.clear();
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] != MPI_REQUEST_NULL) missing.push_back(info.peers[i]);
    }
    if (missing.empty()) return;  // everything finished at the last moment
  }
  throw_timeout(info, timeout, my_rank, missing);
}

}  // namespace wd::comm
