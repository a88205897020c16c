#include "coc/model/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "coc/core/error.h"

namespace coc {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string type() const override { return "ByteTokenizer"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids)
      if (id >= 0 && id < 256) s += static_cast<char>(id);
    return s;
  }
  int32_t eod() const override { return 0; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const auto status = sp_.Load(path);
    if (!status.ok())
      throw_invalid("--tokenizer-model {}: not a SentencePiece model ({}); pass a .model file written by spm_train "
                    "or shipped with the model (tokenizer.model)",
                    path, status.ToString());
  }
  std::string type() const override { return "SentencePieceTokenizer"; }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    sp_.Encode(text, &ids).IgnoreError();
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> in;
    for (int32_t id : ids)
      if (id >= 0 && id < sp_.GetPieceSize()) in.push_back(id);
    std::string out;
    sp_.Decode(in, &out).IgnoreError();
    return out;
  }
  int32_t eod() const override { return sp_.eos_id() >= 0 ? sp_.eos_id() : 0; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_file) {
  if (type == "ByteTokenizer") {
    if (!model_file.empty())
      throw_invalid("--tokenizer-model {} was given but --tokenizer-type is ByteTokenizer, which needs no model; pass "
                    "--tokenizer-type SentencePieceTokenizer to use it",
                    model_file);
    return std::make_unique<ByteTokenizer>();
  }
  if (type == "SentencePieceTokenizer") {
    if (model_file.empty())
      throw_invalid("--tokenizer-type SentencePieceTokenizer needs --tokenizer-model FILE (a SentencePiece .model, "
                    "e.g. one trained with spm_train)");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model_file, ec))
      throw_invalid("--tokenizer-model {}: no such file; pass the path of a SentencePiece .model file", model_file);
    return std::make_unique<SentencePieceTokenizer>(model_file);
  }
  throw_invalid("unknown --tokenizer-type '{}'; use ByteTokenizer (default) or SentencePieceTokenizer (coc train also "
                "takes Megatron's Llama2Tokenizer, GPTSentencePieceTokenizer, HuggingFaceTokenizer and MindSpeed-LLM's "
                "PretrainedFromHF); GPT-2's BPE is not implemented: train a SentencePiece model with spm_train",
                type);
}

int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int tp) {
  if (divisible_by < 1)
    throw_invalid("--make-vocab-size-divisible-by must be >= 1 (got {})", divisible_by);
  // 1 = no padding at all (coc splits a vocabulary unevenly), so the byte vocabulary stays 256 at any tp.
  const int64_t multiple = divisible_by == 1 ? 1 : divisible_by * tp;
  const int64_t padded = (vocab + multiple - 1) / multiple * multiple;
  if (padded < tp)
    throw_invalid("the vocabulary of {} tokens cannot be split over --tensor-model-parallel-size {}: a rank would "
                  "hold no row; use a tp of at most {} or a larger --make-vocab-size-divisible-by",
                  padded, tp, padded);
  return padded;
}

}  // namespace coc
