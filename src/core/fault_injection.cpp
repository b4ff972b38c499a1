// Fault injection: parsing KIND@ROLE:RANK:STEP and performing the fault at its step.
#include "core/fault_injection.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <map>
#include <thread>

#include "core/errors.hpp"
#include "core/torch_compat.hpp"

namespace wd {

namespace {

const std::map<std::string, FaultSpec::Kind>& kinds() {
  static const std::map<std::string, FaultSpec::Kind> table{
      {"oom", FaultSpec::Kind::kOom},         {"oom_huge", FaultSpec::Kind::kOomHuge},
      {"nan", FaultSpec::Kind::kNan},
      {"throw", FaultSpec::Kind::kThrow},     {"hang", FaultSpec::Kind::kHang},
      {"sigkill", FaultSpec::Kind::kSigkill}, {"sigterm", FaultSpec::Kind::kSigterm},
      {"sigusr1", FaultSpec::Kind::kSigusr1}};
  return table;
}

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw ConfigError("inject-fault(" + text + ") " + why +
                    "; expected KIND@ROLE:RANK:STEP with KIND one of oom, oom_huge, nan, throw, hang, sigkill, "
                    "sigterm, sigusr1, ROLE teacher or student, RANK the index among that role's ranks and STEP "
                    "the 1-based training step, e.g. oom@student:0:3");
}

}  // namespace

std::optional<FaultSpec> FaultSpec::parse(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const auto at = text.find('@');
  if (at == std::string::npos) bad(text, "has no '@'");
  FaultSpec spec;
  const auto kind = kinds().find(text.substr(0, at));
  if (kind == kinds().end()) bad(text, "names an unknown kind '" + text.substr(0, at) + "'");
  spec.kind = kind->second;
  const std::string rest = text.substr(at + 1);
  const auto c1 = rest.find(':');
  const auto c2 = c1 == std::string::npos ? std::string::npos : rest.find(':', c1 + 1);
  if (c2 == std::string::npos) bad(text, "lacks ROLE:RANK:STEP");
  const std::string role = rest.substr(0, c1);
  if (role == "teacher") {
    spec.role = Role::kTeacher;
  } else if (role == "student") {
    spec.role = Role::kStudent;
  } else {
    bad(text, "names an unknown role '" + role + "'");
  }
  try {
    std::size_t used = 0;
    const std::string rank = rest.substr(c1 + 1, c2 - c1 - 1), step = rest.substr(c2 + 1);
    spec.role_rank = std::stoi(rank, &used);
    if (used != rank.size()) bad(text, "has a bad RANK");
    spec.step = std::stoll(step, &used);
    if (used != step.size()) bad(text, "has a bad STEP");
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception&) {
    bad(text, "has a RANK or STEP that is not a number");
  }
  if (spec.role_rank < 0 || spec.step < 1) bad(text, "needs RANK >= 0 and STEP >= 1");
  return spec;
}

std::string FaultSpec::describe() const {
  for (const auto& [name, k] : kinds()) {
    if (k == kind) {
      return name + "@" + role_name(role) + ":" + std::to_string(role_rank) + ":" + std::to_string(step);
    }
  }
  return "?";
}

FaultInjector::FaultInjector(std::optional<FaultSpec> spec, Role role, int role_rank)
    : spec_(std::move(spec)), role_(role), role_rank_(role_rank) {}

bool FaultInjector::due(std::int64_t step) const {
  return spec_ && spec_->role == role_ && spec_->role_rank == role_rank_ && spec_->step == step;
}

bool FaultInjector::nan_due(std::int64_t step) const {
  if (!due(step) || spec_->kind != FaultSpec::Kind::kNan) return false;
  spdlog::warn("injecting fault {} (testing aid)", spec_->describe());
  return true;
}

void FaultInjector::at_step(std::int64_t step, const c10::Device& device) const {
  if (!due(step) || spec_->kind == FaultSpec::Kind::kNan) return;
  spdlog::warn("injecting fault {} (testing aid)", spec_->describe());
  switch (spec_->kind) {
    case FaultSpec::Kind::kOom: {
      // A request the size of a job that outgrew its memory, not an absurd one (the diagnosis
      // calls a request beyond all of a rank's memory a wrong shape). On a GPU the caching
      // allocator really fails a request for the whole device. A host would overcommit a request
      // just beyond its free memory and the OOM killer would strike later, so there the
      // allocator's failure is raised in LibTorch's words.
      const auto gpu = compat::device_memory(device);
      if (gpu.available) {
        auto whole = torch::empty({static_cast<std::int64_t>(gpu.total_bytes)}, torch::TensorOptions(torch::kUInt8).device(device));
        static_cast<void>(whole);
        break;
      }
      const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
      const auto free = static_cast<std::uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
      throw OutOfMemory("injected fault " + spec_->describe() + ": not enough memory: you tried to allocate " +
                        std::to_string(free + (std::uint64_t{64} << 20)) +
                        " bytes (the host's free memory plus 64 MiB; testing aid)");
    }
    case FaultSpec::Kind::kOomHuge: {
      // 256 TiB: more than any host or device has, as a tensor sized from a wrong dimension
      // would ask; the allocator itself fails.
      auto impossible = torch::empty({std::int64_t{1} << 48}, torch::TensorOptions(torch::kUInt8).device(device));
      static_cast<void>(impossible);
      break;
    }
    case FaultSpec::Kind::kThrow:
      throw Error("injected fault " + spec_->describe());
    case FaultSpec::Kind::kHang:
      // Like a call stuck inside a library: no polling, no heartbeat, forever.
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    case FaultSpec::Kind::kSigkill:
      spdlog::default_logger()->flush();
      std::raise(SIGKILL);
      break;
    case FaultSpec::Kind::kSigterm:
      std::raise(SIGTERM);
      break;
    case FaultSpec::Kind::kSigusr1:
      std::raise(SIGUSR1);
      break;
    case FaultSpec::Kind::kNan:
      break;
  }
}

}  // namespace wd
