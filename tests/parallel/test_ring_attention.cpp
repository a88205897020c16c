// coc-test-np: 2 3 4
// coc-test-timeout: 300
// Ring attention (coc/parallel/ring_attention.h) on real MPI ranks, CP = the world (2, 3, 4) and, on 4 ranks, CP = 2
// inside a tp-cp-dp mesh: output, dQ, dK, dV against full fp64 attention (1e-5 relative) for both masks, several
// sequences and heads, odd chunk lengths and more than one kernel tile; the double ring (w = CP, and w = 2 with
// CP = 4); --use-cp-send-recv-overlap on and off
// bitwise equal; random ranks delayed at random steps still give the same bits and never hang; the zig-zag layout;
// and every refusal of bad sizes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "coc/comm/mesh.h"
#include "coc/core/error.h"
#include "coc/parallel/ring_attention_check.h"
#include "coc/runtime/tracer.h"
#include "support/expect_error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_size;

CommOptions comm_options() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  return o;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
}

void expect_within(const RingAttentionCheck& r, double rtol, const std::string& what) {
  for (const auto& [name, e] : r.errors) EXPECT_LE(e.rel(), rtol) << what << ": " << name << " abs " << e.abs;
}

void expect_same(const RingAttentionCheck& a, const RingAttentionCheck& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.out, b.out)) << what << ": out";
  EXPECT_TRUE(same_bits(a.dq, b.dq)) << what << ": dq";
  EXPECT_TRUE(same_bits(a.dk, b.dk)) << what << ": dk";
  EXPECT_TRUE(same_bits(a.dv, b.dv)) << what << ": dv";
}

struct Shape {
  int64_t chunk, batch, heads, head_dim;  ///< S = 2·CP·chunk
};

/// Every shape, both masks, overlap off and on: within 1e-5 of fp64, and the two switches bitwise equal.
void check_all(Communicator& cp, int window = 1) {
  std::unique_ptr<Communicator> dup;
  const CpRing plain = make_cp_ring(cp, false, dup);
  const CpRing duplex = make_cp_ring(cp, true, dup);
  for (const Shape& s : {Shape{1, 1, 1, 4}, Shape{3, 1, 1, 4}, Shape{5, 3, 2, 8}, Shape{70, 1, 2, 16}})
    for (AttnMask mask : {AttnMask::kCausal, AttnMask::kFull}) {
      RingAttentionCase c;
      c.seq = 2 * cp.size() * s.chunk;
      c.batch = s.batch;
      c.heads = s.heads;
      c.head_dim = s.head_dim;
      c.opts.mask = mask;
      c.opts.window_size = window;
      const std::string what = fmt::format("CP {} w {} S {} B {} heads {} D {} {}", cp.size(), window, c.seq,
                                           c.batch, c.heads, c.head_dim, to_string(mask));
      const RingAttentionCheck a = check_ring_attention(plain, c);
      const RingAttentionCheck b = check_ring_attention(duplex, c);
      expect_within(a, 1e-5, what);
      expect_same(a, b, what + ", overlap on vs off");
      c.opts.serial = true;  // the benchmark's non-overlapped baseline
      expect_same(a, check_ring_attention(plain, c), what + ", serial vs overlapped");
    }
}

TEST(RingAttention, MatchesFullAttentionCpIsTheWorld) {
  Mesh m = make_mesh({.tp = 1, .cp = world_size()}, comm_options());
  ASSERT_EQ(m.cp->size(), world_size());
  check_all(*m.cp);
}

TEST(RingAttention, DoubleRingMatchesFullAttention) {
  // w = CP (one window, no outer ring) on every world; w = 2 with CP = 4 (two windows of two).
  Mesh m = make_mesh({.tp = 1, .cp = world_size()}, comm_options());
  check_all(*m.cp, world_size());
  if (world_size() == 4) check_all(*m.cp, 2);
}

TEST(RingAttention, MatchesFullAttentionOnTheMeshCpGroup) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks (tp 1, cp 2, dp 2 and tp 2, cp 2)";
  for (int tp : {1, 2}) {
    Mesh m = make_mesh({.tp = tp, .cp = 2}, comm_options());
    ASSERT_EQ(m.cp->size(), 2);
    check_all(*m.cp);
  }
}

TEST(RingAttention, DelayedRanksGiveTheSameBitsAndNeverHang) {
  Mesh m = make_mesh({.tp = 1, .cp = world_size()}, comm_options());
  std::unique_ptr<Communicator> dup;
  const int P = world_size();
  for (auto [overlap, window] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{true, P % 2 == 0 ? 2 : P}}) {
    const CpRing ring = make_cp_ring(*m.cp, overlap, dup);
    RingAttentionCase c;
    c.opts.window_size = window;
    c.seq = 2 * m.cp->size() * 9;
    c.batch = 2;
    c.heads = 2;
    c.head_dim = 8;
    const RingAttentionCheck calm = check_ring_attention(ring, c);
    std::mt19937 rng(1234u + static_cast<unsigned>(m.cp->rank()));
    c.opts.step_hook = [&rng](int) {
      // About half the steps of each rank sleep up to 30 ms: peers wait, buffers must still be respected.
      if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 30));
    };
    const RingAttentionCheck delayed = check_ring_attention(ring, c);
    expect_within(delayed, 1e-5, "delayed");
    expect_same(calm, delayed, fmt::format("delayed, overlap {}, window {}", overlap, window));
  }
}

TEST(RingAttention, WorkDuringTheLastHopRunsOnceAndChangesNoBit) {
  // RingAttentionOptions::during_last_hop (the decoder's delayed weight gradients): once per backward with CP > 1,
  // even a slow one (it sleeps, making no MPI call) leaves the results bitwise unchanged, on both rings.
  Mesh m = make_mesh({.tp = 1, .cp = world_size()}, comm_options());
  std::unique_ptr<Communicator> dup;
  for (bool overlap : {false, true}) {
    const CpRing ring = make_cp_ring(*m.cp, overlap, dup);
    RingAttentionCase c;
    c.seq = 2 * m.cp->size() * 7;
    c.batch = 2;
    c.heads = 2;
    c.head_dim = 8;
    const RingAttentionCheck plain = check_ring_attention(ring, c);
    int calls = 0;
    c.opts.during_last_hop = [&calls] {
      ++calls;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    };
    const RingAttentionCheck with_work = check_ring_attention(ring, c);
    EXPECT_EQ(calls, world_size() > 1 ? 1 : 0);
    expect_same(plain, with_work, fmt::format("work during the last hop, overlap {}", overlap));
  }
}

TEST(RingAttention, TraceShowsEachTransferUnderBlockAttention) {
  // Every hop is posted before the step's blocks and polled between their query tiles, so each KV transfer's trace
  // event (post to detected completion) overlaps a block_attention event: the profile's overlap analysis sees the
  // ring's communication under its compute. (How much of it is hidden on a real link is measured on the cluster.)
  Mesh m = make_mesh({.tp = 1, .cp = world_size()}, comm_options());
  std::unique_ptr<Communicator> dup;
  const CpRing ring = make_cp_ring(*m.cp, false, dup);
  RingAttentionCase c;
  c.seq = 2 * m.cp->size() * 64;
  trace::clear();
  trace::set_level(trace::Level::kLevel1);
  check_ring_attention(ring, c);
  trace::set_level(trace::Level::kOff);
  const std::vector<trace::Record> recs = trace::collect();
  trace::clear();
  int hops = 0, covered = 0;
  for (const trace::Record& h : recs) {
    if (h.cat != trace::Cat::kComm || std::string(h.label).find(" kv ") == std::string::npos) continue;
    ++hops;
    for (const trace::Record& b : recs)
      if (b.cat == trace::Cat::kCompute && std::string(b.name).rfind("block_attention", 0) == 0 &&
          b.begin_ns < h.end_ns && b.end_ns > h.begin_ns) {
        ++covered;
        break;
      }
  }
  // Forward and backward: CP − 1 KV hops each.
  EXPECT_EQ(hops, 2 * (m.cp->size() - 1));
  EXPECT_EQ(covered, hops);
}

/// The bytes of the trace's K/V hops (tags with " kv ") and dK/dV hops (" dkv ") recorded while `f` runs.
template <typename F>
std::pair<int64_t, int64_t> hop_bytes(F&& f) {
  trace::clear();
  trace::set_level(trace::Level::kLevel0);
  f();
  trace::set_level(trace::Level::kOff);
  std::pair<int64_t, int64_t> bytes{0, 0};
  for (const trace::Record& r : trace::collect()) {
    if (r.cat != trace::Cat::kComm) continue;
    const std::string label(r.label);
    int64_t* into = label.find(" kv ") != std::string::npos    ? &bytes.first
                    : label.find(" dkv ") != std::string::npos ? &bytes.second
                                                               : nullptr;
    for (int i = 0; into && i < r.nargs; ++i)
      if (std::string(r.args[i].key) == "bytes") *into += r.args[i].value;
  }
  trace::clear();
  return bytes;
}

// Issue 35: K and V blocks that hold bf16 values (what --bf16's layers pass) travel as bf16 (kv_dtype): half the
// bytes of every K/V hop, the dK/dV partial sums unchanged in fp32, and bitwise the results of fp32 blocks, for the
// plain and the double ring, with and without the send/recv overlap.
TEST(RingAttention, Bf16KvBlocksHalveTheBytesAndChangeNoBit) {
  Mesh m = make_mesh({.tp = 1, .cp = world_size()}, comm_options());
  std::unique_ptr<Communicator> dup;
  const int P = m.cp->size();
  for (bool overlap : {false, true})
    for (int window : {1, P % 2 == 0 ? 2 : 1}) {
      const CpRing ring = make_cp_ring(*m.cp, overlap, dup);
      RingAttentionCase c;
      c.seq = 2 * P * 5;
      c.heads = 2;
      c.bf16_values = true;
      c.opts.window_size = window;
      RingAttentionCheck r32, r16;
      const auto [kv32, dkv32] = hop_bytes([&] { r32 = check_ring_attention(ring, c); });
      c.opts.kv_dtype = DType::kBF16;
      const auto [kv16, dkv16] = hop_bytes([&] { r16 = check_ring_attention(ring, c); });
      const std::string what = fmt::format("cp {} window {} overlap {}", P, window, overlap);
      expect_same(r32, r16, what);
      expect_within(r16, 1e-5, what);
      EXPECT_GT(kv32, 0) << what;
      EXPECT_EQ(2 * kv16, kv32) << what;
      EXPECT_EQ(dkv16, dkv32) << what;
    }
}

TEST(RingAttention, ZigZagLayout) {
  const int P = world_size();
  const int64_t S = 2 * P * 3, B = 2;
  std::vector<int> seen(static_cast<size_t>(S), 0);
  for (int r = 0; r < P; ++r) {
    for (int64_t t = 0; t < S / P; ++t) ++seen[static_cast<size_t>(zigzag_position(t, r, P, S))];
    // Rank r holds chunks r and 2·CP−1−r.
    EXPECT_EQ(zigzag_position(0, r, P, S), r * 3);
    EXPECT_EQ(zigzag_position(3, r, P, S), (2 * P - 1 - r) * 3);
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  Tensor full = test::random_tensor({S * B, 5}, 3), back({S * B, 5}), local({S / P * B, 5});
  for (int r = 0; r < P; ++r) {
    zigzag_gather(full.mat(), B, r, P, local.mat());
    zigzag_scatter(local.mat(), B, r, P, back.mat());
  }
  EXPECT_TRUE(same_bits(full, back));
}

TEST(RingAttention, RefusesBadSizes) {
  Error e = test::expect_error([] { check_ring_attention_sizes(100, 3, 1); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(e.uniform());
  EXPECT_NE(std::string(e.what()).find("96 or 102"), std::string::npos) << e.what();
  e = test::expect_error([] { check_ring_attention_sizes(3, 4, 1); });
  EXPECT_NE(std::string(e.what()).find("use 8"), std::string::npos) << e.what();
  e = test::expect_error([] { check_ring_attention_sizes(64, 4, 3); });
  EXPECT_NE(std::string(e.what()).find("divide --context-parallel-size 4"), std::string::npos) << e.what();
  e = test::expect_error([] { check_ring_attention_sizes(64, 4, 0); });
  EXPECT_NE(std::string(e.what()).find("must be >= 1"), std::string::npos) << e.what();
  // Through the ring itself: every rank refuses the same way, before any transfer.
  auto world = test::world_comm();
  std::unique_ptr<Communicator> dup;
  const CpRing ring = make_cp_ring(*world, false, dup);
  RingAttentionCase c;
  c.seq = 2 * world->size() + 1;
  e = test::expect_error([&] { check_ring_attention(ring, c); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("--seq-length"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace coc
