// student.checkpointing's policy (checkpoint_policy.hpp).
#include "core/checkpoint_policy.hpp"

#include <cctype>
#include <exception>

#include "core/errors.hpp"

namespace wd {

CheckpointPolicy CheckpointPolicy::parse(const std::string& text) {
  CheckpointPolicy p;
  if (text == "off") return p;
  if (text == "all") {
    p.mode = Mode::kAll;
    return p;
  }
  const std::string prefix = "every:";
  if (text.rfind(prefix, 0) == 0) {
    const auto digits = text.substr(prefix.size());
    std::size_t used = 0;
    long long k = 0;
    try {
      k = std::stoll(digits, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (!digits.empty() && used == digits.size() && k >= 1 && std::isdigit(static_cast<unsigned char>(digits[0]))) {
      p.mode = Mode::kEvery;
      p.every = k;
      return p;
    }
  }
  throw ConfigError("student.checkpointing(" + text + ") must be off, all or every:k with k >= 1");
}

bool CheckpointPolicy::applies(std::int64_t block) const {
  switch (mode) {
    case Mode::kOff:
      return false;
    case Mode::kAll:
      return true;
    case Mode::kEvery:
      return block % every == 0;
  }
  return false;
}

std::string CheckpointPolicy::str() const {
  switch (mode) {
    case Mode::kOff:
      return "off";
    case Mode::kAll:
      return "all";
    case Mode::kEvery:
      return "every:" + std::to_string(every);
  }
  return "off";
}

}  // namespace wd
