// Move-only RAII owners of HDF5 handles, and WD_CHECK_H5 (a failed H5 call as a wd::DataError).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"

namespace wd::data {

/// Owns one HDF5 identifier and closes it with `Close`. Copying is deleted; a moved-from
/// handle is empty. The destructor never throws (a failed close has nothing left to tell).
template <herr_t (*Close)(hid_t)>
class H5Handle {
 public:
  H5Handle() noexcept = default;
  explicit H5Handle(hid_t id) noexcept : id_(id) {}
  ~H5Handle() { reset(); }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  H5Handle& operator=(H5Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
    }
    return *this;
  }

  hid_t get() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ >= 0; }
  /// Gives up ownership without closing, for callers that close and check the result.
  hid_t release() noexcept { return std::exchange(id_, H5I_INVALID_HID); }
  /// Closes the handle now (if any); close errors are ignored, as in the destructor.
  void reset() noexcept {
    if (id_ >= 0) Close(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using H5File = H5Handle<&H5Fclose>;
using H5Dataset = H5Handle<&H5Dclose>;
using H5Dataspace = H5Handle<&H5Sclose>;
using H5Datatype = H5Handle<&H5Tclose>;  ///< only for types we own (never H5T_NATIVE_*)
using H5Attribute = H5Handle<&H5Aclose>;
using H5PropertyList = H5Handle<&H5Pclose>;

namespace detail {

/// "<call> failed: <HDF5's outermost and innermost error descriptions>", then clears the
/// HDF5 error stack.
std::string h5_failure(const char* call);

/// Returns `value` (a hid_t or herr_t) when it is >= 0, else throws wd::DataError(file, item)
/// with the failed call, HDF5's reason and the source location.
template <typename T>
T check_h5(T value, const char* call, const std::string& file, const std::string& item,
           const char* src_file, int src_line) {
  if (value < 0) {
    throw DataError(file, item, ::wd::detail::located(h5_failure(call), src_file, src_line));
  }
  return value;
}

}  // namespace detail

/// Turns off HDF5's automatic printing of its error stack, so a failure reaches the user once,
/// as our exception. Idempotent; every function here that opens or creates a file calls it.
void h5_silence_errors();

/// Opens an existing file read-only; a missing file or a non-HDF5 file is a wd::DataError.
H5File h5_open_read_only(const std::string& path);

/// Creates (truncating) a file for writing.
H5File h5_create(const std::string& path);

/// The IEEE binary16 type (little-endian): HDF5 has no predefined one, and this is the layout
/// h5py and NumPy write for float16, so such files round-trip bit-exactly.
H5Datatype h5_float16_type();

/// A variable-length UTF-8 string type.
H5Datatype h5_vlen_string_type();

/// The extent of a dataset's dataspace; a dimension beyond int64 is a wd::DataError.
std::vector<std::int64_t> h5_dims(hid_t dataset, const std::string& file, const std::string& item);

/// How many chunks of a chunked dataset are stored in the file, or nothing where this HDF5
/// (before 1.10.5) cannot tell.
std::optional<std::uint64_t> h5_stored_chunks(hid_t dataset, const std::string& file,
                                              const std::string& item);

/// How many chunks cover `dims` with the chunk shape of `dcpl` (1 for a dataset not chunked).
std::uint64_t h5_chunk_count(hid_t dcpl, const std::vector<std::int64_t>& dims,
                             const std::string& file, const std::string& item);

}  // namespace wd::data

/// Evaluates an HDF5 call; when it returns < 0, throws wd::DataError naming the call, HDF5's
/// reason, the file and the item (dataset or attribute). Yields the call's value otherwise,
/// so it wraps both `hid_t` constructors and `herr_t` operations.
#define WD_CHECK_H5(call, file, item) \
  ::wd::data::detail::check_h5((call), #call, (file), (item), __FILE__, __LINE__)
