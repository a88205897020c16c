// coc-test-np: 1 2 4 8
// coc-test-timeout: 240
// Placements drive the gradient synchronisation and the gradient norm (coc/parallel/grad_sync.h): on every mesh
// that fits the world, parameters with distinct placements (TP-sharded, TP-replicated with and without a
// sequence-parallel partial gradient, expert weights, a dp-only replica group) are each reduced over their own
// group, and the norm equals the norm of the full gradient computed from the definition. make_gradient_sync
// (coc/parallel/gradient_sync.h) picks each strategy with its hooks, and its all-reduces match sync_gradients bit for
// bit.
#include <gtest/gtest.h>

#include <cmath>
#include <array>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/parallel/grad_sync.h"
#include "coc/parallel/gradient_sync.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_rank;
using test::world_size;

struct Layout {
  int world, tp, cp, ep;
  int dp() const { return world / (tp * cp); }
  int tp_of(int w) const { return w % tp; }
  int cp_of(int w) const { return (w / tp) % cp; }
  int dp_of(int w) const { return w / (tp * cp); }
  int ep_of(int w) const { return (w / tp) % ep; }
  int edp_of(int w) const { return w / (tp * ep); }
  /// World ranks that agree with w on `same` (a predicate of two ranks).
  std::vector<int> group(int w, const std::function<bool(int, int)>& same) const {
    std::vector<int> g;
    for (int v = 0; v < world; ++v)
      if (same(w, v)) g.push_back(v);
    return g;
  }
  std::vector<int> tp_group(int w) const {
    return group(w, [&](int a, int b) { return cp_of(a) == cp_of(b) && dp_of(a) == dp_of(b); });
  }
  std::vector<int> dp_group(int w) const {
    return group(w, [&](int a, int b) { return tp_of(a) == tp_of(b) && cp_of(a) == cp_of(b); });
  }
  std::vector<int> dp_cp_group(int w) const { return group(w, [&](int a, int b) { return tp_of(a) == tp_of(b); }); }
  std::vector<int> expert_dp_group(int w) const {
    return group(w, [&](int a, int b) { return tp_of(a) == tp_of(b) && ep_of(a) == ep_of(b); });
  }
  std::vector<int> expert_mp_group(int w) const { return group(w, [&](int a, int b) { return edp_of(a) == edp_of(b); }); }
};

/// Before the sync, element i of every parameter on world rank w holds (i + 1) · (1 + w): every rank different.
double raw(int w, int64_t i) { return static_cast<double>(i + 1) * (1 + w); }

/// Σ_{v in g} f(v) / (dp · cp): every group's sum is scaled to the global-batch mean over the dp × cp ranks.
double mean_over(const Layout& L, const std::vector<int>& g, const std::function<double(int)>& f) {
  double s = 0;
  for (int v : g) s += f(v);
  return s / static_cast<double>(L.dp() * L.cp);
}

struct Case {
  std::string name;
  Placement placement;
  int64_t numel;
  /// The synced value of element i on rank w, from the definitions. The expert case holds the sum over expert-dp
  /// divided by dp × cp (not by expert-dp), the global-batch scaling of Megatron's expert gradients.
  std::function<double(const Layout&, int, int64_t)> expected;
};

std::vector<Case> cases() {
  return {
      {"tp_shard", Placement::tp_shard(), 7,
       [](const Layout& L, int w, int64_t i) {
         return mean_over(L, L.dp_cp_group(w), [&](int v) { return raw(v, i); });
       }},
      {"norm_sp", Placement::tp_replicated(true), 13,
       [](const Layout& L, int w, int64_t i) {
         return mean_over(L, L.dp_cp_group(w), [&](int v) {
           double s = 0;
           for (int t : L.tp_group(v)) s += raw(t, i);
           return s;
         });
       }},
      {"row_bias", Placement::tp_replicated(false), 5,
       [](const Layout& L, int w, int64_t i) {
         return mean_over(L, L.dp_cp_group(w), [&](int v) { return raw(v, i); });
       }},
      {"expert", Placement::expert(true), 11,
       [](const Layout& L, int w, int64_t i) {
         return mean_over(L, L.expert_dp_group(w), [&](int v) { return raw(v, i); });
       }},
      {"dp_only", {true, false, false, MeshGroup::kDp}, 3,
       [](const Layout& L, int w, int64_t i) {
         return mean_over(L, L.dp_group(w), [&](int v) { return raw(v, i); });
       }},
  };
}

/// The parameter of case `c` on world rank w, its gradient raw(w, ·) (its value zero).
void init_param(Param& p, const Case& c, int w) {
  p.name = c.name;
  p.placement = c.placement;
  p.value.resize({c.numel});
  p.grad.resize({c.numel});
  for (int64_t i = 0; i < c.numel; ++i) p.grad[i] = static_cast<float>(raw(w, i));
}

TEST(GradSync, EachPlacementIsReducedOverItsGroupAndTheNormIsTheFullOne) {
  const int world = world_size(), me = world_rank();
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  for (int tp = 1; tp <= world; ++tp)
    for (int cp = 1; tp * cp <= world; ++cp) {
      if (world % (tp * cp) != 0) continue;
      const int dp = world / (tp * cp);
      for (int ep = 1; ep <= dp * cp; ++ep) {
        if ((dp * cp) % ep != 0) continue;
        const Layout L{world, tp, cp, ep};
        Mesh mesh = make_mesh({tp, cp, ep}, o);
        for (bool deterministic : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "tp " << tp << " cp " << cp << " ep " << ep << " dp " << dp
                                            << " deterministic " << deterministic);
          const std::vector<Case> cs = cases();
          std::vector<Param> storage(cs.size());
          ParamList params;
          for (size_t c = 0; c < cs.size(); ++c) {
            init_param(storage[c], cs[c], me);
            params.push_back(&storage[c]);
          }
          sync_gradients(mesh, params, deterministic);
          for (size_t c = 0; c < cs.size(); ++c)
            for (int64_t i = 0; i < cs[c].numel; ++i)
              EXPECT_NEAR(storage[c].grad[i], cs[c].expected(L, me, i), 1e-5 * cs[c].expected(L, me, i))
                  << cs[c].name << "[" << i << "]";

          // The full gradient: every TP shard of a dense tensor (one per rank of my tp group), a TP-replicated
          // tensor once (TP rank 0's copy), every tp × ep shard of an expert tensor.
          double full = 0;
          for (size_t c = 0; c < cs.size(); ++c) {
            const Placement& pl = cs[c].placement;
            std::vector<int> holders = pl.ep_sharded ? L.expert_mp_group(me) : L.tp_group(me);
            for (int v : holders) {
              if (!pl.tp_sharded && L.tp_of(v) != 0) continue;
              for (int64_t i = 0; i < cs[c].numel; ++i) full += std::pow(cs[c].expected(L, v, i), 2);
            }
          }
          const double norm = grad_norm(mesh, params);
          EXPECT_NEAR(norm, std::sqrt(full), 1e-6 * std::sqrt(full));
        }
      }
    }
}

TEST(GradSync, DenseOnlyNormIsOneReductionOverTheModelParallelGroup) {
  // Without expert parameters the norm takes one collective on the model-parallel group and none elsewhere, so
  // dense runs keep the collectives (and bits) they had before placements existed.
  const int world = world_size();
  CommOptions o;
  Mesh mesh = make_mesh({world, 1, 1}, o);
  Param p;
  p.name = "w";
  p.value.resize({4});
  p.grad.resize({4});
  p.grad.fill(1.0f);
  ParamList ps{&p};
  const uint64_t mp = mesh.model_parallel->next_seq(), emp = mesh.expert_model_parallel->next_seq();
  EXPECT_DOUBLE_EQ(grad_norm(mesh, ps), std::sqrt(4.0 * world));
  EXPECT_EQ(mesh.model_parallel->next_seq(), mp + 1);
  EXPECT_EQ(mesh.expert_model_parallel->next_seq(), emp);
}

/// Two modules of the dense cases ({tp_shard, norm_sp}, {row_bias}), each gradient holding raw() of this rank.
struct DenseModules {
  std::vector<Param> storage = std::vector<Param>(3);
  std::vector<ParamList> modules{{&storage[0], &storage[1]}, {&storage[2]}};
  DenseModules() {
    const std::vector<Case> cs = cases();
    for (size_t c = 0; c < storage.size(); ++c) init_param(storage[c], cs[c], world_rank());
  }
  ParamList all() { return {&storage[0], &storage[1], &storage[2]}; }
};

/// The hooks a strategy registers, by point, to run by hand.
struct Hooks {
  std::array<std::vector<ModuleHook>, 4> at;
  HookRegistrar registrar() {
    return [this](HookPoint p, ModuleHook h) { at[static_cast<size_t>(p)].push_back(std::move(h)); };
  }
  size_t count(HookPoint p) const { return at[static_cast<size_t>(p)].size(); }
};

TEST(GradientSync, FactoryPicksEachStrategyWithItsHooks) {
  CommOptions o;
  Mesh mesh = make_mesh({1, 1, 1}, o);
  GradSyncOptions plain, overlapped, switchable, zero1;
  overlapped.overlap_grad_reduce = true;
  switchable.overlap_grad_reduce_switchable = true;
  zero1.sharding.strategy = ShardingStrategy::kOptim;
  struct Want {
    const char* name;
    GradSyncOptions opts;
    size_t post_backward, other_hooks;
    bool sharded;
  };
  for (const Want& w : {Want{"plain", plain, 0, 0, false}, Want{"overlapped", overlapped, 1, 0, false},
                        Want{"switchable", switchable, 1, 0, false}, Want{"optim", zero1, 1, 3, true}}) {
    SCOPED_TRACE(w.name);
    DenseModules m;
    Hooks h;
    std::unique_ptr<GradientSync> s = make_gradient_sync(mesh, m.modules, w.opts, h.registrar());
    EXPECT_EQ(h.count(HookPoint::kPostBackward), w.post_backward);
    EXPECT_EQ(h.count(HookPoint::kPreForward) + h.count(HookPoint::kPostForward) + h.count(HookPoint::kPreBackward),
              w.other_hooks);
    EXPECT_EQ(s->sharded() != nullptr, w.sharded);
    EXPECT_EQ(s->optimizer_params().size(), m.storage.size());
    if (!w.sharded) EXPECT_EQ(s->optimizer_params(), m.all());
    if (!w.sharded) EXPECT_EQ(s->memory().parameters, 4 * (7 + 13 + 5));
  }
}

TEST(GradientSync, AllReducesEqualSyncGradientsBitwise) {
  // Overlap on (posted from the hooks), on but not the last micro-batch (nothing posted: finish falls back), and
  // switched off by set_switches: each must leave the bits of sync_gradients, and the same norm.
  const int world = world_size();
  CommOptions o;
  for (int tp : {1, 2}) {
    if (world % tp != 0) continue;
    Mesh mesh = make_mesh({tp, 1, 1}, o);
    DenseModules ref;
    sync_gradients(mesh, ref.all(), /*deterministic=*/true);
    const double ref_norm = grad_norm(mesh, ref.all());
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " variant " << variant);
      DenseModules m;
      Hooks h;
      GradSyncOptions opts;
      opts.sharding.deterministic = true;
      opts.overlap_grad_reduce = variant > 0;
      std::unique_ptr<GradientSync> s = make_gradient_sync(mesh, m.modules, opts, h.registrar());
      if (variant == 3) s->set_switches(1, 1, false, DType::kF32);
      s->begin_micro_batch(/*last=*/variant != 2);
      for (int i = static_cast<int>(m.modules.size()) - 1; i >= 0; --i)
        for (const ModuleHook& hook : h.at[static_cast<size_t>(HookPoint::kPostBackward)]) hook(i);
      s->finish();
      for (size_t c = 0; c < m.storage.size(); ++c)
        EXPECT_EQ(std::memcmp(m.storage[c].grad.data(), ref.storage[c].grad.data(),
                              sizeof(float) * static_cast<size_t>(m.storage[c].grad.numel())),
                  0)
            << m.storage[c].name;
      EXPECT_EQ(s->grad_norm(), ref_norm);
      EXPECT_EQ(s->take_wait_seconds(), 0.0);
    }
  }
}

}  // namespace
}  // namespace coc
