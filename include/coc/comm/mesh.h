// The parallel layout: every rank's coordinates and every named process group, built once from the world and the
// parallel sizes (Megatron-core's RankGenerator and ProcessGroupCollection, megatron/core/parallel_state.py).
//
// Terms.
//   dimension  one parallel size: tp, cp, ep, dp, pp (MeshDim). World = tp × cp × dp × pp.
//   order      Megatron's order string, innermost dimension first: "tp-cp-ep-dp-pp" (kMeshOrder). tp innermost keeps
//              the ranks of a TP group adjacent (TP traffic stays on a node); pp outermost.
//   view       the order with the sizes of one kind of layer (MeshView). The dense view drops ep: "tp-cp-dp-pp";
//              the expert view (a MoE layer's experts) drops cp and reads dp as expert-dp: "tp-ep-dp-pp", where
//              ep × expert-dp subdivides the dense cp × dp ranks. With the default order:
//                world rank w = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank))             (dense)
//                             = tp_rank + tp·(ep_rank + ep·(expert_dp_rank + expert_dp·pp_rank)) (expert)
//   group      the ranks whose coordinates in one view differ only along a set of dimensions (GroupSpec). The
//              named groups (process_group_table):
//     world                  every rank
//     tp                     tensor parallel (the CoC ops of the linear layers)
//     cp                     context parallel (ring attention)
//     dp                     data parallel
//     dp-cp                  data × context parallel: where dense gradients are reduced (Megatron's
//                            get_data_parallel_group(with_context_parallel=True))
//     model-parallel         the ranks holding different shards of one dense replica (tp × pp)
//     ep                     expert parallel (MoE all-to-all)
//     expert-dp              data parallel of the experts: where expert gradients are reduced
//     expert-model-parallel  the same as model-parallel for expert weights (tp × ep × pp)
//     pp                     pipeline parallel (the stages; model/pipeline_schedule.h)
// Steps (make_mesh): check the sizes against the world (mesh_dense_dp); build both views from the order
// (mesh_layout); for each row of the group table, in the table's order, list the groups of its dimensions in its
// view (mesh_groups: Megatron's generate_masked_orthogonal_rank_groups) and split the world into them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "coc/comm/communicator.h"

namespace coc {

/// The parallel sizes of a run. dp and expert_dp follow from the world size (mesh_dense_dp, MeshView::size).
struct MeshSizes {
  int tp = 1;  ///< --tensor-model-parallel-size
  int cp = 1;  ///< --context-parallel-size
  int ep = 1;  ///< --expert-model-parallel-size
  int pp = 1;  ///< --pipeline-model-parallel-size (model/pipeline_schedule.h)
};

/// One dimension of the layout: a token of the order string. kExpertDp is the token "dp" of the expert view.
enum class MeshDim { kTp, kCp, kEp, kDp, kExpertDp, kPp };

/// "tp", "cp", "ep", "dp", "expert-dp", "pp": the dimension's name in logs and errors.
const char* to_string(MeshDim d);

/// Megatron-core's default order (initialize_model_parallel's `order`), innermost first.
inline constexpr std::string_view kMeshOrder = "tp-cp-ep-dp-pp";

/// The five dimensions of an order string such as "tp-cp-ep-dp-pp", innermost first (dp is kDp). Throws a uniform
/// kInvalidArgument error naming the order when a token is unknown, repeated or missing, or when cp, ep and dp are
/// not adjacent (ep × expert-dp must subdivide the cp × dp ranks, so that tp and pp mean the same in both views).
std::vector<MeshDim> parse_mesh_order(std::string_view order);

/// One view of the world (Megatron's RankGenerator): its dimensions innermost first and their sizes, whose product
/// is the world size.
struct MeshView {
  std::vector<MeshDim> dims;
  std::vector<int> sizes;

  /// The view's order string as Megatron spells it: "tp-cp-dp-pp" (dense), "tp-ep-dp-pp" (expert).
  std::string order() const;
  /// The size of `d`; 1 when the view lacks it.
  int size(MeshDim d) const;
  /// World rank `w`'s coordinate along `d`; 0 when the view lacks it.
  int coord(int w, MeshDim d) const;
  /// mesh_groups over the dimensions `of` (each must be in the view; kInternal error otherwise).
  std::vector<std::vector<int>> groups(const std::vector<MeshDim>& of) const;
};

/// Both views of one run.
struct MeshLayout {
  MeshView dense;   ///< the order without ep
  MeshView expert;  ///< the order without cp, dp read as expert-dp

  /// The groups over the dimensions `of`, in the expert view when they name ep or expert-dp, else the dense one.
  std::vector<std::vector<int>> groups(const std::vector<MeshDim>& of) const;
};

/// Checks the sizes (mesh_dense_dp) and the order (parse_mesh_order) and builds both views. Throws their errors.
MeshLayout mesh_layout(int world_size, const MeshSizes& s, std::string_view order = kMeshOrder);

/// Pure rank arithmetic, no MPI: the groups of one view of the mesh (Megatron's RankGenerator.get_ranks).
/// `sizes` are the dimensions from innermost to outermost, e.g. {tp, cp, dp, pp}; their product is the world size.
/// groups(mask) returns every group of ranks that differ only along the dimensions where mask is true: W / (the
/// product of the masked sizes) groups, each listing its world ranks in ascending coordinate order (which is
/// ascending rank order). This is Megatron's generate_masked_orthogonal_rank_groups.
std::vector<std::vector<int>> mesh_groups(const std::vector<int>& sizes, const std::vector<bool>& mask);

/// Checks the sizes against the world and returns dp = W / (tp · cp · pp). Throws a uniform kInvalidArgument error
/// naming the sizes and the rule when a size is < 1, when tp · cp · pp does not divide W, or when ep does not divide
/// dp · cp ("expert parallelism subdivides the data- and context-parallel ranks").
int mesh_dense_dp(int world_size, const MeshSizes& s);

/// A rank's position along every dimension of both views.
struct MeshCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0;  ///< dense view
  int ep = 0, expert_dp = 0;           ///< expert view (tp and pp are shared)
};

/// The coordinates of world rank `w` in the default order. Throws mesh_dense_dp's errors.
MeshCoords mesh_coords(int world_size, const MeshSizes& s, int w);

/// The named groups of the table (process_group_table), for the generic accessor ProcessGroups::group.
enum class GroupName { kWorld, kTp, kCp, kDp, kDpCp, kModelParallel, kEp, kExpertDp, kExpertModelParallel, kPp };

/// The groups a model's layers run on, non-owning (Megatron-core's ProcessGroupCollection as its modules receive it,
/// pg_collection). The Decoder and each TransformerLayer are given it at construction: the one way a group reaches
/// a layer. ProcessGroups::model_groups() takes it from the mesh; tests build it by hand. The groups must outlive
/// the model. Null: the model does not use that dimension.
struct ModelGroups {
  Communicator* tp = nullptr;  ///< tensor parallel: the linear layers' ops (the ParallelContext names the same one)
  Communicator* cp = nullptr;  ///< context parallel: ring attention (the CpRing is over this group)
  Communicator* ep = nullptr;  ///< expert parallel: the MoE dispatch (a MoE model needs it)
  /// Data × context parallel: the ranks whose tokens make up the global batch (the MoE aux loss; a MoE model needs
  /// it).
  Communicator* dp_cp = nullptr;
  /// Pipeline parallel: the stages, in order (pp rank = stage). Null or size 1: one stage holds the whole model.
  /// The Decoder takes its stage (pp rank) and its layers from it; the stage transfers run on links split from it
  /// (model/pipeline_schedule.h).
  Communicator* pp = nullptr;
};

/// The groups of one run, each a Communicator of its own (an MPI_Comm_split of the world); Megatron-core's
/// ProcessGroupCollection. Build it with make_mesh. Layers and ops receive the group they run on (Megatron-core's
/// injected process groups); nothing looks a group up globally.
struct ProcessGroups {
  MeshSizes sizes;
  MeshLayout layout;  ///< both views, in the default order
  int dp_size_ = 1, expert_dp_size_ = 1;
  MeshCoords coords;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp, cp, dp, dp_cp, ep, expert_dp, pp;
  std::unique_ptr<Communicator> model_parallel, expert_model_parallel;

  int tp_size() const { return sizes.tp; }
  int cp_size() const { return sizes.cp; }
  int ep_size() const { return sizes.ep; }
  int pp_size() const { return sizes.pp; }
  int dp_size() const { return dp_size_; }
  int expert_dp_size() const { return expert_dp_size_; }
  int tp_rank() const { return coords.tp; }
  int cp_rank() const { return coords.cp; }
  int dp_rank() const { return coords.dp; }
  int pp_rank() const { return coords.pp; }
  int ep_rank() const { return coords.ep; }
  int expert_dp_rank() const { return coords.expert_dp; }
  /// The groups the model's layers run on, pointing into this object.
  ModelGroups model_groups() const { return {tp.get(), cp.get(), ep.get(), dp_cp.get(), pp.get()}; }
  /// The communicator of `g`. kInternal error when make_mesh did not build it.
  Communicator& group(GroupName g);
  /// "tp 1/2, cp 0/1, dp 1/2, pp 0/1, ep 0/1, expert-dp 1/2": this rank's coordinates, as `coc train -v` logs them.
  std::string describe() const;
};
using Mesh = ProcessGroups;

/// One row of the group table: the ranks whose coordinates in the view differ only along `dims` (the expert view
/// when `dims` names ep or expert-dp), the communicator's name (traces and analysis show it) and its member.
struct GroupSpec {
  GroupName group;
  const char* name;
  std::vector<MeshDim> dims;
  std::unique_ptr<Communicator> ProcessGroups::*member;
};

/// Every named group, in the order make_mesh builds them (world first).
const std::vector<GroupSpec>& process_group_table();

/// Builds every group over the world (collective over MPI_COMM_WORLD: every rank must call it with the same
/// sizes). The groups share one progress engine. Throws mesh_dense_dp's errors before any group is made.
ProcessGroups make_mesh(const MeshSizes& sizes, const CommOptions& opts);

}  // namespace coc
