// Rotary position embedding (Su et al. 2021), rotate-half form as in LLaMA and Megatron-LM
// (megatron/core/models/common/embeddings/rotary_pos_embedding.py: _rotate_half, freqs = base^(−2i/D)).
#include <cmath>
#include <vector>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"
#include "vec_math.h"

namespace coc {

namespace {
/// cos and sin of every angle p·θ^(−2i/D) for positions p in [0, end), [end, D/2] each.
struct RopeTable {
  float theta = 0;
  int64_t head_dim = 0, end = 0;
  std::vector<float> cos, sin;
};

/// This thread's table, covering positions [0, pos0 + seq) of the arguments' theta and D; recomputed only when they
/// change or a call reaches past its end. Why kept: a step applies the same rotation to q and k of every layer,
/// forward and backward, and the table's cos and sin cost as much as the rotation itself (measured with perf: 3% of
/// a step at S = 256, D = 32). Why from position 0: calls on a range of positions (a query block's rows in
/// attention's backward, a context-parallel chunk) read the same table, and each entry depends on its position
/// only.
const RopeTable& rope_table(float theta, int64_t head_dim, int64_t pos0, int64_t seq) {
  thread_local RopeTable t;
  const int64_t end = pos0 + seq;
  if (t.theta == theta && t.head_dim == head_dim && end <= t.end) return t;
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] =
        std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  t.cos.resize(static_cast<size_t>(end * half));
  t.sin.resize(static_cast<size_t>(end * half));
  for (int64_t p = 0; p < end; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // The angle in fp64: t·freq reaches ~S radians, where fp32 would lose the low bits of the phase.
      const double a = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
      t.cos[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(a));
      t.sin[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(a));
    }
  t.theta = theta;
  t.head_dim = head_dim;
  t.end = end;
  return t;
}
}  // namespace

COC_VEC_CLONES void rope_apply_rows(MatrixView x, int64_t first_row, int64_t batch, int64_t heads, int64_t head_dim,
                                    float theta, bool inverse) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "rope", {"m", x.rows}, {"n", x.cols});
  COC_ASSERT(batch > 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0,
             "rope_apply: batch {}, heads {}, head_dim {} (must be even)", batch, heads, head_dim);
  COC_ASSERT(x.cols == heads * head_dim, "rope_apply: x [{}, {}] for heads {}, D {}", x.rows, x.cols, heads,
             head_dim);
  COC_ASSERT(theta > 0.0f && first_row >= 0, "rope_apply: theta {} must be > 0, first row {} >= 0", theta,
             first_row);
  if (x.rows == 0) return;
  const int64_t half = head_dim / 2;
  const int64_t pos0 = first_row / batch, end = (first_row + x.rows - 1) / batch + 1;
  const RopeTable& tab = rope_table(theta, head_dim, pos0, end - pos0);
  const float sign = inverse ? -1.0f : 1.0f;  // Rᵀ(θ) = R(−θ)
  for (int64_t r = 0; r < x.rows; ++r) {
    const int64_t t = (first_row + r) / batch;
    const float* cs = tab.cos.data() + t * half;
    const float* sn = tab.sin.data() + t * half;
    float* row = x.row(r);
    for (int64_t j = 0; j < heads; ++j) {
      float* x1 = row + j * head_dim;
      float* x2 = x1 + half;
      for (int64_t i = 0; i < half; ++i) {
        const float a1 = x1[i], a2 = x2[i];
        const float c = cs[i], sv = sign * sn[i];
        x1[i] = a1 * c - a2 * sv;
        x2[i] = a2 * c + a1 * sv;
      }
    }
  }
}

void rope_apply(MatrixView x, int64_t batch, int64_t heads, int64_t head_dim, float theta, bool inverse,
                int64_t pos0) {
  COC_ASSERT(batch > 0 && x.rows % batch == 0 && pos0 >= 0, "rope_apply: x [{}, {}] for B {} (rows must be a "
             "multiple of it), pos0 {}", x.rows, x.cols, batch, pos0);
  rope_apply_rows(x, pos0 * batch, batch, heads, head_dim, theta, inverse);
}

}  // namespace coc
