// CommConfig: its options table entries and its checks.
#include "comm/comm_config.hpp"

#include <sstream>

namespace wd::comm {

namespace {

std::string config_number(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

}  // namespace

void CommConfig::bind(OptionTable& table) {
  table
      .bind(
          "comm.prefetch_depth", prefetch_depth,
          "batches a teacher may run ahead of its students; each student posts this many receives "
          "ahead into as many preallocated buffers")
      .bind("comm.timeout_s", timeout_s,
            "deadline in seconds of every wait (batch send/receive, gradient all-reduce); a peer "
            "silent for longer is reported by rank")
      .bind(
          "comm.mode", mode,
          "scatter: each student receives its own slice of the teacher's batch | broadcast: every "
          "student of a replica receives the same batch")
      .bind("comm.bucket_mb", bucket_mb,
            "size in MiB of a gradient all-reduce bucket (one MPI call per bucket)")
      .bind("comm.watchdog_s", watchdog_s,
            "seconds without progress after which a rank's watchdog ends it with exit code 6 (a "
            "call stuck inside a library); 0 = 2 x comm.timeout_s + 90")
      .bind("comm.backend", backend,
            "auto | mpi | nccl: what carries teacher outputs and the students' gradient all-reduce. "
            "auto: NCCL where every rank of the link (or student group) holds CUDA tensors on a "
            "GPU of its own, MPI (pinned host staging) otherwise; nccl where it cannot work is an "
            "error naming the ranks and GPUs");
}

double CommConfig::watchdog_limit() const { return watchdog_s > 0 ? watchdog_s : 2 * timeout_s + 90; }

void CommConfig::validate(ConfigProblems& problems) const {
  problems.check(prefetch_depth >= 1,
                 "comm.prefetch_depth(" + std::to_string(prefetch_depth) + ") must be >= 1");
  problems.check(timeout_s > 0, "comm.timeout_s(" + config_number(timeout_s) + ") must be > 0");
  // MPI counts are ints: a bucket holds at most 2^31-1 floats (8 GiB).
  problems.check(bucket_mb > 0 && bucket_mb <= 8192,
                 "comm.bucket_mb(" + config_number(bucket_mb) + ") must be > 0 and <= 8192");
  problems.check(watchdog_s == 0 || watchdog_s > timeout_s,
                 "comm.watchdog_s(" + config_number(watchdog_s) + ") must be 0 or longer than comm.timeout_s(" +
                     config_number(timeout_s) + "): a rank that merely waits its deadline is not stuck");
}

std::uint64_t CommConfig::bucket_bytes() const {
  return static_cast<std::uint64_t>(bucket_mb * 1024.0 * 1024.0);
}

}  // namespace wd::comm
