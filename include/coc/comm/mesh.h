// The parallel layout: every rank's coordinates and every named process group, built once from the world and the
// parallel sizes (Megatron-core's RankGenerator and ProcessGroupCollection, megatron/core/parallel_state.py).
//
// Terms. The world of W ranks is a dense mesh tp × cp × dp (tp innermost: the ranks of one TP group are adjacent,
// which keeps TP traffic on a node), and, for the experts of a MoE layer, a second view of the same ranks,
// tp × ep × expert-dp, where ep subdivides the dense dp × cp ranks:
//   world rank w = tp_rank + tp · (cp_rank + cp · dp_rank)             (dense, order "tp-cp-dp")
//                = tp_rank + tp · (ep_rank + ep · expert_dp_rank)      (expert, order "tp-ep-dp")
// A group is the set of ranks whose coordinates differ only along the named dimensions. The groups:
//   tp         tensor parallel (the CoC ops of the linear layers)
//   cp         context parallel (ring attention)
//   dp         data parallel
//   dp_cp      data × context parallel: where dense gradients are reduced (Megatron's get_data_parallel_group(
//              with_context_parallel=True))
//   ep         expert parallel (MoE all-to-all)
//   expert_dp  data parallel of the experts: where expert gradients are reduced
//   model_parallel         the ranks that hold different shards of one dense replica (tp; Megatron's tp × pp,
//                          coc has no pipeline parallelism)
//   expert_model_parallel  the same for expert weights (tp × ep)
//   world
// Pipeline parallelism does not exist in coc, so pp = 1 everywhere.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"

namespace coc {

/// The parallel sizes of a run. dp and expert_dp follow from the world size (dense_dp, expert_dp).
struct MeshSizes {
  int tp = 1;  ///< --tensor-model-parallel-size
  int cp = 1;  ///< --context-parallel-size
  int ep = 1;  ///< --expert-model-parallel-size
};

/// One dimension of a mesh, for RankGenerator tokens ("tp", "cp", "dp", "ep").
enum class MeshDim { kTp, kCp, kDp, kEp };

/// A rank's position along every dimension of both views.
struct MeshCoords {
  int tp = 0, cp = 0, dp = 0;  ///< dense view
  int ep = 0, expert_dp = 0;   ///< expert view (the tp coordinate is shared)
};

/// Pure rank arithmetic, no MPI: the groups of one view of the mesh (Megatron's RankGenerator.get_ranks).
/// `sizes` are the dimensions from innermost to outermost, e.g. {tp, cp, dp}; their product is the world size.
/// groups(mask) returns every group of ranks that differ only along the dimensions where mask is true: W / (the
/// product of the masked sizes) groups, each listing its world ranks in ascending coordinate order (which is
/// ascending rank order). This is Megatron's generate_masked_orthogonal_rank_groups.
std::vector<std::vector<int>> mesh_groups(const std::vector<int>& sizes, const std::vector<bool>& mask);

/// Checks the sizes against the world and returns dp = W / (tp · cp). Throws a uniform kInvalidArgument error
/// naming the sizes and the rule when a size is < 1, when tp · cp does not divide W, or when ep does not divide
/// dp · cp ("expert parallelism subdivides the data- and context-parallel ranks").
int mesh_dense_dp(int world_size, const MeshSizes& s);

/// The coordinates of world rank `w` (pure; assumes mesh_dense_dp accepted the sizes).
MeshCoords mesh_coords(int world_size, const MeshSizes& s, int w);

/// The groups of one run, each a Communicator of its own (an MPI_Comm_split of the world). Build it with make_mesh.
/// Layers and ops receive the group they run on (Megatron-core's injected process groups); nothing looks a group
/// up globally.
struct Mesh {
  MeshSizes sizes;
  int dp_size_ = 1, expert_dp_size_ = 1;
  MeshCoords coords;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp, cp, dp, dp_cp, ep, expert_dp;
  std::unique_ptr<Communicator> model_parallel, expert_model_parallel;

  int tp_size() const { return sizes.tp; }
  int cp_size() const { return sizes.cp; }
  int ep_size() const { return sizes.ep; }
  int dp_size() const { return dp_size_; }
  int expert_dp_size() const { return expert_dp_size_; }
  int tp_rank() const { return coords.tp; }
  int cp_rank() const { return coords.cp; }
  int dp_rank() const { return coords.dp; }
  int ep_rank() const { return coords.ep; }
  int expert_dp_rank() const { return coords.expert_dp; }
  /// "tp 1/2, cp 0/1, dp 1/2, ep 0/1, expert-dp 1/2": this rank's coordinates, as `coc train -v` logs them.
  std::string describe() const;
};

/// Builds every group over the world (collective over MPI_COMM_WORLD: every rank must call it with the same
/// sizes). The groups share one progress engine. Throws mesh_dense_dp's errors before any group is made.
Mesh make_mesh(const MeshSizes& sizes, const CommOptions& opts);

}  // namespace coc
