// Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py, the "MMIDIDX" format written by
// tools/preprocess_data.py), so that coc reads Megatron's preprocessed corpora and Megatron reads coc's.
//
// PREFIX.bin: the token ids of every sequence, back to back, in the dtype of the index (no header).
// PREFIX.idx (little-endian):
//   9 bytes   "MMIDIDX\x00\x00"               magic
//   u64       1                               version
//   u8        dtype code                      1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
//                                             8 uint16 (Megatron's DType)
//   u64       S                               sequence count
//   u64       D                               document-index count (documents + 1)
//   i32[S]    sequence lengths                in tokens
//   i64[S]    sequence pointers               byte offset of each sequence in .bin
//   i64[D]    document indices                0, then the index of the sequence after each document's last
// coc's preprocess writes one sequence per document (Megatron without --split-sentences).
//
// The reader memory-maps both files: nothing is read into memory until a token is used, so a corpus far larger
// than RAM costs a rank only the pages its samples touch. No MPI.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace coc {

/// Megatron's DType codes of the .idx header.
enum class IndexedDType : uint8_t { kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6,
                                    kFloat32 = 7, kUInt16 = 8 };

/// The dtype Megatron's preprocess picks for a vocabulary: uint16 below 65500 tokens, else int32.
IndexedDType indexed_dtype_for_vocab(int64_t vocab_size);

/// Writes PREFIX.bin while documents are added and PREFIX.idx at finalize() (Megatron's IndexedDatasetBuilder).
/// Both files are written under temporary names and renamed at finalize(), so an interrupted run leaves no
/// PREFIX.idx that names a partial .bin. Errors: kIo naming the file and the OS error; kInvalidArgument for a token
/// id that does not fit the dtype.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, IndexedDType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;
  /// Appends one document made of one sequence of `n` tokens.
  void add_document(const int32_t* tokens, int64_t n);
  /// Writes the index and renames both files into place.
  void finalize();
  int64_t tokens() const { return tokens_; }

 private:
  std::string prefix_;
  IndexedDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_, doc_idx_{0};
  int64_t bytes_ = 0, tokens_ = 0;
  bool done_ = false;
};

/// A memory-mapped PREFIX.bin/.idx pair.
class IndexedDataset {
 public:
  /// Maps PREFIX.idx and PREFIX.bin. Errors (uniform kInvalidArgument, every rank sees the same files): a missing
  /// .idx or .bin ("--data-path X: X.idx does not exist; run coc preprocess ..."); kCorrupt: a bad magic, version or
  /// dtype, an index whose size does not match its counts, or sequences that point outside .bin.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexedDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  /// Documents (document-index entries minus one).
  int64_t num_documents() const { return num_docs_; }
  int64_t sequence_length(int64_t i) const { return load<int32_t>(lengths_, i); }
  int64_t sequence_pointer(int64_t i) const { return load<int64_t>(pointers_, i); }
  /// Entry i of the document index, i in [0, num_documents()].
  int64_t document_index(int64_t i) const { return load<int64_t>(doc_idx_, i); }
  /// Tokens of .bin before sequence i (sequence_pointer(i) / element size).
  int64_t token_offset(int64_t i) const { return sequence_pointer(i) / elem_; }
  /// Total tokens in .bin.
  int64_t num_tokens() const { return static_cast<int64_t>(bin_bytes_) / elem_; }
  /// Tokens [offset, offset + n) of the concatenated .bin as int32 ids into `out`.
  void read_tokens(int64_t offset, int64_t n, int32_t* out) const;

 private:
  std::string prefix_;
  IndexedDType dtype_ = IndexedDType::kUInt16;
  int elem_ = 2;
  int64_t num_sequences_ = 0, num_docs_ = 0;
  // The .idx arrays, in place in the mapping. Its 34-byte header leaves them unaligned (Megatron's numpy reader reads
  // them at an offset too), so each entry is loaded through memcpy: an unaligned pointer dereference is undefined
  // behaviour even where the CPU allows the load, and memcpy compiles to the same single load.
  const char* lengths_ = nullptr;   ///< int32 [num_sequences]
  const char* pointers_ = nullptr;  ///< int64 [num_sequences], byte offsets into .bin
  const char* doc_idx_ = nullptr;   ///< int64 [num_documents + 1]
  template <class T>
  static T load(const char* array, int64_t i) {
    T v;
    std::memcpy(&v, array + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  }
  void* idx_map_ = nullptr;
  size_t idx_bytes_ = 0;
  const unsigned char* bin_ = nullptr;
  size_t bin_bytes_ = 0;
};

}  // namespace coc
