// coc-test-np: 1 2
// coc-test-timeout: 300
// --bf16 on the decoder (docs/mixed-precision.md): with the GEMMs in bf16, a deterministic run gives the same loss and
// gradients, bit for bit, for every CoC N and with the pipelines and backward overlaps on or off, and with
// recomputation; its logits are bf16 values; its loss and gradients stay near the fp32 model's, within a bound
// stated below; --fp32-residual-connection changes the rounding only.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "coc/core/dtype.h"
#include "coc/kernels/gemm.h"
#include "coc/model/decoder.h"
#include "decoder_step.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

ModelConfig small(int tp) {
  ModelConfig c;
  c.num_layers = 2;
  c.num_attention_heads = 2 * tp;
  c.hidden_size = c.num_attention_heads * 8;
  c.ffn_hidden_size = 12 * tp;
  c.seq_length = 70;  // not a multiple of the attention block, nor of tp · N
  return c;
}

/// Runs the process's GEMMs in `t` while alive, and restores fp32.
struct ComputeType {
  explicit ComputeType(DType t) { set_gemm_compute_type(t); }
  ~ComputeType() { set_gemm_compute_type(DType::kF32); }
};

ParallelContext context(Communicator& tp, bool sp, int n, bool overlaps) {
  ParallelContext ctx{&tp, sp, {}};
  ctx.coc.parallel_num = n;
  ctx.coc.deterministic = true;
  ctx.tp_comm_bulk_wgrad = ctx.delay_wgrad_compute = ctx.delay_column_wgrad = overlaps;
  ctx.attention_dense_pipeline = ctx.attention_dense_backward_pipeline = ctx.swiglu_down_pipeline = overlaps;
  ctx.attention_qkv_backward_pipeline = ctx.swiglu_down_backward_pipeline = overlaps;
  return ctx;
}

bool has_bf16_gemms() { return !onednn_info().bf16_kernel.empty(); }

TEST(Bf16Decoder, SameBitsForEveryNWithAndWithoutOverlapsAndRecompute) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeType bf16(DType::kBF16);
  auto tp = test::world_comm();
  for (bool sp : {false, true}) {
    ParallelContext ref_ctx = context(*tp, sp, 1, false);
    Decoder ref(small(test::world_size()), {.tp = tp.get()}, &ref_ctx, 7);
    const test::Step want = test::decoder_step(ref, 2);
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(testing::Message() << "sp " << sp << " N " << n);
      ParallelContext ctx = context(*tp, sp, n, true);
      Decoder model(small(test::world_size()), {.tp = tp.get()}, &ctx, 7);
      const test::Step got = test::decoder_step(model, 2);
      EXPECT_EQ(got.loss, want.loss);
      EXPECT_TRUE(got.grads == want.grads) << "gradients differ";
      model.set_recompute({RecomputeGranularity::kFull, RecomputeMethod::kUniform, 1});
      EXPECT_TRUE(test::decoder_step(model, 2).grads == want.grads) << "gradients differ with recomputation";
    }
  }
}

// Under --bf16 with local attention qkv's output is scratch shared by every layer, and by every decoder of the
// process (TransformerLayer::qkv_out): nothing reads it after the forward has packed q, k and v. So a model's
// gradients keep their bits when another model of another shape runs its forward and backward between this one's
// forward and backward (which resizes the scratch).
TEST(Bf16Decoder, QkvScratchIsSharedWithoutChangingBits) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeType bf16(DType::kBF16);
  auto tp = test::world_comm();
  ParallelContext ctx = context(*tp, true, 3, true);
  Decoder a(small(test::world_size()), {.tp = tp.get()}, &ctx, 7);
  const test::Step want = test::decoder_step(a, 2);
  ModelConfig other = small(test::world_size());
  other.seq_length = 45;
  Decoder b(other, {.tp = tp.get()}, &ctx, 9);
  const test::FixedBatch batch(a, 2);  // decoder_step's
  for (Param* p : a.params()) p->grad.zero();
  const double loss = a.forward(batch.tokens.data(), batch.targets.data(), 2);
  test::decoder_step(b, 3);
  a.backward(0.5f);
  EXPECT_EQ(loss, want.loss);
  EXPECT_TRUE(test::gradients(a) == want.grads) << "gradients differ";
}

// The bound: each stored activation is within 2^-9 (relative) of the fp32 model's value at that point, and each GEMM
// rounds its inputs likewise, so each layer perturbs its output by a few units of 2^-9 = 2e-3. The gradients pass
// through about ten such roundings (2 layers × (qkv, attention, projection, gate_up, down) and the head): relative
// to their norm, a few times 2e-3, bounded here by 2e-2. The loss at initialisation is ≈ ln 256 with small logits,
// which it barely depends on: 1e-3. Measured on 1 and 2 ranks: 2.6e-6 for the loss, 3.4e-3 for the gradients.
TEST(Bf16Decoder, StaysNearTheFp32Model) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  auto tp = test::world_comm();
  ParallelContext ctx = context(*tp, true, 4, true);
  Decoder fp32_model(small(test::world_size()), {.tp = tp.get()}, &ctx, 7);
  const test::Step want = test::decoder_step(fp32_model, 2);
  test::Step got;
  {
    ComputeType bf16(DType::kBF16);
    Decoder model(small(test::world_size()), {.tp = tp.get()}, &ctx, 7);
    got = test::decoder_step(model, 2);
  }
  EXPECT_LT(std::abs(got.loss - want.loss), 1e-3 * std::abs(want.loss));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    diff += (got.grads[i] - want.grads[i]) * double(got.grads[i] - want.grads[i]);
    norm += want.grads[i] * double(want.grads[i]);
  }
  EXPECT_LT(std::sqrt(diff), 2e-2 * std::sqrt(norm));
  EXPECT_NE(got.loss, want.loss) << "bf16 must round somewhere";
}

TEST(Bf16Decoder, LogitsAreBf16ValuesAndTheResidualCanStayFp32) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeType bf16(DType::kBF16);
  auto tp = test::world_comm();
  ParallelContext ctx = context(*tp, false, 1, false);
  Decoder model(small(test::world_size()), {.tp = tp.get()}, &ctx, 7);
  const int32_t prompt[] = {5, 77, 200, 3};
  for (float v : model.next_token_logits(prompt, 4)) ASSERT_EQ(v, bf16_to_float(float_to_bf16(v)));
  ModelConfig wide = small(test::world_size());
  wide.fp32_residual_connection = true;
  Decoder fp32_residual(wide, {.tp = tp.get()}, &ctx, 7);
  const double a = test::decoder_step(model, 2).loss, b = test::decoder_step(fp32_residual, 2).loss;
  EXPECT_NE(a, b) << "the residual stream's rounding is a real difference";
  EXPECT_LT(std::abs(a - b), 1e-2 * std::abs(a));
}

}  // namespace
}  // namespace coc
