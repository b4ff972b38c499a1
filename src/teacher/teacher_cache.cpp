// The teacher cache's shards, entries and index, and the source that reads them (teacher_cache.hpp).
#include "teacher/teacher_cache.hpp"

#include <fcntl.h>
#include <cerrno>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/checksum.hpp"
#include "core/errors.hpp"
#include "data/h5_file.hpp"

namespace wd::teacher {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "wan-distill teacher cache";
constexpr int kVersion = 1;
constexpr const char* kHashes = "xxh64";  ///< the dataset of each message's xxh64

/// fsync of a file or directory by path (a directory's EINVAL, refused by some filesystems, is fine).
void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  WD_CHECK_SYS(fd, "open(" + path + ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && !(directory && err == EINVAL)) {
    errno = err;
    WD_CHECK_SYS(rc, "fsync(" + path + ")");
  }
}

/// Writes `text` to `path` through a temporary file, fsynced and renamed: all of it or nothing.
/// The temporary file is this process's own: two ranks that write the same index at once (both
/// found every shard in) each rename a whole file.
void write_atomically(const fs::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    WD_CHECK_AS(SystemError, out.good(), "cannot write " << tmp);
  }
  fsync_path(tmp, false);
  WD_CHECK_SYS(::rename(tmp.c_str(), path.c_str()), tmp + " -> " + path.string());
  fsync_path(path.parent_path().string(), true);
}

json read_json(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  WD_CHECK_DATA(in.good(), path.string(), "", "cannot be read: " << what);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw DataError(path.string(), "", std::string("is not valid JSON: ") + e.what());
  }
}

/// The layout as identity.json and index.json write it; `replicas` only where a train's replicas
/// dealt the streams (a cache of one replica per stream reads as generate's always has).
json layout_json(const CacheLayout& l) {
  json j{{"students", l.students}, {"batch", l.batch}, {"eval_messages", l.eval_messages},
         {"positions", l.positions}, {"shard_positions", l.shard_positions}};
  if (l.replicas > 0) j["replicas"] = l.replicas;
  if (l.keep > 0) j["keep"] = l.keep;
  return j;
}

CacheLayout layout_of(const json& j) {
  return {j.at("students").get<int>(), j.at("batch").get<std::int64_t>(), j.at("eval_messages").get<std::int64_t>(),
          j.at("positions").get<std::int64_t>(), j.at("shard_positions").get<std::int64_t>(),
          j.value("replicas", 0), j.value("keep", std::int64_t{0})};
}

fs::path entry_path(const std::string& dir, const ShardId& id) { return fs::path(dir) / (id.file_name() + ".json"); }

/// The file and memory types of a message tensor's dtype (fp32 targets, int64 lengths).
std::pair<hid_t, hid_t> h5_types(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case torch::kLong: return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case torch::kInt: return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    default: break;
  }
  throw Error(std::string("teacher cache: a message tensor of dtype ") + c10::toString(t) +
              " (float32, int64 and int32 are stored)");
}

/// The hyperslab of row `row` of a dataset whose first dimension counts the messages.
std::pair<data::H5Dataspace, data::H5Dataspace> row_spaces(hid_t set, std::int64_t row, const std::string& file,
                                                          const std::string& name) {
  data::H5Dataspace space(WD_CHECK_H5(H5Dget_space(set), file, name));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  WD_CHECK_DATA(rank >= 1 && row < static_cast<std::int64_t>(dims[0]), file, name,
                "has no message " << row << " (" << (rank >= 1 ? dims[0] : 0) << " stored)");
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(row);
  count[0] = 1;
  WD_CHECK_H5(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), file,
              name);
  data::H5Dataspace mem(WD_CHECK_H5(H5Screate_simple(rank, count.data(), nullptr), file, name));
  return {std::move(space), std::move(mem)};
}

/// A message's xxh64: its tensors' names and bytes, in name order.
std::uint64_t message_xxh64(const comm::TensorDict& m) {
  Xxh64 h;
  for (const auto& [name, t] : m) {
    const auto c = t.contiguous();
    h.update(name.data(), name.size());
    h.update(c.data_ptr(), c.numel() * c.element_size());
  }
  return h.digest();
}

/// Message `row` of the open shard `file`: every tensor of `names`, as stored.
comm::TensorDict read_message(hid_t file, const std::string& path, const std::vector<std::string>& names,
                              std::int64_t row) {
  comm::TensorDict m;
  for (const auto& name : names) {
    const data::H5Dataset set(WD_CHECK_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, name));
    auto [space, mem] = row_spaces(set.get(), row, path, name);
    const data::H5Datatype type(WD_CHECK_H5(H5Dget_type(set.get()), path, name));
    const bool is_float = H5Tget_class(type.get()) == H5T_FLOAT;
    const auto size = H5Tget_size(type.get());
    const auto dtype = is_float ? torch::kFloat : size == 8 ? torch::kLong : torch::kInt;
    const auto dims = data::h5_dims(set.get(), path, name);
    auto t = torch::empty(std::vector<std::int64_t>(dims.begin() + 1, dims.end()), dtype);
    WD_CHECK_H5(H5Dread(set.get(), h5_types(dtype).second, mem.get(), space.get(), H5P_DEFAULT, t.data_ptr()), path,
                name);
    m[name] = t;
  }
  return m;
}

std::vector<std::uint64_t> read_hashes(hid_t file, const std::string& path, std::int64_t count) {
  const data::H5Dataset set(WD_CHECK_H5(H5Dopen2(file, kHashes, H5P_DEFAULT), path, kHashes));
  const auto dims = data::h5_dims(set.get(), path, kHashes);
  WD_CHECK_DATA(dims.size() == 1 && dims[0] == count, path, kHashes,
                "must hold " << count << " checksums, one per message");
  std::vector<std::uint64_t> h(static_cast<std::size_t>(count));
  WD_CHECK_H5(H5Dread(set.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, h.data()), path, kHashes);
  return h;
}

/// A dataset's creation properties without modification times, so that a shard's bytes depend on
/// its messages alone: the same shard written twice (a resumed run, another rank) is the same file.
data::H5PropertyList untimed(const std::string& path, const std::string& name) {
  data::H5PropertyList dcpl(WD_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE), path, name));
  WD_CHECK_H5(H5Pset_obj_track_times(dcpl.get(), false), path, name);
  return dcpl;
}

/// Creates, in `file`, one dataset [count, ...] per tensor of the first message `m`.
void create_sets(hid_t file, const std::string& path, const comm::TensorDict& m, std::int64_t count) {
  for (const auto& [name, t] : m) {
    std::vector<hsize_t> dims{static_cast<hsize_t>(count)};
    for (const auto d : t.sizes()) dims.push_back(static_cast<hsize_t>(d));
    const data::H5Dataspace space(WD_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                              path, name));
    const auto dcpl = untimed(path, name);
    const data::H5Dataset set(WD_CHECK_H5(H5Dcreate2(file, name.c_str(), h5_types(t.scalar_type()).first, space.get(),
                                                     H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                                          path, name));
  }
}

void write_row(hid_t file, const std::string& path, const std::string& name, const torch::Tensor& t,
               std::int64_t row) {
  const data::H5Dataset set(WD_CHECK_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, name));
  auto [space, mem] = row_spaces(set.get(), row, path, name);
  const auto c = t.to(torch::kCPU).contiguous();
  WD_CHECK_H5(H5Dwrite(set.get(), h5_types(c.scalar_type()).second, mem.get(), space.get(), H5P_DEFAULT, c.data_ptr()),
              path, name);
}

void write_hashes(hid_t file, const std::string& path, const std::vector<std::uint64_t>& h) {
  const hsize_t n = h.size();
  const data::H5Dataspace space(WD_CHECK_H5(H5Screate_simple(1, &n, nullptr), path, kHashes));
  const auto dcpl = untimed(path, kHashes);
  const data::H5Dataset set(
      WD_CHECK_H5(H5Dcreate2(file, kHashes, H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), path,
                  kHashes));
  WD_CHECK_H5(H5Dwrite(set.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, h.data()), path, kHashes);
}

/// "training message 70 of stream 0" (a cache of trajectories: "training round 70 of stream 0"):
/// a row of a shard as the errors name it.
std::string message_name(const ShardId& id, std::int64_t row, bool rounds = false) {
  return std::string(id.eval ? "held-out" : "training") + (rounds ? " round " : " message ") +
         std::to_string(id.first + row) + " of stream " + std::to_string(id.student);
}

/// The shard of `index` holding stream `student`'s row `position` (training or held-out).
std::size_t shard_of(const CacheIndex& index, int student, bool eval, std::int64_t position) {
  for (std::size_t i = 0; i < index.shards.size(); ++i) {
    const auto& s = index.shards[i];
    if (s.student == student && s.eval == eval && position >= s.first && position < s.first + s.count) return i;
  }
  throw Error("teacher cache: no shard holds " +
              message_name({student, eval, position, 1}, 0, index.layout.keep > 0));
}

}  // namespace

std::string ShardId::file_name() const {
  return fmt::format("s{:05d}-{}-{:09d}.h5", student, eval ? "eval" : "train", first);
}

void check_identity(const std::string& name, const CacheIdentity& cache, const CacheIdentity& run,
                    const std::string& what) {
  std::string problems;
  auto add = [&](const std::string& key, const std::string& a, const std::string& b) {
    problems += (problems.empty() ? "" : "; ") + key + ": the cache has " + a + ", " + what + " " + b;
  };
  for (const auto& [key, value] : cache) {
    const auto it = run.find(key);
    if (it == run.end()) {
      add(key, value, "has none");
    } else if (it->second != value) {
      add(key, "'" + value + "'", "has '" + it->second + "'");
    }
  }
  for (const auto& [key, value] : run) {
    if (cache.count(key) == 0) add(key, "none", "has '" + value + "'");
  }
  if (!problems.empty()) {
    throw ConfigError(name + " was generated for other keys: " + problems);
  }
}

std::vector<ShardId> cache_shards(const CacheLayout& layout) {
  std::vector<ShardId> out;
  for (int s = 0; s < layout.students; ++s) {
    if (layout.eval_messages > 0) out.push_back({s, true, 0, layout.eval_messages});
    for (std::int64_t p = 0; p < layout.positions; p += layout.shard_positions) {
      out.push_back({s, false, p, std::min(layout.shard_positions, layout.positions - p)});
    }
  }
  return out;
}

std::vector<ShardId> shards_of_rank(const CacheLayout& layout, int rank, int ranks) {
  std::vector<ShardId> out;
  const auto all = cache_shards(layout);
  for (std::size_t i = static_cast<std::size_t>(rank); i < all.size(); i += static_cast<std::size_t>(ranks)) {
    out.push_back(all[i]);
  }
  return out;
}

struct ShardWriter::OpenFile {
  data::H5File file;
  hid_t get() const { return file.get(); }
};

ShardWriter::ShardWriter(std::string dir, ShardId id)
    : dir_(std::move(dir)), id_(id), tmp_((fs::path(dir_) / id_.file_name()).string() + ".tmp") {
  // A stale entry (a shard being redone) goes first: no index is made from it meanwhile.
  std::error_code ec;
  fs::remove(entry_path(dir_, id_), ec);
  file_ = std::make_unique<OpenFile>(OpenFile{data::h5_create(tmp_)});
}

ShardWriter::~ShardWriter() {
  if (!file_) return;  // finished
  file_.reset();
  std::error_code ec;
  fs::remove(tmp_, ec);  // a shard left unfinished is redone, never kept half written
}

void ShardWriter::add(const comm::TensorDict& message) {
  WD_CHECK(file_ && !full(), "teacher cache: " << id_.file_name() << " holds " << id_.count << " messages");
  comm::TensorDict m;
  for (const auto& [name, t] : message) m[name] = t.to(torch::kCPU).contiguous();
  const auto row = rows();
  if (row == 0) {
    create_sets(file_->get(), tmp_, m, id_.count);
    for (const auto& [name, t] : m) names_.push_back(name);
  }
  for (const auto& [name, t] : m) write_row(file_->get(), tmp_, name, t, row);
  hashes_.push_back(message_xxh64(m));
}

std::string ShardWriter::finish() {
  WD_CHECK(file_ && full(), "teacher cache: " << id_.file_name() << " sealed with " << rows() << " of " << id_.count
                                              << " messages");
  write_hashes(file_->get(), tmp_, hashes_);
  file_.reset();
  const auto final_path = fs::path(dir_) / id_.file_name();
  fsync_path(tmp_, false);
  WD_CHECK_SYS(::rename(tmp_.c_str(), final_path.c_str()), tmp_ + " -> " + final_path.string());
  const auto hash = file_xxh64_hex(final_path.string());
  write_atomically(entry_path(dir_, id_), json{{"file", id_.file_name()}, {"student", id_.student}, {"eval", id_.eval},
                                               {"first", id_.first}, {"count", id_.count}, {"tensors", names_},
                                               {"xxh64", hash}}.dump(2) + "\n");
  return hash;
}

std::string write_shard(const std::string& dir, const ShardId& id, TargetSource& source, std::int64_t batch) {
  ShardWriter writer(dir, id);
  for (std::int64_t i = 0; i < id.count; ++i) {
    const auto made = source.make(id.first + i, id.eval);
    check_finite(made.out, id.first + i, "teacher's output");
    writer.add(student_message(made, 0, batch));
  }
  return writer.finish();
}

std::string write_trajectory_shard(const std::string& dir, const ShardId& id, TrajectoryRounds& rounds,
                                   std::int64_t keep) {
  ShardWriter writer(dir, id);
  for (std::int64_t i = 0; i < id.count; ++i) writer.add({{"states", rounds.whole_round(id.first + i, id.eval, keep)}});
  return writer.finish();
}

bool shard_complete(const std::string& dir, const ShardId& id, bool rehash) {
  std::error_code ec;
  const auto entry = entry_path(dir, id);
  const auto file = fs::path(dir) / id.file_name();
  if (!fs::exists(entry, ec) || !fs::exists(file, ec)) return false;
  try {
    const auto j = read_json(entry, "a shard's entry");
    if (j.at("count").get<std::int64_t>() != id.count) return false;
    return !rehash || j.at("xxh64").get<std::string>() == file_xxh64_hex(file.string());
  } catch (const std::exception&) {
    return false;  // an entry cut short by a kill: the shard is redone
  }
}

void claim_cache_dir(const std::string& dir, const CacheIdentity& identity, const CacheLayout& layout,
                     const std::string& name, const std::string& what) {
  fs::create_directories(dir);
  const auto path = fs::path(dir) / "identity.json";
  if (!fs::exists(path)) {
    write_atomically(path, json{{"format", kFormat}, {"version", kVersion}, {"identity", identity},
                                {"layout", layout_json(layout)}}.dump(2) + "\n");
    return;
  }
  const auto j = read_json(path, "the identity of a cache begun earlier");
  check_identity(name.empty() ? "generate --output " + dir : name, j.at("identity").get<CacheIdentity>(), identity,
                 what);
  const auto was = layout_of(j.at("layout"));
  WD_CHECK_AS(ConfigError, was == layout,
              "the teacher cache " << dir << " was begun with another layout: " << layout_json(was).dump() << ", "
                                   << what << " asks " << layout_json(layout).dump()
                                   << " (generate: the same --students and --shard-positions; a train writing it: "
                                      "the same student ranks, teacher replicas and "
                                      "data.teacher_cache_shard_positions; the same train keys; or another folder)");
}

std::pair<CacheIdentity, CacheLayout> claimed_cache(const std::string& dir) {
  const auto path = fs::path(dir) / "identity.json";
  const auto j = read_json(path, "the identity of the cache being written");
  try {
    return {j.at("identity").get<CacheIdentity>(), layout_of(j.at("layout"))};
  } catch (const json::exception& e) {
    throw DataError(path.string(), "", std::string("is not a teacher cache's identity: ") + e.what());
  }
}

bool write_index_if_complete(const std::string& dir, const CacheIdentity& identity, const CacheLayout& layout) {
  json shards = json::array();
  json tensors;
  for (const auto& id : cache_shards(layout)) {
    if (!shard_complete(dir, id, false)) return false;
    auto entry = read_json(entry_path(dir, id), "a shard's entry");
    tensors = entry.at("tensors");
    shards.push_back(std::move(entry));
  }
  write_atomically(fs::path(dir) / "index.json",
                   json{{"format", kFormat}, {"version", kVersion}, {"identity", identity},
                        {"layout", layout_json(layout)}, {"tensors", tensors}, {"shards", shards}}.dump(2) + "\n");
  return true;
}

CacheIndex read_cache_index(const std::string& dir) {
  const auto path = (fs::path(dir) / "index.json").string();
  WD_CHECK_DATA(fs::exists(path), path, "",
                "is missing: not a complete teacher cache (a generate that did not finish: rerun it with the same "
                "keys and --output to complete it)");
  const auto j = read_json(path, "the cache's index");
  try {
    WD_CHECK_DATA(j.at("format") == kFormat && j.at("version") == kVersion, path, "format",
                  "must be \"" << kFormat << "\" version " << kVersion);
    CacheIndex index{j.at("identity").get<CacheIdentity>(), layout_of(j.at("layout")), {}, {}};
    for (const auto& s : j.at("shards")) {
      index.shards.push_back({s.at("student").get<int>(), s.at("eval").get<bool>(), s.at("first").get<std::int64_t>(),
                              s.at("count").get<std::int64_t>()});
      index.xxh64.push_back(s.at("xxh64").get<std::string>());
    }
    for (const auto& t : j.at("tensors")) index.tensors.push_back(t.get<std::string>());
    return index;
  } catch (const json::exception& e) {
    throw DataError(path, "", std::string("is not a teacher cache index: ") + e.what());
  }
}

void verify_stream(const std::string& dir, const CacheIndex& index, int student) {
  const bool rounds = index.layout.keep > 0;
  for (std::size_t i = 0; i < index.shards.size(); ++i) {
    const auto& id = index.shards[i];
    if (id.student != student) continue;
    const auto path = (fs::path(dir) / id.file_name()).string();
    std::int64_t bad = -1;  // the first message whose bytes do not hash to its checksum
    try {
      const auto file = data::h5_open_read_only(path);
      const auto hashes = read_hashes(file.get(), path, id.count);
      for (std::int64_t row = 0; row < id.count && bad < 0; ++row) {
        const auto m = read_message(file.get(), path, index.tensors, row);
        if (message_xxh64(m) != hashes[static_cast<std::size_t>(row)]) bad = row;
      }
    } catch (const DataError& e) {
      throw DataError(path, e.item(), std::string(e.what()) + " [the shard of " + message_name(id, 0, rounds) + " to " +
                                          std::to_string(id.first + id.count - 1) + " is truncated or corrupt; delete "
                                          "it and its .json entry and rerun generate to redo it]");
    }
    WD_CHECK_DATA(bad < 0, path, "", message_name(id, bad, rounds) << " (sample " << bad << " of this shard) does not match "
                  "its checksum: the shard was altered; delete it and its .json entry and rerun generate to redo it");
    const auto found = file_xxh64_hex(path);
    WD_CHECK_DATA(found == index.xxh64[i], path, "",
                  "checksum mismatch: the index has xxh64 " << index.xxh64[i] << ", the file " << found
                  << (rounds ? " (rounds " : " (messages ") << id.first << " to " << id.first + id.count - 1 << " of stream " << student << ")");
  }
}

struct StreamRows::OpenShard {
  std::string path;
  data::H5File file;
};

StreamRows::StreamRows(std::string dir, CacheIndex index, int student, bool cycle)
    : dir_(std::move(dir)), index_(std::move(index)), student_(student), cycle_(cycle) {}

StreamRows::~StreamRows() = default;

comm::TensorDict StreamRows::read(std::int64_t position, bool eval) {
  const auto& l = index_.layout;
  const char* rows = l.keep > 0 ? "trajectory rounds" : "training batches";
  if (!eval && position >= l.positions) {
    WD_CHECK(cycle_, "teacher cache " << dir_ << ": training " << (l.keep > 0 ? "round " : "batch ") << position
                                      << " is past the cache's " << l.positions << " and data.teacher_cache_end is stop");
    if (!cycling_logged_) {
      spdlog::info("data.teacher_cache: the cache holds {} {} per student; from {} {} on the run reads them again "
                   "from the start (cycling)",
                   l.positions, rows, l.keep > 0 ? "round" : "batch", position);
      cycling_logged_ = true;
    }
    position %= l.positions;
  }
  WD_CHECK(!eval || position < l.eval_messages,
           "teacher cache " << dir_ << ": held-out " << (l.keep > 0 ? "round " : "message ") << position << " of "
                            << l.eval_messages);
  const auto& id = index_.shards[shard_of(index_, student_, eval, position)];
  const auto path = (fs::path(dir_) / id.file_name()).string();
  if (!open_ || open_->path != path) {  // consecutive positions read one shard: it stays open
    open_ = std::make_unique<OpenShard>(OpenShard{path, data::h5_open_read_only(path)});
  }
  return read_message(open_->file.get(), path, index_.tensors, position - id.first);
}

StageBatch CacheSource::make(std::int64_t position, bool eval) {
  const auto m = rows_.read(position, eval);
  auto b = StageBatch::inputs_of(m);
  b.out = m.at("teacher_out");
  if (m.count("x_start")) b.start = m.at("x_start");
  for (const auto& [name, t] : m) {
    if (name.rfind("feat.", 0) == 0) b.features[std::stoll(name.substr(5))] = t;
  }
  return b;
}

}  // namespace wd::teacher
