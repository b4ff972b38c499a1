// GuidanceScale's text form (guidance_scale.hpp).
#include "core/guidance_scale.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "core/config.hpp"
#include "core/errors.hpp"

namespace wd {

namespace {

/// The number that is all of `text`, else NaN.
double number(const std::string& text) {
  std::size_t used = 0;
  double v = std::nan("");
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nan("");
  }
  return used == text.size() ? v : std::nan("");
}

}  // namespace

GuidanceScale GuidanceScale::parse(const std::string& key, const std::string& text) {
  const auto comma = text.find(',');
  const auto low = number(text.substr(0, comma));
  const auto high = comma == std::string::npos ? low : number(text.substr(comma + 1));
  WD_CHECK_AS(ConfigError, std::isfinite(low) && std::isfinite(high) && low > 0 && high > 0,
              key << "(" << text << ") must be a guidance scale g > 0, or two, LOW,HIGH: the low-noise and the "
                  << "high-noise expert's of a two-expert teacher (e.g. 3,4 as the official T2V-A14B sampler)");
  return {low, high};
}

std::string GuidanceScale::str() const {
  std::ostringstream os;
  os << low;
  if (per_expert()) os << "," << high;
  return os.str();
}

OptionTable& bind_guidance(OptionTable& table, const std::string& key, GuidanceScale& field, const std::string& help) {
  return table.bind_parsed<GuidanceScale>(
      key, field, [key](const std::string& text) { return GuidanceScale::parse(key, text); },
      [](const GuidanceScale& g) { return g.str(); }, help);
}

void to_json(nlohmann::json& j, const GuidanceScale& g) {
  j = g.per_expert() ? nlohmann::json(g.str()) : nlohmann::json(g.low);
}

}  // namespace wd
