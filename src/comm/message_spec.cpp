// MessageSpec's layout and hash, the message checks, Message::at.
#include "comm/message_spec.hpp"

#include <algorithm>

#include "core/errors.hpp"
#include "core/logging.hpp"

namespace wd::comm {

namespace {

/// Every tensor starts on this boundary of a message buffer.
constexpr std::uint64_t kTensorAlign = 64;

std::uint64_t align_tensor(std::uint64_t n) { return (n + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

std::string names_of(const TensorDict& dict) {
  std::string out;
  for (const auto& [name, tensor] : dict) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "(none)" : out;
}

}  // namespace

std::string tensor_names(const MessageSpec& spec) {
  std::string out;
  for (const auto& t : spec.tensors) out += (out.empty() ? "" : ", ") + t.name;
  return out.empty() ? "(none)" : out;
}

std::uint64_t TensorSpec::bytes() const {
  std::uint64_t n = 1;
  for (const auto d : shape) {
    WD_CHECK(d >= 0,
             "tensor '" << name << "' has a negative dimension in shape " << format_shape(shape));
    n *= static_cast<std::uint64_t>(d);
  }
  return n * c10::elementSize(dtype);
}

std::vector<std::uint64_t> MessageSpec::offsets() const {
  std::vector<std::uint64_t> out;
  out.reserve(tensors.size());
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    out.push_back(at);
    at += align_tensor(t.bytes());
  }
  return out;
}

std::uint64_t MessageSpec::bytes() const {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += align_tensor(t.bytes());
  return total;
}

std::uint64_t MessageSpec::hash() const {
  std::string text;
  for (const auto& t : tensors) {
    text += t.name + ":" + std::to_string(static_cast<int>(t.dtype)) + ":" + format_shape(t.shape) + ";";
  }
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

void check_message(const MessageSpec& spec, const TensorDict& dict, std::int64_t step, const std::string& who) {
  for (const auto& [name, tensor] : dict) {
    const bool known = std::any_of(spec.tensors.begin(), spec.tensors.end(),
                                   [&](const TensorSpec& t) { return t.name == name; });
    WD_CHECK(known, "message for " << who << " of step " << step << " has tensor '" << name
                                   << "', which the message spec lacks (spec: " << tensor_names(spec) << ")");
  }
  for (const auto& t : spec.tensors) {
    const auto it = dict.find(t.name);
    WD_CHECK(it != dict.end(), "message for " << who << " of step " << step << " lacks tensor '" << t.name
                                              << "' (it has: " << names_of(dict) << ")");
    WD_CHECK(it->second.defined(), "tensor '" << t.name << "' for " << who << " of step " << step << " is undefined");
    WD_CHECK(it->second.sizes() == c10::IntArrayRef(t.shape),
             "tensor '" << t.name << "' for " << who << " of step " << step << ": expected shape "
                        << format_shape(t.shape) << ", got " << format_shape(it->second.sizes()));
  }
}

const torch::Tensor& Message::at(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    throw Error("message of step " + std::to_string(step) + " has no tensor '" + name +
                "' (it has: " + names_of(tensors) + ")");
  }
  return it->second;
}

}  // namespace wd::comm
