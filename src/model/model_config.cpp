#include "coc/model/model_config.h"

#include <cmath>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "coc/comm/communicator.h"
#include "coc/core/error.h"

namespace coc {

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size, f = ffn_hidden_size;
  const int64_t kv = kv_heads() * head_dim();
  const int64_t per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h;
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < num_layers; ++i) moe_layers += moe_layer(i) ? 1 : 0;
  // A MoE layer's MLP: E experts of 3·h·F_e plus the [E, h] router, instead of the dense 3·h·f.
  const int64_t moe_delta = num_experts * (3 * h * moe_ffn() + h) - 3 * h * f;
  return num_layers * per_layer + moe_layers * moe_delta + 2 * vocab_size * h + h;
}

double ModelConfig::num_floating_point_operations(int64_t batch) const {
  const double h = static_cast<double>(hidden_size), S = static_cast<double>(seq_length);
  const double q = static_cast<double>(num_attention_heads * head_dim());
  const double kv = static_cast<double>(kv_heads() * head_dim());
  double moe_layers = 0;
  for (int64_t i = 0; i < num_layers; ++i) moe_layers += moe_layer(i) ? 1 : 0;
  const double dense_layers = static_cast<double>(num_layers) - moe_layers;
  constexpr double kPasses = 3, kFma = 2, kSwiglu = 3;  // Megatron's three expansion factors
  const double mlp = h * (static_cast<double>(ffn_hidden_size) * kSwiglu * dense_layers +
                          static_cast<double>(moe_ffn() * moe_router_topk) * kSwiglu * moe_layers);
  const double attention = h * (q + 2 * kv) + q * S / 2 * 2 + q * h;
  const double logits = h * static_cast<double>(vocab_size);
  return static_cast<double>(batch) * S * kPasses * kFma *
         (mlp + attention * static_cast<double>(num_layers) + logits);
}

void ModelConfig::validate(int tp) const {
  if (num_layers < 1) throw_invalid("--num-layers must be >= 1 (got {})", num_layers);
  if (hidden_size < 1 || num_attention_heads < 1 || ffn_hidden_size < 1)
    throw_invalid("--hidden-size, --num-attention-heads and --ffn-hidden-size must be >= 1 (got {}, {}, {})",
                  hidden_size, num_attention_heads, ffn_hidden_size);
  if (seq_length < 1) throw_invalid("--seq-length must be >= 1 (got {})", seq_length);
  if (hidden_size % num_attention_heads != 0)
    throw_invalid("--hidden-size {} is not divisible by --num-attention-heads {}; pick heads that divide the hidden "
                  "size",
                  hidden_size, num_attention_heads);
  if (head_dim() % 2 != 0)
    throw_invalid("head dim {} (= --hidden-size / --num-attention-heads) must be even for rotary embeddings",
                  head_dim());
  if (num_attention_heads % tp != 0)
    throw_invalid("--num-attention-heads {} is not divisible by --tensor-model-parallel-size {}; use a tp that "
                  "divides the head count (e.g. {}) or change the heads",
                  num_attention_heads, tp, num_attention_heads % 2 == 0 ? 2 : 1);
  if (num_query_groups < 0 || (num_query_groups > 0 && num_attention_heads % num_query_groups != 0))
    throw_invalid("--num-query-groups {} does not divide --num-attention-heads {}; pick a number of key/value groups "
                  "that divides the heads",
                  num_query_groups, num_attention_heads);
  if (kv_heads() % tp != 0)
    throw_invalid("--num-query-groups {} is not divisible by --tensor-model-parallel-size {}: each TP rank needs whole "
                  "key/value groups; use a tp that divides {} or more query groups",
                  kv_heads(), tp, kv_heads());
  if (vocab_size < tp)
    throw_invalid("the vocabulary of {} tokens cannot be split over --tensor-model-parallel-size {}: a rank would hold "
                  "no row; use a smaller tp",
                  vocab_size, tp);
  if (hidden_size % tp != 0)
    throw_invalid("--hidden-size {} is not divisible by --tensor-model-parallel-size {}", hidden_size, tp);
  if (ffn_hidden_size % tp != 0)
    throw_invalid("--ffn-hidden-size {} is not divisible by --tensor-model-parallel-size {}; use a multiple of {}",
                  ffn_hidden_size, tp, tp);
  if (!(norm_epsilon > 0)) throw_invalid("--norm-epsilon must be > 0 (got {})", norm_epsilon);
  if (!(rotary_base > 1)) throw_invalid("--rotary-base must be > 1 (got {}); RoPE's usual base is 10000", rotary_base);
  if (num_experts < 0) throw_invalid("--num-experts must be >= 0 (got {}; 0: a dense model)", num_experts);
  if (is_moe()) {
    if (moe_router_topk < 1 || moe_router_topk > num_experts)
      throw_invalid("--moe-router-topk {} must be in [1, --num-experts {}]", moe_router_topk, num_experts);
    if (moe_ffn_hidden_size < 0)
      throw_invalid("--moe-ffn-hidden-size must be >= 1 (got {}; 0: --ffn-hidden-size)", moe_ffn_hidden_size);
    if (moe_layer_freq < 1) throw_invalid("--moe-layer-freq must be >= 1 (got {})", moe_layer_freq);
    if (moe_first_k_dense < 0 || moe_first_k_dense >= num_layers)
      throw_invalid("--first-k-dense-replace {} must be in [0, --num-layers {}): at least one layer must be MoE",
                    moe_first_k_dense, num_layers);
  }
  if (!(init_method_std >= 0) || !std::isfinite(init_method_std))
    throw_invalid("--init-method-std must be a finite number >= 0 (got {}); Megatron's default is 0.02", init_method_std);
}

uint64_t ModelConfig::hash() const {
  const int64_t f[] = {num_layers, hidden_size, num_attention_heads, ffn_hidden_size, vocab_size, kv_heads()};
  // Multi-head attention hashes as it did before GQA existed, so older checkpoints still load; likewise a dense
  // model as before MoE.
  const uint64_t h = fnv1a(f, kv_heads() == num_attention_heads ? sizeof(f) - sizeof(int64_t) : sizeof(f));
  if (!is_moe()) return h;
  // A first-k-dense layout hashes its K after the rest, so that MoE checkpoints without it still load.
  const int64_t m[] = {static_cast<int64_t>(h), num_experts, moe_router_topk, moe_ffn(), moe_layer_freq,
                       moe_first_k_dense};
  return fnv1a(m, moe_first_k_dense == 0 ? sizeof(m) - sizeof(int64_t) : sizeof(m));
}

std::string ModelConfig::shape_flags() const {
  std::string s = fmt::format("--num-layers {} --hidden-size {} --num-attention-heads {} --ffn-hidden-size {}",
                              num_layers, hidden_size, num_attention_heads, ffn_hidden_size);
  if (kv_heads() != num_attention_heads) s += fmt::format(" --group-query-attention --num-query-groups {}", kv_heads());
  if (is_moe())
    s += fmt::format(" --num-experts {} --moe-router-topk {} --moe-ffn-hidden-size {} --moe-layer-freq {}",
                     num_experts, moe_router_topk, moe_ffn(), moe_layer_freq);
  if (is_moe() && moe_first_k_dense > 0) s += fmt::format(" --first-k-dense-replace {}", moe_first_k_dense);
  if (vocab_size != 256) s += fmt::format(" (vocabulary {})", vocab_size);
  return s;
}

/// A float as the double with the same shortest decimal form (1e-5f → 1e-05, not 9.99999974737875e-06), so that
/// JSON readers see the value the user typed.
double decimal(float f) { return std::stod(fmt::format("{}", f)); }

std::string model_config_json(const ModelConfig& c) {
  nlohmann::json j{{"num_layers", c.num_layers},           {"hidden_size", c.hidden_size},
                   {"num_attention_heads", c.num_attention_heads}, {"num_query_groups", c.kv_heads()},
                   {"ffn_hidden_size", c.ffn_hidden_size}, {"vocab_size", c.vocab_size},
                   {"norm_epsilon", decimal(c.norm_epsilon)}, {"rotary_base", decimal(c.rotary_base)},
                   {"seq_length", c.seq_length}};
  if (c.is_moe()) {  // Megatron's argument names; absent for a dense model
    j["num_experts"] = c.num_experts;
    j["moe_router_topk"] = c.moe_router_topk;
    j["moe_ffn_hidden_size"] = c.moe_ffn();
    j["moe_layer_freq"] = c.moe_layer_freq;
    if (c.moe_first_k_dense > 0) j["first_k_dense_replace"] = c.moe_first_k_dense;  // MindSpeed-LLM's name
  }
  return j.dump();
}

ModelConfig model_config_from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) throw_invalid("the model config '{}' is not a JSON object", text.substr(0, 80));
  ModelConfig c;
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key) || !j[key].is_number())
      throw_invalid("the model config lacks the number '{}' (it holds {})", key, text.substr(0, 200));
    field = j[key].get<std::remove_reference_t<decltype(field)>>();
  };
  get("num_layers", c.num_layers);
  get("hidden_size", c.hidden_size);
  get("num_attention_heads", c.num_attention_heads);
  get("num_query_groups", c.num_query_groups);
  get("ffn_hidden_size", c.ffn_hidden_size);
  get("vocab_size", c.vocab_size);
  get("norm_epsilon", c.norm_epsilon);
  get("rotary_base", c.rotary_base);
  get("seq_length", c.seq_length);
  if (j.contains("num_experts")) {
    get("num_experts", c.num_experts);
    get("moe_router_topk", c.moe_router_topk);
    get("moe_ffn_hidden_size", c.moe_ffn_hidden_size);
    get("moe_layer_freq", c.moe_layer_freq);
    if (j.contains("first_k_dense_replace")) get("first_k_dense_replace", c.moe_first_k_dense);
  }
  if (c.num_query_groups == c.num_attention_heads) c.num_query_groups = 0;
  return c;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") return c;
  if (name == "tiny-moe") {
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 256;
    return c;
  }
  if (name == "llama2-7b-layer") {
    c.num_layers = 1;
    c.hidden_size = 4096;
    c.num_attention_heads = 32;
    c.ffn_hidden_size = 11008;
    c.seq_length = 256;
    return c;
  }
  throw_invalid("unknown --model-preset '{}'; choose 'tiny' (default), 'tiny-moe' or 'llama2-7b-layer'", name);
}

}  // namespace coc
