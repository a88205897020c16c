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

VocabComm parse_vocab_comm(const std::string& s) {
  if (s == "auto") return VocabComm::kAuto;
  if (s == "activations") return VocabComm::kActivations;
  if (s == "weights") return VocabComm::kWeights;
  throw_invalid("unknown --vocab-parallel-comm '{}'; use 'activations' (Megatron: the embedding's output and the "
                "output layer's input cross the TP group), 'weights' (the [V, H] weights and their gradients do) or "
                "'auto' (weights when that moves fewer bytes and the full weight fits 64 MiB)",
                s);
}

const char* to_string(VocabComm c) {
  switch (c) {
    case VocabComm::kAuto: return "auto";
    case VocabComm::kActivations: return "activations";
    case VocabComm::kWeights: return "weights";
  }
  return "auto";
}

bool ParallelContext::gathers_vocab_weights(int64_t vocab, int64_t hidden, int64_t m) const {
  // Without SP every rank holds all m rows: working on them against the whole vocabulary would repeat the work.
  if (!sequence_parallel || tp_size() == 1 || vocab_comm == VocabComm::kActivations) return false;
  if (vocab_comm == VocabComm::kWeights) return true;
  constexpr int64_t kMaxFullWeightBytes = int64_t{64} << 20;  // memory of the gathered weight, per layer
  return vocab < m && vocab * hidden * 4 <= kMaxFullWeightBytes;
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
  ctx.vocab_comm = f.vocab_comm;
  ctx.delay_column_wgrad = f.delay_column_wgrad;
  ctx.attention_dense_pipeline = f.attention_dense_pipeline;
  ctx.attention_dense_backward_pipeline = f.attention_dense_backward_pipeline;
  ctx.swiglu_down_pipeline = f.swiglu_down_pipeline;
  ctx.attention_qkv_backward_pipeline = f.attention_qkv_backward_pipeline;
  ctx.swiglu_down_backward_pipeline = f.swiglu_down_backward_pipeline;
  ctx.coc.comm_dtype = f.comm_dtype;
  ctx.coc.stats = stats;
  return ctx;
}

void WgradQueue::run() {
  std::vector<std::function<void()>> queue;
  queue.swap(work_);
  for (auto& f : queue) f();
}

bool ParallelContext::wgrad_under_row_gather() const {
  return sequence_parallel && tp_size() > 1 && delay_wgrad_compute && delay_column_wgrad && !fused_kernel && !mc2 &&
         !coc.customized && (coc.parallel_num == CocOptions::kAuto || coc.parallel_num == 1);
}

int64_t ParallelContext::shard_rows(int64_t m) const { return split_rows(m, tp_size(), tp_rank()).count; }
}  // namespace coc
