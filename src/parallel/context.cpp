#include "coc/parallel/context.h"

#include "coc/overlap/partition.h"

namespace coc {
int64_t ParallelContext::shard_rows(int64_t m) const { return split_rows(m, tp_size(), tp_rank()).count; }
}  // namespace coc
