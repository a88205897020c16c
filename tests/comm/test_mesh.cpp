// coc-test-np: 1 2 4 8
// coc-test-timeout: 240
// The rank mesh (coc/comm/mesh.h), as pure arithmetic and on real MPI ranks: for every (tp, cp, pp, ep) that fits
// the world, every row of the group table has the members of Megatron's rank formula, computed here independently
// from coordinates (and written out for a few sizes, as Megatron's RankGenerator lists them); every size or order
// string that does not fit gives one uniform error naming the rule.
#include <fmt/format.h>
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
/// w = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)) = tp_rank + tp·(ep_rank + ep·(edp_rank + edp·pp_rank)),
/// and a group is every rank that agrees with w on the coordinates outside the group's dimensions.
struct Coords {
  int tp, cp, dp, ep, edp, pp;
};
Coords coords_of(int w, int tp, int cp, int ep, int world, int pp = 1) {
  const int dp = world / (tp * cp * pp), edp = world / (tp * ep * pp);
  return {w % tp, (w / tp) % cp, (w / (tp * cp)) % dp, (w / tp) % ep, (w / (tp * ep)) % edp, w / (tp * cp * dp)};
}
std::vector<int> reference_members(const std::string& group, int w, int tp, int cp, int ep, int world, int pp = 1) {
  const Coords me = coords_of(w, tp, cp, ep, world, pp);
  std::vector<int> out;
  for (int v = 0; v < world; ++v) {
    const Coords o = coords_of(v, tp, cp, ep, world, pp);
    bool same;
    if (group == "tp") same = o.cp == me.cp && o.dp == me.dp && o.pp == me.pp;
    else if (group == "model-parallel") same = o.cp == me.cp && o.dp == me.dp;
    else if (group == "cp") same = o.tp == me.tp && o.dp == me.dp && o.pp == me.pp;
    else if (group == "dp") same = o.tp == me.tp && o.cp == me.cp && o.pp == me.pp;
    else if (group == "dp-cp") same = o.tp == me.tp && o.pp == me.pp;
    else if (group == "pp") same = o.tp == me.tp && o.cp == me.cp && o.dp == me.dp;
    else if (group == "ep") same = o.tp == me.tp && o.edp == me.edp && o.pp == me.pp;
    else if (group == "expert-dp") same = o.tp == me.tp && o.ep == me.ep && o.pp == me.pp;
    else if (group == "expert-model-parallel") same = o.edp == me.edp;
    else same = true;  // world
    if (same) out.push_back(v);
  }
  return out;
}

/// The groups of one row of the table, as make_mesh lists them.
std::vector<std::vector<int>> table_groups(int world, const MeshSizes& s, GroupName g,
                                           std::string_view order = kMeshOrder) {
  for (const GroupSpec& spec : process_group_table())
    if (spec.group == g) return mesh_layout(world, s, order).groups(spec.dims);
  return {};
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

/// Every (tp, cp, ep, pp) that fits `world`: tp · cp · pp divides it and ep divides dp · cp.
std::vector<MeshSizes> fitting_sizes(int world) {
  std::vector<MeshSizes> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int cp = 1; tp * cp <= world; ++cp)
      for (int pp = 1; tp * cp * pp <= world; ++pp) {
        if (world % (tp * cp * pp) != 0) continue;
        const int dp = world / (tp * cp * pp);
        for (int ep = 1; ep <= dp * cp; ++ep)
          if ((dp * cp) % ep == 0) out.push_back({tp, cp, ep, pp});
      }
  return out;
}

TEST(MeshGroups, EveryTableRowMatchesTheReferenceWithPp) {
  // Every row of the table, for every world up to 16 and every fitting tp, cp, pp and ep, against the layout's
  // definition: each rank lies in exactly the group the reference gives it.
  int checked = 0;
  for (int world = 1; world <= 16; ++world)
    for (const MeshSizes& s : fitting_sizes(world)) {
      const auto [tp, cp, ep, pp] = s;
      const MeshLayout l = mesh_layout(world, s);
      EXPECT_EQ(l.dense.size(MeshDim::kDp), world / (tp * cp * pp));
      EXPECT_EQ(l.expert.size(MeshDim::kExpertDp), world / (tp * ep * pp));
      for (const GroupSpec& spec : process_group_table())
        for (const std::vector<int>& group : l.groups(spec.dims))
          for (int w : group) {
            SCOPED_TRACE(::testing::Message() << spec.name << " world " << world << " tp " << tp << " cp " << cp
                                              << " pp " << pp << " ep " << ep << " rank " << w);
            EXPECT_EQ(group, reference_members(spec.name, w, tp, cp, ep, world, pp));
            ++checked;
          }
      for (int w = 0; w < world; ++w) {
        const MeshCoords c = mesh_coords(world, s, w);
        const Coords r = coords_of(w, tp, cp, ep, world, pp);
        EXPECT_EQ(std::vector<int>({c.tp, c.cp, c.dp, c.pp, c.ep, c.expert_dp}),
                  std::vector<int>({r.tp, r.cp, r.dp, r.pp, r.ep, r.edp}));
      }
    }
  EXPECT_GT(checked, 10000);
}

TEST(MeshGroups, SixteenRanksAsTp2Cp2Dp2Pp2) {
  // Megatron's RankGenerator(tp=2, cp=2, dp=2, pp=2, order="tp-cp-ep-dp-pp").get_ranks(token), written out.
  using V = std::vector<std::vector<int>>;
  const MeshSizes s{.tp = 2, .cp = 2, .ep = 2, .pp = 2};
  EXPECT_EQ(table_groups(16, s, GroupName::kTp), (V{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13},
                                                    {14, 15}}));
  EXPECT_EQ(table_groups(16, s, GroupName::kCp), (V{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14},
                                                    {13, 15}}));
  EXPECT_EQ(table_groups(16, s, GroupName::kDp), (V{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14},
                                                    {11, 15}}));
  EXPECT_EQ(table_groups(16, s, GroupName::kPp), (V{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14},
                                                    {7, 15}}));
  EXPECT_EQ(table_groups(16, s, GroupName::kDpCp), (V{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  // get_ranks("tp-pp"): Megatron's model-parallel group.
  EXPECT_EQ(table_groups(16, s, GroupName::kModelParallel),
            (V{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(table_groups(16, s, GroupName::kWorld).size(), 1u);
  // The expert generator (tp=2, ep=2, dp=expert-dp=2, pp=2, cp=1): get_ranks("ep"), ("dp"), ("tp-ep-pp").
  EXPECT_EQ(table_groups(16, s, GroupName::kEp), table_groups(16, s, GroupName::kCp));
  EXPECT_EQ(table_groups(16, s, GroupName::kExpertDp), table_groups(16, s, GroupName::kDp));
  EXPECT_EQ(table_groups(16, s, GroupName::kExpertModelParallel),
            (V{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
  // ep 4 spans cp × dp inside each pp stage; expert-dp is then 1.
  const MeshSizes ep4{.tp = 2, .cp = 2, .ep = 4, .pp = 2};
  EXPECT_EQ(table_groups(16, ep4, GroupName::kEp), (V{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(table_groups(16, ep4, GroupName::kExpertDp).size(), 16u);
  EXPECT_EQ(table_groups(16, ep4, GroupName::kExpertModelParallel),
            (V{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}));
}

TEST(MeshGroups, OddSizes) {
  using V = std::vector<std::vector<int>>;
  EXPECT_EQ(table_groups(6, {.tp = 3}, GroupName::kTp), (V{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(table_groups(6, {.tp = 3}, GroupName::kDp), (V{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(table_groups(6, {.tp = 3, .pp = 2}, GroupName::kPp), (V{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(table_groups(6, {.tp = 3, .pp = 2}, GroupName::kDp), (V{{0}, {1}, {2}, {3}, {4}, {5}}));
  EXPECT_EQ(table_groups(6, {.tp = 3, .pp = 2}, GroupName::kModelParallel), (V{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(table_groups(6, {.tp = 1, .cp = 3}, GroupName::kCp), (V{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(table_groups(6, {.tp = 1, .cp = 3, .ep = 3}, GroupName::kEp), (V{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(table_groups(6, {.tp = 1, .cp = 3, .ep = 2}, GroupName::kEp), (V{{0, 1}, {2, 3}, {4, 5}}));
}

TEST(MeshOrder, ViewsAreSpelledAsMegatronDoes) {
  const MeshLayout l = mesh_layout(16, {.tp = 2, .cp = 2, .ep = 2, .pp = 2});
  EXPECT_EQ(l.dense.order(), "tp-cp-dp-pp");
  EXPECT_EQ(l.expert.order(), "tp-ep-dp-pp");
  EXPECT_EQ(l.dense.sizes, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(parse_mesh_order(kMeshOrder),
            (std::vector<MeshDim>{MeshDim::kTp, MeshDim::kCp, MeshDim::kEp, MeshDim::kDp, MeshDim::kPp}));
  // Another order moves the dimensions: pp innermost, then tp (RankGenerator(order="pp-tp-cp-ep-dp")).
  using V = std::vector<std::vector<int>>;
  const MeshSizes s{.tp = 2, .pp = 2};
  EXPECT_EQ(mesh_layout(8, s, "pp-tp-cp-ep-dp").dense.order(), "pp-tp-cp-dp");
  EXPECT_EQ(table_groups(8, s, GroupName::kPp, "pp-tp-cp-ep-dp"), (V{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(table_groups(8, s, GroupName::kTp, "pp-tp-cp-ep-dp"), (V{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(table_groups(8, s, GroupName::kDp, "pp-tp-cp-ep-dp"), (V{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(MeshOrder, BadOrdersGiveOneErrorNamingTheOrder) {
  const auto message = [](std::string_view order) -> std::string {
    try {
      parse_mesh_order(order);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_TRUE(e.uniform());
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("tp-cp-xp-dp-pp").find("unknown dimension 'xp' in the parallel order 'tp-cp-xp-dp-pp'"),
            std::string::npos);
  EXPECT_NE(message("").find("unknown dimension '' in the parallel order ''"), std::string::npos);
  EXPECT_NE(message("tp-cp-ep-dp-pp-").find("unknown dimension ''"), std::string::npos);
  EXPECT_NE(message("tp-cp-tp-ep-dp-pp").find("dimension 'tp' appears twice"), std::string::npos);
  EXPECT_NE(message("tp-cp-ep-dp").find("the parallel order 'tp-cp-ep-dp' lacks 'pp'"), std::string::npos);
  EXPECT_NE(message("tp-cp-pp-ep-dp").find("separates cp, ep and dp; keep them adjacent"), std::string::npos);
  EXPECT_EQ(message("tp-dp-ep-cp-pp"), "");
  EXPECT_EQ(message(kMeshOrder), "");
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
  // pp joins the dense product: tp · cp · pp must divide the world.
  EXPECT_NE(message(8, {.tp = 2, .pp = 3}).find("world size 8 is not divisible by --tensor-model-parallel-size 2 × "
                                                "--pipeline-model-parallel-size 3 = 6 (the layout is world = tp × cp "
                                                "× pp × dp); launch a multiple of 6 ranks (scripts/launch -n 12"),
            std::string::npos);
  EXPECT_NE(message(16, {.tp = 2, .cp = 3, .pp = 2}).find("--tensor-model-parallel-size 2 × --context-parallel-size 3 "
                                                          "× --pipeline-model-parallel-size 2 = 12"),
            std::string::npos);
  EXPECT_NE(message(4, {.pp = 0}).find("--pipeline-model-parallel-size must be >= 1 (got 0)"), std::string::npos);
  EXPECT_NE(message(8, {.tp = 2, .ep = 4, .pp = 2}).find("--expert-model-parallel-size 4 does not divide dp × cp = "
                                                         "2 × 1"),
            std::string::npos);
  EXPECT_EQ(message(8, {.tp = 2, .ep = 2, .pp = 2}), "");
}

TEST(MeshOnRanks, EveryGroupHasTheReferenceMembers) {
  const int world = world_size(), w = world_rank();
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  const std::vector<MeshSizes> all = fitting_sizes(world);
  for (const MeshSizes& s : all) {
    const auto [tp, cp, ep, pp] = s;
    SCOPED_TRACE(::testing::Message() << "world " << world << " tp " << tp << " cp " << cp << " pp " << pp << " ep "
                                      << ep);
    Mesh m = make_mesh(s, o);
    EXPECT_EQ(m.dp_size(), world / (tp * cp * pp));
    EXPECT_EQ(m.expert_dp_size(), world / (tp * ep * pp));
    for (const GroupSpec& spec : process_group_table()) {
      SCOPED_TRACE(spec.name);
      EXPECT_EQ(&m.group(spec.group), (m.*spec.member).get());
      EXPECT_EQ(m.group(spec.group).name(), spec.name);
      EXPECT_EQ(members(m.group(spec.group)), reference_members(spec.name, w, tp, cp, ep, world, pp));
    }
    EXPECT_EQ(m.tp->rank(), m.tp_rank());
    EXPECT_EQ(m.cp->rank(), m.cp_rank());
    EXPECT_EQ(m.dp->rank(), m.dp_rank());
    EXPECT_EQ(m.pp->rank(), m.pp_rank());
    EXPECT_EQ(m.ep->rank(), m.ep_rank());
    EXPECT_EQ(m.expert_dp->rank(), m.expert_dp_rank());
  }
  // 8 ranks cover tp2·cp2·dp2 with ep 1, 2 and 4 among the combinations.
  if (world == 8) EXPECT_GE(all.size(), 20u);
}

TEST(MeshOnRanks, PipelineGroupsOnFourRanks) {
  // tp 1, pp 2 on 4 ranks: dp 2 inside each stage ({0, 1}, {2, 3}), the stages pair ranks two apart.
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int w = world_rank();
  Mesh m = make_mesh({.tp = 1, .pp = 2}, CommOptions{});
  EXPECT_EQ(m.pp_size(), 2);
  EXPECT_EQ(m.dp_size(), 2);
  EXPECT_EQ(m.pp_rank(), w / 2);
  EXPECT_EQ(members(*m.pp), (std::vector<int>{w % 2, w % 2 + 2}));
  EXPECT_EQ(members(*m.dp), (std::vector<int>{w / 2 * 2, w / 2 * 2 + 1}));
  EXPECT_EQ(members(*m.model_parallel), members(*m.pp));
  EXPECT_EQ(m.describe(), fmt::format("tp 0/1, cp 0/1, dp {}/2, pp {}/2, ep 0/1, expert-dp {}/2", w % 2, w / 2, w % 2));
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
