// The flags of Megatron-LM's and MindSpeed-LLM's pretrain scripts (pretrain_gpt.py; MindSpeed-LLM's
// examples/mcore/*/pretrain_*.sh) that describe the model, the run or the implementation, so that such a script's
// argument list runs unchanged where coc can honour it. Each flag is one of:
//   restating  it says what coc always does (--swiglu, --normalization RMSNorm, --disable-bias-linear, zero dropout,
//              --transformer-impl local, ...): accepted, and rank 0 prints one note
//              line listing every such flag given;
//   mapped     it has a coc equivalent (--use-distributed-optimizer = --data-parallel-sharding-strategy optim,
//              --tokenizer-type Llama2Tokenizer = SentencePieceTokenizer, --moe-router-load-balancing-type none =
//              --moe-aux-loss-coeff 0, ...): applied, with one note each;
//   refused    a value coc cannot honour (--normalization LayerNorm, --position-embedding-type learned_absolute,
//              --hidden-dropout 0.1, --add-qkv-bias, ...): one error line
//              naming every such flag, its value and the reason.
// The learning-rate schedule, checkpoint-loading and vocabulary flags that change the math are implemented in
// train_options.cpp and the trainer (--lr-decay-style, --lr-warmup-fraction, --no-load-optim, --finetune,
// --exit-interval, --vocab-size, --padded-vocab-size, ...).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "coc/model/trainer.h"

namespace coc::cli {

/// Values of these flags as parsed (TrainOptions::megatron).
struct MegatronFlags {
  /// Every restating or refused flag registered, with its values as given (empty when not given).
  struct Given {
    std::string name;                 ///< "--normalization"
    std::vector<std::string> values;  ///< as typed; empty for a switch
    bool given = false;
    const CLI::Option* opt = nullptr;
  };
  std::vector<Given> fixed;
  const CLI::App* app = nullptr;  ///< the parser, for the order in which the flags were given
  bool use_distributed_optimizer = false;
  std::string moe_token_dispatcher_type;         ///< "" when not given
  std::string moe_router_load_balancing_type;    ///< "" when not given
  std::string tokenizer_name_or_path;            ///< MindSpeed-LLM's, with --tokenizer-type PretrainedFromHF
  int64_t max_position_embeddings = 0;           ///< 0: not given
  int64_t kv_channels = 0;                       ///< 0: not given
};

/// Registers the restating, mapped and refused flags on `cmd` (group "Megatron/MindSpeed-LLM script flags").
void add_megatron_flags(CLI::App* cmd, MegatronFlags& m);

/// Applies the mapped flags to `c` and checks the restating ones' values (inside TrainOptions::resolve, after the
/// model shapes are known). Throws one uniform kInvalidArgument line naming each refused flag with its value and
/// the reason, in command-line order.
void apply_megatron_flags(const MegatronFlags& m, TrainConfig& c);

/// The tokenizer of Megatron's and MindSpeed-LLM's --tokenizer-type names, as coc's: Llama2Tokenizer and
/// GPTSentencePieceTokenizer are SentencePieceTokenizer (same vocabulary and end-of-document id); PretrainedFromHF
/// (with --tokenizer-name-or-path DIR) and HuggingFaceTokenizer (with --tokenizer-model DIR) read DIR/tokenizer.model.
/// Updates c.tokenizer_type and c.tokenizer_model. Throws a uniform kInvalidArgument for a folder with only
/// tokenizer.json (saying what to do), a missing folder, or --tokenizer-name-or-path with another type.
void resolve_tokenizer_name(const std::string& name_or_path, TrainConfig& c);

/// Rank 0's note lines for the flags given: one listing the restating flags, one per mapped flag. `c`: the
/// configuration as parsed, before TrainOptions::resolve (the tokenizer type as typed); `resolved`: after it.
std::vector<std::string> megatron_notes(const MegatronFlags& m, const TrainConfig& c, const TrainConfig& resolved);

}  // namespace coc::cli
