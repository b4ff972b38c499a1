// Validation of an HDF5 data set against the schema and the teacher's expectations.
#include "data/dataset_info.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "data/dataset_schema.hpp"
#include "data/h5_file.hpp"

namespace wd::data {
namespace {

std::string class_name(H5T_class_t cls) {
  switch (cls) {
    case H5T_INTEGER:
      return "integer";
    case H5T_FLOAT:
      return "float";
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    default:
      return "non-numeric";
  }
}

/// One opened dataset with the facts validation needs.
struct Opened {
  H5Dataset dataset;
  H5Datatype type;
  std::vector<std::int64_t> dims;
  H5T_class_t cls = H5T_NO_CLASS;
  std::size_t type_size = 0;
};

std::string object_kind(H5O_type_t type) {
  switch (type) {
    case H5O_TYPE_GROUP:
      return "a group";
    case H5O_TYPE_DATASET:
      return "a dataset";
    case H5O_TYPE_NAMED_DATATYPE:
      return "a named datatype";
    default:
      return "an object of unknown kind";
  }
}

/// Opens `name`; a missing object is a DataError that says what the schema expects there. The
/// object must be a dataset whose bytes live in this file: an external link, external raw
/// storage or a virtual dataset would read another file, which validation never sees.
Opened open_dataset(hid_t file, const std::string& path, const char* name, const char* expected) {
  const htri_t exists = WD_CHECK_H5(H5Lexists(file, name, H5P_DEFAULT), path, name);
  WD_CHECK_DATA(exists > 0, path, name,
                "missing; expected a dataset " << expected << " (see docs/data-format.md)");
  H5L_info_t link{};
  WD_CHECK_H5(H5Lget_info(file, name, &link, H5P_DEFAULT), path, name);
  WD_CHECK_DATA(link.type != H5L_TYPE_EXTERNAL, path, name,
                "is an external link to another file, expected a dataset "
                    << expected << " stored in this file");
  H5O_info_t object{};
  WD_CHECK_H5(H5Oget_info_by_name(file, name, &object, H5P_DEFAULT), path, name);
  WD_CHECK_DATA(object.type == H5O_TYPE_DATASET, path, name,
                "is " << object_kind(object.type) << ", expected a dataset " << expected);
  Opened o;
  o.dataset = H5Dataset(WD_CHECK_H5(H5Dopen2(file, name, H5P_DEFAULT), path, name));
  const H5PropertyList dcpl(WD_CHECK_H5(H5Dget_create_plist(o.dataset.get()), path, name));
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  WD_CHECK_DATA(layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED || layout == H5D_COMPACT, path,
                name, "has a virtual (or unknown) storage layout mapping other files, expected "
                      "contiguous, chunked or compact storage in this file");
  const int external = WD_CHECK_H5(H5Pget_external_count(dcpl.get()), path, name);
  WD_CHECK_DATA(external == 0, path, name,
                "keeps its data in " << external << " external file(s), expected it in this file");
  o.type = H5Datatype(WD_CHECK_H5(H5Dget_type(o.dataset.get()), path, name));
  o.cls = WD_CHECK_H5(H5Tget_class(o.type.get()), path, name);
  o.type_size = H5Tget_size(o.type.get());
  o.dims = h5_dims(o.dataset.get(), path, name);
  return o;
}

void check_rank(const Opened& o, const std::string& path, const char* name, const char* expected) {
  WD_CHECK_DATA(o.dims.size() == std::string(expected).size(), path, name,
                "rank " << o.dims.size() << " with shape " << format_shape(o.dims)
                        << ", expected rank " << std::string(expected).size() << " [" << expected
                        << "]");
}

/// The bit layout of a float type, as HDF5 describes it.
struct FloatFields {
  std::size_t sign = 0, exp_pos = 0, exp_bits = 0, man_pos = 0, man_bits = 0;
  bool operator==(const FloatFields& o) const {
    return sign == o.sign && exp_pos == o.exp_pos && exp_bits == o.exp_bits &&
           man_pos == o.man_pos && man_bits == o.man_bits;
  }
};

/// IEEE binary32 or binary16 in either byte order (any other class, width or bit layout, such
/// as float64 or a bfloat16 stored as a custom 2-byte type, is refused); returns the dtype name.
std::string check_float(const Opened& o, const std::string& path, const char* name) {
  WD_CHECK_DATA(
      o.cls == H5T_FLOAT && (o.type_size == 4 || o.type_size == 2), path, name,
      class_name(o.cls) << " data of " << o.type_size << " bytes, expected float32 or float16");
  FloatFields f;
  WD_CHECK_H5(H5Tget_fields(o.type.get(), &f.sign, &f.exp_pos, &f.exp_bits, &f.man_pos,
                            &f.man_bits),
              path, name);
  const bool single = o.type_size == 4;
  const FloatFields ieee = single ? FloatFields{31, 23, 8, 0, 23} : FloatFields{15, 10, 5, 0, 10};
  WD_CHECK_DATA(f == ieee, path, name,
                "float data of " << o.type_size << " bytes with " << f.exp_bits << " exponent and "
                                 << f.man_bits << " mantissa bits, expected IEEE "
                                 << (single ? "float32 (8 and 23)" : "float16 (5 and 10)")
                                 << (single ? "" : "; bfloat16 is not part of the schema"));
  return single ? "float32" : "float16";
}

void check_samples(const Opened& o, const std::string& path, const char* name,
                   std::int64_t samples) {
  WD_CHECK_DATA(
      o.dims[0] == samples, path, name,
      "dimension 0 (N) is " << o.dims[0] << ", expected " << samples << " (the N of /latents)");
}

void check_positive_dims(const Opened& o, const std::string& path, const char* name,
                         const char* labels) {
  for (std::size_t d = 1; d < o.dims.size(); ++d) {
    WD_CHECK_DATA(
        o.dims[d] >= 1, path, name,
        "dimension " << d << " (" << labels[d] << ") is " << o.dims[d] << ", expected >= 1");
  }
}

/// The extent must be addressable and present: its byte count fits int64 (a crafted extent
/// could otherwise wrap around), and every byte is stored in the file. Without filters the
/// bytes must fit in the file and all of them be allocated; with filters (compressed data)
/// every chunk must be stored. Anything less means the writer stopped part-way, and HDF5 would
/// silently read the missing parts as fill values.
void check_extent(const Opened& o, const std::string& path, const char* name,
                  std::uint64_t file_size) {
  std::int64_t bytes = static_cast<std::int64_t>(o.type_size);
  for (const std::int64_t d : o.dims) {
    WD_CHECK_DATA(!__builtin_mul_overflow(bytes, d, &bytes), path, name,
                  "shape " << format_shape(o.dims) << " of " << o.type_size
                           << "-byte elements has more bytes than int64 can count");
  }
  const H5PropertyList dcpl(WD_CHECK_H5(H5Dget_create_plist(o.dataset.get()), path, name));
  if (WD_CHECK_H5(H5Pget_nfilters(dcpl.get()), path, name) > 0) {
    const std::optional<std::uint64_t> stored = h5_stored_chunks(o.dataset.get(), path, name);
    const std::uint64_t expected = h5_chunk_count(dcpl.get(), o.dims, path, name);
    WD_CHECK_DATA(!stored || *stored >= expected, path, name,
                  "only " << stored.value_or(0) << " of its " << expected
                          << " (compressed) chunks are stored in the file, expected all of them "
                             "(was the file written completely?)");
    return;
  }
  WD_CHECK_DATA(static_cast<std::uint64_t>(bytes) <= file_size, path, name,
                "shape " << format_shape(o.dims) << " needs " << bytes << " bytes ("
                         << format_bytes(static_cast<double>(bytes))
                         << ") but the whole file has " << file_size
                         << " bytes, expected the data to fit in the file");
  const auto stored = static_cast<std::int64_t>(H5Dget_storage_size(o.dataset.get()));
  WD_CHECK_DATA(stored >= bytes, path, name,
                "only " << format_bytes(static_cast<double>(stored)) << " of its "
                        << format_bytes(static_cast<double>(bytes))
                        << " are stored in the file, expected all of them (was the file "
                           "written completely?)");
}

H5Attribute open_root_attr(hid_t file, const std::string& path, const char* name,
                           const std::string& expected) {
  const htri_t exists = WD_CHECK_H5(H5Aexists(file, name), path, root_attr(name));
  WD_CHECK_DATA(exists > 0, path, root_attr(name),
                "missing, expected " << expected << " (see docs/data-format.md)");
  return H5Attribute(WD_CHECK_H5(H5Aopen(file, name, H5P_DEFAULT), path, root_attr(name)));
}

bool is_scalar_attr(hid_t attr) {
  const H5Dataspace space(H5Aget_space(attr));
  return space && H5Sget_simple_extent_npoints(space.get()) == 1;
}

std::int64_t read_int_attr(hid_t file, const std::string& path, const char* name,
                           const std::string& expected) {
  const H5Attribute attr = open_root_attr(file, path, name, expected);
  const H5Datatype type(WD_CHECK_H5(H5Aget_type(attr.get()), path, root_attr(name)));
  WD_CHECK_DATA(H5Tget_class(type.get()) == H5T_INTEGER && is_scalar_attr(attr.get()), path,
                root_attr(name),
                "is not a scalar integer (" << class_name(H5Tget_class(type.get()))
                                            << "), expected " << expected);
  std::int64_t value = 0;
  WD_CHECK_H5(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), path, root_attr(name));
  return value;
}

/// Reads a string attribute stored either as variable-length (h5py's default) or fixed-length.
std::string read_string_attr(hid_t file, const std::string& path, const char* name,
                             const std::string& expected) {
  const H5Attribute attr = open_root_attr(file, path, name, expected);
  const std::string item = root_attr(name);
  const H5Datatype type(WD_CHECK_H5(H5Aget_type(attr.get()), path, item));
  WD_CHECK_DATA(H5Tget_class(type.get()) == H5T_STRING && is_scalar_attr(attr.get()), path, item,
                "is not a scalar string (" << class_name(H5Tget_class(type.get())) << "), expected "
                                           << expected);
  if (WD_CHECK_H5(H5Tis_variable_str(type.get()), path, item) > 0) {
    const H5Datatype mem = h5_vlen_string_type();
    char* text = nullptr;
    WD_CHECK_H5(H5Aread(attr.get(), mem.get(), &text), path, item);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(type.get()), '\0');
  WD_CHECK_H5(H5Aread(attr.get(), type.get(), value.data()), path, item);
  // Fixed-length strings may be null-terminated, null-padded or space-padded.
  value.resize(std::strlen(value.c_str()));
  while (!value.empty() && value.back() == ' ') value.pop_back();
  return value;
}

/// Every /context_lens value must be in 1..L. Values are read in their own signedness, so a
/// huge unsigned value is reported as stored rather than clipped, and in blocks, so a crafted
/// (compressed) dataset of billions of samples cannot exhaust memory here.
void check_context_lens(const Opened& lens, const std::string& path, std::int64_t samples,
                        std::int64_t context_len) {
  const bool is_unsigned = H5Tget_sign(lens.type.get()) == H5T_SGN_NONE;
  const H5Dataspace file_space(WD_CHECK_H5(H5Dget_space(lens.dataset.get()), path, kContextLens));
  constexpr std::int64_t kBlock = 1 << 16;
  std::vector<std::uint64_t> block(static_cast<std::size_t>(std::min(samples, kBlock)));
  for (std::int64_t first = 0; first < samples; first += kBlock) {
    const auto count = static_cast<hsize_t>(std::min(kBlock, samples - first));
    const auto start = static_cast<hsize_t>(first);
    WD_CHECK_H5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count,
                                    nullptr),
                path, kContextLens);
    const H5Dataspace mem_space(WD_CHECK_H5(H5Screate_simple(1, &count, nullptr), path,
                                            kContextLens));
    WD_CHECK_H5(H5Dread(lens.dataset.get(), is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64,
                        mem_space.get(), file_space.get(), H5P_DEFAULT, block.data()),
                path, kContextLens);
    for (hsize_t i = 0; i < count; ++i) {
      const std::uint64_t raw = block[i];
      const bool ok = is_unsigned ? raw >= 1 && raw <= static_cast<std::uint64_t>(context_len)
                                  : static_cast<std::int64_t>(raw) >= 1 &&
                                        static_cast<std::int64_t>(raw) <= context_len;
      if (ok) continue;
      const std::string value =
          is_unsigned ? std::to_string(raw) : std::to_string(static_cast<std::int64_t>(raw));
      throw DataError(path,
                      std::string(kContextLens) + "[" + std::to_string(first + i) + "]",
                      "is " + value + ", expected 1.." + std::to_string(context_len) +
                          " (L of /context)");
    }
  }
}

/// "[N,C,F,H,W]" with the numbers of a condition shaped like these latents (F frames).
std::string condition_shape_text(const DatasetInfo& info, std::int64_t frames) {
  const auto& l = info.latent_shape;
  return "[" + std::to_string(info.samples) + "," + std::to_string(l[0]) + "," + std::to_string(frames) + "," +
         std::to_string(l[2]) + "," + std::to_string(l[3]) + "]";
}

/// /condition, when present: rank 5, float, fully stored, the samples' N, the latents' C, H and W,
/// and the F the teacher takes (i2v: the latents' F, the first frame's latent followed by zero
/// frames; ti2v: 1, the first frame's latent; without a teacher either). A teacher that takes no
/// condition refuses one unless ignore_condition; an i2v teacher needs it; a ti2v teacher trains
/// its image mode from it, or with ignore_condition its text-to-video mode.
void check_condition(hid_t f, const std::string& path, const DatasetExpectations& expect, std::uint64_t file_size,
                     DatasetInfo& info) {
  const bool teacher = expect.latent_channels > 0;
  const auto& l = info.latent_shape;
  const htri_t present = WD_CHECK_H5(H5Lexists(f, kCondition, H5P_DEFAULT), path, kCondition);
  if (present <= 0) {
    WD_CHECK_DATA(expect.condition != ImageCondition::kI2v, path, kCondition,
                  "missing; the teacher (model_type i2v) needs each sample's image condition, expected a dataset "
                      << condition_shape_text(info, l[1])
                      << " float32|float16: the first frame's latent followed by zero frames (docs/data-format.md)");
    return;
  }
  const Opened c = open_dataset(f, path, kCondition, "[N,C,F,H,W] float32|float16");
  check_rank(c, path, kCondition, "NCFHW");
  info.condition_dtype = check_float(c, path, kCondition);
  check_samples(c, path, kCondition, info.samples);
  check_positive_dims(c, path, kCondition, "NCFHW");
  check_extent(c, path, kCondition, file_size);
  for (int d = 0; d < 4; ++d) info.condition_shape[d] = c.dims[d + 1];
  info.has_condition = true;
  if (teacher && expect.ignore_condition) {
    WD_CHECK_DATA(expect.condition != ImageCondition::kI2v, path, kCondition,
                  "holds the image conditions the teacher (model_type i2v) needs; data.ignore_condition true "
                  "cannot leave them out (it trains a t2v or ti2v teacher on the videos alone)");
    info.condition_ignored = true;
    return;
  }
  WD_CHECK_DATA(!teacher || expect.condition != ImageCondition::kNone, path, kCondition,
                "holds image conditions " << format_shape(c.dims)
                    << ", but the teacher (model_type t2v) takes none; set data.ignore_condition true to "
                       "train on the videos alone, or use an i2v or ti2v teacher");
  if (teacher) info.condition_kind = expect.condition;
  const std::string latents = info.has_latents ? "/latents" : root_attr(kLatentShapeAttr);
  const std::int64_t frames = expect.condition == ImageCondition::kTi2v ? 1 : l[1];
  const bool frames_ok = c.dims[2] == frames || (!teacher && c.dims[2] == 1);
  const std::string kind = expect.condition == ImageCondition::kTi2v ? "ti2v" : "i2v";
  WD_CHECK_DATA(c.dims[1] == l[0] && frames_ok && c.dims[3] == l[2] && c.dims[4] == l[3], path, kCondition,
                "has shape " << format_shape(c.dims) << ", expected " << condition_shape_text(info, frames)
                             << (teacher ? " for the teacher (model_type " + kind + "): " : ": ")
                             << (frames == 1 ? "the first frame's latent"
                                             : "the first frame's latent followed by zero frames")
                             << ", with the C, H and W of " << latents);
}

}  // namespace

/// The latent_shape root attribute of a contexts-only data set: 4 positive integers, C,F,H,W.
std::array<std::int64_t, 4> read_latent_shape_attr(hid_t file, const std::string& path) {
  const std::string expected = "[C,F,H,W] 4 positive integers (a data set without /latents declares its latent shape)";
  const H5Attribute attr = open_root_attr(file, path, kLatentShapeAttr, expected);
  const std::string item = root_attr(kLatentShapeAttr);
  const H5Datatype type(WD_CHECK_H5(H5Aget_type(attr.get()), path, item));
  const H5Dataspace space(H5Aget_space(attr.get()));
  const auto points = space ? H5Sget_simple_extent_npoints(space.get()) : -1;
  WD_CHECK_DATA(H5Tget_class(type.get()) == H5T_INTEGER && points == 4, path, item,
                "is " << class_name(H5Tget_class(type.get())) << " with " << points << " values, expected " << expected);
  std::array<std::int64_t, 4> shape{};
  WD_CHECK_H5(H5Aread(attr.get(), H5T_NATIVE_INT64, shape.data()), path, item);
  for (int d = 0; d < 4; ++d) {
    WD_CHECK_DATA(shape[d] >= 1, path, item, "CFHW"[d] << " is " << shape[d] << ", expected " << expected);
  }
  return shape;
}

DatasetInfo validate_dataset(const std::string& path, const DatasetExpectations& expect) {
  const H5File file = h5_open_read_only(path);
  const hid_t f = file.get();
  const std::uint64_t file_size = std::filesystem::file_size(path);
  DatasetInfo info;
  info.path = path;

  info.schema_version = read_int_attr(f, path, kSchemaAttr, std::to_string(kSchemaVersion));
  WD_CHECK_DATA(info.schema_version == kSchemaVersion, path, root_attr(kSchemaAttr),
                "is " << info.schema_version << ", expected " << kSchemaVersion
                      << " (the schema this build reads)");
  info.latent_layout =
      read_string_attr(f, path, kLayoutAttr, std::string("\"") + kLatentLayout + "\"");
  WD_CHECK_DATA(info.latent_layout == kLatentLayout, path, root_attr(kLayoutAttr),
                "is \"" << info.latent_layout << "\", expected \"" << kLatentLayout
                        << "\" (latents stored as [N,C,F,H,W])");

  // /latents fixes N and the latent shape; the other datasets must agree with it. Without
  // /latents (contexts only) the latent_shape attribute gives the shape and /context N.
  const htri_t has_latents = WD_CHECK_H5(H5Lexists(f, kLatents, H5P_DEFAULT), path, kLatents);
  info.has_latents = has_latents > 0;
  std::string shape_source = kLatents;
  if (info.has_latents) {
    const Opened latents = open_dataset(f, path, kLatents, "[N,C,F,H,W] float32|float16");
    check_rank(latents, path, kLatents, "NCFHW");
    info.latent_dtype = check_float(latents, path, kLatents);
    info.samples = latents.dims[0];
    WD_CHECK_DATA(info.samples >= 1, path, kLatents,
                  "dimension 0 (N) is 0, expected at least 1 sample");
    check_positive_dims(latents, path, kLatents, "NCFHW");
    for (int d = 0; d < 4; ++d) info.latent_shape[d] = latents.dims[d + 1];
    check_extent(latents, path, kLatents, file_size);
  } else {
    info.latent_shape = read_latent_shape_attr(f, path);
    shape_source = root_attr(kLatentShapeAttr);  // a contexts-only data set declares the shape
  }
  if (expect.latent_channels > 0) {
    WD_CHECK_DATA(info.latent_shape[0] == expect.latent_channels, path, shape_source,
                  (info.has_latents ? "dimension 1 (C) is " : "C is ")
                      << info.latent_shape[0] << ", the teacher expects " << expect.latent_channels);
  }
  for (int d = 0; d < 3; ++d) {
    const std::int64_t size = info.latent_shape[d + 1], p = expect.patch[d];
    WD_CHECK_DATA(p >= 1 && size % p == 0, path, shape_source,
                  (info.has_latents ? "dimension " + std::to_string(d + 2) + " (" + "FHW"[d] + ")"
                                    : std::string(1, "FHW"[d]))
                      << " is " << size << ", expected a multiple of " << p
                           << " (the teacher's patch [" << expect.patch[0] << ","
                           << expect.patch[1] << "," << expect.patch[2] << "])");
  }

  const Opened context = open_dataset(f, path, kContext, "[N,L,text_dim] float32|float16");
  check_rank(context, path, kContext, "NLD");
  info.context_dtype = check_float(context, path, kContext);
  if (!info.has_latents) {
    info.samples = context.dims[0];
    WD_CHECK_DATA(info.samples >= 1, path, kContext, "dimension 0 (N) is 0, expected at least 1 sample");
  }
  check_samples(context, path, kContext, info.samples);
  WD_CHECK_DATA(context.dims[1] >= 1, path, kContext,
                "dimension 1 (L) is " << context.dims[1] << ", expected >= 1");
  WD_CHECK_DATA(context.dims[2] >= 1, path, kContext,
                "dimension 2 (text_dim) is " << context.dims[2] << ", expected >= 1");
  info.context_len = context.dims[1];
  info.text_dim = context.dims[2];
  if (expect.text_dim > 0) {
    WD_CHECK_DATA(info.text_dim == expect.text_dim, path, kContext,
                  "dimension 2 (text_dim) is " << info.text_dim << ", the teacher expects "
                                               << expect.text_dim);
  }
  if (expect.text_len > 0) {
    WD_CHECK_DATA(info.context_len <= expect.text_len, path, kContext,
                  "dimension 1 (L) is " << info.context_len << ", expected <= " << expect.text_len
                                        << " (the teacher's text_len)");
  }
  check_extent(context, path, kContext, file_size);

  const Opened lens = open_dataset(f, path, kContextLens, "[N] int32");
  check_rank(lens, path, kContextLens, "N");
  WD_CHECK_DATA(lens.cls == H5T_INTEGER, path, kContextLens,
                class_name(lens.cls) << " data, expected integers (int32)");
  check_samples(lens, path, kContextLens, info.samples);
  check_extent(lens, path, kContextLens, file_size);
  check_context_lens(lens, path, info.samples, info.context_len);

  check_condition(f, path, expect, file_size, info);

  const htri_t has_prompts = WD_CHECK_H5(H5Lexists(f, kPrompts, H5P_DEFAULT), path, kPrompts);
  if (has_prompts > 0) {
    const Opened prompts = open_dataset(f, path, kPrompts, "[N] strings");
    check_rank(prompts, path, kPrompts, "N");
    WD_CHECK_DATA(prompts.cls == H5T_STRING, path, kPrompts,
                  class_name(prompts.cls) << " data, expected strings");
    check_samples(prompts, path, kPrompts, info.samples);
    info.has_prompts = true;
  }
  return info;
}

}  // namespace wd::data
