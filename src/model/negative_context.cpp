// load_negative_context (negative_context.hpp).
#include "model/negative_context.hpp"

#include "core/errors.hpp"
#include "model/safetensors.hpp"

namespace wd {

torch::Tensor load_negative_context(const std::string& path, std::int64_t text_dim) {
  const auto file = SafetensorsFile::open(path);
  WD_CHECK_DATA(file.contains("context"), path, "context", "is missing: the negative context is a tensor named `context`");
  auto neg = file.tensor("context", torch::kFloat);
  if (neg.dim() == 3 && neg.size(0) == 1) neg = neg[0];
  WD_CHECK_DATA(neg.dim() == 2 && neg.size(1) == text_dim, path, "context",
                "is " << neg.sizes() << "; it must be [L,text_dim] or [1,L,text_dim] with text_dim " << text_dim);
  return neg.contiguous();
}

}  // namespace wd
