// oneDNN's matmul primitive as coc's GEMM back end (kernels/ only; the public face is coc/kernels/gemm.h).
//
// Terms: a primitive is oneDNN's compiled kernel for one problem (shapes, strides, element types, alpha, beta);
// creating one costs 0.1-1 ms (its JIT), running it is the GEMM. Steps of one call: build the key of the problem,
// find its primitive in this thread's cache or create it, wrap the caller's buffers in memory objects (no copy:
// strides describe the views, so CoC's row chunks and both weight layouts run in place), execute on this thread's
// stream. oneDNN accumulates in fp32 for every input type (its "f32 accumulation" of bf16 × bf16 matmuls).
#pragma once

#include <cstdint>
#include <string>

#include "coc/core/dtype.h"

namespace coc::detail {

/// One GEMM operand: op(x) of [rows, cols] stored row-major with leading dimension ld (elements); `trans` means
/// the stored matrix is [cols, rows] and read transposed.
struct GemmOperand {
  const void* data = nullptr;
  DType type = DType::kF32;
  int64_t ld = 0;
  bool trans = false;
};

/// c[m, n] (type ct, leading dimension ldc) = alpha · op(a)[m, k] · op(b)[k, n] + beta · c. m, n, k > 0 (the
/// caller handles empty problems). a and b have the same type; ct is fp32 or that type. Throws kInvalidArgument
/// when oneDNN has no kernel for the types on this CPU, kInternal for any other oneDNN failure, naming the shapes.
void onednn_gemm(const GemmOperand& a, const GemmOperand& b, void* c, DType ct, int64_t ldc, int64_t m, int64_t n,
                 int64_t k, float alpha, float beta);

/// The kernel oneDNN picks for a [64, 64] · [64, 64] problem of `t` inputs (fp32 output), e.g.
/// "brg:avx512_core_bf16", or "" when it has none. Creates (and caches) one primitive.
std::string onednn_kernel_name(DType t);

/// Primitives created so far in this thread (cache misses); coc::onednn_primitives_created() says it publicly.
int64_t onednn_primitives_created();

}  // namespace coc::detail
