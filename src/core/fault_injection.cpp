// Fault injection: parsing KIND@ROLE:RANK:STEP[:POINT] and performing the fault at its step and point.
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

const std::map<std::string, FaultSpec::Point>& points() {
  static const std::map<std::string, FaultSpec::Point> table{{"step", FaultSpec::Point::kStep},
                                                             {"allreduce", FaultSpec::Point::kAllreduce},
                                                             {"send", FaultSpec::Point::kSend},
                                                             {"save", FaultSpec::Point::kSave},
                                                             {"serve", FaultSpec::Point::kServe},
                                                             {"allgather", FaultSpec::Point::kAllgather}};
  return table;
}

template <typename T>
std::string name_in(const std::map<std::string, T>& table, T value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  return "?";
}

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw ConfigError("inject-fault(" + text + ") " + why +
                    "; expected KIND@ROLE:RANK:STEP[:POINT] with KIND one of oom, oom_huge, nan, throw, hang, "
                    "sigkill, sigterm, sigusr1, ROLE teacher or student, RANK the index among that role's ranks, "
                    "STEP the 1-based training step and POINT step (its start, the default), allreduce (a "
                    "student, inside the gradient all-reduce), send (a teacher, inside the send of the step's "
                    "batch), save (student 0, inside the checkpoint save), serve (a teacher of train.objective dmd, "
                    "inside a real-score answer) or allgather (a student of student.shard optimizer, inside the "
                    "all-gather of the updated parameters), e.g. oom@student:0:3 or "
                    "sigkill@student:1:3:allreduce");
}

/// The point's own rules: who reaches it, and which kinds make sense there.
void check_point(const FaultSpec& spec, const std::string& text) {
  using Point = FaultSpec::Point;
  if (spec.point == Point::kStep) return;
  const auto point = name_in(points(), spec.point);
  if (spec.kind == FaultSpec::Kind::kNan) {
    bad(text, "puts nan at point " + point + ": nan poisons a step's input, so it strikes only at the step's start");
  }
  if ((spec.point == Point::kAllreduce || spec.point == Point::kSave || spec.point == Point::kAllgather) &&
      spec.role != Role::kStudent) {
    bad(text, "puts a teacher at point " + point + ", which only students reach");
  }
  if (spec.point == Point::kSend && spec.role != Role::kTeacher) {
    bad(text, "puts a student at point send, which only teachers reach (they send the batches)");
  }
  if (spec.point == Point::kServe && spec.role != Role::kTeacher) {
    bad(text, "puts a student at point serve, which only teachers reach (they answer the real-score requests)");
  }
  if (spec.point == Point::kSave && spec.role_rank != 0) {
    bad(text, "puts student " + std::to_string(spec.role_rank) +
                  " at point save: student 0 writes every checkpoint, the others never save");
  }
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
  const auto c3 = rest.find(':', c2 + 1);
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
    const std::string rank = rest.substr(c1 + 1, c2 - c1 - 1), step = rest.substr(c2 + 1, c3 - c2 - 1);
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
  if (c3 != std::string::npos) {
    const auto point = points().find(rest.substr(c3 + 1));
    if (point == points().end()) bad(text, "names an unknown point '" + rest.substr(c3 + 1) + "'");
    spec.point = point->second;
  }
  check_point(spec, text);
  return spec;
}

std::string FaultSpec::describe() const {
  // The old form for the step's start, so its messages read as before.
  return name_in(kinds(), kind) + "@" + role_name(role) + ":" + std::to_string(role_rank) + ":" +
         std::to_string(step) + (point == Point::kStep ? "" : ":" + name_in(points(), point));
}

FaultInjector::FaultInjector(std::optional<FaultSpec> spec, Role role, int role_rank)
    : spec_(std::move(spec)), role_(role), role_rank_(role_rank) {}

bool FaultInjector::planned(FaultSpec::Point point) const {
  return spec_ && spec_->role == role_ && spec_->role_rank == role_rank_ && spec_->point == point;
}

bool FaultInjector::due(FaultSpec::Point point, std::int64_t step) const {
  return planned(point) && spec_->step == step;
}

bool FaultInjector::nan_due(std::int64_t step) const {
  if (!due(FaultSpec::Point::kStep, step) || spec_->kind != FaultSpec::Kind::kNan) return false;
  spdlog::warn("injecting fault {} (testing aid)", spec_->describe());
  return true;
}

void FaultInjector::at(FaultSpec::Point point, std::int64_t step, const c10::Device& device) const {
  if (!due(point, step) || spec_->kind == FaultSpec::Kind::kNan) return;
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
