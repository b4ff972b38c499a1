// The speed model: per-sample seconds from FLOP counts and rates, then each layout's bound.
#include "plan/speed.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/errors.hpp"

namespace wd::plan {

double dit_forward_flops(const DitShape& d, std::int64_t tokens, std::int64_t context_len) {
  const double D = static_cast<double>(d.dim), F = static_cast<double>(d.ffn_dim);
  const double S = static_cast<double>(tokens), L = static_cast<double>(context_len);
  const double block = 2 * S * 4 * D * D + 4 * S * S * D  // self-attention: q, k, v, o; QK^T, PV
                       + 2 * S * 2 * D * D + 2 * L * 2 * D * D  // cross-attention: q, o; k, v on text
                       + 4 * S * L * D                          // cross-attention: QK^T, PV
                       + 2 * S * 2 * D * F;                     // FFN
  const double time = 2 * S * (static_cast<double>(d.freq_dim) * D + D * D + 6 * D * D);
  // One expert runs per sample (A14B routes by timestep), so experts add memory, not FLOPs.
  return static_cast<double>(d.num_layers) * block + time;
}

double teacher_seconds_per_sample(const SpeedInput& in) {
  if (in.teacher_measured_s > 0) return in.teacher_forwards * in.teacher_measured_s;
  return in.teacher_forwards * dit_forward_flops(in.teacher, in.tokens, in.context_len) / (in.teacher_gflops * 1e9);
}

double student_seconds_per_sample(const SpeedInput& in) {
  // A measured step is a forward and a backward (3 forwards' worth); roll-out jumps add forwards.
  if (in.student_measured_s > 0) return in.student_measured_s * (1 + in.student_extra_forwards / 3);
  // Forward, then a backward of twice its FLOPs; checkpointed blocks run their forward again.
  const double forward = dit_forward_flops(in.student, in.tokens, in.context_len);
  const double layers = static_cast<double>(std::max<std::int64_t>(1, in.student.num_layers));
  const double recompute = forward * static_cast<double>(in.recomputed_blocks) / layers;
  return ((3 + in.student_extra_forwards) * forward + recompute) / (in.student_gflops * 1e9);
}

TeacherForward fastest_forward(std::vector<std::pair<std::int64_t, double>> by_size, std::int64_t replica_batch) {
  WD_CHECK(!by_size.empty(), "fastest_forward needs at least one timed size");
  std::sort(by_size.begin(), by_size.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::optional<std::pair<std::int64_t, double>> best;
  for (const auto& [size, seconds] : by_size) {
    if (size > replica_batch) continue;
    if (!best || seconds < best->second * (1 - kMicroBatchMargin)) best = std::make_pair(size, seconds);
  }
  if (!best) return {0, by_size.back().second};  // below every measured size: the smallest is closest
  return {best->first == replica_batch ? 0 : best->first, best->second};
}

double stream_gbps(double pcie_gbps, bool arena, int copy_threads) {
  if (arena) return pcie_gbps;
  return std::min(pcie_gbps, kStagingGbpsPerThread * std::max(1, copy_threads));
}

StreamCost stream_cost(const PlanInput& in, double pcie_gbps) {
  StreamCost s;
  s.on = true;
  s.block_bytes = static_cast<double>(in.teacher.block_params) * static_cast<double>(in.teacher_elem_bytes);
  s.blocks = in.teacher.num_layers;
  s.pcie_gbps = pcie_gbps;
  s.gbps = stream_gbps(pcie_gbps, arena_fits(in), in.copy_threads);
  s.source = stream_source(in);
  return s;
}

double stream_copy_seconds(const StreamCost& s) {
  if (!s.on || s.gbps <= 0) return 0;
  return static_cast<double>(s.blocks) * s.block_bytes / (s.gbps * 1e9);
}

double streamed_forward_seconds(double compute_s, const StreamCost& s) {
  return std::max(compute_s, stream_copy_seconds(s));
}

TeacherForward teacher_forward(const SpeedInput& in, std::int64_t replica_batch) {
  // Seconds per sample of a forward of n samples, its copies included (a trajectory's or a
  // guided teacher's several forward samples per trained sample are counted as one forward
  // each: an upper bound where guided runs both halves in one copy-bound forward).
  const auto streamed = [&in](double seconds_per_sample, std::int64_t n) {
    if (!in.stream.on) return seconds_per_sample;
    const double samples = static_cast<double>(std::max<std::int64_t>(1, n));
    return streamed_forward_seconds(seconds_per_sample * samples, in.stream) / samples;
  };
  if (in.teacher_measured_by_size.empty()) {
    const double tf = std::max(1e-12, in.teacher_forwards);
    return {0, tf * streamed(teacher_seconds_per_sample(in) / tf, replica_batch)};
  }
  auto by_size = in.teacher_measured_by_size;
  for (auto& [n, seconds] : by_size) seconds = streamed(seconds, n);
  // A guided teacher runs each sample twice in one forward: timed sizes of n forwards serve n/2
  // samples (the micro-batch stays in trained samples).
  auto forward = fastest_forward(by_size, replica_batch);
  forward.seconds_per_sample *= in.teacher_forwards;
  return forward;
}

std::vector<std::int64_t> teacher_forward_sizes(std::int64_t largest) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t n = std::max<std::int64_t>(1, largest);; n = (n + 1) / 2) {
    sizes.push_back(n);
    if (n == 1) break;
  }
  return sizes;
}

namespace {

/// One rank of a layout in the simulation: what it computes each job step and whom it serves.
struct SimRank {
  enum class Kind { kStage, kStudent, kColocated } kind = Kind::kStudent;
  int replica = 0;
  int stage = 0;
  double work = 0;  ///< seconds of one core per job step
};

/// What the simulation measures over its later steps.
struct SteadyState {
  double step_s = 0;        ///< seconds per job step
  double student_wait = 0;  ///< share of a student's time not computing
};

/// The ranks' steady state, simulated step by step as the job runs them: a teacher stage
/// computes step n once the previous stage has (or at once, the first stage reading the data)
/// and while its consumers (the next stage, or its replica's students) have released step
/// n - depth; a student computes step n once its replica's last stage has and every student
/// has finished step n - 1 (the gradient all-reduce); a colocated rank computes step n once
/// every rank has finished step n - 1. The ranks that are computing share the cores fairly,
/// each using at most one (cores 0: a device each). So teachers run ahead where the ring lets
/// them, and a teacher that is the bottleneck still loses its core's share while the students
/// compute beside it.
SteadyState simulate(const std::vector<SimRank>& ranks, int stages, int cores, int depth) {
  using Kind = SimRank::Kind;
  const int n_ranks = static_cast<int>(ranks.size());
  const int steps = 4 * (depth + stages) + 16;
  constexpr double kNotYet = -1;
  std::vector<std::vector<double>> started(n_ranks, std::vector<double>(steps, kNotYet));
  std::vector<std::vector<double>> done(n_ranks, std::vector<double>(steps, kNotYet));
  // Who feeds and who consumes each teacher stage; which ranks train.
  std::vector<int> previous(n_ranks, -1);
  std::vector<std::vector<int>> consumers(n_ranks);
  std::vector<int> trainers;
  for (int i = 0; i < n_ranks; ++i) {
    if (ranks[i].kind != Kind::kStage) trainers.push_back(i);
    for (int j = 0; j < n_ranks; ++j) {
      if (ranks[j].kind != Kind::kStage || ranks[j].replica != ranks[i].replica) continue;
      const bool feeds = ranks[i].kind == Kind::kStage ? ranks[j].stage + 1 == ranks[i].stage
                                                       : ranks[i].kind == Kind::kStudent && ranks[j].stage == stages - 1;
      if (!feeds) continue;
      previous[i] = j;
      consumers[j].push_back(i);
    }
  }
  std::vector<int> trained(steps, 0);  // trainers that have finished each step
  std::vector<int> next(n_ranks, 0);
  std::vector<double> left(n_ranks, 0);
  std::vector<bool> running(n_ranks, false);
  const auto ready = [&](int i) {
    const int n = next[i];
    if (n >= steps) return false;
    if (previous[i] >= 0 && done[previous[i]][n] < 0) return false;
    if (ranks[i].kind != Kind::kStage) return n == 0 || trained[n - 1] == static_cast<int>(trainers.size());
    if (n < depth) return true;
    for (const int c : consumers[i]) {
      if (done[c][n - depth] < 0) return false;
    }
    return true;
  };
  double now = 0;
  for (;;) {
    int active = 0;
    for (int i = 0; i < n_ranks; ++i) {
      if (!running[i] && ready(i)) {
        running[i] = true;
        left[i] = ranks[i].work;
        started[i][next[i]] = now;
      }
      active += running[i] ? 1 : 0;
    }
    if (active == 0) break;
    const double rate = cores > 0 ? std::min(1.0, static_cast<double>(cores) / active) : 1.0;
    double first = std::numeric_limits<double>::infinity();
    for (int i = 0; i < n_ranks; ++i) {
      if (running[i]) first = std::min(first, left[i]);
    }
    now += first / rate;
    for (int i = 0; i < n_ranks; ++i) {
      if (!running[i]) continue;
      left[i] -= first;
      if (left[i] > 1e-12 * std::max(1.0, ranks[i].work)) continue;
      running[i] = false;
      done[i][next[i]] = now;
      if (ranks[i].kind != Kind::kStage) ++trained[next[i]];
      ++next[i];
    }
  }
  // The middle half of the steps: the ring has filled and the pattern repeats (at the end the
  // teachers run out of steps and the students compute alone).
  const auto step_end = [&](int n) {
    double t = 0;
    for (const int i : trainers) t = std::max(t, done[i][n]);
    return t;
  };
  const int from = steps / 4, to = 3 * steps / 4;
  SteadyState out;
  const double span = step_end(to) - step_end(from);
  out.step_s = span / (to - from);
  double computing = 0;
  for (const int i : trainers) {
    for (int n = from + 1; n <= to; ++n) computing += done[i][n] - started[i][n];
  }
  out.student_wait = span > 0 ? std::max(0.0, 1 - computing / (span * static_cast<double>(trainers.size()))) : 0.0;
  return out;
}

/// One layout's samples/s and student wait. A job step is B samples on each student; each
/// teacher replica computes its students' samples, split evenly over its stages; every rank adds
/// `overhead`, a colocated rank twice (it is a teacher rank and a student). simulate() then runs
/// the ranks as the job would (a teacher's micro-batches are slices of its step's forward: the
/// step is still one ring slot).
LayoutSpeed predict(LayoutSpeed l, const SpeedInput& in, double tS) {
  const double B = static_cast<double>(in.batch);
  const double overhead = in.step_overhead_s;
  l.replica_batch = l.colocated ? in.batch : in.batch * l.students / (l.teacher_ranks / l.stages);
  // Only a whole teacher on its own rank streams: a colocated teacher is resident on its
  // student's GPU, pipeline stages hold their blocks (shard).
  SpeedInput resident = in;
  resident.stream.on = false;
  const bool streams = in.stream.on && !l.colocated && l.stages == 1;
  const auto forward = teacher_forward(streams ? in : resident, l.replica_batch);
  l.micro_batch = forward.micro_batch;
  const double tT = forward.seconds_per_sample;
  if (streams) l.stream_overhead = tT / std::max(1e-30, teacher_forward(resident, l.replica_batch).seconds_per_sample);
  std::vector<SimRank> ranks;
  if (l.colocated) {
    // A colocated rank does a teacher rank's per-step work (read, noise) and a student's.
    ranks.assign(static_cast<std::size_t>(l.students), {SimRank::Kind::kColocated, 0, 0, B * (tT + tS) + 2 * overhead});
  } else {
    const int replicas = l.teacher_ranks / l.stages;
    const double per_replica = B * l.students / replicas;
    for (int r = 0; r < replicas; ++r) {
      for (int j = 0; j < l.stages; ++j) ranks.push_back({SimRank::Kind::kStage, r, j, per_replica * tT / l.stages + overhead});
    }
    // Students take their replica in blocks, as Layout::make assigns them.
    for (int s = 0; s < l.students; ++s) {
      ranks.push_back({SimRank::Kind::kStudent, s / (l.students / replicas), 0, B * tS + overhead});
    }
  }
  const auto steady = simulate(ranks, l.stages, in.cores, static_cast<int>(std::max<std::int64_t>(1, in.prefetch_depth)));
  l.samples_per_s = B * l.students / steady.step_s;
  l.student_wait = l.colocated ? 0.0 : steady.student_wait;
  double total = 0, busiest = 0;
  for (const auto& r : ranks) {
    total += r.work;
    busiest = std::max(busiest, r.work);
  }
  if (in.cores > 0 && static_cast<int>(ranks.size()) > in.cores && total / in.cores >= busiest) {
    l.bound = "cores";
  } else {
    l.bound = !l.colocated && ranks.front().work >= ranks.back().work ? "teacher" : "students";
  }
  return l;
}

}  // namespace

std::vector<LayoutSpeed> predict_layouts(const SpeedInput& in) {
  const double tS = student_seconds_per_sample(in);
  std::vector<LayoutSpeed> out;
  LayoutSpeed colocated;
  colocated.name = fmt::format("colocated x{}", in.ranks);
  colocated.colocated = true;
  colocated.students = in.ranks;
  out.push_back(predict(colocated, in, tS));
  for (int t = 1; t < in.ranks; ++t) {
    const int s = in.ranks - t;
    for (int stages = 1; stages <= (in.whole_teacher ? 1 : t); ++stages) {
      if (t % stages != 0 || stages > in.teacher.num_layers) continue;
      const int replicas = t / stages;
      if (s % replicas != 0) continue;  // Layout::make's rule: students divide among replicas
      LayoutSpeed l;
      l.teacher_ranks = t;
      l.stages = stages;
      l.students = s;
      l.name = stages > 1 ? fmt::format("{} replica(s) x {} stages + {} student(s)", replicas, stages, s)
                          : fmt::format("{} teacher(s) + {} student(s)", t, s);
      out.push_back(predict(l, in, tS));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const LayoutSpeed& a, const LayoutSpeed& b) { return a.samples_per_s > b.samples_per_s; });
  return out;
}

double generate_seconds(const SpeedInput& in, std::int64_t messages) {
  SpeedInput resident = in;  // generate holds the whole teacher where it computes: nothing streams
  resident.stream.on = false;
  const double per_message =
      static_cast<double>(in.batch) * teacher_forward(resident, in.batch).seconds_per_sample + in.step_overhead_s;
  const double share = in.cores > 0 ? std::min(1.0, static_cast<double>(in.cores) / std::max(1, in.ranks)) : 1.0;
  return static_cast<double>(messages) * per_message / share;
}

std::string layout_flags(const LayoutSpeed& l) {
  std::string flags = l.colocated ? "--teacher.placement colocated"
                      : l.stages > 1
                          ? fmt::format("--teacher.ranks {} --teacher.placement shard --teacher.stages {}",
                                        l.teacher_ranks, l.stages)
                          : fmt::format("--teacher.ranks {}", l.teacher_ranks);
  if (l.micro_batch > 0) flags += fmt::format(" --teacher.micro_batch {}", l.micro_batch);
  return flags;
}

std::string format_speeds(const SpeedInput& in, const std::vector<LayoutSpeed>& layouts) {
  const double tT = teacher_seconds_per_sample(in), tS = student_seconds_per_sample(in);
  const bool measured = in.teacher_measured_s > 0 && in.student_measured_s > 0;
  std::string s = fmt::format(
      "speed ({} ranks{}): teacher forward {:.1f} GFLOP/sample x {:g} forward(s) per trained sample, {:.3f} "
      "s/sample; student step {:.3f} s/sample ({})\n",
      in.ranks, in.cores > 0 ? fmt::format(" sharing {} cores", in.cores) : std::string(" on a device each"),
      dit_forward_flops(in.teacher, in.tokens, in.context_len) / 1e9, in.teacher_forwards, tT, tS,
      measured ? std::string("both measured here: the job's models, random weights, one batch")
               : fmt::format("FLOPs at {:.1f} and {:.1f} GFLOP/s a rank", in.teacher_gflops, in.student_gflops));
  if (!in.teacher_measured_by_size.empty()) {
    std::string sizes;
    for (const auto& [n, seconds] : in.teacher_measured_by_size) {
      sizes += fmt::format("{}{} a forward {:.3f} s/sample", sizes.empty() ? "" : ", ", n, seconds);
    }
    s += "  teacher forward by size: " + sizes + " (each layout's teacher computes in its fastest size)\n";
  }
  if (in.stream.on) {
    s += fmt::format(
        "  stream: {} blocks of {:.1f} MB a forward from the {} at {:.1f} GB/s ({:.1f} GB/s host-to-device): "
        "{:.2f} ms of copies a forward, overlapping the compute (a forward takes the longer of the two)\n",
        in.stream.blocks, in.stream.block_bytes / 1e6, in.stream.source, in.stream.gbps, in.stream.pcie_gbps,
        1e3 * stream_copy_seconds(in.stream));
  }
  const auto stream_column = [&](const std::string& v) { return in.stream.on ? fmt::format(" {:>8}", v) : std::string(); };
  s += fmt::format("  {:<40} {:>10} {:>14} {:>9} {:>16}{}\n", "layout", "samples/s", "student wait %", "bound",
                   "teacher forward", stream_column("stream"));
  for (const auto& l : layouts) {
    s += fmt::format("  {:<40} {:>10.2f} {:>14.0f} {:>9} {:>16}{}\n", l.name, l.samples_per_s, 100 * l.student_wait,
                     l.bound,
                     l.micro_batch > 0 ? fmt::format("{} of {}", l.micro_batch, l.replica_batch)
                                       : fmt::format("all {}", l.replica_batch),
                     stream_column(l.colocated || l.stages > 1 ? "-" : fmt::format("{:.2f}x", l.stream_overhead)));
  }
  if (!layouts.empty()) {
    const auto& best = layouts.front();
    s += fmt::format("recommended layout: {} ({}); {}\n", best.name, layout_flags(best),
                     "the memory of each layout is the table above (colocated: a student's plus the teacher's)");
  }
  return s;
}

}  // namespace wd::plan
