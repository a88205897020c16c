// Communicator: one MPI communicator (always an MPI_Comm_dup, never MPI_COMM_WORLD itself) plus its sequence
// counter, its options and a shared progress engine.
//
// All collectives are asynchronous (they return a Work). all_reduce, reduce_scatter and all_gather move fp32,
// bf16 or fp16 elements (CommElement): 16-bit sums are taken in fp32 and rounded (src/comm/element_types.h says
// how often); the other collectives are fp32. Every rank must issue the same collectives on a
// communicator in the same order (MPI's rule); each op gets the next sequence number. With `check_fingerprints`
// on (--debug-collectives), each op first all-gathers its fingerprint (op, count, sequence number) and, on a
// mismatch, throws a uniform kComm error naming the first rank that differs, instead of hanging or corrupting
// memory (docs/design.md, async model; PyTorch c10d's ProcessGroupWrapper does the same).
//
// Counts are in elements (of the buffer's type), and must fit MPI's int; larger messages throw kInvalidArgument.
//
// Besides the fp32 collectives, typed metadata calls (counts, sizes, timings, agreement: all_reduce_values,
// all_gather_bytes, all_to_all_counts, gather_bytes, broadcast_string) let the layers above exchange what they
// need without calling MPI (only comm/ and the entry point do). They are blocking, but take the same path as every
// collective: a sequence number, the fingerprint check under --debug-collectives, the flight recorder and the
// communicator's deadline (a peer that never joins gives a kTimeout naming the op, not a hang).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "coc/comm/progress_engine.h"
#include "coc/comm/work.h"
#include "coc/core/dtype.h"

namespace coc {

class ShmWindow;

/// How the non-blocking reduce-scatter and all-gather are built (--comm-nonblocking-impl; a coc option, beyond
/// Megatron). kP2p: MPI_Irecv from and MPI_Isend to every peer, and for the reduce-scatter a rank-ordered sum
/// of the T partials when the Work is waited for. kMpi: MPI_Ireduce_scatter and MPI_Iallgatherv. Why p2p by
/// default: Open MPI's MPI_Ireduce_scatter takes 102 ms for 8 MB over 1 Gbit/s where the wire needs 34 ms (its
/// libnbc schedule reduces at one root, then scatters), and the same messages sent directly run at link speed
/// (docs/performance.md, point 16).
enum class NonblockingImpl { kP2p, kMpi };

/// "p2p" or "mpi"; throws kInvalidArgument naming the flag for anything else.
NonblockingImpl parse_nonblocking_impl(const std::string& s);
const char* to_string(NonblockingImpl k);

struct CommOptions {
  EngineKind engine = EngineKind::kInline;
  NonblockingImpl nonblocking = NonblockingImpl::kP2p;  ///< --comm-nonblocking-impl
  int poll_us = 100;                              ///< threaded engine: sleep between tests (µs)
  std::chrono::milliseconds timeout{300000};      ///< deadline of every wait (ms)
  bool check_fingerprints = false;                ///< --debug-collectives
};

enum class ReduceOp { kSum, kMax, kMin };

/// The element types the data collectives move: fp32, bf16 and fp16.
template <typename T>
concept CommElement = std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

/// One block of a point-to-point exchange (Communicator::exchange): `count` elements of `type` (fp32, bf16 or
/// fp16; 4 or 2 bytes each) at `buf`, to or from `peer` (a rank of the communicator, never this rank). The bytes
/// move as they are: a 16-bit block is posted as MPI messages of 2-byte elements (issue 35: half the bytes of an
/// fp32 block), and the trace and flight recorder count count · dtype_size(type) bytes. A send and its matching
/// receive must name the same type (a 2-byte send into a 4-byte receive fails MPI's type matching, or leaves the
/// receive waiting). kInt8 is refused (kInvalidArgument).
struct P2pSend {
  int peer = 0;
  const void* buf = nullptr;
  int64_t count = 0;
  DType type = DType::kF32;
};
struct P2pRecv {
  int peer = 0;
  void* buf = nullptr;
  int64_t count = 0;
  DType type = DType::kF32;
};

class Communicator {
 public:
  /// Duplicates `parent`. Collective over `parent`.
  Communicator(MPI_Comm parent, std::string name, std::shared_ptr<ProgressEngine> engine, CommOptions opts);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// A duplicate of the whole job's world (MPI_COMM_WORLD), for code above comm/ that needs every rank. Collective
  /// over the world.
  static std::unique_ptr<Communicator> world(std::string name, std::shared_ptr<ProgressEngine> engine,
                                             CommOptions opts);

  /// A new communicator of the ranks with the same `color`, ordered by `key` (MPI_Comm_split), with this one's
  /// options, or `opts` where given. Collective.
  std::unique_ptr<Communicator> split(int color, int key, std::string name, const CommOptions* opts = nullptr) const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  /// This communicator's number in the process, never reused (an address may be, once a communicator is gone): what
  /// per-communicator caches key on, alike on every rank that builds its communicators in the same order.
  uint64_t serial() const { return serial_; }
  /// The MPI communicator, for comm/ itself and its tests; the layers above never call MPI.
  MPI_Comm raw() const { return comm_; }
  const CommOptions& options() const { return opts_; }
  /// The progress engine, for comm/ and its tests; the layers above reach it through comm/progress.h.
  const std::shared_ptr<ProgressEngine>& engine() const { return engine_; }
  uint64_t next_seq() const { return seq_; }
  /// The node-shared window of this communicator for the fused ops (shm_window.h). Created on first use, which
  /// is collective: every rank must reach its first fused op together (they do: ops are issued in the same order).
  ShmWindow& shm_window();

  // `blocking`: run the blocking MPI collective (MPI_Allreduce, ...) inside the call and return a completed Work.
  // The serial (N = 1) schedules use it: a serial op has nothing to overlap with, and Open MPI's non-blocking
  // all-reduce (and, with NonblockingImpl::kMpi, its reduce-scatter) is several times slower than the blocking
  // call (measured in docs/performance.md).

  /// In-place all-reduce of buf[0, count) (kSum, kMax or kMin).
  template <CommElement T>
  Work all_reduce(T* buf, int64_t count, ReduceOp op, const std::string& tag, bool blocking = false) {
    return all_reduce_impl(buf, dtype_of<T>(), count, op, tag, blocking);
  }
  /// Reduce-scatter (sum) with uneven shares: `send` holds sum(recv_counts) elements laid out rank-major; rank r
  /// receives recv_counts[r] elements into `recv`. `send` must stay valid until the Work completes. Non-blocking
  /// with NonblockingImpl::kP2p, `recv` holds the sum only after wait() (or a test() that returns true): the sum
  /// is the Work's completion step, in rank order (for 16-bit elements, in fp32 and rounded once).
  template <CommElement T>
  Work reduce_scatter(const T* send, T* recv, std::span<const int64_t> recv_counts, const std::string& tag,
                      bool blocking = false) {
    return reduce_scatter_impl(send, recv, dtype_of<T>(), recv_counts, tag, blocking);
  }
  /// All-gather with uneven shares: rank r contributes counts[r] elements, which land at recv + displs[r]. `send`
  /// may be this rank's own place in `recv` (recv + displs[rank]): the gather is then in place (MPI_IN_PLACE).
  template <CommElement T>
  Work all_gather(const T* send, T* recv, std::span<const int64_t> counts, std::span<const int64_t> displs,
                  const std::string& tag, bool blocking = false) {
    return all_gather_impl(send, recv, dtype_of<T>(), counts, displs, tag, blocking);
  }
  /// Point-to-point exchange: posts every MPI_Irecv of `recvs`, then every MPI_Isend of `sends`, as one Work. The
  /// CoC point-to-point schedules (overlap/p2p_schedules.cpp) build reduce-scatter and all-gather from it, so that
  /// each rank can send a peer's rows as soon as they are computed and compute its own rows last, and because Open
  /// MPI's non-blocking collectives are slow where its point-to-point path is not (docs/performance.md). Like a
  /// collective it takes the communicator's next sequence number, and every rank must call it in the same order:
  /// the MPI tag is derived from that number, so messages of different exchanges never match each other. A peer
  /// that posts a different count makes MPI fail the receive (MPI_ERR_TRUNCATE) or leaves it waiting until the
  /// deadline (kTimeout). Buffers must stay valid until the Work completes.
  ///
  /// `after` paces the sends: when given and its sends have not yet left this rank, the receives are posted now
  /// and the sends once they have (the progress engine posts them: every poll_us with the thread engine, at poll()
  /// and in any wait() with the inline one, which tests every op in flight while it waits). Why: MPI libraries interleave the fragments of all pending sends to a peer,
  /// so chunks posted at once over a slow link all arrive together near the end, and a schedule that consumes
  /// them in order waits for nearly the last byte before its first chunk. Chained on local send completion, the
  /// next send starts while the socket still drains the previous one, so chunks arrive in order and the link
  /// does not idle.
  Work exchange(std::span<const P2pSend> sends, std::span<const P2pRecv> recvs, const std::string& tag,
                const Work& after = Work());
  /// An exchange in two halves. exchange_recvs posts the receives of one step now; exchange_sends posts the
  /// step's sends later, with the MPI tag of `recvs_of` (this rank's exchange_recvs of the same step), so that they
  /// match the peers' receives of that step: every rank posts its exchange_recvs in the same order, hence at the
  /// same sequence numbers. Why split: receives posted before the data is computed let every message land in
  /// place (no unexpected-message copy inside MPI), and the caller can wait for what it receives without waiting
  /// for what it still sends (matmul_reduce_scatter_p2p accumulates its own GEMM onto the received partial). Each
  /// half takes a sequence number like any op; `after` paces the sends as in exchange(). With
  /// --debug-collectives exchanges of every kind are fingerprinted by kind only (their counts differ between ranks
  /// with uneven shares). Throws kInvalidArgument for a count above INT_MAX, and exchange_sends kInternal if
  /// `recvs_of` is not an exchange_recvs of this communicator.
  Work exchange_recvs(std::span<const P2pRecv> recvs, const std::string& tag);
  Work exchange_sends(std::span<const P2pSend> sends, const Work& recvs_of, const std::string& tag,
                      const Work& after = Work());
  /// All-to-all with uneven shares (element counts and displacements per peer, in elements of T, for send and
  /// recv; MPI_Ialltoallv). T is fp32, bf16 or fp16: 16-bit elements travel as 2 bytes each (nothing is summed, so
  /// no conversion happens; the MoE token exchange and the deterministic reduce-scatter under a bf16 wire use it).
  /// With --debug-collectives every rank's counts are all-gathered first and a send count that differs from its
  /// peer's recv count throws a uniform kComm error naming both ranks, instead of truncating or hanging.
  template <CommElement T>
  Work all_to_all(const T* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                  T* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                  const std::string& tag) {
    return all_to_all_impl(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype_of<T>(), tag);
  }
  /// Broadcast of buf[0, count) from `root`.
  Work broadcast(float* buf, int64_t count, int root, const std::string& tag);
  /// Broadcast of raw bytes (config agreement, schedules chosen by rank 0).
  Work broadcast_bytes(void* buf, int64_t bytes, int root, const std::string& tag);
  /// Blocking barrier with the communicator's deadline.
  void barrier(const std::string& tag);

  // ---- Typed metadata calls (blocking; see the top of this file) ----------------------------------------------
  // `tag` names the call in errors and in the flight recorder. Every rank must make the same calls in the same
  // order, with the same lengths where a call says so; --debug-collectives then reports a mismatch (kComm, uniform)
  // instead of a hang or a wrong result.

  /// In-place element-wise all-reduce of `values` (the same length on every rank). For timings (max over ranks),
  /// agreement on sizes, sums of counters.
  void all_reduce_values(std::span<int64_t> values, ReduceOp op, const std::string& tag);
  void all_reduce_values(std::span<uint64_t> values, ReduceOp op, const std::string& tag);
  void all_reduce_values(std::span<double> values, ReduceOp op, const std::string& tag);
  /// One value reduced over the ranks (T: int64_t, uint64_t or double).
  template <typename T>
  T all_reduce_value(T value, ReduceOp op, const std::string& tag) {
    all_reduce_values(std::span<T>(&value, 1), op, tag);
    return value;
  }

  /// All-gather of `bytes` bytes from every rank (the same `bytes` on every rank): rank r's `mine` lands at
  /// all[r·bytes, (r+1)·bytes). `all` holds size()·bytes bytes. Throws kInvalidArgument if bytes is negative or
  /// above MPI's int.
  void all_gather_bytes(const void* mine, int64_t bytes, void* all, const std::string& tag);
  /// Every rank's `value`, indexed by rank (T trivially copyable; its bytes are exchanged as they are).
  template <typename T>
  std::vector<T> all_gather_value(const T& value, const std::string& tag) {
    static_assert(std::is_trivially_copyable_v<T>, "all_gather_value exchanges the value's bytes");
    std::vector<T> all(static_cast<size_t>(size_));
    all_gather_bytes(&value, static_cast<int64_t>(sizeof(T)), all.data(), tag);
    return all;
  }

  /// The counts exchange before an all-to-all with uneven shares (MoE token dispatch): send_counts[p] is what
  /// this rank will send to rank p (elements, >= 0; size() entries). Returns recv_counts, where recv_counts[p] is
  /// what rank p will send to this rank (p = rank(): its own send_counts[rank()]). Throws kInvalidArgument for a
  /// negative count.
  std::vector<int64_t> all_to_all_counts(std::span<const int64_t> send_counts, const std::string& tag);

  /// Gathers every rank's bytes (any length, up to MPI's int in all) to `root`: on root, element r is rank r's
  /// `mine`; elsewhere, an empty vector. Two collectives (the lengths, then the bytes). Throws kInvalidArgument on
  /// the rank whose length, or on root if the total, does not fit MPI's int.
  std::vector<std::string> gather_bytes(std::string_view mine, int root, const std::string& tag);

  /// `value` of `root`, on every rank (any length; the other ranks' `value` is ignored). Two broadcasts (the
  /// length, then the bytes).
  std::string broadcast_string(std::string value, int root, const std::string& tag);

  /// Checks that every rank passes the same `value` (for example a hash of the model config). Throws a uniform
  /// kInvalidArgument error naming the first differing rank and `what`. Always on, independent of
  /// check_fingerprints.
  void check_same(uint64_t value, const std::string& what);

 private:
  /// The data collectives above, for elements of `type` (one path for every type; the op's name in the flight
  /// recorder and fingerprints carries the type when it is not fp32).
  Work all_reduce_impl(void* buf, DType type, int64_t count, ReduceOp op, const std::string& tag, bool blocking);
  Work reduce_scatter_impl(const void* send, void* recv, DType type, std::span<const int64_t> recv_counts,
                           const std::string& tag, bool blocking);
  Work all_gather_impl(const void* send, void* recv, DType type, std::span<const int64_t> counts,
                       std::span<const int64_t> displs, const std::string& tag, bool blocking);
  Work all_to_all_impl(const void* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                       void* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                       DType type, const std::string& tag);
  /// Posts an op: `start` adds its requests now. An exchange also passes `sends`, which adds its sends, now or,
  /// when `after` is given and its sends are still in flight, later (WorkState::deferred).
  Work post(const std::string& op, const std::string& tag, int64_t count, int64_t bytes,
            const std::function<void(std::vector<MPI_Request>&)>& start, bool blocking = false,
            std::function<void(std::vector<MPI_Request>&)> sends = nullptr, std::shared_ptr<WorkState> after = nullptr);
  void check_fingerprint(const std::string& op, int64_t count, const std::string& tag);
  /// all_to_all under --debug-collectives: checks send_counts against the peers' recv_counts (see all_to_all).
  void check_all_to_all_counts(std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts,
                               const std::string& tag);
  /// Waits for a metadata op on the calling thread (Work::wait_impl with drive), with the communicator's deadline.
  void wait_metadata(Work& w) const;
  /// all_reduce_values: `count` elements of `type` (elem_bytes each) at `buf`; `type_name` for the op's name.
  void all_reduce_typed(void* buf, size_t count, MPI_Datatype type, int64_t elem_bytes, const char* type_name,
                        ReduceOp op, const std::string& tag);
  /// exchange() and its halves: `op` names the kind for the flight recorder and fingerprints, `pair_tag` >= 0 is
  /// the MPI tag to send with (exchange_sends), otherwise the tag comes from this op's sequence number.
  Work exchange_impl(const char* op, std::span<const P2pSend> sends, std::span<const P2pRecv> recvs,
                     const std::string& tag, const Work& after, int pair_tag);
  int to_int(int64_t v, const char* what, const std::string& tag) const;

  static uint64_t next_serial();
  const uint64_t serial_ = next_serial();
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  std::shared_ptr<ProgressEngine> engine_;
  CommOptions opts_;
  int rank_ = 0;
  int size_ = 1;
  int world_root_ = 0;  ///< MPI_COMM_WORLD rank of this group's rank 0: which group a trace event belongs to
  uint64_t seq_ = 0;
  std::unique_ptr<ShmWindow> shm_;  ///< lazily created by shm_window()
};

/// FNV-1a hash of bytes, for fingerprints and config agreement.
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);

}  // namespace coc
