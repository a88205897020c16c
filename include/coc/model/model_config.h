// Shapes of the LLaMA-style decoder (Megatron/MindSpeed-LLM argument names) and the built-in presets.
#pragma once

#include <cstdint>
#include <string>

namespace coc {

struct ModelConfig {
  int64_t num_layers = 3;            ///< --num-layers
  int64_t hidden_size = 192;         ///< --hidden-size (H)
  int64_t num_attention_heads = 6;   ///< --num-attention-heads; head_dim = H / heads
  int64_t ffn_hidden_size = 512;     ///< --ffn-hidden-size (SwiGLU inner width F)
  int64_t seq_length = 128;          ///< --seq-length (S)
  int64_t vocab_size = 256;          ///< the tokenizer's vocabulary, padded (--make-vocab-size-divisible-by)
  /// --num-query-groups G with --group-query-attention (Ainslie et al. 2023): G key/value heads, each shared by
  /// heads / G query heads; 0 = one per query head (multi-head attention).
  int64_t num_query_groups = 0;
  float norm_epsilon = 1e-5f;        ///< --norm-epsilon (RMSNorm)
  float rotary_base = 10000.0f;      ///< --rotary-base (RoPE theta)
  float init_method_std = 0.02f;     ///< --init-method-std
  /// --fp32-residual-connection (Megatron's): under --bf16 the residual stream keeps fp32 values; otherwise it holds
  /// bf16 values, as a bf16 Megatron model's does. No effect in fp32.
  bool fp32_residual_connection = false;
  // Mixture of experts (parallel/moe.h, docs/semantics.md §6): the MLP of every --moe-layer-freq-th layer (layer i
  // with i % freq == 0, Megatron's integer form) is a MoeLayer of E SwiGLU experts; 0 experts: a dense model.
  int64_t num_experts = 0;           ///< --num-experts E
  int64_t moe_router_topk = 2;       ///< --moe-router-topk K
  int64_t moe_ffn_hidden_size = 0;   ///< --moe-ffn-hidden-size: each expert's SwiGLU width (0: --ffn-hidden-size)
  int64_t moe_layer_freq = 1;        ///< --moe-layer-freq
  /// --first-k-dense-replace K (MindSpeed-LLM's, DeepSeek's layout): layers 0 .. K-1 keep a dense MLP.
  int64_t moe_first_k_dense = 0;
  bool is_moe() const { return num_experts > 0; }
  /// Whether layer `i` (0-based) has a MoE MLP.
  bool moe_layer(int64_t i) const { return is_moe() && i >= moe_first_k_dense && i % moe_layer_freq == 0; }
  int64_t moe_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Key/value heads: num_query_groups, or num_attention_heads without GQA.
  int64_t kv_heads() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  /// Parameter count of the full (unsharded) model.
  int64_t num_parameters() const;
  /// Floating-point operations of one training iteration (forward and backward) over `batch` sequences of
  /// seq_length tokens: Megatron-LM's num_floating_point_operations (megatron/training/training.py, its
  /// transformer_flops for a GPT model with --swiglu, GQA, MoE routed to top-K experts, no shared experts, no MTP):
  /// 3 (forward, weight and data gradients) × 2 (multiply-add) × [h·(3·F) per dense MLP, h·(3·F_e·K) per MoE MLP,
  /// h·(q + 2·kv) + q·S (causal half of QK^T and PV) + q·h per attention, h·V for the logits] per token, with
  /// q = heads·head_dim, kv = groups·head_dim and V the padded vocabulary. Model FLOPs: recomputation is not counted,
  /// and the general (non-causal) mask counts as causal, as in Megatron. Units: FLOPs (a double; 7B-sized batches
  /// overflow no int64 but need no exactness). `batch` >= 0.
  double num_floating_point_operations(int64_t batch) const;
  /// Checks the shapes against tp; throws a uniform kInvalidArgument error naming the flag and the fix
  /// ("--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3; ...").
  void validate(int tp) const;
  /// Stable hash of every shape field (checkpoint compatibility, cross-rank agreement).
  uint64_t hash() const;
  /// The flags behind hash(), as a user would type them: "--num-layers 3 --hidden-size 192 ..." (and the vocabulary
  /// when it is not 256). Quoted in checkpoints so that a mismatch can name what to pass.
  std::string shape_flags() const;
};

/// The shape fields as a JSON object ({"num_layers": 3, ...}), recorded in checkpoints so that `coc convert` can
/// rebuild the full weights without flags.
std::string model_config_json(const ModelConfig& c);
/// `f` as the double of its shortest decimal form (1e-5f → 1e-05): what a JSON file should record for a float flag.
double decimal(float f);
/// Parses model_config_json's text. Errors (uniform kInvalidArgument): not such an object, naming the field.
ModelConfig model_config_from_json(const std::string& text);

/// "tiny" (default: 3 layers, H 192, 6 heads, F 512; trains on fortunes in about a minute on 2 ranks), "tiny-moe"
/// (tiny with a MoE MLP in every layer: 4 experts of width 256, top-2) or "llama2-7b-layer" (one LLaMA2-7B layer:
/// H 4096, 32 heads, F 11008, scaled down in tokens only, for benchmarking). Throws for an unknown name.
ModelConfig model_preset(const std::string& name);

}  // namespace coc
