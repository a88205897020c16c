// coc-test-np: 1 2 4 8
// coc-test-timeout: 240
// The rank mesh (coc/comm/mesh.h) on real MPI ranks: for every (tp, cp, ep) that fits the world, every group's
// members equal those of Megatron's rank formula, computed here independently from coordinates, and every size
// that does not fit gives one uniform error naming the rule.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/core/error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_rank;
using test::world_size;

/// The reference, written from the layout's definition rather than from Megatron's stride arithmetic: world rank
/// w = tp_rank + tp·(cp_rank + cp·dp_rank) = tp_rank + tp·(ep_rank + ep·edp_rank), and a group is every rank that
/// agrees with w on the coordinates outside the group's dimensions.
struct Coords {
  int tp, cp, dp, ep, edp;
};
Coords coords_of(int w, int tp, int cp, int ep, int world) {
  const int dp = world / (tp * cp);
  (void)dp;
  return {w % tp, (w / tp) % cp, w / (tp * cp), (w / tp) % ep, w / (tp * ep)};
}
std::vector<int> reference_members(const std::string& group, int w, int tp, int cp, int ep, int world) {
  const Coords me = coords_of(w, tp, cp, ep, world);
  std::vector<int> out;
  for (int v = 0; v < world; ++v) {
    const Coords o = coords_of(v, tp, cp, ep, world);
    bool same;
    if (group == "tp" || group == "model-parallel") same = o.cp == me.cp && o.dp == me.dp;
    else if (group == "cp") same = o.tp == me.tp && o.dp == me.dp;
    else if (group == "dp") same = o.tp == me.tp && o.cp == me.cp;
    else if (group == "dp-cp") same = o.tp == me.tp;
    else if (group == "ep") same = o.tp == me.tp && o.edp == me.edp;
    else if (group == "expert-dp") same = o.tp == me.tp && o.ep == me.ep;
    else if (group == "expert-model-parallel") same = o.edp == me.edp;
    else same = true;  // world
    if (same) out.push_back(v);
  }
  return out;
}

/// The world ranks of `c`'s members, in group-rank order (an all-gather of each member's world rank).
std::vector<int> members(Communicator& c) {
  float mine = static_cast<float>(world_rank());
  std::vector<float> all(static_cast<size_t>(c.size()));
  std::vector<int64_t> counts(all.size(), 1), displs(all.size());
  for (size_t i = 0; i < displs.size(); ++i) displs[i] = static_cast<int64_t>(i);
  c.all_gather(&mine, all.data(), counts, displs, "members").wait();
  return std::vector<int>(all.begin(), all.end());
}

TEST(MeshGroups, MatchesMegatronOrderForEveryFittingSize) {
  // Pure arithmetic first (no MPI): every world up to 16 and every fitting size.
  for (int world = 1; world <= 16; ++world)
    for (int tp = 1; tp <= world; ++tp)
      for (int cp = 1; tp * cp <= world; ++cp) {
        if (world % (tp * cp) != 0) continue;
        const int dp = world / (tp * cp);
        for (int ep = 1; ep <= dp * cp; ++ep) {
          if ((dp * cp) % ep != 0) continue;
          const MeshSizes s{tp, cp, ep};
          EXPECT_EQ(mesh_dense_dp(world, s), dp);
          const auto dense = mesh_groups({tp, cp, dp}, {false, true, true});
          ASSERT_EQ(dense.size(), static_cast<size_t>(tp));
          for (int w = 0; w < world; ++w) {
            const MeshCoords c = mesh_coords(world, s, w);
            const Coords r = coords_of(w, tp, cp, ep, world);
            EXPECT_EQ(c.tp, r.tp);
            EXPECT_EQ(c.cp, r.cp);
            EXPECT_EQ(c.dp, r.dp);
            EXPECT_EQ(c.ep, r.ep);
            EXPECT_EQ(c.expert_dp, r.edp);
            // w's dp-cp group is the one of its tp rank, listed in ascending rank order.
            EXPECT_EQ(dense[static_cast<size_t>(c.tp)], reference_members("dp-cp", w, tp, cp, ep, world));
          }
        }
      }
}

TEST(MeshGroups, EightRanksAsTp2Cp2Dp2) {
  // The example, spelled out: tp groups {0,1},{2,3},...; cp pairs ranks two apart; dp four apart.
  EXPECT_EQ(mesh_groups({2, 2, 2}, {true, false, false}),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh_groups({2, 2, 2}, {false, true, false}),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh_groups({2, 2, 2}, {false, false, true}),
            (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh_groups({2, 2, 2}, {false, true, true}),
            (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // Expert view of the same 8 ranks with tp 2, ep 4: ep groups span the dense cp and dp ranks.
  EXPECT_EQ(mesh_groups({2, 4, 1}, {false, true, false}), (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(mesh_groups({2, 2, 2}, {false, true, false}),  // tp 2, ep 2, expert-dp 2
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(MeshSizesCheck, BadSizesGiveOneErrorNamingTheRule) {
  const auto message = [](int world, MeshSizes s) -> std::string {
    try {
      mesh_dense_dp(world, s);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_TRUE(e.uniform());
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(6, {4, 1, 1}).find("world size 6 is not divisible by --tensor-model-parallel-size 4; launch a "
                                      "multiple of 4 ranks (scripts/launch -n 8"),
            std::string::npos);
  EXPECT_NE(message(8, {2, 3, 1}).find("--context-parallel-size 3 = 6 (the layout is world = tp × cp × dp)"),
            std::string::npos);
  EXPECT_NE(message(8, {2, 1, 3}).find("--expert-model-parallel-size 3 does not divide dp × cp = 4 × 1"),
            std::string::npos);
  EXPECT_NE(message(8, {2, 2, 8}).find("expert parallelism subdivides"), std::string::npos);
  EXPECT_NE(message(4, {0, 1, 1}).find("--tensor-model-parallel-size must be >= 1"), std::string::npos);
  EXPECT_NE(message(4, {1, 0, 1}).find("--context-parallel-size must be >= 1"), std::string::npos);
  EXPECT_NE(message(4, {1, 1, -1}).find("--expert-model-parallel-size must be >= 1"), std::string::npos);
  EXPECT_EQ(message(8, {2, 2, 4}), "");  // ep 4 divides dp × cp = 2 × 2
}

TEST(MeshOnRanks, EveryGroupHasTheReferenceMembers) {
  const int world = world_size(), w = world_rank();
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  int combos = 0;
  for (int tp = 1; tp <= world; ++tp)
    for (int cp = 1; tp * cp <= world; ++cp) {
      if (world % (tp * cp) != 0) continue;
      const int dp = world / (tp * cp);
      for (int ep = 1; ep <= dp * cp; ++ep) {
        if ((dp * cp) % ep != 0) continue;
        SCOPED_TRACE(::testing::Message() << "world " << world << " tp " << tp << " cp " << cp << " ep " << ep);
        Mesh m = make_mesh({tp, cp, ep}, o);
        ++combos;
        EXPECT_EQ(m.dp_size(), dp);
        EXPECT_EQ(m.expert_dp_size(), world / (tp * ep));
        const std::pair<const char*, Communicator*> groups[] = {
            {"world", m.world.get()}, {"tp", m.tp.get()},       {"cp", m.cp.get()},
            {"dp", m.dp.get()},       {"dp-cp", m.dp_cp.get()}, {"ep", m.ep.get()},
            {"expert-dp", m.expert_dp.get()}, {"model-parallel", m.model_parallel.get()},
            {"expert-model-parallel", m.expert_model_parallel.get()}};
        for (const auto& [name, comm] : groups) {
          SCOPED_TRACE(name);
          EXPECT_EQ(members(*comm), reference_members(name, w, tp, cp, ep, world));
        }
        EXPECT_EQ(m.tp->rank(), m.tp_rank());
        EXPECT_EQ(m.cp->rank(), m.cp_rank());
        EXPECT_EQ(m.dp->rank(), m.dp_rank());
        EXPECT_EQ(m.ep->rank(), m.ep_rank());
        EXPECT_EQ(m.expert_dp->rank(), m.expert_dp_rank());
      }
    }
  // 8 ranks cover tp2·cp2·dp2 with ep 1, 2 and 4 among the combinations.
  if (world == 8) EXPECT_GE(combos, 20);
}

TEST(MeshOnRanks, BadSizesThrowOnEveryRankBeforeAnyGroup) {
  const int world = world_size();
  CommOptions o;
  try {
    make_mesh({world + 1, 1, 1}, o);
    FAIL() << "tp above the world was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.uniform());
    EXPECT_NE(std::string(e.what()).find("is not divisible by --tensor-model-parallel-size"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace coc
