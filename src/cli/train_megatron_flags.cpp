// Megatron's and MindSpeed-LLM's script flags: restating, mapped or refused (cli/train_megatron_flags.h).
// Sources of the names and values: Megatron-LM's megatron/training/arguments.py and MindSpeed-LLM's
// examples/mcore/{llama2,qwen2,mixtral}/pretrain_*.sh.
#include "cli/train_megatron_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string_view>

#include "coc/core/error.h"

namespace coc::cli {

namespace {

const char* const kGroup = "Megatron/MindSpeed-LLM script flags";

/// A switch that restates what coc always does.
struct RestatingSwitch {
  const char* name;
  const char* coc_does;
};
constexpr RestatingSwitch kRestatingSwitches[] = {
    {"--use-mcore-models", "coc's decoder is its own Megatron-core-style GPT model"},
    {"--use-legacy-models", "coc's decoder computes what Megatron's legacy GPT model computes with these flags"},
    {"--swiglu", "coc's MLP is always SwiGLU"},
    {"--disable-bias-linear", "coc's linear layers have no biases"},
    {"--untie-embeddings-and-output-weights", "coc's input embedding and output layer are always separate weights"},
    {"--use-rotary-position-embeddings", "coc always applies rotary position embeddings (RoPE)"},
    {"--no-position-embedding", "coc has no learned position table (RoPE only)"},
    {"--no-masked-softmax-fusion", "coc's softmax is its own fused fp32 loop on the CPU"},
    {"--attention-softmax-in-fp32", "coc computes the softmax in fp32"},
    {"--no-query-key-layer-scaling", "coc scales attention scores by 1/sqrt(head dim) only"},
    {"--no-gradient-accumulation-fusion", "coc accumulates weight gradients in fp32 in its own GEMMs"},
    {"--no-rope-fusion", "coc's rotary embedding is its own loop on the CPU"},
    {"--no-bias-swiglu-fusion", "coc's SwiGLU has no bias to fuse"},
    {"--no-bias-dropout-fusion", "coc has no bias or dropout to fuse"},
    {"--no-persist-layer-norm", "coc's RMSNorm is its own loop on the CPU"},
    {"--use-cpu-initialization", "coc always initialises on the CPU"},
    {"--no-shared-storage", "every coc rank reads its own data and checkpoint files"},
    {"--no-check-for-nan-in-loss-and-grad", "coc still stops with an error on a non-finite loss or gradient norm"},
    {"--no-load-rng", "coc's checkpoints hold no random state: data order and sampling follow --seed"},
    {"--overlap-param-gather", "coc's sharded strategies schedule their parameter all-gathers themselves"},
    {"--moe-grouped-gemm", "coc runs each local expert's tokens as one GEMM"},
    {"--moe-permutation-async-comm", "coc's dispatchers overlap their exchange on their own schedule"},
    {"--distribute-saved-activations",
     "coc keeps each recomputed chunk's input whole on every TP rank (memory only; the results are the same)"},
    {"--log-throughput", "coc always logs Megatron's TFLOP/s per rank (and tokens/s)"},
    {"--log-timers-to-tensorboard", "coc always writes Megatron's iteration-time and throughput scalars"},
    {"--log-validation-ppl-to-tensorboard", "coc always writes Megatron's lm loss validation ppl scalars"},
    {"--tokenizer-not-use-fast", "coc reads SentencePiece models itself"},
    {"--calculate-per-token-loss", "coc's sequences have no padding or loss mask: every token counts once already"},
    {"--cross-entropy-loss-fusion", "coc's vocabulary-parallel cross-entropy is one fused pass"},
    {"--manual-gc", "coc has no garbage collector"},
    {"--no-create-attention-mask-in-dataloader", "coc's attention builds its causal mask itself"},
    {"--no-mmap-bin-files", "coc memory-maps the .bin files; the tokens are the same"},
    {"--log-params-norm", "coc logs the gradient norm"},
    {"--log-num-zeros-in-grad", "coc logs the gradient norm"},
};

/// A flag with a value: `accepted` ('|'-separated; "*" = any; numbers compare as numbers) restates coc, any other
/// value is refused with `refusal`.
struct RestatingValue {
  const char* name;
  const char* accepted;
  const char* coc_does;
  const char* refusal;
};
constexpr RestatingValue kRestatingValues[] = {
    {"--normalization", "RMSNorm", "coc normalises with RMSNorm (LLaMA's)",
     "coc implements RMSNorm only; pass --normalization RMSNorm"},
    {"--position-embedding-type", "rope", "coc's positions are rotary embeddings (RoPE)",
     "coc implements rotary position embeddings only; pass --position-embedding-type rope"},
    {"--rotary-percent", "1", "coc rotates the whole head dimension",
     "coc's RoPE rotates the whole head dimension; pass --rotary-percent 1.0"},
    {"--attention-dropout", "0", "coc has no dropout",
     "coc has no dropout yet; pass 0 (as MindSpeed-LLM's scripts do)"},
    {"--hidden-dropout", "0", "coc has no dropout",
     "coc has no dropout yet; pass 0 (as MindSpeed-LLM's scripts do)"},
    {"--optimizer", "adam", "coc's optimizer is AdamW (Megatron's adam, decoupled weight decay)",
     "coc implements AdamW only; pass --optimizer adam"},
    {"--transformer-impl", "*", "coc's layers are its own CPU kernels", ""},
    {"--attention-backend", "*", "coc's attention is its own CPU kernel", ""},
    {"--distributed-backend", "*", "coc communicates over MPI", ""},
    {"--ckpt-format", "*", "coc writes its own sharded safetensors checkpoints", ""},
    {"--num-workers", "*", "coc reads its data on the training thread", ""},
    {"--empty-unused-memory-level", "*", "coc keeps its buffers allocated (no device cache to empty)", ""},
    {"--data-cache-path", "*", "coc builds its sample index in memory, the same order every run", ""},
    {"--tensorboard-log-interval", "*", "coc writes a TensorBoard record at every logged iteration", ""},
    {"--cross-entropy-fusion-impl", "*", "coc's vocabulary-parallel cross-entropy is its own fused pass", ""},
};

/// A flag whose every use changes the result in a way coc does not implement.
struct Refused {
  const char* name;
  bool takes_value;
  const char* reason;
};
constexpr Refused kRefused[] = {
    {"--add-qkv-bias", false, "coc's linear layers have no biases (Qwen's query/key/value biases are not implemented)"},
    {"--add-bias-linear", false, "coc's linear layers have no biases"},
    {"--qk-layernorm", false, "coc does not normalise queries and keys"},
    {"--apply-layernorm-1p", false, "coc's RMSNorm scales by its weight, not 1 + weight"},
    {"--use-rope-scaling", false, "coc's RoPE has no frequency scaling (LLaMA 3.1's)"},
    {"--rope-scaling-type", true, "coc's RoPE has no frequency scaling"},
    {"--rampup-batch-size", true, "coc's global batch size is fixed; drop the ramp-up"},
    {"--tie-embed-logits", false, "coc's input embedding and output layer are separate weights"},
    {"--vocab-file", true,
     "coc has no GPT-2 BPE tokenizer; train a SentencePiece model (spm_train), preprocess with it (coc preprocess) "
     "and pass --tokenizer-type SentencePieceTokenizer --tokenizer-model FILE"},
    {"--merge-file", true, "coc has no GPT-2 BPE tokenizer (see --vocab-file)"},
    {"--mock-data", false, "coc trains on real text; leave out --data-path for its built-in corpus (fortunes)"},
    {"--decoupled-lr", true, "coc has one learning rate for every parameter"},
    {"--decoupled-min-lr", true, "coc has one learning rate for every parameter"},
    {"--apply-query-key-layer-scaling", false, "coc scales attention scores by 1/sqrt(head dim) only"},
    {"--checkpoint-activations", false,
     "Megatron's removed spelling: pass --recompute-granularity full --recompute-method uniform "
     "--recompute-num-layers 1"},
    {"--recompute-modules", true,
     "coc recomputes whole layers (--recompute-granularity full) or the attention probabilities (selective)"},
    {"--recompute-activation-function", false,
     "coc recomputes whole layers (--recompute-granularity full) or the attention probabilities (selective)"},
    {"--recompute-activation-function-num-layers", true, "coc has no activation-function recomputation"},
    {"--recompute-norm", false,
     "coc recomputes whole layers (--recompute-granularity full) or the attention probabilities (selective)"},
    {"--recompute-norm-num-layers", true, "coc has no norm recomputation"},
    {"--recompute-in-advance", false, "coc recomputes a chunk just before its backward"},
};

/// Whether `value` is one of `accepted` ('|'-separated, "*" = any); numbers compare as numbers ("0.0" is "0").
bool is_accepted(std::string_view accepted, const std::string& value) {
  if (accepted == "*") return true;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  const bool numeric = !value.empty() && end == value.c_str() + value.size();
  for (size_t pos = 0; pos <= accepted.size();) {
    const size_t bar = std::min(accepted.find('|', pos), accepted.size());
    const std::string a(accepted.substr(pos, bar - pos));
    const bool a_numeric = !a.empty() && std::isdigit(static_cast<unsigned char>(a[0]));
    if (a == value || (numeric && a_numeric && std::strtod(a.c_str(), nullptr) == v)) return true;
    pos = bar + 1;
  }
  return false;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : sep) + p;
  return s;
}

const RestatingValue* restating_value(const std::string& name) {
  for (const RestatingValue& r : kRestatingValues)
    if (name == r.name) return &r;
  return nullptr;
}
const Refused* refused(const std::string& name) {
  for (const Refused& r : kRefused)
    if (name == r.name) return &r;
  return nullptr;
}

/// The restating and refused flags given, in command-line order (those from a --config file last, in table order).
std::vector<const MegatronFlags::Given*> given_in_order(const MegatronFlags& m) {
  std::vector<const MegatronFlags::Given*> out;
  for (const MegatronFlags::Given& g : m.fixed)
    if (g.given || !g.values.empty()) out.push_back(&g);
  if (!m.app) return out;
  const std::vector<CLI::Option*> order = m.app->parse_order();
  const auto position = [&](const MegatronFlags::Given* g) {
    return std::find(order.begin(), order.end(), g->opt) - order.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](auto* a, auto* b) { return position(a) < position(b); });
  return out;
}

/// The flag as typed: "--normalization LayerNorm", "--swiglu".
std::string with_values(const MegatronFlags::Given& g) {
  return g.values.empty() ? g.name : g.name + " " + join(g.values, " ");
}

}  // namespace

void add_megatron_flags(CLI::App* cmd, MegatronFlags& m) {
  m.fixed.clear();
  m.app = cmd;
  m.fixed.reserve(std::size(kRestatingSwitches) + std::size(kRestatingValues) + std::size(kRefused));
  for (const RestatingSwitch& r : kRestatingSwitches) {
    MegatronFlags::Given& g = m.fixed.emplace_back(MegatronFlags::Given{r.name, {}, false});
    g.opt = cmd->add_flag(r.name, g.given, fmt::format("Megatron's flag, accepted: {}", r.coc_does))->group(kGroup);
  }
  for (const RestatingValue& r : kRestatingValues) {
    MegatronFlags::Given& g = m.fixed.emplace_back(MegatronFlags::Given{r.name, {}, false});
    const std::string help = std::string_view(r.accepted) == "*"
                                 ? fmt::format("Megatron's flag, accepted with any value: {}", r.coc_does)
                                 : fmt::format("Megatron's flag: {} accepted ({}); other values refused", r.accepted,
                                               r.coc_does);
    g.opt = cmd->add_option(r.name, g.values, help)->expected(1)->type_name("VALUE")->group(kGroup);
  }
  for (const Refused& r : kRefused) {
    MegatronFlags::Given& g = m.fixed.emplace_back(MegatronFlags::Given{r.name, {}, false});
    const std::string help = fmt::format("Megatron's flag, refused: {}", r.reason);
    if (r.takes_value)
      g.opt = cmd->add_option(r.name, g.values, help)
          ->expected(1, CLI::detail::expected_max_vector_size)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
          ->type_name("VALUE")
          ->group(kGroup);
    else
      g.opt = cmd->add_flag(r.name, g.given, help)->group(kGroup);
  }
  cmd->add_flag("--use-distributed-optimizer", m.use_distributed_optimizer,
                "Megatron's distributed optimizer: --data-parallel-sharding-strategy optim (ZeRO-1; the same losses), "
                "unless a strategy is given")
      ->group(kGroup);
  cmd->add_option("--moe-token-dispatcher-type", m.moe_token_dispatcher_type,
                  "Megatron's MoE dispatcher (allgather, alltoall, alltoall_seq): accepted; coc's --ep-dispatcher "
                  "(eager by default) gives the same result")
      ->group(kGroup);
  cmd->add_option("--moe-router-load-balancing-type", m.moe_router_load_balancing_type,
                  "aux_loss (coc's, Megatron's default) or none (no load-balancing loss: --moe-aux-loss-coeff 0); "
                  "sinkhorn and seq_aux_loss are refused")
      ->group(kGroup);
  cmd->add_option("--tokenizer-name-or-path", m.tokenizer_name_or_path,
                  "MindSpeed-LLM's, with --tokenizer-type PretrainedFromHF: a Hugging Face model folder; coc reads "
                  "its tokenizer.model (SentencePiece)")
      ->group(kGroup);
  cmd->add_option("--max-position-embeddings", m.max_position_embeddings,
                  "Megatron's position-table size: RoPE needs no table, so it must only be >= --seq-length")
      ->group(kGroup);
  cmd->add_option("--kv-channels", m.kv_channels,
                  "Megatron's head dimension: accepted when it is --hidden-size / --num-attention-heads (coc's)")
      ->group(kGroup);
}

void apply_megatron_flags(const MegatronFlags& m, TrainConfig& c) {
  std::vector<std::string> refusals;
  for (const MegatronFlags::Given* g : given_in_order(m)) {
    if (const Refused* r = refused(g->name)) refusals.push_back(fmt::format("{}: {}", with_values(*g), r->reason));
    const RestatingValue* v = restating_value(g->name);
    if (v && !g->values.empty() && !is_accepted(v->accepted, g->values.back()))
      refusals.push_back(fmt::format("{}: {}", with_values(*g), v->refusal));
  }
  const ModelConfig& model = c.model;
  if (m.max_position_embeddings != 0 && m.max_position_embeddings < model.seq_length)
    refusals.push_back(fmt::format("--max-position-embeddings {}: below --seq-length {}, as Megatron refuses too; "
                                   "pass at least {}",
                                   m.max_position_embeddings, model.seq_length, model.seq_length));
  if (m.kv_channels != 0 && m.kv_channels * model.num_attention_heads != model.hidden_size)
    refusals.push_back(fmt::format("--kv-channels {}: coc's head dimension is --hidden-size / --num-attention-heads "
                                   "= {}; pass that or leave it out",
                                   m.kv_channels, model.hidden_size / std::max<int64_t>(1, model.num_attention_heads)));
  const std::string& lb = m.moe_router_load_balancing_type;
  if (lb == "none") c.moe.aux_loss_coeff = 0;
  else if (!lb.empty() && lb != "aux_loss")
    refusals.push_back(fmt::format("--moe-router-load-balancing-type {}: coc implements aux_loss (the load-balancing "
                                   "loss) and none; pass one of them",
                                   lb));
  const std::string& d = m.moe_token_dispatcher_type;
  if (!d.empty() && d != "allgather" && d != "alltoall" && d != "alltoall_seq")
    refusals.push_back(fmt::format("--moe-token-dispatcher-type {}: use allgather, alltoall or alltoall_seq "
                                   "(Megatron's; coc's --ep-dispatcher picks its own exchange)",
                                   d));
  if (!refusals.empty()) throw_invalid("{}", join(refusals, "; "));
  // A MoE model shards its experts over expert-dp and its dense weights over dp × cp (docs/semantics.md §4).
  if (m.use_distributed_optimizer && c.data_parallel_sharding_strategy == ShardingStrategy::kNoShard)
    c.data_parallel_sharding_strategy = ShardingStrategy::kOptim;
}

void resolve_tokenizer_name(const std::string& name_or_path, TrainConfig& c) {
  const std::string type = c.tokenizer_type;
  if (type == "Llama2Tokenizer" || type == "GPTSentencePieceTokenizer") c.tokenizer_type = "SentencePieceTokenizer";
  const bool hf = type == "PretrainedFromHF" || type == "HuggingFaceTokenizer";
  if (!name_or_path.empty() && type != "PretrainedFromHF")
    throw_invalid("--tokenizer-name-or-path {}: MindSpeed-LLM reads it only with --tokenizer-type PretrainedFromHF "
                  "(this run has {}); pass that type, or leave the folder out",
                  name_or_path, type);
  if (!hf) return;
  const std::string flag = type == "PretrainedFromHF" ? "--tokenizer-name-or-path" : "--tokenizer-model";
  const std::string dir = type == "PretrainedFromHF" ? name_or_path : c.tokenizer_model;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec))
    throw_invalid("--tokenizer-type {} needs {} DIR, a Hugging Face model folder with a tokenizer.model{}", type, flag,
                  dir.empty() ? std::string() : fmt::format(" ({}: no such folder)", dir));
  if (!fs::is_regular_file(fs::path(dir) / "tokenizer.model", ec))
    throw_invalid("{} {}: no tokenizer.model there{}; coc reads SentencePiece models only: pass a folder with "
                  "tokenizer.model (LLaMA, Mistral and Mixtral ship one), or --tokenizer-type SentencePieceTokenizer "
                  "--tokenizer-model FILE (one can be trained with spm_train)",
                  flag, dir,
                  fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec)
                      ? " (only tokenizer.json, a Hugging Face fast tokenizer, which coc cannot read)"
                      : "");
  c.tokenizer_type = "SentencePieceTokenizer";
  c.tokenizer_model = (fs::path(dir) / "tokenizer.model").string();
}

std::vector<std::string> megatron_notes(const MegatronFlags& m, const TrainConfig& c, const TrainConfig& resolved) {
  std::vector<std::string> notes, restating;
  for (const MegatronFlags::Given* g : given_in_order(m))
    if (!refused(g->name)) restating.push_back(with_values(*g));
  if (!restating.empty())
    notes.push_back(fmt::format("accepted, restating what coc always does (coc train --help says how): {}",
                                join(restating, ", ")));
  const std::string& t = c.tokenizer_type;
  if (t == "Llama2Tokenizer" || t == "GPTSentencePieceTokenizer" || t == "PretrainedFromHF" ||
      t == "HuggingFaceTokenizer")
    notes.push_back(fmt::format("--tokenizer-type {}: coc's SentencePieceTokenizer (the same vocabulary and "
                                "end-of-document id; preprocessed data is read as Megatron wrote it)",
                                t));
  // A MoE model's experts have replicas of their own (expert-dp), over which their state is sharded: say so.
  const std::string over = resolved.model.is_moe() ? "the data-parallel ranks, a MoE model's experts over their "
                                                     "expert-data-parallel ranks"
                                                   : "the data-parallel ranks";
  if (m.use_distributed_optimizer)
    notes.push_back(c.data_parallel_sharding_strategy == ShardingStrategy::kNoShard
                        ? fmt::format("--use-distributed-optimizer: --data-parallel-sharding-strategy optim (ZeRO-1: "
                                      "AdamW's state sharded over {}; the same losses)",
                                      over)
                        : "--use-distributed-optimizer: the given --data-parallel-sharding-strategy already shards "
                          "the optimizer");
  if (!m.moe_token_dispatcher_type.empty())
    notes.push_back(fmt::format("--moe-token-dispatcher-type {}: coc's --ep-dispatcher exchanges the tokens (eager "
                                "by default; every dispatcher gives the same result)",
                                m.moe_token_dispatcher_type));
  if (m.moe_router_load_balancing_type == "none")
    notes.push_back("--moe-router-load-balancing-type none: no load-balancing loss (--moe-aux-loss-coeff 0)");
  if (m.max_position_embeddings != 0)
    notes.push_back(fmt::format("--max-position-embeddings {}: RoPE needs no position table (checked >= "
                                "--seq-length)",
                                m.max_position_embeddings));
  return notes;
}

}  // namespace coc::cli
