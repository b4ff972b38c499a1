// Start-up agreement over MPI: error flag, failing rank, and its message.
#include "comm/startup.hpp"

#include <climits>

#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {

enum Kind : int { kGeneric = 1, kData = 2, kConfig = 3 };

std::pair<int, std::string> describe(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const DataError& e) {
    return {kData, e.what()};
  } catch (const ConfigError& e) {
    return {kConfig, e.what()};
  } catch (const std::exception& e) {
    return {kGeneric, e.what()};
  } catch (...) {
    return {kGeneric, "unknown exception"};
  }
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace

void agree_on_startup(const std::string& stage, std::exception_ptr failure, MPI_Comm comm,
                      double timeout_s, HealthChannel* health) {
  int rank = 0;
  WD_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  const auto [kind, message] = failure ? describe(failure) : std::pair<int, std::string>{0, ""};
  // Lowest failing rank (INT_MAX when none) and its kind, in one reduction.
  int mine[2] = {failure ? rank : INT_MAX, 0};
  int first[2] = {0, 0};
  MPI_Request req;
  WD_CHECK_MPI(MPI_Iallreduce(mine, first, 1, MPI_2INT, MPI_MINLOC, comm, &req));
  wait_with_deadline(req, {"start-up check", -1, sizeof(mine), {}}, std::chrono::duration<double>(timeout_s), world_rank(), health);
  if (first[0] == INT_MAX) return;
  const int root = first[0];
  std::vector<std::int64_t> header{kind, static_cast<std::int64_t>(message.size())};
  broadcast_ints(header, root, comm, timeout_s, "start-up error", health);
  std::string text(static_cast<std::size_t>(header[1]), '\0');
  if (rank == root) text = message;
  WD_CHECK_MPI(MPI_Ibcast(text.data(), static_cast<int>(text.size()), MPI_CHAR, root, comm, &req));
  wait_with_deadline(req, {"start-up error text", -1, text.size(), {root}}, std::chrono::duration<double>(timeout_s),
                     world_rank(), health);
  if (failure) std::rethrow_exception(failure);
  int root_world = root;
  MPI_Group g, w;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  MPI_Group_translate_ranks(g, 1, &root, w, &root_world);
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  const std::string what = stage + " failed on rank " + std::to_string(root_world) + ": " + text;
  switch (header[0]) {
    case kData:
      throw DataError("", "", what);
    case kConfig:
      throw ConfigError(what);
    default:
      throw Error(what);
  }
}

void broadcast_ints(std::vector<std::int64_t>& values, int root, MPI_Comm comm, double timeout_s,
                    const char* what, HealthChannel* health) {
  MPI_Request req;
  WD_CHECK_MPI(MPI_Ibcast(values.data(), static_cast<int>(values.size()), MPI_INT64_T, root, comm, &req));
  wait_with_deadline(req, {what, -1, values.size() * sizeof(std::int64_t), {root}},
                     std::chrono::duration<double>(timeout_s), world_rank(), health);
}

}  // namespace wd::comm
