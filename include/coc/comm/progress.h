// Progress: how the layers above comm/ keep posted transfers moving while they compute.
//
// MPI moves a posted non-blocking collective or message only while someone is inside an MPI call, unless a
// progress thread runs (the engines of comm/progress_engine.h: kInline polls only when asked, kThread polls on its
// own). So the compute that overlaps a transfer has to say where MPI may run: between GEMM chunks (progress), or
// beside one long kernel that cannot stop to poll (progress_during, ProgressLease). These four calls are the only
// way the overlap/, parallel/ and model/ layers reach the engine; they act on the engine `group` was built with,
// which moves the ops of every communicator sharing it (one per process in `coc train`), not only `group`'s.
#pragma once

#include <functional>
#include <memory>

#include "coc/comm/progress_engine.h"

namespace coc {

class Communicator;

/// A communication thread lent to the inline engine while a stretch of compute that is not one call runs (a
/// decoder module's forward between two hooks); destroying it hands the thread back (ProgressEngine::PollLease).
using ProgressLease = ProgressEngine::PollLease;

/// Gives the posted transfers a turn now: tests every op in flight once (MPI_Testall per op). The inline engine's
/// only chance to move a transfer besides a wait, so the CoC schedules call it after each GEMM chunk; a no-op with
/// the threaded engine (its thread does it). Cheap when nothing is in flight. Throws kComm on an MPI failure.
void progress(const Communicator& group);

/// Runs `compute` (one long kernel, such as a weight-gradient GEMM, that cannot stop to poll: splitting it would
/// change its bits) while the transfers in flight keep moving: the inline engine lends a communication thread for
/// the duration, the threaded engine needs none, and with nothing in flight `compute` runs alone. Errors of the
/// transfers are left to their waiters; `compute`'s own exception propagates once the helper is handed back.
void progress_during(const Communicator& group, const std::function<void()>& compute);

/// A ProgressLease for compute between two calls (FSDP's prefetched gathers), or nullptr when none is needed: the
/// threaded engine drives MPI itself, and with nothing in flight there is nothing to drive.
std::unique_ptr<ProgressLease> lend_progress(const Communicator& group);

/// Whether the transfers move while compute runs without progress() between the pieces (the threaded engine). With
/// the inline engine the GEMM boundaries are MPI's only chances, so a schedule keeps every chunk its own call.
bool progresses_in_background(const Communicator& group);

}  // namespace coc
