// coc-test-np: 2 3 4
// coc-test-timeout: 300
// The fused layer modes (ParallelContext::fused_kernel = --coc-fused-kernel, ParallelContext::mc2 = --use-mc2) on
// Column/Row parallel layers, forward and backward, against the fp64 single-rank reference (docs/semantics.md §2-3):
// awkward m (1, < tp, not divisible), k == n, bias, SP on/off, frozen weights; the ops each mode runs fused
// (MC2: column fwd AG, row fwd RS, row bwd AG; column bwd only for a frozen weight) are checked through CocStats;
// a TP group smaller than the world (edge case 6 of docs/edge-cases.md); and the flag validation (uniform errors).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "coc/parallel/consistency.h"
#include "coc/parallel/context.h"
#include "support/expect_error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

void expect_ok(const ConsistencyResult& res, const std::string& what, double tol = 1e-5) {
  for (const auto& [name, e] : res) EXPECT_LE(e.rel(), tol) << what << ": " << name << " abs " << e.abs;
}

/// Fused calls one forward + backward of `layer` makes in each mode (SP on unless stated).
int64_t expected_fused(const std::string& layer, bool mc2, bool sp, bool frozen) {
  if (!mc2) return layer == "column" ? (sp ? 2 : 1) : (sp ? 2 : 1);
  if (layer == "column") return frozen ? 2 : 1;
  return 2;
}

TEST(FusedLayers, MatchReferenceInBothModes) {
  auto tp = test::world_comm();
  const int T = tp->size();
  for (const char* layer : {"column", "row"})
    for (bool mc2 : {false, true})
      for (bool sp : {false, true})
        for (bool frozen : {false, true})
          for (int64_t m : {int64_t{1}, int64_t{T - 1 > 0 ? T - 1 : 1}, int64_t{7}, int64_t{301}})
            for (bool det : {false, true}) {
              if (mc2 && !sp) continue;  // refused (see FlagsAreValidated)
              ConsistencyCase c;
              c.layer = layer;
              c.m = m;
              c.k = 40;
              c.n = (m % 2) ? 40 : 56;  // k == n and not
              c.sequence_parallel = sp;
              c.bias = true;
              c.fused_kernel = !mc2;
              c.mc2 = mc2;
              c.frozen_weight = frozen;
              c.coc.deterministic = det;
              c.coc.parallel_num = 3;
              CocStats st;
              c.coc.stats = &st;
              const std::string what = fmt::format("{} mc2={} sp={} frozen={} m={} det={} T={}", layer, mc2, sp,
                                                   frozen, m, det, T);
              expect_ok(check_consistency(*tp, c), what);
              EXPECT_EQ(st.fused_calls, expected_fused(layer, mc2, sp, frozen)) << what;
              EXPECT_EQ(st.fused_fallbacks, 0) << what;
            }
}

TEST(FusedLayers, TpGroupSmallerThanWorld) {
  auto world = test::world_comm();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks (tp=2 x dp=2)";
  auto tp = world->split(world->rank() / 2, world->rank() % 2, "tp");
  for (const char* layer : {"column", "row"})
    for (bool mc2 : {false, true}) {
      ConsistencyCase c;
      c.layer = layer;
      c.m = 33;
      c.k = 24;
      c.n = 20;
      c.sequence_parallel = true;
      c.bias = true;
      c.fused_kernel = !mc2;
      c.mc2 = mc2;
      c.seed = 9 + static_cast<uint64_t>(world->rank() / 2);
      expect_ok(check_consistency(*tp, c), fmt::format("{} mc2={} tp=2 x dp=2", layer, mc2));
    }
}

TEST(FusedLayers, FlagsAreValidated) {
  Error both = test::expect_error([] { ParallelContext::check_fused_flags(true, true, true); });
  EXPECT_TRUE(both.uniform());
  EXPECT_NE(std::string(both.what()).find("cannot be combined"), std::string::npos) << both.what();
  Error no_sp = test::expect_error([] { ParallelContext::check_fused_flags(false, true, false); });
  EXPECT_NE(std::string(no_sp.what()).find("--use-mc2 requires --sequence-parallel"), std::string::npos);
  ParallelContext::check_fused_flags(true, false, false);  // the fused kernel works without SP
  ParallelContext::check_fused_flags(false, true, true);
}

}  // namespace
}  // namespace coc
