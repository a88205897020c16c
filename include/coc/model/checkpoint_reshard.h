// A coc checkpoint's stage shards read as one model, and re-cut for another pipeline layout (`coc convert --loader
// coc --saver coc --target-pipeline-parallel-size P`, as Megatron's tools/checkpoint/convert.py re-shards an mcore
// checkpoint with the mcore loader and saver). A pipelined checkpoint keeps each stage's tensors under their global
// names in a shard of its own (checkpoint.h, PipelineLayout), so re-cutting moves whole tensors between files: no
// value changes; the Adam moments, the iteration and the metadata (optimizer step, loss scaler, seed) go along, and
// `coc train --load` resumes from the result bit for bit. tp and ep stay as saved. No MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/model/checkpoint.h"
#include "coc/model/model_config.h"

namespace coc {

/// What a checkpoint's first shard (TP rank 0, stage 0, ep rank 0 of the latest iteration) says about all of them.
struct CheckpointInfo {
  int64_t iteration = 0;
  uint64_t config_hash = 0;  ///< CheckpointShard::config_hash of its shards
  ModelConfig config;
  int tp = 1;             ///< --tensor-model-parallel-size it was saved with
  int ep = 1;             ///< --expert-model-parallel-size it was saved with (its shards: stage × ep + ep rank)
  PipelineLayout layout;  ///< its stages and their layers
  std::string meta;       ///< the first shard's meta JSON (CheckpointShard::meta_json)
};

/// The latest checkpoint of `load_dir`, from its first shard's metadata. Errors (kInvalidArgument, one line naming
/// --load-dir and the fix): no latest_checkpointed_iteration.txt, no first shard, a shard without its model_config
/// (saved by an older coc); read_safetensors_header's (kIo, kCorrupt) for an unreadable first shard.
CheckpointInfo read_checkpoint_info(const std::string& load_dir);

/// The shard file of each pipeline stage (in stage order) of TP rank `tp_rank` and ep rank `ep_rank` of `info`'s
/// iteration. kInvalidArgument when one is missing, naming the file, its stage and the layout it was saved with.
std::vector<std::string> checkpoint_stage_paths(const std::string& load_dir, const CheckpointInfo& info, int tp_rank,
                                                int ep_rank);

/// The layout coc convert writes at `pp` stages: num_layers / pp layers each (Megatron's converter splits evenly
/// too; coc train --load reads a checkpoint at any split or V). kInvalidArgument naming --target-pipeline-parallel-size
/// and the fix for pp < 1, pp above the number of layers or not dividing it.
PipelineLayout target_pipeline_layout(const ModelConfig& c, int pp);

/// `meta_json` (a shard's meta, a JSON object) with its "mesh" object's pipeline fields for stage `stage` of
/// `layout`, as coc train writes them (pp, pp_rank, pp_layers, pp_virtual_stages = layout.layers.size() / pp), or
/// without them when layout.pp == 1.
std::string checkpoint_meta_for_stage(const std::string& meta_json, const PipelineLayout& layout, int stage);

/// Writes the latest checkpoint of `load_dir` to `save_dir` at `pp` stages (target_pipeline_layout), the same
/// iteration, every tensor (parameters and Adam moments) of every tp and ep rank, and its latest file; returns the
/// source's info. Each source shard is read whole through load_shard, so a damaged one is refused (kCorrupt)
/// before anything is written for its rank. Holds one tp and ep rank's tensors (all stages) in memory at a time.
/// Errors: those of the functions above, load_shard's and save_shard's; kInvalidArgument when a stage shard records
/// another layout than the first shard (the folder mixes checkpoints) or two stage shards hold the same tensor.
CheckpointInfo reshard_checkpoint_pipeline(const std::string& load_dir, const std::string& save_dir, int pp);

}  // namespace coc
