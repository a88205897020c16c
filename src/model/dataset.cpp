#include "coc/model/dataset.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "coc/core/error.h"
#include "coc/core/splitmix.h"

namespace coc {
namespace {

namespace fs = std::filesystem;

/// Bytes inspected for a NUL to call a file binary (the same heuristic as git and grep).
constexpr size_t kBinaryProbeBytes = 4096;

/// (st_dev, st_ino) of the file or folder a path resolves to: two paths name the same target iff these match,
/// which catches symlinks, hard links and `..` detours without canonicalising strings.
using FileId = std::pair<uint64_t, uint64_t>;

bool file_id(const std::string& path, FileId& id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;  // stat follows symlinks: identity of the target
  id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  return true;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Reads a whole file. A file that exists but cannot be read is a per-rank I/O problem (permissions, NFS).
std::vector<uint8_t> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw_error(ErrorKind::kIo, "cannot open data file {}: {}; fix its permissions or remove it from --data-path",
                path, std::strerror(errno));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    size_t n = std::fread(buf, 1, sizeof buf, f);
    out.insert(out.end(), buf, buf + n);
    if (n < sizeof buf) break;
  }
  bool failed = std::ferror(f) != 0;
  int err = errno;
  std::fclose(f);
  if (failed)
    throw_error(ErrorKind::kIo, "cannot read data file {}: {}; fix it or remove it from --data-path", path,
                std::strerror(err));
  return out;
}

bool looks_binary(const std::vector<uint8_t>& data) {
  size_t n = std::min(data.size(), kBinaryProbeBytes);
  return std::memchr(data.data(), 0, n) != nullptr;
}

/// Collects every regular file under `dir` (following symlinked folders; each folder target visited once so a
/// link back up the tree cannot loop forever).
void collect_files(const fs::path& dir, std::set<FileId>& visited_dirs, std::vector<std::string>& out) {
  FileId id;
  if (!file_id(dir.string(), id) || !visited_dirs.insert(id).second) return;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec)
    throw_error(ErrorKind::kIo, "cannot list data folder {}: {}; fix its permissions or pass another --data-path",
                dir.string(), ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path p = it->path();
    std::error_code sec;
    fs::file_status st = fs::status(p, sec);  // follows symlinks; a dangling link reports not_found
    if (sec) continue;
    if (fs::is_directory(st)) {
      collect_files(p, visited_dirs, out);
    } else if (fs::is_regular_file(st)) {
      out.push_back(p.string());
    }
  }
  if (ec)
    throw_error(ErrorKind::kIo, "cannot list data folder {}: {}; fix its permissions or pass another --data-path",
                dir.string(), ec.message());
}

void check_sampling_args(int64_t size, int seq_length) {
  if (seq_length < 1) throw_invalid("--seq-length must be >= 1, got {}; pass a positive sequence length", seq_length);
  if (size < static_cast<int64_t>(seq_length) + 1)
    throw_invalid("the training text holds {} bytes but --seq-length {} needs at least {}; pass more text with "
                  "--data-path or a smaller --seq-length",
                  size, seq_length, static_cast<int64_t>(seq_length) + 1);
}

}  // namespace

ByteDataset::ByteDataset(const std::string& path, int64_t seq_length) : path_(path) {
  if (seq_length < 1)
    throw_invalid("--seq-length must be >= 1, got {}; pass a positive sequence length", seq_length);
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (path.empty() || !fs::exists(st))
    throw_invalid("--data-path {} does not exist; pass a text file or folder, or run scripts/setup to install "
                  "the default fortunes corpus",
                  path.empty() ? "''" : path);

  if (fs::is_directory(st)) {
    std::set<FileId> visited_dirs;
    std::vector<std::string> candidates;
    collect_files(path, visited_dirs, candidates);
    // Byte-wise order of the full path: independent of readdir order, locale and filesystem.
    std::sort(candidates.begin(), candidates.end());
    std::set<FileId> loaded;
    int64_t skipped_empty = 0;
    for (const std::string& file : candidates) {
      if (ends_with(file, ".dat")) {
        ++skipped_dat_;
        continue;
      }
      FileId id;
      if (!file_id(file, id)) continue;  // vanished since the listing
      if (loaded.count(id)) {
        ++skipped_duplicate_;
        continue;
      }
      std::vector<uint8_t> data = read_file(file);
      if (data.empty()) {
        ++skipped_empty;
        continue;
      }
      if (looks_binary(data)) {
        ++skipped_binary_;
        continue;
      }
      loaded.insert(id);
      files_.push_back(file);
      bytes_.insert(bytes_.end(), data.begin(), data.end());
    }
    if (bytes_.empty())
      throw_invalid("--data-path {} holds no usable text ({} files found; skipped {} .dat index, {} binary, {} "
                    "empty); pass a folder containing text files, or run scripts/setup to install the default "
                    "fortunes corpus",
                    path, candidates.size(), skipped_dat_, skipped_binary_, skipped_empty);
  } else if (fs::is_regular_file(st)) {
    // A file named explicitly is loaded even if it ends in .dat: the user asked for it. The binary check
    // still applies (a fortune index would otherwise train the model on struct padding).
    bytes_ = read_file(path);
    if (bytes_.empty())
      throw_invalid("--data-path {} is empty; pass a text file or folder, or run scripts/setup to install the "
                    "default fortunes corpus",
                    path);
    if (looks_binary(bytes_))
      throw_invalid("--data-path {} is a binary file (NUL byte in its first {} bytes); pass a text file or folder",
                    path, kBinaryProbeBytes);
    files_.push_back(path);
  } else {
    throw_invalid("--data-path {} is neither a regular file nor a folder; pass a text file or folder", path);
  }

  if (size() < seq_length + 1)
    throw_invalid("--data-path {} holds {} bytes of text but --seq-length {} needs at least {}; pass more text or "
                  "a smaller --seq-length",
                  path, size(), seq_length, seq_length + 1);

  // zlib's crc32 takes a 32-bit length: feed it in chunks so corpora over 4 GiB are fine.
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (size_t off = 0; off < bytes_.size();) {
    size_t n = std::min<size_t>(bytes_.size() - off, size_t{1} << 30);
    crc = ::crc32(crc, bytes_.data() + off, static_cast<uInt>(n));
    off += n;
  }
  checksum_ = static_cast<uint32_t>(crc);
}

std::string ByteDataset::description() const {
  return fmt::format("{}: {} file{}, {} bytes ({:.2f} MiB); skipped {} .dat, {} binary, {} duplicate links", path_,
                     files_.size(), files_.size() == 1 ? "" : "s", size(), static_cast<double>(size()) / (1 << 20),
                     skipped_dat_, skipped_binary_, skipped_duplicate_);
}

int64_t ByteDataset::sample_offset(int64_t iteration, int64_t global_index, int seq_length, uint64_t seed) const {
  if (iteration < 0) throw_invalid("sample iteration must be >= 0, got {}", iteration);
  if (global_index < 0) throw_invalid("global sample index must be >= 0, got {}", global_index);
  check_sampling_args(size(), seq_length);
  // Counter-based: nest the three counters through the mixer so (seed, i, g) and (seed, g, i) differ.
  uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(iteration)) ^
                            static_cast<uint64_t>(global_index));
  // Valid starts are 0..size-S-1 (the target of the last position, at start+S, must exist).
  const uint64_t count = static_cast<uint64_t>(size() - seq_length);
  // Lemire's multiply-shift maps 64 random bits to [0, count) without a division; its bias (< count / 2^64) is
  // far below anything a training run could notice.
  return static_cast<int64_t>((static_cast<unsigned __int128>(key) * count) >> 64);
}

void ByteDataset::sample_batch(int64_t iteration, int micro_batch_index, int dp_rank, int dp_size,
                               int micro_batch_size, int seq_length, uint64_t seed, std::vector<int32_t>& tokens,
                               std::vector<int32_t>& targets) const {
  if (micro_batch_index < 0) throw_invalid("micro-batch index must be >= 0, got {}", micro_batch_index);
  if (dp_size < 1) throw_invalid("data-parallel size must be >= 1, got {}", dp_size);
  if (dp_rank < 0 || dp_rank >= dp_size)
    throw_invalid("data-parallel rank {} is outside [0, {})", dp_rank, dp_size);
  if (micro_batch_size < 1)
    throw_invalid("--micro-batch-size must be >= 1, got {}; pass a positive micro-batch size", micro_batch_size);
  check_sampling_args(size(), seq_length);

  const int64_t S = seq_length, B = micro_batch_size;
  tokens.resize(static_cast<size_t>(S * B));
  targets.resize(static_cast<size_t>(S * B));
  const int64_t first = (static_cast<int64_t>(micro_batch_index) * dp_size + dp_rank) * B;
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* src = bytes_.data() + sample_offset(iteration, first + b, seq_length, seed);
    for (int64_t t = 0; t < S; ++t) {
      tokens[static_cast<size_t>(t * B + b)] = src[t];
      targets[static_cast<size_t>(t * B + b)] = src[t + 1];
    }
  }
}

}  // namespace coc
