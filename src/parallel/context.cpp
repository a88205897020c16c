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

int64_t ParallelContext::shard_rows(int64_t m) const { return split_rows(m, tp_size(), tp_rank()).count; }
}  // namespace coc
