// Conversion between Hugging Face's LLaMA layout and coc checkpoints (`coc convert`; Megatron's
// tools/checkpoint/convert.py with the llama loader and the mcore saver, and back).
//
// Hugging Face side: a folder with config.json (model_type "llama" or "mistral", hidden_act "silu", untied
// embeddings, no biases, no rope_scaling) and model.safetensors or model.safetensors.index.json with its shards.
// Names and layouts ([out, in] everywhere, as coc):
//   model.embed_tokens.weight [V, H]                       → embedding.weight (rows split over tp)
//   model.layers.i.input_layernorm.weight [H]              → layers.i.input_layernorm.weight
//   model.layers.i.self_attn.{q,k,v}_proj.weight           → layers.i.attention.qkv.weight: q [H, H], k and v
//     ([KV, H], KV = num_key_value_heads × head_dim)          [KV, H] stacked, each rank holding whole heads/groups
//   model.layers.i.self_attn.o_proj.weight [H, H]          → layers.i.attention.dense.weight (columns split)
//   model.layers.i.post_attention_layernorm.weight [H]     → layers.i.post_attention_layernorm.weight
//   model.layers.i.mlp.{gate,up}_proj.weight [F, H]        → layers.i.mlp.gate_up.weight (gate, then up)
//   model.layers.i.mlp.down_proj.weight [H, F]             → layers.i.mlp.down.weight (columns split)
//   model.norm.weight [H]                                  → final_layernorm.weight
//   lm_head.weight [V, H]                                  → output_layer.weight (rows split)
// Both use RoPE's rotate-half form, so q and k need no permutation. Weights are read as F32, F16 or BF16. A coc
// checkpoint holds them as F32 (the master weights, so that a --bf16 run resumes bit for bit); a Hugging Face
// folder as F32, BF16 or F16 (`--hf-dtype`: rounded to nearest even from the fp32 masters, as PyTorch's
// .to(torch.bfloat16) rounds). A coc checkpoint made here is at iteration 0 with zero Adam moments, ready for
// `coc train --load DIR` with the flags convert prints. No MPI.
#pragma once

#include <string>

#include "coc/core/dtype.h"
#include "coc/model/model_config.h"

namespace coc {

/// The ModelConfig of a Hugging Face config.json. Errors (uniform kInvalidArgument): a missing or unreadable file,
/// or a shape coc cannot express, naming the field and why (tied embeddings, biases, rope_scaling, another
/// activation, a head_dim other than hidden_size / heads, heads not a multiple of the key/value heads).
ModelConfig hf_llama_config(const std::string& hf_dir);

/// Writes the Hugging Face LLaMA model in `hf_dir` as a coc checkpoint of `tp` shards at iteration 0 in `save_dir`
/// (and its latest_checkpointed_iteration.txt), cut into `pp` pipeline stages of num_layers / pp layers each
/// (target_pipeline_layout; each stage's shard holds its layers, stage 0 the embedding, stage pp - 1 the final norm
/// and the output layer, as coc train --save at that pp writes them). Returns the model's config. Errors:
/// hf_llama_config's; a tp the model cannot be split over (ModelConfig::validate); a pp it cannot be cut into
/// (target_pipeline_layout's); a missing tensor or one of the wrong shape, naming it (kInvalidArgument);
/// unreadable files (kIo, kCorrupt).
ModelConfig convert_hf_to_coc(const std::string& hf_dir, const std::string& save_dir, int tp, int pp = 1);

/// Writes the latest checkpoint of `load_dir` (all its tp shards, and all pipeline stage shards of each: saved at
/// any pp, layer split or V) as a Hugging Face LLaMA folder `hf_dir`: config.json (torch_dtype "float32", "bfloat16"
/// or "float16") and model.safetensors with every tensor stored as `dtype` (F32, BF16 or F16; the 16-bit types
/// round to nearest even). Returns the model's config. Errors: no checkpoint, a shard missing (a stage's named
/// with its stage: checkpoint_stage_paths) or not a safetensors shard, a shard without its model config (saved
/// before coc recorded it) or missing a tensor, a mixture-of-experts model; dtype kInt8 (kInvalidArgument, before
/// anything is read or written).
ModelConfig convert_coc_to_hf(const std::string& load_dir, const std::string& hf_dir, DType dtype = DType::kF32);

}  // namespace coc
