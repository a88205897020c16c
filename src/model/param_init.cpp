#include "param_init.h"

#include <cmath>
#include <numbers>

#include "coc/core/splitmix.h"
#include "coc/model/transformer_layer.h"

namespace coc {

float init_normal(uint64_t seed, uint64_t key, uint64_t index, float std) {
  // Box–Muller on two independent 53-bit uniforms from a counter-based hash: any element can be drawn alone, so a
  // shard draws exactly its part of the full weight, whatever tp.
  uint64_t a = splitmix64(seed ^ splitmix64(key ^ splitmix64(index * 2)));
  uint64_t b = splitmix64(seed ^ splitmix64(key ^ splitmix64(index * 2 + 1)));
  double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

namespace model_init {

uint64_t name_key(const std::string& s) { return fnv1a(s.data(), s.size()); }

void init_rows(Param& p, const std::vector<int64_t>& rows, int64_t k, uint64_t seed, const std::string& key,
               float std) {
  const uint64_t kk = name_key(key);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t j = 0; j < k; ++j)
      p.value[static_cast<int64_t>(i) * k + j] = init_normal(seed, kk, static_cast<uint64_t>(rows[i] * k + j), std);
}

void init_cols(Param& p, int64_t k, int64_t begin, uint64_t seed, const std::string& key, float std) {
  const uint64_t kk = name_key(key);
  const int64_t n = p.value.dim(0), kr = p.value.dim(1);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kr; ++j)
      p.value[i * kr + j] = init_normal(seed, kk, static_cast<uint64_t>(i * k + begin + j), std);
}

Param make_norm(const std::string& name, int64_t h, bool sequence_parallel) {
  Param p;
  p.name = name;
  p.value.resize({h});
  p.grad.resize({h});
  p.placement = Placement::tp_replicated(sequence_parallel);
  p.weight_decay = false;
  p.value.fill(1.0f);
  return p;
}

}  // namespace model_init
}  // namespace coc
