// The speed model: per-sample seconds from FLOP counts and rates, then each layout's bound.
#include "memory/speed.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace wd::memory {

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
  if (in.teacher_measured_s > 0) return in.teacher_measured_s;
  return dit_forward_flops(in.teacher, in.tokens, in.context_len) / (in.teacher_gflops * 1e9);
}

double student_seconds_per_sample(const SpeedInput& in) {
  if (in.student_measured_s > 0) return in.student_measured_s;
  // Forward, then a backward of twice its FLOPs; checkpointed blocks run their forward again.
  const double forward = dit_forward_flops(in.student, in.tokens, in.context_len);
  const double layers = static_cast<double>(std::max<std::int64_t>(1, in.student.num_layers));
  const double recompute = forward * static_cast<double>(in.recomputed_blocks) / layers;
  return (3 * forward + recompute) / (in.student_gflops * 1e9);
}

TeacherForward teacher_forward(const SpeedInput& in, std::int64_t replica_batch) {
  TeacherForward best{0, teacher_seconds_per_sample(in)};
  if (in.teacher_measured_by_size.empty()) return best;
  bool found = false;
  for (const auto& [size, seconds] : in.teacher_measured_by_size) {
    if (size > replica_batch) continue;
    if (!found || seconds < best.seconds_per_sample) best = {size == replica_batch ? 0 : size, seconds};
    found = true;
  }
  if (!found) {
    // A replica batch below every measured size: the smallest measured one is the closest.
    const auto smallest = *std::min_element(in.teacher_measured_by_size.begin(), in.teacher_measured_by_size.end());
    best = {0, smallest.second};
  }
  return best;
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

/// When each rank finishes its share of one job step, given the seconds of work each needs on
/// one core: every rank starts together (the ring's prefetch lets teachers run a step ahead)
/// and the ranks share `cores` fairly, each using at most one (0: a device each, no sharing).
std::vector<double> finish_times(const std::vector<double>& work, int cores) {
  std::vector<std::size_t> order(work.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return work[a] < work[b]; });
  std::vector<double> finish(work.size(), 0.0);
  double now = 0, done = 0;  // done: the work every still-running rank has completed
  for (std::size_t k = 0; k < order.size(); ++k) {
    const double running = static_cast<double>(order.size() - k);
    const double rate = cores > 0 ? std::min(1.0, cores / running) : 1.0;
    now += (work[order[k]] - done) / rate;
    done = work[order[k]];
    finish[order[k]] = now;
  }
  return finish;
}

/// One layout's samples/s and student wait in the steady state. A job step is B samples on each
/// student; each teacher replica computes its students' samples, split evenly over its stages;
/// every rank adds `overhead`, a colocated rank twice (it is a teacher rank and a student).
/// Teacher ranks run ahead of their students through the ring (comm.prefetch_depth), so no core
/// idles while a rank has work: a step lasts as long as the busiest rank's work (a rank uses at
/// most one core) or all the work over the cores, whichever is longer. A student waits for what
/// is left of the step after it finishes its share, the cores shared fairly among the ranks
/// (finish_times).
LayoutSpeed predict(LayoutSpeed l, const SpeedInput& in, double tS) {
  const double B = static_cast<double>(in.batch);
  const int cores = in.cores;
  const double overhead = in.step_overhead_s;
  l.replica_batch = l.colocated ? in.batch : in.batch * l.students / (l.teacher_ranks / l.stages);
  const auto forward = teacher_forward(in, l.replica_batch);
  l.micro_batch = forward.micro_batch;
  const double tT = forward.seconds_per_sample;
  std::vector<double> work;
  if (l.colocated) {
    // A colocated rank does a teacher rank's per-step work (read, noise) and a student's.
    work.assign(static_cast<std::size_t>(l.students), B * (tT + tS) + 2 * overhead);
  } else {
    const int replicas = l.teacher_ranks / l.stages;
    const double per_replica = B * l.students / replicas;
    work.assign(static_cast<std::size_t>(l.teacher_ranks), per_replica * tT / l.stages + overhead);
    work.insert(work.end(), static_cast<std::size_t>(l.students), B * tS + overhead);
  }
  double total = 0, busiest = 0;
  for (const double w : work) {
    total += w;
    busiest = std::max(busiest, w);
  }
  const double all_cores = cores > 0 ? total / cores : 0.0;
  const double step = std::max(busiest, all_cores);
  l.samples_per_s = B * l.students / step;
  const auto finish = finish_times(work, cores);
  l.student_wait = l.colocated ? 0.0 : std::max(0.0, 1 - finish.back() / step);
  if (all_cores >= busiest && static_cast<int>(work.size()) > cores && cores > 0) {
    l.bound = "cores";
  } else {
    l.bound = !l.colocated && work.front() >= work.back() ? "teacher" : "students";
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
    for (int stages = 1; stages <= t; ++stages) {
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
      "speed ({} ranks{}): teacher forward {:.1f} GFLOP/sample, {:.3f} s/sample; student step {:.3f} s/sample ({})\n",
      in.ranks, in.cores > 0 ? fmt::format(" sharing {} cores", in.cores) : std::string(" on a device each"),
      dit_forward_flops(in.teacher, in.tokens, in.context_len) / 1e9, tT, tS,
      measured ? std::string("both measured here: the job's models, random weights, one batch")
               : fmt::format("FLOPs at {:.1f} and {:.1f} GFLOP/s a rank", in.teacher_gflops, in.student_gflops));
  if (!in.teacher_measured_by_size.empty()) {
    std::string sizes;
    for (const auto& [n, seconds] : in.teacher_measured_by_size) {
      sizes += fmt::format("{}{} a forward {:.3f} s/sample", sizes.empty() ? "" : ", ", n, seconds);
    }
    s += "  teacher forward by size: " + sizes + " (each layout's teacher computes in its fastest size)\n";
  }
  s += fmt::format("  {:<40} {:>10} {:>14} {:>9} {:>16}\n", "layout", "samples/s", "student wait %", "bound",
                   "teacher forward");
  for (const auto& l : layouts) {
    s += fmt::format("  {:<40} {:>10.2f} {:>14.0f} {:>9} {:>16}\n", l.name, l.samples_per_s, 100 * l.student_wait,
                     l.bound,
                     l.micro_batch > 0 ? fmt::format("{} of {}", l.micro_batch, l.replica_batch)
                                       : fmt::format("all {}", l.replica_batch));
  }
  if (!layouts.empty()) {
    const auto& best = layouts.front();
    s += fmt::format("recommended layout: {} ({}); {}\n", best.name, layout_flags(best),
                     "the memory of each layout is the table above (colocated: a student's plus the teacher's)");
  }
  return s;
}

}  // namespace wd::memory
