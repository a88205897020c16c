// shm_all_reduce (fused_ops.h): the node-local all-reduce without a GEMM, the scheme of DeepSpeed's shm
// all-reduce (deepspeed/csrc/cpu/comm/shm.cpp) and xFasterTransformer's shm_reduction, with generation flags.
//
// buf is cut into slices of kSlice floats (about 8 per rank), owned in contiguous blocks (owned_tiles). In step i every rank
//  (a) copies slice i of every peer's block into its own segment and flags it (slot 1+s),
//  (b) waits for the peers' copies of slice i of its own block, sums them with its own buf slice in rank order into
//      buf and into its segment, and flags it reduced (slot 1+slices+s),
//  (c) copies slice i−1 of every peer's block, reduced, from the owner's segment into buf.
// Steps proceed in lockstep on all ranks, so each slice is read by its consumer while it is still in the shared
// cache: per rank, (T−1)/T of buf is copied out and back and 1/T is reduced, with no MPI message at all. Waiting
// on (b) needs only the peers' (a) of the same step and (c) only the owners' (b) of the step before, so there is no
// cycle. The sum is rank-ordered, hence deterministic.
#include <algorithm>
#include <cstring>

#include "coc/core/error.h"
#include "coc/overlap/fused_ops.h"
#include "fused_internal.h"

namespace coc {

using namespace detail;

void shm_all_reduce(Communicator& comm, float* buf, int64_t count, const std::string& tag) {
  const int T = comm.size(), me = comm.rank();
  if (count < 0) throw_invalid("shm_all_reduce '{}' (rank {}): count must be >= 0, got {}", tag, me, count);
  if (T == 1 || count == 0) return;
  if (std::string why = fused_unavailable_reason(comm); !why.empty())
    throw_invalid("shm_all_reduce '{}' (rank {}): node-shared memory is unavailable: {}; use Communicator::"
                  "all_reduce instead",
                  tag, me, why);
  // About 8 steps per rank: each step is a hand-off between ranks, which costs a scheduler round trip when ranks
  // share cores, so not too many; slices of >= 128 KiB (and <= 4 MiB: a step's T slices stay in the shared L3).
  // Multiples of 16 floats keep every slice 64-byte aligned.
  const int64_t kSlice = std::clamp<int64_t>((count / (8 * T) + 15) / 16 * 16, 32 * 1024, 1024 * 1024);
  const int64_t slices = (count + kSlice - 1) / kSlice;
  const std::string what = fmt::format("shm_all_reduce '{}' (rank {})", tag, me);
  ShmWindow& win = comm.shm_window();
  if (!win.ensure(2 * slices, count * 4, what)) throw_error(ErrorKind::kComm, "{}: {}", what, win.unavailable_reason());
  guard_window(win, [&] {
    const uint64_t gen = win.begin_op(what);
    float* mine = win.data(me);
    auto len = [&](int64_t s) { return std::min(kSlice, count - s * kSlice); };
    std::vector<RowRange> block(static_cast<size_t>(T));
    int64_t steps = 0;
    for (int r = 0; r < T; ++r) {
      block[static_cast<size_t>(r)] = owned_tiles(slices, T, r);
      steps = std::max(steps, block[static_cast<size_t>(r)].count);
    }
    std::vector<const float*> parts(static_cast<size_t>(T));
    auto fetch = [&](int64_t i) {
      for (int j = 1; j < T; ++j) {
        const int o = (me + j) % T;
        const RowRange& bo = block[static_cast<size_t>(o)];
        if (i >= bo.count) continue;
        const int64_t s = bo.begin + i;
        win.wait_flag(o, 1 + slices + s, gen, what + fmt::format(" reduced slice {}/{}", s + 1, slices));
        std::memcpy(buf + s * kSlice, win.data(o) + s * kSlice, static_cast<size_t>(len(s)) * 4);
      }
    };
    for (int64_t i = 0; i < steps; ++i) {
      for (int j = 1; j < T; ++j) {  // (a)
        const RowRange& bo = block[static_cast<size_t>((me + j) % T)];
        if (i >= bo.count) continue;
        const int64_t s = bo.begin + i;
        std::memcpy(mine + s * kSlice, buf + s * kSlice, static_cast<size_t>(len(s)) * 4);
        win.set_flag(1 + s, gen);
        maybe_inject_kill();
      }
      const RowRange& own = block[static_cast<size_t>(me)];
      if (i < own.count) {  // (b)
        const int64_t s = own.begin + i;
        for (int r = 0; r < T; ++r) {
          if (r != me) win.wait_flag(r, 1 + s, gen, what + fmt::format(" slice {}/{}", s + 1, slices));
          parts[static_cast<size_t>(r)] = r == me ? buf + s * kSlice : win.data(r) + s * kSlice;
        }
        sum_parts(parts.data(), T, len(s), nullptr, buf + s * kSlice, mine + s * kSlice);
        win.set_flag(1 + slices + s, gen);
      }
      if (i > 0) fetch(i - 1);  // (c)
    }
    if (steps > 0) fetch(steps - 1);
    win.end_op(gen);
  });
}

}  // namespace coc
