#include "coc/parallel/placement.h"

#include <fmt/format.h>

#include "coc/core/error.h"

namespace coc {

const char* to_string(MeshGroup g) {
  switch (g) {
    case MeshGroup::kWorld: return "world";
    case MeshGroup::kTp: return "tp";
    case MeshGroup::kCp: return "cp";
    case MeshGroup::kDp: return "dp";
    case MeshGroup::kDpCp: return "dp-cp";
    case MeshGroup::kEp: return "ep";
    case MeshGroup::kExpertDp: return "expert-dp";
    case MeshGroup::kModelParallel: return "model-parallel";
    case MeshGroup::kExpertModelParallel: return "expert-model-parallel";
  }
  return "?";
}

Communicator& group_of(Mesh& mesh, MeshGroup g) {
  Communicator* c = nullptr;
  switch (g) {
    case MeshGroup::kWorld: c = mesh.world.get(); break;
    case MeshGroup::kTp: c = mesh.tp.get(); break;
    case MeshGroup::kCp: c = mesh.cp.get(); break;
    case MeshGroup::kDp: c = mesh.dp.get(); break;
    case MeshGroup::kDpCp: c = mesh.dp_cp.get(); break;
    case MeshGroup::kEp: c = mesh.ep.get(); break;
    case MeshGroup::kExpertDp: c = mesh.expert_dp.get(); break;
    case MeshGroup::kModelParallel: c = mesh.model_parallel.get(); break;
    case MeshGroup::kExpertModelParallel: c = mesh.expert_model_parallel.get(); break;
  }
  COC_ASSERT(c != nullptr, "the mesh has no '{}' group (built by make_mesh?)", to_string(g));
  return *c;
}

std::string Placement::describe() const {
  std::string shard = tp_sharded && ep_sharded ? "tp × ep-sharded"
                      : tp_sharded             ? "tp-sharded"
                      : ep_sharded             ? "ep-sharded, tp-replicated"
                                               : "tp-replicated";
  return fmt::format("{}{}, mean over {}", shard, tp_partial_grad ? ", partial gradient summed over tp" : "",
                     to_string(replicas));
}

}  // namespace coc
