// coc-test-np: 1 2
// coc-test-timeout: 300
// Activation recomputation (model/transformer_layer.h, Decoder::set_recompute): the chunks of Megatron's methods and
// their errors; a decoder that recomputes gives the loss and every gradient of one that does not, bit for bit, over
// the world as one TP group with and without sequence parallelism, with grouped-query attention and a MoE layer, also
// when the setting changes between steps; the hooks of a recomputed chunk run as a sharded strategy needs them; and
// the activations it keeps shrink as documented.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coc/core/error.h"
#include "coc/model/decoder.h"
#include "decoder_step.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

RecomputeConfig full(RecomputeMethod m, int n) { return {RecomputeGranularity::kFull, m, n}; }
const RecomputeConfig kSelective{RecomputeGranularity::kSelective, std::nullopt, std::nullopt};

std::string chunks_str(const std::vector<LayerChunk>& cs) {
  std::string s;
  for (const LayerChunk& c : cs) s += fmt::format("[{},{}){} ", c.begin, c.end, c.recompute ? "r" : "");
  return s;
}

TEST(RecomputeChunks, FollowMegatronsMethods) {
  EXPECT_EQ(chunks_str(recompute_chunks(5, {})), "[0,1) [1,2) [2,3) [3,4) [4,5) ");
  EXPECT_EQ(chunks_str(recompute_chunks(5, full(RecomputeMethod::kUniform, 2))), "[0,2)r [2,4)r [4,5)r ");
  EXPECT_EQ(chunks_str(recompute_chunks(5, full(RecomputeMethod::kUniform, 5))), "[0,5)r ");
  EXPECT_EQ(chunks_str(recompute_chunks(5, full(RecomputeMethod::kBlock, 2))), "[0,1)r [1,2)r [2,3) [3,4) [4,5) ");
  EXPECT_EQ(chunks_str(recompute_chunks(1, full(RecomputeMethod::kBlock, 1))), "[0,1)r ");
  EXPECT_EQ(chunks_str(recompute_chunks(3, kSelective)), "[0,1) [1,2) [2,3) ");
}

TEST(RecomputeChunks, BadCombinationsAreOneClearError) {
  auto message = [](const RecomputeConfig& r, int layers) {
    try {
      r.validate(layers);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({RecomputeGranularity::kFull, std::nullopt, 1}, 4).find("needs --recompute-method"),
            std::string::npos);
  EXPECT_NE(message(full(RecomputeMethod::kUniform, 0), 4).find("from 1 to --num-layers (4)"), std::string::npos);
  EXPECT_NE(message(full(RecomputeMethod::kBlock, 5), 4).find("--recompute-num-layers 5"), std::string::npos);
  EXPECT_NE(message({RecomputeGranularity::kSelective, std::nullopt, 2}, 4).find("drop --recompute-num-layers"),
            std::string::npos);
  EXPECT_NE(message({RecomputeGranularity::kSelective, RecomputeMethod::kUniform, std::nullopt}, 4)
                .find("drop --recompute-method"),
            std::string::npos);
  EXPECT_NE(message({RecomputeGranularity::kFull, RecomputeMethod::kUniform, std::nullopt}, 4)
                .find("needs --recompute-num-layers N, from 1 to --num-layers (4)"),
            std::string::npos);
  EXPECT_EQ(message({RecomputeGranularity::kNone, RecomputeMethod::kBlock, 9}, 4), "no error");  // not read
  EXPECT_THROW(parse_recompute_granularity("partial"), Error);
  EXPECT_THROW(parse_recompute_method("every"), Error);
  EXPECT_EQ(parse_recompute_granularity("selective"), RecomputeGranularity::kSelective);
  EXPECT_EQ(parse_recompute_method("block"), RecomputeMethod::kBlock);
}

ModelConfig three_layers(int tp) {
  ModelConfig c;
  c.num_layers = 3;
  c.num_attention_heads = 2 * tp;
  c.hidden_size = c.num_attention_heads * 8;
  c.ffn_hidden_size = 12 * tp;
  c.seq_length = 130;  // two attention blocks, the second one partial
  return c;
}

const RecomputeConfig kSettings[] = {full(RecomputeMethod::kUniform, 1), full(RecomputeMethod::kUniform, 2),
                                     full(RecomputeMethod::kBlock, 2), kSelective};

// Deterministic mode with an explicit N, so that the recomputed forward's collectives sum in the first forward's
// order; the pipelines and backward overlaps stay on, as coc train runs them.
void check_same_bits(const ModelConfig& cfg, const ModelGroups& groups, const MoeConfig& moe, bool sp) {
  ParallelContext ctx{groups.tp, sp, {}};
  ctx.coc.parallel_num = 3;
  ctx.coc.deterministic = true;
  ctx.tp_comm_bulk_wgrad = ctx.delay_wgrad_compute = ctx.delay_column_wgrad = true;
  ctx.attention_dense_pipeline = ctx.attention_dense_backward_pipeline = ctx.swiglu_down_pipeline = true;
  ctx.attention_qkv_backward_pipeline = ctx.swiglu_down_backward_pipeline = true;
  Decoder plain(cfg, groups, &ctx, 7, moe);
  const test::Step want = test::decoder_step(plain, 2);
  for (const RecomputeConfig& r : kSettings) {
    SCOPED_TRACE(fmt::format("sp={} {} {} {}", sp, to_string(r.granularity), r.method ? to_string(*r.method) : "",
                             r.num_layers.value_or(0)));
    Decoder model(cfg, groups, &ctx, 7, moe);
    model.set_recompute(r);
    const test::Step got = test::decoder_step(model, 2);
    EXPECT_EQ(got.loss, want.loss);
    EXPECT_TRUE(got.grads == want.grads) << "gradients differ with recomputation";
    // Switched off and on again between steps (coc bench train --baseline): the same bits each time.
    model.set_recompute({});
    EXPECT_TRUE(test::decoder_step(model, 2).grads == want.grads);
    model.set_recompute(r);
    EXPECT_TRUE(test::decoder_step(model, 2).grads == want.grads);
  }
}

TEST(Recompute, GivesTheSameBitsAsKeepingActivations) {
  auto tp = test::world_comm();
  for (bool sp : {false, true}) check_same_bits(three_layers(test::world_size()), {.tp = tp.get()}, {}, sp);
}

TEST(Recompute, GivesTheSameBitsWithGroupedQueryAttention) {
  ModelConfig cfg = three_layers(test::world_size());
  cfg.num_attention_heads = 4 * test::world_size();
  cfg.num_query_groups = test::world_size();
  cfg.hidden_size = cfg.num_attention_heads * 4;
  auto tp = test::world_comm();
  check_same_bits(cfg, {.tp = tp.get()}, {}, true);
}

TEST(Recompute, GivesTheSameBitsWithAMoeLayer) {
  ModelConfig cfg = three_layers(1);
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.moe_ffn_hidden_size = 8;
  cfg.moe_layer_freq = 2;  // layers 0 and 2 are MoE layers, layer 1 dense
  // Each rank its own TP group; the world routes as one expert-parallel group (and makes up the batch).
  auto ep = test::world_comm(), tokens = test::world_comm();
  auto self = std::make_unique<Communicator>(MPI_COMM_SELF, "self",
                                             std::make_shared<ProgressEngine>(EngineKind::kInline, 100), CommOptions{});
  MoeConfig moe;
  moe.aux_loss_coeff = 0.1;
  moe.deterministic = true;
  check_same_bits(cfg, {.tp = self.get(), .ep = ep.get(), .dp_cp = tokens.get()}, moe, false);
}

// A recomputed chunk runs the pre-backward hooks of all its layers (top down) before recomputing, where a sharded
// strategy gathers their parameters once, and runs no forward hooks again (no forward prefetch).
TEST(Recompute, HooksOfARecomputedChunkRunOncePerModule) {
  auto tp = test::world_comm();
  ParallelContext ctx{tp.get(), false, {}};
  ModelConfig cfg = three_layers(test::world_size());
  Decoder model(cfg, {.tp = ctx.tp}, &ctx, 7);
  model.set_recompute(full(RecomputeMethod::kUniform, 2));  // chunks [0, 2) and [2, 3): modules 1-2 and 3
  std::vector<std::string> events;
  const char* names[] = {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd"};
  for (HookPoint point : {HookPoint::kPreForward, HookPoint::kPostForward, HookPoint::kPreBackward,
                          HookPoint::kPostBackward})
    model.add_hook(point, [&events, &names, point](int module) {
      events.push_back(std::string(names[static_cast<int>(point)]) + " " + std::to_string(module));
    });
  test::decoder_step(model, 1);
  std::vector<std::string> want;
  for (int i = 0; i < 5; ++i) {
    want.push_back("pre_fwd " + std::to_string(i));
    want.push_back("post_fwd " + std::to_string(i));
  }
  for (const char* e : {"pre_bwd 4", "post_bwd 4", "pre_bwd 3", "post_bwd 3", "pre_bwd 2", "pre_bwd 1", "post_bwd 2",
                        "post_bwd 1", "pre_bwd 0", "post_bwd 0"})
    want.push_back(e);
  EXPECT_EQ(events, want);
}

// What the memory line reports: full/uniform keeps one layer's activations in a shared slot plus each chunk's input;
// full/block N keeps L - N layers (the recomputed ones borrow a kept layer's buffers) plus N inputs; selective drops
// every layer's attention probabilities but one shared buffer.
TEST(Recompute, KeepsFewerActivations) {
  auto tp = test::world_comm();
  ParallelContext ctx{tp.get(), true, {}};
  ModelConfig cfg = three_layers(test::world_size());
  cfg.num_layers = 4;
  Decoder model(cfg, {.tp = ctx.tp}, &ctx, 7);
  test::decoder_step(model, 2);
  const int64_t none = model.activation_bytes();
  model.set_recompute(full(RecomputeMethod::kUniform, 1));
  test::decoder_step(model, 2);
  const int64_t full1 = model.activation_bytes();
  model.set_recompute(kSelective);
  test::decoder_step(model, 2);
  const int64_t selective = model.activation_bytes();
  model.set_recompute(full(RecomputeMethod::kBlock, 1));
  test::decoder_step(model, 2);
  const int64_t block1 = model.activation_bytes();
  model.set_recompute(full(RecomputeMethod::kBlock, 4));
  test::decoder_step(model, 2);
  EXPECT_EQ(model.activation_bytes(), full1) << "block over every layer is uniform 1";
  EXPECT_LT(full1, none / 2);
  EXPECT_LT(selective, none);
  EXPECT_LT(full1, selective);
  // One layer fewer, one input more (a layer's activations are several times its input).
  EXPECT_LT(block1, none - (none - full1) / 6);
}

}  // namespace
}  // namespace coc
