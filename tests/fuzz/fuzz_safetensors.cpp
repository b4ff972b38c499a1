// libFuzzer target for parse_safetensors, the validation behind SafetensorsFile::open.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <set>
#include <string>

#include "core/errors.hpp"
#include "model/safetensors_format.hpp"

namespace {

constexpr const char* kName = "fuzz-input";

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors: FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();  // libFuzzer saves the input as a crash artifact
}

void require(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

/// Everything the reader relies on once a file is accepted: a finding if any fails.
void check_accepted(const wd::SafetensorsLayout& layout, const std::uint8_t* data,
                    std::size_t size) {
  require(layout.data_start >= 8 && layout.data_start <= size,
          "data_start " + std::to_string(layout.data_start) + " outside a file of " +
              std::to_string(size) + " bytes");
  require(layout.data_start - 8 <= wd::kSafetensorsMaxHeaderBytes, "header over the limit");
  require(data[8] == '{', "accepted a header that does not start with '{'");
  require(layout.data_start + layout.data_bytes == size,
          "data section does not end where the file ends");
  std::set<std::string> names;
  std::uint64_t covered = 0;
  for (const wd::TensorInfo& t : layout.tensors) {
    const std::string who = "tensor \"" + t.name + "\": ";
    require(t.name != "__metadata__", "__metadata__ returned as a tensor");
    require(names.insert(t.name).second, who + "listed twice");
    const std::size_t element = wd::safetensors_dtype_size(t.dtype);
    require(element != 0, who + "unknown dtype " + t.dtype + " accepted");
    require(t.begin <= t.end && t.end <= layout.data_bytes, who + "offsets out of range");
    require(t.begin == covered, who + "does not start where the previous tensor ends");
    covered = t.end;
    // Recomputed independently in 128 bits, in the order safetensors multiplies.
    unsigned __int128 elements = 1;
    for (const std::int64_t dim : t.shape) {
      require(dim >= 0, who + "negative dimension accepted");
      elements *= static_cast<std::uint64_t>(dim);
      require(elements <= std::numeric_limits<std::uint64_t>::max(),
              who + "element count overflow accepted");
    }
    const unsigned __int128 bytes = elements * element;
    require(bytes == t.nbytes(), who + "byte size does not match the shape");
    if (t.nbytes() > 0) {
      // Touch both ends, as loading the tensor would: ASan reports any byte outside the input.
      const volatile std::uint8_t first = data[layout.data_start + t.begin];
      const volatile std::uint8_t last = data[layout.data_start + t.end - 1];
      (void)first;
      (void)last;
    }
  }
  require(covered == layout.data_bytes, "tensors do not cover the data section");
}

}  // namespace

/// libFuzzer entry point: a wd::DataError is the expected answer to a bad file; a crash, a
/// sanitizer report, any other exception or an accepted layout breaking an invariant is a finding.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const wd::SafetensorsLayout layout = wd::parse_safetensors(data, size, kName);
    check_accepted(layout, data, size);
  } catch (const wd::DataError& e) {
    const std::string what = e.what();
    require(e.file() == kName && what.rfind(std::string(kName) + ": ", 0) == 0,
            "DataError does not name the file: " + what);
    require(!e.item().empty(), "DataError names no item: " + what);
  } catch (const std::exception& e) {
    finding(std::string("unexpected exception (not wd::DataError): ") + e.what());
  }
  return 0;
}
