// coc-test-np: 1 2 3 4
// coc-test-timeout: 300
//
// The CoC ops (include/coc/overlap/coc_ops.h) on real MPI ranks, against an fp64 single-rank reference:
// every op, N in {1,2,3,4,8}, m in {1, 7, N-1, 1000} (and 4097 with N = 8), square shapes in both weight layouts
// and non-square ones (edge cases 1, 2, 10 of docs/edge-cases.md), with and without bias (3), both progress
// engines, strided views; the exact-12 reduction case (4); 1,000 back-to-back calls with changing m (5); a TP group smaller than the world
// (6) and a group that is not TP (a split of non-adjacent ranks); bitwise determinism across runs and N (13);
// uniform errors for bad arguments and for ranks that disagree on m; stats, verbose output and CocPending's
// lifetime.
//
// Every rank runs every test and issues the same collectives in the same order, so checks inside loops use
// EXPECT_* (never an ASSERT_* that would skip the rest of a loop on one rank only).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/coc_ops.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/consistency.h"
#include "coc/runtime/tracer.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_comm;

enum class Op { kAR, kRS, kAG, kAGv2 };
const char* name(Op op) {
  switch (op) {
    case Op::kAR: return "matmul_all_reduce";
    case Op::kRS: return "matmul_reduce_scatter";
    case Op::kAG: return "all_gather_matmul";
    case Op::kAGv2: return "all_gather_matmul_v2";
  }
  return "?";
}
constexpr Op kAllOps[] = {Op::kAR, Op::kRS, Op::kAG, Op::kAGv2};
constexpr int kNs[] = {1, 2, 3, 4, 8};

/// One call: global problem [m, K] · W[K -> n]; the op decides which slice each rank holds.
struct Case {
  Op op = Op::kAR;
  int64_t m = 1, K = 8, n = 8;
  WeightLayout layout = WeightLayout::kNK;
  bool bias = false;
  int N = 1;
  bool det = false;
  int64_t min_chunk_rows = 1;
  bool strided = false;  ///< out (and gathered) with ld > cols
  uint64_t seed_salt = 0;
  CocCommAlgo algo = CocCommAlgo::kCollective;
  bool produce = false;  ///< AR/RS: a's rows start as NaN and are filled by CocOptions::produce_rows on request
  bool last_rows_first = false;  ///< CocOptions::last_rows_first
  bool finish = false;           ///< AG: CocOptions::finish_rows records the rows it is given and their values
  bool fused = false;    ///< CocOptions::fused
  DType wire = DType::kF32;  ///< CocOptions::comm_dtype
  bool round_inputs = false;  ///< a, W and the bias start as bf16 values (what --bf16's layers pass)
  bool gathered16 = false;    ///< v2: gathered as bf16 (the --bf16 overload); Result::gathered holds it widened
  std::string str() const {
    return fmt::format("{} m={} K={} n={} layout={} bias={} N={} det={} min_chunk_rows={} strided={} algo={} "
                       "produce={} last_rows_first={} fused={} wire={} round_inputs={} gathered16={}",
                       name(op), m, K, n, to_string(layout), bias, N, det, min_chunk_rows, strided, to_string(algo),
                       produce, last_rows_first, fused, to_string(wire), round_inputs, gathered16);
  }
};

struct Result {
  std::vector<float> out;       ///< this rank's output, dense
  std::vector<float> gathered;  ///< v2 only, dense
  double err = 0;               ///< max relative error against the fp64 reference
  int64_t non_finite = 0;       ///< NaN-initialised rows the op never wrote
  bool gathered_exact = true;   ///< v2: gathered == the full input, bitwise
  int64_t produce_calls = 0;    ///< Case::produce: requests that computed at least one row
  int64_t first_request = 0;    ///< rows computed by the first of them
  int64_t unproduced = 0;       ///< rows never requested
  int64_t first_request_begin = -1;  ///< first row of the first request that computed a row
  int64_t finish_calls = 0;     ///< Case::finish: calls of finish_rows
  int64_t finished_wrong = 0;   ///< rows finished other than once, or whose values changed after finish_rows saw them
  /// bf16 wire: max over elements of |out - ref| / bound (wire16_bound); <= 1 passes.
  double bound_ratio = 0;
};

/// The error bound of one output element under a bf16 wire: coc::bf16_op_bound (consistency.h derives it), which
/// also covers inputs that are not bf16 values (the all-gather's rounding of a).
double wire16_bound(double ref, double s, int64_t K, int T) { return bf16_op_bound(ref, s, K, T); }

uint64_t seed_of(const Case& c) {
  uint64_t v[] = {static_cast<uint64_t>(c.op), static_cast<uint64_t>(c.m), static_cast<uint64_t>(c.K),
                  static_cast<uint64_t>(c.n), static_cast<uint64_t>(c.layout), c.seed_salt};
  return fnv1a(v, sizeof(v));
}

/// Runs one case on `comm` (the TP group) and checks it against the reference. `dp_salt` varies the data between
/// replicas when the TP group is smaller than the world.
Result run_case(Communicator& comm, const Case& c, CocStats* stats = nullptr, uint64_t dp_salt = 0) {
  const int T = comm.size(), me = comm.rank();
  const bool nk = c.layout == WeightLayout::kNK;
  const bool ag = c.op == Op::kAG || c.op == Op::kAGv2;
  const uint64_t seed = seed_of(c) + dp_salt * 7919;
  Tensor A = test::random_tensor({c.m, c.K}, seed);
  // AR/RS: the full weight (each rank reads its k-slice). AG: each rank's own weight (a column-parallel slice).
  std::vector<int64_t> wshape = nk ? std::vector<int64_t>{c.n, c.K} : std::vector<int64_t>{c.K, c.n};
  Tensor W = test::random_tensor(wshape, seed + 1 + (ag ? 1000 * static_cast<uint64_t>(me + 1) : 0));
  Tensor B = test::random_tensor({c.n}, seed + 2);
  if (c.round_inputs)
    for (Tensor* t : {&A, &W, &B}) round_to_bf16(t->data(), t->numel());
  const float* bias = c.bias ? B.data() : nullptr;
  const std::vector<double> ref = test::ref_matmul(A.data(), c.m, c.K, W.data(), c.n, nk, bias);
  std::vector<double> ref_abs;  // Σ|a·w| per element, for wire16_bound
  std::vector<float> A16;       // A as the bf16 wire delivers it: what `gathered` must hold
  if (c.wire == DType::kBF16) {
    Tensor Aa = A, Wa = W;
    for (Tensor* t : {&Aa, &Wa})
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = std::fabs(t->data()[i]);
    ref_abs = test::ref_matmul(Aa.data(), c.m, c.K, Wa.data(), c.n, nk);
    A16.assign(A.data(), A.data() + A.numel());
    round_to_bf16(A16.data(), A.numel());
  }

  CocOptions o;
  o.parallel_num = c.N;
  o.comm_algo = c.algo;
  o.deterministic = c.det;
  o.last_rows_first = c.last_rows_first;
  o.min_chunk_rows = c.min_chunk_rows;
  o.stats = stats;
  o.tag = "test";
  o.fused = c.fused;
  o.comm_dtype = c.wire;

  const RowRange share = split_rows(c.m, T, me);
  const int64_t out_rows = c.op == Op::kRS ? share.count : c.m;
  const int64_t ref_row0 = c.op == Op::kRS ? share.begin : 0;
  const int64_t ld = c.n + (c.strided ? 3 : 0);
  // NaN-filled, so rows an op forgets to write (MindSpeed's AR left the last m mod N rows as garbage) show up.
  std::vector<float> obuf(static_cast<size_t>(std::max<int64_t>(out_rows * ld, 1)),
                          std::numeric_limits<float>::quiet_NaN());
  MatrixView out{obuf.data(), out_rows, c.n, ld};

  Result r;
  // Case::finish: the rows finish_rows is given, and their values then, compared with the output afterwards.
  std::vector<int> finished(static_cast<size_t>(out_rows), 0);
  std::vector<float> seen(static_cast<size_t>(std::max<int64_t>(out_rows * c.n, 1)));
  if (c.finish)
    o.finish_rows = [&](RowRange rows) {
      ++r.finish_calls;
      for (int64_t i = rows.begin; i < rows.end(); ++i) {
        if (i < 0 || i >= out_rows) {
          ++r.finished_wrong;
          continue;
        }
        ++finished[static_cast<size_t>(i)];
        std::memcpy(&seen[static_cast<size_t>(i * c.n)], out.row(i), static_cast<size_t>(c.n) * 4);
      }
    };
  if (!ag) {
    // Row-parallel: rank r holds the columns split_rows(K, T, r) of A and the matching k-slice of W (a strided
    // view for both in the [n,k] layout: ld = K).
    const RowRange ks = split_rows(c.K, T, me);
    ConstMatrixView a{A.data() + ks.begin, c.m, ks.count, c.K};
    // Case::produce: the op sees a NaN copy whose rows are filled only when it asks for them, so a GEMM that reads
    // a row before asking shows up as NaN in the result.
    std::vector<float> late(static_cast<size_t>(std::max<int64_t>(c.m * ks.count, 1)),
                            std::numeric_limits<float>::quiet_NaN());
    std::vector<char> done(static_cast<size_t>(c.m), 0);
    if (c.produce) {
      const ConstMatrixView src = a;
      o.produce_rows = [&, src](RowRange rows) {
        EXPECT_TRUE(rows.begin >= 0 && rows.count >= 0 && rows.end() <= c.m) << rows.begin << "+" << rows.count;
        int64_t fresh = 0;
        for (int64_t i = std::max<int64_t>(rows.begin, 0); i < std::min(rows.end(), c.m); ++i) {
          if (done[static_cast<size_t>(i)]) continue;
          done[static_cast<size_t>(i)] = 1;
          std::memcpy(&late[static_cast<size_t>(i * ks.count)], src.row(i), static_cast<size_t>(ks.count) * 4);
          ++fresh;
        }
        if (fresh > 0 && r.produce_calls++ == 0) {
          r.first_request = fresh;
          r.first_request_begin = rows.begin;
        }
      };
      a = ConstMatrixView{late.data(), c.m, ks.count, ks.count};
    }
    ConstMatrixView w = nk ? ConstMatrixView{W.data() + ks.begin, c.n, ks.count, c.K}
                           : ConstMatrixView{W.data() + ks.begin * c.n, ks.count, c.n, c.n};
    if (c.op == Op::kAR)
      matmul_all_reduce(comm, a, w, c.layout, out, bias, o);
    else
      matmul_reduce_scatter(comm, a, w, c.layout, out, bias, o);
    for (char d : done) r.unproduced += c.produce && !d ? 1 : 0;
  } else {
    ConstMatrixView a{A.data() + share.begin * c.K, share.count, c.K, c.K};
    ConstMatrixView w = W.mat();
    if (c.op == Op::kAG) {
      all_gather_matmul(comm, a, w, c.layout, out, bias, o);
    } else if (c.gathered16) {
      const int64_t gld = c.K + (c.strided ? 5 : 0);
      std::vector<BFloat16> gbuf(static_cast<size_t>(std::max<int64_t>(c.m * gld, 1)), float_to_bf16(-7.0f));
      Bf16View g{gbuf.data(), c.m, c.K, gld};
      all_gather_matmul_v2(comm, a, w, c.layout, out, g, bias, o);
      std::vector<float> want(A.data(), A.data() + A.numel());
      round_to_bf16(want.data(), A.numel());  // the bf16 values of every rank's rows, whatever the wire
      r.gathered.resize(static_cast<size_t>(c.m * c.K));
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.K; ++j) r.gathered[static_cast<size_t>(i * c.K + j)] = bf16_to_float(g.row(i)[j]);
      r.gathered_exact = std::memcmp(r.gathered.data(), want.data(), r.gathered.size() * sizeof(float)) == 0;
    } else {
      const int64_t gld = c.K + (c.strided ? 5 : 0);
      std::vector<float> gbuf(static_cast<size_t>(std::max<int64_t>(c.m * gld, 1)), -7.0f);
      MatrixView g{gbuf.data(), c.m, c.K, gld};
      all_gather_matmul_v2(comm, a, w, c.layout, out, g, bias, o);
      r.gathered.resize(static_cast<size_t>(c.m * c.K));
      for (int64_t i = 0; i < c.m; ++i)
        std::memcpy(&r.gathered[static_cast<size_t>(i * c.K)], g.row(i), static_cast<size_t>(c.K) * 4);
      const float* want = A16.empty() || T == 1 ? A.data() : A16.data();  // T = 1: nothing on the wire
      r.gathered_exact = r.gathered.empty() ||
                         std::memcmp(r.gathered.data(), want, r.gathered.size() * sizeof(float)) == 0;
    }
  }
  r.out.resize(static_cast<size_t>(out_rows * c.n));
  for (int64_t i = 0; i < out_rows; ++i)
    std::memcpy(&r.out[static_cast<size_t>(i * c.n)], out.row(i), static_cast<size_t>(c.n) * 4);
  for (int64_t i = 0; i < (c.finish ? out_rows : 0); ++i)
    if (finished[static_cast<size_t>(i)] != 1 ||
        std::memcmp(&seen[static_cast<size_t>(i * c.n)], &r.out[static_cast<size_t>(i * c.n)], c.n * 4) != 0)
      ++r.finished_wrong;
  for (float v : r.out) r.non_finite += std::isfinite(v) ? 0 : 1;
  r.err = test::max_rel_error(r.out.data(), ref.data() + ref_row0 * c.n, out_rows * c.n);
  for (int64_t i = 0; i < static_cast<int64_t>(ref_abs.empty() ? 0 : r.out.size()); ++i) {
    const auto j = static_cast<size_t>(ref_row0 * c.n + i);
    const double e = std::fabs(static_cast<double>(r.out[static_cast<size_t>(i)]) - ref[j]);
    r.bound_ratio = std::max(r.bound_ratio, e / wire16_bound(ref[j], ref_abs[j], c.K, T));
  }
  return r;
}

void expect_correct(const Result& r, const Case& c) {
  EXPECT_EQ(r.non_finite, 0) << c.str();
  if (c.wire == DType::kF32)
    EXPECT_LE(r.err, 1e-5) << c.str();
  else
    EXPECT_LE(r.bound_ratio, 1.0) << c.str();
  EXPECT_TRUE(r.gathered_exact) << c.str();
}

std::vector<int64_t> ms_for(int N) {
  std::vector<int64_t> ms = {1, 7, 1000};
  if (N - 1 >= 1 && N - 1 != 7 && N - 1 != 1) ms.push_back(N - 1);
  return ms;
}

struct Shape {
  int64_t K, n;
  WeightLayout layout;
};
// k == n in both layouts (edge case 2), and non-square both ways (edge case 10).
constexpr Shape kShapes[] = {{48, 48, WeightLayout::kNK},
                             {48, 48, WeightLayout::kKN},
                             {72, 40, WeightLayout::kNK},
                             {40, 72, WeightLayout::kKN}};

// ---- correctness against the fp64 reference ---------------------------------------------------------------

TEST(CocOps, AllOpsMatchReferenceInlineEngine) {
  auto comm = world_comm(EngineKind::kInline);
  for (Op op : kAllOps)
    for (int N : kNs)
      for (int64_t m : ms_for(N))
        for (const Shape& s : kShapes)
          for (bool bias : {false, true}) {
            Case c{op, m, s.K, s.n, s.layout, bias, N};
            expect_correct(run_case(*comm, c), c);
          }
}

TEST(CocOps, LargeUnevenMWithEightChunks) {
  // m = 4097: odd, not a multiple of N = 8 nor of any tp > 1.
  auto comm = world_comm(EngineKind::kInline);
  for (Op op : kAllOps)
    for (WeightLayout l : {WeightLayout::kNK, WeightLayout::kKN}) {
      Case c{op, 4097, 64, 64, l, /*bias=*/true, 8};
      expect_correct(run_case(*comm, c), c);
    }
  Case c{Op::kRS, 4097, 64, 24, WeightLayout::kNK, true, 8};
  expect_correct(run_case(*comm, c), c);
}

TEST(CocOps, AllOpsMatchReferenceThreadEngine) {
  auto comm = world_comm(EngineKind::kThread);
  for (Op op : kAllOps)
    for (int N : {1, 3, 8})
      for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{1000}})
        for (const Shape& s : {kShapes[1], kShapes[2]}) {
          Case c{op, m, s.K, s.n, s.layout, /*bias=*/m != 7, N};
          expect_correct(run_case(*comm, c), c);
          c.det = true;
          expect_correct(run_case(*comm, c), c);
        }
}

// The point-to-point schedules (remote rows first for reduce-scatter and all-reduce, own rows first for
// all-gather) on both engines, with m not divisible by N or tp, m < N, m = 1, strided outputs and the _v2 gathered
// output.
TEST(CocOps, PointToPointSchedulesMatchReference) {
  for (EngineKind e : {EngineKind::kInline, EngineKind::kThread}) {
    auto comm = world_comm(e);
    for (Op op : {Op::kAR, Op::kRS, Op::kAG, Op::kAGv2})
      for (int N : {2, 3, 8})
        for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4097}})
          for (const Shape& s : {kShapes[0], kShapes[3]})
            for (bool strided : {false, true}) {
              Case c{op, m, s.K, s.n, s.layout, /*bias=*/m != 7, N};
              c.strided = strided;
              c.algo = CocCommAlgo::kP2p;
              expect_correct(run_case(*comm, c), c);
            }
  }
}

// The reduce half of the point-to-point reduce-scatter and all-reduce accumulates this rank's GEMM onto the
// peers' partials when they are already in, and otherwise computes into a scratch slot and adds once they arrive.
// Rank 0 starts late here, so its peers reach their own rows before its partials do (the second path) while rank 0
// finds theirs in (the first). Both must give the reference's result, for every tp.
TEST(CocOps, PointToPointReduceWithLatePartials) {
  for (EngineKind e : {EngineKind::kInline, EngineKind::kThread}) {
    auto comm = world_comm(e);
    for (Op op : {Op::kAR, Op::kRS})
      for (int64_t m : {int64_t{7}, int64_t{1000}})
        for (bool bias : {false, true}) {
          Case c{op, m, 40, 72, WeightLayout::kKN, bias, 3};
          c.algo = CocCommAlgo::kP2p;
          comm->barrier("late partials");
          if (comm->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
          expect_correct(run_case(*comm, c), c);
        }
  }
}

// --coc-parallel-num auto: every rank of this test shares one node, so the choice is serial without timing, and
// says why; the result is the reference's; a second call of the same shape reuses the choice, without the
// all-reduce that agrees on the shape (one collective fewer on the communicator).
TEST(CocOps, AutoChoiceOnOneNodeIsSerialAndCorrect) {
  auto comm = world_comm(EngineKind::kInline);
  coc_auto_forget();
  for (Op op : kAllOps) {
    Case c{op, 1000, 48, 40, WeightLayout::kKN, /*bias=*/true, CocOptions::kAuto};
    const uint64_t s0 = comm->next_seq();
    expect_correct(run_case(*comm, c), c);
    const uint64_t s1 = comm->next_seq();
    expect_correct(run_case(*comm, c), c);
    const uint64_t s2 = comm->next_seq();
    if (comm->size() > 1) EXPECT_EQ(s2 - s1 + 1, s1 - s0) << "the repeated call still agreed on its shape";
  }
  const auto choices = coc_auto_choices();
  if (comm->size() == 1) {
    ASSERT_EQ(choices.size(), 4u);
    for (const auto& ch : choices) EXPECT_NE(ch.reason.find("nothing to communicate"), std::string::npos);
    return;
  }
  ASSERT_EQ(choices.size(), 4u) << "one choice per op and shape, reused by the second call";
  for (const auto& ch : choices) {
    EXPECT_EQ(ch.parallel_num, 1) << ch.op;
    EXPECT_NE(ch.reason.find("share one node"), std::string::npos) << ch.reason;
  }
  Case tiny{Op::kRS, 64, 48, 40, WeightLayout::kKN, false, CocOptions::kAuto};
  expect_correct(run_case(*comm, tiny), tiny);
  EXPECT_NE(coc_auto_choices().back().reason.find("tiny m"), std::string::npos) << coc_auto_choices().back().reason;
  coc_auto_forget();
  EXPECT_TRUE(coc_auto_choices().empty());
}

// MindSpeed's customized_coc: the table's N wins for the listed per-rank shape only; bad tables are named.
TEST(CocOps, CustomizedCocOverridesNPerShape) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size();
  const int64_t m = 512, K = 64, n = 32;
  const int64_t k_local = split_rows(K, T, comm->rank()).count;
  CocOptions o;
  o.parallel_num = 4;
  // Every rank lists its own k (uneven splits are allowed), so the table is the same wherever k is.
  std::string table = "{";
  for (int r = 0; r < T; ++r)
    table += fmt::format("{}\"[{}, {}, {}]\": 2", r ? ", " : "", m, split_rows(K, T, r).count, n);
  o.customized = parse_customized_coc(table + "}");
  Tensor a({m, k_local}), w({k_local, n}), out({m, n});
  CocStats st;
  o.stats = &st;
  matmul_all_reduce(*comm, a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o);
  EXPECT_EQ(st.chunks, T == 1 ? 1 : 2) << "the table's N=2, not parallel_num=4";
  st.reset();
  Tensor a2({m + 1, k_local}), out2({m + 1, n});
  matmul_all_reduce(*comm, a2.mat(), w.mat(), WeightLayout::kKN, out2.mat(), nullptr, o);
  EXPECT_EQ(st.chunks, T == 1 ? 1 : 4) << "a shape not in the table keeps parallel_num";
  for (const char* bad : {"[1]", "{\"[1, 2]\": 4}", "{\"[1, 2, 3]\": 0}", "{\"[a, 2, 3]\": 4}", "{\"[1,2,3]\": \"x\"}", "not json"})
    EXPECT_THROW(parse_customized_coc(bad), Error) << bad;
  const auto t = parse_customized_coc("{\"[4096, 1024, 1024]\": \"auto\"}");
  EXPECT_EQ(t->at({4096, 1024, 1024}), CocOptions::kAuto);
}

TEST(CocOps, DeterministicModeMatchesReference) {
  auto comm = world_comm(EngineKind::kInline);
  for (Op op : kAllOps)
    for (int N : kNs)
      for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{300}})
        for (const Shape& s : {kShapes[0], kShapes[3]}) {
          Case c{op, m, s.K, s.n, s.layout, /*bias=*/true, N, /*det=*/true};
          expect_correct(run_case(*comm, c), c);
        }
}

TEST(CocOps, StridedOutputsAndGathered) {
  // out (and gathered) with ld > cols: the ops must use dense stand-ins for MPI and copy back.
  auto comm = world_comm(EngineKind::kInline);
  for (Op op : kAllOps)
    for (bool det : {false, true})
      for (int N : {1, 3}) {
        Case c{op, 37, 24, 20, WeightLayout::kKN, true, N, det};
        c.strided = true;
        expect_correct(run_case(*comm, c), c);
      }
}

TEST(CocOps, MinChunkRowsFallsBackAndStaysCorrect) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size();
  for (Op op : kAllOps)
    for (int64_t mcr : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{100000}}) {
      CocStats st;
      Case c{op, 200, 32, 24, WeightLayout::kNK, true, 8};
      c.min_chunk_rows = mcr;
      expect_correct(run_case(*comm, c, &st), c);
      EXPECT_EQ(st.calls, 1);
      const int64_t rows = op == Op::kAR ? 200 : split_rows(200, T, 0).count;
      const int64_t expect_chunks = T == 1 ? 1 : std::max<int64_t>(1, std::min<int64_t>(8, rows / mcr));
      EXPECT_EQ(st.chunks, expect_chunks) << c.str();
      EXPECT_EQ(st.serial_fallbacks, (T > 1 && expect_chunks == 1) ? 1 : 0) << c.str();
    }
}

// ---- edge case 4: the reduction sums, exactly ------------------------------------------------------------------

TEST(CocOps, OnesTimesTwosIsExactlyTwelve) {
  // The true k = 6 is split over the ranks (3 + 3 for tp = 2): each rank holds ones[4, k_r] and twos[k_r, 6], so
  // the sum over ranks is 2 · 6 = 12 for every tp; an average would give 12 / tp.
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size(), me = comm->rank();
  const int64_t kr = split_rows(6, T, me).count;
  for (bool det : {false, true})
    for (int N : kNs)
      for (WeightLayout l : {WeightLayout::kKN, WeightLayout::kNK}) {
        std::vector<float> a(static_cast<size_t>(4 * kr), 1.0f), w(static_cast<size_t>(6 * kr), 2.0f);
        ConstMatrixView av{a.data(), 4, kr, kr};
        ConstMatrixView wv = l == WeightLayout::kKN ? ConstMatrixView{w.data(), kr, 6, 6}
                                                    : ConstMatrixView{w.data(), 6, kr, kr};
        CocOptions o;
        o.parallel_num = N;
        o.deterministic = det;
        std::vector<float> out(4 * 6, -1.0f);
        matmul_all_reduce(*comm, av, wv, l, MatrixView{out.data(), 4, 6, 6}, nullptr, o);
        for (float v : out) EXPECT_EQ(v, 12.0f) << "AR N=" << N << " det=" << det;
        const int64_t mine = split_rows(4, T, me).count;
        std::vector<float> rs(static_cast<size_t>(std::max<int64_t>(mine * 6, 1)), -1.0f);
        matmul_reduce_scatter(*comm, av, wv, l, MatrixView{rs.data(), mine, 6, 6}, nullptr, o);
        for (int64_t i = 0; i < mine * 6; ++i) EXPECT_EQ(rs[static_cast<size_t>(i)], 12.0f) << "RS N=" << N;
        // Column-parallel counterpart: AG(ones[4, 6]) · twos[6, 6] = 12.
        std::vector<float> ag_a(static_cast<size_t>(std::max<int64_t>(mine * 6, 1)), 1.0f), ag_w(36, 2.0f),
            ag_out(24, -1.0f);
        all_gather_matmul(*comm, ConstMatrixView{ag_a.data(), mine, 6, 6}, ConstMatrixView{ag_w.data(), 6, 6, 6}, l,
                          MatrixView{ag_out.data(), 4, 6, 6}, nullptr, o);
        for (float v : ag_out) EXPECT_EQ(v, 12.0f) << "AG N=" << N;
      }
}

// ---- edge case 5: repeated calls ------------------------------------------------------------------------------

TEST(CocOps, ThousandBackToBackCallsWithChangingM) {
  // Fresh results first, on their own communicator, in deterministic mode (bitwise independent of N); then 1,000
  // calls on one communicator cycling op, m, N and the mode. Deterministic calls must equal the fresh result
  // bitwise, the others within 1e-5; nothing may stay in flight.
  constexpr int64_t K = 12, n = 10;
  constexpr int kMs = 23;
  const Op ops[] = {Op::kAR, Op::kRS, Op::kAG};
  std::vector<std::vector<float>> fresh(3 * kMs);
  {
    auto comm = world_comm(EngineKind::kInline);
    for (int o = 0; o < 3; ++o)
      for (int64_t m = 1; m <= kMs; ++m) {
        Case c{ops[o], m, K, n, WeightLayout::kNK, true, 1, true};
        Result r = run_case(*comm, c);
        expect_correct(r, c);
        fresh[static_cast<size_t>(o * kMs + m - 1)] = r.out;
      }
  }
  auto comm = world_comm(EngineKind::kInline);
  int bitwise_mismatches = 0;
  for (int i = 0; i < 1000; ++i) {
    const int o = i % 3;
    const int64_t m = 1 + (i * 7) % kMs;
    Case c{ops[o], m, K, n, WeightLayout::kNK, true, 1 + (i / 3) % 8, (i / 2) % 2 == 0};
    Result r = run_case(*comm, c);
    const auto& f = fresh[static_cast<size_t>(o * kMs + m - 1)];
    EXPECT_EQ(r.non_finite, 0) << "call " << i << ": " << c.str();
    if (c.det) {
      bool same = r.out.size() == f.size() && (f.empty() || std::memcmp(r.out.data(), f.data(), f.size() * 4) == 0);
      if (!same) ++bitwise_mismatches;
    } else {
      double err = 0, scale = 1e-30;
      for (size_t j = 0; j < f.size(); ++j) {
        err = std::max(err, std::fabs(static_cast<double>(r.out[j]) - f[j]));
        scale = std::max(scale, std::fabs(static_cast<double>(f[j])));
      }
      EXPECT_LE(err / scale, 1e-5) << "call " << i << ": " << c.str();
    }
  }
  EXPECT_EQ(bitwise_mismatches, 0);
  EXPECT_EQ(comm->engine()->in_flight(), 0u);
}

// ---- edge case 13: determinism -------------------------------------------------------------------------------

TEST(CocOps, DeterministicIsBitwiseIdenticalAcrossRunsAndN) {
  for (EngineKind engine : {EngineKind::kInline, EngineKind::kThread}) {
    auto comm = world_comm(engine);
    for (Op op : {Op::kAR, Op::kRS, Op::kAG, Op::kAGv2})
      for (const Case& base : {Case{op, 1000, 64, 64, WeightLayout::kNK, true, 1, true},
                               Case{op, 333, 72, 40, WeightLayout::kKN, true, 1, true},
                               Case{op, 5, 40, 72, WeightLayout::kNK, false, 1, true}}) {
        if (engine == EngineKind::kThread && base.m != 333) continue;  // the thread engine on one shape
        const Result ref = run_case(*comm, base);
        expect_correct(ref, base);
        for (int N : kNs)
          for (int rep = 0; rep < 3; ++rep) {
            Case c = base;
            c.N = N;
            c.strided = rep == 1 && N == 3;  // a strided out must not change a bit either
            if (rep == 1 && N == 8) c.min_chunk_rows = 50;
            if (rep == 2) c.algo = CocCommAlgo::kP2p;  // the point-to-point schedules give the same bits
            Result r = run_case(*comm, c);
            expect_correct(r, c);
            EXPECT_EQ(r.out.size(), ref.out.size());
            EXPECT_TRUE(r.out.size() == ref.out.size() &&
                        std::memcmp(r.out.data(), ref.out.data(), ref.out.size() * sizeof(float)) == 0)
                << "not bitwise identical to N=1: " << c.str() << " engine " << to_string(engine);
          }
      }
  }
}

// CocOptions::comm_dtype = kBF16 (issue 35 item 3), deterministic mode: every N (uneven chunks too), algorithm,
// engine, strided out and the fused kernel (which rounds each partial in the node-shared window and sums in rank
// order) give the bits of N = 1 with the inline engine, for inputs that are bf16 values (m = 5)
// and inputs that are not (the all-gather rounds them). Every result is within wire16_bound of the fp64 reference,
// and without a bias every output element of a reduction over T > 1 is a bf16 value (the sum was rounded once).
TEST(CocOps, Bf16WireDeterministicIsBitwiseIdenticalAcrossNAlgoEngineAndFused) {
  std::vector<std::vector<float>> first;  // the inline engine's N = 1 bits per (op, shape), in loop order
  const int T = test::world_size();
  for (EngineKind engine : {EngineKind::kInline, EngineKind::kThread}) {
    auto comm = world_comm(engine);
    size_t idx = 0;
    for (Op op : kAllOps)
      for (const Case& base : {Case{op, 333, 72, 40, WeightLayout::kKN, true, 1, true},
                               Case{op, 5, 40, 72, WeightLayout::kNK, false, 1, true},
                               Case{op, 1, 48, 48, WeightLayout::kNK, true, 1, true}}) {
        Case b = base;
        b.wire = DType::kBF16;
        b.round_inputs = base.m == 5;
        const Result ref = run_case(*comm, b);
        expect_correct(ref, b);
        if (engine == EngineKind::kInline) first.push_back(ref.out);
        const std::vector<float>& want = first[idx++];
        if (T > 1 && !b.bias && (op == Op::kAR || op == Op::kRS))
          for (float v : ref.out) EXPECT_EQ(v, bf16_to_float(float_to_bf16(v))) << b.str();
        for (int N : kNs)
          for (CocCommAlgo algo : {CocCommAlgo::kCollective, CocCommAlgo::kP2p})
            for (bool fused : {false, true}) {
              if (fused && algo == CocCommAlgo::kP2p) continue;
              Case c = b;
              c.N = N;
              c.algo = algo;
              c.fused = fused;
              c.strided = N == 3;
              CocStats st;
              Result r = run_case(*comm, c, &st);
              expect_correct(r, c);
              if (fused) EXPECT_EQ(st.fused_calls, T > 1 && c.m > 0 ? 1 : 0) << c.str();
              if (fused) EXPECT_EQ(st.fused_fallbacks, 0) << c.str();
              EXPECT_TRUE(r.out.size() == want.size() &&
                          (want.empty() ||  // an empty result passes no null pointer to memcmp
                           std::memcmp(r.out.data(), want.data(), want.size() * sizeof(float)) == 0))
                  << "bf16 wire not bitwise identical to N=1 inline: " << c.str() << " engine " << to_string(engine);
            }
      }
  }
}

// Under --bf16 (the GEMM compute type) with a bf16 wire, the all-gather's GEMMs read the gathered bf16 rows as
// they arrived, and skip widening them when nobody keeps them (all_gather_matmul without _v2). That must give the
// bits of multiplying the widened rows, which the deterministic tiles still do (oneDNN gives a row the same bits in
// any block of rows): every N, uneven and one-row m, both forms, and v2's gathered rows.
TEST(CocOps, Bf16ComputeReadsTheGatheredBf16RowsWithTheBitsOfTheWidenedOnes) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  const DType saved = gemm_compute_type();
  set_gemm_compute_type(DType::kBF16);
  auto comm = world_comm(EngineKind::kInline);
  for (Op op : {Op::kAG, Op::kAGv2})
    for (int N : {1, 3, 8})
      for (int64_t m : {int64_t{1}, int64_t{333}}) {
        Case c{op, m, 72, 40, WeightLayout::kNK, true, N};
        c.wire = DType::kBF16;
        c.round_inputs = true;
        const Result fast = run_case(*comm, c);
        c.det = true;
        const Result tiles = run_case(*comm, c);
        EXPECT_EQ(fast.out, tiles.out) << c.str();
        EXPECT_EQ(fast.gathered, tiles.gathered) << c.str();
      }
  set_gemm_compute_type(saved);
}

// Under --bf16 a column-parallel layer keeps its gathered input in bf16 (all_gather_matmul_v2's Bf16View form):
// every schedule (collective over a bf16 or fp32 wire, deterministic tiles, point to point, the fused kernel,
// strided or dense target) must fill it with the bf16 values of the gathered rows and give the outputs of the fp32
// form, bit for bit; and outside --bf16 the form is refused.
TEST(CocOps, Bf16GatheredFormHoldsTheRoundedRowsAndTheOutputsOfTheFp32Form) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  auto comm = world_comm(EngineKind::kInline);
  {
    Case c{Op::kAGv2, 5, 8, 4, WeightLayout::kNK, false, 1};
    c.gathered16 = true;
    EXPECT_THROW(run_case(*comm, c), Error) << "the bf16 form outside --bf16";
  }
  const DType saved = gemm_compute_type();
  set_gemm_compute_type(DType::kBF16);
  struct Mode {
    DType wire;
    bool det, fused, strided;
    CocCommAlgo algo;
  };
  // Point to point first: its fp32 scratch must not be one an earlier case filled (the pool hands out used buffers).
  const Mode modes[] = {{DType::kBF16, false, false, false, CocCommAlgo::kP2p},
                        {DType::kBF16, false, false, false, CocCommAlgo::kCollective},
                        {DType::kBF16, false, false, true, CocCommAlgo::kCollective},
                        {DType::kBF16, true, false, false, CocCommAlgo::kCollective},
                        {DType::kBF16, false, true, false, CocCommAlgo::kCollective},
                        {DType::kF32, false, false, false, CocCommAlgo::kCollective}};
  for (const Mode& md : modes)
    for (int N : {1, 3})
      for (int64_t m : {int64_t{1}, int64_t{333}}) {
        Case c{Op::kAGv2, m, 72, 40, WeightLayout::kNK, true, N};
        c.wire = md.wire;
        c.det = md.det;
        c.fused = md.fused;
        c.strided = md.strided;
        c.algo = md.algo;
        c.round_inputs = true;
        c.gathered16 = true;  // first: a scratch reused from the fp32 form's call could hide rows never written
        const Result half = run_case(*comm, c);
        c.gathered16 = false;
        const Result fp32 = run_case(*comm, c);
        EXPECT_TRUE(half.gathered_exact) << c.str();
        EXPECT_EQ(half.out, fp32.out) << c.str();
        EXPECT_EQ(half.gathered, fp32.gathered) << c.str();
      }
  set_gemm_compute_type(saved);
}

/// Runs `c` with the trace on and returns it with the bytes its chunk messages carried (the trace events whose tag
/// names a chunk: the op's data, not the argument agreement).
std::pair<Result, int64_t> run_case_bytes(Communicator& comm, const Case& c) {
  trace::clear();
  trace::set_level(trace::Level::kLevel0);
  Result r = run_case(comm, c);
  trace::set_level(trace::Level::kOff);
  int64_t bytes = 0;
  for (const trace::Record& rec : trace::collect())
    if (rec.cat == trace::Cat::kComm && std::string(rec.label).find(" chunk ") != std::string::npos)
      for (int i = 0; i < rec.nargs; ++i)
        if (std::string(rec.args[i].key) == "bytes") bytes += rec.args[i].value;
  trace::clear();
  return {std::move(r), bytes};
}

// Issue 35 item 3: under a bf16 wire every schedule moves 2-byte elements, the point-to-point ones and the
// deterministic reduce-scatter's all-to-all included: exactly half the bytes of the fp32 wire on the same call, and
// the bits of the collective schedule in deterministic mode (the point-to-point schedules widen what arrives and
// sum it in fp32 as before, so the 2-byte transport changes no bit).
TEST(CocOps, Bf16WireHalvesTheBytesOfEverySchedule) {
  const int T = test::world_size();
  auto comm = world_comm(EngineKind::kInline);
  for (Op op : kAllOps)
    for (bool det : {false, true})
      for (CocCommAlgo algo : {CocCommAlgo::kCollective, CocCommAlgo::kP2p}) {
        Case c{op, 333, 72, 40, WeightLayout::kKN, true, 3};
        c.det = det;
        c.algo = algo;
        c.round_inputs = true;
        const auto [r32, b32] = run_case_bytes(*comm, c);
        c.wire = DType::kBF16;
        const auto [r16, b16] = run_case_bytes(*comm, c);
        expect_correct(r16, c);
        if (T > 1) EXPECT_GT(b32, 0) << c.str();
        EXPECT_EQ(2 * b16, b32) << "a bf16 wire must move half the bytes: " << c.str();
        if (!det || algo == CocCommAlgo::kCollective) continue;
        Case coll = c;
        coll.algo = CocCommAlgo::kCollective;
        EXPECT_EQ(run_case(*comm, coll).out, r16.out) << "p2p bf16 wire not bitwise the collective's: " << c.str();
      }
}

// A bf16 wire without deterministic mode (MPI's 16-bit sums in the collective schedules, coc's rank-ordered fp32 sum
// in the point-to-point ones and the fused kernel): within wire16_bound of the fp64 reference of the bf16 inputs for
// every op, N, algorithm and awkward m (one row, m not divisible by T or N), both engines, strided outputs.
TEST(CocOps, Bf16WireMatchesRoundedReference) {
  for (EngineKind engine : {EngineKind::kInline, EngineKind::kThread}) {
    auto comm = world_comm(engine);
    for (Op op : kAllOps)
      for (int N : kNs)
        for (int64_t m : ms_for(N))
          for (CocCommAlgo algo : {CocCommAlgo::kCollective, CocCommAlgo::kP2p}) {
            if (engine == EngineKind::kThread && m == 1000 && N != 4) continue;
            Case c{op, m, 72, 40, WeightLayout::kKN, true, N};
            c.wire = DType::kBF16;
            c.round_inputs = true;
            c.algo = algo;
            c.strided = N == 3;
            expect_correct(run_case(*comm, c), c);
            if (algo == CocCommAlgo::kP2p || N != 4) continue;
            c.fused = true;
            CocStats st;
            expect_correct(run_case(*comm, c, &st), c);
            EXPECT_EQ(st.fused_fallbacks, 0) << c.str();
          }
  }
}

// CocOptions::produce_rows: every GEMM asks for its rows first (a NaN row read before its request would reach
// the result), every row is asked for, a chunked schedule asks chunk by chunk, and the bits equal the same call on
// a computed a. Collective and point-to-point schedules (whose merging of ready chunks needs the thread engine),
// deterministic tiles, the fused kernel, auto (whose trials need all of a, asked for first) and uneven m.
TEST(CocOps, RowsProducedOnRequestGiveTheSameBits) {
  for (EngineKind engine : {EngineKind::kInline, EngineKind::kThread}) {
    auto comm = world_comm(engine);
    const int T = comm->size();
    for (Op op : {Op::kAR, Op::kRS})
      for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{1000}})
        for (int N : {1, 3, 8, CocOptions::kAuto})
          for (int variant = 0; variant < 4; ++variant) {
            Case c{op, m, 72, 40, WeightLayout::kNK, true, N};
            c.algo = variant == 1 ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
            c.det = variant == 2;
            c.fused = variant == 3;
            if (c.fused && N != 1) continue;
            // auto times its candidates (on one node too) in both calls, so the second one's trials meet the
            // producer.
            if (N == CocOptions::kAuto) {
              setenv("COC_TEST_AUTO_TIMED", "1", 1);
              coc_auto_forget();
            }
            const Result ref = run_case(*comm, c);
            if (N == CocOptions::kAuto) coc_auto_forget();
            c.produce = true;
            const Result r = run_case(*comm, c);
            unsetenv("COC_TEST_AUTO_TIMED");
            expect_correct(r, c);
            EXPECT_EQ(r.unproduced, 0) << c.str();
            // Outside deterministic mode two calls may differ in their last bits: two timed auto calls may choose
            // different schedules, and the point-to-point reduce-scatter and all-reduce add a peer's partial before
            // or after this rank's GEMM, as the partial arrives in time or not (and merge ready chunks).
            if (c.det || (N != CocOptions::kAuto && c.algo == CocCommAlgo::kCollective))
              EXPECT_TRUE(r.out.size() == ref.out.size() &&
                          (r.out.empty() ||  // a rank with no rows: memcmp must not see the null data()
                           std::memcmp(r.out.data(), ref.out.data(), ref.out.size() * sizeof(float)) == 0))
                  << "not bitwise identical to the call on a computed a: " << c.str();
            // Chunked over several ranks, a first request covers one chunk's rows (or, deterministic, its 128-row
            // tiles), not all of a; auto asks for everything before its trials.
            if (T > 1 && m == 1000 && (N == 3 || N == 8) && !c.fused) EXPECT_LT(r.first_request, m) << c.str();
            if (T > 1 && N == CocOptions::kAuto) EXPECT_EQ(r.first_request, m) << c.str();
          }
  }
}

// CocOptions::last_rows_first (--attention-qkv-backward-pipeline, whose producer finishes rows from the last one
// down): the chunks go from the last rows to the first, so the first request is for the last chunk's rows, and the
// result has the bits of the call on a computed a in first-rows-first order (deterministic mode; the collective
// schedule, which the point-to-point one falls back to, sums alike in either order).
TEST(CocOps, LastRowsFirstAsksForRowsFromTheEnd) {
  auto comm = world_comm(EngineKind::kThread);
  const int T = comm->size();
  for (Op op : {Op::kAR, Op::kRS})
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{1000}})
      for (int N : {1, 3, 8})
        for (int variant = 0; variant < 3; ++variant) {
          Case c{op, m, 72, 40, WeightLayout::kNK, true, N};
          c.det = variant == 1;
          c.algo = variant == 2 ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
          c.wire = variant == 0 ? DType::kBF16 : DType::kF32;
          const Result ref = run_case(*comm, c);
          c.produce = c.last_rows_first = true;
          const Result r = run_case(*comm, c);
          expect_correct(r, c);
          EXPECT_EQ(r.unproduced, 0) << c.str();
          if (c.det)
            EXPECT_TRUE(r.out.size() == ref.out.size() &&
                        (r.out.empty() || std::memcmp(r.out.data(), ref.out.data(), ref.out.size() * 4) == 0))
                << "not bitwise identical to the first-rows-first call: " << c.str();
          // Chunked over several ranks, the first request is for the last chunk's rows, not the first ones.
          if (T > 1 && m == 1000 && N > 1) EXPECT_GT(r.first_request_begin, 0) << c.str();
        }
}

// CocOptions::finish_rows (the decoder's rounding of qkv's and gate_up's outputs under --bf16): every output row is
// given exactly once, with its final values, whatever the schedule: collective chunks, deterministic tiles, the
// point-to-point schedule, the fused kernel, auto (whose trials must not call it) and T = 1.
TEST(CocOps, GatherOpsFinishEveryRowOnceWithItsFinalValues) {
  auto comm = world_comm(EngineKind::kThread);
  const int T = comm->size();
  for (Op op : {Op::kAG, Op::kAGv2})
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{1000}})
      for (int N : {1, 3, 8, CocOptions::kAuto})
        for (int variant = 0; variant < 4; ++variant) {
          Case c{op, m, 72, 40, WeightLayout::kKN, true, N};
          c.det = variant == 1;
          c.algo = variant == 2 ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
          c.fused = variant == 3;
          if (c.fused && N != 1) continue;
          c.finish = true;
          if (N == CocOptions::kAuto) {
            setenv("COC_TEST_AUTO_TIMED", "1", 1);
            coc_auto_forget();
          }
          const Result r = run_case(*comm, c);
          unsetenv("COC_TEST_AUTO_TIMED");
          expect_correct(r, c);
          EXPECT_EQ(r.finished_wrong, 0) << c.str();
          // Chunked over several ranks, the rows are finished chunk by chunk.
          if (T > 1 && m == 1000 && (N == 3 || N == 8) && variant == 0) EXPECT_GT(r.finish_calls, 1) << c.str();
        }
}

// ---- edge case 6: a TP group smaller than the world ------------------------------------------------------------

TEST(CocOps, TensorParallelGroupSmallerThanWorld) {
  const int world = test::world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even world size (tp = 2)";  // identical on every rank
  CommOptions co;
  co.timeout = std::chrono::milliseconds(60000);
  Mesh g = make_mesh({.tp = 2}, co);
  EXPECT_EQ(g.tp_size(), 2);
  EXPECT_EQ(g.dp_size(), world / 2);
  for (Op op : kAllOps)
    for (bool det : {false, true}) {
      // Different data per replica: a collective leaking across the TP groups would mix them.
      Case c{op, 101, 24, 16, WeightLayout::kKN, true, 3, det};
      expect_correct(run_case(*g.tp, c, nullptr, static_cast<uint64_t>(g.dp_rank())), c);
    }
}

// ---- any group: the ops run on the group they are given, not only on TP ----------------------------------------

TEST(CocOps, OpsRunOnAGroupOtherThanTensorParallel) {
  // The "dp" groups of a tp = 2 layout, made by Communicator::split: on 4 ranks {0, 2} and {1, 3}, whose members
  // are not adjacent. Different data per group: a collective leaking out of its group would mix them.
  const int world = test::world_size();
  if (world < 4) GTEST_SKIP() << "needs 4 ranks (two groups of two)";  // identical on every rank
  auto comm = world_comm();
  const std::unique_ptr<Communicator> dp = comm->split(/*color=*/comm->rank() % 2, /*key=*/comm->rank(), "dp");
  EXPECT_EQ(dp->size(), (world + 1 - comm->rank() % 2) / 2);
  EXPECT_EQ(dp->rank(), comm->rank() / 2);
  for (Op op : kAllOps)
    for (CocCommAlgo algo : {CocCommAlgo::kCollective, CocCommAlgo::kP2p})
      for (bool det : {false, true}) {
        Case c{op, 101, 24, 16, WeightLayout::kKN, true, 3, det};
        c.algo = algo;
        expect_correct(run_case(*dp, c, nullptr, static_cast<uint64_t>(comm->rank() % 2)), c);
      }
}

// ---- async handle ---------------------------------------------------------------------------------------------

TEST(CocOps, AsyncPendingWaitsInDestructorAndMove) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size(), me = comm->rank();
  const int64_t m = 50, K = 16, n = 12;
  Tensor A = test::random_tensor({m, K}, 11), W = test::random_tensor({K, n}, 12), B = test::random_tensor({n}, 13);
  const auto ref = test::ref_matmul(A.data(), m, K, W.data(), n, false, B.data());
  const RowRange ks = split_rows(K, T, me);
  ConstMatrixView a{A.data() + ks.begin, m, ks.count, K};
  ConstMatrixView w{W.data() + ks.begin * n, ks.count, n, n};
  CocOptions o;
  o.parallel_num = 4;
  for (bool det : {false, true}) {
    o.deterministic = det;
    Tensor out({m, n});
    {
      CocPending p = matmul_all_reduce_async(*comm, a, w, WeightLayout::kKN, out.mat(), B.data(), o);
      CocPending q = std::move(p);  // the moved-from handle must not wait or finish twice
      EXPECT_FALSE(p.pending());    // NOLINT(bugprone-use-after-move): testing the moved-from state
      EXPECT_EQ(q.pending(), T > 1);  // tp = 1 runs synchronously: nothing left to wait for
    }  // destructor waits (and adds the bias)
    EXPECT_LE(test::max_rel_error(out.data(), ref.data(), m * n), 1e-5);
    Tensor out2({m, n});
    CocPending p = matmul_all_reduce_async(*comm, a, w, WeightLayout::kKN, out2.mat(), B.data(), o);
    p.wait();
    EXPECT_FALSE(p.pending());
    p.wait();  // a second wait is a no-op
    EXPECT_EQ(std::memcmp(out.data(), out2.data(), static_cast<size_t>(m * n) * 4), 0);
    // Move-assigning onto a pending handle finishes the old op first.
    Tensor out3({m, n}), out4({m, n});
    CocPending r = matmul_all_reduce_async(*comm, a, w, WeightLayout::kKN, out3.mat(), B.data(), o);
    r = matmul_all_reduce_async(*comm, a, w, WeightLayout::kKN, out4.mat(), B.data(), o);
    EXPECT_LE(test::max_rel_error(out3.data(), ref.data(), m * n), 1e-5);
    r.wait();
    EXPECT_LE(test::max_rel_error(out4.data(), ref.data(), m * n), 1e-5);
  }
  EXPECT_EQ(comm->engine()->in_flight(), 0u);
}

// ---- row collectives --------------------------------------------------------------------------------------------

// The row collectives in fp32 and over a bf16 wire (--grad-reduce-in-bf16): deterministic mode gives the rank-ordered
// sum bit for bit (bf16: of the rounded inputs, rounded once), MPI's sums stay within their rounding (fp32: 1e-5
// relative; bf16: one bf16 step per pairwise sum), and a bf16 all-gather delivers the bf16 values of what was sent.
// On one rank nothing moves and nothing is rounded.
TEST(CocOps, RowCollectivesMatchRankOrderedSums) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size(), me = comm->rank();
  for (DType wire : {DType::kF32, DType::kBF16})
    for (int64_t m : {int64_t{1}, int64_t{5}, int64_t{33}})
      for (bool det : {false, true})
        for (bool strided : {false, true}) {
          const int64_t c = 9, ld = strided ? c + 2 : c;
          const bool b16 = wire == DType::kBF16;
          std::vector<Tensor> xs;
          for (int r = 0; r < T; ++r) xs.push_back(test::random_tensor({m, c}, 100 + static_cast<uint64_t>(r)));
          // Expected: the float sum in rank order (what deterministic mode promises, bit for bit).
          std::vector<float> sum(static_cast<size_t>(m * c));
          for (int64_t i = 0; i < m * c; ++i) {
            auto in = [&](int r) {
              const float v = xs[static_cast<size_t>(r)][i];
              return b16 && T > 1 ? bf16_to_float(float_to_bf16(v)) : v;  // one rank moves nothing
            };
            float s = in(0);
            for (int r = 1; r < T; ++r) s += in(r);
            sum[static_cast<size_t>(i)] = b16 && T > 1 ? bf16_to_float(float_to_bf16(s)) : s;
          }
          const std::string label = fmt::format(" m={} det={} wire={}", m, det, to_string(wire));
          auto check = [&](const float* got, int64_t rows, int64_t row0, int64_t gld, const char* what) {
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t j = 0; j < c; ++j) {
                float g = got[i * gld + j], e = sum[static_cast<size_t>((row0 + i) * c + j)];
                const float tol = b16 ? std::ldexp(1.0f, -8) * static_cast<float>(T) * (1 + std::fabs(e))
                                      : 1e-5f * (1 + std::fabs(e));
                if (det || (b16 && T <= 2))  // T = 2: MPI's 16-bit sum rounds once, as the rank-ordered one
                  EXPECT_EQ(g, e) << what << label;
                else
                  EXPECT_NEAR(g, e, tol) << what << label;
              }
          };
          // all_reduce_rows, in place
          std::vector<float> x(static_cast<size_t>(m * ld), 0.0f);
          for (int64_t i = 0; i < m; ++i)
            std::memcpy(&x[static_cast<size_t>(i * ld)], xs[static_cast<size_t>(me)].data() + i * c, c * 4);
          all_reduce_rows(*comm, MatrixView{x.data(), m, c, ld}, det, "ar", wire).wait();
          check(x.data(), m, 0, ld, "all_reduce_rows");
          // reduce_scatter_rows
          const RowRange share = split_rows(m, T, me);
          std::vector<float> rs(static_cast<size_t>(std::max<int64_t>(share.count * ld, 1)), -1.0f);
          ConstMatrixView xin{xs[static_cast<size_t>(me)].data(), m, c, c};
          reduce_scatter_rows(*comm, xin, MatrixView{rs.data(), share.count, c, ld}, det, "rs", wire).wait();
          check(rs.data(), share.count, share.begin, ld, "reduce_scatter_rows");
          // all_gather_rows: gathers rank r's share of the rank-ordered sum back to the full matrix (bf16 values
          // already under a bf16 wire, so the gather keeps them).
          std::vector<float> ag(static_cast<size_t>(m * ld), -1.0f);
          all_gather_rows(*comm, ConstMatrixView{rs.data(), share.count, c, ld}, MatrixView{ag.data(), m, c, ld}, "ag",
                          wire)
              .wait();
          check(ag.data(), m, 0, ld, "all_gather_rows");
          if (!b16 || T == 1) continue;
          // A bf16 gather of values that are not bf16 delivers their rounding.
          const ConstMatrixView mine{xs[static_cast<size_t>(me)].data() + share.begin * c, share.count, c, c};
          all_gather_rows(*comm, mine, MatrixView{ag.data(), m, c, ld}, "ag16", wire).wait();
          for (int r = 0; r < T; ++r) {
            const RowRange sr = split_rows(m, T, r);
            for (int64_t i = sr.begin; i < sr.end(); ++i)
              for (int64_t j = 0; j < c; ++j)
                EXPECT_EQ(ag[static_cast<size_t>(i * ld + j)],
                          bf16_to_float(float_to_bf16(xs[static_cast<size_t>(r)][i * c + j])))
                    << "all_gather_rows bf16" << label;
          }
        }
}

// ---- errors -------------------------------------------------------------------------------------------------

/// Runs f, expecting a uniform kInvalidArgument coc::Error whose message contains every string in `needles`.
template <typename F>
void expect_uniform_error(F&& f, std::vector<std::string> needles, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error thrown";
  } catch (const Error& e) {
    EXPECT_TRUE(e.uniform()) << what << ": " << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << what << ": " << e.what();
    for (const auto& s : needles)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << what << ": '" << s << "' not in: " << e.what();
  }
}

TEST(CocOps, BadArgumentsThrowUniformErrorsNamingOpRankAndShapes) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size(), me = comm->rank();
  const std::string rank = fmt::format("(rank {})", me);
  Tensor a({4097, 16}), w({16, 8}), out({4097, 8});
  CocOptions o;
  o.tag = "layers.0.mlp";
  o.parallel_num = -1;
  expect_uniform_error([&] { matmul_all_reduce(*comm, a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o); },
                       {"matmul_all_reduce", "'layers.0.mlp'", rank, "parallel_num", ">= 1 or auto"}, "N=-1");
  o.parallel_num = 4;
  o.min_chunk_rows = 0;
  expect_uniform_error([&] { all_gather_matmul(*comm, a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o); },
                       {"min_chunk_rows"}, "min_chunk_rows=0");
  o.min_chunk_rows = 1;
  o.comm_dtype = DType::kF16;  // the wire is fp32 or bf16
  expect_uniform_error([&] { all_gather_matmul(*comm, a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o); },
                       {"comm_dtype must be fp32 or bf16, got fp16"}, "comm_dtype=fp16");
  o.comm_dtype = DType::kF32;
  // [k,n] weight passed as [n,k]: k = 8 != 16.
  expect_uniform_error([&] { matmul_all_reduce(*comm, a.mat(), w.mat(), WeightLayout::kNK, out.mat(), nullptr, o); },
                       {"matmul_all_reduce", rank, "[4097, 16]", "layout"}, "wrong layout");
  // out of the wrong size for the reduce-scatter: rank's share + 1 rows.
  const int64_t share = split_rows(4097, T, me).count;
  Tensor rs_out({share + 1, 8});
  expect_uniform_error(
      [&] { matmul_reduce_scatter(*comm, a.mat(), w.mat(), WeightLayout::kKN, rs_out.mat(), nullptr, o); },
      {"matmul_reduce_scatter", rank, fmt::format("out has {} rows", share + 1), "m=4097",
       fmt::format("tp={}", T), fmt::format("is {} rows", share)},
      "RS out rows");
  // all_gather_matmul: a must be this rank's share of out's rows.
  Tensor ag_a({share + 2, 16});
  expect_uniform_error(
      [&] { all_gather_matmul(*comm, ag_a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o); },
      {"all_gather_matmul", rank, fmt::format("a has {} rows", share + 2)}, "AG a rows");
  Tensor bad_g({4097, 15});
  Tensor ag_a2({share, 16});
  expect_uniform_error(
      [&] {
        all_gather_matmul_v2(*comm, ag_a2.mat(), w.mat(), WeightLayout::kKN, out.mat(), bad_g.mat(), nullptr, o);
      },
      {"all_gather_matmul_v2", "gathered is [4097, 15]"}, "AG gathered shape");
  // out aliasing the input.
  Tensor sq({8, 8});
  expect_uniform_error(
      [&] {
        matmul_all_reduce(*comm, sq.mat(), Tensor({8, 8}).mat(), WeightLayout::kKN, sq.mat(), nullptr, o);
      },
      {"overlaps"}, "aliasing");
  // The communicator is still in step afterwards.
  Case c{Op::kAR, 9, 8, 8, WeightLayout::kNK, true, 3};
  expect_correct(run_case(*comm, c), c);
}

TEST(CocOps, RanksDisagreeingOnMGetUniformErrorsWithDebugCollectives) {
  if (test::world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  CommOptions co;
  co.check_fingerprints = true;
  co.timeout = std::chrono::milliseconds(60000);
  Communicator comm(MPI_COMM_WORLD, "tp", std::make_shared<ProgressEngine>(EngineKind::kInline, 100), co);
  const int me = comm.rank();
  for (int N : {1, 4}) {
    CocOptions o;
    o.parallel_num = N;
    // m = 7 + rank: with N = 4 the first chunks have equal sizes on ranks 0 and 1 (2 rows each), so only an
    // up-front check catches it before the chunk loops diverge.
    const int64_t m = 7 + me;
    Tensor a({m, 8}), w({8, 6}), out({m, 6});
    for (int op = 0; op < 3; ++op) {
      bool threw = false;
      try {
        if (op == 0) matmul_all_reduce(comm, a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o);
        if (op == 1) {
          Tensor rs({split_rows(m, comm.size(), me).count, 6});
          matmul_reduce_scatter(comm, a.mat(), w.mat(), WeightLayout::kKN, rs.mat(), nullptr, o);
        }
        if (op == 2) {
          // out rows = m differ; a is each rank's (self-consistent) share.
          Tensor ag_a({split_rows(m, comm.size(), me).count, 8});
          all_gather_matmul(comm, ag_a.mat(), w.mat(), WeightLayout::kKN, out.mat(), nullptr, o);
        }
      } catch (const Error& e) {
        threw = true;
        EXPECT_TRUE(e.uniform()) << e.what();
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
        EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
      }
      EXPECT_TRUE(threw) << "op " << op << " N=" << N;
    }
    // One rank alone rejects its arguments (wrong out shape): every rank throws, none hangs.
    Tensor a2({16, 8}), out2({me == 1 ? 15 : 16, 6});
    bool threw = false;
    try {
      matmul_all_reduce(comm, a2.mat(), w.mat(), WeightLayout::kKN, out2.mat(), nullptr, o);
    } catch (const Error& e) {
      threw = true;
      EXPECT_TRUE(e.uniform()) << e.what();
      if (me == 1) EXPECT_NE(std::string(e.what()).find("out is [15, 6]"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(threw);
  }
  // Agreeing ranks pass the check and compute the right thing.
  Case c{Op::kAR, 40, 16, 8, WeightLayout::kKN, true, 4};
  expect_correct(run_case(comm, c), c);
  c.op = Op::kAG;
  expect_correct(run_case(comm, c), c);
}

// ---- stats and verbose --------------------------------------------------------------------------------------

TEST(CocOps, StatsCountCallsChunksAndWork) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size();
  CocStats st;
  Case c{Op::kAR, 100, 32, 16, WeightLayout::kNK, false, 4};
  expect_correct(run_case(*comm, c, &st), c);
  EXPECT_EQ(st.calls, 1);
  EXPECT_EQ(st.chunks, T == 1 ? 1 : 4);
  EXPECT_EQ(st.serial_fallbacks, 0);
  const double k_local = static_cast<double>(split_rows(32, T, comm->rank()).count);
  EXPECT_NEAR(st.gflop, 2.0 * 100 * 16 * k_local * 1e-9, 1e-12);
  EXPECT_GE(st.gemm_s, 0.0);
  EXPECT_GE(st.comm_wait_s, 0.0);
  c.op = Op::kAG;
  expect_correct(run_case(*comm, c, &st), c);
  EXPECT_EQ(st.calls, 2);
  // m = 1 cannot be chunked: a serial fallback when tp > 1 and N > 1.
  c.m = 1;
  expect_correct(run_case(*comm, c, &st), c);
  EXPECT_EQ(st.serial_fallbacks, T > 1 ? 1 : 0);
  CocStats sum;
  sum += st;
  sum += st;
  EXPECT_EQ(sum.calls, 2 * st.calls);
  st.reset();
  EXPECT_EQ(st.calls, 0);
}

TEST(CocOps, VerboseSaysWhichScheduleRanAndWhy) {
  auto comm = world_comm(EngineKind::kInline);
  const int T = comm->size();
  log::set_level(2);
  testing::internal::CaptureStderr();
  Case c{Op::kAR, 256, 16, 8, WeightLayout::kNK, false, 8};
  c.min_chunk_rows = 64;
  expect_correct(run_case(*comm, c), c);
  Case c1{Op::kRS, 3, 16, 8, WeightLayout::kNK, false, 4};
  expect_correct(run_case(*comm, c1), c1);
  Case c2{Op::kAG, 9, 16, 8, WeightLayout::kNK, false, 1};
  expect_correct(run_case(*comm, c2), c2);
  std::string log_text = testing::internal::GetCapturedStderr();
  log::set_level(0);
  if (comm->rank() != 0) {
    EXPECT_EQ(log_text.find("coc matmul"), std::string::npos) << "only tp rank 0 logs schedules";
    return;
  }
  EXPECT_NE(log_text.find("coc matmul_all_reduce 'test': m=256 k="), std::string::npos) << log_text;
  if (T == 1) {
    EXPECT_NE(log_text.find("tp=1: no communication"), std::string::npos) << log_text;
  } else {
    EXPECT_NE(log_text.find("min_chunk_rows=64: N lowered 8->4"), std::string::npos) << log_text;
    EXPECT_NE(log_text.find("effective=4"), std::string::npos) << log_text;
    EXPECT_NE(log_text.find("compute-first"), std::string::npos) << log_text;
    EXPECT_NE(log_text.find("< N=4"), std::string::npos) << log_text;  // RS: m=3 over tp rows per rank
    EXPECT_NE(log_text.find("N=1: plain Megatron order, no overlap"), std::string::npos) << log_text;
  }
}

}  // namespace
}  // namespace coc
