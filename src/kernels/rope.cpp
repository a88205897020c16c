// Rotary position embedding (Su et al. 2021), rotate-half form as in LLaMA and Megatron-LM
// (megatron/core/models/common/embeddings/rotary_pos_embedding.py: _rotate_half, freqs = base^(−2i/D)).
#include <cmath>
#include <vector>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"

namespace coc {

void rope_apply(MatrixView x, int64_t batch, int64_t heads, int64_t head_dim, float theta, bool inverse,
                int64_t pos0) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "rope", {"m", x.rows}, {"n", x.cols});
  COC_ASSERT(batch > 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0,
             "rope_apply: batch {}, heads {}, head_dim {} (must be even)", batch, heads, head_dim);
  COC_ASSERT(x.cols == heads * head_dim && x.rows % batch == 0, "rope_apply: x [{}, {}] for B {}, heads {}, D {}",
             x.rows, x.cols, batch, heads, head_dim);
  COC_ASSERT(theta > 0.0f, "rope_apply: theta {} must be > 0", theta);
  const int64_t half = head_dim / 2;
  const int64_t seq = x.rows / batch;
  // Inverse frequencies theta^(−2i/D), and per position one cos/sin table shared by the B rows and all heads.
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] =
        std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  const double sign = inverse ? -1.0 : 1.0;  // Rᵀ(θ) = R(−θ)
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // The angle in fp64: t·freq reaches ~S radians, where fp32 would lose the low bits of the phase.
      const double a = static_cast<double>(pos0 + t) * inv_freq[static_cast<size_t>(i)];
      cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(i)] = static_cast<float>(sign * std::sin(a));
    }
    for (int64_t b = 0; b < batch; ++b) {
      float* row = x.row(t * batch + b);
      for (int64_t j = 0; j < heads; ++j) {
        float* x1 = row + j * head_dim;
        float* x2 = x1 + half;
        for (int64_t i = 0; i < half; ++i) {
          const float a1 = x1[i], a2 = x2[i];
          const float c = cs[static_cast<size_t>(i)], s = sn[static_cast<size_t>(i)];
          x1[i] = a1 * c - a2 * s;
          x2[i] = a2 * c + a1 * s;
        }
      }
    }
  }
}

}  // namespace coc
