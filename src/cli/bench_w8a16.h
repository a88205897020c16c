// `coc bench w8a16`: the int8-weight GEMM (quant.h) against fp32 sgemm on one rank: the panel algorithm at
// several panel heights against dequantise-all, fp32 and fp16 activations, with the weight bytes.
#pragma once

#include <cstdint>
#include <string>

namespace coc::cli::bench {

struct W8a16BenchOptions {
  int64_t m = 1024, k = 4096, n = 1024;
  std::string spec = "per-group:128";
  std::string panels = "64,256,1024";
  int reps = 7, warmup = 1;
  std::string json;
};

/// Every rank runs the same single-rank GEMMs (ranks launched together share the cores, as in training); rank 0
/// prints the max over ranks of the per-rank medians. Throws uniform kInvalidArgument for bad options.
int run_w8a16(const W8a16BenchOptions& o);

}  // namespace coc::cli::bench
