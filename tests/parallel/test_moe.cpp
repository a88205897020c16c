// coc-test-np: 1 2 4
// coc-test-timeout: 300
// The MoE layer (coc/parallel/moe.h) on every EP size that fits the world (1, 2, 4; with 4 ranks also ep 2 × dp 2
// and ep 1 × dp 4): each dispatcher (eager, fused, mc2 with 1-3 chunks), top-1 and top-2, learned, balanced,
// skewed and empty-expert routing, against the fp64 single-rank reference (output, aux loss, dx, router and expert
// gradients). mc2 equals eager bitwise for any chunk count; the expert gradients, the aux loss and the router's
// gradient do not depend on the layout; an expert without tokens has an exactly zero gradient; a rank without
// tokens still joins every collective; bad configs and mismatched all-to-all counts give errors, not hangs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/core/bf16.h"
#include "coc/kernels/gemm.h"
#include "coc/parallel/moe_check.h"
#include "coc/runtime/tracer.h"
#include "support/expect_error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_size;

constexpr double kRtol = 1e-5;

/// Leaked on purpose: the communicators must not be freed after MPI_Finalize (the test main finalizes).
std::map<int, Mesh>& meshes() {
  static auto* m = new std::map<int, Mesh>;
  return *m;
}

/// The mesh with ep = `ep` over the world (tp = cp = 1), built once.
Mesh& mesh_ep(int ep) {
  auto it = meshes().find(ep);
  if (it == meshes().end()) {
    CommOptions o;
    o.timeout = std::chrono::milliseconds(60000);
    it = meshes().emplace(ep, make_mesh({1, 1, ep}, o)).first;
  }
  return it->second;
}

std::vector<int> ep_sizes() {
  std::vector<int> v;
  for (int ep : {1, 2, 4})
    if (world_size() % ep == 0) v.push_back(ep);
  return v;
}

MoeCheckCase base_case(int topk, RouterPattern pattern, MoeDispatcher d, int chunks = 2) {
  MoeCheckCase c;
  c.cfg.hidden = 16;
  c.cfg.ffn_hidden = 24;
  c.cfg.num_experts = 4;
  c.cfg.topk = topk;
  c.cfg.fixed_router = pattern;
  c.cfg.dispatcher = d;
  c.cfg.mc2_chunks = chunks;
  c.cfg.aux_loss_coeff = 0.01;
  c.tokens = 40;
  c.cfg.deterministic_tile_rows = 3;  // several tiles per block at these sizes
  return c;
}

std::string describe(int ep, const MoeCheckCase& c) {
  return "ep " + std::to_string(ep) + " of " + std::to_string(world_size()) + ", " + to_string(c.cfg.dispatcher) +
         " (" + std::to_string(c.cfg.mc2_chunks) + " chunks), top-" + std::to_string(c.cfg.topk) + ", router " +
         to_string(c.cfg.fixed_router) + (c.empty_rank ? ", rank 0 without tokens" : "") +
         (c.cfg.capacity_factor > 0 ? ", capacity " + std::to_string(c.cfg.capacity_factor) : "");
}

void expect_matches_reference(const MoeCheckResult& r, const std::string& what) {
  for (const auto& [name, err] : r.errors) EXPECT_LE(err.rel(), kRtol) << what << ": " << name;
}

const RouterPattern kPatterns[] = {RouterPattern::kNone, RouterPattern::kBalanced, RouterPattern::kSkewed,
                                   RouterPattern::kEmpty};

TEST(Moe, EveryDispatcherMatchesTheFp64Reference) {
  for (int ep : ep_sizes())
    for (int topk : {1, 2})
      for (RouterPattern pat : kPatterns)
        for (MoeDispatcher d : {MoeDispatcher::kEager, MoeDispatcher::kFused, MoeDispatcher::kMc2}) {
          const MoeCheckCase c = base_case(topk, pat, d);
          expect_matches_reference(check_moe_layer(mesh_ep(ep), c), describe(ep, c));
        }
}

TEST(Moe, Mc2AndFusedEqualEagerBitwiseForAnyChunkCountInDeterministicMode) {
  for (int ep : ep_sizes())
    for (int topk : {1, 2})
      for (RouterPattern pat : kPatterns) {
        MoeCheckCase ce = base_case(topk, pat, MoeDispatcher::kEager);
        ce.cfg.deterministic = true;
        const MoeCheckResult eager = check_moe_layer(mesh_ep(ep), ce);
        for (int chunks : {1, 2, 3, 7}) {
          MoeCheckCase c = base_case(topk, pat, MoeDispatcher::kMc2, chunks);
          c.cfg.deterministic = true;
          const MoeCheckResult mc2 = check_moe_layer(mesh_ep(ep), c);
          EXPECT_EQ(mc2.output, eager.output) << describe(ep, c);
          EXPECT_EQ(mc2.gate_up_grad, eager.gate_up_grad) << describe(ep, c);
          EXPECT_EQ(mc2.down_grad, eager.down_grad) << describe(ep, c);
          EXPECT_EQ(mc2.router_grad, eager.router_grad) << describe(ep, c);
        }
        MoeCheckCase cf = base_case(topk, pat, MoeDispatcher::kFused);
        cf.cfg.deterministic = true;
        const MoeCheckResult fused = check_moe_layer(mesh_ep(ep), cf);
        EXPECT_EQ(fused.output, eager.output) << "fused, ep " << ep;
        EXPECT_EQ(fused.gate_up_grad, eager.gate_up_grad) << "fused, ep " << ep;
      }
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

TEST(Moe, ExpertGradientsAuxLossAndRouterGradientDoNotDependOnTheLayout) {
  for (int topk : {1, 2})
    for (RouterPattern pat : kPatterns) {
      const MoeCheckResult ep1 = check_moe_layer(mesh_ep(1), base_case(topk, pat, MoeDispatcher::kEager));
      for (int ep : ep_sizes()) {
        const MoeCheckResult r = check_moe_layer(mesh_ep(ep), base_case(topk, pat, MoeDispatcher::kMc2));
        EXPECT_LE(max_rel_diff(r.gate_up_grad, ep1.gate_up_grad), kRtol) << "ep " << ep;
        EXPECT_LE(max_rel_diff(r.down_grad, ep1.down_grad), kRtol) << "ep " << ep;
        EXPECT_LE(max_rel_diff(r.router_grad, ep1.router_grad), kRtol) << "ep " << ep;
        EXPECT_NEAR(r.aux_loss, ep1.aux_loss, 1e-7 * std::fabs(ep1.aux_loss)) << "ep " << ep;
      }
    }
}

TEST(Moe, AnExpertWithoutTokensHasAnExactlyZeroGradient) {
  for (int ep : ep_sizes())
    for (MoeDispatcher d : {MoeDispatcher::kEager, MoeDispatcher::kFused, MoeDispatcher::kMc2}) {
      // kEmpty with E = 4, top-1: experts 2 and 3 get nothing (with ep 2 or 4 whole ranks receive no token).
      const MoeCheckCase c = base_case(1, RouterPattern::kEmpty, d);
      const MoeCheckResult r = check_moe_layer(mesh_ep(ep), c);
      expect_matches_reference(r, describe(ep, c));
      const size_t per_gu = r.gate_up_grad.size() / 4, per_d = r.down_grad.size() / 4;
      for (size_t i = 2 * per_gu; i < r.gate_up_grad.size(); ++i) ASSERT_EQ(r.gate_up_grad[i], 0.0f) << i;
      for (size_t i = 2 * per_d; i < r.down_grad.size(); ++i) ASSERT_EQ(r.down_grad[i], 0.0f) << i;
      EXPECT_GT(std::count_if(r.gate_up_grad.begin(), r.gate_up_grad.begin() + 2 * static_cast<long>(per_gu),
                              [](float v) { return v != 0.0f; }),
                0);
    }
}

TEST(Moe, ARankWithoutTokensTakesPartInEveryCollective) {
  for (int ep : ep_sizes())
    for (MoeDispatcher d : {MoeDispatcher::kEager, MoeDispatcher::kFused, MoeDispatcher::kMc2})
      for (int topk : {1, 2}) {
        MoeCheckCase c = base_case(topk, RouterPattern::kNone, d, 3);
        c.empty_rank = true;
        expect_matches_reference(check_moe_layer(mesh_ep(ep), c), describe(ep, c));
      }
}

TEST(Moe, CapacityFactorDropsTokensAsMegatron) {
  for (int ep : ep_sizes())
    for (MoeDispatcher d : {MoeDispatcher::kEager, MoeDispatcher::kMc2})
      for (double cf : {0.5, 1.0, 1.5}) {
        MoeCheckCase c = base_case(2, RouterPattern::kSkewed, d);
        c.cfg.capacity_factor = cf;
        expect_matches_reference(check_moe_layer(mesh_ep(ep), c), describe(ep, c));
      }
}

TEST(Moe, BadConfigsGiveOneClearError) {
  MoeConfig c = base_case(1, RouterPattern::kNone, MoeDispatcher::kEager).cfg;
  c.num_experts = 3;
  EXPECT_NE(std::string(test::expect_error([&] { check_moe_config(c, 2); }).what()).find("not divisible"),
            std::string::npos);
  c.num_experts = 4;
  c.topk = 5;
  EXPECT_NE(std::string(test::expect_error([&] { check_moe_config(c, 1); }).what()).find("--moe-router-topk"),
            std::string::npos);
  c.topk = 1;
  c.mc2_chunks = 0;
  EXPECT_EQ(test::expect_error([&] { check_moe_config(c, 1); }).kind(), ErrorKind::kInvalidArgument);
  EXPECT_THROW(parse_moe_dispatcher("alltoall"), Error);
}

TEST(Moe, TheTraceShowsDispatchAndCombineOnTheCommTrackAndGroupedGemmsOnTheComputeTrack) {
  for (MoeDispatcher d : {MoeDispatcher::kEager, MoeDispatcher::kMc2}) {
    trace::clear();
    trace::set_level(trace::Level::kLevel1);
    check_moe_layer(mesh_ep(world_size()), base_case(2, RouterPattern::kBalanced, d, 3));
    trace::set_level(trace::Level::kOff);
    int dispatch = 0, combine = 0, gemms = 0;
    for (const trace::Record& r : trace::collect()) {
      const std::string label = r.label_key ? r.label : "";
      if (r.track == trace::Track::kComm && label.rfind("moe dispatch", 0) == 0) ++dispatch;
      if (r.track == trace::Track::kComm && label.rfind("moe combine", 0) == 0) ++combine;
      if (r.track == trace::Track::kCompute && std::string(r.name) == "grouped_gemm") ++gemms;
    }
    trace::clear();
    EXPECT_GT(gemms, 0) << to_string(d);
    if (world_size() > 1) {
      // forward and backward; mc2: one exchange per (peer distance, chunk) each way
      const int per_pass = d == MoeDispatcher::kMc2 ? (world_size() - 1) * 3 : 1;
      EXPECT_EQ(dispatch, 2 * per_pass) << to_string(d);
      EXPECT_EQ(combine, 2 * per_pass) << to_string(d);
    }
  }
}

/// The bytes of the trace's comm events per tag prefix ("moe dispatch forward", ...), recorded while `f` runs.
template <typename F>
std::map<std::string, int64_t> exchange_bytes(F&& f) {
  trace::clear();
  trace::set_level(trace::Level::kLevel0);
  f();
  trace::set_level(trace::Level::kOff);
  std::map<std::string, int64_t> bytes;
  for (const trace::Record& r : trace::collect()) {
    const std::string label = r.label_key ? r.label : "";
    if (r.cat != trace::Cat::kComm || label.rfind("moe ", 0) != 0) continue;
    const std::string key = label.substr(0, label.find(' ', label.find(' ', 4) + 1));  // "moe dispatch forward"
    for (int i = 0; i < r.nargs; ++i)
      if (std::string(r.args[i].key) == "bytes") bytes[key] += r.args[i].value;
  }
  trace::clear();
  return bytes;
}

/// Restores the process's GEMM compute type to fp32 when it goes.
struct ComputeType {
  explicit ComputeType(DType t) { set_gemm_compute_type(t); }
  ~ComputeType() { set_gemm_compute_type(DType::kF32); }
};

// Issue 35: under a bf16 token exchange (--bf16) every dispatcher sends all four exchanges (the dispatched rows:
// forward tokens, backward output gradients; the combined rows: forward expert outputs, backward input gradients)
// as 2-byte elements, half the bytes. With the GEMMs in bf16 (as under --bf16) the experts' gradients are bitwise
// those of the fp32 exchange (the GEMMs round the tokens and output gradients anyway, and the experts' input
// gradients, rounded on the way back, feed no expert weight); the output is the fp32 exchange's with the expert
// outputs rounded to bf16 (within 2^-8 relative of it, every element a combination of bf16 values). mc2 and fused
// stay bitwise eager's in deterministic mode.
TEST(Moe, Bf16ExchangeHalvesTheBytesAndKeepsTheExpertGradients) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeType bf16(DType::kBF16);
  const int ep = world_size();
  std::vector<float> eager_out, eager_grad;  // eager's bf16-exchange results, which the others must equal
  for (MoeDispatcher d : {MoeDispatcher::kEager, MoeDispatcher::kFused, MoeDispatcher::kMc2}) {
    MoeCheckCase c = base_case(2, RouterPattern::kNone, d, 3);
    c.cfg.deterministic = true;
    MoeCheckResult r32, r16;
    const auto b32 = exchange_bytes([&] { r32 = check_moe_layer(mesh_ep(ep), c); });
    c.cfg.comm_dtype = DType::kBF16;
    const auto b16 = exchange_bytes([&] { r16 = check_moe_layer(mesh_ep(ep), c); });
    const std::string what = describe(ep, c);
    EXPECT_EQ(r16.gate_up_grad, r32.gate_up_grad) << what;
    EXPECT_EQ(r16.down_grad, r32.down_grad) << what;
    // Each expert output moves by at most 2^-9 of itself and the top-k weights sum to at most 1, so an output
    // element moves by at most 2^-9 of the largest expert output it combines; normwise against the largest output
    // element that is 2^-8 here (the outputs cancel partially, so an element-wise relative bound would not hold).
    ASSERT_EQ(r16.output.size(), r32.output.size()) << what;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < r16.output.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(r16.output[i]) - r32.output[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(r32.output[i])));
    }
    EXPECT_LE(diff, std::ldexp(scale, -8)) << what;
    EXPECT_GT(diff, 0) << what << ": the expert outputs were not rounded";
    if (ep > 1) {
      for (const char* k : {"moe dispatch forward", "moe combine forward", "moe dispatch backward",
                            "moe combine backward"}) {
        EXPECT_GT(b32.at(k), 0) << what << " " << k;
        EXPECT_EQ(2 * b16.at(k), b32.at(k)) << what << " " << k;
      }
    }
    if (d == MoeDispatcher::kEager) {
      eager_out = r16.output;
      eager_grad = r16.gate_up_grad;
    } else {
      EXPECT_EQ(r16.output, eager_out) << what << ": not bitwise eager's";
      EXPECT_EQ(r16.gate_up_grad, eager_grad) << what << ": not bitwise eager's";
    }
  }
}

TEST(Moe, MismatchedAllToAllCountsAreAnErrorUnderDebugCollectives) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CommOptions o;
  o.check_fingerprints = true;
  o.timeout = std::chrono::milliseconds(20000);
  auto world = Communicator::world("debug world", std::make_shared<ProgressEngine>(EngineKind::kInline, 100), o);
  const int n = world->size();
  std::vector<int64_t> sc(n, 1), sd(n), rc(n, 1), rd(n);
  for (int i = 0; i < n; ++i) sd[i] = rd[i] = i * 2;
  if (world->rank() == 0) rc[1] = 2;  // rank 0 expects 2 elements from rank 1, which sends 1
  std::vector<float> send(2 * n, 1.0f), recv(2 * n);
  const Error e = test::expect_error([&] { world->all_to_all(send.data(), sc, sd, recv.data(), rc, rd, "t").wait(); });
  EXPECT_EQ(e.kind(), ErrorKind::kComm);
  EXPECT_NE(std::string(e.what()).find("count mismatch"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace coc
