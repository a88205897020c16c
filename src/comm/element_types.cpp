// Element types of the collectives and the 16-bit reductions (element_types.h).
#include "element_types.h"

#include <algorithm>
#include <mutex>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "mpi_check.h"

namespace coc::detail {
namespace {

/// Block of elements converted at once: three fp32 blocks stay in L1.
constexpr int64_t kBlock = 1024;

struct HalfTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL, fp16 = MPI_DATATYPE_NULL;
  MPI_Op ops[2][3] = {};  // [bf16, fp16][sum, max, min]
};

template <ReduceOp Op>
float combine(float a, float b) {
  if constexpr (Op == ReduceOp::kSum) return a + b;
  if constexpr (Op == ReduceOp::kMax) return std::max(a, b);
  return std::min(a, b);
}

DType type_of(MPI_Datatype dt);

/// MPI's user-function signature: inout[i] = in[i] (op) inout[i], for *len elements of *dt.
template <ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype* dt) {
  const DType t = type_of(*dt);
  float a[kBlock], b[kBlock];
  const auto* src = static_cast<const uint16_t*>(in);
  auto* dst = static_cast<uint16_t*>(inout);
  for (int64_t i = 0; i < *len; i += kBlock) {
    const int64_t n = std::min<int64_t>(kBlock, *len - i);
    half_to_fp32(t, src + i, a, n);
    half_to_fp32(t, dst + i, b, n);
    for (int64_t j = 0; j < n; ++j) b[j] = combine<Op>(a[j], b[j]);
    fp32_to_half(t, b, dst + i, n);
  }
}

HalfTypes& half_types() {
  static HalfTypes h;
  static std::once_flag once;
  std::call_once(once, [] {
    for (MPI_Datatype* t : {&h.bf16, &h.fp16}) {
      check_mpi(MPI_Type_dup(MPI_UINT16_T, t), "MPI_Type_dup", "16-bit element type");
      check_mpi(MPI_Type_commit(t), "MPI_Type_commit", "16-bit element type");
    }
    MPI_User_function* fns[3] = {&half_op<ReduceOp::kSum>, &half_op<ReduceOp::kMax>, &half_op<ReduceOp::kMin>};
    for (auto& per_type : h.ops)
      for (int o = 0; o < 3; ++o)
        check_mpi(MPI_Op_create(fns[o], /*commute=*/1, &per_type[o]), "MPI_Op_create", "16-bit op");
  });
  return h;
}

DType type_of(MPI_Datatype dt) { return dt == half_types().bf16 ? DType::kBF16 : DType::kF16; }

}  // namespace

MPI_Datatype mpi_type(DType t) {
  if (t == DType::kF32) return MPI_FLOAT;
  return t == DType::kBF16 ? half_types().bf16 : half_types().fp16;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const int o = op == ReduceOp::kSum ? 0 : op == ReduceOp::kMax ? 1 : 2;
  if (t == DType::kF32) return o == 0 ? MPI_SUM : o == 1 ? MPI_MAX : MPI_MIN;
  return half_types().ops[t == DType::kBF16 ? 0 : 1][o];
}

void sum_partials_in_rank_order(DType t, const void* parts, const void* own, int me, int T, int64_t count,
                                void* out) {
  const int64_t es = dtype_size(t);
  auto at = [es](const void* base, int64_t i) { return static_cast<const char*>(base) + i * es; };
  float acc[kBlock], tmp[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t len = std::min(kBlock, count - b);
    for (int r = 0; r < T; ++r) {
      const void* src = r == me ? at(own, b) : at(parts, (r < me ? r : r - 1) * count + b);
      const float* x = static_cast<const float*>(src);
      if (t != DType::kF32) {
        half_to_fp32(t, src, tmp, len);
        x = tmp;
      }
      if (r == 0)
        std::copy_n(x, len, acc);
      else
        for (int64_t i = 0; i < len; ++i) acc[i] += x[i];
    }
    if (t == DType::kF32)
      std::copy_n(acc, len, static_cast<float*>(out) + b);
    else
      fp32_to_half(t, acc, static_cast<char*>(out) + b * es, len);
  }
}

}  // namespace coc::detail
