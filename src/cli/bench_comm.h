// `coc bench comm`: nccl-tests-style sweep of the TP collectives over message sizes, per progress engine.
#pragma once

#include <cstdint>
#include <string>

namespace coc::cli::bench {

struct CommBenchOptions {
  std::string ops = "all_reduce,reduce_scatter,all_gather,shm_all_reduce";
  std::string engines = "inline,thread";
  std::string dtypes = "fp32";  ///< --dtype: fp32, bf16, fp16 (comma-separated)
  int64_t min_bytes = 8 << 10, max_bytes = 64 << 20;
  int64_t factor = 4;
  int reps = 7, warmup = 2;
  int poll_us = 100;
  std::string nonblocking_impl = "p2p";  ///< --comm-nonblocking-impl
  std::string json;
};

/// Runs the sweep over MPI_COMM_WORLD. Throws uniform kInvalidArgument for bad options.
int run_comm(const CommBenchOptions& o);

}  // namespace coc::cli::bench
