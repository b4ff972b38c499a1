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

/// One layout's samples/s and student wait: a job step is B samples on each student; each
/// teacher replica computes its students' samples, split evenly over its stages; every rank
/// adds `overhead`, a colocated rank twice (it is a teacher rank and a student). The step
/// lasts until the slowest rank is done; a student waits for the rest of it.
LayoutSpeed predict(LayoutSpeed l, double tT, double tS, std::int64_t batch, int cores, double overhead) {
  const double B = static_cast<double>(batch);
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
  const auto finish = finish_times(work, cores);
  const double step = *std::max_element(finish.begin(), finish.end());
  l.samples_per_s = B * l.students / step;
  l.student_wait = l.colocated ? 0.0 : 1 - finish.back() / step;
  const bool teacher_last = !l.colocated && finish.front() >= finish.back();
  const bool shared = cores > 0 && static_cast<int>(work.size()) > cores;
  l.bound = l.colocated ? (shared ? "cores" : "students") : teacher_last ? "teacher" : "students";
  if (!l.colocated && shared && std::abs(finish.front() - finish.back()) < 0.05 * step) l.bound = "cores";
  return l;
}

}  // namespace

std::vector<LayoutSpeed> predict_layouts(const SpeedInput& in) {
  const double tT = teacher_seconds_per_sample(in), tS = student_seconds_per_sample(in);
  std::vector<LayoutSpeed> out;
  LayoutSpeed colocated;
  colocated.name = fmt::format("colocated x{}", in.ranks);
  colocated.colocated = true;
  colocated.students = in.ranks;
  out.push_back(predict(colocated, tT, tS, in.batch, in.cores, in.step_overhead_s));
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
      out.push_back(predict(l, tT, tS, in.batch, in.cores, in.step_overhead_s));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const LayoutSpeed& a, const LayoutSpeed& b) { return a.samples_per_s > b.samples_per_s; });
  return out;
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
  s += fmt::format("  {:<40} {:>10} {:>14} {:>9}\n", "layout", "samples/s", "student wait %", "bound");
  for (const auto& l : layouts) {
    s += fmt::format("  {:<40} {:>10.2f} {:>14.0f} {:>9}\n", l.name, l.samples_per_s, 100 * l.student_wait, l.bound);
  }
  if (!layouts.empty()) {
    const auto& best = layouts.front();
    s += fmt::format("recommended layout: {} ({}); {}\n", best.name,
                     best.colocated ? "--teacher.placement colocated"
                     : best.stages > 1
                         ? fmt::format("--teacher.ranks {} --teacher.placement shard --teacher.stages {}",
                                       best.teacher_ranks, best.stages)
                         : fmt::format("--teacher.ranks {}", best.teacher_ranks),
                     "the memory of each layout is the table above (colocated: a student's plus the teacher's)");
  }
  return s;
}

}  // namespace wd::memory
