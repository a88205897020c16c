// The token data of `coc train` (Megatron's BlendedMegatronDatasetBuilder + GPTDataset, stateless):
//
// --data-path takes
//   * a text file or folder (ByteDataset's rules), tokenized in memory with the run's tokenizer (ByteTokenizer:
//     the bytes themselves, no copy);
//   * a preprocessed prefix: PREFIX.bin/.idx (Megatron's indexed dataset, memory-mapped: a rank never loads the
//     corpus, it touches only the pages of the samples it draws); PREFIX_text_document is tried too;
//   * Megatron's weighted blend "0.3 A 0.7 B" of any of the above (weights are normalised).
// --split "98,2,0" cuts every source into train, validation and test parts (Megatron's get_split_indices: by
// documents for a prefix, by tokens for text); an empty split (the default) keeps everything for training.
//
// Sampling is stateless, as ByteDataset's: sample g of iteration i of a split starts at a uniform token offset of
// its source's part, drawn from splitmix64(seed, i, g) (for the validation and test splits, from a seed of their
// own), and a blend picks the source of each sample from the same counters by weight. So a resumed run draws the
// same samples, the global batch is the same for any dp, and with one text source and no split the training
// samples are ByteDataset::sample_offset's, bit for bit. Samples run across document boundaries, as Megatron's
// GPTDataset does. No MPI.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coc/model/tokenizer.h"

namespace coc {

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };

/// "98,2,0" (or "98/2/0", any non-negative weights, fewer than three parts padded with 0) as fractions that sum to
/// 1; "" is {1, 0, 0}. Errors (uniform kInvalidArgument): not numbers, negative, more than three, or all zero.
std::array<double, 3> parse_split(const std::string& split);

class TrainingData {
 public:
  /// Loads `data_path` (see above) for sequences of `seq_length` tokens. Errors (uniform kInvalidArgument unless
  /// said): a path that is neither text nor a prefix ("PREFIX.idx does not exist"), a bad blend ("0.3 A 0.7" has no
  /// path for its last weight), a training part shorter than seq_length + 1 tokens; kCorrupt for a damaged .idx
  /// (IndexedDataset). Token ids are checked as they are sampled.
  TrainingData(const std::string& data_path, const std::string& split, const Tokenizer& tokenizer,
               int64_t seq_length);
  ~TrainingData();

  /// True when every source's part of `split` holds at least seq_length + 1 tokens.
  bool has(Split split) const;
  /// Tokens of `split` over all sources.
  int64_t tokens(Split split) const;
  /// Fills one micro-batch, as ByteDataset::sample_batch does (same shapes, layout and global sample index), from
  /// `split`. Errors (uniform kInvalidArgument): the split is empty or shorter than seq_length + 1 tokens, bad
  /// indices (ByteDataset::sample_batch's), or a sampled token id outside the tokenizer's vocabulary (data
  /// preprocessed with another tokenizer).
  void sample_batch(Split split, int64_t iteration, int micro_batch_index, int dp_rank, int dp_size,
                    int micro_batch_size, int seq_length, uint64_t seed, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets) const;
  /// One line for the start-up log: each source, its weight and its train/valid/test tokens.
  std::string description() const;

 private:
  struct Source;
  std::vector<std::unique_ptr<Source>> sources_;
  std::vector<double> cumulative_;  ///< normalised cumulative weights
  int64_t seq_length_;
  int64_t vocab_size_;              ///< the tokenizer's: every sampled id must be below it
};

}  // namespace coc
