#include "coc/comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <numeric>

#include "coc/comm/shm_window.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "element_types.h"
#include "mpi_check.h"
#include "work_state.h"

namespace coc {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

namespace {
using detail::check_mpi;
using detail::mpi_op;
using detail::mpi_type;

/// "" for a sum (the historical name of the fp32 all-reduce), else "_max" / "_min".
const char* op_suffix(ReduceOp op) { return op == ReduceOp::kSum ? "" : op == ReduceOp::kMax ? "_max" : "_min"; }

/// The op's name: `base`, then "_max" / "_min" (see op_suffix), then ".bf16" / ".fp16" for 16-bit elements.
std::string op_name(const char* base, ReduceOp op, DType t) {
  std::string n = std::string(base) + op_suffix(op);
  if (t != DType::kF32) n += std::string(".") + to_string(t);
  return n;
}
}  // namespace

NonblockingImpl parse_nonblocking_impl(const std::string& s) {
  if (s == "p2p") return NonblockingImpl::kP2p;
  if (s == "mpi") return NonblockingImpl::kMpi;
  throw_invalid("unknown --comm-nonblocking-impl '{}'; use 'p2p' (point-to-point messages to every peer) or 'mpi' "
                "(MPI_Ireduce_scatter and MPI_Iallgatherv)",
                s);
}
const char* to_string(NonblockingImpl k) { return k == NonblockingImpl::kP2p ? "p2p" : "mpi"; }

uint64_t Communicator::next_serial() {
  static std::atomic<uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed);
}

Communicator::Communicator(MPI_Comm parent, std::string name, std::shared_ptr<ProgressEngine> engine,
                           CommOptions opts)
    : name_(std::move(name)), engine_(std::move(engine)), opts_(opts) {
  engine_->call([&] {
    check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup", name_);
    // MPI's default handler aborts the job with its own message, which launchers may hide (Open MPI's mpirun under
    // --quiet exits 15 without a line); returned, an error becomes coc's one line naming the op (check_mpi, and
    // ProgressEngine for the ops in flight), and the error policy aborts the job.
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", name_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Groups of one name (the tp groups of a dp x tp mesh) are told apart in a merged trace by their rank 0.
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    const int zero = 0;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(mine, 1, &zero, world, &world_root_);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    return 0;
  });
}

Communicator::~Communicator() {
  shm_.reset();  // its node communicator is independent of comm_, but free it while the engine is certainly alive
  if (comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // With an op still in flight (abandoned by an exception, e.g. a timeout), leak the communicator instead of
    // freeing it: Open MPI 4.1 does not defer the free as the standard says, and the pending libnbc schedule
    // later dereferences the freed communicator and segfaults (seen in tests/comm/test_communicator.cpp,
    // AbandonedOpDoesNotBlockShutdown). The engine may be shared, so any in-flight op counts.
    if (!finalized && engine_->in_flight() == 0) engine_->call([&] { return MPI_Comm_free(&comm_); });
  }
}

ShmWindow& Communicator::shm_window() {
  if (!shm_) shm_ = std::make_unique<ShmWindow>(*this);
  return *shm_;
}

std::unique_ptr<Communicator> Communicator::world(std::string name, std::shared_ptr<ProgressEngine> engine,
                                                 CommOptions opts) {
  return std::make_unique<Communicator>(MPI_COMM_WORLD, std::move(name), std::move(engine), opts);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name,
                                                  const CommOptions* opts) const {
  MPI_Comm sub = MPI_COMM_NULL;
  engine_->call([&] {
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", name);
    return 0;
  });
  auto c = std::make_unique<Communicator>(sub, std::move(name), engine_, opts ? *opts : opts_);
  engine_->call([&] { return MPI_Comm_free(&sub); });
  return c;
}

int Communicator::to_int(int64_t v, const char* what, const std::string& tag) const {
  if (v < 0 || v > INT_MAX)
    throw_invalid("rank {}: {} = {} in '{}' on communicator '{}' does not fit MPI's int; use a smaller chunk "
                  "(raise --coc-parallel-num) or a smaller micro-batch",
                  log::rank(), what, v, tag, name_);
  return static_cast<int>(v);
}

void Communicator::check_fingerprint(const std::string& op, int64_t count, const std::string& tag) {
  // Fingerprint = (hash of op name, element count, sequence number). Gathered blocking, before the op is posted,
  // so a mismatch is reported instead of mismatched buffers being exchanged.
  uint64_t mine[3] = {fnv1a(op.data(), op.size()), static_cast<uint64_t>(count), seq_};
  std::vector<uint64_t> all(3 * static_cast<size_t>(size_));
  engine_->call([&] {
    check_mpi(MPI_Allgather(mine, 3, MPI_UINT64_T, all.data(), 3, MPI_UINT64_T, comm_), "MPI_Allgather",
              "fingerprint of " + op);
    return 0;
  });
  for (int r = 0; r < size_; ++r) {
    const uint64_t* f = &all[3 * static_cast<size_t>(r)];
    if (f[0] != all[0] || f[1] != all[1] || f[2] != all[2]) {
      throw Error(ErrorKind::kComm,
                  fmt::format("collective mismatch on communicator '{}' at op #{}: rank 0 posts {} of {} elements, "
                              "rank {} posts {} of {} elements (rank {} '{}'). Every rank must issue the same "
                              "collectives with the same shapes: check that all ranks got the same config, data "
                              "shapes and flags",
                              name_, seq_, f[0] == mine[0] ? op : std::string("a different op"), all[1], r,
                              f[0] == all[0] ? "the same op" : "a different op", f[1], rank_, tag),
                  /*uniform=*/true);
    }
  }
}

void Communicator::check_all_to_all_counts(std::span<const int64_t> send_counts,
                                           std::span<const int64_t> recv_counts, const std::string& tag) {
  const auto n = static_cast<size_t>(size_);
  std::vector<int64_t> mine(2 * n), all(2 * n * n);
  std::copy(send_counts.begin(), send_counts.end(), mine.begin());
  std::copy(recv_counts.begin(), recv_counts.end(), mine.begin() + static_cast<std::ptrdiff_t>(n));
  engine_->call([&] {
    check_mpi(MPI_Allgather(mine.data(), static_cast<int>(2 * n), MPI_INT64_T, all.data(), static_cast<int>(2 * n),
                            MPI_INT64_T, comm_),
              "MPI_Allgather", "all_to_all counts of " + tag);
    return 0;
  });
  // Rank r's send count to p must be rank p's recv count from r.
  for (size_t r = 0; r < n; ++r)
    for (size_t p = 0; p < n; ++p) {
      const int64_t sent = all[r * 2 * n + p], expected = all[p * 2 * n + n + r];
      if (sent != expected)
        throw Error(ErrorKind::kComm,
                    fmt::format("all_to_all count mismatch on communicator '{}' at op #{} ('{}'): rank {} sends {} "
                                "elements to rank {}, which expects {}. Exchange the counts first "
                                "(all_to_all_counts) and pass what it returns",
                                name_, seq_, tag, r, sent, p, expected),
                    /*uniform=*/true);
    }
}

Work Communicator::post(const std::string& op, const std::string& tag, int64_t count, int64_t bytes,
                        const std::function<void(std::vector<MPI_Request>&)>& start, bool blocking,
                        std::function<void(std::vector<MPI_Request>&)> sends, std::shared_ptr<WorkState> after) {
  if (opts_.check_fingerprints) check_fingerprint(op, count, tag);
  auto st = std::make_shared<WorkState>();
  st->desc = OpDesc{name_, op, tag, seq_++, bytes};
  st->group_root = world_root_;
  st->start = std::chrono::steady_clock::now();
  engine_->call([&] {
    start(st->requests);
    if (sends) {
      st->sends_from = st->requests.size();
      if (!after || after->sends_done.load(std::memory_order_acquire) || after->done.load(std::memory_order_acquire))
        sends(st->requests);
      else {
        st->deferred = std::move(sends);
        st->after = std::move(after);
      }
    }
    return 0;
  });
  if (st->requests.empty() && !st->deferred) {
    st->end = blocking ? std::chrono::steady_clock::now() : st->start;
    st->done.store(true, std::memory_order_release);
    if (blocking) trace_completed(*st);
  }
  log::debug("post {}", st->desc.to_string());
  engine_->track(st);
  return Work(st, engine_, opts_.timeout);
}

Work Communicator::all_reduce_impl(void* buf, DType type, int64_t count, ReduceOp op, const std::string& tag,
                                   bool blocking) {
  int n = to_int(count, "count", tag);
  return post(op_name("all_reduce", op, type), tag, count, count * dtype_size(type),
              [&](std::vector<MPI_Request>& reqs) {
                if (size_ == 1 || n == 0) return;
                const MPI_Datatype dt = mpi_type(type);
                const MPI_Op mop = mpi_op(op, type);
                if (blocking) {
                  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, n, dt, mop, comm_), "MPI_Allreduce", tag);
                  return;
                }
                reqs.emplace_back();
                check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, n, dt, mop, comm_, &reqs.back()), "MPI_Iallreduce", tag);
              },
              blocking);
}

namespace {
/// Element `i` of a buffer of `es`-byte elements.
const char* elem(const void* base, int64_t i, int64_t es) { return static_cast<const char*>(base) + i * es; }
char* elem(void* base, int64_t i, int64_t es) { return static_cast<char*>(base) + i * es; }
}  // namespace

Work Communicator::reduce_scatter_impl(const void* send, void* recv, DType type,
                                       std::span<const int64_t> recv_counts, const std::string& tag, bool blocking) {
  COC_ASSERT(static_cast<int>(recv_counts.size()) == size_, "reduce_scatter needs {} counts", size_);
  auto counts_p = std::make_shared<std::vector<int>>(recv_counts.size());
  std::vector<int>& counts = *counts_p;
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = to_int(recv_counts[i], "recv count", tag);
    total += recv_counts[i];
  }
  to_int(total, "total count", tag);
  const int64_t es = dtype_size(type);
  const bool p2p = !blocking && size_ > 1 && total > 0 && opts_.nonblocking == NonblockingImpl::kP2p;
  std::vector<int64_t> displs(counts.size());
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  // The peers' partials of this rank's share, slot by slot in rank order (this rank's own slot skipped).
  // Uninitialised (MPI writes every element): no memory pass before the transfer.
  std::shared_ptr<char[]> parts;
  if (p2p) parts.reset(new char[static_cast<size_t>((size_ - 1) * recv_counts[static_cast<size_t>(rank_)] * es)]);
  // As in exchange_impl: the sequence number post() takes below names this op on every rank.
  const int mpi_tag = static_cast<int>(seq_ % 32767);
  Work w = post(op_name("reduce_scatter", ReduceOp::kSum, type), tag, total, total * es,
                [&](std::vector<MPI_Request>& reqs) {
    if (total == 0) return;
    if (size_ == 1) {
      if (recv != send) std::memcpy(recv, send, static_cast<size_t>(total * es));
      return;
    }
    const MPI_Datatype dt = mpi_type(type);
    if (blocking) {
      check_mpi(MPI_Reduce_scatter(send, recv, counts.data(), dt, mpi_op(ReduceOp::kSum, type), comm_),
                "MPI_Reduce_scatter", tag);
      return;
    }
    if (p2p) {
      // Receives first (they land in place), then this rank's partial of every peer's share.
      const int64_t mine = counts[static_cast<size_t>(rank_)];
      for (int r = 0, slot = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if (mine > 0) {
          reqs.emplace_back();
          check_mpi(MPI_Irecv(elem(parts.get(), slot * mine, es), static_cast<int>(mine), dt, r, mpi_tag, comm_,
                              &reqs.back()),
                    "MPI_Irecv", tag);
        }
        ++slot;
      }
      for (int k = 1; k < size_; ++k) {  // rank+1 first: at T > 2 no peer is everyone's first target
        const int r = (rank_ + k) % size_;
        const int c = counts[static_cast<size_t>(r)];
        if (c == 0) continue;
        reqs.emplace_back();
        check_mpi(MPI_Isend(elem(send, displs[static_cast<size_t>(r)], es), c, dt, r, mpi_tag, comm_, &reqs.back()),
                  "MPI_Isend", tag);
      }
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Ireduce_scatter(send, recv, counts.data(), dt, mpi_op(ReduceOp::kSum, type), comm_, &reqs.back()),
              "MPI_Ireduce_scatter", tag);
  }, blocking);
  w.keep_alive(counts_p);
  if (!p2p) return w;
  // The reduction itself, on the waiting thread once every message is in: the rank-ordered sum of the T partials
  // of this rank's share (its own read in place from `send`), so the bits do not depend on arrival order.
  const int64_t mine = recv_counts[static_cast<size_t>(rank_)];
  const void* own = elem(send, displs[static_cast<size_t>(rank_)], es);
  return w.then([parts, own, recv, mine, type, T = size_, me = rank_] {
    detail::sum_partials_in_rank_order(type, parts.get(), own, me, T, mine, recv);
  });
}

Work Communicator::all_gather_impl(const void* send, void* recv, DType type, std::span<const int64_t> counts,
                                   std::span<const int64_t> displs, const std::string& tag, bool blocking) {
  COC_ASSERT(static_cast<int>(counts.size()) == size_ && displs.size() == counts.size(), "all_gather needs {} counts",
             size_);
  // The int arrays must outlive the request: MPI may read them until completion, so the Work keeps them.
  auto c = std::make_shared<std::vector<int>>(counts.size());
  auto d = std::make_shared<std::vector<int>>(counts.size());
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    (*c)[i] = to_int(counts[i], "count", tag);
    (*d)[i] = to_int(displs[i], "displacement", tag);
    total += counts[i];
  }
  const int64_t es = dtype_size(type);
  const int mpi_tag = static_cast<int>(seq_ % 32767);  // as in reduce_scatter
  const auto me = static_cast<size_t>(rank_);
  Work w = post(op_name("all_gather", ReduceOp::kSum, type), tag, total, counts[me] * es,
                [&](std::vector<MPI_Request>& reqs) {
    if (total == 0) return;
    if (size_ == 1) {
      char* mine = elem(recv, (*d)[0], es);
      if (mine != send) std::memmove(mine, send, static_cast<size_t>((*c)[0] * es));
      return;
    }
    const MPI_Datatype dt = mpi_type(type);
    // MPI forbids a send buffer inside the receive buffer unless it says so with MPI_IN_PLACE.
    const bool in_place = send == elem(recv, (*d)[me], es);
    const void* sbuf = in_place ? MPI_IN_PLACE : send;
    const int scount = in_place ? 0 : (*c)[me];
    const MPI_Datatype stype = in_place ? MPI_DATATYPE_NULL : dt;
    if (blocking) {
      check_mpi(MPI_Allgatherv(sbuf, scount, stype, recv, c->data(), d->data(), dt, comm_), "MPI_Allgatherv", tag);
      return;
    }
    if (opts_.nonblocking == NonblockingImpl::kP2p) {
      // Own block first: copied after the messages were posted, an 8 MB gather on the thread engine took 67 ms
      // instead of 35 in most reps (docs/performance.md, point 16).
      const int mine = (*c)[me];
      if (!in_place && mine > 0) std::memcpy(elem(recv, (*d)[me], es), send, static_cast<size_t>(mine * es));
      for (int r = 0; r < size_; ++r) {
        const int cnt = (*c)[static_cast<size_t>(r)];
        if (r == rank_ || cnt == 0) continue;
        reqs.emplace_back();
        check_mpi(MPI_Irecv(elem(recv, (*d)[static_cast<size_t>(r)], es), cnt, dt, r, mpi_tag, comm_, &reqs.back()),
                  "MPI_Irecv", tag);
      }
      if (mine == 0) return;
      for (int k = 1; k < size_; ++k) {
        reqs.emplace_back();
        check_mpi(MPI_Isend(send, mine, dt, (rank_ + k) % size_, mpi_tag, comm_, &reqs.back()), "MPI_Isend", tag);
      }
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Iallgatherv(sbuf, scount, stype, recv, c->data(), d->data(), dt, comm_, &reqs.back()),
              "MPI_Iallgatherv", tag);
  }, blocking);
  w.keep_alive(c);
  return w.keep_alive(d);
}

Work Communicator::all_to_all_impl(const void* send, std::span<const int64_t> send_counts,
                                   std::span<const int64_t> send_displs, void* recv,
                                   std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                                   DType type, const std::string& tag) {
  // The loop below reads size_ entries of each span: a short span would be read out of bounds.
  const auto n = static_cast<size_t>(size_);
  COC_ASSERT(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n &&
                 recv_displs.size() == n,
             "all_to_all needs {} counts and displacements for send and recv", size_);
  auto arrays = std::make_shared<std::vector<int>>(4 * static_cast<size_t>(size_));
  int* sc = arrays->data();
  int* sd = sc + size_;
  int* rc = sd + size_;
  int* rd = rc + size_;
  int64_t total = 0;
  for (int i = 0; i < size_; ++i) {
    sc[i] = to_int(send_counts[i], "send count", tag);
    sd[i] = to_int(send_displs[i], "send displacement", tag);
    rc[i] = to_int(recv_counts[i], "recv count", tag);
    rd[i] = to_int(recv_displs[i], "recv displacement", tag);
    total += send_counts[i];
  }
  // Each rank sends its own total, so the fingerprint carries the kind only (as exchanges do); under
  // --debug-collectives the counts themselves are checked pairwise instead.
  if (opts_.check_fingerprints) check_all_to_all_counts(send_counts, recv_counts, tag);
  const int64_t es = dtype_size(type);
  Work w = post(op_name("all_to_all", ReduceOp::kSum, type), tag, 0, total * es, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1) {
      if (sc[0] > 0) std::memmove(elem(recv, rd[0], es), elem(send, sd[0], es), static_cast<size_t>(sc[0] * es));
      return;
    }
    const MPI_Datatype dt = mpi_type(type);
    reqs.emplace_back();
    check_mpi(MPI_Ialltoallv(send, sc, sd, dt, recv, rc, rd, dt, comm_, &reqs.back()), "MPI_Ialltoallv", tag);
  });
  return w.keep_alive(arrays);
}

namespace {
/// An exchange block's element type: fp32, bf16 or fp16 (the types mpi_type knows); int8 never travels alone.
void check_p2p_type(DType t, const char* side, const std::string& tag, int rank) {
  if (t == DType::kF32 || t == DType::kBF16 || t == DType::kF16) return;
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("exchange '{}' (rank {}): a {} block of {} elements; exchanges move fp32, bf16 or fp16 "
                          "(set P2pSend/P2pRecv::type to one of them)",
                          tag, rank, side, to_string(t)));
}
}  // namespace

Work Communicator::exchange(std::span<const P2pSend> sends, std::span<const P2pRecv> recvs, const std::string& tag,
                           const Work& after) {
  return exchange_impl("exchange", sends, recvs, tag, after, -1);
}

Work Communicator::exchange_recvs(std::span<const P2pRecv> recvs, const std::string& tag) {
  return exchange_impl("exchange_recvs", {}, recvs, tag, Work(), -1);
}

Work Communicator::exchange_sends(std::span<const P2pSend> sends, const Work& recvs_of, const std::string& tag,
                                 const Work& after) {
  COC_ASSERT(recvs_of.state_ && recvs_of.state_->mpi_tag >= 0 && recvs_of.state_->desc.op == "exchange_recvs" &&
                 recvs_of.state_->desc.comm == name_,
             "exchange_sends '{}': recvs_of is not an exchange_recvs of communicator '{}'", tag, name_);
  return exchange_impl("exchange_sends", sends, {}, tag, after, recvs_of.state_->mpi_tag);
}

Work Communicator::exchange_impl(const char* op, std::span<const P2pSend> sends, std::span<const P2pRecv> recvs,
                                 const std::string& tag, const Work& after, int pair_tag) {
  int64_t sent_bytes = 0;
  for (const auto& b : sends) {
    COC_ASSERT(b.peer >= 0 && b.peer < size_ && b.peer != rank_, "exchange '{}': send peer {} of {} ranks (self {})",
               tag, b.peer, size_, rank_);
    check_p2p_type(b.type, "send", tag, rank_);
    to_int(b.count, "send count", tag);
    sent_bytes += b.count * dtype_size(b.type);
  }
  for (const auto& b : recvs) {
    COC_ASSERT(b.peer >= 0 && b.peer < size_ && b.peer != rank_, "exchange '{}': recv peer {} of {} ranks (self {})",
               tag, b.peer, size_, rank_);
    check_p2p_type(b.type, "recv", tag, rank_);
    to_int(b.count, "recv count", tag);
  }
  // Every rank issues its ops in the same order, so the sequence number (taken by post() below) names the same
  // exchange everywhere; MPI's tag space is only guaranteed up to 32767.
  const int mpi_tag = pair_tag >= 0 ? pair_tag : static_cast<int>(seq_ % 32767);
  // The list is copied: the sends may be posted after this call returns (paced behind `after`).
  auto post_sends = [list = std::vector<P2pSend>(sends.begin(), sends.end()), mpi_tag, comm = comm_,
                     tag](std::vector<MPI_Request>& reqs) {
    for (const auto& b : list) {
      if (b.count == 0) continue;
      reqs.emplace_back();
      check_mpi(MPI_Isend(b.buf, static_cast<int>(b.count), mpi_type(b.type), b.peer, mpi_tag, comm, &reqs.back()),
                "MPI_Isend", tag);
    }
  };
  // Fingerprinted by kind only: an exchange's counts differ between ranks whenever the shares are uneven (at T >= 3
  // even the sum of what a rank sends and receives), so comparing them would report a mismatch for correct calls.
  Work w = post(
      op, tag, 0, sent_bytes,
      [&](std::vector<MPI_Request>& reqs) {
        // Receives first: a message that finds its receive already posted lands in place without an extra copy.
        for (const auto& b : recvs) {
          if (b.count == 0) continue;
          reqs.emplace_back();
          check_mpi(
              MPI_Irecv(b.buf, static_cast<int>(b.count), mpi_type(b.type), b.peer, mpi_tag, comm_, &reqs.back()),
              "MPI_Irecv", tag);
        }
      },
      /*blocking=*/false, std::move(post_sends), after.state_);
  w.state_->mpi_tag = mpi_tag;
  return w;
}

Work Communicator::broadcast(float* buf, int64_t count, int root, const std::string& tag) {
  int n = to_int(count, "count", tag);
  return post("broadcast", tag, count, count * 4, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1 || n == 0) return;
    reqs.emplace_back();
    check_mpi(MPI_Ibcast(buf, n, MPI_FLOAT, root, comm_, &reqs.back()), "MPI_Ibcast", tag);
  });
}

Work Communicator::broadcast_bytes(void* buf, int64_t bytes, int root, const std::string& tag) {
  int n = to_int(bytes, "bytes", tag);
  return post("broadcast_bytes", tag, bytes, bytes, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1 || n == 0) return;
    reqs.emplace_back();
    check_mpi(MPI_Ibcast(buf, n, MPI_BYTE, root, comm_, &reqs.back()), "MPI_Ibcast", tag);
  });
}

void Communicator::barrier(const std::string& tag) {
  post("barrier", tag, 0, 0, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1) return;
    reqs.emplace_back();
    check_mpi(MPI_Ibarrier(comm_, &reqs.back()), "MPI_Ibarrier", tag);
  }).wait();
}

// The metadata calls below copy what MPI reads and writes into buffers that the op's state keeps alive
// (Work::keep_alive), and copy the result out after the wait: if a wait expires and the error unwinds past the
// call, MPI may still write when the peers join late, and must not find a dead stack frame.

void Communicator::wait_metadata(Work& w) const {
  w.wait_impl(std::chrono::steady_clock::now() + opts_.timeout, /*drive=*/true);
}

void Communicator::all_reduce_typed(void* buf, size_t count, MPI_Datatype type, int64_t elem_bytes,
                                    const char* type_name, ReduceOp op, const std::string& tag) {
  const int n = to_int(static_cast<int64_t>(count), "count", tag);
  const size_t bytes = count * static_cast<size_t>(elem_bytes);
  auto tmp = std::make_shared<std::vector<unsigned char>>(bytes);
  if (bytes > 0) std::memcpy(tmp->data(), buf, bytes);
  Work w = post(fmt::format("all_reduce_{}{}", type_name, op_suffix(op)), tag, n, n * elem_bytes,
                [&](std::vector<MPI_Request>& reqs) {
                  if (size_ == 1 || n == 0) return;
                  reqs.emplace_back();
                  const MPI_Op mop = mpi_op(op, DType::kF32);  // MPI's own op, for MPI's integer and double types
                  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, tmp->data(), n, type, mop, comm_, &reqs.back()),
                            "MPI_Iallreduce", tag);
                });
  w.keep_alive(tmp);
  wait_metadata(w);
  if (bytes > 0) std::memcpy(buf, tmp->data(), bytes);
}

void Communicator::all_reduce_values(std::span<int64_t> values, ReduceOp op, const std::string& tag) {
  all_reduce_typed(values.data(), values.size(), MPI_INT64_T, 8, "int64", op, tag);
}

void Communicator::all_reduce_values(std::span<uint64_t> values, ReduceOp op, const std::string& tag) {
  all_reduce_typed(values.data(), values.size(), MPI_UINT64_T, 8, "uint64", op, tag);
}

void Communicator::all_reduce_values(std::span<double> values, ReduceOp op, const std::string& tag) {
  all_reduce_typed(values.data(), values.size(), MPI_DOUBLE, 8, "double", op, tag);
}

void Communicator::all_gather_bytes(const void* mine, int64_t bytes, void* all, const std::string& tag) {
  const int n = to_int(bytes, "bytes", tag);
  to_int(bytes * size_, "total bytes", tag);
  // [ this rank's bytes | every rank's bytes ]
  const size_t nb = static_cast<size_t>(n);
  auto tmp = std::make_shared<std::vector<unsigned char>>(nb * static_cast<size_t>(size_ + 1));
  if (nb > 0) std::memcpy(tmp->data(), mine, nb);
  unsigned char* const send = tmp->data();
  unsigned char* const recv = tmp->data() + nb;
  Work w = post("all_gather_bytes", tag, bytes, bytes, [&](std::vector<MPI_Request>& reqs) {
    if (n == 0) return;
    if (size_ == 1) {
      std::memcpy(recv, send, nb);
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &reqs.back()), "MPI_Iallgather", tag);
  });
  w.keep_alive(tmp);
  wait_metadata(w);
  if (nb > 0) std::memcpy(all, recv, nb * static_cast<size_t>(size_));
}

std::vector<int64_t> Communicator::all_to_all_counts(std::span<const int64_t> send_counts, const std::string& tag) {
  COC_ASSERT(send_counts.size() == static_cast<size_t>(size_), "all_to_all_counts '{}' needs {} counts, got {}", tag,
             size_, send_counts.size());
  for (int p = 0; p < size_; ++p)
    if (send_counts[static_cast<size_t>(p)] < 0)
      throw_invalid("rank {}: all_to_all_counts '{}' on communicator '{}': the count for rank {} is {}; counts are "
                    "numbers of elements, >= 0",
                    log::rank(), tag, name_, p, send_counts[static_cast<size_t>(p)]);
  // [ send_counts | recv_counts ]
  const auto n = static_cast<size_t>(size_);
  auto tmp = std::make_shared<std::vector<int64_t>>(2 * n);
  std::copy(send_counts.begin(), send_counts.end(), tmp->begin());
  int64_t* const send = tmp->data();
  int64_t* const recv = tmp->data() + n;
  Work w = post("all_to_all_counts", tag, size_, 8 * static_cast<int64_t>(size_), [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1) {
      recv[0] = send[0];
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Ialltoall(send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T, comm_, &reqs.back()), "MPI_Ialltoall", tag);
  });
  w.keep_alive(tmp);
  wait_metadata(w);
  return std::vector<int64_t>(recv, recv + n);
}

std::vector<std::string> Communicator::gather_bytes(std::string_view mine, int root, const std::string& tag) {
  COC_ASSERT(root >= 0 && root < size_, "gather_bytes '{}': root {} of {} ranks", tag, root, size_);
  struct Buffers {
    int len = 0;
    std::vector<int> lens, displs;  // on root: every rank's length and its offset in `all`
    std::string send, all;
  };
  auto b = std::make_shared<Buffers>();
  b->len = to_int(static_cast<int64_t>(mine.size()), "bytes", tag);
  b->send.assign(mine);
  const bool at_root = rank_ == root;
  if (at_root) {
    b->lens.resize(static_cast<size_t>(size_));
    b->displs.resize(static_cast<size_t>(size_));
  }
  Work sizes = post("gather_bytes_sizes", tag, 1, 4, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1) {
      b->lens[0] = b->len;
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Igather(&b->len, 1, MPI_INT, b->lens.data(), 1, MPI_INT, root, comm_, &reqs.back()), "MPI_Igather",
              tag);
  });
  sizes.keep_alive(b);
  wait_metadata(sizes);
  if (at_root) {
    int64_t total = 0;
    for (size_t r = 0; r < b->lens.size(); ++r) {
      b->displs[r] = static_cast<int>(total);
      total += b->lens[r];
      to_int(total, "total bytes gathered", tag);
    }
    b->all.resize(static_cast<size_t>(total));
  }
  // Fingerprinted by kind only: the lengths differ between ranks.
  Work data = post("gather_bytes", tag, 0, b->len, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1) {
      b->all = b->send;
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Igatherv(b->send.data(), b->len, MPI_BYTE, b->all.data(), b->lens.data(), b->displs.data(),
                           MPI_BYTE, root, comm_, &reqs.back()),
              "MPI_Igatherv", tag);
  });
  data.keep_alive(b);
  wait_metadata(data);
  std::vector<std::string> out;
  if (at_root)
    for (size_t r = 0; r < b->lens.size(); ++r)
      out.push_back(b->all.substr(static_cast<size_t>(b->displs[r]), static_cast<size_t>(b->lens[r])));
  return out;
}

std::string Communicator::broadcast_string(std::string value, int root, const std::string& tag) {
  COC_ASSERT(root >= 0 && root < size_, "broadcast_string '{}': root {} of {} ranks", tag, root, size_);
  auto len = std::make_shared<int64_t>(static_cast<int64_t>(value.size()));
  Work w = broadcast_bytes(len.get(), sizeof(int64_t), root, tag);
  w.keep_alive(len);
  wait_metadata(w);
  auto text = std::make_shared<std::string>(std::move(value));
  text->resize(static_cast<size_t>(*len));
  w = broadcast_bytes(text->data(), *len, root, tag);
  w.keep_alive(text);
  wait_metadata(w);
  return *text;
}

void Communicator::check_same(uint64_t value, const std::string& what) {
  // [ value | every rank's value ]
  auto tmp = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>(size_) + 1);
  (*tmp)[0] = value;
  Work w = post("check_same", what, 1, 8, [&](std::vector<MPI_Request>& reqs) {
    if (size_ == 1) {
      (*tmp)[1] = value;
      return;
    }
    reqs.emplace_back();
    check_mpi(MPI_Iallgather(tmp->data(), 1, MPI_UINT64_T, tmp->data() + 1, 1, MPI_UINT64_T, comm_, &reqs.back()),
              "MPI_Iallgather", what);
  });
  w.keep_alive(tmp);
  wait_metadata(w);
  const uint64_t* all = tmp->data() + 1;
  for (int r = 1; r < size_; ++r)
    if (all[r] != all[0])
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("ranks disagree on {}: rank {} differs from rank 0 on communicator '{}'. Launch every "
                              "rank with the same flags, config file and data",
                              what, r, name_),
                  /*uniform=*/true);
}

}  // namespace coc
