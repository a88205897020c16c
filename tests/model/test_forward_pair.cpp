// coc-test-np: 1 2 3
// coc-test-timeout: 600
// Decoder::forward_pair (--overlap-forward-micro-batches): two micro-batches' forwards interleaved layer by layer,
// each filling the other's TP waits with its attention and SwiGLU, then each one's head and backward in order, give
// the bits of the sequential forward, backward, forward, backward: both losses and every gradient. Over sequences of
// 130 positions (two attention blocks, the second partial) and 3 sequences per micro-batch, so the CoC chunks cut
// through blocks and batch items; with sequence parallelism on and off, N = 1, 3 and auto, the forward pipelines
// (--attention-dense-pipeline, --swiglu-down-pipeline) on and off, both progress engines, fp32 and bf16, and
// grouped-query attention.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

#include "coc/kernels/gemm.h"
#include "coc/model/decoder.h"
#include "coc/overlap/coc_ops.h"
#include "decoder_step.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

ModelConfig config(int tp, bool gqa) {
  ModelConfig c;
  c.num_layers = 2;
  c.num_attention_heads = (gqa ? 4 : 2) * tp;
  if (gqa) c.num_query_groups = 2 * tp;
  c.hidden_size = c.num_attention_heads * 8;
  c.ffn_hidden_size = 14 * tp;  // 7 columns of gate and of up per rank
  c.seq_length = 130;
  return c;
}

constexpr int64_t kBatch = 3;

/// Micro-batch `k`'s ids: (37·i + 11 + 29·k) mod 256 and (53·i + 5 + 13·k) mod 256.
struct MicroBatch {
  std::vector<int32_t> tokens, targets;
  MicroBatch(const ModelConfig& c, int k) {
    for (int64_t i = 0; i < c.seq_length * kBatch; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 37 + 11 + 29 * k) % 256));
      targets.push_back(static_cast<int32_t>((i * 53 + 5 + 13 * k) % 256));
    }
  }
};

struct TwoSteps {
  double loss[2] = {0, 0};
  std::vector<float> grads;
};

TwoSteps sequential(Decoder& model, const MicroBatch (&mb)[2]) {
  for (Param* p : model.params()) p->grad.zero();
  TwoSteps s;
  for (int k = 0; k < 2; ++k) {
    s.loss[k] = model.forward(mb[k].tokens.data(), mb[k].targets.data(), kBatch);
    model.backward(0.5f);
  }
  s.grads = test::gradients(model);
  return s;
}

TwoSteps paired(Decoder& model, const MicroBatch (&mb)[2]) {
  for (Param* p : model.params()) p->grad.zero();
  TwoSteps s;
  model.forward_pair(mb[0].tokens.data(), mb[0].targets.data(), mb[1].tokens.data(), mb[1].targets.data(), kBatch);
  for (int k = 0; k < 2; ++k) {
    s.loss[k] = model.forward_head(k);
    model.backward_stage(0, k, {}, 0.5f, {});
  }
  s.grads = test::gradients(model);
  return s;
}

void check_same_bits(bool gqa, DType compute) {
  set_gemm_compute_type(compute);
  for (EngineKind engine : {EngineKind::kInline, EngineKind::kThread}) {
    // A communicator per engine, freed after its loop: the next one may take its address on some ranks only, which
    // the auto schedule's cache must not mistake for the old one (it keys on Communicator::serial).
    const std::unique_ptr<Communicator> comm = test::world_comm(engine);
    Communicator* tp = comm.get();
    const ModelConfig cfg = config(tp->size(), gqa);
    const MicroBatch mb[2] = {MicroBatch(cfg, 0), MicroBatch(cfg, 1)};
    for (bool sp : {false, true})
      for (int n : {1, 3, CocOptions::kAuto})
        for (bool pipelines : {false, true}) {
          SCOPED_TRACE(fmt::format("engine {} sp {} N {} pipelines {}", to_string(engine), sp, n, pipelines));
          ParallelContext ctx{tp, sp, {}};
          ctx.coc.parallel_num = n;
          // auto's choice may be timed: deterministic mode fixes it (and its tiles) for both runs.
          ctx.coc.deterministic = n == CocOptions::kAuto;
          ctx.attention_dense_pipeline = ctx.swiglu_down_pipeline = pipelines;
          Decoder model(cfg, {.tp = tp}, &ctx, 11);
          model.set_pipeline_slots(0, 2);
          const TwoSteps want = sequential(model, mb);
          const TwoSteps got = paired(model, mb);
          EXPECT_EQ(got.loss[0], want.loss[0]);
          EXPECT_EQ(got.loss[1], want.loss[1]);
          EXPECT_NE(got.loss[0], got.loss[1]) << "the two micro-batches should differ";
          EXPECT_TRUE(got.grads == want.grads) << "gradients differ";
          // The layers are back on slot 0: a plain step after the pair gives its usual bits.
          EXPECT_TRUE(sequential(model, mb).grads == want.grads) << "a sequential step after the pair differs";
        }
  }
  set_gemm_compute_type(DType::kF32);
}

bool has_bf16_gemms() { return !onednn_info().bf16_kernel.empty(); }

// reserve_activations after set_pipeline_slots(0, 2) sizes the second micro-batch's slot as well (what the trainer
// does under --overlap-forward-micro-batches): the paired step after it writes into pages that are there already,
// with the bits of a model that reserved nothing.
TEST(ForwardPair, ReservedSecondSlotLeavesTheStepFewPageFaults) {
  const std::unique_ptr<Communicator> comm = test::world_comm();
  Communicator* tp = comm.get();
  ModelConfig cfg = config(tp->size(), false);
  cfg.seq_length = 512;  // ~6 MiB of attention probabilities per layer and micro-batch
  const MicroBatch mb[2] = {MicroBatch(cfg, 0), MicroBatch(cfg, 1)};
  ParallelContext ctx{tp, true, {}};
  Decoder fresh(cfg, {.tp = tp}, &ctx, 11);  // also the process's first step: BLAS's and the kernels' own buffers
  fresh.set_pipeline_slots(0, 2);
  const TwoSteps want = paired(fresh, mb);

  Decoder reserved(cfg, {.tp = tp}, &ctx, 11);
  reserved.set_pipeline_slots(0, 2);
  long before = test::minor_faults();
  reserved.reserve_activations(kBatch);
  const long reserve_faults = test::minor_faults() - before;
  before = test::minor_faults();
  const TwoSteps got = paired(reserved, mb);
  const long step_faults = test::minor_faults() - before;
  EXPECT_EQ(got.loss[0], want.loss[0]);
  EXPECT_EQ(got.loss[1], want.loss[1]);
  EXPECT_TRUE(got.grads == want.grads) << "gradients differ";
  test::expect_few_page_faults(step_faults, reserve_faults, "the paired step");
}

TEST(ForwardPair, SameBitsAsSequentialFp32) { check_same_bits(false, DType::kF32); }

TEST(ForwardPair, SameBitsAsSequentialGqaFp32) { check_same_bits(true, DType::kF32); }

TEST(ForwardPair, SameBitsAsSequentialBf16) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  check_same_bits(false, DType::kBF16);
  check_same_bits(true, DType::kBF16);
}

}  // namespace
}  // namespace coc
