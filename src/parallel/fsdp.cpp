// Sharded data parallelism and its prefetch (fsdp.h; docs/semantics.md §4). Megatron-FSDP's strategies, PyTorch
// FSDP2's module hooks and prefetch, over the row collectives of coc_ops.h (all_gather_rows, reduce_scatter_rows:
// rank r's share of n elements is split_rows(n, D, r), and the deterministic sum is in rank order).
#include "coc/parallel/fsdp.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "coc/comm/progress.h"
#include "coc/core/error.h"
#include "coc/core/splitmix.h"
#include "coc/overlap/coc_ops.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/grad_sync.h"
#include "coc/runtime/tracer.h"

namespace coc {

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kNoShard: return "no_shard";
    case ShardingStrategy::kOptim: return "optim";
    case ShardingStrategy::kOptimGrads: return "optim_grads";
    case ShardingStrategy::kOptimGradsParams: return "optim_grads_params";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& s) {
  for (ShardingStrategy v : {ShardingStrategy::kNoShard, ShardingStrategy::kOptim, ShardingStrategy::kOptimGrads,
                             ShardingStrategy::kOptimGradsParams})
    if (s == to_string(v)) return v;
  throw_invalid("--data-parallel-sharding-strategy '{}' is not one of no_shard, optim, optim_grads, "
                "optim_grads_params",
                s);
}

void validate_prefetch(int forward_prefetch, int backward_prefetch) {
  if (forward_prefetch < 0)
    throw_invalid("--num-to-forward-prefetch must be >= 0 (0: gather on demand), got {}", forward_prefetch);
  if (backward_prefetch < 0)
    throw_invalid("--num-to-backward-prefetch must be >= 0 (0: gather on demand), got {}", backward_prefetch);
}

struct FullyShardedDataParallel::Shard {
  Param* full = nullptr;        ///< the model's parameter (value/grad of its full tp-shard shape, or empty)
  Communicator* group = nullptr;
  std::vector<int64_t> shape;   ///< the full shape
  int64_t n = 0;                ///< elements of the full parameter
  RowRange range;               ///< this rank's elements, split_rows(n, D, rank)
  Param param;                  ///< the shard: value and grad [ceil(n / D)], zero beyond range.count

  ConstMatrixView shard_of(const Tensor& t) const { return {t.data(), range.count, 1, 1}; }
  MatrixView shard_of(Tensor& t) const { return {t.data(), range.count, 1, 1}; }
  static MatrixView column(Tensor& t) { return {t.data(), t.numel(), 1, 1}; }
  static ConstMatrixView column(const Tensor& t) { return {t.data(), t.numel(), 1, 1}; }
};

struct FullyShardedDataParallel::Module {
  std::vector<Shard*> shards;
  bool unsharded = false;           ///< full parameters allocated (gathered or being gathered)
  std::vector<Work> gathers;        ///< in flight until waited
  std::vector<Work> reductions;     ///< reduce-scatters in flight until finish_gradients
  int64_t param_bytes() const {
    int64_t b = 0;
    for (const Shard* s : shards) b += s->n * 4;
    return b;
  }
};

namespace {
// Element copies between a full tensor and a shard buffer (the shard's range of the flattened tensor).
void copy_range(const float* from, int64_t count, float* to) { std::copy_n(from, count, to); }
}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(Mesh& mesh, std::vector<ParamList> modules, FsdpOptions opts)
    : mesh_(mesh), opts_(opts), delay_state_(opts.random_delay_seed) {
  COC_ASSERT(opts_.strategy != ShardingStrategy::kNoShard, "FullyShardedDataParallel with no_shard");
  validate_prefetch(opts_.forward_prefetch, opts_.backward_prefetch);
  for (ParamList& ps : modules) {
    auto m = std::make_unique<Module>();
    for (Param* p : ps) {
      auto* s = new Shard();
      s->full = p;
      s->group = &comm_of(p->placement.replicas);
      s->shape = p->value.shape();
      s->n = p->value.numel();
      const int D = s->group->size();
      s->range = split_rows(s->n, D, s->group->rank());
      const int64_t padded = std::max<int64_t>((s->n + D - 1) / D, 1);
      s->param.name = p->name + ".shard";
      s->param.value = Tensor({padded});
      s->param.grad = Tensor({padded});
      s->param.placement = p->placement;
      s->param.weight_decay = p->weight_decay;
      s->param.requires_grad = p->requires_grad;
      copy_range(p->value.data() + s->range.begin, s->range.count, s->param.value.data());
      if (shards_params()) p->value = Tensor();
      if (shards_grads()) p->grad = Tensor();
      m->shards.push_back(s);
      shards_.push_back(s);
    }
    modules_.push_back(std::move(m));
  }
}

Communicator& FullyShardedDataParallel::comm_of(MeshGroup g) {
  for (auto& [group, comm] : comms_)
    if (group == g) return *comm;
  Communicator& parent = group_of(mesh_, g);
  comms_.emplace_back(g, parent.split(0, parent.rank(), std::string("fsdp ") + to_string(g)));
  return *comms_.back().second;
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (Shard* s : shards_) delete s;
}

ParamList FullyShardedDataParallel::shard_params() {
  ParamList out;
  for (Shard* s : shards_) out.push_back(&s->param);
  return out;
}

int FullyShardedDataParallel::modules_unsharded() const {
  int k = 0;
  for (const auto& m : modules_) k += m->unsharded ? 1 : 0;
  return k;
}

void FullyShardedDataParallel::account_window() {
  int64_t bytes = 0;
  for (const auto& m : modules_) {
    if (shards_params() && m->unsharded) bytes += m->param_bytes();
    if (shards_grads())
      for (const Shard* s : m->shards) bytes += s->full->grad.numel() * 4;
  }
  window_bytes_ = bytes;
  window_peak_ = std::max(window_peak_, bytes);
  max_unsharded_ = std::max(max_unsharded_, modules_unsharded());
  trace::counter(trace::Level::kLevel0, "fsdp gathered bytes", "bytes", bytes);
}

void FullyShardedDataParallel::gather(int module) {
  if (module < 0 || module >= static_cast<int>(modules_.size())) return;
  Module& m = *modules_[static_cast<size_t>(module)];
  if (m.unsharded) return;
  if (opts_.random_delay_seed != 0) {
    const uint64_t r = splitmix64(delay_state_ + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(mesh_.world->rank() + 1));
    delay_state_ = r;
    std::this_thread::sleep_for(std::chrono::microseconds(r % 2000));
  }
  m.unsharded = true;
  for (Shard* s : m.shards) {
    s->full->value.resize(s->shape);
    m.gathers.push_back(all_gather_rows(*s->group, s->shard_of(s->param.value), Shard::column(s->full->value),
                                        "fsdp all_gather " + s->full->name, wire_of(*s)));
  }
  account_window();
}

void FullyShardedDataParallel::wait_gathered(int module) {
  Module& m = *modules_[static_cast<size_t>(module)];
  gather(module);
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel1, "fsdp wait all_gather", {"module", module});
  const auto t0 = std::chrono::steady_clock::now();
  wait_all(m.gathers);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.gathers.clear();
}

void FullyShardedDataParallel::free_params(int module) {
  Module& m = *modules_[static_cast<size_t>(module)];
  if (!m.unsharded) return;
  wait_all(m.gathers);  // a prefetched gather that nobody used: its buffer must not be freed under MPI
  m.gathers.clear();
  for (Shard* s : m.shards) s->full->value = Tensor();
  m.unsharded = false;
  account_window();
}

void FullyShardedDataParallel::reshard_all() {
  if (!shards_params()) return;
  for (int i = 0; i < static_cast<int>(modules_.size()); ++i) free_params(i);
}

void FullyShardedDataParallel::set_prefetch(int forward_prefetch, int backward_prefetch) {
  validate_prefetch(forward_prefetch, backward_prefetch);
  COC_ASSERT(modules_unsharded() == 0, "set_prefetch during a pass ({} modules unsharded)", modules_unsharded());
  opts_.forward_prefetch = forward_prefetch;
  opts_.backward_prefetch = backward_prefetch;
}

void FullyShardedDataParallel::begin_forward(bool last) {
  backward_follows_ = true;
  reduce_now_ = last;
}

void FullyShardedDataParallel::pre_forward(int module) {
  if (!shards_params()) return;
  wait_gathered(module);
  for (int k = 1; k <= opts_.forward_prefetch; ++k) gather(module + k);
  lend_poller();
}

void FullyShardedDataParallel::post_forward(int module) {
  lease_.reset();
  if (!shards_params()) return;
  const int last = static_cast<int>(modules_.size()) - 1;
  const bool head = module == last;
  if (head && backward_follows_) return;  // its backward comes next: keep it (FSDP2 keeps the root)
  // The module before the head is the first whose parameters the backward needs, and nothing computes between its
  // forward and the head's short backward to hide a gather under: with backward prefetch on, keep it gathered
  // (torchtitan does not reshard its last transformer block after forward either). At most head + this one are
  // unsharded then.
  if (module == last - 1 && backward_follows_ && opts_.backward_prefetch > 0) return;
  free_params(module);
  if (head) reshard_all();
}

void FullyShardedDataParallel::pre_backward(int module) {
  if (shards_params()) {
    wait_gathered(module);
    for (int k = 1; k <= opts_.backward_prefetch; ++k) gather(module - k);
  }
  if (shards_grads()) {
    for (Shard* s : modules_[static_cast<size_t>(module)]->shards)
      if (s->full->grad.numel() != s->n) s->full->grad = Tensor(s->shape);  // zero: the layers accumulate
    account_window();
  }
  lend_poller();
}

void FullyShardedDataParallel::lend_poller() {
  if (!comms_.empty()) lease_ = lend_progress(*comms_.front().second);
}

void FullyShardedDataParallel::post_backward(int module) {
  lease_.reset();
  if (shards_params()) {
    free_params(module);
    // Post the gathers that module − 1's pre-backward would post before this module's reduce-scatters: the next
    // backward waits for those gathers, the reduce-scatters are waited only one module later, and both queue on
    // the same link in posting order. Freeing first keeps at most B + 1 modules unsharded.
    for (int k = 1; k <= opts_.backward_prefetch; ++k) gather(module - 1 - k);
  }
  if (reduce_now_) {
    reduce_scatter(module);
    // The previous module's reduce-scatters had this module's backward to hide under: finish them now, which
    // frees their full gradients (optim_grads and up), so that at most two modules' full gradients exist.
    if (module + 1 < static_cast<int>(modules_.size())) complete_reduction(module + 1);
  }
  if (module == 0) {
    reshard_all();
    backward_follows_ = false;
  }
}

void FullyShardedDataParallel::reduce_scatter(int module) {
  Module& m = *modules_[static_cast<size_t>(module)];
  // Under sequence parallelism a norm weight's gradient is a partial sum over tp: complete it first, as
  // sync_gradients does, so that the reduce-scatter sums the same values.
  std::vector<Work> partial;
  if (mesh_.tp_size() > 1)
    for (Shard* s : m.shards)
      if (s->full->placement.tp_partial_grad)
        partial.push_back(all_reduce_rows(*mesh_.tp, {s->full->grad.data(), 1, s->n, s->n}, opts_.deterministic,
                                          "sp grad " + s->full->name));
  wait_all(partial);
  for (Shard* s : m.shards)
    m.reductions.push_back(reduce_scatter_rows(*s->group, Shard::column(static_cast<const Tensor&>(s->full->grad)),
                                               s->shard_of(s->param.grad), opts_.deterministic,
                                               "fsdp reduce_scatter " + s->full->name, opts_.grad_reduce_dtype));
}

void FullyShardedDataParallel::complete_reduction(int module) {
  Module& m = *modules_[static_cast<size_t>(module)];
  if (m.reductions.empty()) return;
  {
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel1, "fsdp wait reduce_scatter", {"module", module});
    const auto t0 = std::chrono::steady_clock::now();
    wait_all(m.reductions);
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  m.reductions.clear();
  // The same scaling as sync_gradients: the sum over dp × cp ranks, divided by their count.
  const float inv = 1.0f / static_cast<float>(mesh_.dp_size() * mesh_.cp_size());
  for (Shard* s : m.shards) {
    float* g = s->param.grad.data();
    for (int64_t i = 0; i < s->range.count; ++i) g[i] *= inv;
    if (shards_grads()) s->full->grad = Tensor();
  }
  account_window();
}

void FullyShardedDataParallel::finish_gradients() {
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "fsdp finish reduce_scatter");
  for (int i = 0; i < static_cast<int>(modules_.size()); ++i) complete_reduction(i);
}

double FullyShardedDataParallel::grad_norm() {
  // no_shard sums, per parameter, the squares of its elements in order into a double starting at 0 (sum_squares),
  // then adds the parameters in order. Each shard continues its parameter's sum where the previous rank stopped:
  // under --deterministic the partial sums travel along the replica group in rank order (one broadcast per rank),
  // which reproduces no_shard's double exactly; otherwise they are summed in one all-reduce.
  std::vector<double> sums(shards_.size(), 0.0);
  std::vector<MeshGroup> groups;
  for (const Shard* s : shards_)
    if (std::find(groups.begin(), groups.end(), s->full->placement.replicas) == groups.end())
      groups.push_back(s->full->placement.replicas);
  auto add_mine = [&](MeshGroup g) {
    for (size_t i = 0; i < shards_.size(); ++i) {
      const Shard& s = *shards_[i];
      if (s.full->placement.replicas != g) continue;
      const float* p = s.param.grad.data();
      for (int64_t j = 0; j < s.range.count; ++j) sums[i] += static_cast<double>(p[j]) * p[j];
    }
  };
  for (MeshGroup g : groups) {
    Communicator& comm = comm_of(g);
    std::vector<size_t> idx;
    for (size_t i = 0; i < shards_.size(); ++i)
      if (shards_[i]->full->placement.replicas == g) idx.push_back(i);
    std::vector<double> buf(idx.size());
    if (opts_.deterministic) {
      for (int r = 0; r < comm.size(); ++r) {
        if (r == comm.rank()) add_mine(g);
        for (size_t k = 0; k < idx.size(); ++k) buf[k] = sums[idx[k]];
        comm.broadcast_bytes(buf.data(), static_cast<int64_t>(buf.size() * sizeof(double)), r, "fsdp grad norm")
            .wait();
        for (size_t k = 0; k < idx.size(); ++k) sums[idx[k]] = buf[k];
      }
    } else {
      add_mine(g);
      for (size_t k = 0; k < idx.size(); ++k) buf[k] = sums[idx[k]];
      comm.all_reduce_values(std::span<double>(buf), ReduceOp::kSum, "fsdp grad norm");
      for (size_t k = 0; k < idx.size(); ++k) sums[idx[k]] = buf[k];
    }
  }
  double local[2] = {0, 0};
  bool any_expert = false;
  std::vector<double> terms[2];  // pipeline: this stage's dense and expert terms, added across stages in order
  for (size_t i = 0; i < shards_.size(); ++i) {
    const Placement& pl = shards_[i]->full->placement;
    any_expert = any_expert || pl.ep_sharded;
    if (!pl.tp_sharded && mesh_.tp_rank() != 0) continue;
    local[pl.ep_sharded ? 1 : 0] += sums[i];
    terms[pl.ep_sharded ? 1 : 0].push_back(sums[i]);
  }
  if (mesh_.pp_size() > 1) {
    const StageSquares all = pipeline_squares(*mesh_.pp, terms[0], terms[1], any_expert);
    return grad_norm_of_squares(mesh_, all.dense, all.expert, all.any_expert);
  }
  return grad_norm_of_squares(mesh_, local[0], local[1], any_expert);
}

DType FullyShardedDataParallel::wire_of(const Shard& s) const {
  return s.full->read_as_compute_type ? opts_.param_gather_dtype : DType::kF32;
}

void FullyShardedDataParallel::after_step() {
  if (!shards_params()) gather_all_params();
}

void FullyShardedDataParallel::gather_all_params() {
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "fsdp all_gather params");
  std::vector<Work> works;
  for (Shard* s : shards_)
    works.push_back(all_gather_rows(*s->group, s->shard_of(s->param.value), Shard::column(s->full->value),
                                    "fsdp all_gather " + s->full->name, wire_of(*s)));
  wait_all(works);
}

void FullyShardedDataParallel::set_param_gather_dtype(DType t) {
  if (t != DType::kF32 && t != DType::kBF16)
    throw_invalid("FSDP parameter gathers in {}: only fp32 and bf16 are supported", to_string(t));
  COC_ASSERT(modules_unsharded() == 0, "set_param_gather_dtype during a pass ({} modules unsharded)",
             modules_unsharded());
  const DType was = opts_.param_gather_dtype;
  opts_.param_gather_dtype = t;
  if (!shards_params() && was != DType::kF32 && t == DType::kF32) gather_all_params();
}

void FullyShardedDataParallel::allocate_full() {
  if (!shards_params()) return;
  for (auto& m : modules_) {
    wait_all(m->gathers);
    m->gathers.clear();
    m->unsharded = true;
    for (Shard* s : m->shards) s->full->value.resize(s->shape);
  }
}

void FullyShardedDataParallel::release_full() { reshard_all(); }

void FullyShardedDataParallel::gather_full_state(const std::vector<Tensor>& exp_avg,
                                                 const std::vector<Tensor>& exp_avg_sq,
                                                 std::vector<Tensor>& full_exp_avg,
                                                 std::vector<Tensor>& full_exp_avg_sq) {
  COC_ASSERT(exp_avg.size() == shards_.size() && exp_avg_sq.size() == shards_.size(),
             "gather_full_state: {} moments for {} parameters", exp_avg.size(), shards_.size());
  allocate_full();
  full_exp_avg.clear();
  full_exp_avg_sq.clear();
  for (Shard* s : shards_) {
    full_exp_avg.emplace_back(s->shape);
    full_exp_avg_sq.emplace_back(s->shape);
  }
  std::vector<Work> works;
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = *shards_[i];
    const std::string tag = "checkpoint gather " + s.full->name;
    // From the master shard in fp32 for every strategy: optim's and optim_grads' full buffers may hold the bf16
    // values of a 16-bit gather (after_step), which a checkpoint must not keep.
    works.push_back(all_gather_rows(*s.group, s.shard_of(s.param.value), Shard::column(s.full->value), tag));
    works.push_back(all_gather_rows(*s.group, s.shard_of(exp_avg[i]), Shard::column(full_exp_avg[i]), tag));
    works.push_back(all_gather_rows(*s.group, s.shard_of(exp_avg_sq[i]), Shard::column(full_exp_avg_sq[i]), tag));
  }
  wait_all(works);
}

void FullyShardedDataParallel::scatter_full_state(const std::vector<Tensor>& full_exp_avg,
                                                  const std::vector<Tensor>& full_exp_avg_sq,
                                                  std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq) {
  COC_ASSERT(full_exp_avg.size() == shards_.size() && exp_avg.size() == shards_.size(),
             "scatter_full_state: {} moments for {} parameters", full_exp_avg.size(), shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = *shards_[i];
    const int64_t b = s.range.begin, c = s.range.count;
    copy_range(s.full->value.data() + b, c, s.param.value.data());
    copy_range(full_exp_avg[i].data() + b, c, exp_avg[i].data());
    copy_range(full_exp_avg_sq[i].data() + b, c, exp_avg_sq[i].data());
  }
}

FsdpMemory FullyShardedDataParallel::memory() const {
  FsdpMemory m;
  for (const Shard* s : shards_) {
    const int64_t shard = s->param.value.numel() * 4, full = s->n * 4;
    m.parameters += shards_params() ? shard : full;
    m.gradients += shard + (shards_grads() ? 0 : full);
    m.optimizer += 2 * shard + (shards_params() ? 0 : shard);  // m and v; the master shard unless it is the parameter
  }
  m.window_peak = window_peak_;
  return m;
}

}  // namespace coc
