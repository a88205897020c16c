// `coc bench ring-attention`: how much of ring attention's KV traffic hides under its block attention, and whether
// sending and receiving on two communicators (--use-cp-send-recv-overlap) helps, on the ranks it is launched on.
#pragma once

#include <cstdint>
#include <string>

namespace coc::cli::bench {

struct RingBenchOptions {
  int cp = 0;  ///< 0: the world
  int64_t seq = 4096, heads = 8, head_dim = 64, batch = 1;
  std::string mask = "causal";
  int window_size = 1;
  int reps = 5, warmup = 1;
  std::string engine = "inline";  ///< --comm-engine (comm/progress_engine.h)
  int poll_us = 100;              ///< --comm-poll-us
  std::string json;
};

/// Forward + backward of one attention per variant (serial: each transfer waited for as soon as it is posted;
/// overlapped on one communicator; overlapped on two), and the transfers alone; times are medians over --reps of
/// the max over ranks. hidden = (T_serial − T_overlap) / T_transfers. Throws uniform kInvalidArgument for bad
/// options (check_ring_attention_sizes' errors among them).
int run_ring_bench(const RingBenchOptions& o);

}  // namespace coc::cli::bench
