#include "coc/parallel/context.h"

#include "coc/core/error.h"
#include "coc/overlap/partition.h"

namespace coc {
void ParallelContext::check_fused_flags(bool fused_kernel, bool mc2, bool sequence_parallel) {
  // MindSpeed refuses the same combinations: MC2 replaces the SP column/row mappings, and the two fused modes
  // would each claim the same ops.
  if (fused_kernel && mc2)
    throw_invalid("--coc-fused-kernel and --use-mc2 cannot be combined: --coc-fused-kernel fuses every TP op, "
                  "--use-mc2 only MC2's (column fwd AG, row fwd RS, row bwd AG); pick one");
  if (mc2 && !sequence_parallel)
    throw_invalid("--use-mc2 requires --sequence-parallel (MC2 fuses the all-gather / reduce-scatter of the "
                  "sequence-parallel layers); add --sequence-parallel, or use --coc-fused-kernel without it");
}

void OverlapConfig::validate() const {
  if (coc_parallel_num < 1 && coc_parallel_num != CocOptions::kAuto)
    throw_invalid("--coc-parallel-num must be >= 1 or auto (got {}); use 1 for the plain Megatron order, 2-16 to "
                  "overlap communication with computation, or auto to let coc time the choices per shape",
                  coc_parallel_num);
  ParallelContext::check_fused_flags(coc_fused_kernel, use_mc2, sequence_parallel);
  if (!customized_coc.empty()) parse_customized_coc(customized_coc);  // a bad table fails before any work
  if (coc_min_chunk_rows < 1) throw_invalid("--coc-min-chunk-rows must be >= 1 (got {})", coc_min_chunk_rows);
}

ParallelContext make_parallel_context(Communicator& group, const OverlapConfig& f, CocStats* stats) {
  f.validate();
  ParallelContext ctx;
  ctx.tp = &group;
  ctx.sequence_parallel = f.sequence_parallel;
  ctx.coc.parallel_num = f.coc_parallel_num;
  ctx.coc.comm_algo = f.coc_comm_algo;
  if (!f.customized_coc.empty()) ctx.coc.customized = parse_customized_coc(f.customized_coc);
  ctx.coc.deterministic = f.deterministic;
  ctx.coc.min_chunk_rows = f.coc_min_chunk_rows;
  ctx.fused_kernel = f.coc_fused_kernel;
  ctx.mc2 = f.use_mc2;
  ctx.tp_comm_bulk_wgrad = f.tp_comm_bulk_wgrad;
  ctx.delay_wgrad_compute = f.delay_wgrad_compute;
  ctx.coc.stats = stats;
  return ctx;
}

void ParallelContext::run_delayed_wgrad() {
  std::vector<std::function<void()>> queue;
  queue.swap(delayed_wgrad);
  for (auto& f : queue) f();
}

int64_t ParallelContext::shard_rows(int64_t m) const { return split_rows(m, tp_size(), tp_rank()).count; }
}  // namespace coc
