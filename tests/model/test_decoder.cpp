// coc-test-np: 1 2 3 4
// coc-test-timeout: 300
// The tensor-parallel decoder against itself at tp = 1 (on MPI_COMM_SELF): same loss and, shard by shard, the
// same gradients, with sequence parallelism on and off, N ∈ {1, 4}, both vocabulary communications
// (--vocab-parallel-comm) and the overlaps (--tp-comm-bulk-wgrad, --delay-wgrad-compute, --delay-column-wgrad and the
// four pipelines: --attention-dense-pipeline, --attention-dense-backward-pipeline, --swiglu-down-pipeline,
// --attention-qkv-backward-pipeline) off and on; the pipelines also against themselves off, over sequences of several attention blocks. At tp = 1 its backward
// is checked against central finite differences of the loss. Initialisation is identical for any tp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "coc/core/error.h"
#include "coc/model/decoder.h"
#include "coc/overlap/partition.h"
#include "decoder_step.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

ModelConfig small_config(int tp) {
  ModelConfig c;
  c.num_layers = 2;
  c.num_attention_heads = tp == 3 ? 6 : 4;
  c.hidden_size = c.num_attention_heads * 8;
  c.ffn_hidden_size = 12 * tp;
  c.seq_length = 9;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(int64_t m) {
  Batch b;
  for (int64_t i = 0; i < m; ++i) {
    b.tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
    b.targets.push_back(static_cast<int32_t>((i * 53 + 5) % 256));
  }
  return b;
}

std::unique_ptr<Communicator> self_comm() {
  return std::make_unique<Communicator>(MPI_COMM_SELF, "self", std::make_shared<ProgressEngine>(EngineKind::kInline, 100),
                                        CommOptions{});
}

/// Value of element (i, j) of the full parameter `name` seen from a shard, or nullopt if this rank lacks it.
/// Uses the layers' shard maps: column layers hold rows, row layers hold columns, vocab tables hold rows.
struct ShardMap {
  std::map<std::string, std::vector<int64_t>> rows;  // full row index of each local row
  std::map<std::string, int64_t> col_begin;           // row-parallel: first full column
};

/// Grouped-query attention: two query heads per key/value group, tp whole groups per rank.
ModelConfig gqa_config(int tp) {
  ModelConfig c = small_config(tp);
  c.num_attention_heads = 2 * tp;
  c.num_query_groups = tp;
  c.hidden_size = c.num_attention_heads * 8;
  return c;
}

/// The decoder of `cfg` on every rank of the world as one TP group against the same model on MPI_COMM_SELF.
void check_tensor_parallel_matches_single_rank(const ModelConfig& cfg) {
  const int T = test::world_size();
  auto tp = test::world_comm();
  auto self = self_comm();
  const int64_t batch = 2, m = cfg.seq_length * batch;
  Batch b = make_batch(m);
  for (bool sp : {false, true})
    for (int N : {1, 4})
      for (VocabComm vocab : {VocabComm::kActivations, VocabComm::kWeights})
        for (bool overlaps : {false, true}) {
          SCOPED_TRACE(fmt::format("sp={} N={} vocab={} backward overlaps={}", sp, N, to_string(vocab), overlaps));
          ParallelContext ref_ctx{self.get(), false, {}};
          Decoder ref(cfg, {.tp = ref_ctx.tp}, &ref_ctx, 42);
          const double ref_loss = ref.forward(b.tokens.data(), b.targets.data(), batch);
          ref.backward(1.0f);
          ParallelContext ctx{tp.get(), sp, {}};
          ctx.coc.parallel_num = N;
          ctx.vocab_comm = vocab;
          ctx.tp_comm_bulk_wgrad = ctx.delay_wgrad_compute = ctx.delay_column_wgrad = overlaps;
          ctx.attention_dense_pipeline = ctx.attention_dense_backward_pipeline = ctx.swiglu_down_pipeline = overlaps;
          ctx.attention_qkv_backward_pipeline = ctx.swiglu_down_backward_pipeline = overlaps;
          Decoder model(cfg, {.tp = ctx.tp}, &ctx, 42);
          const double loss = model.forward(b.tokens.data(), b.targets.data(), batch);
          model.backward(1.0f);
          EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
          // Norm-weight gradients under SP are partial sums; the trainer all-reduces them over TP.
          std::map<std::string, Param*> full;
          for (Param* p : ref.params()) full[p->name] = p;
          for (Param* p : model.params()) {
            if (p->placement.tp_partial_grad)
              tp->all_reduce(p->grad.data(), p->grad.numel(), ReduceOp::kSum, "test sp grad").wait();
            const Param* f = full.at(p->name);
            const bool is_row = p->name.find("dense") != std::string::npos || p->name.find("down") != std::string::npos;
            const int64_t cols = p->value.ndim() == 2 ? p->value.dim(1) : 1;
            const int64_t fcols = f->value.ndim() == 2 ? f->value.dim(1) : 1;
            double max_err = 0, scale = 1e-30;
            for (int64_t i = 0; i < p->value.numel(); ++i) {
              const int64_t r = i / cols, c = i % cols;
              int64_t fr = r, fc = c;
              if (is_row) {
                fc = split_rows(fcols, T, tp->rank()).begin + c;
              } else if (p->name.find("qkv") != std::string::npos) {
                fr = qkv_row_map(cfg, T, tp->rank())[static_cast<size_t>(r)];
              } else if (p->name.find("gate_up") != std::string::npos) {
                fr = gate_up_row_map(cfg, T, tp->rank())[static_cast<size_t>(r)];
              } else if (p->value.ndim() == 2) {
                fr = split_rows(f->value.dim(0), T, tp->rank()).begin + r;
              }
              const int64_t fi = fr * fcols + fc;
              ASSERT_EQ(p->value[i], f->value[fi]) << p->name << ": init differs from tp=1 at " << i;
              max_err = std::max(max_err, static_cast<double>(std::fabs(p->grad[i] - f->grad[fi])));
              scale = std::max(scale, static_cast<double>(std::fabs(f->grad[fi])));
            }
            EXPECT_LE(max_err / scale, 2e-5) << p->name;
          }
        }
}

TEST(Decoder, TensorParallelMatchesSingleRank) { check_tensor_parallel_matches_single_rank(small_config(test::world_size())); }

bool ctx_deterministic(int variant) { return variant % 3 >= 1; }

// The four pipelines compute attention and SwiGLU block by block or row by row as the projections ask for rows,
// and attention's backward as the output projection's backward hands rows out and as qkv's backward asks for rows
// (last rows first): at S = 300 (three blocks of 128 positions, the last one partial), B = 3, the chunks of the
// projections' ops cut through blocks and batch items, and so do the SP shards (450 rows each at tp 2) the
// backward's gather segments. Against the run with the four pipelines off: the collective schedules with and without deterministic mode, the point-to-point ones in it, each
// with and without the backward overlaps; N = 1, 3, 8 and auto; SP on and off. The loss must have the same bits, and
// so must every gradient except outside deterministic mode with SP or auto, where they must agree closely.
void check_pipelines_give_the_same_bits(ModelConfig cfg) {
  auto tp = test::world_comm();
  cfg.seq_length = 300;
  cfg.num_layers = 1;
  const int64_t batch = 3;
  Batch b = make_batch(cfg.seq_length * batch);
  for (bool sp : {false, true})
    for (int N : {1, 3, 8, CocOptions::kAuto})
      for (int variant = 0; variant < 6; ++variant) {
        // Variants 3-5: with the backward overlaps, whose queued weight gradient then runs under the gather's
        // first segments.
        const bool overlaps = variant >= 3;
        SCOPED_TRACE(fmt::format("sp={} N={} variant={}", sp, N, variant));
        std::vector<std::vector<float>> grads[2];
        double loss[2] = {0, 0};
        for (int on = 0; on < 2; ++on) {
          ParallelContext ctx{tp.get(), sp, {}};
          ctx.coc.parallel_num = N;
          // The point-to-point schedules' own bits depend on arrival times outside deterministic mode.
          ctx.coc.comm_algo = variant % 3 == 1 ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
          ctx.coc.deterministic = ctx_deterministic(variant);
          ctx.tp_comm_bulk_wgrad = ctx.delay_wgrad_compute = ctx.delay_column_wgrad = overlaps;
          ctx.attention_dense_pipeline = ctx.attention_dense_backward_pipeline = ctx.swiglu_down_pipeline = on == 1;
          ctx.attention_qkv_backward_pipeline = ctx.swiglu_down_backward_pipeline = on == 1;
          Decoder model(cfg, {.tp = ctx.tp}, &ctx, 7);
          loss[on] = model.forward(b.tokens.data(), b.targets.data(), batch);
          model.backward(1.0f);
          for (Param* p : model.params()) grads[on].emplace_back(p->grad.data(), p->grad.data() + p->grad.numel());
        }
        EXPECT_EQ(loss[0], loss[1]);
        if (ctx_deterministic(variant) || (!sp && N != CocOptions::kAuto) || test::world_size() == 1) {
          EXPECT_TRUE(grads[0] == grads[1]) << "gradients differ with the attention pipeline";
        } else {
          // The backward's segmented gather splits the projection's dX GEMM by rows, which OpenBLAS may round
          // differently outside deterministic mode's fixed tiles (as between values of N); under auto qkv's
          // backward takes one chunk per attention block on, and auto's choice off, and MPI may sum an all-reduce
          // of another size in another order.
          ASSERT_EQ(grads[0].size(), grads[1].size());
          for (size_t i = 0; i < grads[0].size(); ++i)
            for (size_t j = 0; j < grads[0][i].size(); ++j)
              ASSERT_NEAR(grads[0][i][j], grads[1][i][j], 1e-5 + 1e-4 * std::abs(grads[0][i][j]))
                  << "parameter " << i << " element " << j;
        }
      }
}

TEST(Decoder, PipelinesGiveTheSameBits) { check_pipelines_give_the_same_bits(small_config(test::world_size())); }

// Grouped-query attention: dK and dV per query head accumulate across the backward's block calls, then sum per group.
TEST(Decoder, PipelinesGiveTheSameBitsWithGroupedQueryAttention) {
  check_pipelines_give_the_same_bits(gqa_config(test::world_size()));
}

TEST(Decoder, GroupedQueryAttentionTensorParallelMatchesSingleRank) {
  check_tensor_parallel_matches_single_rank(gqa_config(test::world_size()));
}

TEST(Decoder, GroupedQueryAttentionThatTpCannotSplitIsOneClearError) {
  const int T = test::world_size();
  if (T < 2) GTEST_SKIP() << "needs tp >= 2";
  auto tp = test::world_comm();
  ModelConfig cfg = gqa_config(T);
  cfg.num_query_groups = 1;
  ParallelContext ctx{tp.get(), false, {}};
  try {
    Decoder model(cfg, {.tp = ctx.tp}, &ctx, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.uniform());
    EXPECT_NE(std::string(e.what()).find("--num-query-groups 1 is not divisible by --tensor-model-parallel-size"),
              std::string::npos)
        << e.what();
  }
}

/// The objective's gradient (the loss plus a MoE model's aux losses) against central finite differences.
void check_backward_matches_finite_differences(ModelConfig cfg, ModelGroups groups = {}, const MoeConfig& moe = {}) {
  auto self = self_comm();
  groups.tp = self.get();
  cfg.seq_length = 5;
  const int64_t batch = 2, m = cfg.seq_length * batch;
  Batch b = make_batch(m);
  ParallelContext ctx{self.get(), false, {}};
  Decoder model(cfg, groups, &ctx, 7, moe);
  model.forward(b.tokens.data(), b.targets.data(), batch);
  model.backward(1.0f);
  auto objective = [&] { return model.forward(b.tokens.data(), b.targets.data(), batch) + model.moe_aux_loss(); };
  int checked = 0;
  for (Param* p : model.params()) {
    // A few elements of every parameter, including the largest-gradient one.
    int64_t best = 0;
    for (int64_t i = 0; i < p->grad.numel(); ++i)
      if (std::fabs(p->grad[i]) > std::fabs(p->grad[best])) best = i;
    for (int64_t i : {best, p->grad.numel() / 3}) {
      const float h = 1e-2f, orig = p->value[i];
      p->value[i] = orig + h;
      const double lp = objective();
      p->value[i] = orig - h;
      const double lm = objective();
      p->value[i] = orig;
      const double fd = (lp - lm) / (2.0 * h);
      EXPECT_NEAR(p->grad[i], fd, 2e-3 + 0.05 * std::fabs(fd)) << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

/// One forward and backward from zero gradients: the loss, then every gradient.
std::vector<float> step_bits(Decoder& model, const Batch& b, int64_t batch) {
  for (Param* p : model.params()) p->grad.zero();
  std::vector<float> out{static_cast<float>(model.forward(b.tokens.data(), b.targets.data(), batch))};
  model.backward(1.0f);
  for (Param* p : model.params()) out.insert(out.end(), p->grad.data(), p->grad.data() + p->grad.numel());
  return out;
}

// `coc bench train --baseline` and sampling re-point the layers at another context between passes instead of
// writing the one they share: each step has the bits of a decoder built with its context (the two vocabulary paths
// differ in their bits at tp > 1), and sampling, which runs under a copy without SP, leaves nothing behind.
TEST(Decoder, SwitchingContextsBetweenStepsGivesEachContextsBits) {
  auto tp = test::world_comm();
  const ModelConfig cfg = small_config(test::world_size());
  const int64_t batch = 2;
  const Batch b = make_batch(cfg.seq_length * batch);
  ParallelContext plain{tp.get(), true, {}};
  plain.coc.parallel_num = 1;
  plain.coc.deterministic = true;
  ParallelContext overlapped = plain;
  overlapped.coc.parallel_num = 3;
  overlapped.tp_comm_bulk_wgrad = overlapped.delay_wgrad_compute = overlapped.delay_column_wgrad = true;
  overlapped.attention_dense_backward_pipeline = overlapped.swiglu_down_pipeline = true;
  overlapped.attention_qkv_backward_pipeline = overlapped.swiglu_down_backward_pipeline = true;
  overlapped.vocab_comm = VocabComm::kWeights;
  const ParallelContext* ctx[2] = {&plain, &overlapped};
  std::vector<float> want[2];
  for (int s = 0; s < 2; ++s) {
    Decoder fresh(cfg, {.tp = tp.get()}, ctx[s], 7);
    want[s] = step_bits(fresh, b, batch);
  }
  Decoder model(cfg, {.tp = tp.get()}, &plain, 7);
  for (int s : {1, 0, 1}) {
    model.set_parallel_context(ctx[s]);
    (void)model.next_token_logits(b.tokens.data(), 4);
    EXPECT_EQ(&model.parallel_context(), ctx[s]);
    EXPECT_TRUE(step_bits(model, b, batch) == want[s]) << "side " << s;
  }
}

TEST(Decoder, BackwardMatchesFiniteDifferences) { check_backward_matches_finite_differences(small_config(1)); }

TEST(Decoder, GroupedQueryAttentionBackwardMatchesFiniteDifferences) {
  ModelConfig cfg = small_config(1);
  cfg.num_query_groups = 2;  // 4 heads, 2 per group
  check_backward_matches_finite_differences(cfg);
}

// A MoE layer in layer 0 (--moe-layer-freq 2: layer 1 stays dense): its router, experts and aux loss take part in the
// gradient. The fixed router keeps the routing constant under the finite differences (a learned top-k choice
// would flip at a tie); the weights stay the router's probabilities, so the router is still checked.
TEST(Decoder, MoeBackwardMatchesFiniteDifferencesOfTheObjective) {
  ModelConfig cfg = small_config(1);
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.moe_ffn_hidden_size = 8;
  cfg.moe_layer_freq = 2;
  auto ep = self_comm(), tokens = self_comm();
  MoeConfig moe;
  moe.aux_loss_coeff = 0.1;
  moe.fixed_router = RouterPattern::kBalanced;
  check_backward_matches_finite_differences(cfg, {.ep = ep.get(), .dp_cp = tokens.get()}, moe);
  auto self = self_comm();
  ParallelContext ctx{self.get(), false, {}};
  Decoder model(cfg, {.tp = self.get(), .ep = ep.get(), .dp_cp = tokens.get()}, &ctx, 7, moe);
  EXPECT_EQ(model.moe_layers(), 1);
  int64_t n = 0;
  for (Param* p : model.params()) n += p->value.numel();
  EXPECT_EQ(n, cfg.num_parameters());
  // A MoE model without its groups is one clear error.
  EXPECT_THROW(Decoder(cfg, {.tp = self.get()}, &ctx, 7), Error);
}

// --vocab-parallel-comm's rule (ParallelContext::gathers_vocab_weights): weights only with SP over tp > 1, and under
// auto only where the weight is the smaller message and fits 64 MiB.
TEST(VocabComm, AutoTakesTheWeightsOnlyWhereTheyAreTheSmallerMessage) {
  auto tp = test::world_comm();
  const bool multi = tp->size() > 1;
  ParallelContext ctx{tp.get(), true, {}};
  ctx.vocab_comm = VocabComm::kAuto;
  EXPECT_EQ(ctx.gathers_vocab_weights(256, 512, 4096), multi);   // coc's byte vocabulary: 16x fewer bytes
  EXPECT_FALSE(ctx.gathers_vocab_weights(256, 512, 256));        // V = m: no fewer bytes
  EXPECT_FALSE(ctx.gathers_vocab_weights(32000, 4096, 65536));   // 500 MiB of gathered weight
  ctx.vocab_comm = VocabComm::kWeights;
  EXPECT_EQ(ctx.gathers_vocab_weights(32000, 4096, 16), multi);  // forced, whatever the sizes
  ctx.vocab_comm = VocabComm::kActivations;
  EXPECT_FALSE(ctx.gathers_vocab_weights(256, 512, 4096));
  ctx.sequence_parallel = false;  // every rank holds every row: nothing to gain
  ctx.vocab_comm = VocabComm::kWeights;
  EXPECT_FALSE(ctx.gathers_vocab_weights(256, 512, 4096));
  EXPECT_EQ(parse_vocab_comm("weights"), VocabComm::kWeights);
  EXPECT_STREQ(to_string(parse_vocab_comm("activations")), "activations");
  EXPECT_THROW(parse_vocab_comm("rows"), Error);
}

// reserve_activations: the step after it writes into buffers whose pages are already there, and buffers reused
// from step to step (holding the last step's values) give the bits of fresh ones.
TEST(Decoder, ReservedActivationsGiveTheSameBitsWithoutFreshPages) {
  auto self = self_comm();
  ModelConfig cfg = small_config(1);
  cfg.seq_length = 256;  // ~2 MiB of attention probabilities per layer, ~8 MiB in all
  cfg.hidden_size = 128;
  cfg.ffn_hidden_size = 256;
  const int64_t batch = 2, m = cfg.seq_length * batch;
  Batch b = make_batch(m);
  ParallelContext ctx{self.get(), false, {}};
  auto grads = [](Decoder& d) {
    std::vector<float> g;
    for (Param* p : d.params()) g.insert(g.end(), p->grad.data(), p->grad.data() + p->grad.numel());
    return g;
  };
  auto step = [&](Decoder& d) {
    for (Param* p : d.params()) p->grad.zero();
    const double loss = d.forward(b.tokens.data(), b.targets.data(), batch);
    d.backward(1.0f);
    return loss;
  };
  Decoder fresh(cfg, {.tp = ctx.tp}, &ctx, 7);  // also the first step of the process: BLAS and the kernels' own buffers
  const double want_loss = step(fresh);
  const std::vector<float> want = grads(fresh);

  Decoder reserved(cfg, {.tp = ctx.tp}, &ctx, 7);
  long before = test::minor_faults();
  reserved.reserve_activations(batch);
  const long reserve_faults = test::minor_faults() - before;
  before = test::minor_faults();
  EXPECT_EQ(step(reserved), want_loss);
  const long step_faults = test::minor_faults() - before;
  EXPECT_EQ(grads(reserved), want);
  EXPECT_EQ(step(reserved), want_loss) << "the second step, in the first one's buffers";
  EXPECT_EQ(grads(reserved), want);
  test::expect_few_page_faults(step_faults, reserve_faults, "the step");
}

TEST(Decoder, HooksRunAroundEveryModuleInOrderAndModulesPartitionTheParameters) {
  auto self = self_comm();
  ModelConfig cfg = small_config(1);
  const int64_t batch = 1, m = cfg.seq_length * batch;
  Batch b = make_batch(m);
  ParallelContext ctx{self.get(), false, {}};
  Decoder model(cfg, {.tp = ctx.tp}, &ctx, 7);
  const int M = model.num_modules();
  ASSERT_EQ(M, cfg.num_layers + 2);  // embedding, layers, head

  // Every parameter in exactly one module, in params() order.
  ParamList all;
  for (int i = 0; i < M; ++i)
    for (Param* p : model.module_params(i)) all.push_back(p);
  EXPECT_EQ(all, model.params());
  EXPECT_EQ(model.module_params(0).front()->name, "embedding.weight");
  EXPECT_EQ(model.module_params(M - 1).back()->name, "output_layer.weight");
  EXPECT_THROW(model.module_params(M), Error);

  std::vector<std::string> events;
  const char* names[] = {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd"};
  for (HookPoint point : {HookPoint::kPreForward, HookPoint::kPostForward, HookPoint::kPreBackward,
                          HookPoint::kPostBackward})
    model.add_hook(point, [&events, &names, point](int module) {
      events.push_back(std::string(names[static_cast<int>(point)]) + " " + std::to_string(module));
    });
  model.add_hook(HookPoint::kPreForward, [&events](int module) { events.push_back("second " + std::to_string(module)); });
  const double loss = model.forward(b.tokens.data(), b.targets.data(), batch);
  model.backward(1.0f);
  std::vector<std::string> want;
  for (int i = 0; i < M; ++i) {
    want.push_back("pre_fwd " + std::to_string(i));
    want.push_back("second " + std::to_string(i));  // hooks of one point run in the order they were added
    want.push_back("post_fwd " + std::to_string(i));
  }
  for (int i = M - 1; i >= 0; --i) {
    want.push_back("pre_bwd " + std::to_string(i));
    want.push_back("post_bwd " + std::to_string(i));
  }
  EXPECT_EQ(events, want);

  // Hooks observe; they change nothing: the same model without hooks gives the same loss, bit for bit.
  Decoder plain(cfg, {.tp = ctx.tp}, &ctx, 7);
  EXPECT_EQ(plain.forward(b.tokens.data(), b.targets.data(), batch), loss);

  // A hook that throws aborts the pass with its error.
  model.add_hook(HookPoint::kPreBackward, [](int module) {
    if (module == 1) throw Error(ErrorKind::kInvalidArgument, "hook failed");
  });
  model.forward(b.tokens.data(), b.targets.data(), batch);
  EXPECT_THROW(model.backward(1.0f), Error);
}

}  // namespace
}  // namespace coc
