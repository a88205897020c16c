// Ping-pong clock offset measurement (comm/clock_sync.h).
#include "coc/comm/clock_sync.h"

#include <limits>

#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {
// Private to this exchange, and outside the sequence-number tags of exchanges and p2p collectives (seq % 32767).
constexpr int kTag = 32767;

void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw_error(ErrorKind::kComm, "rank {}: {} failed while measuring clock offsets for --profile", log::rank(), call);
}
}  // namespace

ClockOffsets measure_clock_offsets(Communicator& comm, int rounds) {
  if (rounds < 1) throw_invalid("measure_clock_offsets: rounds must be >= 1 (got {})", rounds);
  const int P = comm.size(), me = comm.rank();
  ClockOffsets out;
  out.offset_ns.assign(static_cast<size_t>(P), 0);
  out.rtt_ns.assign(static_cast<size_t>(P), 0);
  ProgressEngine& eng = *comm.engine();
  MPI_Comm c = comm.raw();
  // Every MPI call goes through the engine's mutex (MPI_THREAD_SERIALIZED); nothing else is in flight yet.
  if (me == 0) {
    for (int r = 1; r < P; ++r) {
      int64_t best_rtt = std::numeric_limits<int64_t>::max(), best_off = 0;
      for (int i = 0; i < rounds; ++i) {
        int64_t ping = i, peer = 0;
        const int64_t t0 = trace::now_ns();
        eng.call([&] { check(MPI_Send(&ping, 1, MPI_INT64_T, r, kTag, c), "MPI_Send"); return 0; });
        eng.call([&] {
          check(MPI_Recv(&peer, 1, MPI_INT64_T, r, kTag, c, MPI_STATUS_IGNORE), "MPI_Recv");
          return 0;
        });
        const int64_t t1 = trace::now_ns();
        if (t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          best_off = peer - (t0 + (t1 - t0) / 2);
        }
      }
      out.offset_ns[static_cast<size_t>(r)] = best_off;
      out.rtt_ns[static_cast<size_t>(r)] = best_rtt;
    }
  } else {
    for (int i = 0; i < rounds; ++i) {
      int64_t ping = 0;
      eng.call([&] {
        check(MPI_Recv(&ping, 1, MPI_INT64_T, 0, kTag, c, MPI_STATUS_IGNORE), "MPI_Recv");
        return 0;
      });
      int64_t t = trace::now_ns();
      eng.call([&] { check(MPI_Send(&t, 1, MPI_INT64_T, 0, kTag, c), "MPI_Send"); return 0; });
    }
  }
  eng.call([&] {
    check(MPI_Bcast(out.offset_ns.data(), P, MPI_INT64_T, 0, c), "MPI_Bcast");
    check(MPI_Bcast(out.rtt_ns.data(), P, MPI_INT64_T, 0, c), "MPI_Bcast");
    return 0;
  });
  return out;
}

}  // namespace coc
