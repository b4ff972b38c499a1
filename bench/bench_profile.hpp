// Kineto kernel tables for the benchmarks: one call under LibTorch's Kineto profiler (CPU and, on
// a GPU, CUDA activities), its device kernels (on the host: its aten ops) summed by name and by
// category, as markdown tables; the trace as Chrome JSON on request.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/torch_compat.hpp"

namespace wd::bench {

namespace profile_detail {
// LibTorch 2.x reports a Kineto event's duration in ns (durationNs), 1.13 in µs (durationUs).
// The one feature check of the benchmarks' own; it stays here rather than in core's compat
// header, which every library includes, because only the benchmarks use the profiler.
template <typename Event, typename = void>
struct HasDurationNs : std::false_type {};
template <typename Event>
struct HasDurationNs<Event, std::void_t<decltype(std::declval<const Event&>().durationNs())>> : std::true_type {};

template <typename Event>
double duration_us(const Event& e) {
  if constexpr (HasDurationNs<Event>::value) {
    return static_cast<double>(e.durationNs()) / 1e3;
  } else {
    return static_cast<double>(e.durationUs());
  }
}
}  // namespace profile_detail

/// A kernel's (or host op's) category, from its name: what the forward's time goes to.
inline std::string kernel_category(const std::string& name) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("flash") || has("fmha") || has("sdpa") || has("attention") || has("cudnn_generated")) return "attention";
  if (has("gemm") || has("nvjet") || has("xmma") || has("cutlass") || has("cublas") || has("aten::mm") ||
      has("aten::addmm") || has("aten::bmm") || has("aten::linear") || has("aten::matmul")) {
    return "GEMM";
  }
  if (has("layer_norm") || has("rms_norm") || has("LayerNorm") || has("RowwiseMoments") || has("norm")) return "norms";
  if (has("gelu") || has("GeluCUDA") || has("Gelu")) return "GELU";
  if (has("reduce") || has("Reduce")) return "reductions";
  if (has("copy") || has("Copy") || has("cat") || has("memcpy") || has("Memcpy")) return "copies and casts";
  if (has("elementwise") || has("Elementwise") || has("aten::mul") || has("aten::add") || has("aten::addcmul") ||
      has("aten::sub")) {
    return "elementwise (RoPE, modulation, gates)";
  }
  return "other";
}

/// What one profiled call spent, per kernel name.
struct KernelRow {
  std::string name;
  std::string category;
  long calls = 0;
  double total_us = 0;
};

/// Runs `call` under the Kineto profiler and returns its kernels (a GPU run: the CUDA kernels
/// and copies; the host: its aten ops, nested ones included) summed by name, most time first.
/// `trace`, when not empty, gets the Chrome trace where this LibTorch has Kineto (USE_KINETO;
/// Debian's 1.13 collects the events without it, but writes no trace: said on stdout).
inline std::vector<KernelRow> profile_kernels(const std::function<void()>& call, bool cuda, const std::string& trace) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  call();
  auto result = prof::disableProfiler();
  std::map<std::string, KernelRow> by_name;
  for (const auto& e : result->events()) {
    const bool device = e.deviceType() == c10::DeviceType::CUDA;
    if (cuda ? !device : e.name().rfind("aten::", 0) != 0) continue;
    auto& row = by_name[e.name()];
    row.name = e.name();
    row.category = kernel_category(e.name());
    row.calls += 1;
    row.total_us += profile_detail::duration_us(e);
  }
  if (!trace.empty()) {
    try {
      result->save(trace);
    } catch (const std::exception& e) {  // a LibTorch without Kineto (Debian's 1.13) keeps the events, not the trace
      const std::string what = e.what();
      std::printf("trace not written: %s\n", what.substr(0, what.find('\n')).c_str());
    }
  }
  std::vector<KernelRow> rows;
  for (auto& [name, row] : by_name) rows.push_back(std::move(row));
  std::sort(rows.begin(), rows.end(), [](const KernelRow& a, const KernelRow& b) { return a.total_us > b.total_us; });
  return rows;
}

/// Prints the top `top` rows and the time by category (per block: over `blocks`), as markdown.
inline void print_kernel_tables(const std::vector<KernelRow>& rows, int top, int blocks, double wall_ms, bool cuda) {
  double total = 0;
  std::map<std::string, std::pair<long, double>> by_category;
  for (const auto& r : rows) {
    total += r.total_us;
    by_category[r.category].first += r.calls;
    by_category[r.category].second += r.total_us;
  }
  std::printf("\n### Kineto: top %d %s of one forward (%s)\n\n", top, cuda ? "CUDA kernels" : "host aten ops",
              cuda ? "device time; GPU busy = kernel time / wall time"
                   : "host time, nested ops counted in their callers too");
  std::printf("| # | kernel | category | calls | total ms | %% of kernel time |\n|---:|---|---|---:|---:|---:|\n");
  for (int i = 0; i < top && i < static_cast<int>(rows.size()); ++i) {
    const auto& r = rows[static_cast<std::size_t>(i)];
    std::printf("| %d | `%s` | %s | %ld | %.3f | %.1f%% |\n", i + 1, r.name.substr(0, 100).c_str(), r.category.c_str(),
                r.calls, r.total_us / 1e3, 100 * r.total_us / std::max(total, 1e-9));
  }
  std::printf("\n### By category: one forward and one block (the forward over its %d blocks; the embeddings and "
              "head are in the forward's figure)\n\n",
              blocks);
  std::printf("| category | calls | forward ms | per block ms | %% |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [category, v] : by_category) {
    std::printf("| %s | %ld | %.3f | %.3f | %.1f%% |\n", category.c_str(), v.first, v.second / 1e3,
                v.second / 1e3 / std::max(1, blocks), 100 * v.second / std::max(total, 1e-9));
  }
  std::printf("\nkernel time %.3f ms in a forward of %.3f ms wall%s\n", total / 1e3, wall_ms,
              cuda ? (" (GPU busy " + std::to_string(static_cast<int>(100 * total / 1e3 / std::max(wall_ms, 1e-9))) + "%)").c_str()
                   : "");
}

}  // namespace wd::bench
