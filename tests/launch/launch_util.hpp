// Launching `wan-distill train` under mpirun from a one-process test, and reading what it wrote.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace wd::test {

struct LaunchResult {
  int code = -1;          ///< mpirun's exit status (-1: killed by a signal)
  std::string output;     ///< stdout and stderr of every rank
  double seconds = 0;     ///< wall time of the whole launch
};

/// The CPU kernels every launched rank uses, whatever the machine's CPU and environment:
/// LibTorch dispatches by ISA (AVX-512 where the CPU has it), OpenBLAS by its detected core, MKL
/// (the pip LibTorch's BLAS) likewise, and each choice changes the summation order. Pinned to
/// what every x86-64 machine here has (AVX2), losses are reproducible to the last bit across
/// them, so the golden loss curve holds on any of them. oneDNN (bf16 matmul, and in LibTorch
/// 2.11 the packing of bf16 flash attention) picks its code by CPU apart from ATen: on a CPU with
/// AMX it changed the bf16 teacher's numbers (LibTorch 1.13) and, with ATen pinned to AVX2, made
/// LibTorch 2.11 throw "pack_vnni2 is only supported when avx512 is supported". Capped at
/// AVX512_CORE it reproduces both golden curves there (2026-11-26, an Intel Xeon with AMX).
inline const std::string kPinnedKernels =
    "-x ATEN_CPU_CAPABILITY=avx2 -x OPENBLAS_CORETYPE=Haswell -x MKL_CBWR=AVX2 -x ONEDNN_MAX_CPU_ISA=AVX512_CORE ";

/// Where `args` gives the option `key` (`--key VALUE` or `--key=VALUE`): the position just past
/// the key, or npos.
inline std::size_t option_end(const std::string& args, const std::string& key) {
  const std::string flag = "--" + key;
  for (auto pos = args.find(flag); pos != std::string::npos; pos = args.find(flag, pos + 1)) {
    const auto end = pos + flag.size();
    const bool starts = pos == 0 || args[pos - 1] == ' ';
    if (starts && (end == args.size() || args[end] == ' ' || args[end] == '=')) return end;
  }
  return std::string::npos;
}

/// Whether `args` sets the option `key` itself.
inline bool sets_option(const std::string& args, const std::string& key) {
  return option_end(args, key) != std::string::npos;
}

/// The value `args` gives the option `key` ("" when it does not set it).
inline std::string option_value(const std::string& args, const std::string& key) {
  const auto end = option_end(args, key);
  if (end == std::string::npos || end == args.size()) return "";
  const auto from = args.find_first_not_of(' ', end + 1);
  return from == std::string::npos ? "" : args.substr(from, args.find(' ', from) - from);
}

/// The job settings a launched `train` (and `plan`, which reads the same keys) assumes, so that
/// it gives the same answers on a GPU host as here. Left at their defaults, each would change
/// with the host: runtime.threads 0 shares the node's cores out over its ranks (the summation
/// order, hence the golden curve, follows the core count); student.device and teacher.placement
/// `auto` pick a visible GPU; a stream or shard teacher computes on cuda:<local rank> whenever
/// one exists; teacher.compute auto times a bf16 against an fp32 matmul at start-up and could
/// choose apart between two runs under CI load. `fp32` is pinned: the bf16 matmul's speed is the
/// CPU's (LibTorch 1.13 here, one thread: ~570 GFLOP/s with AMX, ~15 under kPinnedKernels'
/// oneDNN cap, ~1-2 without oneDNN, the path 1.13 takes on a CPU without AVX-512; fp32 ~50-110),
/// so a bf16 teacher made every launched job crawl on an AVX2-only host (stop 57's CI ran past
/// its time there), while fp32 matmuls under the pinned kernels take one code path on any x86-64
/// CPU.
/// A test of the bf16 teacher sets `--teacher.compute weights` itself. A key that `args`
/// sets keeps the test's value (boost refuses a key given twice),
/// and teacher.device is left alone where the test asks for a GPU (teacher.placement gpu,
/// student.device cuda[:N]): there it would put that GPU's teacher on the host. A --config file
/// does not count as setting a key: pass these on the command line instead.
inline std::string pinned_options(const std::string& args) {
  std::string pins;
  const auto pin = [&](const std::string& key, const std::string& value) {
    if (!sets_option(args, key)) pins += " --" + key + " " + value;
  };
  pin("runtime.threads", "1");
  pin("student.device", "cpu");
  pin("teacher.placement", "cpu");
  pin("teacher.compute", "fp32");
  const bool asks_for_a_gpu = option_value(args, "teacher.placement") == "gpu" ||
                              option_value(args, "student.device").rfind("cuda", 0) == 0;
  if (!asks_for_a_gpu) pin("teacher.device", "cpu");
  return pins;
}

/// `args` with pinned_options(args) added: the whole command line of a launched job.
inline std::string pinned_args(const std::string& args) { return args + pinned_options(args); }

/// Runs the shell command `cmd` (its stderr redirected by the caller) and returns its exit code,
/// output and wall time.
inline LaunchResult run_captured(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe && std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pipe ? ::pclose(pipe) : -1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, secs};
}

/// Runs `wan-distill <command> <args>` (launch_command; launch_train: `train`) on `ranks` ranks, pinned to the host (pinned_args) and to
/// kPinnedKernels. mpirun's --timeout bounds a hang; `kill_grace_s` is how long mpirun lets the
/// other ranks finish after one exits non-zero (long enough for the failure protocol, see
/// launch/mpirun.sh).
inline LaunchResult launch_command(int ranks, const std::string& command, const std::string& args, int timeout_s = 240,
                                   int kill_grace_s = 3) {
  const std::string cmd = std::string(WD_MPIEXEC) + " -n " + std::to_string(ranks) +
                          " --oversubscribe --allow-run-as-root --bind-to none --timeout " + std::to_string(timeout_s) +
                          " --mca odls_base_sigkill_timeout " + std::to_string(kill_grace_s) +
                          " -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 " + kPinnedKernels + WD_CLI + " " + command +
                          " " + pinned_args(args) + " 2>&1";
  return run_captured(cmd);
}
inline LaunchResult launch_train(int ranks, const std::string& args, int timeout_s = 240, int kill_grace_s = 3) {
  return launch_command(ranks, "train", args, timeout_s, kill_grace_s);
}

/// launch_train for a job every rank refuses before training (a bad key or combination): each
/// rank says why and exits at once, so mpirun's kill grace, which it waits out twice after a
/// non-zero exit, is kept to a second.
inline LaunchResult launch_refused(int ranks, const std::string& args) {
  return launch_train(ranks, args, /*timeout_s=*/120, /*kill_grace_s=*/1);
}

/// The directories fresh_dir() made in this process, removed when it ends with every test passed
/// (a failure keeps them to look at, as does WD_KEEP_TEST_DIRS=1): a run of the launch tests
/// writes gigabytes of checkpoints and logs, and CI runs on the same machine each time.
class FreshDirs {
 public:
  FreshDirs() = default;
  FreshDirs(const FreshDirs&) = delete;
  FreshDirs& operator=(const FreshDirs&) = delete;
  ~FreshDirs() {
    const char* keep = std::getenv("WD_KEEP_TEST_DIRS");
    if ((keep != nullptr && std::string(keep) == "1") || !::testing::UnitTest::GetInstance()->Passed()) return;
    for (const auto& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  void add(const std::filesystem::path& d) { dirs_.push_back(d); }

 private:
  std::vector<std::filesystem::path> dirs_;
};

/// A fresh directory under the system temp dir, unique to this process and `name`; removed at
/// exit when every test passed (FreshDirs).
inline std::filesystem::path fresh_dir(const std::string& name) {
  static FreshDirs made;  // after GoogleTest's UnitTest, so destroyed before it
  auto d = std::filesystem::temp_directory_path() / ("wd-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  made.add(d);
  return d;
}

/// The folder of runs that several cases of a driver share (a static, made by the first case
/// that needs it). Run as one program, that is fresh_dir(name). CTest runs each case in its own
/// process (tests/launch/CMakeLists.txt) and sets WD_LAUNCH_SHARED: then it is `name` in there,
/// made by the driver's setup case, which CTest runs first, and only read by the other cases.
inline std::filesystem::path shared_dir(const std::string& name) {
  const char* root = std::getenv("WD_LAUNCH_SHARED");
  if (root == nullptr || *root == '\0') return fresh_dir(name);
  return std::filesystem::path(root) / name;
}

/// The JSON lines of a metrics.jsonl file.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& file) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

/// The training losses of a run, step by step, from its metrics.jsonl.
inline std::vector<double> losses(const std::filesystem::path& run_dir) {
  std::vector<double> out;
  for (const auto& m : read_metrics(run_dir / "metrics.jsonl")) {
    if (m.contains("loss")) out.push_back(m["loss"].get<double>());
  }
  return out;
}

/// The loss curves of runs `a` and `b` both have `steps` steps and agree to `relative` (1e-6) at
/// every one (two layouts whose BLAS may sum in another order).
inline void expect_close_losses(const std::filesystem::path& a, const std::filesystem::path& b, std::size_t steps,
                                double relative = 1e-6) {
  const auto la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), steps);
  ASSERT_EQ(lb.size(), la.size());
  for (std::size_t i = 0; i < la.size(); ++i) {
    EXPECT_NEAR(lb[i], la[i], relative * std::abs(la[i])) << "step " << i + 1;
  }
}

/// The run `resumed`, resumed after step `from` of the `steps`-step run `straight`, trained its
/// remaining steps bit for bit as the straight run did.
inline void expect_resumed_exactly(const std::filesystem::path& straight, const std::filesystem::path& resumed,
                                   std::size_t steps, std::size_t from) {
  const auto all = losses(straight), tail = losses(resumed);
  ASSERT_EQ(all.size(), steps);
  ASSERT_EQ(tail.size(), steps - from);
  for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], all[i + from]) << "step " << i + from + 1;
}

/// How many times `needle` occurs in `text`.
inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

}  // namespace wd::test
