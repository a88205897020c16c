// coc-test-np: 1 2 3 4
// coc-test-timeout: 180
// The Communicator (coc/comm/communicator.h) on real MPI ranks, with both progress engines: every collective
// with uneven and zero counts, ordering and sequence numbers, disagreement checks, tp×dp process groups (edge case
// 6), deadlines with the flight recorder (edge case 18 of docs/edge-cases.md), and that the threaded engine sleeps
// while idle.
#include <dirent.h>
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/comm/communicator.h"
#include "coc/core/error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using namespace std::chrono_literals;
using test::world_rank;
using test::world_size;

class CommTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override { comm_ = test::world_comm(GetParam(), 60000); }
  std::unique_ptr<Communicator> comm_;
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  void exchange_round(bool chained);  // body of ExchangesInFlightDoNotCrossAndAllowZeroCounts
  /// A second communicator on this test's engine that checks every op's fingerprint (--debug-collectives).
  std::unique_ptr<Communicator> checked_comm(const char* name) const {
    CommOptions o;
    o.engine = GetParam();
    o.timeout = 60s;
    o.check_fingerprints = true;
    return Communicator::world(name, comm_->engine(), o);
  }
};

INSTANTIATE_TEST_SUITE_P(Engines, CommTest, ::testing::Values(EngineKind::kInline, EngineKind::kThread),
                         [](const ::testing::TestParamInfo<EngineKind>& i) { return to_string(i.param); });

TEST_P(CommTest, WorldIsADupOfWorld) {
  EXPECT_EQ(rank(), world_rank());
  EXPECT_EQ(size(), world_size());
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(comm_->raw(), MPI_COMM_WORLD, &cmp);
  EXPECT_EQ(cmp, MPI_CONGRUENT) << "the communicator must be a duplicate, never MPI_COMM_WORLD itself";
}

TEST_P(CommTest, AllReduceSumAndMax) {
  const int n = size();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}}) {
    std::vector<float> sum(static_cast<size_t>(count)), mx(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      // Small integers and halves: exact in fp32 whatever the reduction order.
      sum[static_cast<size_t>(i)] = static_cast<float>(rank()) + 0.5f * static_cast<float>(i);
      mx[static_cast<size_t>(i)] = static_cast<float>((rank() * 7 + i) % n);
    }
    Work ws = comm_->all_reduce(sum.data(), count, ReduceOp::kSum, "sum");
    Work wm = comm_->all_reduce(mx.data(), count, ReduceOp::kMax, "max");
    ws.wait();
    wm.wait();
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(sum[static_cast<size_t>(i)], static_cast<float>(n * (n - 1) / 2) + 0.5f * n * i) << "i=" << i;
      float expect_max = 0;
      for (int r = 0; r < n; ++r) expect_max = std::max(expect_max, static_cast<float>((r * 7 + i) % n));
      ASSERT_EQ(mx[static_cast<size_t>(i)], expect_max) << "i=" << i;
    }
  }
}

TEST_P(CommTest, ReduceScatterUnevenWithZeroShares) {
  const int n = size();
  // Every rank r receives counts[r] elements; ranks 1, 4, ... receive nothing.
  for (bool all_zero : {false, true}) {
    std::vector<int64_t> counts(static_cast<size_t>(n)), offs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = all_zero || r % 3 == 1 ? 0 : r + 2;
    std::exclusive_scan(counts.begin(), counts.end(), offs.begin(), int64_t{0});
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    std::vector<float> send(static_cast<size_t>(total));
    for (int64_t j = 0; j < total; ++j) send[static_cast<size_t>(j)] = static_cast<float>(rank() * 1000 + j);
    const int64_t mine = counts[static_cast<size_t>(rank())];
    std::vector<float> recv(static_cast<size_t>(mine) + 1, -7.0f);  // one guard element past the share
    comm_->reduce_scatter(send.data(), recv.data(), counts, "rs").wait();
    for (int64_t i = 0; i < mine; ++i) {
      const double expect = 1000.0 * n * (n - 1) / 2 + static_cast<double>(n) * (offs[static_cast<size_t>(rank())] + i);
      ASSERT_EQ(recv[static_cast<size_t>(i)], static_cast<float>(expect)) << "i=" << i;
    }
    EXPECT_EQ(recv[static_cast<size_t>(mine)], -7.0f) << "wrote past this rank's share";
  }
}

TEST_P(CommTest, AllGatherUnevenWithZeroSharesAndGaps) {
  const int n = size();
  std::vector<int64_t> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    counts[static_cast<size_t>(r)] = r == 1 ? 0 : r + 1;
    displs[static_cast<size_t>(r)] = at;
    at += counts[static_cast<size_t>(r)] + 2;  // a 2-element gap after every block must stay untouched
  }
  std::vector<float> send(static_cast<size_t>(counts[static_cast<size_t>(rank())]) + 1);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(rank() * 100 + static_cast<int>(i));
  std::vector<float> recv(static_cast<size_t>(at), -1.0f);
  comm_->all_gather(send.data(), recv.data(), counts, displs, "ag").wait();
  std::vector<float> expect(static_cast<size_t>(at), -1.0f);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
      expect[static_cast<size_t>(displs[static_cast<size_t>(r)] + i)] = static_cast<float>(r * 100 + i);
  EXPECT_EQ(recv, expect);

  // All shares empty: completes without touching anything.
  std::vector<int64_t> zeros(static_cast<size_t>(n), 0), zdispl(static_cast<size_t>(n), 0);
  float dummy = 3.0f;
  comm_->all_gather(&dummy, &dummy, zeros, zdispl, "ag empty").wait();
  EXPECT_EQ(dummy, 3.0f);
}

TEST_P(CommTest, AllToAllUnevenWithZeroCounts) {
  const int n = size();
  const int me = rank();
  auto cnt = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 3); };  // 0, 1 or 2; asymmetric
  std::vector<int64_t> sc(static_cast<size_t>(n)), sd(static_cast<size_t>(n)), rc(static_cast<size_t>(n)),
      rd(static_cast<size_t>(n));
  int64_t st = 0, rt = 0;
  for (int p = 0; p < n; ++p) {
    sc[static_cast<size_t>(p)] = cnt(me, p);
    rc[static_cast<size_t>(p)] = cnt(p, me);
    sd[static_cast<size_t>(p)] = st;
    rd[static_cast<size_t>(p)] = rt;
    st += sc[static_cast<size_t>(p)];
    rt += rc[static_cast<size_t>(p)];
  }
  std::vector<float> send(static_cast<size_t>(st) + 1), recv(static_cast<size_t>(rt) + 1, -1.0f);
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < sc[static_cast<size_t>(p)]; ++i)
      send[static_cast<size_t>(sd[static_cast<size_t>(p)] + i)] = static_cast<float>(me * 100 + p * 10 + i);
  comm_->all_to_all(send.data(), sc, sd, recv.data(), rc, rd, "a2a").wait();
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < rc[static_cast<size_t>(p)]; ++i)
      EXPECT_EQ(recv[static_cast<size_t>(rd[static_cast<size_t>(p)] + i)], static_cast<float>(p * 100 + me * 10 + i))
          << "from rank " << p << " element " << i;
  EXPECT_EQ(recv[static_cast<size_t>(rt)], -1.0f) << "wrote past the receive buffer";
}

TEST_P(CommTest, BroadcastFromLastRank) {
  const int root = size() - 1;
  std::vector<float> buf(257, rank() == root ? 0.0f : -1.0f);
  if (rank() == root) std::iota(buf.begin(), buf.end(), 1.0f);
  comm_->broadcast(buf.data(), static_cast<int64_t>(buf.size()), root, "bcast").wait();
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], static_cast<float>(i + 1));

  char text[32] = {};
  if (rank() == root) std::snprintf(text, sizeof text, "schedule from %d", root);
  comm_->broadcast_bytes(text, sizeof text, root, "bcast bytes").wait();
  EXPECT_EQ(std::string(text), "schedule from " + std::to_string(root));
}

// Point-to-point exchanges (the CoC p2p schedules' building block): several in flight at once, each to every peer,
// with uneven and zero counts; messages of different exchanges never cross even though they share the peers. Also
// chained (`after`: each exchange's sends wait for the previous one's), waited in reverse order, so that the wait
// on the last one must drive the whole chain (the inline engine tests only the op it waits for).
TEST_P(CommTest, ExchangesInFlightDoNotCrossAndAllowZeroCounts) {
  for (bool chained : {false, true}) {
    SCOPED_TRACE(chained ? "chained" : "all at once");
    exchange_round(chained);
  }
}

void CommTest::exchange_round(bool chained) {
  const int n = size(), me = rank();
  constexpr int kExchanges = 5;
  auto count = [](int from, int to, int x) { return static_cast<int64_t>((from * 7 + to * 3 + x) % 4 * 1000); };
  auto value = [](int from, int to, int x) { return static_cast<float>(from * 1000 + to * 10 + x); };
  std::vector<std::vector<std::vector<float>>> out(kExchanges), in(kExchanges);
  std::vector<Work> works;
  works.reserve(kExchanges);  // `after` refers into it
  for (int x = 0; x < kExchanges; ++x) {
    out[x].resize(static_cast<size_t>(n));
    in[x].resize(static_cast<size_t>(n));
    std::vector<P2pSend> sends;
    std::vector<P2pRecv> recvs;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      out[x][p].assign(static_cast<size_t>(count(me, p, x)), value(me, p, x));
      in[x][p].assign(static_cast<size_t>(count(p, me, x)), -1.0f);
      sends.push_back({p, out[x][p].data(), count(me, p, x)});
      recvs.push_back({p, in[x][p].data(), count(p, me, x)});
    }
    const Work none;
    works.push_back(comm_->exchange(sends, recvs, "exchange " + std::to_string(x),
                                    chained && x > 0 ? works[static_cast<size_t>(x - 1)] : none));
  }
  for (int x = kExchanges; x-- > 0;) works[static_cast<size_t>(x)].wait();  // reverse order
  for (int x = 0; x < kExchanges; ++x)
    for (int p = 0; p < n; ++p)
      for (float v : in[x][p]) ASSERT_EQ(v, value(p, me, x)) << "exchange " << x << " from rank " << p;
}

// The split exchange (exchange_recvs now, exchange_sends later with the receives' tag): every step's receives are
// posted first, then the sends in the same step order, chained, with uneven and zero counts that differ between
// ranks, under --debug-collectives (which fingerprints the halves by kind, not by count). Messages land in the
// step whose receives they were sent against; the receive halves complete without waiting for this rank's sends.
TEST_P(CommTest, SplitExchangeMatchesSendsToTheirStepsReceives) {
  auto checked = checked_comm("split");
  Communicator& c = *checked;
  const int n = size(), me = rank();
  constexpr int kSteps = 4;
  auto count = [](int from, int to, int x) { return static_cast<int64_t>((from * 5 + to * 3 + x) % 3 * 700); };
  auto value = [](int from, int to, int x) { return static_cast<float>(from * 1000 + to * 10 + x); };
  std::vector<std::vector<std::vector<float>>> out(kSteps), in(kSteps);
  std::vector<Work> recvs, sends;
  sends.reserve(kSteps);  // `after` refers into it
  for (int x = 0; x < kSteps; ++x) {
    out[x].resize(static_cast<size_t>(n));
    in[x].resize(static_cast<size_t>(n));
    std::vector<P2pRecv> list;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      in[x][p].assign(static_cast<size_t>(count(p, me, x)), -1.0f);
      list.push_back({p, in[x][p].data(), count(p, me, x)});
    }
    recvs.push_back(c.exchange_recvs(list, "recv " + std::to_string(x)));
  }
  for (int x = 0; x < kSteps; ++x) {
    std::vector<P2pSend> list;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      out[x][p].assign(static_cast<size_t>(count(me, p, x)), value(me, p, x));
      list.push_back({p, out[x][p].data(), count(me, p, x)});
    }
    const Work none;
    sends.push_back(c.exchange_sends(list, recvs[static_cast<size_t>(x)], "send " + std::to_string(x),
                                     x > 0 ? sends.back() : none));
  }
  wait_all(recvs);
  wait_all(sends);
  for (int x = 0; x < kSteps; ++x)
    for (int p = 0; p < n; ++p)
      for (float v : in[x][p]) ASSERT_EQ(v, value(p, me, x)) << "step " << x << " from rank " << p;
  // Sends against something that is not a receive half are a programming error, named.
  EXPECT_THROW(c.exchange_sends({}, Work(), "no receives"), Error);
}

// Waiting for a step's receives must drive this rank's queued sends, which the peers' receives wait for: with
// messages above every eager limit (1 MiB), each chained send is queued behind the previous one, and an inline wait
// that tested only the receive it waits for left both ranks waiting for ever (the p2p reduce-scatter waits its
// receives before its sends). A 20 s deadline turns such a hang into a failure (kTimeout).
TEST_P(CommTest, WaitingForReceivesPostsQueuedSends) {
  if (size() < 2) GTEST_SKIP() << "needs a peer";
  auto c = test::world_comm(GetParam(), 20000);
  const int n = size(), me = rank();
  constexpr int kSteps = 4;
  constexpr int64_t kCount = 1 << 18;  // floats: 1 MiB per peer and step
  std::vector<std::vector<float>> out(kSteps), in(kSteps);
  std::vector<Work> recvs, sends;
  sends.reserve(kSteps);
  for (int x = 0; x < kSteps; ++x) {
    in[x].assign(static_cast<size_t>(kCount * n), -1.0f);
    std::vector<P2pRecv> list;
    for (int p = 0; p < n; ++p)
      if (p != me) list.push_back({p, in[x].data() + p * kCount, kCount});
    recvs.push_back(c->exchange_recvs(list, "big recv " + std::to_string(x)));
  }
  for (int x = 0; x < kSteps; ++x) {
    out[x].assign(static_cast<size_t>(kCount), static_cast<float>(me * 100 + x));
    std::vector<P2pSend> list;
    for (int p = 0; p < n; ++p)
      if (p != me) list.push_back({p, out[x].data(), kCount});
    const Work none;
    sends.push_back(c->exchange_sends(list, recvs[static_cast<size_t>(x)], "big send " + std::to_string(x),
                                      x > 0 ? sends.back() : none));
  }
  // Receives before sends, as the schedules wait, and the last step's first: its matching send is the end of
  // every rank's chain, so only a wait that drives the whole chain can see it complete.
  for (int x = kSteps; x-- > 0;) {
    recvs[static_cast<size_t>(x)].wait();
    for (int p = 0; p < n; ++p)
      if (p != me) ASSERT_EQ(in[x][static_cast<size_t>(p * kCount + kCount - 1)], static_cast<float>(p * 100 + x));
  }
  wait_all(sends);
}

TEST_P(CommTest, BlockingCollectivesReturnCompletedWork) {
  std::vector<float> buf(1000, 1.0f);
  Work w = comm_->all_reduce(buf.data(), 1000, ReduceOp::kSum, "blocking ar", /*blocking=*/true);
  EXPECT_TRUE(w.test());
  EXPECT_EQ(buf[999], static_cast<float>(size()));
  std::vector<int64_t> counts(static_cast<size_t>(size()), 10), displs(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) displs[static_cast<size_t>(r)] = 10 * r;
  std::vector<float> mine(10, static_cast<float>(rank())), all(static_cast<size_t>(10 * size()), -1.0f);
  comm_->all_gather(mine.data(), all.data(), counts, displs, "blocking ag", true).wait();
  for (int r = 0; r < size(); ++r) EXPECT_EQ(all[static_cast<size_t>(10 * r + 9)], static_cast<float>(r));
  std::vector<float> part(10, -1.0f);
  comm_->reduce_scatter(all.data(), part.data(), counts, "blocking rs", true).wait();
  EXPECT_EQ(part[0], static_cast<float>(rank() * size()));
}

// The non-blocking reduce-scatter and all-gather of both builds (CommOptions::nonblocking). The p2p reduce-scatter
// must give exactly the rank-ordered sum (its contract, whatever order the messages arrive in), the MPI one the
// same values up to rounding; several ops in flight at once must not take each other's messages; a caller's
// completion step must see the summed result; the p2p all-gather must also work in place.
TEST_P(CommTest, NonblockingImplsGiveTheRankOrderedSumAndKeepOpsApart) {
  const int n = size();
  std::vector<int64_t> counts(static_cast<size_t>(n)), offs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r == 1 ? 0 : 1500 + 37 * r;  // uneven, one empty
  std::exclusive_scan(counts.begin(), counts.end(), offs.begin(), int64_t{0});
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t mine = counts[static_cast<size_t>(rank())], at = offs[static_cast<size_t>(rank())];
  auto data_of = [&](int r, uint64_t salt) {  // rank r's send buffer, known to every rank
    Tensor t = test::random_tensor({total}, 1000 * salt + static_cast<uint64_t>(r));
    return std::vector<float>(t.data(), t.data() + total);
  };
  for (NonblockingImpl impl : {NonblockingImpl::kP2p, NonblockingImpl::kMpi}) {
    SCOPED_TRACE(to_string(impl));
    CommOptions o;
    o.engine = GetParam();
    o.timeout = 60s;
    o.nonblocking = impl;
    auto c = Communicator::world("nonblocking", comm_->engine(), o);
    constexpr int kInFlight = 3;
    std::vector<std::vector<float>> send(kInFlight), recv(kInFlight), copied(kInFlight);
    std::vector<Work> works;
    for (int k = 0; k < kInFlight; ++k) {
      send[static_cast<size_t>(k)] = data_of(rank(), static_cast<uint64_t>(k));
      recv[static_cast<size_t>(k)].assign(static_cast<size_t>(mine) + 1, -7.0f);  // one guard element
      auto& dst = copied[static_cast<size_t>(k)];
      const float* src = recv[static_cast<size_t>(k)].data();
      works.push_back(c->reduce_scatter(send[static_cast<size_t>(k)].data(), recv[static_cast<size_t>(k)].data(),
                                        counts, "rs " + std::to_string(k))
                          .then([&dst, src, mine] { dst.assign(src, src + mine); }));
    }
    for (int k = kInFlight - 1; k >= 0; --k) works[static_cast<size_t>(k)].wait();  // any wait order
    for (int k = 0; k < kInFlight; ++k) {
      std::vector<float> expect(static_cast<size_t>(mine), 0.0f);
      for (int r = 0; r < n; ++r) {
        const std::vector<float> d = data_of(r, static_cast<uint64_t>(k));
        for (int64_t i = 0; i < mine; ++i)
          expect[static_cast<size_t>(i)] = r == 0 ? d[static_cast<size_t>(at + i)]
                                                  : expect[static_cast<size_t>(i)] + d[static_cast<size_t>(at + i)];
      }
      const auto& got = recv[static_cast<size_t>(k)];
      for (int64_t i = 0; i < mine; ++i) {
        if (impl == NonblockingImpl::kP2p)
          ASSERT_EQ(got[static_cast<size_t>(i)], expect[static_cast<size_t>(i)]) << "op " << k << " i=" << i;
        else
          ASSERT_NEAR(got[static_cast<size_t>(i)], expect[static_cast<size_t>(i)], 1e-5f * n) << "op " << k;
      }
      EXPECT_EQ(got[static_cast<size_t>(mine)], -7.0f) << "wrote past this rank's share";
      EXPECT_EQ(copied[static_cast<size_t>(k)], std::vector<float>(got.begin(), got.begin() + mine))
          << "the caller's completion step ran before the sum";
    }

    // All-gather, out of place and in place (this rank's block already at its place in recv).
    std::vector<float> expect(static_cast<size_t>(total));
    for (int r = 0; r < n; ++r) {
      const std::vector<float> d = data_of(r, 7);
      std::copy(d.begin(), d.begin() + counts[static_cast<size_t>(r)], expect.begin() + offs[static_cast<size_t>(r)]);
    }
    const std::vector<float> own = data_of(rank(), 7);
    std::vector<float> gathered(static_cast<size_t>(total), -1.0f), in_place(static_cast<size_t>(total), -1.0f);
    std::copy(own.begin(), own.begin() + mine, in_place.begin() + at);
    Work a = c->all_gather(own.data(), gathered.data(), counts, offs, "ag");
    Work b = c->all_gather(in_place.data() + at, in_place.data(), counts, offs, "ag in place");
    b.wait();
    a.wait();
    EXPECT_EQ(gathered, expect);
    EXPECT_EQ(in_place, expect);
  }
  EXPECT_EQ(parse_nonblocking_impl("p2p"), NonblockingImpl::kP2p);
  EXPECT_EQ(parse_nonblocking_impl("mpi"), NonblockingImpl::kMpi);
  EXPECT_THROW(parse_nonblocking_impl("nccl"), Error);
}

TEST_P(CommTest, BarrierWaitsForTheSlowestRank) {
  if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto t0 = std::chrono::steady_clock::now();
  if (rank() == 0) std::this_thread::sleep_for(100ms);
  comm_->barrier("slow rank 0");
  if (rank() != 0) EXPECT_GE(std::chrono::steady_clock::now() - t0, 80ms) << "left the barrier before rank 0 came";
}

TEST_P(CommTest, ManyOpsInFlightCompleteInAnyWaitOrder) {
  const int n = size();
  std::vector<std::vector<float>> bufs(8, std::vector<float>(64));
  std::vector<Work> works;
  const uint64_t seq0 = comm_->next_seq();
  for (size_t k = 0; k < bufs.size(); ++k) {
    std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(k + 1));
    works.push_back(comm_->all_reduce(bufs[k].data(), 64, ReduceOp::kSum, "op " + std::to_string(k)));
    EXPECT_EQ(works.back().desc()->seq, seq0 + k);
  }
  EXPECT_EQ(comm_->next_seq(), seq0 + bufs.size());
  for (size_t k = bufs.size(); k-- > 0;) works[k].wait();  // reverse order
  for (size_t k = 0; k < bufs.size(); ++k) {
    EXPECT_EQ(bufs[k][0], static_cast<float>((k + 1) * n));
    EXPECT_TRUE(works[k].test());
  }
}

TEST_P(CommTest, CheckSameAcceptsAgreementAndNamesTheFirstDissenter) {
  EXPECT_NO_THROW(comm_->check_same(0xC0C, "model config"));
  if (size() < 2) return;
  try {
    comm_->check_same(rank() == 0 ? 1 : 2, "model config");
    FAIL() << "ranks disagree; check_same must throw on every rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_TRUE(e.uniform());
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model config"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  }
}

TEST_P(CommTest, FingerprintMismatchIsReportedInsteadOfHanging) {
  auto checked = checked_comm("checked");
  Communicator& c = *checked;
  float x[8] = {};
  EXPECT_NO_THROW(c.all_reduce(x, 8, ReduceOp::kSum, "agreed").wait());
  if (size() < 2) return;
  try {
    c.all_reduce(x, rank() == 0 ? 4 : 5, ReduceOp::kSum, "mismatched").wait();
    FAIL() << "ranks posted different counts";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kComm);
    EXPECT_TRUE(e.uniform());
    EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
  }
}

// ---- Typed metadata calls ---------------------------------------------------------------------------------------

TEST_P(CommTest, AllReduceMinOfFloats) {
  std::vector<float> x = {static_cast<float>(rank()), static_cast<float>(-rank()), 7.0f};
  comm_->all_reduce(x.data(), 3, ReduceOp::kMin, "min").wait();
  EXPECT_EQ(x, (std::vector<float>{0.0f, static_cast<float>(1 - size()), 7.0f}));
}

TEST_P(CommTest, AllReduceValuesOfEveryTypeAndOp) {
  const int n = size(), me = rank();
  // Values above 2^53 (int64 and uint64 must not go through a double) and negative ones.
  int64_t big[3] = {(int64_t{1} << 60) + me, -me, me == n - 1 ? 5 : 0};
  comm_->all_reduce_values(big, ReduceOp::kMax, "int64 max");
  EXPECT_EQ(big[0], (int64_t{1} << 60) + n - 1);
  EXPECT_EQ(big[1], 0);
  EXPECT_EQ(big[2], 5);
  EXPECT_EQ(comm_->all_reduce_value(int64_t{-me}, ReduceOp::kMin, "int64 min"), int64_t{1 - n});
  EXPECT_EQ(comm_->all_reduce_value(int64_t{me}, ReduceOp::kSum, "int64 sum"), int64_t{n} * (n - 1) / 2);
  std::vector<uint64_t> u = {~uint64_t{0} - static_cast<uint64_t>(me), static_cast<uint64_t>(me)};
  comm_->all_reduce_values(u, ReduceOp::kMin, "uint64 min");
  EXPECT_EQ(u[0], ~uint64_t{0} - static_cast<uint64_t>(n - 1));
  EXPECT_EQ(u[1], 0u);
  EXPECT_EQ(comm_->all_reduce_value(uint64_t{1}, ReduceOp::kSum, "uint64 sum"), static_cast<uint64_t>(n));
  EXPECT_EQ(comm_->all_reduce_value(0.5 * me, ReduceOp::kMax, "double max"), 0.5 * (n - 1));
  EXPECT_EQ(comm_->all_reduce_value(0.25 + me, ReduceOp::kSum, "double sum"), 0.25 * n + n * (n - 1) / 2.0);
  // Empty: nothing to reduce, but still one op in order on every rank.
  const uint64_t seq = comm_->next_seq();
  comm_->all_reduce_values(std::span<double>(), ReduceOp::kSum, "empty");
  EXPECT_EQ(comm_->next_seq(), seq + 1);
}

TEST_P(CommTest, AllGatherValueAndBytes) {
  struct Shape {
    int32_t rank;
    int64_t rows;
    double scale;
  };
  const std::vector<Shape> all = comm_->all_gather_value(Shape{rank(), 100 * rank() + 1, 0.5 * rank()}, "shapes");
  ASSERT_EQ(static_cast<int>(all.size()), size());
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(all[static_cast<size_t>(r)].rank, r);
    EXPECT_EQ(all[static_cast<size_t>(r)].rows, 100 * r + 1);
    EXPECT_EQ(all[static_cast<size_t>(r)].scale, 0.5 * r);
  }
  // Zero bytes from every rank: completes and writes nothing.
  char untouched = 'x';
  comm_->all_gather_bytes(nullptr, 0, &untouched, "nothing");
  EXPECT_EQ(untouched, 'x');
  EXPECT_THROW(comm_->all_gather_bytes(nullptr, -1, nullptr, "negative"), Error);
}

TEST_P(CommTest, AllToAllCountsUnevenAndZero) {
  const int n = size(), me = rank();
  auto cnt = [](int from, int to) { return static_cast<int64_t>((from * 5 + to * 3) % 4) * 1000; };  // 0 .. 3000
  for (bool all_zero : {false, true}) {
    std::vector<int64_t> send(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) send[static_cast<size_t>(p)] = all_zero ? 0 : cnt(me, p);
    const std::vector<int64_t> recv = comm_->all_to_all_counts(send, "token counts");
    ASSERT_EQ(static_cast<int>(recv.size()), n);
    for (int p = 0; p < n; ++p)
      EXPECT_EQ(recv[static_cast<size_t>(p)], all_zero ? 0 : cnt(p, me)) << "what rank " << p << " sends to " << me;
  }
  // Counts above 2^31: the exchange is int64, not MPI's int.
  std::vector<int64_t> huge(static_cast<size_t>(n), (int64_t{1} << 40) + me);
  for (int64_t c : comm_->all_to_all_counts(huge, "huge counts")) EXPECT_GE(c, int64_t{1} << 40);
  // A negative count is a caller's bug, named; every rank throws before posting, so nothing is left half done.
  std::vector<int64_t> bad(static_cast<size_t>(n), 1);
  bad[0] = -3;
  try {
    comm_->all_to_all_counts(bad, "bad counts");
    FAIL() << "a negative count must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bad counts"), std::string::npos) << e.what();
  }
}

TEST_P(CommTest, GatherBytesOfUnevenAndEmptyLengthsToAnyRoot) {
  const int n = size(), me = rank();
  auto text = [](int r) {
    return r % 2 == 1 ? std::string() : std::string(static_cast<size_t>(1000 * r + 3), static_cast<char>('a' + r));
  };
  for (int root : {0, n - 1}) {
    const std::vector<std::string> got = comm_->gather_bytes(text(me), root, "fragments");
    if (me != root) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], text(r)) << "from rank " << r;
  }
  // Binary bytes (NULs included) arrive as they are.
  const std::string bin("a\0b\0", 4);
  const std::vector<std::string> got = comm_->gather_bytes(bin, 0, "binary");
  if (me == 0)
    for (const auto& g : got) EXPECT_EQ(g, bin);
}

TEST_P(CommTest, BroadcastStringOfAnyLength) {
  const int root = size() - 1;
  for (const std::string& s : {std::string(), std::string("trace path"), std::string(100000, 'z')}) {
    const std::string got = comm_->broadcast_string(rank() == root ? s : "ignored on other ranks", root, "string");
    EXPECT_EQ(got, s);
  }
}

// Under --debug-collectives the typed calls are fingerprinted like every collective: a rank that passes another
// length, or calls another op, is reported on every rank (kComm, uniform) instead of corrupting or hanging.
TEST_P(CommTest, TypedCallMismatchIsReportedUnderDebugCollectives) {
  auto checked = checked_comm("checked typed");
  Communicator& c = *checked;
  int64_t two[2] = {1, 2};
  EXPECT_NO_THROW(c.all_reduce_values(two, ReduceOp::kSum, "agreed"));
  if (size() < 2) return;
  auto expect_mismatch = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": ranks disagree, the call must throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kComm) << what;
      EXPECT_TRUE(e.uniform()) << what;
      EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
    }
  };
  expect_mismatch([&] { c.all_reduce_values(std::span<int64_t>(two, rank() == 0 ? 1 : 2), ReduceOp::kMax, "len"); },
                  "all_reduce_values of 1 and 2 values");
  expect_mismatch(
      [&] {
        if (rank() == 0) c.all_gather_value(int32_t{1}, "width");
        else c.all_gather_value(int64_t{1}, "width");
      },
      "all_gather_value of 4 and 8 bytes");
  expect_mismatch(
      [&] {
        std::vector<int64_t> counts(static_cast<size_t>(size()), 1);
        if (rank() == 0) c.all_to_all_counts(counts, "counts");
        else c.all_reduce_values(counts, ReduceOp::kSum, "counts");
      },
      "all_to_all_counts against all_reduce_values");
  // The communicator is still in step afterwards: no op was posted by the failed calls.
  EXPECT_EQ(c.all_reduce_value(int64_t{1}, ReduceOp::kSum, "after"), size());
}

// A metadata call whose peers do not come in time ends with kTimeout naming the op (edge case 18), and its buffers
// survive the unwinding: the peers join later and MPI writes into memory the op still owns.
TEST_P(CommTest, TypedCallDeadlineNamesTheOp) {
  if (size() < 2) GTEST_SKIP() << "needs a peer that does not join";
  auto side = test::world_comm(GetParam(), 60000);
  auto late = test::world_comm(GetParam(), 1000);
  if (rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      late->all_reduce_value(int64_t{7}, ReduceOp::kMax, "shape key");
      FAIL() << "the peers have not joined";
    } catch (const Error& e) {
      EXPECT_GE(std::chrono::steady_clock::now() - t0, 900ms);
      EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("all_reduce_int64_max#"), std::string::npos) << msg;
      EXPECT_NE(msg.find("shape key"), std::string::npos) << msg;
    }
    side->barrier("release the late ranks");
  } else {
    side->barrier("release the late ranks");
    EXPECT_EQ(late->all_reduce_value(int64_t{rank()}, ReduceOp::kMax, "late join"), std::max(7, size() - 1));
  }
  // Rank 0's abandoned op completes while it waits here (every wait drives every op in flight).
  late->barrier("joined");
}

TEST_P(CommTest, DeadlineExpiryNamesTheOpAndDumpsTheFlightRecorder) {
  if (size() < 2) GTEST_SKIP() << "needs a peer that does not join";
  // A second communicator orders the late join after rank 0's timeout, so MPI stays consistent.
  auto side = test::world_comm(GetParam(), 60000);
  float x = 1.0f;
  if (rank() == 0) {
    Work w = comm_->all_reduce(&x, 1, ReduceOp::kSum, "never joined in time");
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w.wait_until(t0 + 200ms);
      FAIL() << "the all_reduce cannot complete: the other ranks have not posted it";
    } catch (const Error& e) {
      const auto waited = std::chrono::steady_clock::now() - t0;
      EXPECT_GE(waited, 190ms);
      EXPECT_LT(waited, 10s) << "the deadline was not honoured";
      EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
      EXPECT_FALSE(e.uniform());
      const std::string msg = e.what();
      EXPECT_NE(msg.find("all_reduce#"), std::string::npos) << msg;
      EXPECT_NE(msg.find("never joined in time"), std::string::npos) << msg;
      EXPECT_NE(msg.find("Last ops on this rank"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[pending]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    }
    EXPECT_FALSE(w.test());
    side->barrier("release the late ranks");
    w.wait();  // now the peers join
  } else {
    side->barrier("release the late ranks");
    comm_->all_reduce(&x, 1, ReduceOp::kSum, "late join").wait();
  }
  EXPECT_EQ(x, static_cast<float>(size()));
}

TEST(CommThreadEngine, AbandonedOpDoesNotBlockShutdown) {
  // A timed-out op whose Work is dropped (an exception unwinding past it) must not make the engine's destructor
  // wait for it: that would hang the failing rank instead of letting the error policy abort the job.
  if (world_size() < 2) GTEST_SKIP() << "needs a peer that does not join";
  auto side = test::world_comm(EngineKind::kInline, 60000);
  static float x = 1.0f;  // MPI writes into it whenever the late peers join: must outlive everything here
  auto late = test::world_comm(EngineKind::kThread, 60000);
  if (world_rank() == 0) {
    Work w = late->all_reduce(&x, 1, ReduceOp::kSum, "abandoned");
    EXPECT_THROW(w.wait_until(std::chrono::steady_clock::now() + 100ms), Error);
    std::promise<void> done;
    auto fut = done.get_future();
    std::thread destroyer([&] {
      w = Work();      // drop the last handle of the op...
      late.reset();    // ...then the communicator and, with it, the engine and its thread
      done.set_value();
    });
    const bool finished = fut.wait_for(10s) == std::future_status::ready;
    EXPECT_TRUE(finished) << "destroying an engine with an abandoned op hung";
    if (finished) destroyer.join();
    else destroyer.detach();  // the process is failing anyway; do not hang the test
  }
  side->barrier("release");
  if (world_rank() != 0) late->all_reduce(&x, 1, ReduceOp::kSum, "late join").wait();
  // Rank 0 keeps MPI progressing here (its request is still live inside MPI) until the peers have joined.
  side->barrier("joined");
}

TEST(InlineEngine, PollLeaseMovesOpsWhileTheCallerMakesNoMpiCall) {
  // ProgressEngine::PollLease: the inline engine's lent thread must complete an op posted before a stretch of
  // compute that never calls into MPI (here: a sleep), and stop once nothing is in flight.
  auto c = test::world_comm(EngineKind::kInline, 60000);
  std::vector<float> x(1 << 16, 1.0f);
  c->barrier("start");
  Work w = c->all_reduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum, "leased");
  {
    const auto lease = c->engine()->lend_poller();
    const auto t0 = std::chrono::steady_clock::now();
    while (c->engine()->in_flight() > 0 && std::chrono::steady_clock::now() - t0 < 20s)
      std::this_thread::sleep_for(5ms);  // no MPI call from this thread
    EXPECT_EQ(c->engine()->in_flight(), 0u) << "the lent thread did not complete the all-reduce";
  }
  w.wait();
  EXPECT_EQ(x[0], static_cast<float>(world_size()));
  EXPECT_EQ(c->engine()->lend_poller(), nullptr);  // nothing in flight: no thread lent
  auto t = test::world_comm(EngineKind::kThread, 60000);
  Work u = t->all_reduce(x.data(), 1, ReduceOp::kSum, "threaded");
  EXPECT_EQ(t->engine()->lend_poller(), nullptr);  // the threaded engine drives MPI itself
  u.wait();
  c->barrier("end");
}

/// The whole process's CPU time (all threads, MPI's included), in ms, while this thread sleeps for `d`.
double cpu_ms_while_sleeping(std::chrono::milliseconds d) {
  timespec a{}, b{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  std::this_thread::sleep_for(d);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  return (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
}

TEST(InlineEngine, LeasesShareOneParkedThread) {
  // PollLease lends one thread per engine, parked between leases: a thread per lease cost 30-90 µs, and the
  // segmented backward takes one per row block. Many leases leave one more thread than none, and it sleeps.
  auto threads = [] {
    int n = 0;
    if (DIR* d = opendir("/proc/self/task")) {
      while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
      closedir(d);
    }
    return n;
  };
  auto c = test::world_comm(EngineKind::kInline, 60000);
  std::vector<float> x(1 << 16, 1.0f);
  c->barrier("start");
  const int before = threads();
  for (int i = 0; i < 20; ++i) {
    Work w = c->all_reduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum, "leased");
    {
      const auto lease = c->engine()->lend_poller();
      const auto t0 = std::chrono::steady_clock::now();
      while (c->engine()->in_flight() > 0 && std::chrono::steady_clock::now() - t0 < 20s)
        std::this_thread::sleep_for(1ms);  // no MPI call from this thread
      EXPECT_EQ(c->engine()->in_flight(), 0u) << "lease " << i << ": the lent thread did not complete the all-reduce";
    }
    w.wait();
  }
  EXPECT_LE(threads(), before + 1) << "each lease started a thread of its own";
  c->barrier("start idle");
  const double ms = cpu_ms_while_sleeping(300ms);
  EXPECT_LT(ms, 20.0) << "the parked lease thread used " << ms << " ms of CPU in 300 ms";
  c->barrier("end");
}

TEST(CommThreadEngine, SleepsWhileIdle) {
  // docs/design.md: the communication thread must sleep while it waits; it may never spin a core the GEMM
  // needs. Whole-process CPU time (all threads, MPI's included) over 300 ms of idleness with a live engine.
  auto c = test::world_comm(EngineKind::kThread, 60000);
  float x = 1.0f;
  c->all_reduce(&x, 1, ReduceOp::kSum, "warm up").wait();  // the thread has run at least once
  c->barrier("start idle");
  const double ms = cpu_ms_while_sleeping(300ms);
  EXPECT_LT(ms, 20.0) << "an idle threaded engine used " << ms << " ms of CPU in 300 ms";
  EXPECT_EQ(c->engine()->in_flight(), 0u);
  c->barrier("end idle");
}

TEST(CommThreadEngine, MetadataCallsDoNotWaitForThePollPeriod) {
  // The caller of a blocking metadata call drives MPI itself: with a communication thread that polls only every
  // 200 ms, ten calls would take >= 2 s if they waited for it to see each completion. (The limit leaves room for
  // one poll period: the barrier before the loop is an ordinary wait, so ranks leave it up to 200 ms apart.)
  CommOptions o;
  o.engine = EngineKind::kThread;
  o.poll_us = 200000;
  auto c = Communicator::world("slow poll", std::make_shared<ProgressEngine>(o.engine, o.poll_us), o);
  c->barrier("start");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(c->all_reduce_value(int64_t{1}, ReduceOp::kSum, "count ranks"), world_size());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  c->barrier("end");
}

TEST(Mesh, TpByDpOnFourRanksKeepsCollectivesInTheirGroup) {
  const int n = world_size(), w = world_rank();
  CommOptions o;
  o.timeout = 60s;
  if (n % 2 != 0) {
    try {
      make_mesh({.tp = 2}, o);
      FAIL() << "world " << n << " cannot split into tp=2";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_TRUE(e.uniform());
      EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
    }
    return;
  }
  for (EngineKind kind : {EngineKind::kInline, EngineKind::kThread}) {
    o.engine = kind;
    Mesh g = make_mesh({.tp = 2}, o);
    const int dp = n / 2;
    ASSERT_EQ(g.tp_size(), 2);
    ASSERT_EQ(g.dp_size(), dp);
    EXPECT_EQ(g.tp_rank(), w % 2) << "tp ranks of one replica must be adjacent";
    EXPECT_EQ(g.dp_rank(), w / 2);
    EXPECT_EQ(g.world->size(), n);

    // Post on both groups before waiting on either, same order on every rank.
    float t = static_cast<float>(w), d = static_cast<float>(w);
    Work wt = g.tp->all_reduce(&t, 1, ReduceOp::kSum, "tp");
    Work wd = g.dp->all_reduce(&d, 1, ReduceOp::kSum, "dp");
    wt.wait();
    wd.wait();
    EXPECT_EQ(t, static_cast<float>(4 * (w / 2) + 1));  // (2·dp_rank) + (2·dp_rank + 1)
    EXPECT_EQ(d, static_cast<float>(2 * dp * (dp - 1) / 2 + dp * (w % 2)));  // Σ_d (2d + tp_rank)

    // The tp group gathers exactly this replica's two world ranks.
    float mine = static_cast<float>(w), both[2] = {-1, -1};
    const int64_t counts[2] = {1, 1}, displs[2] = {0, 1};
    g.tp->all_gather(&mine, both, counts, displs, "tp members").wait();
    EXPECT_EQ(both[0], static_cast<float>(w - w % 2));
    EXPECT_EQ(both[1], static_cast<float>(w - w % 2 + 1));
  }
}

TEST(Mesh, RejectsTpBelowOne) {
  CommOptions o;
  EXPECT_THROW(make_mesh({.tp = 0}, o), Error);
}

}  // namespace
}  // namespace coc
