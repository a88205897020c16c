// coc-test-np: 1 2 3 4
// coc-test-timeout: 240
// Sharded data parallelism (coc/parallel/fsdp.h) against the unsharded reference (sync_gradients, grad_norm, AdamW
// on full parameters): every strategy, with parameter sizes that do not divide by dp (uneven, padded shards; a
// parameter smaller than dp), tp × dp when the world allows, expert parameters (MoE: sharded over expert-dp, which
// is smaller than dp once ep > 1, while the dense ones shard over dp), gradient accumulation over micro-batches, a
// frozen parameter, prefetch depths 0..3 and randomly delayed gathers. Under --deterministic the sharded step must
// be bitwise equal to no_shard's; otherwise within fp32 rounding. Under --bf16 the parameters only GEMMs read are
// gathered in bf16 (FsdpOptions::param_gather_dtype): rounded values in half the bytes, the masters untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/model/optimizer.h"
#include "coc/parallel/fsdp.h"
#include "coc/parallel/grad_sync.h"
#include "coc/runtime/tracer.h"
#include "support/expect_error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_rank;
using test::world_size;

/// Module i's parameters: sizes chosen so that no dp size in 2..4 divides all of them, one of 1 element; two expert
/// weights (the model's experts are tp-replicated; a tp-sharded one exercises the other grad-norm path). The
/// weights are read only by GEMMs (Param::read_as_compute_type), the norms and the bias are not.
struct Spec {
  std::string name;
  int64_t numel;
  Placement placement;
  bool frozen = false;
  bool gemm_only = true;
};
std::vector<std::vector<Spec>> model_specs() {
  return {{{"emb", 37, Placement::tp_shard()}},
          {{"l0.w", 29, Placement::tp_shard()}, {"l0.norm", 5, Placement::tp_replicated(true), false, false},
           {"l0.b", 1, Placement::tp_replicated(false), false, false}, {"l0.experts", 13, Placement::expert(false)}},
          {{"l1.w", 31, Placement::tp_shard(), true}, {"l1.norm", 7, Placement::tp_replicated(true), false, false},
           {"l1.experts", 11, Placement::expert(true)}},
          {{"head", 23, Placement::tp_shard()}}};
}

/// The value of element i of `name` on this rank: equal on data-parallel replicas, different across tp ranks for
/// tp-sharded tensors and across ep ranks for experts.
float init_value(const Spec& s, int tp_rank, int ep_rank, int64_t i) {
  const int shard = (s.placement.tp_sharded ? tp_rank : 0) + (s.placement.ep_sharded ? 5 * ep_rank : 0);
  return 0.01f * static_cast<float>((i * 7 + static_cast<int64_t>(s.name.size()) * 3 + shard * 11) % 17) - 0.05f;
}
/// The gradient micro-batch `mb` adds to element i on world rank w: different on every rank.
float grad_value(int w, int mb, int64_t i) { return 0.1f * static_cast<float>((i + 1) * (w + 2) % 13) - 0.3f * mb; }

struct Model {
  std::vector<std::vector<Spec>> specs = model_specs();
  std::vector<std::unique_ptr<Param>> storage;
  std::vector<ParamList> modules;
  ParamList all;
  explicit Model(const Mesh& mesh) {
    for (const auto& mod : specs) {
      ParamList ps;
      for (const Spec& s : mod) {
        auto p = std::make_unique<Param>();
        p->name = s.name;
        p->placement = s.placement;
        p->requires_grad = !s.frozen;
        p->read_as_compute_type = s.gemm_only;
        p->weight_decay = s.placement.tp_sharded;
        p->value = Tensor({s.numel});
        p->grad = Tensor({s.numel});
        for (int64_t i = 0; i < s.numel; ++i) p->value[i] = init_value(s, mesh.tp_rank(), mesh.ep_rank(), i);
        ps.push_back(p.get());
        all.push_back(p.get());
        storage.push_back(std::move(p));
      }
      modules.push_back(ps);
    }
  }
  /// The backward of module i for micro-batch mb: accumulate into the full gradients (frozen ones stay zero).
  void backward(int i, int mb, int w) {
    for (Param* p : modules[static_cast<size_t>(i)]) {
      ASSERT_GT(p->grad.numel(), 0) << p->name << ": the full gradient exists during its backward";
      if (!p->requires_grad) continue;
      for (int64_t j = 0; j < p->grad.numel(); ++j) p->grad[j] += grad_value(w, mb, j);
    }
  }
};

struct Outcome {
  double norm = 0;
  std::vector<std::vector<float>> values;  ///< every parameter after `steps` steps
};

constexpr int kSteps = 2;

Outcome run_reference(Mesh& mesh, int micro_batches, bool deterministic) {
  Model m(mesh);
  OptimizerConfig oc;
  oc.lr = 0.01f;
  AdamW opt(m.all, oc);
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    for (Param* p : m.all) p->grad.zero();
    for (int mb = 0; mb < micro_batches; ++mb)
      for (int i = static_cast<int>(m.modules.size()) - 1; i >= 0; --i) m.backward(i, mb + step, mesh.world->rank());
    sync_gradients(mesh, m.all, deterministic);
    out.norm = grad_norm(mesh, m.all);
    opt.step(oc.lr, clip_scale(out.norm, 1.0f));
  }
  for (Param* p : m.all) out.values.emplace_back(p->value.data(), p->value.data() + p->value.numel());
  return out;
}

Outcome run_sharded(Mesh& mesh, int micro_batches, FsdpOptions fo, int* max_unsharded) {
  Model m(mesh);
  FullyShardedDataParallel f(mesh, m.modules, fo);
  OptimizerConfig oc;
  oc.lr = 0.01f;
  AdamW opt(f.shard_params(), oc);
  const int L = static_cast<int>(m.modules.size());
  const bool zero3 = fo.strategy == ShardingStrategy::kOptimGradsParams;
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    for (Param* p : m.all) p->grad.zero();
    for (int mb = 0; mb < micro_batches; ++mb) {
      f.begin_forward(mb == micro_batches - 1);
      for (int i = 0; i < L; ++i) {
        f.pre_forward(i);
        if (zero3)
          for (Param* p : m.modules[static_cast<size_t>(i)]) EXPECT_GT(p->value.numel(), 0) << "gathered before use";
        f.post_forward(i);
      }
      for (int i = L - 1; i >= 0; --i) {
        f.pre_backward(i);
        m.backward(i, mb + step, mesh.world->rank());
        f.post_backward(i);
      }
      if (zero3) EXPECT_EQ(f.modules_unsharded(), 0) << "everything is freed after the backward";
    }
    f.finish_gradients();
    out.norm = f.grad_norm();
    opt.step(oc.lr, clip_scale(out.norm, 1.0f));
    f.after_step();
  }
  *max_unsharded = f.max_modules_unsharded();
  // The parameters after the steps: optim_grads_params gathers them (as a checkpoint does).
  std::vector<Tensor> fm, fv;
  f.gather_full_state(opt.exp_avg(), opt.exp_avg_sq(), fm, fv);
  for (Param* p : m.all) out.values.emplace_back(p->value.data(), p->value.data() + p->value.numel());
  f.release_full();
  if (zero3)
    for (Param* p : m.all) EXPECT_EQ(p->value.numel(), 0) << p->name << " is freed again";
  return out;
}

void expect_same(const Outcome& a, const Outcome& b, bool bitwise, const std::string& what) {
  SCOPED_TRACE(what);
  if (bitwise)
    EXPECT_EQ(a.norm, b.norm);
  else
    EXPECT_NEAR(a.norm, b.norm, 1e-5 * b.norm);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t k = 0; k < a.values.size(); ++k) {
    ASSERT_EQ(a.values[k].size(), b.values[k].size()) << "parameter " << k;
    for (size_t j = 0; j < a.values[k].size(); ++j)
      if (bitwise)
        EXPECT_EQ(a.values[k][j], b.values[k][j]) << "parameter " << k << " element " << j;
      else
        EXPECT_NEAR(a.values[k][j], b.values[k][j], 1e-5) << "parameter " << k << " element " << j;
  }
}

/// The ep sizes to try with dp data-parallel ranks: 1 (expert-dp = dp), 2 and dp (expert-dp 1), where they divide dp.
std::vector<int> ep_sizes(int dp) {
  std::vector<int> eps{1};
  for (int ep : {2, dp})
    if (ep > eps.back() && dp % ep == 0) eps.push_back(ep);
  return eps;
}

TEST(Fsdp, EveryStrategyMatchesNoShard) {
  const int world = world_size();
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  for (int tp : {1, 2}) {
    if (world % tp != 0 || (tp == 2 && world < 4)) continue;
    for (int ep : ep_sizes(world / tp)) {
      Mesh mesh = make_mesh({tp, 1, ep}, o);
      for (bool det : {true, false})
        for (int mbs : {1, 3}) {
          const Outcome ref = run_reference(mesh, mbs, det);
          for (ShardingStrategy s :
               {ShardingStrategy::kOptim, ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams})
            for (int pf : {0, 1, 2, 7}) {
              if (pf != 1 && s != ShardingStrategy::kOptimGradsParams) continue;
              FsdpOptions fo;
              fo.strategy = s;
              fo.forward_prefetch = fo.backward_prefetch = pf;
              fo.deterministic = det;
              int max_unsharded = 0;
              const Outcome got = run_sharded(mesh, mbs, fo, &max_unsharded);
              const std::string what =
                  fmt::format("tp {} dp {} ep {} {} deterministic {} micro-batches {} prefetch {}", tp, mesh.dp_size(),
                              ep, to_string(s), det, mbs, pf);
              expect_same(got, ref, det, what);
              if (s == ShardingStrategy::kOptimGradsParams)
                EXPECT_LE(max_unsharded, std::min(pf, 3) + 1) << what << ": at most F + 1 modules unsharded";
            }
        }
    }
  }
}

TEST(Fsdp, RandomlyDelayedGathersGiveTheSameBits) {
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  Mesh mesh = make_mesh({1, 1, 1}, o);
  FsdpOptions fo;
  fo.deterministic = true;
  int unused = 0;
  const Outcome plain = run_sharded(mesh, 2, fo, &unused);
  for (uint64_t seed : {1u, 2u, 3u}) {
    fo.random_delay_seed = seed * 1000 + static_cast<uint64_t>(world_rank());
    fo.forward_prefetch = static_cast<int>(seed) - 1;
    fo.backward_prefetch = 3 - static_cast<int>(seed);
    expect_same(run_sharded(mesh, 2, fo, &unused), plain, true, fmt::format("delay seed {}", seed));
  }
}

// Each parameter is split over its own replicas: dense weights over dp, experts over expert-dp (dp / ep); the
// memory line counts exactly those padded shards.
TEST(Fsdp, ShardsAreSplitRowsOfTheFlatParameterPadded) {
  CommOptions o;
  for (int ep : ep_sizes(world_size())) {
    SCOPED_TRACE(fmt::format("ep {}", ep));
    Mesh mesh = make_mesh({1, 1, ep}, o);
    Model m(mesh);
    FsdpOptions fo;
    fo.strategy = ShardingStrategy::kOptimGradsParams;
    FullyShardedDataParallel f(mesh, m.modules, fo);
    ParamList shards = f.shard_params();
    ASSERT_EQ(shards.size(), m.all.size());
    size_t k = 0;
    int64_t shard_bytes = 0;
    for (const auto& mod : m.specs)
      for (const Spec& s : mod) {
        const bool expert = s.placement.replicas == MeshGroup::kExpertDp;
        const int D = expert ? mesh.expert_dp_size() : mesh.dp_size();
        const int r = expert ? mesh.expert_dp_rank() : mesh.dp_rank();
        const int64_t padded = std::max<int64_t>((s.numel + D - 1) / D, 1);
        EXPECT_EQ(shards[k]->value.numel(), padded) << s.name;
        shard_bytes += padded * 4;
        // The first n mod D ranks hold one element more.
        const int64_t begin = s.numel / D * r + std::min<int64_t>(r, s.numel % D);
        const int64_t count = s.numel / D + (r < s.numel % D ? 1 : 0);
        for (int64_t j = 0; j < padded; ++j)
          EXPECT_EQ(shards[k]->value[j], j < count ? init_value(s, 0, mesh.ep_rank(), begin + j) : 0.0f)
              << s.name << " " << j;
        EXPECT_EQ(m.all[k]->value.numel(), 0) << "optim_grads_params frees " << s.name;
        ++k;
      }
    const FsdpMemory mem = f.memory();
    EXPECT_EQ(mem.parameters, shard_bytes);
    EXPECT_EQ(mem.gradients, shard_bytes);
    EXPECT_EQ(mem.optimizer, 2 * shard_bytes);
  }
}

// --bf16's parameter gathers (FsdpOptions::param_gather_dtype = kBF16) feed the forward and backward only: AdamW
// steps the fp32 master shards and the checkpoint gather (gather_full_state) reads them in fp32, so every strategy
// stays bitwise no_shard's, values and norms, at every dp (uneven, padded shards) and with experts.
TEST(Fsdp, Bf16ParamGathersLeaveTheMasterWeights) {
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  for (int ep : ep_sizes(world_size())) {
    Mesh mesh = make_mesh({1, 1, ep}, o);
    const Outcome ref = run_reference(mesh, 2, true);
    for (ShardingStrategy s :
         {ShardingStrategy::kOptim, ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams}) {
      FsdpOptions fo;
      fo.strategy = s;
      fo.deterministic = true;
      fo.param_gather_dtype = DType::kBF16;
      int unused = 0;
      expect_same(run_sharded(mesh, 2, fo, &unused), ref, true,
                  fmt::format("dp {} ep {} {} with bf16 parameter gathers", mesh.dp_size(), ep, to_string(s)));
    }
  }
}

/// The bytes of each parameter's FSDP gathers in the trace since `trace::clear()`, by parameter name.
std::map<std::string, int64_t> gather_bytes() {
  std::map<std::string, int64_t> out;
  const std::string prefix = "fsdp all_gather ";
  for (const trace::Record& rec : trace::collect()) {
    const std::string label = rec.label;
    if (rec.cat != trace::Cat::kComm || label.rfind(prefix, 0) != 0) continue;
    for (int i = 0; i < rec.nargs; ++i)
      if (std::string(rec.args[i].key) == "bytes") out[label.substr(prefix.size())] += rec.args[i].value;
  }
  return out;
}

/// The full parameter `p` holds what a gather in `wire` over D replicas delivers of the masters (init_value): the
/// bf16 value of each element for a GEMM-only parameter on a bf16 wire (every rank's shard rounded, its own
/// included), the fp32 value otherwise (and on one rank, where nothing moves).
void expect_gathered(const Param& p, const Spec& s, const Mesh& mesh, DType wire, const std::string& what) {
  const int D = s.placement.replicas == MeshGroup::kExpertDp ? mesh.expert_dp_size() : mesh.dp_size();
  const bool rounded = s.gemm_only && wire == DType::kBF16 && D > 1;
  ASSERT_EQ(p.value.numel(), s.numel) << what << " " << s.name;
  int changed = 0;
  for (int64_t j = 0; j < s.numel; ++j) {
    float v = init_value(s, mesh.tp_rank(), mesh.ep_rank(), j);
    const float exact = v;
    if (rounded) round_to_bf16(&v, 1);
    changed += v != exact ? 1 : 0;
    EXPECT_EQ(p.value[j], v) << what << " " << s.name << " element " << j;
  }
  if (rounded && s.numel > 4) EXPECT_GT(changed, 0) << s.name << ": the test values must not all be bf16 already";
}

// The gather itself, on real ranks with uneven shards (no dp in 2..4 divides every size): under a bf16
// param_gather_dtype a GEMM-only parameter arrives as the bf16 values of its master in exactly half the bytes of
// the fp32 gather, the norms and the bias exact in fp32 bytes; optim_grads_params gathers before each module's
// forward, optim after the step, and optim's full buffer goes back to the exact masters when the gathers switch
// back to fp32 (coc bench train --baseline --no-bf16).
TEST(Fsdp, Bf16ParamGatherDeliversRoundedValuesInHalfTheBytes) {
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  for (int ep : ep_sizes(world_size())) {
    Mesh mesh = make_mesh({1, 1, ep}, o);
    for (ShardingStrategy strategy : {ShardingStrategy::kOptim, ShardingStrategy::kOptimGradsParams}) {
      std::map<DType, std::map<std::string, int64_t>> bytes;
      for (DType wire : {DType::kF32, DType::kBF16}) {
        const std::string what = fmt::format("ep {} {} {} gathers", ep, to_string(strategy), to_string(wire));
        Model m(mesh);
        FsdpOptions fo;
        fo.strategy = strategy;
        fo.param_gather_dtype = wire;
        FullyShardedDataParallel f(mesh, m.modules, fo);
        trace::clear();
        trace::set_level(trace::Level::kLevel0);
        for (size_t i = 0; i < m.modules.size(); ++i) {
          if (strategy == ShardingStrategy::kOptim && i == 0) f.after_step();
          f.pre_forward(static_cast<int>(i));
          for (size_t k = 0; k < m.modules[i].size(); ++k)
            expect_gathered(*m.modules[i][k], m.specs[i][k], mesh, wire, what);
          f.post_forward(static_cast<int>(i));
        }
        trace::set_level(trace::Level::kOff);
        bytes[wire] = gather_bytes();
        trace::clear();
        if (strategy != ShardingStrategy::kOptim) continue;
        f.set_param_gather_dtype(DType::kF32);
        for (size_t i = 0; i < m.modules.size(); ++i)
          for (size_t k = 0; k < m.modules[i].size(); ++k)
            expect_gathered(*m.modules[i][k], m.specs[i][k], mesh, DType::kF32, what + ", then switched to fp32");
      }
      for (const auto& mod : model_specs())
        for (const Spec& s : mod) {
          const int64_t b32 = bytes[DType::kF32][s.name], b16 = bytes[DType::kBF16][s.name];
          const int D = s.placement.replicas == MeshGroup::kExpertDp ? mesh.expert_dp_size() : mesh.dp_size();
          SCOPED_TRACE(fmt::format("ep {} {} {}: {} bytes in fp32, {} in bf16", ep, to_string(strategy), s.name,
                                   b32, b16));
          if (D > 1 && s.numel >= D) EXPECT_GT(b32, 0);  // the bytes this rank sends: its share
          EXPECT_EQ(b16 * (s.gemm_only ? 2 : 1), b32);
        }
    }
  }
}

TEST(Fsdp, BadSettingsAreRefused) {
  EXPECT_EQ(parse_sharding_strategy("optim_grads"), ShardingStrategy::kOptimGrads);
  EXPECT_EQ(parse_sharding_strategy("no_shard"), ShardingStrategy::kNoShard);
  auto expect = [](const Error& e, const std::string& text) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  };
  expect(test::expect_error([] { parse_sharding_strategy("zero3"); }),
         "--data-parallel-sharding-strategy 'zero3' is not one of");
  expect(test::expect_error([] { validate_prefetch(-1, 0); }), "--num-to-forward-prefetch must be >= 0");
  expect(test::expect_error([] { validate_prefetch(0, -2); }), "--num-to-backward-prefetch must be >= 0");
  CommOptions o;
  Mesh mesh = make_mesh({1, 1, 1}, o);
  Model m(mesh);
  FsdpOptions fo;
  FullyShardedDataParallel f(mesh, m.modules, fo);
  expect(test::expect_error([&] { f.set_param_gather_dtype(DType::kF16); }),
         "FSDP parameter gathers in fp16: only fp32 and bf16 are supported");
}

}  // namespace
}  // namespace coc
