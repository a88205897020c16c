// ModelConfig::num_floating_point_operations against Megatron-LM's num_floating_point_operations
// (megatron/training/training.py), evaluated by hand for the shapes below: the per-token terms written out as
// Megatron's code adds them, so that a change of coc's formula shows here.
#include <gtest/gtest.h>

#include "coc/model/model_config.h"

namespace coc {
namespace {

// Megatron's transformer_flops for --swiglu, no MLA, no MTP, no shared experts, written term by term.
double megatron_flops(int64_t B, int64_t S, int64_t L, int64_t h, int64_t heads, int64_t groups, int64_t ffn,
                      int64_t V, int64_t dense_layers, int64_t moe_layers, int64_t moe_ffn, int64_t topk) {
  const double kv_channels = static_cast<double>(h) / heads;
  const double qp = kv_channels * heads, kp = kv_channels * groups, vp = kv_channels * groups;
  const double self_attn = 3.0 * 2 * (h * (qp + kp + vp) + qp * S / 2 * 2 + qp * h);
  const double mlp = 3.0 * 2 * h * (ffn * 3.0 * dense_layers + moe_ffn * topk * 3.0 * moe_layers);
  return static_cast<double>(B) * S * (mlp + self_attn * L + 3.0 * 2 * h * V);
}

TEST(ModelFlops, DenseTinyModelIsMegatrons) {
  ModelConfig c;  // 3 layers, hidden 192, 6 heads, ffn 512, seq 128, vocab 256
  EXPECT_DOUBLE_EQ(c.num_floating_point_operations(16), megatron_flops(16, 128, 3, 192, 6, 6, 512, 256, 3, 0, 0, 0));
  // The dominant term by itself: 6 · params · tokens is within 30% for this shape (attention's S² adds the rest).
  const double six_nd = 6.0 * static_cast<double>(c.num_parameters()) * 16 * 128;
  EXPECT_GT(c.num_floating_point_operations(16), 0.7 * six_nd);
  EXPECT_LT(c.num_floating_point_operations(16), 1.6 * six_nd);
}

TEST(ModelFlops, GroupedQueryAttentionCountsTheSmallerKeyValueProjections) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 4096;
  c.num_attention_heads = 32;
  c.num_query_groups = 8;
  c.ffn_hidden_size = 11008;
  c.seq_length = 4096;
  c.vocab_size = 32000;
  EXPECT_DOUBLE_EQ(c.num_floating_point_operations(4),
                   megatron_flops(4, 4096, 2, 4096, 32, 8, 11008, 32000, 2, 0, 0, 0));
  ModelConfig mha = c;
  mha.num_query_groups = 0;
  EXPECT_LT(c.num_floating_point_operations(4), mha.num_floating_point_operations(4));
}

TEST(ModelFlops, MoeLayersCountTopKExpertsOfTheirWidth) {
  ModelConfig c;
  c.num_layers = 4;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 256;
  c.moe_layer_freq = 2;       // layers 0 and 2
  c.moe_first_k_dense = 1;    // ... from layer 1: layer 2 only
  EXPECT_DOUBLE_EQ(c.num_floating_point_operations(8), megatron_flops(8, 128, 4, 192, 6, 6, 512, 256, 3, 1, 256, 2));
  EXPECT_EQ(c.num_floating_point_operations(0), 0.0);
}

}  // namespace
}  // namespace coc
