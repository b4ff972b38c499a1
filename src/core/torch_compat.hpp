// The one place that knows LibTorch versions apart (Debian's 1.13 CPU build vs 2.x CUDA builds).
#pragma once

#include <torch/torch.h>
#include <torch/version.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#define WD_TORCH_HAS_SDPA 1
#else
#define WD_TORCH_HAS_SDPA 0
#endif

// WD_TORCH_CUDA is set by CMake (src/core/CMakeLists.txt) when the LibTorch found was built
// with CUDA; Debian's CPU build ships the c10/cuda headers but not the libraries behind them.
#ifndef WD_TORCH_CUDA
#define WD_TORCH_CUDA 0
#endif
#if WD_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace wd::compat {

/// True when this LibTorch has the fused scaled-dot-product attention.
constexpr bool kHasFusedAttention = WD_TORCH_HAS_SDPA;

/// "1.13.0" etc.
inline const char* torch_version() { return TORCH_VERSION; }

/// The plain formula, available in every build so tests can compare it with `attention`.
/// Half inputs on the host go through both products as fp32 on their half values (products of
/// two half numbers are exact in fp32), the probabilities rounded to v's dtype first: what a half
/// matmul with fp32 accumulation computes, as the fused kernels do. LibTorch 1.13's own bf16
/// batched matmul on the host accumulates in bf16 where oneDNN does not serve it (a CPU without
/// AVX-512): probabilities times values over 512 keys came out 5.8e-2 off relative, against
/// 2.5e-3 with fp32 accumulation (LibTorch 1.13 with its oneDNN turned off, 2026-12-02).
inline torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v,
                                         const std::optional<torch::Tensor>& key_mask = std::nullopt) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const bool widen = q.is_cpu() && (q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf);
  const auto wide = [&](const torch::Tensor& t) { return widen ? t.to(torch::kFloat) : t; };
  auto scores = at::matmul(wide(q), wide(k).transpose(-2, -1)).to(torch::kFloat).mul_(scale);
  if (key_mask) scores.masked_fill_(key_mask->logical_not(), -std::numeric_limits<float>::infinity());
  auto probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(wide(probs), wide(v)).to(v.scalar_type());
}

/// softmax(q·kᵀ/√d)·v over [B, heads, S, d] tensors. `key_mask`, when given, is a boolean
/// [B, 1, 1, S_k] tensor, true for keys that take part. Uses the fused kernel where LibTorch
/// has one; otherwise plain attention with an fp32 softmax (the fused kernels also keep the
/// softmax in fp32 for half inputs), so both paths agree in fp32 up to summation order.
inline torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v,
                               const std::optional<torch::Tensor>& key_mask = std::nullopt) {
#if WD_TORCH_HAS_SDPA
  return at::scaled_dot_product_attention(
      q, k, v, key_mask ? c10::optional<at::Tensor>(*key_mask) : c10::nullopt);
#else
  return attention_reference(q, k, v, key_mask);
#endif
}

/// Which kernel `attention` runs for these inputs: LibTorch's own choice among its fused
/// scaled-dot-product backends (math, flash, efficient, cudnn), with the cuDNN version for CUDA
/// inputs; "reference" where LibTorch has no fused attention (1.13).
inline std::string attention_backend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const std::optional<torch::Tensor>& key_mask = std::nullopt) {
#if WD_TORCH_HAS_SDPA
  static const char* const kNames[] = {"math", "flash", "efficient", "cudnn", "overrideable"};
  const auto choice = at::_fused_sdp_choice(q, k, v, key_mask ? c10::optional<at::Tensor>(*key_mask) : c10::nullopt);
  std::string name = choice >= 0 && choice < 5 ? kNames[choice] : "error";
#if WD_TORCH_CUDA
  if (q.is_cuda()) name += " (cuDNN " + std::to_string(at::detail::getCUDAHooks().versionCuDNN()) + ")";
#endif
  return name;
#else
  static_cast<void>(q), static_cast<void>(k), static_cast<void>(v), static_cast<void>(key_mask);
  return "reference (LibTorch " TORCH_VERSION " has no fused attention)";
#endif
}

/// x·rsqrt(mean(x², last dim) + eps), in x's dtype: LibTorch's fused at::rms_norm where it has
/// one (2.4 and later), else the same formula from its parts (Debian's 1.13).
inline torch::Tensor rms_norm(const torch::Tensor& x, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::rms_norm(x, {x.size(-1)}, c10::nullopt, eps);
#else
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
#endif
}

/// True when LibTorch has fp16/bf16 matmul kernels on `device`. Debian's 1.13 CPU build has
/// bf16 (oneDNN) but no fp16 matmul on the host; 2.x builds have both.
inline bool half_matmul_supported(c10::ScalarType dtype, const c10::Device& device) {
  if (device.is_cuda() || dtype != c10::kHalf) return true;
  return TORCH_VERSION_MAJOR >= 2;
}

/// True when a CUDA device is usable by this process.
inline bool cuda_available() { return torch::cuda::is_available(); }

/// True when this LibTorch was built with CUDA (its caching allocator can be queried).
constexpr bool kHasCuda = WD_TORCH_CUDA;

/// The CUDA caching allocator's view of one device, and the device's own free/total.
struct DeviceMemory {
  bool available = false;              ///< false on CPU builds and for non-CUDA devices
  std::uint64_t allocated_bytes = 0;   ///< held by live tensors
  std::uint64_t reserved_bytes = 0;    ///< allocated + cached blocks (what cudaMalloc gave us)
  std::uint64_t peak_allocated_bytes = 0;  ///< since the last reset_device_peak
  std::uint64_t peak_reserved_bytes = 0;   ///< since the last reset_device_peak
  std::uint64_t free_bytes = 0;        ///< cudaMemGetInfo: free on the device (all processes)
  std::uint64_t total_bytes = 0;
};

/// Initialises LibTorch's CUDA state (devices, the caching allocator) once; a no-op after that
/// and in builds without CUDA. The allocator's statistics throw before it ("did you call
/// init?"), so everything that asks them calls this first.
inline void init_cuda() {
#if WD_TORCH_CUDA
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
#endif
}

/// Memory statistics of `device`; `available` is false unless it is a CUDA device of a CUDA
/// build. Only query a device this process already uses: the allocator of an untouched device
/// is not initialised, and cudaMemGetInfo would create a context on it.
inline DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory m;
#if WD_TORCH_CUDA
  if (!device.is_cuda()) return m;
  init_cuda();
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  // Index 0 of every StatArray is StatType::AGGREGATE (all pools) in 1.13 and in 2.x, where
  // StatType moved namespaces; the index keeps this line valid in both.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  m.allocated_bytes = static_cast<std::uint64_t>(stats.allocated_bytes[0].current);
  m.reserved_bytes = static_cast<std::uint64_t>(stats.reserved_bytes[0].current);
  m.peak_allocated_bytes = static_cast<std::uint64_t>(stats.allocated_bytes[0].peak);
  m.peak_reserved_bytes = static_cast<std::uint64_t>(stats.reserved_bytes[0].peak);
  const c10::cuda::CUDAGuard guard(index);
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    m.free_bytes = free;
    m.total_bytes = total;
  }
  m.available = true;
#else
  (void)device;
#endif
  return m;
}

/// The cudaStream_t LibTorch computes on for `device` (its current stream), as void* so
/// callers need no CUDA headers; nullptr (CUDA's legacy default stream, LibTorch's default)
/// where this LibTorch has no CUDA.
inline void* current_cuda_stream(const c10::Device& device) {
#if WD_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
  return nullptr;
#endif
}

/// Waits until the work queued on `device`'s current stream has finished (no-op for the host,
/// where every kernel has finished when it returns).
inline void synchronize_device(const c10::Device& device) {
#if WD_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#else
  (void)device;
#endif
}

/// Makes `device` this thread's current CUDA device, in LibTorch and in the CUDA runtime, so
/// that what the rank allocates next (pinned host buffers included: cudaHostAlloc opens a
/// context on the current device) lands on its own GPU and not on GPU 0. No-op for the host
/// and in builds without CUDA.
inline void set_current_device(const c10::Device& device) {
#if WD_TORCH_CUDA
  if (!device.is_cuda()) return;
  const auto index = device.has_index() ? device.index() : c10::DeviceIndex{0};
  c10::cuda::set_device(index);
  cudaSetDevice(index);  // the runtime's own notion, for code that calls CUDA directly
#else
  (void)device;
#endif
}

/// The CUDA device index this thread computes on (-1 where the build has no CUDA or no device
/// is usable: asking c10 then throws, e.g. "CUDA driver version is insufficient" on a host with
/// the CUDA libraries and no GPU).
inline int current_cuda_device() {
#if WD_TORCH_CUDA
  if (!cuda_available()) return -1;
  return static_cast<int>(c10::cuda::current_device());
#else
  return -1;
#endif
}

/// Whether fp32 matmuls on CUDA may use TF32 (10-bit mantissa inputs, fp32 accumulation): about
/// 8x the fp32 rate on Hopper. Process-wide; CPU matmuls are not affected by "high" precision
/// in either LibTorch. `allow` false gives exact fp32 ("highest", LibTorch's default).
inline void allow_tf32_matmul(bool allow) {
  at::globalContext().setFloat32MatmulPrecision(allow ? "high" : "highest");
}

/// Zeroes every tensor of `tensors` (one multi-tensor kernel launch per device and dtype).
inline void zero_all(std::vector<torch::Tensor>& tensors) {
  if (!tensors.empty()) at::_foreach_zero_(tensors);
}

/// `to[i].copy_(from[i])` for every i (one multi-tensor copy where this LibTorch has it).
inline void copy_all(std::vector<torch::Tensor>& to, const std::vector<torch::Tensor>& from) {
  if (to.empty()) return;
#if TORCH_VERSION_MAJOR >= 2
  at::_foreach_copy_(to, from);
#else
  for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
#endif
}

/// Seconds the work that `run` queues on `device`'s current stream takes on the device, from two
/// CUDA events recorded around it (a host clock would add the launch latency, which dwarfs a
/// small kernel). Waits for the second event. nullopt, and `run` not called, where `device` is
/// not a CUDA device of a CUDA build.
template <typename Run>
std::optional<double> cuda_event_seconds(const c10::Device& device, Run&& run) {
#if WD_TORCH_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    struct Events {  // destroyed on every path, run() may throw
      cudaEvent_t start = nullptr, stop = nullptr;
      ~Events() {
        if (start) cudaEventDestroy(start);
        if (stop) cudaEventDestroy(stop);
      }
    } ev;
    C10_CUDA_CHECK(cudaEventCreate(&ev.start));
    C10_CUDA_CHECK(cudaEventCreate(&ev.stop));
    C10_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    run();
    C10_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
    C10_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    return ms / 1e3;
  }
#endif
  (void)device;
  (void)run;
  return std::nullopt;
}

/// Starts a new peak interval for `device` (no-op where device_memory is not available).
inline void reset_device_peak(const c10::Device& device) {
#if WD_TORCH_CUDA
  if (!device.is_cuda()) return;
  init_cuda();
  c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index()
                                                                     : c10::cuda::current_device());
#else
  (void)device;
#endif
}

/// Returns the CUDA caching allocator's unused cached blocks to the driver. False (and nothing
/// done) on CPU builds and for non-CUDA devices.
inline bool empty_device_cache(const c10::Device& device) {
#if WD_TORCH_CUDA
  if (!device.is_cuda()) return false;
  c10::cuda::CUDACachingAllocator::emptyCache();
  return true;
#else
  (void)device;
  return false;
#endif
}

/// The default random generators' states a recomputation must see again: the CPU one always,
/// and that of the CUDA device `device` when it is one (kernels on it draw from that generator).
struct RngSnapshot {
  c10::Device device{c10::kCPU};
  torch::Tensor cpu_state;
  torch::Tensor device_state;  ///< undefined for a CPU device
};

/// Captures the states of the generators `device` uses (see RngSnapshot).
inline RngSnapshot rng_snapshot(const c10::Device& device) {
  RngSnapshot s;
  s.device = device;
  const auto read = [](at::Generator gen) {  // a handle to the same generator
    // get_state is not synchronised on its own; the generator's mutex guards it.
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  };
  s.cpu_state = read(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)));
  if (device.is_cuda()) s.device_state = read(at::globalContext().defaultGenerator(device));
  return s;
}

/// Puts the generators back into the states `s` captured.
inline void rng_restore(const RngSnapshot& s) {
  const auto write = [](at::Generator gen, const torch::Tensor& state) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  };
  write(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)), s.cpu_state);
  if (s.device_state.defined()) write(at::globalContext().defaultGenerator(s.device), s.device_state);
}

/// The type keying torch::optim::Optimizer::state(): a string in LibTorch 1.13, the TensorImpl
/// address itself in later versions.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<const torch::optim::Optimizer&>().state())>::key_type;

/// The key under which an optimizer keeps the state of parameter `p` (what its step() uses):
/// 1.13 streams the TensorImpl address into a string (c10::guts::to_string, which PyTorch 2.2
/// removed, so it is spelled out here: the same `ostream << pointer`). (A template only so that
/// the branch of the other version is never compiled.)
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;
    address << p.unsafeGetTensorImpl();
    return address.str();
  } else {
    return static_cast<Key>(static_cast<void*>(p.unsafeGetTensorImpl()));
  }
}

/// True where fused_adamw_step can run (LibTorch 2.x).
constexpr bool fused_adamw_step_available() { return TORCH_VERSION_MAJOR >= 2; }

/// One AdamW step of `optimizer` as LibTorch's fused multi-tensor kernel (a handful of launches
/// for all parameters instead of ~8 per parameter), where this LibTorch has it and every
/// parameter with a gradient is on a CUDA device; returns false, having done nothing, otherwise
/// (the caller then runs optimizer.step(), the exact per-parameter update). The moments and the
/// step count live in the optimizer's own state, so checkpoints and resume see no difference.
/// `force` runs the fused kernel on host parameters too (tests: 2.x has a CPU kernel).
template <typename Key = OptimizerStateKey>
bool fused_adamw_step(torch::optim::AdamW& optimizer, bool force = false) {
#if TORCH_VERSION_MAJOR >= 2
  // A dry pass first: the fused path is all or nothing.
  bool any = false;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!force && !p.is_cuda()) return false;
      any = true;
    }
  }
  if (!any) return false;
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps;
    std::map<std::pair<std::int64_t, std::string>, torch::Tensor> step_of;  // one per (count, device)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const Key key = optimizer_state_key<Key>(p);
      auto& states = optimizer.state();
      if (states.find(key) == states.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        states[key] = std::move(fresh);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*states[key]);
      st.step(st.step() + 1);
      auto& count = step_of[{st.step(), p.device().str()}];
      if (!count.defined()) {
        count = torch::full({}, static_cast<double>(st.step()), torch::TensorOptions().dtype(torch::kFloat).device(p.device()));
      }
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      if (o.amsgrad()) max_sqs.push_back(st.max_exp_avg_sq());
      steps.push_back(count);
    }
    if (params.empty()) continue;
    const auto [beta1, beta2] = o.betas();
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps, o.lr(), beta1, beta2,
                      o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
  }
  return true;
#else
  (void)optimizer;
  (void)force;
  return false;
#endif
}

/// Calls `ready` each time the autograd engine has accumulated a gradient into `param`'s .grad
/// (a post hook on its AccumulateGrad node, as LibTorch's own DDP reducer does; the node is kept
/// alive here, else the engine would make a new one without the hook). The hook is removed when
/// this owner dies. Move-only.
class GradReadyHook {
 public:
  GradReadyHook(const torch::Tensor& param, std::function<void()> ready)
      : node_(torch::autograd::impl::grad_accumulator(param)) {
    TORCH_CHECK(node_ != nullptr, "a gradient hook needs a leaf tensor that requires grad");
    key_ = node_->add_post_hook(std::make_unique<Post>(std::move(ready)));
  }
  GradReadyHook(GradReadyHook&& other) noexcept : node_(std::move(other.node_)), key_(other.key_) {}
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;
  GradReadyHook& operator=(GradReadyHook&&) = delete;
  ~GradReadyHook() {
    if (node_) node_->del_post_hook(key_);
  }

 private:
  struct Post final : torch::autograd::FunctionPostHook {
    explicit Post(std::function<void()> f) : fn(std::move(f)) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      fn();
      return outputs;
    }
    std::function<void()> fn;
  };
  std::shared_ptr<torch::autograd::Node> node_;
  std::uintptr_t key_ = 0;
};

}  // namespace wd::compat
