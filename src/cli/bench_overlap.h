// `coc bench overlap`: the op-level overlap figures for every problem of a bench/inputs/*.yaml file, op, chunk
// count N and progress engine. docs/performance.md defines the figures and the columns.
#pragma once

#include <string>

namespace coc::cli::bench {

struct OverlapOptions {
  std::string inputs = "bench/inputs/reference.yaml";
  std::string ops = "all_reduce,reduce_scatter,all_gather";
  std::string parallel_num = "1,4,8,16,auto";  ///< N values; "auto" = CocOptions::kAuto (timed choice)
  std::string comm_algos = "collective,p2p";    ///< --coc-comm-algo values (p2p: reduce-scatter, all-gather)
  std::string engines = "inline,thread";
  std::string problem;      ///< only this problem of the file ("" = all)
  int reps = 7, warmup = 2;
  int poll_us = 100;        ///< thread engine: sleep between MPI tests (µs)
  std::string nonblocking_impl = "p2p";  ///< --comm-nonblocking-impl
  double link_rate = 0;     ///< Gbit/s; 0 = not given (no T_link column)
  double m_scale = 1.0;     ///< multiplies every problem's m (tokens)
  bool fused = false;       ///< add rows with CocOptions::fused
  /// "fp32" or "bf16": under bf16 the GEMMs run in bf16 (set_gemm_compute_type) and every op and baseline
  /// collective moves bf16 (CocOptions::comm_dtype): half the bytes on the wire.
  std::string dtype = "fp32";
  std::string json, plot;
};

/// Runs the benchmark over MPI_COMM_WORLD (tp = world size). Returns the exit code. Throws uniform
/// kInvalidArgument for bad options or inputs (one line), kIo when the JSON or SVG cannot be written.
int run_overlap(const OverlapOptions& o);

}  // namespace coc::cli::bench
