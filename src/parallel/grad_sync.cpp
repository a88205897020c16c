#include "coc/parallel/grad_sync.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/coc_ops.h"
#include "coc/parallel/placement.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {

/// In-place sum of every listed gradient over `comm`: all posted, then all waited.
void all_reduce_grads(Communicator& comm, const ParamList& ps, bool deterministic, const char* what,
                      DType wire = DType::kF32) {
  std::vector<Work> works;
  for (Param* p : ps) {
    MatrixView g{p->grad.data(), 1, p->grad.numel(), p->grad.numel()};
    works.push_back(all_reduce_rows(comm, g, deterministic, std::string(what) + " " + p->name, wire));
  }
  wait_all(works);
}

constexpr MeshGroup kReplicaGroups[] = {MeshGroup::kDp, MeshGroup::kDpCp, MeshGroup::kExpertDp};

}  // namespace

void sync_gradients(Mesh& mesh, const ParamList& params, bool deterministic, DType wire) {
  // Every loss is a mean over this rank's tokens, so the global-batch gradient is the sum over the dp × cp ranks
  // divided by their count. An expert's gradient already sums the tokens its ep group routed to it, so it is
  // summed over expert-dp only, and divided by the same count (Megatron's expert_gradient_scaling_factor).
  const float inv = 1.0f / static_cast<float>(mesh.dp_size() * mesh.cp_size());
  ParamList partial;
  for (Param* p : params)
    if (p->placement.tp_partial_grad) partial.push_back(p);
  if (!partial.empty() && mesh.tp_size() > 1) all_reduce_grads(*mesh.tp, partial, deterministic, "sp grad");
  for (MeshGroup g : kReplicaGroups) {
    Communicator& comm = group_of(mesh, g);
    ParamList ps;
    for (Param* p : params)
      if (p->placement.replicas == g) ps.push_back(p);
    if (ps.empty() || (comm.size() == 1 && inv == 1.0f)) continue;
    all_reduce_grads(comm, ps, deterministic, "dp grad", wire);
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "grad_scale");
    for (Param* p : ps)
      for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad[i] *= inv;
  }
}

void OverlappedGradSync::post(const ParamList& module) {
  ParamList partial;
  for (Param* p : module)
    if (p->placement.tp_partial_grad) partial.push_back(p);
  if (!partial.empty() && mesh_.tp_size() > 1) all_reduce_grads(*mesh_.tp, partial, deterministic_, "sp grad");
  const bool scaled = mesh_.dp_size() * mesh_.cp_size() != 1;
  for (MeshGroup g : kReplicaGroups) {
    Communicator& comm = group_of(mesh_, g);
    for (Param* p : module) {
      if (p->placement.replicas != g) continue;
      posted_.push_back(p);
      if (comm.size() == 1 && !scaled) continue;  // sync_gradients skips such a group too
      MatrixView v{p->grad.data(), 1, p->grad.numel(), p->grad.numel()};
      works_.push_back(all_reduce_rows(comm, v, deterministic_, "dp grad " + p->name, wire_));
    }
  }
}

void OverlappedGradSync::finish() {
  wait_all(works_);
  works_.clear();
  // The scaling of sync_gradients (a factor of 1 leaves the bits as they are).
  const float inv = 1.0f / static_cast<float>(mesh_.dp_size() * mesh_.cp_size());
  if (inv != 1.0f)
    for (Param* p : posted_)
      for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad[i] *= inv;
  posted_.clear();
}

// Stage 0 adds every stage's terms in stage order, which is P = 1's order of the same terms, so the sums have its
// bits. Each stage sends [dense count, any expert, dense terms..., expert terms...].
StageSquares pipeline_squares(Communicator& pp, const std::vector<double>& dense, const std::vector<double>& expert,
                              bool any_expert) {
  std::vector<double> mine{static_cast<double>(dense.size()), any_expert ? 1.0 : 0.0};
  mine.insert(mine.end(), dense.begin(), dense.end());
  mine.insert(mine.end(), expert.begin(), expert.end());
  const std::vector<std::string> all = pp.gather_bytes(
      std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double)), 0,
      "grad norm (pipeline stages)");
  double total[3] = {0, 0, 0};  // dense, expert, stages with expert parameters
  for (const std::string& stage : all) {
    std::vector<double> terms(stage.size() / sizeof(double));
    std::memcpy(terms.data(), stage.data(), terms.size() * sizeof(double));
    COC_ASSERT(terms.size() >= 2, "grad norm (pipeline stages): a stage sent {} values", terms.size());
    const size_t n_dense = static_cast<size_t>(terms[0]);
    for (size_t i = 2; i < terms.size(); ++i) total[i < n_dense + 2 ? 0 : 1] += terms[i];
    total[2] += terms[1];
  }
  pp.broadcast_bytes(total, sizeof total, 0, "grad norm (pipeline stages)").wait();
  return {total[0], total[1], total[2] > 0};
}

double grad_norm(Mesh& mesh, const ParamList& params) {
  // [0]: dense parameters, summed over the model-parallel group; [1]: expert parameters, over tp × ep.
  double local[2] = {0, 0};
  bool any_expert = false;
  std::vector<double> terms[2];  // pipeline: this stage's dense and expert terms, added across stages in order
  for (Param* p : params) {
    any_expert = any_expert || p->placement.ep_sharded;  // the same on every rank: it decides the collectives
    if (!p->placement.tp_sharded && mesh.tp_rank() != 0) continue;  // identical on every TP rank: count it once
    const double sq = sum_squares(p->grad);
    local[p->placement.ep_sharded ? 1 : 0] += sq;
    terms[p->placement.ep_sharded ? 1 : 0].push_back(sq);
  }
  if (mesh.pp_size() > 1) {
    const StageSquares all = pipeline_squares(*mesh.pp, terms[0], terms[1], any_expert);
    return grad_norm_of_squares(mesh, all.dense, all.expert, all.any_expert);
  }
  return grad_norm_of_squares(mesh, local[0], local[1], any_expert);
}

double grad_norm_of_squares(Mesh& mesh, double dense_squares, double expert_squares, bool any_expert) {
  float dense = static_cast<float>(dense_squares);
  // Under pipeline parallelism grad_norm has summed the stages already (pipeline_squares): tp is what is left.
  Communicator& dense_group = mesh.pp_size() > 1 ? *mesh.tp : *mesh.model_parallel;
  dense_group.all_reduce(&dense, 1, ReduceOp::kSum, "grad norm").wait();
  double total = static_cast<double>(dense);
  if (any_expert) {
    // Under pipeline parallelism every stage holds the stages' sum: stage 0 brings it, the others add exact zeros
    // (pp is the outermost dimension of the group, so the terms keep P = 1's order).
    float expert = mesh.pp_size() > 1 && mesh.pp_rank() != 0 ? 0.0f : static_cast<float>(expert_squares);
    mesh.expert_model_parallel->all_reduce(&expert, 1, ReduceOp::kSum, "grad norm (experts)").wait();
    total += static_cast<double>(expert);
  }
  return std::sqrt(total);
}

}  // namespace coc
