// HDF5 error reporting and the file/type helpers shared by the data set reader and writer.
#include "data/h5_file.hpp"

#include <filesystem>
#include <limits>

namespace wd::data {
namespace detail {

std::string h5_failure(const char* call) {
  // The stack runs from the API call (outermost) down to where the problem was found
  // (innermost); the two ends together say what failed and why, the middle is noise.
  struct Ends {
    std::string outer;
    std::string inner;
  } ends;
  const H5E_walk2_t collect = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* e = static_cast<Ends*>(data);
    const std::string desc = err->desc ? err->desc : "";
    if (n == 0) e->outer = desc;
    e->inner = desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &ends);
  H5Eclear2(H5E_DEFAULT);
  std::string msg = std::string(call) + " failed";
  if (!ends.outer.empty()) msg += ": " + ends.outer;
  if (!ends.inner.empty() && ends.inner != ends.outer) msg += ": " + ends.inner;
  return msg;
}

}  // namespace detail

void h5_silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

/// File access properties: HDF5 >= 1.10.7 takes flock() locks that fail on file systems
/// without locking (some NFS and Lustre mounts); read-only readers do not need them to be safe,
/// so a missing lock service is ignored instead of refusing to open the file.
H5PropertyList file_access(const std::string& path) {
  H5PropertyList fapl(WD_CHECK_H5(H5Pcreate(H5P_FILE_ACCESS), path, ""));
#if H5_VERSION_GE(1, 10, 7)
  WD_CHECK_H5(H5Pset_file_locking(fapl.get(), true, true), path, "");
#endif
  return fapl;
}

}  // namespace

H5File h5_open_read_only(const std::string& path) {
  h5_silence_errors();
  std::error_code ec;
  WD_CHECK_DATA(std::filesystem::is_regular_file(path, ec), path, "",
                "no such file (expected an HDF5 data set, see docs/data-format.md)");
  // H5Fis_hdf5 tells "not HDF5 at all" apart from a damaged or truncated HDF5 file.
  WD_CHECK_DATA(WD_CHECK_H5(H5Fis_hdf5(path.c_str()), path, "") > 0, path, "",
                "not an HDF5 file (no HDF5 signature; expected an HDF5 data set, see "
                "docs/data-format.md)");
  const H5PropertyList fapl = file_access(path);
  return H5File(WD_CHECK_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), path, ""));
}

H5File h5_create(const std::string& path) {
  h5_silence_errors();
  const H5PropertyList fapl = file_access(path);
  return H5File(
      WD_CHECK_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), path, ""));
}

H5Datatype h5_float16_type() {
  // binary16: sign bit 15, exponent bits 10..14 (bias 15), mantissa bits 0..9.
  H5Datatype type(WD_CHECK_H5(H5Tcopy(H5T_IEEE_F32LE), "", "float16 type"));
  WD_CHECK_H5(H5Tset_fields(type.get(), 15, 10, 5, 0, 10), "", "float16 type");
  WD_CHECK_H5(H5Tset_size(type.get(), 2), "", "float16 type");
  WD_CHECK_H5(H5Tset_ebias(type.get(), 15), "", "float16 type");
  return type;
}

H5Datatype h5_vlen_string_type() {
  H5Datatype type(WD_CHECK_H5(H5Tcopy(H5T_C_S1), "", "string type"));
  WD_CHECK_H5(H5Tset_size(type.get(), H5T_VARIABLE), "", "string type");
  WD_CHECK_H5(H5Tset_cset(type.get(), H5T_CSET_UTF8), "", "string type");
  return type;
}

std::vector<std::int64_t> h5_dims(hid_t dataset, const std::string& file, const std::string& item) {
  const H5Dataspace space(WD_CHECK_H5(H5Dget_space(dataset), file, item));
  const int rank = WD_CHECK_H5(H5Sget_simple_extent_ndims(space.get()), file, item);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  WD_CHECK_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), file, item);
  for (std::size_t d = 0; d < dims.size(); ++d) {
    WD_CHECK_DATA(dims[d] <= static_cast<hsize_t>(std::numeric_limits<std::int64_t>::max()), file,
                  item, "dimension " << d << " is " << dims[d] << ", beyond int64 (2^63-1)");
  }
  return std::vector<std::int64_t>(dims.begin(), dims.end());
}

std::optional<std::uint64_t> h5_stored_chunks(hid_t dataset, const std::string& file,
                                              const std::string& item) {
#if H5_VERSION_GE(1, 10, 5)
  // HDF5 1.10 refuses H5S_ALL here, so the whole dataspace is passed explicitly.
  const H5Dataspace space(WD_CHECK_H5(H5Dget_space(dataset), file, item));
  hsize_t chunks = 0;
  WD_CHECK_H5(H5Dget_num_chunks(dataset, space.get(), &chunks), file, item);
  return chunks;
#else
  return std::nullopt;
#endif
}

std::uint64_t h5_chunk_count(hid_t dcpl, const std::vector<std::int64_t>& dims,
                             const std::string& file, const std::string& item) {
  if (H5Pget_layout(dcpl) != H5D_CHUNKED) return 1;
  std::vector<hsize_t> chunk(dims.size());
  WD_CHECK_H5(H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), file, item);
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    const auto along = (static_cast<std::uint64_t>(dims[d]) + chunk[d] - 1) / chunk[d];
    // Saturates: a count this large can never be stored, which is all the caller asks.
    if (__builtin_mul_overflow(count, along, &count)) return ~std::uint64_t{0};
  }
  return count;
}

}  // namespace wd::data
