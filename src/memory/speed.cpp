// The speed model: per-sample seconds from FLOP counts and rates, then each layout's bound.
#include "memory/speed.hpp"

#include <fmt/format.h>

#include <algorithm>
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
  return dit_forward_flops(in.teacher, in.tokens, in.context_len) / (in.teacher_gflops * 1e9);
}

double student_seconds_per_sample(const SpeedInput& in) {
  // Forward, then a backward of twice its FLOPs; checkpointed blocks run their forward again.
  const double forward = dit_forward_flops(in.student, in.tokens, in.context_len);
  const double layers = static_cast<double>(std::max<std::int64_t>(1, in.student.num_layers));
  const double recompute = forward * static_cast<double>(in.recomputed_blocks) / layers;
  return (3 * forward + recompute) / (in.student_gflops * 1e9);
}

namespace {

/// Throughput of T teacher ranks and S student ranks on `cores` shared cores (0: a device
/// each). Each side is bounded by its ranks; on shared cores both together by the cores (a
/// waiting rank leaves its core, test_idle_wait). Stages split a replica's forward, so a
/// pipeline of P stages delivers P stage-forwards at once: the teacher side is T / tT whatever
/// the split (transfer time and the pipeline's fill are left out).
LayoutSpeed bound(LayoutSpeed l, double tT, double tS, int cores) {
  const double inf = std::numeric_limits<double>::infinity();
  const double teacher = l.colocated ? inf : l.teacher_ranks / tT;
  const double students = l.colocated ? l.students / (tT + tS) : l.students / tS;
  const double shared = cores > 0 ? cores / (tT + tS) : inf;
  l.samples_per_s = std::min({teacher, students, shared});
  l.bound = l.samples_per_s == shared && shared < std::min(teacher, students) ? "cores"
            : l.samples_per_s == teacher                                      ? "teacher"
                                                                              : "students";
  l.student_wait = l.colocated ? 0.0 : std::max(0.0, 1 - l.samples_per_s * tS / l.students);
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
  out.push_back(bound(colocated, tT, tS, in.cores));
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
      out.push_back(bound(l, tT, tS, in.cores));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const LayoutSpeed& a, const LayoutSpeed& b) { return a.samples_per_s > b.samples_per_s; });
  return out;
}

std::string format_speeds(const SpeedInput& in, const std::vector<LayoutSpeed>& layouts) {
  const double tT = teacher_seconds_per_sample(in), tS = student_seconds_per_sample(in);
  std::string s = fmt::format(
      "speed ({} ranks{}): teacher forward {:.1f} GFLOP/sample at {:.1f} GFLOP/s = {:.3f} s/sample; "
      "student step {:.3f} s/sample at {:.1f} GFLOP/s\n",
      in.ranks, in.cores > 0 ? fmt::format(" sharing {} cores", in.cores) : std::string(" on a device each"),
      dit_forward_flops(in.teacher, in.tokens, in.context_len) / 1e9, in.teacher_gflops, tT, tS, in.student_gflops);
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
