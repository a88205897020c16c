#include "coc/model/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/core/printable.h"
#include "coc/model/safetensors.h"

namespace coc {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The file stores raw host floats and integers; declaring them little-endian IEEE-754 keeps files portable
// between the machines coc runs on (x86-64, aarch64) without a byte swap on the hot path.
static_assert(std::endian::native == std::endian::little, "coc checkpoints assume a little-endian host");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559, "coc checkpoints assume IEEE fp32");

/// The old format's magic and version (checkpoint.h, "Before safetensors").
constexpr uint32_t kLegacyVersion = 1;
constexpr char kMagic[8] = {'C', 'O', 'C', 'C', 'K', 'P', 'T', '1'};
constexpr uint64_t kPrefixBytes = 16;   // magic + version + header_bytes
constexpr uint64_t kTrailerBytes = 4;   // crc32
constexpr uint64_t kAlign = 64;
constexpr uint32_t kMaxHeaderBytes = 256u << 20;  // far above any real model; rejects a garbage length early
constexpr size_t kIoChunk = size_t{1} << 20;
constexpr const char* kLatestFile = "latest_checkpointed_iteration.txt";
/// The __metadata__ key of the shard's CRC32 (8 hex digits), computed over the whole file with these digits read
/// as "00000000".
constexpr const char* kCrcKey = "coc_crc32";

/// Offset in a header's text of the 8 hex digits of kCrcKey, or npos when the key is missing or appears twice.
size_t crc_field_offset(const std::string& header) {
  const std::string key = fmt::format("\"{}\":\"", kCrcKey);
  const size_t at = header.find(key);
  if (at == std::string::npos || header.find(key, at + 1) != std::string::npos) return std::string::npos;
  return at + key.size() + 8 <= header.size() ? at + key.size() : std::string::npos;
}

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/// zlib's crc32 takes a 32-bit length; chunk so tensors over 4 GiB are fine.
uLong crc_update(uLong crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    size_t k = std::min<size_t>(n, size_t{1} << 30);
    crc = ::crc32(crc, p, static_cast<uInt>(k));
    p += k;
    n -= k;
  }
  return crc;
}

}  // namespace

std::string checkpoint_recovery_hint(const std::string& save_dir, int64_t iteration) {
  return fmt::format("delete {} and set {}/{} to an earlier saved iteration to resume from it",
                     checkpoint_iteration_dir(save_dir, iteration), save_dir, kLatestFile);
}

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Atomic writes

/// Creates `dir` and its parents. Several ranks create the same iter_ folder at once, so "already exists as a
/// folder" after a failed attempt is success, not an error.
void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    throw_error(ErrorKind::kIo, "cannot create checkpoint folder {}: {}; check --save and its permissions", dir,
                ec.message());
}

/// fsync of a folder makes a rename or a new entry in it durable (POSIX leaves that to the folder, not the file).
/// Some filesystems refuse fsync on folders (EINVAL); they give no stronger guarantee we could ask for.
void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw_error(ErrorKind::kIo, "cannot open folder {} to sync it: {}", dir, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS)
    throw_error(ErrorKind::kIo, "cannot sync folder {}: {}; check the filesystem under --save", dir,
                std::strerror(err));
}

/// Writes a file as "<path>.tmp.<pid>" and renames it to `path` on commit(); the destructor removes the
/// temporary file if commit() was not reached, so an error never leaves a partial file under either name.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)) {
    tmp_ = fmt::format("{}.tmp.{}", path_, static_cast<long>(::getpid()));
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) fail("cannot create", errno);
    std::setvbuf(f_, nullptr, _IOFBF, kIoChunk);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (f_) std::fclose(f_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void write(const void* data, size_t n) {
    if (n == 0) return;
    if (std::fwrite(data, 1, n, f_) != n) fail("cannot write", errno);
    crc_ = crc_update(crc_, data, n);
    bytes_ += n;
  }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }

  /// fflush + fsync + fclose + rename + fsync(folder): after this returns, `path` names the complete file even
  /// across a power loss; before it, `path` is untouched.
  void commit() {
    if (std::fflush(f_) != 0) fail("cannot write", errno);
    if (::fsync(::fileno(f_)) != 0) fail("cannot sync", errno);
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) fail("cannot close", errno);
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename into place", errno);
    committed_ = true;
    fsync_dir(fs::path(path_).parent_path().string());
  }

 private:
  [[noreturn]] void fail(const char* what, int err) {
    throw_error(ErrorKind::kIo, "{} checkpoint file {}: {}; free disk space or fix permissions under --save", what,
                tmp_, std::strerror(err));
  }

  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
  uLong crc_ = ::crc32(0L, Z_NULL, 0);
  uint64_t bytes_ = 0;
};


// ---------------------------------------------------------------------------------------------------------------
// Reading

/// A read-only file with its size, closing itself.
class InFile {
 public:
  explicit InFile(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) {
      open_errno_ = errno;
      return;
    }
    struct stat st {};
    if (::fstat(::fileno(f_), &st) != 0) fail_io(errno);
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~InFile() {
    if (f_) std::fclose(f_);
  }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  bool is_open() const { return f_ != nullptr; }
  int open_errno() const { return open_errno_; }
  uint64_t size() const { return size_; }

  /// Reads exactly n bytes at `offset`. Sizes were checked against fstat, so a short read means the file
  /// shrank under us or the disk failed: an I/O error, not corruption.
  void read_at(uint64_t offset, void* dst, size_t n) {
    if (n == 0) return;
    if (::fseeko(f_, static_cast<off_t>(offset), SEEK_SET) != 0) fail_io(errno);
    if (std::fread(dst, 1, n, f_) != n) fail_io(std::ferror(f_) ? errno : EIO);
  }

  /// CRC32 of bytes [0, n), streamed so that a multi-GB shard needs no extra memory.
  uint32_t crc_prefix(uint64_t n) {
    std::vector<unsigned char> buf(static_cast<size_t>(std::min<uint64_t>(n, kIoChunk)));
    uLong crc = ::crc32(0L, Z_NULL, 0);
    for (uint64_t off = 0; off < n;) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n - off, kIoChunk));
      read_at(off, buf.data(), k);
      crc = crc_update(crc, buf.data(), k);
      off += k;
    }
    return static_cast<uint32_t>(crc);
  }

  [[noreturn]] void fail_io(int err) {
    throw_error(ErrorKind::kIo, "cannot read checkpoint {}: {}; check the filesystem under --load", path_,
                std::strerror(err));
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  int open_errno_ = 0;
  uint64_t size_ = 0;
};

/// One tensor's entry in a file header, validated.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // relative to the data section
  uint64_t bytes = 0;
};

/// The TP ranks that have a shard (any dp) in `iter_dir`, to explain a missing file.
std::vector<int> tp_ranks_present(const std::string& iter_dir) {
  std::set<int> ranks;
  std::error_code ec;
  for (fs::directory_iterator it(iter_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int tp = -1, dp = -1, consumed = 0;
    if (std::sscanf(name.c_str(), "mp_rank_%d_dp_%d.ckpt%n", &tp, &dp, &consumed) == 2 &&
        static_cast<size_t>(consumed) == name.size())
      ranks.insert(tp);
  }
  return {ranks.begin(), ranks.end()};
}

/// What a shard's metadata says about the model, for mismatch messages: its "model" entry (the shape flags
/// coc train records) when there is one, else the first 400 bytes of the metadata as stored.
std::string describe_meta(const std::string& meta) {
  const auto j = nlohmann::json::parse(meta, nullptr, false);
  if (j.is_object() && j.contains("model") && j["model"].is_string()) return j["model"].get<std::string>();
  return meta.substr(0, 400);
}

/// The tp_size recorded in the header of shard `path`, or nullopt when the header cannot be read (a damaged
/// file is reported when its own rank loads it).
std::optional<int> recorded_tp_size(const std::string& path) {
  try {
    const SafetensorsHeader h = read_safetensors_header(path);
    if (auto it = h.metadata.find("tp_size"); it != h.metadata.end()) return std::stoi(it->second);
  } catch (const std::exception&) {
  }
  InFile f(path);
  if (!f.is_open() || f.size() < kPrefixBytes + kTrailerBytes) return std::nullopt;
  char prefix[kPrefixBytes];
  f.read_at(0, prefix, kPrefixBytes);
  uint32_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix + 12, 4);
  if (std::memcmp(prefix, kMagic, sizeof kMagic) != 0 || header_bytes > kMaxHeaderBytes ||
      kPrefixBytes + header_bytes > f.size())
    return std::nullopt;
  std::string text(header_bytes, '\0');
  f.read_at(kPrefixBytes, text.data(), header_bytes);
  const json h = json::parse(text, nullptr, false);
  if (!h.is_object() || !h.contains("tp_size") || !h["tp_size"].is_number_integer()) return std::nullopt;
  return h["tp_size"].get<int>();
}

std::string join_names(const std::vector<std::string>& names, size_t limit) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < limit; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > limit) s += fmt::format(", ... ({} more)", names.size() - limit);
  return s;
}

}  // namespace

PipelineLayout checkpoint_pipeline_layout(const std::string& meta_json, int64_t num_layers) {
  const json meta = json::parse(meta_json, nullptr, false);
  const bool has_mesh = meta.is_object() && meta.contains("mesh") && meta["mesh"].is_object();
  const json mesh = has_mesh ? meta["mesh"] : json::object();
  return {mesh.value("pp", 1), mesh.value("pp_layers", std::vector<int>{static_cast<int>(num_layers)})};
}

int checkpoint_stage_of(const std::string& name, const PipelineLayout& layout) {
  if (name.rfind("layers.", 0) == 0) {
    const int layer = std::atoi(name.c_str() + 7);
    int first = 0;
    for (size_t v = 0; v < layout.layers.size(); first += layout.layers[v], ++v)
      if (layer < first + layout.layers[v]) return static_cast<int>(v) % layout.pp;
  }
  return name.rfind("embedding", 0) == 0 ? 0 : layout.pp - 1;
}

std::string checkpoint_iteration_dir(const std::string& save_dir, int64_t iteration) {
  return fmt::format("{}/iter_{:07d}", save_dir, iteration);
}

std::string checkpoint_shard_path(const std::string& save_dir, int64_t iteration, int tp_rank, int dp_rank) {
  return fmt::format("{}/mp_rank_{:02d}_dp_{:03d}.ckpt", checkpoint_iteration_dir(save_dir, iteration), tp_rank,
                     dp_rank);
}

void save_shard(const std::string& save_dir, const CheckpointShard& shard) {
  if (shard.iteration < 0) throw_invalid("cannot save a checkpoint for negative iteration {}", shard.iteration);
  if (shard.tp_size < 1 || shard.tp_rank < 0 || shard.tp_rank >= shard.tp_size)
    throw_invalid("cannot save a checkpoint for TP rank {} of {}", shard.tp_rank, shard.tp_size);
  if (shard.dp_rank < 0) throw_invalid("cannot save a checkpoint for dp rank {}", shard.dp_rank);

  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& [name, t] : shard.tensors) {
    if (name.empty()) throw_invalid("cannot save a checkpoint tensor with an empty name");
    if (!t) throw_invalid("cannot save checkpoint: tensor '{}' is null", name);
    tensors.emplace_back(name, t);
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (tensors[i].first == tensors[j].first)
        throw_invalid("cannot save checkpoint: tensor name '{}' appears twice", tensors[i].first);
  std::map<std::string, std::string> meta = {{"format", "coc"},
                                             {"format_version", std::to_string(kCheckpointFormatVersion)},
                                             {"iteration", std::to_string(shard.iteration)},
                                             {"config_hash", std::to_string(shard.config_hash)},
                                             {"tp_rank", std::to_string(shard.tp_rank)},
                                             {"tp_size", std::to_string(shard.tp_size)},
                                             {"dp_rank", std::to_string(shard.dp_rank)},
                                             {"meta", shard.meta_json},
                                             {kCrcKey, std::string(8, '0')}};
  std::string header_text = safetensors_header(tensors, meta);
  if (header_text.size() > kMaxHeaderBytes)
    throw_invalid("checkpoint header of {} bytes exceeds the {} byte limit; shorten the metadata",
                  header_text.size(), kMaxHeaderBytes);
  const size_t crc_at = crc_field_offset(header_text);
  COC_ASSERT(crc_at != std::string::npos, "checkpoint header lacks its {} field", kCrcKey);

  // The CRC covers the whole file with its own 8 hex digits read as "00000000": compute it over the header with
  // the placeholder and the data first, then write the header with the digits filled in.
  uLong crc = crc_update(::crc32(0L, Z_NULL, 0), nullptr, 0);
  const uint64_t header_len = header_text.size();
  crc = crc_update(crc, &header_len, 8);
  crc = crc_update(crc, header_text.data(), header_text.size());
  for (const auto& [name, t] : tensors) crc = crc_update(crc, t->data(), static_cast<size_t>(t->numel()) * sizeof(float));
  const std::string hex = fmt::format("{:08x}", static_cast<uint32_t>(crc));
  header_text.replace(crc_at, 8, hex);

  const std::string iter_dir = checkpoint_iteration_dir(save_dir, shard.iteration);
  make_dirs(iter_dir);
  AtomicFile f(checkpoint_shard_path(save_dir, shard.iteration, shard.tp_rank, shard.dp_rank));
  f.write(&header_len, 8);
  f.write(header_text.data(), header_text.size());
  for (const auto& [name, t] : tensors) f.write(t->data(), static_cast<size_t>(t->numel()) * sizeof(float));
  f.commit();
  // The iter_ folder may be new: make its entry in the save folder durable too.
  fsync_dir(save_dir);
}

namespace {

/// A shard file's header as read and validated by either format: its identity, metadata, tensor table and where
/// its data section starts in the file.
struct ShardHeader {
  int64_t iteration = 0;
  uint64_t config_hash = 0, data_offset = 0, data_bytes = 0;
  int tp_rank = 0, tp_size = 0, dp_rank = 0;
  std::string meta;
  std::vector<TensorEntry> entries;
};

/// The kCorrupt error of one shard file: "checkpoint PATH is corrupt (WHY); HINT".
struct CorruptShard {
  const std::string& path;
  const std::string& hint;
  [[noreturn]] void operator()(const std::string& why) const {
    throw_error(ErrorKind::kCorrupt, "checkpoint {} is corrupt ({}); {}", path, why, hint);
  }
};

/// Why shard `path` cannot be opened (errno `err`): an I/O error; or, when it does not exist, a save with another
/// --tensor-model-parallel-size (as a present shard's header says: kInvalidArgument, the user must change a flag),
/// else an inconsistent folder set (a save that did not complete, or files removed: kCorrupt).
[[noreturn]] void throw_unopenable(const std::string& save_dir, int64_t iteration, const CheckpointShard& into,
                                   const std::string& path, int err) {
  const std::string iter_dir = checkpoint_iteration_dir(save_dir, iteration);
  if (err != ENOENT)
    throw_error(ErrorKind::kIo, "cannot open checkpoint {}: {}; check the files under --load", path,
                std::strerror(err));
  if (!fs::is_directory(iter_dir))
    throw_error(ErrorKind::kCorrupt, "checkpoint folder {} does not exist; pass a --load folder that holds it, or "
                "set {}/{} to an iteration that was saved", iter_dir, save_dir, kLatestFile);
  std::vector<int> present = tp_ranks_present(iter_dir);
  const std::optional<int> saved_tp =
      present.empty() ? std::nullopt
                      : recorded_tp_size(checkpoint_shard_path(save_dir, iteration, present.front(), into.dp_rank));
  if (saved_tp && *saved_tp != into.tp_size)
    throw_error(ErrorKind::kInvalidArgument, "checkpoint {} does not exist; {} was saved with "
                "--tensor-model-parallel-size {} (it holds shards of TP ranks [{}]) but this run is TP rank {} of "
                "{}: resume with --tensor-model-parallel-size {} on a number of ranks it divides (coc does not "
                "reshard checkpoints)",
                path, iter_dir, *saved_tp, fmt::join(present, ", "), into.tp_rank, into.tp_size, *saved_tp);
  throw_error(ErrorKind::kCorrupt, "checkpoint {} does not exist; {} holds shards of TP ranks [{}] only, of {}: "
              "that save did not complete or files were removed; {}",
              path, iter_dir, fmt::join(present, ", "), into.tp_size, checkpoint_recovery_hint(save_dir, iteration));
}

/// Whether an old-format (COCCKPT1) file's trailing CRC matches its contents.
bool legacy_crc_ok(InFile& f) {
  uint32_t stored = 0;
  f.read_at(f.size() - kTrailerBytes, &stored, 4);
  return f.crc_prefix(f.size() - kTrailerBytes) == stored;
}

/// The JSON header of an old-format file, after checking its prefix (magic, version, header length) against the
/// file size. kCorrupt for a damaged prefix; an intact one from another format version is kCorrupt too, so that
/// the CLI treats it as a bad checkpoint file.
std::string read_legacy_header_text(InFile& f, const std::string& path, const CorruptShard& corrupt) {
  const uint64_t size = f.size();
  if (size < kPrefixBytes + kTrailerBytes)
    corrupt(fmt::format("truncated at byte {}; a checkpoint has at least {} bytes", size,
                        kPrefixBytes + kTrailerBytes));
  char prefix[kPrefixBytes];
  f.read_at(0, prefix, kPrefixBytes);
  if (std::memcmp(prefix, kMagic, sizeof kMagic) != 0) corrupt("bad magic: not a coc checkpoint");
  uint32_t version = 0, header_bytes = 0;
  std::memcpy(&version, prefix + 8, 4);
  std::memcpy(&header_bytes, prefix + 12, 4);
  if (version != kLegacyVersion) {
    if (!legacy_crc_ok(f)) corrupt("CRC mismatch in the format version field");
    // Intact but from another coc: not corrupt, yet unusable here.
    throw_error(ErrorKind::kCorrupt, "checkpoint {} has format version {} but this build reads version {}; resume "
                "with the coc build that wrote it, or {}", path, version, kLegacyVersion, corrupt.hint);
  }
  if (header_bytes > kMaxHeaderBytes) corrupt(fmt::format("damaged header length {}", header_bytes));
  // Not worth a CRC pass to tell a cut-off file from a damaged length field: the fix is the same.
  if (kPrefixBytes + header_bytes + kTrailerBytes > size)
    corrupt(fmt::format("truncated at byte {}, inside its {}-byte header", size, header_bytes));
  std::string header_text(header_bytes, '\0');
  f.read_at(kPrefixBytes, header_text.data(), header_bytes);
  return header_text;
}

/// Parses an old-format JSON header into `h` and checks its tensor table (f32 entries, consistent shapes, offsets
/// and sizes, unique names). Throws std::exception for anything that is not what save_shard wrote.
void parse_legacy_header(const std::string& header_text, ShardHeader& h) {
  json j = json::parse(header_text);
  h.iteration = j.at("iteration").get<int64_t>();
  h.config_hash = j.at("config_hash").get<uint64_t>();
  h.tp_rank = j.at("tp_rank").get<int>();
  h.tp_size = j.at("tp_size").get<int>();
  h.dp_rank = j.at("dp_rank").get<int>();
  h.meta = j.at("meta").get<std::string>();
  h.data_bytes = j.at("data_bytes").get<uint64_t>();
  uint64_t running = 0;
  std::set<std::string> names;
  for (const json& t : j.at("tensors")) {
    TensorEntry e;
    e.name = t.at("name").get<std::string>();
    if (t.at("dtype").get<std::string>() != "f32")
      throw std::runtime_error("tensor '" + e.name + "' has dtype " + t.at("dtype").dump());
    e.shape = t.at("shape").get<std::vector<int64_t>>();
    e.offset = t.at("offset").get<uint64_t>();
    e.bytes = t.at("bytes").get<uint64_t>();
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0 || (d > 0 && numel > (uint64_t{1} << 60) / static_cast<uint64_t>(d)))
        throw std::runtime_error("tensor '" + e.name + "' has an impossible shape");
      numel *= static_cast<uint64_t>(d);
    }
    if (e.bytes != numel * sizeof(float) || e.offset != running || !names.insert(e.name).second)
      throw std::runtime_error("tensor table entry '" + e.name + "' is inconsistent");
    running += e.bytes;
    h.entries.push_back(std::move(e));
  }
  if (running != h.data_bytes) throw std::runtime_error("tensor sizes do not add up to data_bytes");
}

/// Reads and validates a file in the format of coc before 0.2 (see the top of checkpoint.h): header, size, CRC.
ShardHeader read_legacy_shard(InFile& f, const std::string& path, const CorruptShard& corrupt) {
  log::warn("checkpoint {} is in coc's old COCCKPT1 format: loading it; checkpoints saved from now on are "
            "safetensors files (save once with --save to convert)", path);
  const uint64_t size = f.size();
  const std::string header_text = read_legacy_header_text(f, path, corrupt);
  ShardHeader h;
  h.data_offset = round_up(kPrefixBytes + header_text.size(), kAlign);
  // Every inconsistency in the header's structure means the file is not what save_shard wrote, i.e. corrupt. A
  // header that fails to parse is most often a flipped bit: say "CRC mismatch" when the CRC disagrees, the honest
  // diagnosis, and give the parse error only for a file written wrong in the first place.
  try {
    parse_legacy_header(header_text, h);
  } catch (const std::exception& e) {
    corrupt(legacy_crc_ok(f) ? fmt::format("unreadable header: {}", e.what())
                             : std::string("CRC mismatch in the header"));
  }
  const uint64_t expected = h.data_offset + h.data_bytes + kTrailerBytes;
  if (size < expected) corrupt(fmt::format("truncated at byte {} of {}", size, expected));
  if (size > expected) corrupt(fmt::format("{} unexpected bytes after byte {}", size - expected, expected));
  uint32_t stored = 0;
  f.read_at(size - kTrailerBytes, &stored, 4);
  const uint32_t actual = f.crc_prefix(size - kTrailerBytes);
  if (stored != actual) corrupt(fmt::format("CRC mismatch: stored {:08x}, computed {:08x}", stored, actual));
  return h;
}

/// The CRC32 of a safetensors shard as save_shard computes it: the 8-byte header length, the header text (with
/// its kCrcKey digits as "00000000") and the data section, streamed.
std::string safetensors_crc(InFile& f, uint64_t header_len, const std::string& header_text,
                            const SafetensorsHeader& h) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  crc = crc_update(crc, &header_len, 8);
  crc = crc_update(crc, header_text.data(), header_text.size());
  std::vector<unsigned char> buf(static_cast<size_t>(std::min<uint64_t>(h.data_bytes(), kIoChunk)));
  for (uint64_t off = 0; off < h.data_bytes();) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(h.data_bytes() - off, kIoChunk));
    f.read_at(h.data_offset() + off, buf.data(), k);
    crc = crc_update(crc, buf.data(), k);
    off += k;
  }
  return fmt::format("{:08x}", static_cast<uint32_t>(crc));
}

/// Reads and validates a safetensors shard: header length, CRC (first, so that a flipped bit anywhere is "CRC
/// mismatch", whatever field it landed in), coc's metadata fields and F32 tensors.
ShardHeader read_safetensors_shard(InFile& f, const CorruptShard& corrupt) {
  const uint64_t size = f.size();
  if (size < 8) corrupt(fmt::format("truncated at byte {}; a safetensors file has at least 8 bytes", size));
  uint64_t header_len = 0;
  f.read_at(0, &header_len, 8);
  if (header_len > kMaxHeaderBytes) corrupt(fmt::format("damaged header length {}", header_len));
  if (8 + header_len > size) corrupt(fmt::format("truncated at byte {}, inside its {}-byte header", size, header_len));
  std::string header_text(header_len, '\0');
  f.read_at(8, header_text.data(), header_len);
  const size_t crc_at = crc_field_offset(header_text);
  if (crc_at == std::string::npos) corrupt(fmt::format("no {} in the safetensors metadata: not a coc shard", kCrcKey));
  const std::string stored = header_text.substr(crc_at, 8);
  header_text.replace(crc_at, 8, std::string(8, '0'));
  SafetensorsHeader st;
  try {
    st = parse_safetensors_header(header_text, size);
  } catch (const std::exception& e) {
    corrupt(e.what());
  }
  const std::string actual = safetensors_crc(f, header_len, header_text, st);
  if (stored != actual) corrupt(fmt::format("CRC mismatch: stored {}, computed {}", printable(stored, false), actual));
  ShardHeader h;
  try {
    const auto& m = st.metadata;
    if (m.at("format") != "coc") throw std::runtime_error("not written by coc");
    h.iteration = std::stoll(m.at("iteration"));
    h.config_hash = std::stoull(m.at("config_hash"));
    h.tp_rank = std::stoi(m.at("tp_rank"));
    h.tp_size = std::stoi(m.at("tp_size"));
    h.dp_rank = std::stoi(m.at("dp_rank"));
    h.meta = m.at("meta");
  } catch (const std::exception& e) {
    corrupt(fmt::format("its metadata lacks coc's fields ({})", e.what()));
  }
  for (const SafetensorsEntry& e : st.tensors) {
    if (e.dtype != "F32") corrupt(fmt::format("tensor '{}' has dtype {}, coc shards hold F32", e.name, e.dtype));
    h.entries.push_back({e.name, e.shape, e.begin, e.end - e.begin});
  }
  h.data_offset = st.data_offset();
  h.data_bytes = st.data_bytes();
  return h;
}

/// Checks that an intact shard `h` is the file its name says (kCorrupt otherwise: someone renamed or copied shards
/// by hand) and was saved with this run's --tensor-model-parallel-size and model config (kInvalidArgument naming
/// the flag to change, rather than the first of a hundred tensors whose shape follows from it).
void check_shard_identity(const ShardHeader& h, const CheckpointShard& into, int64_t iteration,
                          const std::string& path, const CorruptShard& corrupt) {
  if (h.iteration != iteration || h.tp_rank != into.tp_rank || h.dp_rank != into.dp_rank)
    corrupt(fmt::format("it holds iteration {} TP rank {} dp rank {} but its name says iteration {} TP rank {} "
                        "dp rank {}",
                        h.iteration, h.tp_rank, h.dp_rank, iteration, into.tp_rank, into.dp_rank));
  if (h.tp_size != into.tp_size)
    throw_error(ErrorKind::kInvalidArgument, "checkpoint {} was saved with --tensor-model-parallel-size {} but "
                "this run uses {}; resume with --tensor-model-parallel-size {} on a number of ranks it divides (coc "
                "does not reshard checkpoints)",
                path, h.tp_size, into.tp_size, h.tp_size);
  if (h.config_hash != into.config_hash)
    throw_error(ErrorKind::kInvalidArgument, "checkpoint {} was saved with a different model config (config hash "
                "0x{:016x}, this run 0x{:016x}; saved with: {}{}); resume with the model flags it was saved with, "
                "or start a fresh run without --load",
                path, h.config_hash, into.config_hash, describe_meta(h.meta),
                into.meta_json.empty() ? "" : "; this run: " + describe_meta(into.meta_json));
}

/// Matches the shard's tensor table against the tensors `into` expects, by name and shape, both ways; returns the
/// entry of each. Throws kInvalidArgument for a missing, extra (unless into.partial) or differently shaped tensor.
std::map<std::string, const TensorEntry*> match_tensors(const ShardHeader& h, const CheckpointShard& into,
                                                        const std::string& path) {
  std::map<std::string, const TensorEntry*> by_name;
  for (const TensorEntry& e : h.entries) by_name[e.name] = &e;
  std::set<std::string> wanted;
  for (const auto& [name, t] : into.tensors) {
    COC_ASSERT(t != nullptr, "load_shard: tensor '{}' is null", name);
    COC_ASSERT(wanted.insert(name).second, "load_shard: tensor name '{}' appears twice", name);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::vector<std::string> have;
      for (const TensorEntry& e : h.entries) have.push_back(e.name);
      throw_error(ErrorKind::kInvalidArgument, "checkpoint {} has no tensor '{}' (it holds {} tensors: {}); it was "
                  "saved by a different model or optimizer config: resume with the flags it was saved with",
                  path, name, h.entries.size(), join_names(have, 8));
    }
    if (it->second->shape != t->shape())
      throw_error(ErrorKind::kInvalidArgument, "checkpoint {}: tensor '{}' has shape {} in the checkpoint but this "
                  "run expects {} (the checkpoint was saved with --tensor-model-parallel-size {}); resume with the "
                  "model flags it was saved with",
                  path, name, shape_to_string(it->second->shape), t->shape_str(), h.tp_size);
  }
  for (const TensorEntry& e : h.entries)
    if (!into.partial && !wanted.count(e.name))
      throw_error(ErrorKind::kInvalidArgument, "checkpoint {} holds tensor '{}' {} that this run does not expect; it "
                  "was saved by a different model or optimizer config: resume with the flags it was saved with",
                  path, e.name, shape_to_string(e.shape));
  return by_name;
}

}  // namespace

void load_shard(const std::string& save_dir, int64_t iteration, CheckpointShard& into) {
  const std::string path = checkpoint_shard_path(save_dir, iteration, into.tp_rank, into.dp_rank);
  InFile f(path);
  if (!f.is_open()) throw_unopenable(save_dir, iteration, into, path, f.open_errno());
  const std::string hint = checkpoint_recovery_hint(save_dir, iteration);
  const CorruptShard corrupt{path, hint};
  char magic[sizeof kMagic] = {};
  if (f.size() >= sizeof kMagic) f.read_at(0, magic, sizeof kMagic);
  const ShardHeader h = std::memcmp(magic, kMagic, sizeof kMagic) == 0 ? read_legacy_shard(f, path, corrupt)
                                                                       : read_safetensors_shard(f, corrupt);
  check_shard_identity(h, into, iteration, path, corrupt);
  const std::map<std::string, const TensorEntry*> by_name = match_tensors(h, into, path);
  // Everything checked: only now overwrite the caller's tensors.
  for (const auto& [name, t] : into.tensors) {
    const TensorEntry& e = *by_name.at(name);
    f.read_at(h.data_offset + e.offset, t->data(), static_cast<size_t>(e.bytes));
  }
  into.iteration = h.iteration;
  into.meta_json = h.meta;
}

void write_latest(const std::string& save_dir, int64_t iteration) {
  if (iteration < 0) throw_invalid("cannot record negative iteration {} as the latest checkpoint", iteration);
  make_dirs(save_dir);
  AtomicFile f(save_dir + "/" + kLatestFile);
  const std::string text = fmt::format("{}\n", iteration);
  f.write(text.data(), text.size());
  f.commit();
}

std::optional<int64_t> read_latest(const std::string& save_dir) {
  const std::string path = save_dir + "/" + kLatestFile;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return std::nullopt;
    throw_error(ErrorKind::kIo, "cannot read {}: {}; check the permissions under --load", path, std::strerror(err));
  }
  char buf[64];
  size_t n = std::fread(buf, 1, sizeof buf, f);
  std::fclose(f);
  std::string text(buf, n);
  // Megatron writes the number without a newline, coc with one; accept surrounding whitespace either way.
  const size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  int64_t value = -1;
  bool ok = b != std::string::npos && n < sizeof buf;
  if (ok) {
    auto [ptr, ec] = std::from_chars(text.data() + b, text.data() + e + 1, value);
    ok = ec == std::errc() && ptr == text.data() + e + 1 && value >= 0;
  }
  if (!ok)
    throw_error(ErrorKind::kCorrupt, "{} is corrupt (it should hold one iteration number, it holds '{}'); write "
                "the iteration of a complete iter_NNNNNNN folder into it, or delete it to start fresh",
                path, printable(text.substr(0, 40), /*keep_newlines=*/false));
  return value;
}

}  // namespace coc
