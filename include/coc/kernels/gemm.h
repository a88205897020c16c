// Single-rank GEMMs: fp32 through oneDNN's matmul or OpenBLAS's sgemm, bf16 × bf16 (fp32 accumulation) through
// oneDNN.
//
// Why two libraries: on AVX-512 CPUs oneDNN's fp32 kernels (brgemm, avx512_core) run 1.1-2x OpenBLAS's best and 2-4x
// the AVX2 kernels that OPENBLAS_CORETYPE=Haswell pins, and only oneDNN has bf16 GEMMs (Debian's OpenBLAS 0.3.21
// exports no sbgemm). Where oneDNN has no AVX-512 kernels, OpenBLAS stays the fp32 default: measured in
// docs/performance.md, point 26. oneDNN (with bf16 units, for bf16) gives each row of c the same bits whatever block
// of rows a call covers; OpenBLAS does not (a 13-row block of a 97-row product differs in its last bits), which is
// why deterministic mode computes fixed tiles (docs/design.md, "Deterministic mode"). Tested in
// tests/kernels/test_gemm_backend.cpp.
// One BLAS (OpenMP, for oneDNN) thread per rank: ranks are pinned, and threads × ranks > cores thrashes (edge case
// 16 of docs/edge-cases.md).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "coc/core/dtype.h"
#include "coc/core/tensor.h"

namespace coc {

/// How a weight matrix is stored. Explicit, never inferred from shapes: inference goes wrong when k == n
/// (edge case 2; Ascend's MC2 API infers it).
enum class WeightLayout {
  kNK,  ///< [n, k] = [out, in], Megatron's layout: y = x·wᵀ
  kKN,  ///< [k, n] = [in, out]: y = x·w
};
const char* to_string(WeightLayout l);

/// The library of the fp32 GEMMs (--gemm-backend, COC_GEMM_BACKEND; coc's own switch).
enum class GemmBackend {
  kAuto,      ///< oneDNN where its kernels are AVX-512 or wider, OpenBLAS otherwise
  kOneDnn,    ///< dnnl::matmul
  kOpenBlas,  ///< cblas_sgemm
};
const char* to_string(GemmBackend b);
/// "auto", "onednn" or "openblas"; throws kInvalidArgument naming `flag` and the choices otherwise.
GemmBackend parse_gemm_backend(const std::string& s, const std::string& flag = "--gemm-backend");
/// Chooses the fp32 back end of this process (every thread). kAuto resolves at once. Until called, the back end
/// is COC_GEMM_BACKEND's (default auto).
void set_gemm_backend(GemmBackend b);
/// The fp32 back end in use: kOneDnn or kOpenBlas, never kAuto.
GemmBackend gemm_backend();

/// What oneDNN runs on this CPU, for `coc env` and the logs.
struct OneDnnInfo {
  std::string version;      ///< "2.6.3"
  std::string isa;          ///< its effective ISA: "avx512_core_bf16", "avx512_core_amx", "avx2", ...
  std::string f32_kernel;   ///< the kernel of an fp32 matmul, e.g. "brg:avx512_core"
  std::string bf16_kernel;  ///< the kernel of a bf16 matmul, e.g. "brg:avx512_core_bf16"; "" when none
  bool bf16_native = false; ///< the CPU has bf16 dot products (AVX512_BF16 or AMX); otherwise oneDNN emulates them
  /// The CPU has AMX-BF16 (CPUID) and oneDNN runs bf16 natively, but not on AMX: its ISA capped
  /// (ONEDNN_MAX_CPU_ISA), or a Linux kernel without AMX state (before 5.16). On Emerald Rapids bf16 then ran slower
  /// than fp32 (docs/performance.md point 43). False where bf16 is emulated: bf16_native's warning says that.
  bool amx_unused = false;
};
OneDnnInfo onednn_info();
/// oneDNN primitives this thread has created so far: one per distinct problem (shapes, strides, types, alpha,
/// beta), kept in a per-thread cache of 256, so a steady training step creates none.
int64_t onednn_primitives_created();

/// The element type the fp32 GEMMs below multiply in: kF32, kBF16 for Megatron's --bf16, kF16 for --fp16 (coc's
/// process-wide switch, as PyTorch's autocast is a mode rather than an argument, so that every layer, CoC chunk and
/// deterministic tile computes alike without a dtype threaded through the overlap layer). Under kBF16, op(a) and
/// op(b) are rounded to bf16 (nearest even, in per-thread scratch) and multiplied on oneDNN's bf16 kernels with fp32
/// accumulation and fp32 c: exactly the GEMM of a bf16 model with fp32 master weights, whose compute copies are the
/// rounded weights. Costs one conversion pass over each operand per call, except an operand read from its
/// GemmWeightCopies copy (below). Under kF16 the operands are rounded to
/// fp16 values (±inf beyond 65504) and multiplied on the fp32 kernels of gemm_backend(): no target CPU has fp16 dot
/// products, and a product of fp16 values is exact in fp32, so this is an fp16 GEMM's arithmetic, at fp32's speed
/// less the conversion (coc env says so). Throws kInvalidArgument for kInt8.
void set_gemm_compute_type(DType t);
/// This thread's compute type: a live GemmComputeScope's, else the process's (kF32 until set).
DType gemm_compute_type();
/// Runs the GEMMs of this thread in `t` while alive (the fp32 islands of a bf16 model: the MoE router, as
/// Megatron's --moe-router-dtype fp32; and reference computations). Nests; restores the previous type.
class GemmComputeScope {
 public:
  explicit GemmComputeScope(DType t);
  ~GemmComputeScope();
  GemmComputeScope(const GemmComputeScope&) = delete;
  GemmComputeScope& operator=(const GemmComputeScope&) = delete;

 private:
  int saved_;
};
/// The bf16 compute copies of the weights for one training iteration, as a bf16 Megatron model keeps next to its
/// fp32 master weights and refreshes after each optimizer step. While an instance is alive, a GEMM under kBF16 whose
/// operand lies inside one of `weights` (fp32 buffers; any view into one, strided or not) reads a bf16 copy of that
/// buffer, rounded on its first use, instead of rounding the operand again on every call. Why: each weight is an
/// operand of every CoC chunk's GEMM and of the backward's dX GEMMs, and each call rounded it in full (perf, issue
/// 35's shape: rounding took 7% of a bf16 step). The bits are the same: the copy holds the values a call would round
/// to. Costs half the weights' fp32 bytes, kept between instances for the same buffers (no allocation per
/// iteration); under kF32 and kF16 it holds nothing.
/// The caller's contract: the buffers are neither written nor freed while the instance lives (make it after the
/// optimizer step, destroy it before the next: coc train holds one over each iteration's forwards and backwards,
/// except where FSDP frees and regathers the weights inside the iteration). Throws kInternal when another instance
/// is alive.
class GemmWeightCopies {
 public:
  explicit GemmWeightCopies(const std::vector<std::span<const float>>& weights);
  ~GemmWeightCopies();
  GemmWeightCopies(const GemmWeightCopies&) = delete;
  GemmWeightCopies& operator=(const GemmWeightCopies&) = delete;
};

/// A bf16 copy of one activation for the GEMMs of this thread that read it while the instance lives, as
/// GemmWeightCopies does for the weights: under kBF16 a GEMM whose operand lies inside `x` (fp32, any leading
/// dimension; the operand within x's columns, with x's leading dimension) reads the copy instead of rounding the
/// operand again. Why: a column-parallel layer's backward reads dY twice, in the dX GEMMs of its CoC chunks and in
/// dW = dYᵀ·X, and each rounded it in full (perf at issue 35's shape: 1% of a bf16 step). Rows are rounded on their
/// first read, so a producer may still be computing later rows (CocOptions::produce_rows) while GEMMs read the
/// earlier ones; or the producer writes their bf16 values itself (fill_rows), which spares the rounding pass. Same
/// bits either way. Under kF32 and kF16 it does nothing. An instance whose x lies inside the x of an enclosing live
/// one of this thread does nothing either: the enclosing copy serves its reads, with whatever rows its producer
/// filled. The caller's contract: a row of x is not written once a GEMM has read it or fill_rows has handed it out,
/// while the instance lives. The buffer is kept per thread between instances (no allocation per layer).
class GemmOperandCopy {
 public:
  explicit GemmOperandCopy(ConstMatrixView x);
  ~GemmOperandCopy();
  GemmOperandCopy(const GemmOperandCopy&) = delete;
  GemmOperandCopy& operator=(const GemmOperandCopy&) = delete;
  /// Rows [first, first + count) of the copy, [count, x.cols] with x's leading dimension, for the producer of those
  /// rows of x to write their bf16 values (fp32_to_bf16 of what it writes to x: nearest even) before any GEMM reads
  /// them; they count as rounded from then on. An empty view when the instance does nothing (fp32, or an enclosing
  /// copy serves x): the producer then writes x alone. The view is valid until this thread's next GemmOperandCopy
  /// is made. Throws kInternal for rows outside x.
  MatrixViewT<BFloat16> fill_rows(int64_t first, int64_t count);

 private:
  bool active_ = false;
  size_t index_ = 0;  ///< its place among the thread's live copies
};

/// Rounds y in place to the values of gemm_compute_type() when it is kBF16 or kF16 (a 16-bit model stores that
/// activation in 16 bits: linear outputs, the residual stream, logits); nothing under kF32.
void store_as_compute_type(MatrixView y);

/// c = alpha · op(a) · op(b) + beta · c, where op(x) = xᵀ if the flag is set.
/// Shapes: op(a) [m, k], op(b) [k, n], c [m, n]; FLOPs = 2·m·n·k. m, n or k may be 0 (then c is only scaled by
/// beta). Runs on gemm_backend() in gemm_compute_type() (above). Throws kInternal on mismatched shapes (callers validate user input first).
void gemm(ConstMatrixView a, bool trans_a, ConstMatrixView b, bool trans_b, MatrixView c, float alpha = 1.0f,
          float beta = 0.0f);

using ConstBf16View = MatrixViewT<const BFloat16>;
using Bf16View = MatrixViewT<BFloat16>;
/// The same with bf16 operands, on oneDNN whatever gemm_backend() says: products and sums in fp32, c written as
/// fp32, or (second form) rounded once to bf16. Error bound against the exact product of the bf16 inputs, per
/// element: |Δ| ≤ γ_k · Σ_p |a_ip·b_pj| with γ_k ≈ k·2^-24 (fp32 accumulation), plus 2^-8·|c| for the bf16 output.
/// Throws kInternal on mismatched shapes, kInvalidArgument when oneDNN has no bf16 kernel on this CPU.
void gemm(ConstBf16View a, bool trans_a, ConstBf16View b, bool trans_b, MatrixView c, float alpha = 1.0f,
          float beta = 0.0f);
void gemm(ConstBf16View a, bool trans_a, ConstBf16View b, bool trans_b, Bf16View c, float alpha = 1.0f,
          float beta = 0.0f);

/// y = x · W (+ y if accumulate), where W is `w` read with `layout`: x [m, k], w [n, k] (kNK) or [k, n] (kKN),
/// y [m, n]. The bf16 forms take bf16 x and w, and write fp32 or bf16 y (fp32 accumulation either way).
void matmul(ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y, bool accumulate = false);
void matmul(ConstBf16View x, ConstBf16View w, WeightLayout layout, MatrixView y, bool accumulate = false);
void matmul(ConstBf16View x, ConstBf16View w, WeightLayout layout, Bf16View y, bool accumulate = false);

/// y = x · W for fp32 x and w, multiplied as the fp32 form multiplies them (in gemm_compute_type()), with y rounded
/// once to bf16 (nearest even): under kBF16, oneDNN's bf16 kernels write y directly, saving the fp32 pass of the
/// fp32 form followed by fp32_to_bf16 (what a bf16 reduce-scatter of the product sends; about 1% of a bf16 step at
/// issue 35's shape). The same bits as that pair (tests/kernels/test_gemm_backend.cpp: every compute type, both
/// layouts, 1 to 200 rows, a padded x); under kF32 and kF16 it is that pair. Throws as gemm().
void matmul(ConstMatrixView x, ConstMatrixView w, WeightLayout layout, Bf16View y);

/// y = x · W for bf16 x and an fp32 weight rounded as gemm() rounds it under kBF16 (read from its GemmWeightCopies
/// copy when it has one): the bits of matmul(x widened to fp32, w, ...) under kBF16, without rounding x again. Why:
/// a bf16 all-gather receives x in bf16 (overlap/all_gather_matmul.cpp). Throws as gemm().
void matmul(ConstBf16View x, ConstMatrixView w, WeightLayout layout, MatrixView y, bool accumulate = false);

/// c = alpha · op(a) · op(b) + beta · c for fp32 a rounded to bf16 as gemm() rounds it under kBF16 (or its
/// GemmWeightCopies copy), and bf16 b: the bits of gemm(a, b widened to fp32, ...) under kBF16, without widening b
/// and rounding it again. Why: under --bf16 the linear layers keep their gathered inputs (column-parallel: X;
/// row-parallel: dY) in bf16 for the weight gradient dW = dYᵀ·X (parallel/linear.h). Throws as gemm().
void gemm(ConstMatrixView a, bool trans_a, ConstBf16View b, bool trans_b, MatrixView c, float alpha = 1.0f,
          float beta = 0.0f);
/// The same for bf16 a and fp32 b (a row-parallel layer's gathered dY in bf16, dW = dYᵀ·X).
void gemm(ConstBf16View a, bool trans_a, ConstMatrixView b, bool trans_b, MatrixView c, float alpha = 1.0f,
          float beta = 0.0f);

/// The k and n of weight `w` under `layout`.
template <typename T>
int64_t weight_k(MatrixViewT<T> w, WeightLayout l) { return l == WeightLayout::kNK ? w.cols : w.rows; }
template <typename T>
int64_t weight_n(MatrixViewT<T> w, WeightLayout l) { return l == WeightLayout::kNK ? w.rows : w.cols; }

/// y[i, :] += bias[:] for every row. bias has y.cols entries.
void add_bias(MatrixView y, const float* bias);
/// out[j] += sum_i x[i, j] (bias gradient). out has x.cols entries.
void accumulate_colsum(ConstMatrixView x, float* out);

/// Sets the BLAS (and OpenMP, oneDNN's threads) thread count for this process and resolves the fp32 back end, so
/// that a bad COC_GEMM_BACKEND fails at start-up (kInvalidArgument); returns what BLAS reports afterwards.
int set_blas_threads(int n);
int blas_threads();
/// BLAS build description, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64".
std::string blas_config();

}  // namespace coc
