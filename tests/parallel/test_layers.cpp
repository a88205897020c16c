// coc-test-np: 1 2 3 4
// coc-test-timeout: 300
// Column/Row parallel layers, forward and backward, against the fp64 single-rank reference (docs/semantics.md §2) over
// the matrix of the issue: tp = world (1..4), N ∈ {1,2,3,4,8}, SP on/off, awkward m, bias, k == n, and the edge
// cases that concern layers (3 bias once, 6 tp < world, 7 odd tp, 8 input not split, 9 gradient accumulation).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "coc/comm/mesh.h"
#include "coc/core/error.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/consistency.h"
#include "coc/parallel/linear.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

void expect_ok(const ConsistencyResult& res, const std::string& what, double tol = 1e-5) {
  for (const auto& [name, e] : res) EXPECT_LE(e.rel(), tol) << what << ": " << name << " abs " << e.abs;
}

std::string describe(const ConsistencyCase& c) {
  return fmt::format("{} m={} k={} n={} N={} sp={} bias={} T={}", c.layer, c.m, c.k, c.n, c.coc.parallel_num,
                     c.sequence_parallel, c.bias, test::world_size());
}

TEST(ParallelLinear, MatchesReferenceAcrossShapesAndChunkCounts) {
  auto tp = test::world_comm();
  for (const char* layer : {"column", "row"})
    for (bool sp : {false, true})
      for (int N : {1, 2, 3, 4, 8})
        for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{N - 1}, int64_t{1000}}) {
          if (m < 1) continue;
          ConsistencyCase c;
          c.layer = layer;
          c.m = m;
          c.k = 48;
          c.n = 40;
          c.sequence_parallel = sp;
          c.bias = (m % 2) == 1;
          c.coc.parallel_num = N;
          expect_ok(check_consistency(*tp, c), describe(c));
        }
}

TEST(ParallelLinear, LargeUnevenMWithEightChunks) {
  auto tp = test::world_comm();
  for (const char* layer : {"column", "row"})
    for (bool sp : {false, true}) {
      ConsistencyCase c;
      c.layer = layer;
      c.m = 4097;
      c.k = 24;
      c.n = 20;
      c.sequence_parallel = sp;
      c.coc.parallel_num = 8;
      expect_ok(check_consistency(*tp, c), describe(c));
    }
}

TEST(ParallelLinear, SquareWeightsAndBothEngines) {
  for (EngineKind kind : {EngineKind::kInline, EngineKind::kThread}) {
    auto tp = test::world_comm(kind);
    for (const char* layer : {"column", "row"})
      for (bool sp : {false, true}) {
        ConsistencyCase c;
        c.layer = layer;
        c.m = 37;
        c.k = c.n = 36;
        c.bias = true;
        c.sequence_parallel = sp;
        c.coc.parallel_num = 3;
        expect_ok(check_consistency(*tp, c), describe(c) + " engine " + to_string(kind));
      }
  }
}

TEST(ParallelLinear, RowLayerScattersAnInputThatIsNotSplit) {
  // Edge case 8 of docs/edge-cases.md: input_is_parallel = false scatters X first; dX comes back whole.
  auto tp = test::world_comm();
  for (bool sp : {false, true}) {
    ConsistencyCase c;
    c.layer = "row";
    c.input_is_parallel = false;
    c.m = 33;
    c.k = 30;
    c.n = 18;
    c.bias = true;
    c.sequence_parallel = sp;
    c.coc.parallel_num = 4;
    expect_ok(check_consistency(*tp, c), "input_is_parallel=false " + describe(c));
  }
}

TEST(ParallelLinear, RowBiasIsAddedOnce) {
  // Edge cases 3 and 4: ones · twos summed over the full k = 3·T, plus bias 1 added once after the reduction.
  auto tp = test::world_comm();
  const int T = tp->size();
  for (bool sp : {false, true}) {
    ParallelContext ctx;
    ctx.tp = tp.get();
    ctx.sequence_parallel = sp;
    ctx.coc.parallel_num = 2;
    RowParallelLinear row("row", 3 * T, 6, &ctx, {.bias = true, .input_is_parallel = true});
    row.weight.value.fill(2.0f);
    row.bias.value.fill(1.0f);
    Tensor x({4, 3}), y({sp ? ctx.shard_rows(4) : 4, 6});
    x.fill(1.0f);
    row.forward(x.mat(), 4, y.mat());
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y[i], 6.0f * T + 1.0f);
  }
}

TEST(ParallelLinear, GradientAccumulationOfTwoMicroBatchesEqualsOneDoubleBatch) {
  // Edge case 9: two micro-batches of m rows accumulate into the fp32 master gradient exactly like one batch of
  // 2m rows (up to summation order).
  auto tp = test::world_comm();
  for (bool sp : {false, true}) {
    ParallelContext ctx;
    ctx.tp = tp.get();
    ctx.sequence_parallel = sp;
    ctx.coc.parallel_num = 3;
    const int64_t m = 10, k = 12, n = 8;
    ColumnParallelLinear a("a", k, n, &ctx, {.bias = true}), b("b", k, n, &ctx, {.bias = true});
    Tensor w = test::random_tensor({n, k}, 5);
    for (int64_t i = 0; i < a.weight.value.numel(); ++i) a.weight.value[i] = b.weight.value[i] = w[i];
    Tensor X = test::random_tensor({2 * m, k}, 6), DY = test::random_tensor({2 * m, n}, 7);
    auto run = [&](ColumnParallelLinear& l, int64_t row0, int64_t rows) {
      const int64_t in_rows = sp ? ctx.shard_rows(rows) : rows;
      const int64_t in0 = sp ? split_rows(rows, ctx.tp_size(), ctx.tp_rank()).begin : 0;
      Tensor x({in_rows, k}), y({rows, l.local_out()}), dy({rows, l.local_out()}), dx({in_rows, k});
      for (int64_t i = 0; i < in_rows; ++i)
        for (int64_t p = 0; p < k; ++p) x[i * k + p] = X[(row0 + in0 + i) * k + p];
      const int64_t c0 = split_rows(n, ctx.tp_size(), ctx.tp_rank()).begin;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < l.local_out(); ++j) dy[i * l.local_out() + j] = DY[(row0 + i) * n + c0 + j];
      l.forward(x.mat(), rows, y.mat());
      l.backward(dy.mat(), dx.mat());
    };
    run(a, 0, m);
    run(a, m, m);
    run(b, 0, 2 * m);
    for (int64_t i = 0; i < a.weight.grad.numel(); ++i)
      EXPECT_NEAR(a.weight.grad[i], b.weight.grad[i], 1e-5f * (1.0f + std::fabs(b.weight.grad[i])));
    for (int64_t i = 0; i < a.bias.grad.numel(); ++i)
      EXPECT_NEAR(a.bias.grad[i], b.bias.grad[i], 1e-5f * (1.0f + std::fabs(b.bias.grad[i])));
  }
}

TEST(ParallelLinear, TensorParallelGroupSmallerThanWorld) {
  // Edge case 6: world 4 as tp = 2 × dp = 2; every collective stays inside its tp group.
  if (test::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  CommOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  Mesh g = make_mesh({.tp = 2}, o);
  ASSERT_EQ(g.tp_size(), 2);
  ASSERT_EQ(g.dp_size(), 2);
  EXPECT_EQ(g.tp_rank(), test::world_rank() % 2);  // tp ranks adjacent
  for (const char* layer : {"column", "row"})
    for (bool sp : {false, true}) {
      ConsistencyCase c;
      c.layer = layer;
      c.m = 101;
      c.k = 26;
      c.n = 14;
      c.bias = true;
      c.sequence_parallel = sp;
      c.coc.parallel_num = 4;
      // Different data per dp replica: a collective leaking across groups would mix them.
      c.seed = 100 + static_cast<uint64_t>(g.dp_rank());
      expect_ok(check_consistency(*g.tp, c), "tp=2 x dp=2 " + describe(c));
    }
}

TEST(ParallelLinear, DeterministicModeIsBitwiseIdenticalAcrossChunkCounts) {
  // Edge case 13 at layer level: outputs and gradients identical for every N and across repeated runs.
  auto tp = test::world_comm();
  for (const char* kind : {"column", "row"})
    for (bool sp : {false, true}) {
      std::vector<float> first;
      for (int N : {1, 2, 3, 4, 8, 4}) {
        ParallelContext ctx;
        ctx.tp = tp.get();
        ctx.sequence_parallel = sp;
        ctx.coc.parallel_num = N;
        ctx.coc.deterministic = true;
        const int64_t m = 203, k = 40, n = 24;
        std::vector<float> out;
        if (std::string(kind) == "column") {
          ColumnParallelLinear l("c", k, n, &ctx, {.bias = true});
          Tensor w = test::random_tensor(l.weight.value.shape(), 1);
          l.weight.value = w;
          const int64_t rin = ctx.local_rows(m);
          Tensor x = test::random_tensor({rin, k}, 2 + static_cast<uint64_t>(tp->rank())), y({m, l.local_out()}),
                 dy = test::random_tensor({m, l.local_out()}, 3), dx({rin, k});
          l.forward(x.mat(), m, y.mat());
          l.backward(dy.mat(), dx.mat());
          out.insert(out.end(), y.data(), y.data() + y.numel());
          out.insert(out.end(), dx.data(), dx.data() + dx.numel());
          out.insert(out.end(), l.weight.grad.data(), l.weight.grad.data() + l.weight.grad.numel());
        } else {
          RowParallelLinear l("r", k, n, &ctx, {.bias = true, .input_is_parallel = true});
          l.weight.value = test::random_tensor(l.weight.value.shape(), 1 + static_cast<uint64_t>(tp->rank()));
          const int64_t rout = ctx.local_rows(m);
          Tensor x = test::random_tensor({m, l.local_in()}, 2), y({rout, n}), dy = test::random_tensor({rout, n}, 3),
                 dx({m, l.local_in()});
          l.forward(x.mat(), m, y.mat());
          l.backward(dy.mat(), dx.mat());
          out.insert(out.end(), y.data(), y.data() + y.numel());
          out.insert(out.end(), dx.data(), dx.data() + dx.numel());
          out.insert(out.end(), l.weight.grad.data(), l.weight.grad.data() + l.weight.grad.numel());
        }
        if (first.empty())
          first = out;
        else
          ASSERT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float)))
              << kind << " sp=" << sp << " N=" << N << " differs from N=1";
      }
    }
}

// RowParallelLinear::backward with a row consumer (the decoder's --attention-dense-backward-pipeline): every row
// of dx is handed out once and is final when handed out; in deterministic mode dx and the weight gradient have the
// bits of the backward without a consumer, otherwise they agree closely. m = 203 and 1 (awkward shards; a rank
// without rows), segments of 1, 7, 64 and 1000 rows, with and without queued weight-gradient work for the gather
// (run there only on the ranks that do not hold the last rows). Without SP the consumer gets all rows at the end.
// A bf16 wire (deterministic, SP): the segments travel as bf16 and dY is rounded as all_gather_matmul_v2's bf16
// wire rounds it, so dx, the weight and the bias gradients keep the bits of the backward without a consumer.
// wgrad_as_rows_arrive (down's), with COC_TEST_ACROSS_NODES (it acts across nodes only): the weight gradient summed
// by row blocks as they arrive, close to the one GEMM's; deterministic mode ignores it and keeps the bits.
TEST(ParallelLinear, RowBackwardHandsOutEveryRowOnceWithTheSameBits) {
  auto tp = test::world_comm();
  for (DType wire : {DType::kF32, DType::kBF16})
    for (bool deterministic : {true, false})
      for (bool sp : {true, false})
        for (int64_t m : {203, 1})
          for (int64_t seg : {1, 7, 64, 1000})
            for (int variant = 0; variant < 4; ++variant) {
              const bool queued = variant & 1, by_rows = variant & 2;
              if (wire == DType::kBF16 && !(deterministic && sp)) continue;
              SCOPED_TRACE(fmt::format("det={} sp={} m={} segment={} queued={} wire={} by_rows={}", deterministic, sp,
                                       m, seg, queued, to_string(wire), by_rows));
              const int64_t k = 40, n = 24;
              std::vector<float> results[2];
              for (int with = 0; with < 2; ++with) {
                ParallelContext ctx;
                ctx.tp = tp.get();
                ctx.sequence_parallel = sp;
                ctx.coc.parallel_num = CocOptions::kAuto;
                ctx.coc.deterministic = deterministic;
                ctx.coc.comm_dtype = wire;
                ctx.delay_wgrad_compute = ctx.delay_column_wgrad = queued;
                RowParallelLinear l("r", k, n, &ctx, {.bias = true, .input_is_parallel = true});
                l.weight.value = test::random_tensor(l.weight.value.shape(), 1 + static_cast<uint64_t>(tp->rank()));
                const int64_t rout = ctx.local_rows(m);
                Tensor x = test::random_tensor({m, l.local_in()}, 2), y({rout, n}),
                       dy = test::random_tensor({rout, n}, 3 + static_cast<uint64_t>(tp->rank())),
                       dx({m, l.local_in()});
                l.forward(x.mat(), m, y.mat());
                // Queued work stands in for the down projection's delayed weight gradient: it must run, once.
                int ran = 0;
                WgradQueue wgrad;
                if (queued) wgrad.push([&ran] { ++ran; });
                dx.fill(std::nanf(""));
                std::vector<int> handed(static_cast<size_t>(m), 0);
                RowConsumer consume = [&](RowRange rows) {
                  for (int64_t r = rows.begin; r < rows.end(); ++r) {
                    ++handed[static_cast<size_t>(r)];
                    for (int64_t c = 0; c < l.local_in(); ++c)
                      ASSERT_FALSE(std::isnan(dx.mat().row(r)[c])) << "row " << r << " handed out before computed";
                  }
                };
                if (by_rows) setenv("COC_TEST_ACROSS_NODES", "1", 1);
                if (with)
                  l.backward(dy.mat(), dx.mat(), &wgrad, consume, seg, by_rows);
                else
                  l.backward(dy.mat(), dx.mat(), &wgrad);
                unsetenv("COC_TEST_ACROSS_NODES");
                if (queued && with && sp && tp->size() > 1) {
                  // By rows, dW is summed before backward returns; otherwise it waits on the queue.
                  bool summed = false;
                  for (int64_t i = 0; i < l.weight.grad.numel(); ++i) summed = summed || l.weight.grad[i] != 0.0f;
                  EXPECT_EQ(summed, by_rows && !deterministic) << "where the weight gradient was summed";
                }
                if (queued && with && sp && tp->size() > 1) {
                  // It runs under the first segments on the ranks that wait for them, not on the rank holding the
                  // last rows, which leaves it for the next column layer.
                  const RowRange own = split_rows(m, tp->size(), tp->rank());
                  EXPECT_EQ(ran, own.count > 0 && own.end() == m ? 0 : 1) << "queued work placement";
                }
                wgrad.run();
                if (queued) EXPECT_EQ(ran, 1);
                if (with)
                  for (int64_t r = 0; r < m; ++r) ASSERT_EQ(handed[static_cast<size_t>(r)], 1) << "row " << r;
                results[with].insert(results[with].end(), dx.data(), dx.data() + dx.numel());
                results[with].insert(results[with].end(), l.weight.grad.data(),
                                     l.weight.grad.data() + l.weight.grad.numel());
                results[with].insert(results[with].end(), l.bias.grad.data(), l.bias.grad.data() + l.bias.grad.numel());
              }
              if (deterministic || !sp) {
                EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)));
              } else {
                for (size_t i = 0; i < results[0].size(); ++i)
                  ASSERT_NEAR(results[0][i], results[1][i], 1e-5 + 1e-5 * std::abs(results[0][i])) << "element " << i;
              }
            }
}

TEST(ParallelLinear, RowBackwardConsumerNeedsSegmentRows) {
  auto tp = test::world_comm();
  ParallelContext ctx;
  ctx.tp = tp.get();
  ctx.sequence_parallel = true;
  RowParallelLinear l("r", 8, 8, &ctx, {.input_is_parallel = true});
  const int64_t m = 6;
  Tensor x({m, l.local_in()}), y({ctx.local_rows(m), 8}), dy({ctx.local_rows(m), 8}), dx({m, l.local_in()});
  l.forward(x.mat(), m, y.mat());
  try {
    l.backward(dy.mat(), dx.mat(), nullptr, [](RowRange) {}, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("segment_rows must be >= 1"), std::string::npos) << e.what();
  }
}

TEST(ParallelLinear, BackwardOverlapSwitchesMatchReference) {
  // --tp-comm-bulk-wgrad and --delay-wgrad-compute on and off, SP on and off, serial, chunked and auto: each layer
  // against the fp64 single-rank reference.
  auto tp = test::world_comm();
  for (const char* layer : {"column", "row"})
    for (bool sp : {false, true})
      for (int N : {1, 4, CocOptions::kAuto})
        for (int sw = 0; sw < 4; ++sw) {
          ConsistencyCase c;
          c.layer = layer;
          c.m = 301;
          c.k = 36;
          c.n = 28;
          c.bias = true;
          c.sequence_parallel = sp;
          c.coc.parallel_num = N;
          c.tp_comm_bulk_wgrad = (sw & 1) != 0;
          c.delay_wgrad_compute = (sw & 2) != 0;
          expect_ok(check_consistency(*tp, c),
                    describe(c) + fmt::format(" bulk_wgrad={} delay_wgrad={}", c.tp_comm_bulk_wgrad,
                                              c.delay_wgrad_compute));
        }
}

/// One MLP pair as the decoder runs it (column fc1 → row fc2; backward fc2 then fc1), two micro-batches, in
/// deterministic mode: outputs, input gradient and every parameter gradient, concatenated.
std::vector<float> mlp_pair_bits(Communicator& tp, bool sp, int N, bool bulk, bool delay) {
  ParallelContext ctx;
  ctx.tp = &tp;
  ctx.sequence_parallel = sp;
  ctx.coc.parallel_num = N;
  ctx.coc.deterministic = true;
  ctx.tp_comm_bulk_wgrad = bulk;
  ctx.delay_wgrad_compute = delay;
  const int64_t m = 263, h = 40, f = 56;
  ColumnParallelLinear fc1("fc1", h, f, &ctx, {.bias = true});
  RowParallelLinear fc2("fc2", f, h, &ctx, {.bias = true});
  fc1.weight.value = test::random_tensor(fc1.weight.value.shape(), 11 + static_cast<uint64_t>(tp.rank()));
  fc1.bias.value = test::random_tensor(fc1.bias.value.shape(), 12 + static_cast<uint64_t>(tp.rank()));
  fc2.weight.value = test::random_tensor(fc2.weight.value.shape(), 13 + static_cast<uint64_t>(tp.rank()));
  fc2.bias.value = test::random_tensor(fc2.bias.value.shape(), 14);
  std::vector<float> out;
  const auto keep = [&](const Tensor& t) { out.insert(out.end(), t.data(), t.data() + t.numel()); };
  const int64_t ml = ctx.local_rows(m);
  for (uint64_t micro = 0; micro < 2; ++micro) {
    const uint64_t seed = 20 + 10 * micro + static_cast<uint64_t>(tp.rank());
    Tensor x = test::random_tensor({ml, h}, seed), a({m, fc1.local_out()}), y({ml, h});
    fc1.forward(x.mat(), m, a.mat());
    fc2.forward(a.mat(), m, y.mat());
    Tensor dy = test::random_tensor({ml, h}, seed + 1), da({m, fc1.local_out()}), dx({ml, h});
    WgradQueue wgrad;
    fc2.backward(dy.mat(), da.mat(), &wgrad);
    EXPECT_EQ(!wgrad.empty(), delay) << "fc2's wgrad is queued only with delay_wgrad_compute";
    fc1.backward(da.mat(), dx.mat(), {.queue = &wgrad});
    EXPECT_TRUE(wgrad.empty()) << "fc1's backward runs the queued wgrad";
    keep(y);
    keep(dx);
  }
  for (Param* p : {&fc1.weight, &fc1.bias, &fc2.weight, &fc2.bias}) keep(p->grad);
  return out;
}

TEST(ParallelLinear, BackwardOverlapSwitchesAreBitwiseEqualInDeterministicMode) {
  auto tp = test::world_comm();
  for (bool sp : {false, true})
    for (int N : {1, 4, CocOptions::kAuto}) {
      const std::vector<float> ref = mlp_pair_bits(*tp, sp, N, false, false);
      for (int sw = 1; sw < 4; ++sw) {
        const bool bulk = (sw & 1) != 0, delay = (sw & 2) != 0;
        const std::vector<float> got = mlp_pair_bits(*tp, sp, N, bulk, delay);
        ASSERT_EQ(ref.size(), got.size());
        EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)))
            << "sp=" << sp << " N=" << N << " bulk_wgrad=" << bulk << " delay_wgrad=" << delay
            << " differs from both off";
      }
    }
}

}  // namespace
}  // namespace coc
