#include "coc/model/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "coc/core/error.h"

namespace coc {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

int element_bytes(IndexedDType d) {
  switch (d) {
    case IndexedDType::kUInt8:
    case IndexedDType::kInt8: return 1;
    case IndexedDType::kInt16:
    case IndexedDType::kUInt16: return 2;
    case IndexedDType::kInt32:
    case IndexedDType::kFloat32: return 4;
    case IndexedDType::kInt64:
    case IndexedDType::kFloat64: return 8;
  }
  return 0;
}

/// Maps a whole file read-only; returns nullptr for an empty file (mmap refuses length 0).
const void* map_file(const std::string& path, size_t& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw_error(ErrorKind::kIo, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_error(ErrorKind::kIo, "cannot stat {}: {}", path, std::strerror(err));
  }
  bytes = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (bytes > 0) {
    p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw_error(ErrorKind::kIo, "cannot map {}: {}", path, std::strerror(err));
    }
  }
  ::close(fd);  // the mapping keeps the file
  return p;
}

}  // namespace

IndexedDType indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::kUInt16 : IndexedDType::kInt32;
}

// ---------------------------------------------------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, IndexedDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  if (dtype_ != IndexedDType::kUInt8 && dtype_ != IndexedDType::kUInt16 && dtype_ != IndexedDType::kInt32)
    throw_invalid("coc writes token ids as uint8, uint16 or int32 (got dtype code {})", static_cast<int>(dtype_));
  const std::string tmp = prefix_ + ".bin.tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  if (!bin_) throw_error(ErrorKind::kIo, "cannot create {}: {}; pass a writable --output-prefix", tmp, std::strerror(errno));
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
  if (!done_) {
    std::remove((prefix_ + ".bin.tmp").c_str());
    std::remove((prefix_ + ".idx.tmp").c_str());
  }
}

void IndexedDatasetBuilder::add_document(const int32_t* tokens, int64_t n) {
  if (n > std::numeric_limits<int32_t>::max())
    throw_invalid("a document of {} tokens does not fit the index's int32 sequence length; split the input", n);
  const int elem = element_bytes(dtype_);
  const int64_t hi = dtype_ == IndexedDType::kUInt8 ? 255 : dtype_ == IndexedDType::kUInt16 ? 65535 : INT32_MAX;
  std::vector<unsigned char> buf(static_cast<size_t>(n * elem));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t > hi) throw_invalid("token id {} does not fit dtype code {}", t, static_cast<int>(dtype_));
    if (elem == 1) {
      buf[static_cast<size_t>(i)] = static_cast<unsigned char>(t);
    } else if (elem == 2) {
      const uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(&buf[static_cast<size_t>(i * 2)], &v, 2);
    } else {
      std::memcpy(&buf[static_cast<size_t>(i * 4)], &t, 4);
    }
  }
  if (!buf.empty() && std::fwrite(buf.data(), 1, buf.size(), bin_) != buf.size())
    throw_error(ErrorKind::kIo, "cannot write {}.bin.tmp: {}; free disk space", prefix_, std::strerror(errno));
  lengths_.push_back(static_cast<int32_t>(n));
  pointers_.push_back(bytes_);
  bytes_ += n * elem;
  tokens_ += n;
  doc_idx_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::finalize() {
  if (std::fflush(bin_) != 0 || ::fsync(::fileno(bin_)) != 0)
    throw_error(ErrorKind::kIo, "cannot write {}.bin.tmp: {}; free disk space", prefix_, std::strerror(errno));
  std::fclose(bin_);
  bin_ = nullptr;
  const std::string tmp = prefix_ + ".idx.tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw_error(ErrorKind::kIo, "cannot create {}: {}", tmp, std::strerror(errno));
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t s = lengths_.size(), d = doc_idx_.size();
  bool ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&kVersion, 8, 1, f) == 1 &&
            std::fwrite(&code, 1, 1, f) == 1 && std::fwrite(&s, 8, 1, f) == 1 && std::fwrite(&d, 8, 1, f) == 1;
  ok = ok && (s == 0 || std::fwrite(lengths_.data(), 4, s, f) == s);
  ok = ok && (s == 0 || std::fwrite(pointers_.data(), 8, s, f) == s);
  ok = ok && std::fwrite(doc_idx_.data(), 8, d, f) == d;
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  std::fclose(f);
  if (!ok) throw_error(ErrorKind::kIo, "cannot write {}: {}; free disk space", tmp, std::strerror(errno));
  // .bin first: a .idx in place always names a complete .bin.
  if (std::rename((prefix_ + ".bin.tmp").c_str(), (prefix_ + ".bin").c_str()) != 0 ||
      std::rename(tmp.c_str(), (prefix_ + ".idx").c_str()) != 0)
    throw_error(ErrorKind::kIo, "cannot rename {}.bin/.idx into place: {}", prefix_, std::strerror(errno));
  done_ = true;
}

// ---------------------------------------------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  std::error_code ec;
  for (const std::string& p : {idx, bin})
    if (!std::filesystem::is_regular_file(p, ec))
      throw_invalid("--data-path {}: {} does not exist; pass the prefix of a .bin/.idx pair written by coc "
                    "preprocess or Megatron's preprocess_data.py (e.g. corpus_text_document)",
                    prefix, p);
  idx_map_ = const_cast<void*>(map_file(idx, idx_bytes_));
  size_t bin_bytes = 0;
  bin_ = static_cast<const unsigned char*>(map_file(bin, bin_bytes));
  bin_bytes_ = bin_bytes;
  // Every rank maps the same files and finds the same fault: a uniform error, reported once.
  auto corrupt = [&](const std::string& why) {
    throw Error(ErrorKind::kCorrupt,
                fmt::format("{} is not a valid Megatron index ({}); run coc preprocess again to rewrite it", idx, why),
                /*uniform=*/true);
  };
  const auto* p = static_cast<const unsigned char*>(idx_map_);
  if (idx_bytes_ < kHeaderBytes) corrupt("truncated header: " + std::to_string(idx_bytes_) + " bytes");
  if (std::memcmp(p, kMagic, 9) != 0) corrupt("bad magic: expected MMIDIDX");
  uint64_t version = 0, s = 0, d = 0;
  std::memcpy(&version, p + 9, 8);
  if (version != kVersion) corrupt("version " + std::to_string(version) + ", expected 1");
  dtype_ = static_cast<IndexedDType>(p[17]);
  elem_ = element_bytes(dtype_);
  if (elem_ == 0 || dtype_ == IndexedDType::kFloat32 || dtype_ == IndexedDType::kFloat64)
    corrupt("dtype code " + std::to_string(p[17]) + " is not an integer token type");
  std::memcpy(&s, p + 18, 8);
  std::memcpy(&d, p + 26, 8);
  if (s > (uint64_t{1} << 40) || d > (uint64_t{1} << 40) || d < 1)
    corrupt("impossible counts: " + std::to_string(s) + " sequences, " + std::to_string(d) + " document entries");
  const uint64_t want = kHeaderBytes + s * 4 + s * 8 + d * 8;
  if (idx_bytes_ != want)
    corrupt("it holds " + std::to_string(idx_bytes_) + " bytes but its counts need " + std::to_string(want));
  num_sequences_ = static_cast<int64_t>(s);
  num_docs_ = static_cast<int64_t>(d) - 1;
  lengths_ = reinterpret_cast<const char*>(p + kHeaderBytes);
  pointers_ = reinterpret_cast<const char*>(p + kHeaderBytes + s * 4);
  doc_idx_ = reinterpret_cast<const char*>(p + kHeaderBytes + s * 12);
  for (int64_t i = 0; i < num_sequences_; ++i)
    if (sequence_length(i) < 0 || sequence_pointer(i) < 0 || sequence_pointer(i) % elem_ != 0 ||
        static_cast<uint64_t>(sequence_pointer(i)) + static_cast<uint64_t>(sequence_length(i)) * elem_ > bin_bytes_)
      corrupt("sequence " + std::to_string(i) + " points outside " + bin + " (" + std::to_string(bin_bytes_) +
              " bytes)");
  if (document_index(0) != 0) corrupt("the document index does not start at 0");
  for (int64_t i = 1; i <= num_docs_; ++i)
    if (document_index(i) < document_index(i - 1) || document_index(i) > num_sequences_)
      corrupt("the document index is not sorted");
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_bytes_);
  if (bin_) ::munmap(const_cast<unsigned char*>(bin_), bin_bytes_);
}

void IndexedDataset::read_tokens(int64_t offset, int64_t n, int32_t* out) const {
  COC_ASSERT(offset >= 0 && n >= 0 && offset + n <= num_tokens(), "read_tokens [{}, +{}) of {}", offset, n,
             num_tokens());
  const unsigned char* src = bin_ + offset * elem_;
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype_) {
      case IndexedDType::kUInt8: out[i] = src[i]; break;
      case IndexedDType::kInt8: out[i] = static_cast<int8_t>(src[i]); break;
      case IndexedDType::kUInt16: { uint16_t v; std::memcpy(&v, src + 2 * i, 2); out[i] = v; break; }
      case IndexedDType::kInt16: { int16_t v; std::memcpy(&v, src + 2 * i, 2); out[i] = v; break; }
      case IndexedDType::kInt32: { int32_t v; std::memcpy(&v, src + 4 * i, 4); out[i] = v; break; }
      default: { int64_t v; std::memcpy(&v, src + 8 * i, 8); out[i] = static_cast<int32_t>(v); break; }
    }
  }
}

}  // namespace coc
