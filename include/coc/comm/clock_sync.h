// Clock alignment for merged traces: each rank's steady clock (trace::now_ns) measured against rank 0's.
//
// Method: NTP/Cristian-style ping-pong. For every rank r > 0, rank 0 sends a ping, rank r answers with its clock
// reading t_r, rank 0 notes its send and receive times t0, t1. Then offset_r ≈ t_r − (t0 + t1)/2 with an error of at
// most RTT/2; of `rounds` samples the one with the smallest RTT is kept (the sample least disturbed by scheduling).
// On one node all ranks read the same CLOCK_MONOTONIC, so offsets come out within ~RTT/2 (a few µs) of zero;
// across nodes they are what makes the ranks' events line up. Drift over a run is not corrected (µs per minute
// on NTP-disciplined hosts, below the resolution that matters for the overlap lanes, which are per rank).
#pragma once

#include <cstdint>
#include <vector>

#include "coc/comm/communicator.h"

namespace coc {

struct ClockOffsets {
  std::vector<int64_t> offset_ns;  ///< per world rank: its clock − rank 0's clock (ns); offset_ns[0] == 0
  std::vector<int64_t> rtt_ns;     ///< per rank: the round-trip time of the sample kept (ns); 0 for rank 0
};

/// Measures every rank's offset against rank 0 of `comm` and gives the result to every rank. Collective over
/// `comm`; blocking (call it at start-up, before collectives are in flight). `rounds` >= 1 ping-pongs per rank.
/// Throws kComm if an MPI call fails, kInvalidArgument if rounds < 1.
ClockOffsets measure_clock_offsets(Communicator& comm, int rounds = 32);

}  // namespace coc
