// ShmWindow (shm_window.h): the MPI-3 shared window, its on-demand growth and the generation flags.
#include "coc/comm/shm_window.h"

#include <fmt/format.h>
#include <sched.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <exception>
#include <thread>

#include "coc/comm/communicator.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/runtime/affinity.h"
#include "mpi_check.h"

namespace coc {

namespace {
using detail::check_mpi;

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }
}  // namespace

ShmWindow::ShmWindow(Communicator& comm)
    : engine_(comm.engine()), timeout_(comm.options().timeout), comm_name_(comm.name()) {
  rank_ = comm.rank();
  size_ = comm.size();
  int node_size = 0;
  engine_->call([&] {
    // key = rank in comm: on one node, node ranks equal comm ranks, so segment r belongs to tp rank r.
    check_mpi(MPI_Comm_split_type(comm.raw(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node_),
              "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", comm_name_);
    MPI_Comm_size(node_, &node_size);
    // An allocation failure must come back as an error code, so that the op can fall back instead of the whole
    // job dying in MPI's default handler.
    MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
    return 0;
  });
  // Every rank sees the same answer: if any rank's node holds fewer than all ranks, every node does.
  node_local_ = node_size == size_;
  if (!node_local_)
    reason_ = fmt::format("the {} ranks of communicator '{}' span several nodes (this node holds {}); fused "
                          "kernels need node-shared memory",
                          size_, comm_name_, node_size);
}

ShmWindow::~ShmWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A collective free with dead or stuck peers would hang: leak instead (the job is going down; Open MPI unlinks
  // the backing file right after creation, so nothing stays in /dev/shm).
  if (broken_ || std::uncaught_exceptions() > 0) return;
  try {
    free_window();
    if (node_ != MPI_COMM_NULL) engine_->call([&] { return MPI_Comm_free(&node_); });
  } catch (...) {
  }
}

void ShmWindow::free_window() {
  if (win_ == MPI_WIN_NULL) return;
  engine_->call([&] { return MPI_Win_free(&win_); });
  win_ = MPI_WIN_NULL;
  base_.clear();
  flag_cap_ = data_cap_ = 0;
}

bool ShmWindow::ensure(int64_t flags, int64_t data_bytes, const std::string& what) {
  if (!usable()) return false;
  if (flags <= flag_cap_ && data_bytes <= data_cap_) return true;
  // Round up to powers of two: a slowly growing m then reallocates O(log m) times, not every call.
  const int64_t want_flags = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(flags, 64))));
  const int64_t want_data =
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(data_bytes, 1 << 16))));
  return allocate(std::max(want_flags, flag_cap_), std::max(want_data, data_cap_), what);
}

bool ShmWindow::allocate(int64_t flags, int64_t data_bytes, const std::string& what) {
  const int64_t seg = (flags + 1) * kFlagSlotBytes + data_bytes;
  const int64_t total = seg * size_;
  // Every rank checks the node's /dev/shm (they share it) and the verdict is agreed, so all ranks either allocate
  // or throw the same uniform error. The old window's space is given back first, so count it as free.
  const int64_t old_total = win_ == MPI_WIN_NULL ? 0 : ((flag_cap_ + 1) * kFlagSlotBytes + data_cap_) * size_;
  const int64_t free_now = shm_free_bytes();
  int fits = free_now < 0 || free_now + old_total >= total + (total >> 4) ? 1 : 0;
  engine_->call([&] { return MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, node_); });
  if (!fits)
    throw_invalid("{}: the fused kernel needs a node-shared window of {} ({} per rank × {} ranks) but /dev/shm "
                  "has only {} free; enlarge it (docker run --shm-size={}m, or mount -o remount,size=... /dev/shm) "
                  "or run without --coc-fused-kernel / --use-mc2",
                  what, mib(total), mib(seg), size_, mib(std::max<int64_t>(free_now, 0)),
                  (total * 2 >> 20) + 64);
  free_window();
  void* mine = nullptr;
  int rc = engine_->call([&] {
    MPI_Info info;
    MPI_Info_create(&info);
    // Each segment is only touched through its own base pointer: let the library place (and page-align) the
    // segments independently.
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    int r = MPI_Win_allocate_shared(static_cast<MPI_Aint>(seg), 1, info, node_, &mine, &win_);
    MPI_Info_free(&info);
    return r;
  });
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  engine_->call([&] { return MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, node_); });
  if (!ok) {
    char err[MPI_MAX_ERROR_STRING] = "another rank failed";
    int len = static_cast<int>(std::strlen(err));
    if (rc != MPI_SUCCESS) MPI_Error_string(rc, err, &len);
    if (rc == MPI_SUCCESS) free_window();
    win_ = MPI_WIN_NULL;
    reason_ = fmt::format("MPI_Win_allocate_shared of {} per rank failed: {}", mib(seg), std::string(err, len));
    return false;
  }
  base_.assign(static_cast<size_t>(size_), nullptr);
  engine_->call([&] {
    for (int r = 0; r < size_; ++r) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* p = nullptr;
      check_mpi(MPI_Win_shared_query(win_, r, &sz, &disp, &p), "MPI_Win_shared_query", what);
      base_[static_cast<size_t>(r)] = static_cast<char*>(p);
    }
    return 0;
  });
  flag_cap_ = flags;
  data_cap_ = data_bytes;
  // Zero this rank's flags (a fresh window is not guaranteed to be zeroed), with the done counter set to the last
  // generation: nothing of the old window is being read any more (every rank got here). The barrier publishes the
  // zeroed flags before any peer tests them.
  std::memset(base_[static_cast<size_t>(rank_)], 0, static_cast<size_t>(flag_cap_bytes()));
  std::atomic_ref<uint64_t>(*slot_ptr(rank_, 0)).store(gen_, std::memory_order_release);
  engine_->call([&] { return MPI_Barrier(node_); });
  ++allocations_;
  if (rank_ == 0)
    log::verbose("shm window '{}': {} per rank ({} flags, {} data) for {}", comm_name_, mib(seg), flags,
               mib(data_bytes), what);
  return true;
}

uint64_t ShmWindow::begin_op(const std::string& what) {
  COC_ASSERT(win_ != MPI_WIN_NULL, "begin_op before ensure on '{}'", comm_name_);
  const uint64_t g = ++gen_;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) wait_flag(r, 0, g - 1, what + " (peer still reading the previous call)");
  return g;
}

void ShmWindow::end_op(uint64_t gen) { set_flag(0, gen); }

void ShmWindow::set_flag(int64_t slot, uint64_t gen) {
  std::atomic_ref<uint64_t>(*slot_ptr(rank_, slot)).store(gen, std::memory_order_release);
}

bool ShmWindow::test_flag(int r, int64_t slot, uint64_t gen) const {
  return std::atomic_ref<uint64_t>(*slot_ptr(r, slot)).load(std::memory_order_acquire) >= gen;
}

void ShmWindow::wait_flag(int r, int64_t slot, uint64_t gen, const std::string& what) {
  if (test_flag(r, slot, gen)) return;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  for (uint64_t spins = 1;; ++spins) {
    if (test_flag(r, slot, gen)) return;
    if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if ((spins & 63) == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) {
        const uint64_t seen = std::atomic_ref<uint64_t>(*slot_ptr(r, slot)).load(std::memory_order_acquire);
        throw_error(ErrorKind::kTimeout,
                    "{} waited {} ms for rank {} of '{}' (shared-memory flag {} at call {}, seen {}); the peer is "
                    "dead, stuck, or issued different ops (--debug-collectives checks the latter)",
                    what, timeout_.count(), r, comm_name_, slot, gen, seen);
      }
      engine_->poll();  // keep unrelated collectives in flight moving (inline engine)
      if (now - start > std::chrono::milliseconds(10)) {
        // A long wait: the peer is far behind (oversubscribed, or descheduled). Sleep a little instead of burning
        // the core it may need.
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
    }
    sched_yield();
  }
}

}  // namespace coc
