// ShmWindow: node-local shared memory for the fused ops (fused_ops.h), over an MPI-3 shared window
// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED, MPI_Win_allocate_shared, MPI_Win_shared_query). Every rank of the
// communicator owns one segment that every other rank can load from and store to directly: the CPU counterpart of
// Ascend's remote memory access in MindSpeed's fused "lcoc"/MC2 kernels (docs/semantics.md §3), and the scheme of
// DeepSpeed's and xFasterTransformer's shared-memory all-reduce (docs/performance.md, "Prototypes": remove copies,
// don't hide them).
//
// Segment layout (each rank's own segment, bytes):
//   [ flag area: flag_capacity() slots of 64 bytes, each holding one uint64 ]  [ data area: data_capacity() bytes ]
// Slot 0 is the rank's "done" counter (the last op generation whose reads of peers' segments it finished); slots
// 1.. are tile flags that the op in progress assigns. The flag area is only ever used for flags, so a flag never
// reads stale data left by a previous call with another layout.
//
// Synchronisation: op generations, not resets. Every op call takes the next generation g (identical on every rank
// because every rank calls the ops in the same order). A writer fills its data, then stores g into a flag with
// release order (std::atomic_ref); a reader waits until the flag is >= g with acquire order. Flags only grow, so
// 1,000 back-to-back calls with changing shapes never see a stale flag (edge case 5 of docs/edge-cases.md). Before a
// rank overwrites its data area for call g it waits until every peer's done counter is >= g−1 (the peers finished
// reading call g−1): the write-after-read hazard of reusing the buffers.
//
// Waits spin briefly, then sched_yield (ranks may be oversubscribed on fewer cores, and a pure spin would starve
// the very peer being waited for), then sleep 50 µs per check after 10 ms; every wait has a deadline (the
// communicator's timeout) and throws kTimeout naming the op, the peer and the tile, so a dead peer never hangs the
// job (edge case 18).
//
// Sizing: nothing is hard-coded. ensure() grows the window on demand, collectively: when a call needs more flags or
// data than the window holds, every rank frees it and allocates a bigger one (rounded up to a power of two, so a
// slowly growing m reallocates O(log) times). Before allocating, the free space of /dev/shm is checked (statvfs),
// and a window that does not fit is refused with a uniform error naming the bytes needed and the fix (edge case
// 17: a 64 MiB container /dev/shm crashes shared-memory code with SIGBUS instead).
//
// MPI calls go through the communicator's ProgressEngine mutex (MPI_THREAD_SERIALIZED). Flag waits make no MPI
// call, but poll the engine now and then so that unrelated collectives in flight keep moving.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coc/comm/progress_engine.h"

namespace coc {

class Communicator;

class ShmWindow {
 public:
  /// Bytes per flag slot: one cache line, so that a reader polling a flag never shares a line with data a writer
  /// is still storing.
  static constexpr int64_t kFlagSlotBytes = 64;

  /// Collective over `comm`: finds out whether all of comm's ranks share one node. Allocates nothing yet.
  /// Errors: kComm if an MPI call fails.
  explicit ShmWindow(Communicator& comm);
  /// Frees the window collectively, unless it is broken (an op failed mid-way: the peers may be dead or stuck,
  /// and a collective free would hang; the job is being aborted anyway) or an exception is unwinding.
  ~ShmWindow();
  ShmWindow(const ShmWindow&) = delete;
  ShmWindow& operator=(const ShmWindow&) = delete;

  /// True when every rank of the communicator is on this node (the shared-type split has them all). Identical on
  /// every rank.
  bool node_local() const { return node_local_; }
  /// Why the window cannot be used ("" when it can): ranks span nodes, or the allocation failed.
  const std::string& unavailable_reason() const { return reason_; }
  bool usable() const { return reason_.empty(); }

  /// Collective (every rank passes the same values): makes the window hold at least `flags` tile-flag slots
  /// (slot 0 not counted) and `data_bytes` of data per rank, growing it if needed. Checks /dev/shm first.
  /// Returns false (and sets unavailable_reason) when the MPI allocation itself fails, so the caller can fall
  /// back. Errors: uniform kInvalidArgument when /dev/shm has too little free space (names the bytes and the
  /// fix); kComm for other MPI failures.
  bool ensure(int64_t flags, int64_t data_bytes, const std::string& what);

  /// Starts one op call: returns its generation (1, 2, ...), then waits until every peer finished reading the
  /// previous generation's data (their done counter), so this rank may overwrite its data area.
  /// Errors: kTimeout (see wait_flag).
  uint64_t begin_op(const std::string& what);
  /// Ends the op call: this rank has finished reading its peers' segments for generation `gen`.
  void end_op(uint64_t gen);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t flag_capacity() const { return flag_cap_; }
  int64_t data_capacity() const { return data_cap_; }
  /// Data area of rank r's segment (64-byte aligned), directly addressable from this process.
  float* data(int r) const { return reinterpret_cast<float*>(base_[static_cast<size_t>(r)] + flag_cap_bytes()); }

  /// Stores `gen` into this rank's tile flag `slot` (1-based, <= flag_capacity()) with release order: all data
  /// written before it is visible to a peer that sees the flag.
  void set_flag(int64_t slot, uint64_t gen);
  /// True when rank r's flag `slot` is >= gen (acquire).
  bool test_flag(int r, int64_t slot, uint64_t gen) const;
  /// Waits until rank r's flag `slot` is >= gen. Throws a non-uniform kTimeout naming `what`, r and the slot
  /// after the communicator's timeout (the peer is dead or stuck).
  void wait_flag(int r, int64_t slot, uint64_t gen, const std::string& what);

  /// Marks the window unusable for collective teardown (called when an op fails mid-way).
  void mark_broken() { broken_ = true; }
  /// Number of (re)allocations so far (tests check that growth is rare).
  int64_t allocations() const { return allocations_; }

 private:
  int64_t flag_cap_bytes() const { return (flag_cap_ + 1) * kFlagSlotBytes; }
  uint64_t* slot_ptr(int r, int64_t slot) const {
    return reinterpret_cast<uint64_t*>(base_[static_cast<size_t>(r)] + slot * kFlagSlotBytes);
  }
  void free_window();
  bool allocate(int64_t flags, int64_t data_bytes, const std::string& what);

  std::shared_ptr<ProgressEngine> engine_;
  std::chrono::milliseconds timeout_;
  std::string comm_name_;
  MPI_Comm node_ = MPI_COMM_NULL;  ///< dup of comm restricted to the node (== comm's ranks when node_local_)
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<char*> base_;  ///< every rank's segment, mapped here
  int rank_ = 0, size_ = 1;
  bool node_local_ = false;
  bool broken_ = false;
  std::string reason_;
  int64_t flag_cap_ = 0, data_cap_ = 0;
  uint64_t gen_ = 0;
  int64_t allocations_ = 0;
};

}  // namespace coc
