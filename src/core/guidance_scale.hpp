// A classifier-free guidance scale, one for every forward or one per expert of a two-expert
// (A14B) teacher: the official Wan 2.2 samplers guide T2V-A14B's low-noise expert with 3.0 and its
// high-noise expert with 4.0, which one number cannot reproduce.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace wd {

class OptionTable;

struct GuidanceScale {
  double low = 1.0;   ///< the low-noise expert's (a one-expert teacher's only) scale
  double high = 1.0;  ///< the high-noise expert's

  GuidanceScale() = default;
  /// One number is one scale for every forward.
  GuidanceScale(double g) : low(g), high(g) {}  // NOLINT(google-explicit-constructor)
  GuidanceScale(double low_noise, double high_noise) : low(low_noise), high(high_noise) {}

  /// "G" (every forward) or "LOW,HIGH" (the low-noise, then the high-noise expert's, as the
  /// official sample_guide_scale pairs list them); a ConfigError naming `key` otherwise.
  static GuidanceScale parse(const std::string& key, const std::string& text);
  /// The text parse() reads back: "G" or "LOW,HIGH".
  std::string str() const;
  /// Whether the experts' scales differ (then the teacher must have two experts).
  bool per_expert() const { return low != high; }
  /// No guidance anywhere: every forward is the plain conditional one.
  bool is_one() const { return low == 1.0 && high == 1.0; }
  /// The scale of a forward by the high-noise expert (`high_noise`) or the low-noise one.
  double of(bool high_noise) const { return high_noise ? high : low; }
};

/// Binds `key` to `field`: its text is parse(key, ·), --help and INI files show str().
OptionTable& bind_guidance(OptionTable& table, const std::string& key, GuidanceScale& field, const std::string& help);

/// In JSON (reports): the number, or "LOW,HIGH" per expert.
void to_json(nlohmann::json& j, const GuidanceScale& g);

}  // namespace wd
