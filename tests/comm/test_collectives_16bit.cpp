// coc-test-np: 1 2 3 4
// coc-test-timeout: 180
// The 16-bit data collectives (coc/comm/communicator.h, src/comm/element_types.h) on real MPI ranks: bf16 and fp16
// all-reduce (sum, max, min), reduce-scatter and all-gather with uneven and zero shares, in place, blocking and not,
// with both non-blocking builds and both progress engines; the point-to-point reduce-scatter rounds once (the fp32
// sum of the partials in rank order), MPI's collectives round at most T - 1 times; a 16-bit op is not an fp32 op
// to the fingerprint check. Point-to-point exchanges and all-to-all move 16-bit elements as 2 bytes each (the bits
// arrive unchanged, the Work, hence the trace, counts the real bytes), also mixed with fp32 blocks in one exchange; an int8 block
// is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using namespace std::chrono_literals;

/// One case: element format, non-blocking build, engine, and whether the calls block.
struct Case {
  DType type;
  NonblockingImpl impl;
  EngineKind engine;
  bool blocking;
};
std::string name_of(const ::testing::TestParamInfo<Case>& i) {
  return std::string(to_string(i.param.type)) + "_" + to_string(i.param.impl) + "_" + to_string(i.param.engine) +
         (i.param.blocking ? "_blocking" : "");
}

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  for (DType t : {DType::kBF16, DType::kF16})
    for (NonblockingImpl impl : {NonblockingImpl::kP2p, NonblockingImpl::kMpi})
      for (EngineKind e : {EngineKind::kInline, EngineKind::kThread})
        for (bool b : {false, true}) cs.push_back({t, impl, e, b});
  return cs;
}

/// 16-bit buffers held as raw bits, with conversion to and from fp32 by the case's format.
struct Half {
  DType type;
  std::vector<uint16_t> bits;
  Half(DType t, const std::vector<float>& v) : type(t), bits(v.size()) {
    fp32_to_half(t, v.data(), bits.data(), static_cast<int64_t>(v.size()));
  }
  std::vector<float> values() const {
    std::vector<float> v(bits.size());
    half_to_fp32(type, bits.data(), v.data(), static_cast<int64_t>(v.size()));
    return v;
  }
};

class Collectives16 : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    CommOptions o;
    o.engine = GetParam().engine;
    o.nonblocking = GetParam().impl;
    o.timeout = 60s;
    comm_ = Communicator::world("16-bit", std::make_shared<ProgressEngine>(o.engine, 100), o);
  }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  DType type() const { return GetParam().type; }
  bool blocking() const { return GetParam().blocking; }

  // The calls, typed by the case's format (the buffers hold its bits).
  Work all_reduce(Half& h, ReduceOp op) {
    if (type() == DType::kBF16)
      return comm_->all_reduce(reinterpret_cast<BFloat16*>(h.bits.data()), static_cast<int64_t>(h.bits.size()), op,
                               "ar16", blocking());
    return comm_->all_reduce(reinterpret_cast<Float16*>(h.bits.data()), static_cast<int64_t>(h.bits.size()), op,
                             "ar16", blocking());
  }
  Work reduce_scatter(const Half& in, Half& out, std::span<const int64_t> counts) {
    if (type() == DType::kBF16)
      return comm_->reduce_scatter(reinterpret_cast<const BFloat16*>(in.bits.data()),
                                   reinterpret_cast<BFloat16*>(out.bits.data()), counts, "rs16", blocking());
    return comm_->reduce_scatter(reinterpret_cast<const Float16*>(in.bits.data()),
                                 reinterpret_cast<Float16*>(out.bits.data()), counts, "rs16", blocking());
  }
  Work all_gather(const uint16_t* send, Half& out, std::span<const int64_t> counts, std::span<const int64_t> displs) {
    if (type() == DType::kBF16)
      return comm_->all_gather(reinterpret_cast<const BFloat16*>(send), reinterpret_cast<BFloat16*>(out.bits.data()),
                               counts, displs, "ag16", blocking());
    return comm_->all_gather(reinterpret_cast<const Float16*>(send), reinterpret_cast<Float16*>(out.bits.data()),
                             counts, displs, "ag16", blocking());
  }
  std::unique_ptr<Communicator> comm_;
};

INSTANTIATE_TEST_SUITE_P(Formats, Collectives16, ::testing::ValuesIn(all_cases()), name_of);

TEST_P(Collectives16, AllReduceSumMaxMinOfExactValues) {
  const int n = size();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1029}}) {
    std::vector<float> v(static_cast<size_t>(count)), w(v.size());
    for (int64_t i = 0; i < count; ++i) {
      v[static_cast<size_t>(i)] = static_cast<float>(rank() + i % 8);  // small integers: exact in both formats
      w[static_cast<size_t>(i)] = static_cast<float>((rank() * 5 + i) % 7) - 3.0f;
    }
    Half sum(type(), v), mx(type(), w), mn(type(), w);
    Work a = all_reduce(sum, ReduceOp::kSum), b = all_reduce(mx, ReduceOp::kMax), c = all_reduce(mn, ReduceOp::kMin);
    a.wait();
    b.wait();
    c.wait();
    const auto s = sum.values(), x = mx.values(), y = mn.values();
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(s[static_cast<size_t>(i)], static_cast<float>(n * (n - 1) / 2 + n * (i % 8))) << i;
      float hi = -100, lo = 100;
      for (int r = 0; r < n; ++r) {
        const float e = static_cast<float>((r * 5 + i) % 7) - 3.0f;
        hi = std::max(hi, e);
        lo = std::min(lo, e);
      }
      ASSERT_EQ(x[static_cast<size_t>(i)], hi) << i;
      ASSERT_EQ(y[static_cast<size_t>(i)], lo) << i;
    }
  }
}

TEST_P(Collectives16, ReduceScatterUnevenWithZeroShares) {
  const int n = size();
  std::vector<int64_t> counts(static_cast<size_t>(n)), offs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : 2 * r + 3;
  std::exclusive_scan(counts.begin(), counts.end(), offs.begin(), int64_t{0});
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<float> send(static_cast<size_t>(total));
  for (int64_t j = 0; j < total; ++j) send[static_cast<size_t>(j)] = static_cast<float>(rank() * 8 + j % 16);
  const int64_t mine = counts[static_cast<size_t>(rank())];
  Half in(type(), send), out(type(), std::vector<float>(static_cast<size_t>(mine) + 1, -7.0f));
  reduce_scatter(in, out, counts).wait();
  const auto got = out.values();
  for (int64_t i = 0; i < mine; ++i) {
    const int64_t j = offs[static_cast<size_t>(rank())] + i;
    ASSERT_EQ(got[static_cast<size_t>(i)], static_cast<float>(8 * n * (n - 1) / 2 + n * (j % 16))) << i;
  }
  EXPECT_EQ(got[static_cast<size_t>(mine)], -7.0f) << "wrote past this rank's share";
}

TEST_P(Collectives16, SumsRoundOnceOnThePointToPointPath) {
  // Rank 0 sends 1, every other rank 3·2^-10 (exact in both formats). The fp32 sum 1 + (T-1)·3·2^-10 rounds once;
  // adding pairwise in 16 bits rounds each step (bf16: 1 + 3·2^-10 rounds back to 1 every time).
  const int n = size();
  const float part = rank() == 0 ? 1.0f : 3 * 0x1p-10f;
  const float exact = 1.0f + static_cast<float>(n - 1) * 3 * 0x1p-10f;
  std::vector<int64_t> counts(static_cast<size_t>(n), 1);
  Half in(type(), std::vector<float>(static_cast<size_t>(n), part)), out(type(), {0.0f});
  reduce_scatter(in, out, counts).wait();
  Half once(type(), {exact});
  const bool p2p = !blocking() && GetParam().impl == NonblockingImpl::kP2p;
  if (p2p || n <= 2) {
    EXPECT_EQ(out.values()[0], once.values()[0]) << "T = " << n;
  } else {
    // MPI's own reduction rounds up to T - 1 times, u = 2^-8 (bf16) or 2^-11 (fp16) of the running sum each time.
    const double u = type() == DType::kBF16 ? 0x1p-8 : 0x1p-11;
    EXPECT_LE(std::abs(out.values()[0] - exact), (n - 1) * u * 2.0) << "T = " << n;
  }
}

TEST_P(Collectives16, AllGatherUnevenWithGapsAndInPlace) {
  const int n = size();
  std::vector<int64_t> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    counts[static_cast<size_t>(r)] = r == 1 ? 0 : r + 2;
    displs[static_cast<size_t>(r)] = at;
    at += counts[static_cast<size_t>(r)] + 1;  // a gap after every block must stay untouched
  }
  std::vector<float> expect(static_cast<size_t>(at), -1.0f);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
      expect[static_cast<size_t>(displs[static_cast<size_t>(r)] + i)] = static_cast<float>(r * 16 + i);
  const Half mine(type(), std::vector<float>(expect.begin() + displs[static_cast<size_t>(rank())],
                                             expect.begin() + displs[static_cast<size_t>(rank())] +
                                                 counts[static_cast<size_t>(rank())] + 1));
  Half out(type(), std::vector<float>(static_cast<size_t>(at), -1.0f));
  all_gather(mine.bits.data(), out, counts, displs).wait();
  EXPECT_EQ(out.values(), expect);
  // In place: this rank's block already sits at its displacement.
  std::vector<float> start(static_cast<size_t>(at), -1.0f);
  for (int64_t i = 0; i < counts[static_cast<size_t>(rank())]; ++i)
    start[static_cast<size_t>(displs[static_cast<size_t>(rank())] + i)] = static_cast<float>(rank() * 16 + i);
  Half inplace(type(), start);
  all_gather(inplace.bits.data() + displs[static_cast<size_t>(rank())], inplace, counts, displs).wait();
  EXPECT_EQ(inplace.values(), expect);
}

/// The bytes a Work's op carries (OpDesc::bytes: what the trace and the flight recorder report).
int64_t bytes_of(const Work& w) { return w.desc() ? w.desc()->bytes : -1; }

/// Distinct 16-bit patterns per (sender, receiver, index), none a NaN (so that bit equality is value equality).
uint16_t pattern(int from, int to, int64_t i) { return static_cast<uint16_t>(0x3c00 + from * 311 + to * 37 + i); }

// One exchange with a 16-bit block and an fp32 block to and from every peer (uneven counts): the 16-bit bits arrive
// unchanged, and the trace counts 2 bytes per 16-bit element and 4 per fp32 one.
TEST_P(Collectives16, ExchangeMovesTwoByteElements) {
  const int T = size(), me = rank();
  auto n16 = [](int from, int to) { return static_cast<int64_t>(3 + from + 2 * to); };
  std::vector<std::vector<uint16_t>> out16(static_cast<size_t>(T)), in16(static_cast<size_t>(T));
  std::vector<std::vector<float>> out32(static_cast<size_t>(T)), in32(static_cast<size_t>(T));
  std::vector<P2pSend> sends;
  std::vector<P2pRecv> recvs;
  int64_t want_bytes = 0;
  for (int p = 0; p < T; ++p) {
    if (p == me) continue;
    const auto pz = static_cast<size_t>(p);
    for (int64_t i = 0; i < n16(me, p); ++i) out16[pz].push_back(pattern(me, p, i));
    in16[pz].assign(static_cast<size_t>(n16(p, me)), 0);
    out32[pz].assign(2, static_cast<float>(me * 10 + p));
    in32[pz].assign(2, -1.0f);
    sends.push_back({p, out16[pz].data(), n16(me, p), type()});
    sends.push_back({p, out32[pz].data(), 2});
    recvs.push_back({p, in16[pz].data(), n16(p, me), type()});
    recvs.push_back({p, in32[pz].data(), 2});
    want_bytes += 2 * n16(me, p) + 4 * 2;
  }
  Work w = comm_->exchange(sends, recvs, "x16");
  w.wait();
  EXPECT_EQ(bytes_of(w), want_bytes);
  for (int p = 0; p < T; ++p) {
    if (p == me) continue;
    const auto pz = static_cast<size_t>(p);
    for (int64_t i = 0; i < n16(p, me); ++i) EXPECT_EQ(in16[pz][static_cast<size_t>(i)], pattern(p, me, i));
    EXPECT_EQ(in32[pz], std::vector<float>(2, static_cast<float>(p * 10 + me)));
  }
}

// The split exchange (receives first, sends later with the receives' tag) with 16-bit blocks.
TEST_P(Collectives16, SplitExchangeMovesTwoByteElements) {
  const int T = size(), me = rank();
  if (T < 2) GTEST_SKIP() << "needs 2 ranks";
  const int to = (me + 1) % T, from = (me + T - 1) % T;
  std::vector<uint16_t> out(5), in(5, 0);
  for (int64_t i = 0; i < 5; ++i) out[static_cast<size_t>(i)] = pattern(me, to, i);
  const P2pRecv r{from, in.data(), 5, type()};
  const P2pSend s{to, out.data(), 5, type()};
  Work rw = comm_->exchange_recvs(std::span<const P2pRecv>(&r, 1), "x16 recv");
  Work sw = comm_->exchange_sends(std::span<const P2pSend>(&s, 1), rw, "x16");
  sw.wait();
  rw.wait();
  EXPECT_EQ(bytes_of(sw), 10);
  EXPECT_EQ(bytes_of(rw), 0);  // a receive carries no bytes of this rank's
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(in[static_cast<size_t>(i)], pattern(from, me, i));
}

// all_to_all of 16-bit elements with uneven (and zero) counts: the bits arrive unchanged, 2 bytes each.
TEST_P(Collectives16, AllToAllMovesTwoByteElements) {
  const int T = size(), me = rank();
  const auto Tz = static_cast<size_t>(T);
  auto cnt = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 3); };  // some zero
  std::vector<int64_t> sc(Tz), sd(Tz), rc(Tz), rd(Tz);
  int64_t st = 0, rt = 0;
  for (int p = 0; p < T; ++p) {
    const auto pz = static_cast<size_t>(p);
    sc[pz] = cnt(me, p), sd[pz] = st, st += sc[pz];
    rc[pz] = cnt(p, me), rd[pz] = rt, rt += rc[pz];
  }
  std::vector<uint16_t> send(static_cast<size_t>(st)), recv(static_cast<size_t>(rt), 0);
  for (int p = 0; p < T; ++p)
    for (int64_t i = 0; i < sc[static_cast<size_t>(p)]; ++i)
      send[static_cast<size_t>(sd[static_cast<size_t>(p)] + i)] = pattern(me, p, i);
  Work w = type() == DType::kBF16
               ? comm_->all_to_all(reinterpret_cast<const BFloat16*>(send.data()), sc, sd,
                                   reinterpret_cast<BFloat16*>(recv.data()), rc, rd, "a2a16")
               : comm_->all_to_all(reinterpret_cast<const Float16*>(send.data()), sc, sd,
                                   reinterpret_cast<Float16*>(recv.data()), rc, rd, "a2a16");
  w.wait();
  EXPECT_EQ(w.desc()->op, type() == DType::kBF16 ? "all_to_all.bf16" : "all_to_all.fp16");
  EXPECT_EQ(bytes_of(w), 2 * st);
  for (int p = 0; p < T; ++p)
    for (int64_t i = 0; i < rc[static_cast<size_t>(p)]; ++i)
      EXPECT_EQ(recv[static_cast<size_t>(rd[static_cast<size_t>(p)] + i)], pattern(p, me, i));
}

TEST(Collectives16Exchange, AnInt8BlockIsRefused) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CommOptions o;
  o.timeout = 60s;
  auto c = Communicator::world("int8", std::make_shared<ProgressEngine>(EngineKind::kInline, 100), o);
  int8_t b[4] = {};
  const P2pSend s{(c->rank() + 1) % c->size(), b, 4, DType::kInt8};
  try {
    c->exchange(std::span<const P2pSend>(&s, 1), {}, "int8 block");
    FAIL() << "an int8 block must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("exchanges move fp32, bf16 or fp16"), std::string::npos) << e.what();
  }
}

TEST(Collectives16Fingerprint, A16BitOpIsNotAnFp32Op) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CommOptions o;
  o.timeout = 60s;
  o.check_fingerprints = true;
  auto c = Communicator::world("fingerprinted", std::make_shared<ProgressEngine>(EngineKind::kInline, 100), o);
  std::vector<float> f(4, 1.0f);
  std::vector<BFloat16> h(4, float_to_bf16(1.0f));
  try {
    if (c->rank() == 0)
      c->all_reduce(h.data(), 4, ReduceOp::kSum, "bf16 on rank 0").wait();
    else
      c->all_reduce(f.data(), 4, ReduceOp::kSum, "fp32 elsewhere").wait();
    FAIL() << "ops of different element types must not match";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kComm);
    EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace coc
