// MessageSpec: the tensors of one stream message (names, dtypes, shapes, aligned layout), the
// checks a message passes before it is sent, and the received Message.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wd::comm {

/// One tensor of a message: name, dtype, shape.
struct TensorSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const;
};

/// Shapes and dtypes of the message one receiver gets per step. Fixed for a run, so every
/// buffer is allocated once.
struct MessageSpec {
  std::vector<TensorSpec> tensors;
  /// Payload bytes as laid out in a buffer (without the small header): each tensor starts on a
  /// 64-byte boundary so the received views are aligned for vectorised kernels.
  std::uint64_t bytes() const;
  /// Byte offset of each tensor within the payload, in `tensors` order.
  std::vector<std::uint64_t> offsets() const;
  /// FNV-1a over names, dtypes and shapes: the two ends of a stream compare it to catch drift.
  std::uint64_t hash() const;
};

/// Named tensors of one message.
using TensorDict = std::map<std::string, torch::Tensor>;

/// True for the message tensors a receiver keeps on the host whatever its device: the sample
/// lengths (`context_lens`, B integers), which the DiT reads on the host; on the device they
/// would cost a synchronisation at every forward.
inline bool host_resident(const std::string& name) { return name == "context_lens"; }

/// Throws wd::Error unless `dict` holds exactly the spec's tensors, each defined and of the
/// spec's shape; the message names `who` it is for and the step.
void check_message(const MessageSpec& spec, const TensorDict& dict, std::int64_t step, const std::string& who);

/// "x_t, t, context": the spec's tensor names, for messages.
std::string tensor_names(const MessageSpec& spec);

/// A received message: tensors view a ring slot and stay valid until the receiver's
/// `release(step)`.
struct Message {
  std::int64_t step = -1;
  TensorDict tensors;
  /// The tensor `name`; throws wd::Error naming the tensors there are.
  const torch::Tensor& at(const std::string& name) const;
};

}  // namespace wd::comm
