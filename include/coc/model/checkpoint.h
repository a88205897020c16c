// Sharded training checkpoints, laid out like Megatron-LM's (megatron/training/checkpointing.py):
//
//   <save>/latest_checkpointed_iteration.txt          "100\n": the newest complete checkpoint
//   <save>/iter_0000100/mp_rank_00_dp_000.ckpt         TP rank 0's shard
//   <save>/iter_0000100/mp_rank_01_dp_000.ckpt         TP rank 1's shard
//
// Megatron names shards mp_rank_<tp:02d>[_<pp:03d>]; coc's last field (named dp in the API for history) is
// checkpoint_stage_field: the pipeline stage × ep size + the ep rank, so 000 without pipelining or experts.
// Parameters and Adam state are replicated over dp (a sharded optimizer gathers them first), so only dp rank 0 of
// each (tp, stage, ep) group writes, and every dp rank loads that shard: saving costs one copy of the model, not dp
// copies. These functions do no MPI: the trainer decides who writes and calls write_latest() only after a barrier
// confirms that every shard is on disk.
//
// File format: each shard is a safetensors file (model/safetensors.h), so any safetensors reader opens it. Tensors
// are F32, in the caller's order; "__metadata__" holds coc's fields as strings: "format" = "coc", "format_version",
// "iteration", "config_hash", "tp_rank", "tp_size", "dp_rank", "meta" (the caller's string) and "coc_crc32", the
// zlib crc32 (8 hex digits) of the whole file computed with those 8 digits read as "00000000", so that a truncated
// or bit-flipped file fails loudly instead of resuming from garbage.
//
// Before safetensors (format version 1), a shard was "COCCKPT1", u32 version, u32 header length, a JSON header, data
// aligned to 64 bytes and a trailing CRC32. load_shard still reads such a file, with a warning; the next save of the
// run writes safetensors.
// Writes are atomic: data goes to "<file>.tmp.<pid>", is fflush()ed and fsync()ed, renamed over the final
// name, and the folder is fsync()ed, so the final name only ever names a complete file, even after a crash or
// power loss. Leftover .tmp files from a crashed save are never read (loaders open exact names only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coc/core/tensor.h"

namespace coc {

/// "format_version" in a shard's metadata; bumped on any incompatible change of the layout above.
inline constexpr uint32_t kCheckpointFormatVersion = 2;

/// One rank's part of a checkpoint.
///
/// Saving: every field is written; `tensors` point at the data to save (not owned, read only).
/// Loading: the caller fills tp_rank, tp_size, dp_rank (the file to read), config_hash (what this run expects)
/// and `tensors` with the names and already-allocated tensors of the expected shapes, and may set meta_json to
/// this run's description (quoted beside the file's when the model configs differ); load_shard() sets iteration
/// and meta_json from the file and overwrites each tensor's data in place.
struct CheckpointShard {
  int64_t iteration = 0;     ///< training iterations completed when saved (>= 0)
  uint64_t config_hash = 0;  ///< hash of the model-shaping config (layers, hidden size, heads, ...); must match
  int tp_rank = 0;           ///< tensor-parallel rank whose shards these are, in [0, tp_size)
  int tp_size = 1;           ///< --tensor-model-parallel-size the shards were cut for
  int dp_rank = 0;           ///< data-parallel rank in the file name; 0 with replicated optimizer state
  std::string meta_json;     ///< opaque to this layer: args, RNG seeds, LR-scheduler step, consumed samples, ...
  /// (stable name, tensor) pairs, e.g. {"layers.3.attention.qkv.weight", &p.value}, {"adam.m.layers.3...", &m}.
  /// Names must be unique and non-empty. Any fp32 shape, including scalars ([] = 1 element) and empty tensors.
  std::vector<std::pair<std::string, Tensor*>> tensors;
  /// Loading only: the file may hold tensors that `tensors` does not name, and they are skipped (a pipeline stage
  /// reading its layers from the shards of another pipeline layout). Every named tensor must still be there.
  bool partial = false;
};

/// Where a pipelined checkpoint keeps its tensors (docs/pipeline.md, "Checkpoints"): `pp` stages and the layers of
/// each of its pp·V virtual stages in order (virtual stage v is model chunk v / pp of stage v mod pp; with V = 1 one
/// entry per stage). A checkpoint saved without pipelining is {1, {num_layers}}. coc train records it in each
/// shard's meta as mesh.pp and mesh.pp_layers; stage s writes the shard whose last name field is
/// checkpoint_stage_field(s, ep size, ep rank).
struct PipelineLayout {
  int pp = 1;
  std::vector<int> layers;
  bool operator==(const PipelineLayout&) const = default;
};

/// The layout recorded in a shard's meta JSON (`meta_json`, CheckpointShard::meta_json): its mesh.pp and
/// mesh.pp_layers, or {1, {num_layers}} when it records none (saved without pipelining) or is not JSON.
PipelineLayout checkpoint_pipeline_layout(const std::string& meta_json, int64_t num_layers);

/// The stage whose shard holds checkpoint tensor `name` (a parameter or one of its Adam moments, named
/// "<param>.exp_avg[_sq]") under `layout`: "layers.<i>...." the stage of layer i's virtual stage, "embedding..."
/// stage 0, anything else (the final norm, the output layer) stage pp - 1. Parameter names are global, so a tensor
/// has the same name and shape at every pipeline layout; a layer index beyond the layout's layers gives pp - 1
/// (whose shard then reports the tensor missing).
int checkpoint_stage_of(const std::string& name, const PipelineLayout& layout);

/// The last field of the shard name of pipeline stage `stage` and expert-parallel rank `ep_rank` of `ep_size`
/// (coc's dp field: replicas over dp hold the same state, so only these ranks write).
inline int checkpoint_stage_field(int stage, int ep_size, int ep_rank) { return stage * ep_size + ep_rank; }

/// "<save>/iter_0000100": the folder of one iteration's shards (Megatron's 7-digit, zero-padded name).
std::string checkpoint_iteration_dir(const std::string& save_dir, int64_t iteration);
/// The fix named by every corrupt-checkpoint error: delete iteration `iteration`'s folder and point the latest
/// file at an earlier iteration.
std::string checkpoint_recovery_hint(const std::string& save_dir, int64_t iteration);

/// "<save>/iter_0000100/mp_rank_01_dp_000.ckpt": the file of one shard.
std::string checkpoint_shard_path(const std::string& save_dir, int64_t iteration, int tp_rank, int dp_rank);

/// Atomically writes `shard` to checkpoint_shard_path(save_dir, shard.iteration, shard.tp_rank, shard.dp_rank),
/// creating the folders as needed (concurrent calls from other ranks creating the same folders are fine) and
/// replacing any earlier file of that name only once the new one is complete and synced.
///
/// Errors: kInvalidArgument (uniform) for a malformed shard (negative iteration, tp_rank outside [0, tp_size),
/// empty or duplicate tensor name, null tensor); kIo (per rank) when a folder cannot be created or the file
/// cannot be written, synced or renamed (e.g. disk full), naming the path and the OS error. On error the
/// temporary file is removed and no final file is created or changed.
void save_shard(const std::string& save_dir, const CheckpointShard& shard);

/// Reads checkpoint_shard_path(save_dir, iteration, into.tp_rank, into.dp_rank) into `into` (see
/// CheckpointShard). The whole file is CRC-checked before any tensor is touched, so on any error every tensor
/// of `into` is left unchanged.
///
/// Errors (all per rank, via throw_error, because different ranks read different files):
///   kIo              the file is missing (the message lists the TP ranks found in that folder, which reveals a
///                    --tensor-model-parallel-size change) or cannot be read;
///   kCorrupt         bad magic, unknown format version, truncated, trailing bytes, CRC mismatch, an unreadable
///                    or inconsistent header: "checkpoint <path> is corrupt (CRC mismatch ...); delete <iter dir>
///                    and set <save>/latest_checkpointed_iteration.txt to an earlier iteration to resume from";
///   kInvalidArgument the file is intact but does not fit this run: different tp_size ("checkpoint was saved
///                    with --tensor-model-parallel-size 2"), different config_hash, a tensor missing from the file
///                    or the file holding a tensor this run does not expect, or a shape mismatch (naming the
///                    tensor, the expected and the found shape).
void load_shard(const std::string& save_dir, int64_t iteration, CheckpointShard& into);

/// Atomically writes "<iteration>\n" to "<save>/latest_checkpointed_iteration.txt" (same tmp + fsync + rename
/// + folder fsync protocol as save_shard). Call once, on one rank, after every shard of `iteration` is saved.
/// Errors: kInvalidArgument (uniform) for iteration < 0; kIo if the file cannot be written.
void write_latest(const std::string& save_dir, int64_t iteration);

/// The iteration named by "<save>/latest_checkpointed_iteration.txt", or nullopt if that file (or the folder)
/// does not exist, i.e. there is nothing to resume from. Errors: kIo if it exists but cannot be read; kCorrupt
/// if it does not hold a single non-negative integer (Megatron's "release" marker is not supported).
std::optional<int64_t> read_latest(const std::string& save_dir);

}  // namespace coc
