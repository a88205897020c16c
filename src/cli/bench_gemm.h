// `coc bench gemm`: the single-rank GEMM of each back end (coc/kernels/gemm.h) on given shapes, fp32 and bf16, to
// choose the fp32 default per shape class and to see what bf16 buys (docs/performance.md, point 26).
#pragma once

#include <cstdint>
#include <string>

namespace coc::cli::bench {

struct GemmBenchOptions {
  /// m x k x n per problem, comma-separated. Defaults: the three shapes, a llama2-7b layer's MLP and
  /// attention projections at 1024 tokens, and the default job's widest layer.
  std::string shapes = "1024x512x1408,2048x1024x1024,512x4096x4096,1024x4096x11008,1024x4096x4096,2048x192x512";
  std::string backends = "onednn,openblas";  ///< fp32 back ends to time
  std::string dtypes = "fp32,bf16";          ///< bf16 always runs on oneDNN
  std::string layout = "nk";                 ///< weight layout: nk (Megatron's [out, in]) or kn
  int reps = 5, warmup = 2;
  std::string json;
};

/// Every rank runs the same GEMMs (ranks launched together share the cores, as in training); rank 0 prints the
/// max over ranks of the per-rank medians, and GFLOP/s = 2·m·n·k / time. Throws uniform kInvalidArgument for bad
/// options (a shape that is not MxKxN of positive integers, an unknown back end, type or layout).
int run_gemm(const GemmBenchOptions& o);

}  // namespace coc::cli::bench
