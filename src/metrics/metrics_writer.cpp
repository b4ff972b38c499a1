// MetricsWriter: metrics.jsonl lines and their TensorBoard scalars, one run per kind of line.
#include "metrics/metrics_writer.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace wd::metrics {

namespace {

bool is_step_field(const std::string& key) {
  return key.size() >= 4 && key.compare(key.size() - 4, 4, "step") == 0;
}

void collect(const std::string& path, const nlohmann::json& value, std::vector<EventScalar>& out) {
  if (value.is_number()) {
    out.push_back({path, static_cast<float>(value.get<double>())});
  } else if (value.is_object()) {
    for (const auto& [key, v] : value.items()) {
      if (is_step_field(key)) continue;
      collect(v.is_array() ? path : path + "/" + key, v, out);  // elements name themselves
    }
  } else if (value.is_array()) {
    for (std::size_t i = 0; i < value.size(); ++i) {
      const auto& element = value[i];
      if (element.is_object() && element.contains("rank") && element["rank"].is_number_integer()) {
        auto rest = element;
        rest.erase("rank");
        collect(path + "/rank" + std::to_string(element["rank"].get<std::int64_t>()), rest, out);
      } else {
        collect(path + "/" + std::to_string(i), element, out);
      }
    }
  }
}

}  // namespace

MetricScalars metric_scalars(const nlohmann::json& line) {
  MetricScalars m;
  if (!line.is_object()) return m;
  static const std::pair<const char*, const char*> kRuns[] = {
      {"step", "train"}, {"eval_step", "eval"}, {"memory_step", "memory"}};
  for (const auto& [field, run] : kRuns) {
    const auto it = line.find(field);
    if (it == line.end() || !it->is_number_integer()) continue;
    m.run = run;
    m.step = it->get<std::int64_t>();
    collect(m.run, line, m.scalars);
    if (m.scalars.empty()) m.run.clear();
    return m;
  }
  return m;
}

MetricsWriter::MetricsWriter(std::string jsonl_path) : jsonl_path_(std::move(jsonl_path)) {
  if (!jsonl_path_.empty()) {
    tensorboard_dir_ = (std::filesystem::path(jsonl_path_).parent_path() / "tensorboard").string();
  }
}

void MetricsWriter::append(const nlohmann::json& line) {
  if (jsonl_path_.empty()) return;
  const std::string text = line.dump() + "\n";
  const int fd = ::open(jsonl_path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  const bool written = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (!written && !jsonl_warned_) {
    jsonl_warned_ = true;
    spdlog::warn("cannot append to {}: {}", jsonl_path_, std::strerror(errno));
  }
  if (fd >= 0) ::close(fd);

  const auto m = metric_scalars(line);
  if (m.run.empty()) return;
  auto it = runs_.find(m.run);
  try {
    if (it == runs_.end()) {
      // The first line of this run in this process: its step is where a resumed process takes
      // over, and the START there hides what an earlier process recorded from it on.
      it = runs_.emplace(m.run, EventFileWriter((std::filesystem::path(tensorboard_dir_) / m.run).string(), m.step))
               .first;
    }
    if (it->second) it->second->write_scalars(m.step, m.scalars);
  } catch (const std::exception& e) {
    spdlog::warn("TensorBoard run '{}' is no longer written: {}", m.run, e.what());
    if (it == runs_.end()) {
      runs_.emplace(m.run, std::nullopt);
    } else {
      it->second.reset();
    }
  }
}

}  // namespace wd::metrics
