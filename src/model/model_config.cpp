#include "coc/model/model_config.h"

#include <cmath>

#include <fmt/format.h>

#include "coc/comm/communicator.h"
#include "coc/core/error.h"

namespace coc {

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size, f = ffn_hidden_size;
  const int64_t per_layer = 4 * h * h + 3 * h * f + 2 * h;
  return num_layers * per_layer + 2 * vocab_size * h + h;
}

void ModelConfig::validate(int tp) const {
  if (num_layers < 1) throw_invalid("--num-layers must be >= 1 (got {})", num_layers);
  if (hidden_size < 1 || num_attention_heads < 1 || ffn_hidden_size < 1)
    throw_invalid("--hidden-size, --num-attention-heads and --ffn-hidden-size must be >= 1 (got {}, {}, {})",
                  hidden_size, num_attention_heads, ffn_hidden_size);
  if (seq_length < 1) throw_invalid("--seq-length must be >= 1 (got {})", seq_length);
  if (hidden_size % num_attention_heads != 0)
    throw_invalid("--hidden-size {} is not divisible by --num-attention-heads {}; pick heads that divide the hidden "
                  "size",
                  hidden_size, num_attention_heads);
  if (head_dim() % 2 != 0)
    throw_invalid("head dim {} (= --hidden-size / --num-attention-heads) must be even for rotary embeddings",
                  head_dim());
  if (num_attention_heads % tp != 0)
    throw_invalid("--num-attention-heads {} is not divisible by --tensor-model-parallel-size {}; use a tp that "
                  "divides the head count (e.g. {}) or change the heads",
                  num_attention_heads, tp, num_attention_heads % 2 == 0 ? 2 : 1);
  if (hidden_size % tp != 0)
    throw_invalid("--hidden-size {} is not divisible by --tensor-model-parallel-size {}", hidden_size, tp);
  if (ffn_hidden_size % tp != 0)
    throw_invalid("--ffn-hidden-size {} is not divisible by --tensor-model-parallel-size {}; use a multiple of {}",
                  ffn_hidden_size, tp, tp);
  if (!(norm_epsilon > 0)) throw_invalid("--norm-epsilon must be > 0 (got {})", norm_epsilon);
  if (!(rotary_base > 1)) throw_invalid("--rotary-base must be > 1 (got {}); RoPE's usual base is 10000", rotary_base);
  if (!(init_method_std >= 0) || !std::isfinite(init_method_std))
    throw_invalid("--init-method-std must be a finite number >= 0 (got {}); Megatron's default is 0.02", init_method_std);
}

uint64_t ModelConfig::hash() const {
  const int64_t f[] = {num_layers, hidden_size, num_attention_heads, ffn_hidden_size, vocab_size};
  return fnv1a(f, sizeof(f));
}

std::string ModelConfig::shape_flags() const {
  return fmt::format("--num-layers {} --hidden-size {} --num-attention-heads {} --ffn-hidden-size {}", num_layers,
                     hidden_size, num_attention_heads, ffn_hidden_size);
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") return c;
  if (name == "llama2-7b-layer") {
    c.num_layers = 1;
    c.hidden_size = 4096;
    c.num_attention_heads = 32;
    c.ffn_hidden_size = 11008;
    c.seq_length = 256;
    return c;
  }
  throw_invalid("unknown --model-preset '{}'; choose 'tiny' (default) or 'llama2-7b-layer'", name);
}

}  // namespace coc
