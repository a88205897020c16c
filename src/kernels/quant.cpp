// The w8a16 weight format: spec parsing, validation, the quantiser and dequantisation (quant.h). The layout and
// formula follow torch_npu's npu_mm_all_reduce_base antiquant arguments: w = (w_int8 + antiquant_offset) ·
// antiquant_scale, per-tensor / per-channel / per-group (antiquant_group_size, a multiple of 32 below k).
#include "coc/kernels/quant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "coc/core/error.h"

namespace coc {

std::string QuantSpec::str() const {
  switch (granularity) {
    case QuantGranularity::kPerTensor: return "per-tensor";
    case QuantGranularity::kPerChannel: return "per-channel";
    case QuantGranularity::kPerGroup: return fmt::format("per-group:{}", group);
  }
  return "?";
}

QuantSpec QuantSpec::parse(const std::string& s) {
  QuantSpec q;
  if (s == "per-tensor") {
    q.granularity = QuantGranularity::kPerTensor;
    return q;
  }
  if (s == "per-channel") {
    q.granularity = QuantGranularity::kPerChannel;
    return q;
  }
  const std::string pre = "per-group:";
  if (s.rfind(pre, 0) == 0) {
    const std::string g = s.substr(pre.size());
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(g, &used);
    } catch (...) {
      used = 0;
    }
    if (g.empty() || used != g.size())
      throw_invalid("--w8a16 '{}': the group size must be an integer, e.g. per-group:64", s);
    if (v <= 0 || v % 32 != 0)
      throw_invalid("--w8a16 '{}': the group size must be a positive multiple of 32 (torch_npu antiquant_group_size "
                    "rule), e.g. per-group:64",
                    s);
    q.granularity = QuantGranularity::kPerGroup;
    q.group = v;
    return q;
  }
  throw_invalid("--w8a16 '{}': use per-tensor, per-channel or per-group:G (G a multiple of 32 below k)", s);
}

int64_t QuantSpec::scale_rows(int64_t k) const {
  return granularity == QuantGranularity::kPerGroup && group > 0 ? (k + group - 1) / group : 1;
}
int64_t QuantSpec::scale_cols(int64_t n) const { return granularity == QuantGranularity::kPerTensor ? 1 : n; }

int64_t Int8Weight::bytes() const {
  return static_cast<int64_t>(q.size()) + 4 * static_cast<int64_t>(scale.size() + offset.size());
}

namespace {
void check_group(const QuantSpec& spec, int64_t k, const std::string& what) {
  if (spec.granularity != QuantGranularity::kPerGroup) return;
  if (spec.group <= 0 || spec.group % 32 != 0)
    throw_invalid("{}: group size {} must be a positive multiple of 32 (torch_npu antiquant_group_size rule)", what,
                  spec.group);
  if (spec.group >= k)
    throw_invalid("{}: group size {} must be less than k={} (the weight's in-features); use a smaller group or "
                  "per-channel",
                  what, spec.group, k);
}
}  // namespace

void Int8Weight::validate(const std::string& what) const {
  if (k < 1 || n < 1) throw_invalid("{}: int8 weight is [{}, {}]; both dims must be >= 1", what, k, n);
  check_group(spec, k, what);
  if (static_cast<int64_t>(q.size()) != k * n)
    throw_invalid("{}: int8 weight holds {} values but [k, n] = [{}, {}] needs {}", what, q.size(), k, n, k * n);
  const int64_t sr = spec.scale_rows(k), sc = spec.scale_cols(n);
  if (static_cast<int64_t>(scale.size()) != sr * sc)
    throw_invalid("{}: {} scale has {} values but must be [{}, {}] = {} for a [{}, {}] weight", what, spec.str(),
                  scale.size(), sr, sc, sr * sc, k, n);
  if (!offset.empty() && offset.size() != scale.size())
    throw_invalid("{}: offset has {} values but must be empty (symmetric) or match the scale's [{}, {}]", what,
                  offset.size(), sr, sc);
}

Int8Weight quantize_weight(ConstMatrixView w, WeightLayout layout, const QuantSpec& spec, bool asymmetric) {
  Int8Weight out;
  out.k = weight_k(w, layout);
  out.n = weight_n(w, layout);
  out.spec = spec;
  if (out.k < 1 || out.n < 1) throw_invalid("quantize_weight: weight is [{}, {}]; both dims must be >= 1", w.rows, w.cols);
  check_group(spec, out.k, "quantize_weight");
  const int64_t k = out.k, n = out.n, sr = spec.scale_rows(k), sc = spec.scale_cols(n);
  auto at = [&](int64_t p, int64_t j) { return layout == WeightLayout::kKN ? w.row(p)[j] : w.row(j)[p]; };
  // Rows of the weight covered by scale row s.
  auto rows_of = [&](int64_t s) -> std::pair<int64_t, int64_t> {
    if (spec.granularity != QuantGranularity::kPerGroup) return {0, k};
    return {s * spec.group, std::min(k, (s + 1) * spec.group)};
  };
  out.q.assign(static_cast<size_t>(k * n), 0);
  out.scale.assign(static_cast<size_t>(sr * sc), 1.0f);
  if (asymmetric) out.offset.assign(static_cast<size_t>(sr * sc), 0.0f);
  for (int64_t s = 0; s < sr; ++s) {
    const auto [p0, p1] = rows_of(s);
    for (int64_t c = 0; c < sc; ++c) {
      // Columns covered by this scale: all of them (per-tensor) or column c.
      const int64_t j0 = sc == 1 ? 0 : c, j1 = sc == 1 ? n : c + 1;
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t j = j0; j < j1; ++j) {
          lo = std::min(lo, at(p, j));
          hi = std::max(hi, at(p, j));
        }
      float scale = 1.0f, offset = 0.0f;
      if (asymmetric) {
        if (hi > lo) {
          scale = (hi - lo) / 255.0f;
          offset = lo / scale + 128.0f;
        } else {
          offset = lo;  // constant: q = 0 gives (0 + lo) · 1 = lo exactly
        }
      } else {
        const float amax = std::max(std::fabs(lo), std::fabs(hi));
        if (amax > 0) scale = amax / 127.0f;
      }
      const size_t si = static_cast<size_t>(s * sc + c);
      out.scale[si] = scale;
      if (asymmetric) out.offset[si] = offset;
      const float lo_q = asymmetric ? -128.0f : -127.0f;
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t j = j0; j < j1; ++j) {
          float v = std::nearbyint(at(p, j) / scale - offset);
          v = std::clamp(v, lo_q, 127.0f);
          out.q[static_cast<size_t>(p * n + j)] = static_cast<int8_t>(v);
        }
    }
  }
  return out;
}

void dequantize_block(const Int8Weight& w, int64_t row0, int64_t col0, MatrixView out) {
  COC_ASSERT(row0 >= 0 && col0 >= 0 && row0 + out.rows <= w.k && col0 + out.cols <= w.n,
             "dequantize_block: [{}, {}] at ({}, {}) of a [{}, {}] weight", out.rows, out.cols, row0, col0, w.k, w.n);
  const int64_t n = w.n, cols = out.cols;
  const bool per_tensor = w.spec.granularity == QuantGranularity::kPerTensor;
  const bool has_off = !w.offset.empty();
  for (int64_t i = 0; i < out.rows; ++i) {
    const int64_t p = row0 + i;
    const int8_t* q = w.q.data() + p * n + col0;
    float* y = out.row(i);
    if (per_tensor) {
      const float s = w.scale[0], o = has_off ? w.offset[0] : 0.0f;
      for (int64_t j = 0; j < cols; ++j) y[j] = (static_cast<float>(q[j]) + o) * s;
      continue;
    }
    const int64_t srow = w.spec.granularity == QuantGranularity::kPerGroup ? p / w.spec.group : 0;
    const float* s = w.scale.data() + srow * n + col0;
    if (has_off) {
      const float* o = w.offset.data() + srow * n + col0;
      for (int64_t j = 0; j < cols; ++j) y[j] = (static_cast<float>(q[j]) + o[j]) * s[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) y[j] = static_cast<float>(q[j]) * s[j];
    }
  }
}

Tensor dequantize(const Int8Weight& w) {
  Tensor t({w.k, w.n});
  dequantize_block(w, 0, 0, t.mat());
  return t;
}

}  // namespace coc
