// CocPending (the tail of a CoC op still in flight), CocStats, and the error-path drain shared by the ops.
#include <exception>

#include "coc/comm/process.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"

namespace coc {

CocStats& CocStats::operator+=(const CocStats& o) {
  gemm_s += o.gemm_s;
  comm_wait_s += o.comm_wait_s;
  calls += o.calls;
  chunks += o.chunks;
  serial_fallbacks += o.serial_fallbacks;
  gflop += o.gflop;
  fused_calls += o.fused_calls;
  fused_fallbacks += o.fused_fallbacks;
  return *this;
}

CocPending::CocPending(CocPending&& o) noexcept
    : works_(std::move(o.works_)), finish_(std::move(o.finish_)), stats_(o.stats_) {
  // A moved-from std::vector / std::function is only "valid but unspecified"; make it empty so that the source's
  // destructor has nothing to wait for.
  o.works_.clear();
  o.finish_ = nullptr;
}

CocPending& CocPending::operator=(CocPending&& o) {
  if (this != &o) {
    if (pending()) wait();  // the old op's buffers are about to be forgotten: finish it first
    works_ = std::move(o.works_);
    finish_ = std::move(o.finish_);
    stats_ = o.stats_;
    o.works_.clear();
    o.finish_ = nullptr;
  }
  return *this;
}

CocPending::~CocPending() {
  if (!pending()) return;
  // The caller forgot to wait: MPI may still be writing into the output, and the op's scratch buffers and the
  // completion step (rank-ordered sum, bias) have not run. Waiting here keeps memory safe. A destructor must not
  // throw, and a failed collective means the peers are stuck, so a failure aborts the whole job (never
  // std::terminate, which would leave the other ranks waiting until their deadline; edge case 18 of
  // docs/edge-cases.md).
  try {
    wait();
  } catch (const std::exception& e) {
    log::write(0, fmt::format("error: rank {}: a CoC op's collectives failed while its CocPending was destroyed "
                              "without wait(): {}. Aborting the job",
                              log::rank(), e.what()));
    abort_job(1);
  } catch (...) {
    log::write(0, fmt::format("error: rank {}: unknown exception while waiting for a CoC op in ~CocPending. "
                              "Aborting the job",
                              log::rank()));
    abort_job(1);
  }
}

void CocPending::wait() {
  // Take the state first: if a wait throws, this object is already empty, so the destructor does not wait again
  // (the error propagates to the caller, who decides).
  std::vector<Work> works = std::move(works_);
  std::function<void()> finish = std::move(finish_);
  works_.clear();
  finish_ = nullptr;
  detail::Stopwatch sw;
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel1, "coc_wait",
                  {"collectives", static_cast<int64_t>(works.size())});
  for (auto& w : works) w.wait();  // in posting order; each runs its completion step (e.g. the rank-ordered sum)
  if (stats_) stats_->comm_wait_s += sw.seconds();
  if (finish) finish();
}

namespace detail {

void drain_after_error(std::vector<Work>& works, std::exception_ptr cause) {
  bool peers_gone = false;
  try {
    std::rethrow_exception(cause);
  } catch (const Error& e) {
    peers_gone = e.kind() == ErrorKind::kTimeout || (e.kind() == ErrorKind::kComm && !e.uniform());
  } catch (...) {
  }
  if (peers_gone) return;
  // Every collective in `works` was posted by all ranks (a uniform error is raised at the same point everywhere,
  // and a local error such as bad_alloc leaves the peers running), so these complete.
  for (auto& w : works) {
    try {
      w.wait();
    } catch (const std::exception& e) {
      log::write(0, fmt::format("error: rank {}: while unwinding a CoC op: {}", log::rank(), e.what()));
      return;
    }
  }
}

}  // namespace detail
}  // namespace coc
