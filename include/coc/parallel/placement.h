// Where a parameter lives on the mesh and where its gradient goes (Megatron's tensor attributes
// `tensor_model_parallel`, `sequence_parallel` and `allreduce`, made into one value). The gradient synchronisation
// and the gradient norm (grad_sync.h) walk these placements; nothing else decides over which group a gradient is
// reduced.
#pragma once

#include <string>

#include "coc/comm/mesh.h"

namespace coc {

/// A named group of the mesh (mesh.h), for placements and for code that is handed a group by name.
enum class MeshGroup { kWorld, kTp, kCp, kDp, kDpCp, kEp, kExpertDp, kModelParallel, kExpertModelParallel };
const char* to_string(MeshGroup g);
/// The communicator of `g` in `mesh`.
Communicator& group_of(Mesh& mesh, MeshGroup g);

struct Placement {
  /// True when the ranks of a TP group hold different slices of the full tensor (column/row weights, the
  /// vocabulary shards of the embedding and output layer). False when every TP rank holds the whole tensor (norm
  /// weights, a row layer's bias): the grad norm then counts it on TP rank 0 only.
  bool tp_sharded = true;
  /// True for expert weights: the ranks of an EP group hold different experts (MoE).
  bool ep_sharded = false;
  /// Under sequence parallelism a TP-replicated weight applied to the sequence shard (the norms) sees only this
  /// rank's tokens, so its gradient is a partial sum over TP (Megatron's `sequence_parallel` attribute): summed
  /// over TP before the data-parallel mean. Set at construction when SP is on.
  bool tp_partial_grad = false;
  /// The replicas whose gradients are summed (then scaled to the global-batch mean, grad_sync.h): dp × cp for
  /// dense parameters (every cp rank sees other tokens of the same sequences), expert-dp for expert weights.
  MeshGroup replicas = MeshGroup::kDpCp;

  /// A TP-sharded dense weight (the default).
  static Placement tp_shard() { return {}; }
  /// A weight every TP rank holds whole; `sp_partial` when it acts on the sequence shard under SP.
  static Placement tp_replicated(bool sp_partial) { return {false, false, sp_partial, MeshGroup::kDpCp}; }
  /// An expert weight: sharded over ep (and tp when `tp_sharded`), reduced over expert-dp.
  static Placement expert(bool tp_sharded) { return {tp_sharded, true, false, MeshGroup::kExpertDp}; }
  /// "tp-sharded, mean over dp-cp", for logs and tests.
  std::string describe() const;
};

}  // namespace coc
