// Tokenizers of `coc train` and `coc preprocess` (Megatron's --tokenizer-type names):
//   ByteTokenizer           token id = byte value, vocabulary 256, end of document = 0 (NUL): coc's default, so the
//                           README's main job trains on raw bytes with no model file;
//   SentencePieceTokenizer  a SentencePiece model (--tokenizer-model FILE, e.g. LLaMA's tokenizer.model, or one
//                           trained with Debian's spm_train), through Debian's libsentencepiece; end of document =
//                           the model's </s> (eos) id.
// The model's vocabulary is the tokenizer's, padded as Megatron's --make-vocab-size-divisible-by does
// (padded_vocab_size). No MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace coc {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// "ByteTokenizer" or "SentencePieceTokenizer".
  virtual std::string type() const = 0;
  /// Token ids are in [0, vocab_size()) (before padding).
  virtual int64_t vocab_size() const = 0;
  /// The ids of `text` (no BOS or EOS added). Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// The text of `ids` (ids outside the vocabulary, e.g. padding rows, decode to nothing).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// The end-of-document id appended by `coc preprocess --append-eod`.
  virtual int32_t eod() const = 0;
};

/// The tokenizer of --tokenizer-type `type` ("ByteTokenizer" or "SentencePieceTokenizer") with --tokenizer-model
/// `model_file` (SentencePiece only). Errors (uniform kInvalidArgument): unknown type; SentencePiece without a
/// model file, a missing or unreadable one ("--tokenizer-model X: no such file; ..."), or a model file
/// given to ByteTokenizer.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_file);

/// Megatron's _vocab_size_with_padding: `vocab` rounded up to a multiple of divisible_by × tp (each rank then holds
/// an equal number of rows). coc also accepts uneven splits, so divisible_by = 1 (coc's default) keeps the
/// vocabulary as it is at any tp. Errors (uniform
/// kInvalidArgument): divisible_by < 1, or a padded vocabulary smaller than tp (a rank would hold no row).
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int tp);

}  // namespace coc
