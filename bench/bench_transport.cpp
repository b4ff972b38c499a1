// bench_transport: bytes/s of the teacher -> student stream through the MPI sender and receiver next to a plain
// MPI_Isend/MPI_Recv loop of the same sizes (1 teacher + S students, e.g. mpirun -np 3).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
#include "comm/stream_plan.hpp"
#include "comm/mpi_transport.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"

namespace wd::bench {
namespace {

struct TransportBenchConfig {
  std::string sizes = "tiny,1MiB,8MiB,32MiB";
  int reps = 9;
  int steps = 0;
  double stream_mib = 256;
  int min_steps = 20;
  int threads = 1;
  comm::CommConfig comm;
  LogConfig log;

  TransportBenchConfig() { log.level = "warn"; }

  void bind(OptionTable& t) {
    t.bind("sizes", sizes,
           "comma list of per-student messages: tiny (the builtin tiny job's message: x_t and "
           "teacher_out [2,16,3,16,16] f32, context [2,16,64], t, context_lens), or a byte count "
           "with an optional KiB/MiB suffix (one f32 tensor)")
        .bind("reps", reps, "timed repetitions per size and method (median reported)")
        .bind("steps", steps, "messages per student per repetition (0 = from stream_mib)")
        .bind("stream_mib", stream_mib,
              "with steps = 0: about this many MiB per student per repetition ...")
        .bind("min_steps", min_steps, "... but at least this many steps")
        .bind("threads", threads, "LibTorch intra-op threads (the teacher's copy into its slots)");
    comm.bind(t);
    log.bind(t);
  }
  void validate() const {
    ConfigProblems p;
    p.check(reps >= 1, "reps(" + std::to_string(reps) + ") must be >= 1");
    p.check(steps >= 0, "steps(" + std::to_string(steps) + ") must be >= 0");
    p.check(stream_mib > 0, "stream_mib(" + std::to_string(stream_mib) + ") must be > 0");
    p.check(min_steps >= 1, "min_steps(" + std::to_string(min_steps) + ") must be >= 1");
    p.check(threads >= 1, "threads(" + std::to_string(threads) + ") must be >= 1");
    p.check(!split_list(sizes).empty(), "sizes(" + sizes + ") must name at least one size");
    p.check(comm.mode == CommMode::kScatter,
            "comm.mode(" + std::string(name_of(comm.mode)) + ") must be scatter: each student gets its own message");
    comm.validate(p);
    log.validate(p);
    p.throw_if_any("bench_transport");
  }
};

/// One row of the table: what each student receives per step.
struct SizeCase {
  std::string label;
  comm::MessageSpec spec;
};

/// The message of the builtin tiny job (configs/tiny.ini with its t2v `tiny` teacher); the
/// larger CPU config of bench_train.sh streams the same shapes.
comm::MessageSpec tiny_job_spec() {
  comm::StreamPlan plan;
  plan.batch_per_student = 2;
  plan.latent = {16, 3, 16, 16};
  plan.out_channels = 16;
  plan.context_len = 16;
  plan.text_dim = 64;
  return plan.message_spec();
}

SizeCase parse_size(const std::string& text) {
  if (text == "tiny") return {"tiny job", tiny_job_spec()};
  std::uint64_t unit = 1;
  std::string digits = text;
  for (const auto& [suffix, factor] :
       {std::pair<std::string, std::uint64_t>{"KiB", 1024}, {"MiB", 1024 * 1024}}) {
    if (text.size() > suffix.size() &&
        text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      unit = factor;
      digits = text.substr(0, text.size() - suffix.size());
    }
  }
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const auto bytes = static_cast<std::uint64_t>(n) * unit;
  if (used != digits.size() || n <= 0 || bytes % 4 != 0) {
    throw ConfigError("sizes: '" + text +
                      "' is not tiny or a positive multiple of 4 bytes "
                      "(e.g. 4096, 512KiB, 8MiB)");
  }
  comm::MessageSpec spec;
  spec.tensors.push_back({"payload", torch::kFloat, {static_cast<std::int64_t>(bytes / 4)}});
  return {text, spec};
}

std::string human_bytes(std::uint64_t b) {
  char buf[32];
  if (b >= 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024.0);
  }
  return buf;
}

/// One message per student with the spec's shapes, filled once and sent every step.
std::vector<comm::TensorDict> make_messages(const comm::MessageSpec& spec, int students) {
  std::vector<comm::TensorDict> out(static_cast<std::size_t>(students));
  for (auto& dict : out) {
    for (const auto& t : spec.tensors) {
      dict[t.name] = t.dtype == torch::kLong ? torch::full(t.shape, 16, torch::kLong)
                                             : torch::randn(t.shape).to(t.dtype);
    }
  }
  return out;
}

/// Barrier with a deadline (MPI_Ibarrier polled), so a lost rank is reported, not waited for.
void barrier(MPI_Comm comm, double timeout_s, int rank) {
  MPI_Request req = MPI_REQUEST_NULL;
  WD_CHECK_MPI(MPI_Ibarrier(comm, &req));
  comm::wait_with_deadline(req, {"bench barrier", -1, 0, {}},
                           std::chrono::duration<double>(timeout_s), rank, nullptr);
}

/// The slowest rank's seconds (on every rank): the stream is done when its last rank is.
double slowest(double secs, double timeout_s, int rank) {
  double out = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  WD_CHECK_MPI(MPI_Iallreduce(&secs, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req));
  comm::wait_with_deadline(req, {"bench allreduce", -1, sizeof secs, {}},
                           std::chrono::duration<double>(timeout_s), rank, nullptr);
  return out;
}

struct Bench {
  const comm::ProcessGroups& groups;
  int rank;
  bool teacher;
  int students;
  const TransportBenchConfig& cfg;

  /// The real transport: teacher send() (copy into a ring slot, MPI_Isend to each student, wait
  /// only when prefetch_depth steps are in flight) then flush(); students recv() + release().
  /// Streams steps [first, first + steps) of this rank's end (`sender` on the teacher,
  /// `receiver` on a student), which lives for every repetition of a size as in a training run
  /// (fresh ring buffers would add first-touch page faults). Timed from the barrier before the
  /// first send to the last flush / release.
  double transport_rep(comm::Sender* sender, comm::Receiver* receiver,
                       const std::vector<comm::TensorDict>& msgs, std::int64_t first,
                       std::int64_t steps) const {
    barrier(MPI_COMM_WORLD, cfg.comm.timeout_s, rank);
    const auto start = Clock::now();
    if (teacher) {
      for (std::int64_t s = first; s < first + steps; ++s) sender->send(s, msgs);
      sender->flush();
    } else {
      for (std::int64_t s = first; s < first + steps; ++s) {
        receiver->recv(s);
        receiver->release(s);
      }
    }
    return slowest(seconds_since(start), cfg.comm.timeout_s, rank);
  }

  /// The baseline: per step the teacher MPI_Isends the payload to every student from
  /// preallocated buffers and waits for the sends; each student receives into one buffer. With
  /// `deadline_waits` false the waits are plain blocking MPI (MPI_Waitall, MPI_Recv; Open MPI
  /// busy-polls in them): what the transport is measured against. With it true they are the
  /// transport's own waits (MPI_Irecv, then MPI_Test polled with a yield/sleep backoff and a
  /// deadline), which separates the cost of waiting politely from the cost of the ring and copy.
  double plain_rep(std::uint64_t bytes, std::vector<torch::Tensor>& buffers, std::int64_t steps,
                   bool deadline_waits) const {
    constexpr int kTag = 991;
    const int count = static_cast<int>(bytes);
    const std::chrono::duration<double> timeout(cfg.comm.timeout_s);
    std::vector<int> peers;
    for (int i = 0; i < students; ++i) peers.push_back(i + 1);
    std::vector<MPI_Request> reqs(static_cast<std::size_t>(students), MPI_REQUEST_NULL);
    barrier(MPI_COMM_WORLD, cfg.comm.timeout_s, rank);
    const auto start = Clock::now();
    for (std::int64_t s = 0; s < steps; ++s) {
      if (teacher) {
        for (int i = 0; i < students; ++i) {
          WD_CHECK_MPI(MPI_Isend(buffers[static_cast<std::size_t>(i)].data_ptr(), count, MPI_BYTE,
                                 i + 1, kTag, groups.link(), &reqs[static_cast<std::size_t>(i)]));
        }
        if (deadline_waits) {
          comm::wait_all_with_deadline(reqs, {"plain send", s, bytes, peers, true}, timeout, rank, nullptr);
        } else {
          WD_CHECK_MPI(MPI_Waitall(students, reqs.data(), MPI_STATUSES_IGNORE));
        }
      } else if (deadline_waits) {
        WD_CHECK_MPI(MPI_Irecv(buffers.front().data_ptr(), count, MPI_BYTE, 0, kTag, groups.link(),
                               &reqs.front()));
        comm::wait_with_deadline(reqs.front(), {"plain recv", s, bytes, {0}}, timeout, rank, nullptr);
      } else {
        WD_CHECK_MPI(MPI_Recv(buffers.front().data_ptr(), count, MPI_BYTE, 0, kTag, groups.link(),
                              MPI_STATUS_IGNORE));
      }
    }
    return slowest(seconds_since(start), cfg.comm.timeout_s, rank);
  }
};

/// Teacher only, no MPI: the copy Sender::send makes of every student's tensors into its
/// ring slot (the same typed views at the same offsets, prefetch_depth slots in turn).
class SlotCopy {
 public:
  SlotCopy(const comm::MessageSpec& spec, const std::vector<comm::TensorDict>& msgs, int slots) {
    const auto offsets = spec.offsets();
    pairs_.resize(static_cast<std::size_t>(slots));
    for (auto& slot : pairs_) {
      for (const auto& dict : msgs) {
        buffers_.push_back(torch::zeros({static_cast<std::int64_t>(spec.bytes())}, torch::kUInt8));
        auto* base = buffers_.back().data_ptr<std::uint8_t>();
        for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
          const auto& t = spec.tensors[i];
          slot.emplace_back(
              torch::from_blob(base + offsets[i], t.shape, torch::TensorOptions().dtype(t.dtype)),
              dict.at(t.name));
        }
      }
    }
  }
  /// Seconds per step of `steps` steps of copies.
  double seconds_per_step(std::int64_t steps) {
    torch::NoGradGuard no_grad;
    const auto start = Clock::now();
    for (std::int64_t s = 0; s < steps; ++s) {
      for (auto& [dst, src] : pairs_[static_cast<std::size_t>(s) % pairs_.size()]) dst.copy_(src);
    }
    return seconds_since(start) / static_cast<double>(steps);
  }

 private:
  std::vector<torch::Tensor> buffers_;
  std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>> pairs_;  ///< dst, src
};

int run(int argc, char** argv) {
  comm::MpiRuntime mpi(&argc, &argv);
  try {
    TransportBenchConfig cfg;
    OptionTable table("bench_transport options");
    cfg.bind(table);
    if (parse_options(std::vector<std::string>(argv + 1, argv + argc), table).help) {
      if (mpi.rank() == 0) {
        std::cout << "Usage: mpirun -np 3 bench_transport [options]\n" << table.description();
      }
      return 0;
    }
    cfg.validate();
    WD_CHECK_AS(ConfigError, mpi.size() >= 2,
                "bench_transport needs 1 teacher and at least 1 student rank; run it under "
                "mpirun -np 3 (world size is "
                    << mpi.size() << ")");
    std::vector<SizeCase> cases;
    for (const auto& s : split_list(cfg.sizes)) cases.push_back(parse_size(s));

    const auto layout = comm::Layout::make(mpi.size(), 1);
    const int rank = mpi.rank();
    init_logging(layout.topology(rank, mpi.local_rank(), mpi.local_size()), cfg.log.level);
    torch::set_num_threads(cfg.threads);
    comm::ProcessGroups groups(layout, rank);
    const Bench bench{groups, rank, rank == 0, layout.student_ranks, cfg};
    const bool leader = rank == 0;

    if (leader) {
      char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
      int len = 0;
      MPI_Get_library_version(version, &len);
      std::string mpi_version(version, static_cast<std::size_t>(len));
      mpi_version = mpi_version.substr(0, mpi_version.find_first_of(",\n"));
      std::printf("## bench_transport\n\n");
      std::printf(
          "- %s; 1 teacher rank -> %d student ranks; comm.prefetch_depth %d; "
          "LibTorch threads %d\n",
          mpi_version.c_str(), layout.student_ranks, cfg.comm.prefetch_depth, cfg.threads);
      std::printf(
          "- per repetition each student receives `steps` messages; the methods take turns "
          "repetition by repetition after one short warm-up each; median of %d\n",
          cfg.reps);
      std::printf("- tiny job message: ");
      for (const auto& t : tiny_job_spec().tensors) {
        std::string shape;
        for (const auto d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        std::printf("%s [%s] %s, ", t.name.c_str(), shape.c_str(),
                    t.dtype == torch::kLong ? "i64" : "f32");
      }
      std::printf("%llu payload bytes (64-byte aligned tensors)\n",
                  static_cast<unsigned long long>(tiny_job_spec().bytes()));
      std::printf(
          "- MB/s = 10^6 payload bytes per second per student, timed from a barrier to "
          "the slowest rank's last flush/release (transport) or receive (plain); the "
          "transport also sends a 64-byte header per message\n\n");
      std::printf(
          "- plain: MPI_Isend to each student + MPI_Waitall / MPI_Recv; plain, polled: "
          "the same messages waited for the way the transport waits (MPI_Test with "
          "yield/sleep backoff); copy: the teacher's copy of every student's tensors "
          "into a ring slot, which Sender::send does and plain does not (no MPI)\n\n");
      std::printf(
          "| message | bytes/student/step | steps | transport MB/s | plain MB/s "
          "| transport/plain | plain, polled MB/s | transport ms/step | plain ms/step "
          "| plain, polled ms/step | copy ms/step | transport min–max MB/s "
          "| plain min–max MB/s |\n");
      std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
      std::fflush(stdout);
    }

    for (const auto& c : cases) {
      const std::uint64_t bytes = c.spec.bytes();
      std::int64_t steps = cfg.steps;
      if (steps == 0) {
        steps = std::max<std::int64_t>(
            cfg.min_steps,
            static_cast<std::int64_t>(cfg.stream_mib * 1024 * 1024 / static_cast<double>(bytes)));
      }
      const auto msgs = bench.teacher ? make_messages(c.spec, layout.student_ranks)
                                      : std::vector<comm::TensorDict>{};
      std::vector<torch::Tensor> buffers(
          bench.teacher ? static_cast<std::size_t>(layout.student_ranks) : 1);
      for (auto& b : buffers) b = torch::zeros({static_cast<std::int64_t>(bytes)}, torch::kUInt8);

      const std::int64_t warm = std::min<std::int64_t>(steps, 10);
      // This rank's end of the link: the teacher's sender or a student's receiver.
      const auto end = comm::link_end(groups, rank, cfg.comm);
      const std::int64_t stream_steps = warm + cfg.reps * steps;
      const auto sender = bench.teacher ? comm::make_mpi_sender(end, c.spec, cfg.comm, 0, stream_steps, nullptr)
                                        : nullptr;
      const auto receiver = bench.teacher ? nullptr
                                          : comm::make_mpi_receiver(end, c.spec, cfg.comm, 0, stream_steps, nullptr);
      std::optional<SlotCopy> copy;
      if (bench.teacher) copy.emplace(c.spec, msgs, cfg.comm.prefetch_depth);
      bench.transport_rep(sender.get(), receiver.get(), msgs, 0, warm);
      bench.plain_rep(bytes, buffers, warm, false);
      bench.plain_rep(bytes, buffers, warm, true);
      if (copy) copy->seconds_per_step(warm);
      // Repetitions interleave the methods, so a change in machine load hits them alike.
      std::vector<double> transport_s, plain_s, polled_s, copy_s;
      for (int r = 0; r < cfg.reps; ++r) {
        transport_s.push_back(bench.transport_rep(sender.get(), receiver.get(), msgs, warm + r * steps, steps));
        plain_s.push_back(bench.plain_rep(bytes, buffers, steps, false));
        polled_s.push_back(bench.plain_rep(bytes, buffers, steps, true));
        if (copy) copy_s.push_back(copy->seconds_per_step(steps));
      }
      if (leader) {
        const double total = static_cast<double>(bytes) * static_cast<double>(steps);
        const auto mbs = [&](double secs) { return total / secs / 1e6; };
        const auto ms = [&](double secs) { return secs / static_cast<double>(steps) * 1e3; };
        const double t = median(transport_s), p = median(plain_s), q = median(polled_s);
        const auto max_of = [](const std::vector<double>& v) {
          return *std::max_element(v.begin(), v.end());
        };
        std::printf(
            "| %s | %llu (%s) | %lld | %.0f | %.0f | %.2f | %.0f | %.3f | %.3f | %.3f "
            "| %.3f | %.0f–%.0f | %.0f–%.0f |\n",
            c.label.c_str(), static_cast<unsigned long long>(bytes), human_bytes(bytes).c_str(),
            static_cast<long long>(steps), mbs(t), mbs(p), p / t, mbs(q), ms(t), ms(p), ms(q),
            median(copy_s) * 1e3, mbs(max_of(transport_s)), mbs(min_of(transport_s)),
            mbs(max_of(plain_s)), mbs(min_of(plain_s)));
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const ConfigError& e) {
    // Every rank parses the same flags and fails alike before any message moves: one report.
    if (mpi.rank() == 0) std::fprintf(stderr, "bench_transport: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_transport (rank %d): %s\n", mpi.rank(), e.what());
    // A peer may be blocked on this rank; stop them all rather than hang.
    mpi.abort(1);
  }
}

}  // namespace
}  // namespace wd::bench

int main(int argc, char** argv) {
  try {
    return wd::bench::run(argc, argv);
  } catch (const std::exception& e) {
    // MPI itself failed to start (MpiRuntime's constructor).
    std::fprintf(stderr, "bench_transport: %s\n", e.what());
  }
  return 1;
}
