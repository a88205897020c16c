#include "coc/model/hf_convert.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "coc/core/error.h"
#include "coc/model/checkpoint.h"
#include "coc/model/checkpoint_reshard.h"
#include "coc/model/decoder.h"
#include "coc/model/safetensors.h"
#include "coc/overlap/partition.h"

namespace coc {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const std::string& path, const char* what) {
  std::ifstream f(path);
  if (!f) throw_invalid("{}: {} does not exist; pass a Hugging Face model folder (config.json + model.safetensors)",
                        what, path);
  json j = json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw_invalid("{}: {} is not a JSON object", what, path);
  return j;
}

/// The tensors of a Hugging Face folder: name → (file, header), over model.safetensors or its sharded index.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    if (fs::exists(dir + "/model.safetensors", ec)) {
      add_file(dir + "/model.safetensors");
    } else if (fs::exists(dir + "/model.safetensors.index.json", ec)) {
      const json idx = read_json(dir + "/model.safetensors.index.json", "--load-dir");
      if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
        throw_invalid("--load-dir {}: model.safetensors.index.json has no weight_map", dir);
      std::map<std::string, bool> files;
      for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) files[it.value().get<std::string>()] = true;
      for (const auto& [f, _] : files) add_file(dir + "/" + f);
    } else {
      throw_invalid("--load-dir {} holds neither model.safetensors nor model.safetensors.index.json; coc converts "
                    "safetensors weights only",
                    dir);
    }
  }
  /// Tensor `name` as fp32, checked against `shape`.
  Tensor get(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = where_.find(name);
    if (it == where_.end())
      throw_invalid("--load-dir {}: the checkpoint has no tensor '{}'; it is not a complete LLaMA model", dir_, name);
    const auto& [file, header] = files_.at(it->second);
    const SafetensorsEntry& e = *header.find(name);
    if (e.shape != shape)
      throw_invalid("--load-dir {}: tensor '{}' has shape [{}] but config.json implies [{}]", dir_, name,
                    fmt::join(e.shape, ", "), fmt::join(shape, ", "));
    Tensor t;
    read_safetensors_tensor(file, header, e, t);
    return t;
  }

 private:
  void add_file(const std::string& path) {
    const size_t i = files_.size();
    files_.emplace_back(path, read_safetensors_header(path));
    for (const SafetensorsEntry& e : files_.back().second.tensors) where_[e.name] = i;
  }
  std::string dir_;
  std::vector<std::pair<std::string, SafetensorsHeader>> files_;
  std::map<std::string, size_t> where_;
};

/// Rows `rows` of the [n, k] matrix `full`.
Tensor take_rows(const Tensor& full, const std::vector<int64_t>& rows) {
  const int64_t k = full.dim(1);
  Tensor t({static_cast<int64_t>(rows.size()), k});
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(full.data() + rows[i] * k, full.data() + (rows[i] + 1) * k, t.data() + static_cast<int64_t>(i) * k);
  return t;
}
std::vector<int64_t> range_rows(int64_t n, int tp, int r) {
  const RowRange rr = split_rows(n, tp, r);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < rr.count; ++i) rows.push_back(rr.begin + i);
  return rows;
}
/// Columns [begin, begin + count) of the [n, k] matrix `full`.
Tensor take_cols(const Tensor& full, int64_t n, int tp, int r) {
  const int64_t rows = full.dim(0), k = full.dim(1);
  (void)n;
  const RowRange rr = split_rows(k, tp, r);
  Tensor t({rows, rr.count});
  for (int64_t i = 0; i < rows; ++i)
    std::copy(full.data() + i * k + rr.begin, full.data() + i * k + rr.begin + rr.count, t.data() + i * rr.count);
  return t;
}
/// Rows of `parts` stacked: [sum n_i, k].
Tensor stack(const std::vector<const Tensor*>& parts) {
  int64_t n = 0;
  for (const Tensor* p : parts) n += p->dim(0);
  Tensor t({n, parts[0]->dim(1)});
  int64_t at = 0;
  for (const Tensor* p : parts) {
    std::copy(p->data(), p->data() + p->numel(), t.data() + at);
    at += p->numel();
  }
  return t;
}

std::string layer(int64_t i, const char* rest) { return fmt::format("layers.{}.{}", i, rest); }
std::string hf_layer(int64_t i, const char* rest) { return fmt::format("model.layers.{}.{}", i, rest); }

}  // namespace

ModelConfig hf_llama_config(const std::string& hf_dir) {
  const json j = read_json(hf_dir + "/config.json", "--load-dir");
  auto refuse = [&](const std::string& why) {
    throw_invalid("--load-dir {}: coc cannot express this model: {}", hf_dir, why);
  };
  const std::string type = j.value("model_type", "");
  if (type != "llama" && type != "mistral")
    refuse(fmt::format("model_type '{}' is not a LLaMA-layout decoder (coc converts llama and mistral)", type));
  auto num = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_number_integer()) refuse(fmt::format("config.json lacks the integer '{}'", key));
    return j[key].get<int64_t>();
  };
  ModelConfig c;
  c.num_layers = num("num_hidden_layers");
  c.hidden_size = num("hidden_size");
  c.num_attention_heads = num("num_attention_heads");
  c.ffn_hidden_size = num("intermediate_size");
  c.vocab_size = num("vocab_size");
  const int64_t kv = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                         ? num("num_key_value_heads")
                         : c.num_attention_heads;
  c.num_query_groups = kv == c.num_attention_heads ? 0 : kv;
  if (j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer())
    c.seq_length = j["max_position_embeddings"].get<int64_t>();
  if (j.contains("rms_norm_eps")) c.norm_epsilon = j["rms_norm_eps"].get<float>();
  if (j.contains("rope_theta")) c.rotary_base = j["rope_theta"].get<float>();
  // "swish" is SiLU under its other name (x·sigmoid(x)), which some converted configs carry.
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu" && act != "swish")
    refuse(fmt::format("hidden_act '{}' (coc's MLP is SwiGLU, silu)", act));
  // Mistral's sliding-window attention changes what a token sees once the sequence exceeds the window; a window at
  // least the model's context (or null, as Mistral 7B v0.2 has) is plain causal attention.
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() &&
      (!j["sliding_window"].is_number_integer() || j["sliding_window"].get<int64_t>() < c.seq_length))
    refuse(fmt::format("sliding_window {} is below max_position_embeddings {} (coc's attention is plain causal "
                       "attention, without a window)",
                       j["sliding_window"].dump(), c.seq_length));
  if (j.value("tie_word_embeddings", false))
    refuse("tie_word_embeddings is true (coc keeps separate embedding and output weights)");
  if (j.value("attention_bias", false)) refuse("attention_bias is true (coc's attention has no biases)");
  if (j.value("mlp_bias", false)) refuse("mlp_bias is true (coc's MLP has no biases)");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    refuse("rope_scaling is set (coc implements plain RoPE only)");
  if (c.num_attention_heads < 1 || c.hidden_size % c.num_attention_heads != 0)
    refuse(fmt::format("hidden_size {} is not a multiple of num_attention_heads {}", c.hidden_size,
                       c.num_attention_heads));
  if (j.contains("head_dim") && j["head_dim"].is_number_integer() && j["head_dim"].get<int64_t>() != c.head_dim())
    refuse(fmt::format("head_dim {} differs from hidden_size / num_attention_heads = {}", j["head_dim"].get<int64_t>(),
                       c.head_dim()));
  if (kv < 1 || c.num_attention_heads % kv != 0)
    refuse(fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_attention_heads, kv));
  if (c.head_dim() % 2 != 0) refuse(fmt::format("head dim {} is odd (RoPE needs pairs)", c.head_dim()));
  return c;
}

namespace {
/// The tensors of one TP rank of the Hugging Face model `w` under coc's names, split as that rank holds them.
std::vector<std::pair<std::string, Tensor>> coc_tensors(const HfWeights& w, const ModelConfig& c, int tp, int r) {
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, V = c.vocab_size, KV = c.kv_heads() * c.head_dim();
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("embedding.weight", take_rows(w.get("model.embed_tokens.weight", {V, H}), range_rows(V, tp, r)));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    t.emplace_back(layer(i, "input_layernorm.weight"), w.get(hf_layer(i, "input_layernorm.weight"), {H}));
    const Tensor q = w.get(hf_layer(i, "self_attn.q_proj.weight"), {H, H});
    const Tensor k = w.get(hf_layer(i, "self_attn.k_proj.weight"), {KV, H});
    const Tensor v = w.get(hf_layer(i, "self_attn.v_proj.weight"), {KV, H});
    t.emplace_back(layer(i, "attention.qkv.weight"), take_rows(stack({&q, &k, &v}), qkv_row_map(c, tp, r)));
    t.emplace_back(layer(i, "attention.dense.weight"),
                   take_cols(w.get(hf_layer(i, "self_attn.o_proj.weight"), {H, H}), H, tp, r));
    t.emplace_back(layer(i, "post_attention_layernorm.weight"),
                   w.get(hf_layer(i, "post_attention_layernorm.weight"), {H}));
    const Tensor g = w.get(hf_layer(i, "mlp.gate_proj.weight"), {F, H});
    const Tensor u = w.get(hf_layer(i, "mlp.up_proj.weight"), {F, H});
    t.emplace_back(layer(i, "mlp.gate_up.weight"), take_rows(stack({&g, &u}), gate_up_row_map(c, tp, r)));
    t.emplace_back(layer(i, "mlp.down.weight"),
                   take_cols(w.get(hf_layer(i, "mlp.down_proj.weight"), {H, F}), F, tp, r));
  }
  t.emplace_back("final_layernorm.weight", w.get("model.norm.weight", {H}));
  t.emplace_back("output_layer.weight", take_rows(w.get("lm_head.weight", {V, H}), range_rows(V, tp, r)));
  return t;
}
}  // namespace

ModelConfig convert_hf_to_coc(const std::string& hf_dir, const std::string& save_dir, int tp, int pp) {
  const ModelConfig c = hf_llama_config(hf_dir);
  if (tp < 1) throw_invalid("--target-tensor-parallel-size must be >= 1 (got {})", tp);
  c.validate(tp);
  const PipelineLayout stages = target_pipeline_layout(c, pp);
  const HfWeights w(hf_dir);
  for (int r = 0; r < tp; ++r) {
    std::vector<std::pair<std::string, Tensor>> t = coc_tensors(w, c, tp, r);
    // Fresh Adam moments: the checkpoint resumes as a fine-tuning run from step 0.
    std::vector<Tensor> zeros;
    zeros.reserve(t.size());
    for (const auto& [name, x] : t) {
      zeros.emplace_back(x.shape());
      zeros.back().zero();
    }
    const std::string meta =
        json{{"iteration", 0},
             {"adam_step", 0},
             {"model", c.shape_flags()},
             {"model_config", json::parse(model_config_json(c))},
             {"converted_from", hf_dir},
             {"mesh", {{"tp", tp}, {"cp", 1}, {"ep", 1}, {"dp", 1}, {"tp_rank", r}, {"cp_rank", 0}, {"ep_rank", 0}}}}
            .dump();
    // One shard per pipeline stage (checkpoint.h, PipelineLayout), each with its tensors and their moments.
    for (int stage = 0; stage < stages.pp; ++stage) {
      CheckpointShard s;
      s.iteration = 0;
      s.config_hash = c.hash();
      s.tp_rank = r;
      s.tp_size = tp;
      s.dp_rank = checkpoint_stage_field(stage, 1, 0);
      s.meta_json = checkpoint_meta_for_stage(meta, stages, stage);
      for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq"})
        for (size_t i = 0; i < t.size(); ++i)
          if (checkpoint_stage_of(t[i].first, stages) == stage)
            s.tensors.emplace_back(t[i].first + suffix, *suffix ? &zeros[i] : &t[i].second);
      save_shard(save_dir, s);
    }
  }
  write_latest(save_dir, 0);
  return c;
}

namespace {
/// Reads shard `path` (TP rank `tp_rank`, last name field `field`, header `h`) whole through load_shard, which
/// checks its CRC first: an export must refuse a damaged file as `coc train --load` does (kCorrupt, exit 3), not
/// write its flipped bits out.
void verify_shard(const std::string& load_dir, const CheckpointInfo& info, int tp_rank, int field,
                  const SafetensorsHeader& h) {
  CheckpointShard s;
  s.tp_rank = tp_rank;
  s.tp_size = info.tp;
  s.dp_rank = field;
  s.config_hash = info.config_hash;
  std::vector<Tensor> scratch;
  scratch.reserve(h.tensors.size());
  for (const SafetensorsEntry& e : h.tensors) {
    scratch.emplace_back(e.shape);
    s.tensors.emplace_back(e.name, &scratch.back());
  }
  load_shard(load_dir, info.iteration, s);
}

/// Reassembles the full (unsharded) coc tensors, fp32, from the TP shards of one checkpoint, TP rank by TP rank (each
/// tensor from the pipeline stage shard that holds it: checkpoint_stage_of): column-parallel weights by their row
/// maps (qkv_row_map, gate_up_row_map, vocabulary ranges), row-parallel ones by their column ranges (split_rows),
/// replicated norms from TP rank 0.
class ShardMerger {
 public:
  ShardMerger(const ModelConfig& c, int tp, const PipelineLayout& layout) : c_(c), tp_(tp), layout_(layout) {}

  /// Adds TP rank `r`'s stage shards at `paths` (headers `hs`, already verified; one per stage of the layout, in
  /// stage order). Throws kInvalidArgument when a tensor is missing or its shape disagrees with the model config.
  void add(const std::vector<std::string>& paths, const std::vector<SafetensorsHeader>& hs, int r) {
    const int64_t H = c_.hidden_size, F = c_.ffn_hidden_size, V = c_.vocab_size, KV = c_.kv_heads() * c_.head_dim();
    const Shard s{paths, hs, r};
    put_rows(s, "embedding.weight", {V, H}, range_rows(V, tp_, r));
    for (int64_t i = 0; i < c_.num_layers; ++i) {
      put_whole(s, layer(i, "input_layernorm.weight"), H);
      put_rows(s, layer(i, "attention.qkv.weight"), {H + 2 * KV, H}, qkv_row_map(c_, tp_, r));
      put_cols(s, layer(i, "attention.dense.weight"), {H, H});
      put_whole(s, layer(i, "post_attention_layernorm.weight"), H);
      put_rows(s, layer(i, "mlp.gate_up.weight"), {2 * F, H}, gate_up_row_map(c_, tp_, r));
      put_cols(s, layer(i, "mlp.down.weight"), {H, F});
    }
    put_whole(s, "final_layernorm.weight", H);
    put_rows(s, "output_layer.weight", {V, H}, range_rows(V, tp_, r));
  }

  /// The full tensors by coc name, once every shard was added.
  const std::map<std::string, Tensor>& full() const { return full_; }

 private:
  struct Shard {
    const std::vector<std::string>& paths;  // one per stage
    const std::vector<SafetensorsHeader>& hs;
    int r;
  };

  Tensor& full_of(const std::string& name, std::vector<int64_t> shape) {
    auto it = full_.find(name);
    if (it == full_.end()) it = full_.emplace(name, Tensor(std::move(shape))).first;
    return it->second;
  }
  Tensor local(const Shard& s, const std::string& name) const {
    const auto stage = static_cast<size_t>(checkpoint_stage_of(name, layout_));
    const SafetensorsEntry* e = s.hs[stage].find(name);
    if (!e) throw_invalid("{} has no tensor '{}'; it is not a complete coc checkpoint", s.paths[stage], name);
    Tensor t;
    read_safetensors_tensor(s.paths[stage], s.hs[stage], *e, t);
    return t;
  }
  /// The file that holds `name` (for messages).
  const std::string& path_of(const Shard& s, const std::string& name) const {
    return s.paths[static_cast<size_t>(checkpoint_stage_of(name, layout_))];
  }
  void put_rows(const Shard& s, const std::string& name, std::vector<int64_t> shape,
                const std::vector<int64_t>& rows) {
    Tensor& f = full_of(name, shape);
    const Tensor l = local(s, name);
    const int64_t k = shape[1];
    if (l.numel() != static_cast<int64_t>(rows.size()) * k)
      throw_invalid("{}: tensor '{}' has shape {} but the model config implies {} rows of {}", path_of(s, name), name,
                    l.shape_str(), rows.size(), k);
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(l.data() + static_cast<int64_t>(i) * k, l.data() + static_cast<int64_t>(i + 1) * k,
                f.data() + rows[i] * k);
  }
  void put_cols(const Shard& s, const std::string& name, std::vector<int64_t> shape) {
    Tensor& f = full_of(name, shape);
    const Tensor l = local(s, name);
    const RowRange rr = split_rows(shape[1], tp_, s.r);
    if (l.numel() != shape[0] * rr.count)
      throw_invalid("{}: tensor '{}' has shape {} but the model config implies [{}, {}]", path_of(s, name), name,
                    l.shape_str(), shape[0], rr.count);
    for (int64_t i = 0; i < shape[0]; ++i)
      std::copy(l.data() + i * rr.count, l.data() + (i + 1) * rr.count, f.data() + i * shape[1] + rr.begin);
  }
  void put_whole(const Shard& s, const std::string& name, int64_t n) {
    if (s.r == 0) full_of(name, {n}) = local(s, name);
  }

  const ModelConfig& c_;
  const int tp_;
  const PipelineLayout layout_;
  std::map<std::string, Tensor> full_;
};

/// The full coc tensors under their Hugging Face LLaMA names, q/k/v and gate/up split back.
std::vector<std::pair<std::string, Tensor>> hf_tensors(const std::map<std::string, Tensor>& full,
                                                       const ModelConfig& c) {
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, KV = c.kv_heads() * c.head_dim();
  std::vector<std::pair<std::string, Tensor>> out;
  auto rows_of = [](const Tensor& t, int64_t begin, int64_t count) {
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < count; ++i) rows.push_back(begin + i);
    return take_rows(t, rows);
  };
  out.emplace_back("model.embed_tokens.weight", full.at("embedding.weight"));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const Tensor& qkv = full.at(layer(i, "attention.qkv.weight"));
    const Tensor& gu = full.at(layer(i, "mlp.gate_up.weight"));
    out.emplace_back(hf_layer(i, "input_layernorm.weight"), full.at(layer(i, "input_layernorm.weight")));
    out.emplace_back(hf_layer(i, "self_attn.q_proj.weight"), rows_of(qkv, 0, H));
    out.emplace_back(hf_layer(i, "self_attn.k_proj.weight"), rows_of(qkv, H, KV));
    out.emplace_back(hf_layer(i, "self_attn.v_proj.weight"), rows_of(qkv, H + KV, KV));
    out.emplace_back(hf_layer(i, "self_attn.o_proj.weight"), full.at(layer(i, "attention.dense.weight")));
    out.emplace_back(hf_layer(i, "post_attention_layernorm.weight"),
                     full.at(layer(i, "post_attention_layernorm.weight")));
    out.emplace_back(hf_layer(i, "mlp.gate_proj.weight"), rows_of(gu, 0, F));
    out.emplace_back(hf_layer(i, "mlp.up_proj.weight"), rows_of(gu, F, F));
    out.emplace_back(hf_layer(i, "mlp.down_proj.weight"), full.at(layer(i, "mlp.down.weight")));
  }
  out.emplace_back("model.norm.weight", full.at("final_layernorm.weight"));
  out.emplace_back("lm_head.weight", full.at("output_layer.weight"));
  return out;
}

/// PyTorch's name of `t`, as config.json's torch_dtype holds it (transformers loads torch_dtype="auto" with it).
const char* torch_dtype_name(DType t) {
  return t == DType::kBF16 ? "bfloat16" : t == DType::kF16 ? "float16" : "float32";
}

/// Writes `hf_dir`/model.safetensors (the tensors, stored as `dtype`) and `hf_dir`/config.json (LlamaForCausalLM,
/// torch_dtype to match) for config `c`. Throws kInvalidArgument when the folder cannot be created, kIo when
/// config.json cannot be written.
void write_hf_folder(const std::string& hf_dir, const std::vector<std::pair<std::string, Tensor>>& out,
                     const ModelConfig& c, DType dtype) {
  std::error_code ec;
  fs::create_directories(hf_dir, ec);
  if (!fs::is_directory(hf_dir, ec)) throw_invalid("--save-dir {}: cannot create the folder", hf_dir);
  std::vector<std::pair<std::string, const Tensor*>> refs;
  for (const auto& [name, t] : out) refs.emplace_back(name, &t);
  write_safetensors(hf_dir + "/model.safetensors", refs, {{"format", "pt"}}, dtype);
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"model_type", "llama"},
                       {"hidden_size", c.hidden_size},
                       {"intermediate_size", c.ffn_hidden_size},
                       {"num_hidden_layers", c.num_layers},
                       {"num_attention_heads", c.num_attention_heads},
                       {"num_key_value_heads", c.kv_heads()},
                       {"vocab_size", c.vocab_size},
                       {"max_position_embeddings", c.seq_length},
                       {"rms_norm_eps", decimal(c.norm_epsilon)},
                       {"rope_theta", decimal(c.rotary_base)},
                       {"hidden_act", "silu"},
                       {"tie_word_embeddings", false},
                       {"attention_bias", false},
                       {"torch_dtype", torch_dtype_name(dtype)}};
  std::ofstream f(hf_dir + "/config.json");
  f << config.dump(2) << "\n";
  if (!f) throw_error(ErrorKind::kIo, "cannot write {}/config.json", hf_dir);
}
}  // namespace

ModelConfig convert_coc_to_hf(const std::string& load_dir, const std::string& hf_dir, DType dtype) {
  safetensors_dtype_name(dtype);  // refuses int8 before the shards are read
  const CheckpointInfo info = read_checkpoint_info(load_dir);
  const ModelConfig& c = info.config;
  if (c.is_moe())
    throw_invalid("{} holds a mixture-of-experts model ({} experts): coc convert writes dense LLaMA checkpoints only",
                  checkpoint_shard_path(load_dir, info.iteration, 0, 0), c.num_experts);
  ShardMerger merged(c, info.tp, info.layout);
  for (int r = 0; r < info.tp; ++r) {
    const std::vector<std::string> paths = checkpoint_stage_paths(load_dir, info, r, 0);
    std::vector<SafetensorsHeader> hs;
    for (int stage = 0; stage < info.layout.pp; ++stage) {
      hs.push_back(read_safetensors_header(paths[static_cast<size_t>(stage)]));
      verify_shard(load_dir, info, r, checkpoint_stage_field(stage, 1, 0), hs.back());
    }
    merged.add(paths, hs, r);
  }
  write_hf_folder(hf_dir, hf_tensors(merged.full(), c), c, dtype);
  return c;
}

}  // namespace coc
