// Byte-level training text and deterministic batch sampling.
//
// coc trains a byte-level model (vocab 256, token id = byte value), so "tokenizing" is the identity and a
// dataset is just the concatenation of every usable text file under --data-path. The default corpus is
// Debian's `fortunes` package (a few MB of English text, installed by scripts/setup), small enough to load
// whole on every rank. Larger corpora go through Megatron's memory-mapped .bin/.idx (model/indexed_dataset.h);
// model/gpt_dataset.h puts both behind --data-path.
//
// Sampling is stateless: the start offset of each sequence is a pure function of (seed, iteration, global
// sample index), drawn from a counter-based RNG (splitmix64). Hence
//   * a resumed run sees exactly the batches the uninterrupted run would have seen (no data-loader state to
//     checkpoint), and
//   * the global batch of an iteration is the same set of sequences whatever the data-parallel size is, so a
//     dp=1 and a dp=4 run produce the same summed gradient (up to fp32 summation order).
// No MPI here: every rank loads the same files itself and draws only its own samples.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace coc {

/// Default --data-path: the text files of Debian's `fortunes` package (fortune's `.dat` indexes are skipped).
inline constexpr const char* kDefaultDataPath = "/usr/share/games/fortunes";

/// Number of distinct token ids: one per byte value.
inline constexpr int kByteVocabSize = 256;

/// The training text of one run, held in memory as raw bytes (dtype uint8, one byte = one token).
class ByteDataset {
 public:
  /// Loads `path`, a text file or a folder.
  ///
  /// A folder is walked recursively; all regular files found are sorted byte-wise by full path (so the text is
  /// the same on every rank and every run) and concatenated without separators. Symlinks are followed (files
  /// and folders), but a target already loaded under another name (fortunes ships `art.u8 -> art`) is loaded
  /// only once, by its first path in sorted order, and symlink loops are cut. Skipped in a folder: files whose
  /// name ends in `.dat` (fortune's binary random-access indexes), files with a NUL byte in their first 4 KiB
  /// (binary), empty files, and non-regular files (fifos, sockets, devices, dangling links).
  ///
  /// `seq_length` (tokens per sequence, > 0) is only used to check that there is enough text: sampling needs
  /// at least seq_length + 1 bytes (inputs plus the next-byte target of the last position).
  ///
  /// Errors (uniform kInvalidArgument, every rank sees the same files): path missing; a file passed directly
  /// that is empty or binary; a folder with no usable text; text shorter than seq_length + 1 bytes.
  /// Per-rank kIo: a file or folder exists but cannot be read.
  ByteDataset(const std::string& path, int64_t seq_length);

  /// Total bytes (= tokens) of text.
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  /// The concatenated text, [size()] bytes.
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  /// The files loaded, in load (sorted path) order.
  const std::vector<std::string>& files() const { return files_; }
  /// The --data-path this dataset was loaded from.
  const std::string& path() const { return path_; }
  /// zlib crc32 of bytes(): a cheap fingerprint that a resumed run can compare with the one stored in the
  /// checkpoint's metadata, to warn when it resumes on different text.
  uint32_t checksum() const { return checksum_; }
  /// One line for the startup log, e.g.
  /// "/usr/share/games/fortunes: 60 files, 2710846 bytes (2.59 MiB); skipped 60 .dat, 0 binary, 60 duplicate links".
  std::string description() const;

  /// Fills one micro-batch of `micro_batch_size` (B) sequences of `seq_length` (S) tokens for this dp rank.
  ///
  /// Output (resized here): `tokens` and `targets`, dtype int32 token ids in [0, 256), shape [S, B] flattened
  /// sequence-major: element t·B + b is position t (0..S-1) of batch item b (0..B-1), the layout the model
  /// consumes (rows = s·B + b). targets[t·B + b] is the byte after tokens[t·B + b] (next-byte prediction).
  ///
  /// Sample b of this call has global index g = (micro_batch_index·dp_size + dp_rank)·B + b. For a global batch
  /// of G = M·dp_size·B sequences (M micro-batches per rank per iteration) the union over all ranks and
  /// micro-batches is exactly g = 0..G-1, whatever dp_size is. Sequence g of iteration i starts at byte offset
  /// uniform in [0, size() - S - 1], drawn from splitmix64(seed, i, g), so it does not depend on anything but
  /// its arguments (identical after a resume, on any rank, in any call order).
  ///
  /// Errors (uniform kInvalidArgument): iteration < 0, micro_batch_index < 0, dp_size < 1, dp_rank outside
  /// [0, dp_size), micro_batch_size < 1, seq_length < 1, or size() < seq_length + 1.
  void sample_batch(int64_t iteration, int micro_batch_index, int dp_rank, int dp_size, int micro_batch_size,
                    int seq_length, uint64_t seed, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets) const;

  /// Start offset (bytes) of global sample `global_index` of `iteration`, in [0, size() - seq_length - 1].
  /// Exposed for tests and for tools that want to reproduce what a run trained on. Same errors as sample_batch.
  int64_t sample_offset(int64_t iteration, int64_t global_index, int seq_length, uint64_t seed) const;

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  std::vector<std::string> files_;
  uint32_t checksum_ = 0;
  int64_t skipped_dat_ = 0;
  int64_t skipped_binary_ = 0;
  int64_t skipped_duplicate_ = 0;
};

}  // namespace coc
