// `coc check`: MindSpeed's "loss and accuracy consistency check" before going live. Three modes:
//  --op OP      one CoC op against an fp64 single-rank reference (outputs); --op ring_attention: context-parallel
//               ring attention against full fp64 attention (output, dQ, dK, dV)
//  --layer L    a whole Column/Row parallel layer, forward and backward (outputs and gradients); `moe`: the MoE
//               layer with expert parallelism against a single-rank fp64 MoE (parallel/moe_check.h)
//  --train-steps K  the training loss curve for N = 1 against the given N, and tp = 1 against the given tp
// Prints max absolute and relative errors and exits 1 beyond tolerance.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <tuple>

#include "cli/commands.h"
#include "cli/moe_options.h"
#include "cli/train_options.h"
#include "cli/train_precision_flags.h"
#include "coc/comm/mesh.h"
#include "coc/comm/process.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/consistency.h"
#include "coc/parallel/context.h"
#include "coc/parallel/moe_check.h"
#include "coc/parallel/quantized_row_linear.h"
#include "coc/parallel/ring_attention_check.h"

namespace coc::cli {

namespace {

struct CheckOptions {
  std::string op, layer, layout = "nk", engine = "inline";
  int64_t m = 1024, k = 512, n = 768;
  int N = 4, tp = 0, verbose = 0;
  bool bias = false, sp = false, deterministic = false;
  bool fused = false, mc2 = false, frozen = false;  ///< --coc-fused-kernel, --use-mc2, --frozen-weight
  double rtol = 1e-5;
  int64_t train_steps = 0;
  double tp_rtol = std::nan("");  ///< --tp-rtol; NaN: kTpRtol, or kBf16CurveRtol with --bf16
  double bf16_rtol = 2e-2;        ///< --bf16-rtol
  TrainOptions train;  ///< also the MoE flags (train.moe) of --layer moe and --train-steps
};

/// --train-steps' default tolerance of tp = 1 against the given tp in fp32: only the order of fp32 sums differs.
constexpr double kTpRtol = 1e-4;
/// The same under --bf16. tp = 1 rounds each whole product to bf16 where tp rounds each rank's partial before the
/// sum (Megatron's bf16 GEMM outputs), and a sum near a rounding boundary lands on the neighbouring bf16 value (a
/// relative step of 2^-8 = 3.9e-3); such flips move the loss curve by several thousandths over 20 steps (measured:
/// 8.4e-3 at tp 2 with SP on the default job, docs/mixed-precision.md). 2e-2 is about five bf16 steps of the loss.
constexpr double kBf16CurveRtol = 2e-2;

/// Reduces errors to the worst over all ranks and prints one line on rank 0.
bool report(Communicator& world, const std::string& what, const ErrorStat& e, double rtol) {
  float v[2] = {static_cast<float>(e.abs), static_cast<float>(e.rel())};
  world.all_reduce(v, 2, ReduceOp::kMax, "check report").wait();
  const bool ok = v[1] <= rtol;
  if (world.rank() != 0) return ok;
  if (what.ends_with("bf16 bound"))  // the error is already a ratio to its bound (parallel/consistency.h)
    std::printf("  %-24s worst err/bound %.3e   %s\n", what.c_str(), v[1], ok ? "ok" : "FAIL");
  else
    std::printf("  %-16s max abs err %.3e   max rel err %.3e   %s\n", what.c_str(), v[0], v[1], ok ? "ok" : "FAIL");
  return ok;
}

/// Whether the --op or --layer check `o` names runs in bf16 under --bf16: the CoC ops and the column and row layers,
/// but not the ring, MoE or w8a16 checks, which run in fp32.
bool has_bf16_path(const CheckOptions& o, bool w8a16) {
  return (o.layer == "column" || o.layer == "row" || (!o.op.empty() && o.op != "ring_attention")) && !w8a16;
}

/// "--op OP" or "--layer L", for messages.
std::string mode_name(const CheckOptions& o) { return !o.op.empty() ? "--op " + o.op : "--layer " + o.layer; }

/// Refuses the flags a mode would ignore (the precision, tolerance and model-depth flags in the --op and --layer
/// modes; the op's shape flags --m, --k, --n, --bias, --weight-layout under --train-steps), then coc train's own
/// precision refusals (--bf16 with --fp16, loss scaling without --fp16, ...): kInvalidArgument naming the flag, the
/// mode and the fix.
void check_mode_flags(const CLI::App& cmd, const CheckOptions& o, bool w8a16) {
  if (o.train_steps > 0)
    for (const char* name : {"--m", "--k", "--n", "--bias", "--weight-layout"})
      if (cmd.get_option(name)->count() > 0)
        throw_invalid("coc check --train-steps: {} applies to --op and --layer only (the model's shape comes from "
                      "--hidden-size, --num-layers, --seq-length and the other model flags); drop it",
                      name);
  if (o.train_steps == 0) {
    const std::string mode = mode_name(o);
    std::vector<std::string> train_only = {"--tp-rtol", "--bf16-rtol", "--fp16", "--grad-reduce-in-bf16",
                                           "--fp32-residual-connection", "--num-layers",
                                           "--overlap-forward-micro-batches"};
    for (const auto& scaling : o.train.precision.loss_scaling) train_only.push_back(scaling.first->get_name());
    for (const std::string& name : train_only)
      if (cmd.get_option(name)->count() > 0)
        throw_invalid("coc check {}: {} applies to --train-steps only; drop it here", mode, name);
    if (o.train.precision.bf16 && !has_bf16_path(o, w8a16))
      throw_invalid("coc check {}{}: --bf16 applies to the CoC ops and --layer column|row; this check runs in fp32 "
                    "(its bf16 path is checked by --train-steps K --bf16); drop --bf16",
                    mode, w8a16 ? " --w8a16" : "");
  }
  check_precision_flags(o.train.precision);
}

/// "auto" for --coc-parallel-num auto, else the number.
std::string n_label(int N) { return N == CocOptions::kAuto ? std::string("auto") : std::to_string(N); }

/// ", p2p" when --coc-comm-algo p2p is in effect (auto chooses the algorithm itself).
const char* p2p_label(int N, CocCommAlgo algo) {
  return N != CocOptions::kAuto && algo == CocCommAlgo::kP2p ? ", p2p" : "";
}

/// Refuses (uniformly, kInvalidArgument) a shape whose buffers cannot fit in this node's memory, rather than let
/// some rank die in the allocator. Per rank: fp32 operands and outputs (the input, its gathered copy, the weight
/// and its shard, the op's and the reference's [m, n] products) and the fp64 reference; times the ranks sharing
/// this node. Collective over MPI_COMM_WORLD.
void refuse_oversized(int64_t m, int64_t k, int64_t n) {
  const int local = node_placement().local_size;
  const double M = static_cast<double>(m), K = static_cast<double>(k), N = static_cast<double>(n);
  const double need = (4.0 * (2 * M * K + 2 * K * N + 3 * M * N) + 8.0 * M * N) * local;
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && need > have)
    throw_invalid("m={} k={} n={} needs about {:.1f} GiB of buffers on this node ({} rank(s)), more than its "
                  "{:.1f} GiB; lower --m, --k or --n",
                  m, k, n, need / (1 << 30), local, have / (1 << 30));
}

int check_op_or_layer(const CheckOptions& o, Mesh& g) {
  ConsistencyCase c;
  c.op = o.op;
  c.layer = o.layer;
  c.m = o.m;
  c.k = o.k;
  c.n = o.n;
  c.layout = o.layout == "nk" ? WeightLayout::kNK : WeightLayout::kKN;
  c.bias = o.bias;
  c.sequence_parallel = o.sp;
  c.coc.parallel_num = o.N;
  c.coc.deterministic = o.deterministic;
  c.coc.comm_algo = o.train.cfg.coc_comm_algo;
  c.coc.tag = "coc check";
  // --op: either flag runs the op fused. --layer: the layer decides per op (ParallelContext).
  c.coc.fused = !o.op.empty() && (o.fused || o.mc2);
  c.bf16 = o.train.precision.bf16;
  c.fused_kernel = o.fused;
  c.mc2 = o.mc2;
  c.frozen_weight = o.frozen;
  c.tp_comm_bulk_wgrad = o.train.cfg.tp_comm_bulk_wgrad;
  c.delay_wgrad_compute = o.train.cfg.delay_wgrad_compute;
  if (!o.layer.empty()) ParallelContext::check_fused_flags(o.fused, o.mc2, o.sp);
  if (o.frozen && o.layer.empty()) throw_invalid("--frozen-weight applies to --layer only");
  CocStats stats;
  c.coc.stats = &stats;
  // Every rank must check the same problem; a rank launched with other shapes would otherwise desynchronise the
  // collectives. One cheap agreement up front turns that into a clear error.
  const std::string args = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", c.op, c.layer, c.m, c.k,
                                       c.n, o.layout, c.bias, c.sequence_parallel, c.coc.parallel_num,
                                       c.coc.deterministic, o.fused, o.mc2, o.frozen, to_string(c.coc.comm_algo),
                                       c.bf16);
  g.world->check_same(fnv1a(args.data(), args.size()), "the coc check arguments (op/layer, --m, --k, --n, flags)");
  // --bf16: bf16 GEMMs (fp32 accumulation) as --bf16 trains, and bf16 on the wire.
  const DType saved_compute = gemm_compute_type();
  if (c.bf16) set_gemm_compute_type(DType::kBF16);
  ConsistencyResult res;
  try {
    res = check_consistency(*g.tp, c);
  } catch (...) {
    set_gemm_compute_type(saved_compute);
    throw;
  }
  set_gemm_compute_type(saved_compute);
  const std::string mode = o.fused   ? fmt::format("fused kernel ({} of {} calls fused{})", stats.fused_calls,
                                                   stats.calls, stats.fused_fallbacks ? ", the rest fell back" : "")
                           : o.mc2   ? fmt::format("MC2 placement ({} of {} calls fused)", stats.fused_calls,
                                                   stats.calls)
                                     : std::string();
  if (g.world->rank() == 0) {
    const std::string flags = std::string(p2p_label(o.N, c.coc.comm_algo)) +
                              (o.deterministic ? ", deterministic" : "") + (c.bf16 ? ", bf16" : "");
    if (!o.op.empty())
      std::printf("coc check --op %s: m=%lld k=%lld n=%lld, tp=%d, N=%s, weight %s, bias %s%s\n", o.op.c_str(),
                  static_cast<long long>(o.m), static_cast<long long>(o.k), static_cast<long long>(o.n), g.tp_size(),
                  n_label(o.N).c_str(), to_string(c.layout), o.bias ? "on" : "off", flags.c_str());
    else
      std::printf("coc check --layer %s: m=%lld k=%lld n=%lld, tp=%d, N=%s, sequence parallel %s, bias %s%s\n",
                  o.layer.c_str(), static_cast<long long>(o.m), static_cast<long long>(o.k),
                  static_cast<long long>(o.n), g.tp_size(), n_label(o.N).c_str(), o.sp ? "on" : "off",
                  o.bias ? "on" : "off", flags.c_str());
    if (!mode.empty()) std::printf("  mode: %s%s\n", mode.c_str(), o.frozen ? ", frozen weight" : "");
    if (c.bf16)
      std::printf("  bf16: reference = fp64 product of the bf16-rounded inputs; per element |err| <= 1.01*(u*|ref| + "
                  "(T+1)*u*S + g*S), u = 2^-8, S = sum_p |a*w|, g = gamma_{k+T} = %.3e (fp32 accumulation, bf16 "
                  "partials, bf16 sum); the bound lines below are the worst err/bound (<= 1 passes)%s\n",
                  std::ldexp(1.0, -24) * static_cast<double>(c.k + g.tp_size()),
                  o.layer.empty() ? "" : "; k is each sum's length: k for Y, n for dX, m for dW and db");
  }
  bool ok = true;
  for (const auto& [name, err] : res)
    ok = report(*g.world, name, err, name.ends_with("bf16 bound") ? 1.0 : o.rtol) && ok;
  if (g.world->rank() == 0) std::printf("%s\n", ok ? "PASSED" : "FAILED: error above tolerance (--rtol)");
  return ok ? 0 : 1;
}

// ---- --layer moe: the MoE layer on ep × expert-dp ranks (parallel/moe.h) ----------------------------------------
// --m is the global batch's tokens, --k the hidden size, --n each expert's FFN width.
int check_moe(const CheckOptions& o) {
  if (o.train.tp > 1)
    throw_invalid("--layer moe runs its experts without tensor parallelism; drop --tensor-model-parallel-size {}",
                  o.train.tp);
  const MoeOptions& moe = o.train.moe;
  if (moe.layer_freq != MoeOptions::kNotGiven) throw_invalid("--moe-layer-freq applies to coc train and --train-steps only");
  if (moe.first_k_dense != MoeOptions::kNotGiven)
    throw_invalid("--first-k-dense-replace applies to coc train and --train-steps only");
  MoeCheckCase c;
  // Each expert's width: --moe-ffn-hidden-size when given, else --n.
  c.cfg = moe.config(o.k, moe.ffn_hidden != MoeOptions::kNotGiven ? moe.ffn_hidden : o.n, o.deterministic);
  c.tokens = o.m;
  Mesh g = make_mesh({.tp = 1, .cp = 1, .ep = moe.ep}, o.train.comm_options());
  const std::string args =
      fmt::format("moe|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", c.tokens, c.cfg.hidden, c.cfg.ffn_hidden,
                  c.cfg.num_experts, c.cfg.topk, moe.ep, c.cfg.capacity_factor, c.cfg.aux_loss_coeff,
                  to_string(c.cfg.dispatcher), c.cfg.mc2_chunks, to_string(c.cfg.fixed_router), c.cfg.deterministic);
  g.world->check_same(fnv1a(args.data(), args.size()), "the coc check arguments (--layer moe, --m, --k, --n, MoE flags)");
  const MoeCheckResult res = check_moe_layer(g, c);
  if (g.world->rank() == 0) {
    std::printf("coc check --layer moe: tokens=%lld hidden=%lld ffn=%lld, %d experts, top-%d, ep %d x expert-dp %d, "
                "dispatcher %s%s, router %s%s%s\n",
                static_cast<long long>(c.tokens), static_cast<long long>(c.cfg.hidden),
                static_cast<long long>(c.cfg.ffn_hidden), c.cfg.num_experts, c.cfg.topk, g.ep_size(),
                g.expert_dp_size(), to_string(c.cfg.dispatcher),
                c.cfg.dispatcher == MoeDispatcher::kMc2 ? fmt::format(" ({} chunks)", c.cfg.mc2_chunks).c_str() : "",
                c.cfg.fixed_router == RouterPattern::kNone ? "learned" : to_string(c.cfg.fixed_router),
                c.cfg.capacity_factor > 0 ? fmt::format(", capacity factor {}", c.cfg.capacity_factor).c_str() : "",
                c.cfg.deterministic ? ", deterministic" : "");
    std::printf("  aux loss %.9g (reference: fp64 single-rank MoE of all %lld tokens)\n", res.aux_loss,
                static_cast<long long>(c.tokens));
  }
  bool ok = true;
  for (const auto& [name, err] : res.errors) ok = report(*g.world, name, err, o.rtol) && ok;
  if (g.world->rank() == 0) std::printf("%s\n", ok ? "PASSED" : "FAILED: error above tolerance (--rtol)");
  return ok ? 0 : 1;
}

// ---- --w8a16: the frozen row layer with an int8 weight (quantized_row_linear.h) ---------------------------------
struct W8a16Flags {
  std::string spec;
  bool asymmetric = false;
};

int check_w8a16(const CheckOptions& o, const W8a16Flags& f, Mesh& g) {
  const QuantSpec spec = QuantSpec::parse(f.spec);
  ConsistencyCase c;
  c.layer = "row";
  c.m = o.m;
  c.k = o.k;
  c.n = o.n;
  c.bias = o.bias;
  c.sequence_parallel = o.sp;
  c.coc.parallel_num = o.N;
  c.coc.deterministic = o.deterministic;
  c.coc.fused = o.fused;
  c.coc.tag = "coc check w8a16";
  const std::string args =
      fmt::format("w8a16|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", spec.str(), f.asymmetric, c.m, c.k, c.n, c.bias,
                  c.sequence_parallel, c.coc.parallel_num, c.coc.deterministic, c.coc.fused);
  g.world->check_same(fnv1a(args.data(), args.size()), "the coc check arguments (--w8a16, --m, --k, --n, flags)");
  const W8a16CheckResult res = check_w8a16_row_layer(*g.tp, c, spec, f.asymmetric);
  float bytes[2] = {static_cast<float>(res.fp32_bytes), static_cast<float>(res.int8_bytes)};
  g.world->all_reduce(bytes, 2, ReduceOp::kMax, "check w8a16 bytes").wait();
  if (g.world->rank() == 0) {
    std::printf("coc check --layer row --w8a16 %s%s: m=%lld k=%lld n=%lld, tp=%d, %s, bias %s (reference: fp64 "
                "with the dequantised weights)\n",
                spec.str().c_str(), f.asymmetric ? " (asymmetric)" : "", static_cast<long long>(o.m),
                static_cast<long long>(o.k), static_cast<long long>(o.n), g.tp_size(),
                o.fused ? "fused kernel" : ("N=" + n_label(o.N)).c_str(), o.bias ? "on" : "off");
    std::printf("  weight bytes per rank (largest): fp32 %.0f, w8a16 %.0f (%.2fx smaller)\n", bytes[0], bytes[1],
                bytes[0] / bytes[1]);
  }
  bool ok = true;
  for (const auto& [name, err] : res.errors) ok = report(*g.world, name, err, o.rtol) && ok;
  if (g.world->rank() == 0) std::printf("%s\n", ok ? "PASSED" : "FAILED: error above tolerance (--rtol)");
  return ok ? 0 : 1;
}

/// The run --train-steps checks: the training flags for `o.train_steps` iterations, quiet, without checkpoints,
/// and a global batch every reference run can split evenly over `world` ranks.
TrainConfig given_train_config(const CheckOptions& o, int world) {
  TrainConfig base = o.train.resolve(false);
  if (o.train.global_batch_size == 0) {
    // The tp = 1 reference runs with data-parallel size = world, so the automatic global batch must divide by
    // micro-batch × world (then it divides by micro-batch × dp of the given tp too), and all runs see the same data.
    const int64_t step = base.micro_batch_size * world;
    base.global_batch_size = step > 0 ? (16 + step - 1) / step * step : 16;
  }
  base.train_iters = o.train_steps;
  base.optim.warmup_iters = std::min(base.optim.warmup_iters, static_cast<double>(o.train_steps));
  base.optim.decay_iters = o.train_steps;
  base.sample_length = 0;
  base.quiet = true;
  base.save.clear();
  base.load.clear();
  base.progress_bar = false;
  return base;
}

/// The reference runs of --train-steps and which of them apply, derived from the given run `base`.
struct TrainReferences {
  bool fused = false;        ///< a fused mode: the N reference is the same run unfused
  bool sharded = false;      ///< sharded data parallelism or --overlap-grad-reduce: a no_shard reference too
  bool prefetching = false;  ///< optim_grads_params with prefetch: an F = B = 0 reference too
  TrainConfig n1, tp1;
};

TrainReferences train_references(const TrainConfig& base, int world) {
  TrainReferences r;
  // With a fused mode the reference is the same run unfused (the chunked pipeline): bitwise equal in
  // deterministic mode. Otherwise N = 1 (the plain order) against the given N. Either reference runs without the
  // backward overlaps (--tp-comm-bulk-wgrad, --delay-wgrad-compute, --delay-column-wgrad) and without the attention
  // pipelines (--attention-dense-pipeline, --attention-dense-backward-pipeline) and --swiglu-down-pipeline, which
  // must not change a bit either (the attention backward's in deterministic mode), nor the micro-batches' forwards
  // interleaved (--overlap-forward-micro-batches). A MoE model's reference also runs the eager dispatcher (every
  // dispatcher gives the same bits in deterministic mode).
  r.fused = base.coc_fused_kernel || base.use_mc2;
  TrainConfig& n1 = r.n1 = base;
  n1.tp_comm_bulk_wgrad = n1.delay_wgrad_compute = n1.delay_column_wgrad = false;
  n1.attention_dense_pipeline = n1.attention_dense_backward_pipeline = n1.swiglu_down_pipeline = false;
  n1.attention_qkv_backward_pipeline = n1.swiglu_down_backward_pipeline = false;
  n1.overlap_forward_micro_batches = false;
  if (r.fused) {
    n1.coc_fused_kernel = n1.use_mc2 = false;
  } else {
    n1.coc_parallel_num = 1;
  }
  n1.moe.dispatcher = MoeDispatcher::kEager;
  TrainConfig& tp1 = r.tp1 = base;
  tp1.tensor_model_parallel_size = 1;
  tp1.sequence_parallel = false;
  tp1.coc_fused_kernel = tp1.use_mc2 = false;  // tp = 1 has nothing to fuse (and MC2 needs SP)
  tp1.vocab_comm = VocabComm::kAuto;            // nor vocabulary shards to gather
  // Its dp may leave one micro-batch per iteration, and n1 checks the interleaved forwards already.
  tp1.overlap_forward_micro_batches = false;
  // And cp = 1: the reference attends over whole sequences on each rank (context parallelism must not change the
  // loss beyond rounding).
  tp1.context_parallel_size = 1;
  tp1.cp_send_recv_overlap = false;
  // And pp = 1: one stage holds every layer (the stages must not change the loss beyond rounding; at the same tp
  // and dp they change no bit, which tests/cli/pipeline.sh checks across launches).
  tp1.pipeline_model_parallel_size = 1;
  tp1.pipeline_split = {};
  tp1.overlap_p2p_communication = false;
  tp1.cp_window_size = 1;
  // Sharded data parallelism: against no_shard with the same layout, and (optim_grads_params) against gathering on
  // demand (F = B = 0): prefetch changes only when the gathers run, so the losses must be equal.
  // --overlap-grad-reduce (on by default) likewise against the blocking reduction after the backward, where there is
  // a reduction (dp × cp > 1).
  const int replicas = world / std::max(1, base.tensor_model_parallel_size * base.pipeline_model_parallel_size);
  r.sharded = base.data_parallel_sharding_strategy != ShardingStrategy::kNoShard ||
              (base.overlap_grad_reduce && replicas > 1);
  r.prefetching = base.data_parallel_sharding_strategy == ShardingStrategy::kOptimGradsParams &&
                  (base.num_to_forward_prefetch != 0 || base.num_to_backward_prefetch != 0);
  n1.data_parallel_sharding_strategy = tp1.data_parallel_sharding_strategy = ShardingStrategy::kNoShard;
  // And ep = 1 (every rank holds every expert): the layout must not change the loss beyond rounding either.
  tp1.expert_model_parallel_size = 1;
  return r;
}

/// Rank 0: the --train-steps title and the loss table's column heads.
void print_train_header(const CheckOptions& o, const TrainConfig& base, bool fused, int world) {
  std::printf("coc check --train-steps %lld: %s, tp=%d%s, sequence parallel %s, N=%s%s%s%s, world %d\n",
              static_cast<long long>(o.train_steps), base.bf16 ? "bf16" : base.fp16 ? "fp16" : "fp32",
              base.tensor_model_parallel_size,
              base.pipeline_model_parallel_size > 1 ? fmt::format(", pp={}", base.pipeline_model_parallel_size).c_str()
                                                    : "",
              base.sequence_parallel ? "on" : "off", n_label(base.coc_parallel_num).c_str(),
              p2p_label(base.coc_parallel_num, base.coc_comm_algo), base.deterministic ? ", deterministic" : "",
              base.coc_fused_kernel ? ", fused kernel" : base.use_mc2 ? ", MC2" : "", world);
  if (base.overlap_forward_micro_batches)
    std::printf("  --overlap-forward-micro-batches: micro-batches' forwards interleaved in pairs (reference: "
                "sequential)\n");
  if (base.model.is_moe())
    std::printf("  MoE: %lld experts, top-%lld, ep %d, --ep-dispatcher %s (reference: eager)\n",
                static_cast<long long>(base.model.num_experts), static_cast<long long>(base.model.moe_router_topk),
                base.expert_model_parallel_size, to_string(base.moe.dispatcher));
  std::printf("  %5s  %12s  %12s  %12s  %11s  %11s\n", "step", "loss (given)", fused ? "loss unfused" : "loss N=1",
              "loss tp=1", fused ? "rel unfused" : "rel N", "rel tp");
}

/// The worst relative loss differences of --train-steps, each against its reference.
struct TrainWorst {
  double n = 0, tp = 0, ns = 0, f0 = 0, fp32 = 0, recompute = 0;
  /// The gradient norm (before clipping) against no_shard's: the sharded norm sums other partial sums (each shard
  /// continues its parameter's sum where the previous replica stopped), which the losses would show only where
  /// clipping is active.
  double ns_norm = 0;
};

/// Rank 0: one line per comparison, then PASSED or FAILED (`passed`).
void print_train_verdict(const CheckOptions& o, const TrainConfig& base, const TrainReferences& refs,
                         const TrainWorst& worst, std::pair<double, double> tol, bool passed) {
  const auto [tol_n, tol_tp] = tol;
  const bool ok_n = worst.n <= tol_n, ok_tp = worst.tp <= tol_tp;
  if (refs.fused)
    std::printf("  fused vs unfused: max relative loss difference %.3e (tolerance %.0e) %s\n", worst.n, tol_n,
                ok_n ? "ok" : "FAIL");
  else
    std::printf("  N=%s vs N=1:  max relative loss difference %.3e (tolerance %.0e) %s\n",
                n_label(base.coc_parallel_num).c_str(), worst.n, tol_n, ok_n ? "ok" : "FAIL");
  if (base.model.is_moe())
    std::printf("  tp=%d cp=%d ep=%d vs tp=1 cp=1 ep=1: max relative loss difference %.3e (tolerance %.0e) %s\n",
                base.tensor_model_parallel_size, base.context_parallel_size, base.expert_model_parallel_size,
                worst.tp, tol_tp, ok_tp ? "ok" : "FAIL");
  else if (base.pipeline_model_parallel_size > 1)
    std::printf("  tp=%d%s pp=%d vs tp=1%s pp=1: max relative loss difference %.3e (tolerance %.0e) %s\n",
                base.tensor_model_parallel_size,
                base.context_parallel_size > 1 ? fmt::format(" cp={}", base.context_parallel_size).c_str() : "",
                base.pipeline_model_parallel_size, base.context_parallel_size > 1 ? " cp=1" : "", worst.tp, tol_tp,
                ok_tp ? "ok" : "FAIL");
  else if (base.context_parallel_size > 1)
    std::printf("  tp=%d cp=%d vs tp=1 cp=1: max relative loss difference %.3e (tolerance %.0e) %s\n",
                base.tensor_model_parallel_size, base.context_parallel_size, worst.tp, tol_tp,
                ok_tp ? "ok" : "FAIL");
  else
    std::printf("  tp=%d vs tp=1: max relative loss difference %.3e (tolerance %.0e) %s\n",
                base.tensor_model_parallel_size, worst.tp, tol_tp, ok_tp ? "ok" : "FAIL");
  if (refs.sharded) {
    // Named only where it acts: the sharded strategies post their reduce-scatters so whatever the flag says.
    const char* with =
        base.overlap_grad_reduce && base.data_parallel_sharding_strategy == ShardingStrategy::kNoShard
            ? " with --overlap-grad-reduce"
            : "";
    std::printf("  %s%s vs no_shard: max relative loss difference %.3e (tolerance %.0e) %s\n",
                to_string(base.data_parallel_sharding_strategy), with, worst.ns, tol_n,
                worst.ns <= tol_n ? "ok" : "FAIL");
    std::printf("  %s%s vs no_shard: max relative gradient norm difference %.3e (tolerance %.0e) %s\n",
                to_string(base.data_parallel_sharding_strategy), with, worst.ns_norm, tol_n,
                worst.ns_norm <= tol_n ? "ok" : "FAIL");
  }
  if (refs.prefetching)
    std::printf("  prefetch F=%d B=%d vs F=B=0: max relative loss difference %.3e (tolerance %.0e) %s\n",
                base.num_to_forward_prefetch, base.num_to_backward_prefetch, worst.f0, tol_n,
                worst.f0 <= tol_n ? "ok" : "FAIL");
  if (base.recompute.granularity != RecomputeGranularity::kNone)
    std::printf("  recomputation vs keeping activations: max relative loss difference %.3e (tolerance %.0e) %s\n",
                worst.recompute, tol_n, worst.recompute <= tol_n ? "ok" : "FAIL");
  if (base.bf16)
    std::printf("  bf16 vs fp32: max relative loss difference %.3e (tolerance %.0e) %s\n", worst.fp32, o.bf16_rtol,
                worst.fp32 <= o.bf16_rtol ? "ok" : "FAIL");
  std::printf("%s\n", passed ? "PASSED" : "FAILED: loss difference above tolerance");
}

int check_train(const CheckOptions& o) {
  const int world = world_size(), rank = world_rank();
  const TrainConfig base = given_train_config(o, world);
  const TrainReferences refs = train_references(base, world);
  const CommOptions comm = o.train.comm_options();
  auto run = [&](TrainConfig c) { return train(c, comm).log; };
  auto l_given = run(base);
  auto l_n1 = run(refs.n1);
  std::vector<IterationLog> l_tp1;
  try {
    l_tp1 = run(refs.tp1);
  } catch (const Error& e) {
    // Its configuration is the check's, not the user's: say whose it is (the world is all data parallel there).
    if (e.kind() != ErrorKind::kInvalidArgument) throw;
    throw Error(e.kind(),
                fmt::format("coc check's reference run at tp 1 (the same {} ranks, all data parallel) cannot run the "
                            "given shape: {}", world, e.what()),
                e.uniform());
  }
  std::vector<IterationLog> l_ns, l_f0;
  if (refs.sharded) {
    TrainConfig ns = base;
    ns.data_parallel_sharding_strategy = ShardingStrategy::kNoShard;
    ns.overlap_grad_reduce = false;
    l_ns = run(ns);
  }
  if (refs.prefetching) {
    TrainConfig f0 = base;
    f0.num_to_forward_prefetch = f0.num_to_backward_prefetch = 0;
    l_f0 = run(f0);
  }
  auto worst_of = [&](const std::vector<IterationLog>& ref, double IterationLog::*field = &IterationLog::loss) {
    double w = 0;
    for (size_t i = 0; i < l_given.size() && i < ref.size(); ++i) {
      const double a = l_given[i].*field, r = ref[i].*field;
      if (a != r) w = std::max(w, std::fabs(a - r) / std::fabs(r));  // equal: also two zero or infinite norms
    }
    return w;
  };
  TrainWorst worst;
  const bool recomputes = base.recompute.granularity != RecomputeGranularity::kNone;
  if (recomputes) {  // the recomputed forward repeats the first one: the same bits under --deterministic
    TrainConfig kept = base;
    kept.recompute = {};
    worst.recompute = worst_of(run(kept));
  }
  if (base.bf16) {
    TrainConfig fp32 = base;
    fp32.bf16 = false;
    worst.fp32 = worst_of(run(fp32));
  }
  worst.ns = refs.sharded ? worst_of(l_ns) : 0;
  worst.ns_norm = refs.sharded ? worst_of(l_ns, &IterationLog::grad_norm) : 0;
  worst.f0 = refs.prefetching ? worst_of(l_f0) : 0;
  if (rank == 0) print_train_header(o, base, refs.fused, world);
  for (size_t i = 0; i < l_given.size(); ++i) {
    const double a = l_given[i].loss, b = l_n1[i].loss, c = l_tp1[i].loss;
    const double rn = std::fabs(a - b) / std::fabs(b), rt = std::fabs(a - c) / std::fabs(c);
    worst.n = std::max(worst.n, rn);
    worst.tp = std::max(worst.tp, rt);
    if (rank == 0)
      std::printf("  %5zu  %12.6f  %12.6f  %12.6f  %11.3e  %11.3e\n", i + 1, a, b, c, rn, rt);
  }
  const double tol_n = base.deterministic ? 0.0 : o.rtol;
  const double tol_tp = !std::isnan(o.tp_rtol) ? o.tp_rtol : base.bf16 ? kBf16CurveRtol : kTpRtol;
  const bool passed = worst.n <= tol_n && worst.tp <= tol_tp && worst.ns <= tol_n && worst.ns_norm <= tol_n &&
                      worst.f0 <= tol_n && worst.fp32 <= o.bf16_rtol && worst.recompute <= tol_n;
  if (rank == 0) print_train_verdict(o, base, refs, worst, {tol_n, tol_tp}, passed);
  return passed ? 0 : 1;
}

// ---- --op ring_attention: context parallelism (ring_attention.h, docs/semantics.md §5) ---------------------------
struct RingFlags {
  int64_t kv_channels = 16;  ///< --kv-channels: the head dimension D
  const CLI::Option* kv = nullptr;
  const CLI::Option* cp = nullptr;  ///< --context-parallel-size (a training flag), to know whether it was given
  /// Flags the ring check has no use for (its shapes are --seq-length, --num-attention-heads, --kv-channels and
  /// --micro-batch-size; its attention is multi-head): refused when given, not silently ignored.
  std::vector<const CLI::Option*> unused;
};

int check_ring(const CheckOptions& o, const RingFlags& f) {
  for (const CLI::Option* opt : f.unused)
    if (opt->count() > 0)
      throw_invalid("--op ring_attention does not take {}: it checks multi-head attention of --num-attention-heads "
                    "heads of --kv-channels dimensions over --seq-length tokens (× --micro-batch-size); drop it",
                    opt->get_name());
  const int world = world_size();
  const int tp = o.train.tp == 0 ? 1 : o.train.tp;
  const int cp = f.cp->count() > 0 ? o.train.cfg.context_parallel_size : world / tp;
  if (cp < 1 || tp < 1 || world % (tp * cp) != 0)
    throw_invalid("--op ring_attention: --context-parallel-size {} × --tp {} must divide the world size {}", cp, tp,
                  world);
  RingAttentionCase c;
  c.seq = o.train.seq_length == kFromPreset ? 256 : o.train.seq_length;
  c.heads = o.train.num_attention_heads == kFromPreset ? 4 : o.train.num_attention_heads;
  c.batch = o.train.cfg.micro_batch_size;
  c.head_dim = f.kv_channels;
  c.opts.mask = o.train.attention_mask_type == "causal" ? AttnMask::kCausal : AttnMask::kFull;
  c.opts.window_size = o.train.cfg.cp_window_size;
  const bool send_recv_overlap = o.train.cfg.cp_send_recv_overlap;
  c.opts.tag = "coc check ring_attention";
  if (c.seq < 1 || c.heads < 1 || c.batch < 1 || c.head_dim < 1)
    throw_invalid("--op ring_attention: --seq-length {}, --num-attention-heads {}, --micro-batch-size {} and "
                  "--kv-channels {} must be >= 1",
                  c.seq, c.heads, c.batch, c.head_dim);
  check_ring_attention_sizes(c.seq, cp, c.opts.window_size);
  Mesh g = make_mesh({.tp = tp, .cp = cp}, o.train.comm_options());
  const std::string args = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", c.seq, c.heads, c.batch, c.head_dim,
                                       to_string(c.opts.mask), send_recv_overlap, c.opts.window_size, cp);
  g.world->check_same(fnv1a(args.data(), args.size()), "the coc check --op ring_attention arguments");
  std::unique_ptr<Communicator> dup;
  const CpRing ring = make_cp_ring(*g.cp, send_recv_overlap, dup);
  const RingAttentionCheck res = check_ring_attention(ring, c);
  if (g.world->rank() == 0)
    std::printf("coc check --op ring_attention: cp=%d (tp=%d, dp=%d), seq %lld, batch %lld, heads %lld, head dim %lld, "
                "%s mask, send/recv overlap %s, window %d\n",
                cp, tp, g.dp_size(), static_cast<long long>(c.seq), static_cast<long long>(c.batch),
                static_cast<long long>(c.heads), static_cast<long long>(c.head_dim), to_string(c.opts.mask),
                send_recv_overlap ? "on" : "off", c.opts.window_size);
  bool ok = true;
  for (const auto& [name, err] : res.errors) ok = report(*g.world, name, err, o.rtol) && ok;
  if (g.world->rank() == 0) std::printf("%s\n", ok ? "PASSED" : "FAILED: error above tolerance (--rtol)");
  return ok ? 0 : 1;
}

}  // namespace

Runner add_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "check", "Consistency check: an overlapped op, a layer (forward+backward) or the training loss curve against "
               "a single-rank / non-overlapped reference; exits 1 beyond tolerance");
  cmd->add_option("--op", o->op, "CoC op to check")
      ->check(CLI::IsMember({"matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2",
                             "ring_attention"}));
  cmd->add_option("--layer", o->layer, "Parallel layer to check (forward and backward)")
      ->check(CLI::IsMember({"column", "row", "moe"}));
  cmd->add_option("--m", o->m, "Rows of the left matrix (tokens)")->capture_default_str();
  cmd->add_option("--k", o->k, "Inner dimension (in-features)")->capture_default_str();
  cmd->add_option("--n", o->n, "Output columns (out-features)")->capture_default_str();
  cmd->add_option("--weight-layout", o->layout, "Weight storage: nk ([out,in], Megatron) or kn ([in,out])")
      ->check(CLI::IsMember({"nk", "kn"}))->capture_default_str();
  cmd->add_flag("--bias", o->bias, "Add a bias (checked once, after the reduction)");
  cmd->add_flag("--frozen-weight", o->frozen,
                "--layer: a frozen weight (no wgrad); with --use-mc2 the column dX then runs fused");
  cmd->add_option("--rtol", o->rtol, "Max relative error against the fp64 reference")
      ->capture_default_str();
  cmd->add_option("--tp-rtol", o->tp_rtol,
                  "--train-steps: max relative loss difference for tp=1 vs tp (default 1e-4; 2e-2 with --bf16, whose "
                  "stored activations round to 2^-8)");
  cmd->add_option("--bf16-rtol", o->bf16_rtol,
                  "--train-steps --bf16: max relative loss difference of the bf16 curve from the same run in fp32")
      ->capture_default_str();
  CLI::Option* steps = cmd->add_option("--train-steps", o->train_steps, "Compare loss curves over this many steps");
  // The op/layer modes take the overlap flags themselves; --train-steps takes every training flag.
  TrainOptions& t = o->train;
  t.cfg.sequence_parallel = false;
  t.cfg.optim.lr = 3e-3f;
  t.cfg.optim.min_lr = 3e-4f;
  add_train_flags(cmd, t);
  // Training flags that mean nothing here (--train-steps is the length; nothing is saved, loaded, logged or
  // sampled): hidden, and refused on the command line, where they would be silently ignored. They stay known so
  // that a coc train --config file can be reused; its values for them are ignored.
  std::vector<std::pair<std::string, const CLI::Option*>> unused;  // CLI11 names hidden options ""
  for (const char* name : {"--train-iters", "--save", "--load", "--save-interval", "--log-interval",
                           "--sample-length", "--sample-prompt", "--sample-temperature", "--eval-interval",
                           "--eval-iters", "--skip-train", "--logits-out", "--no-load-optim", "--finetune",
                           "--exit-interval", "--exit-duration-in-mins", "--exit-on-missing-checkpoint",
                           "--train-samples"}) {
    CLI::Option* opt = cmd->get_option(name);
    opt->group("");
    unused.emplace_back(name, opt);
  }
  auto w8 = std::make_shared<W8a16Flags>();
  cmd->add_option("--w8a16", w8->spec,
                  "With --layer row: check the frozen row layer with an int8 weight: per-tensor, per-channel or "
                  "per-group:G (G a multiple of 32 below each rank's k slice)");
  cmd->add_flag("--w8a16-asymmetric", w8->asymmetric, "--w8a16: quantise with offsets (asymmetric) instead of symmetric");
  // --op ring_attention: the head dimension is its own flag; --context-parallel-size, --attention-mask-type,
  // --use-cp-send-recv-overlap, --cp-window-size, --seq-length, --num-attention-heads and --micro-batch-size are
  // training flags.
  auto ring = std::make_shared<RingFlags>();
  // coc train's --kv-channels (Megatron's, checked against the model's head dimension) means the ring check's own
  // head dimension here.
  cmd->remove_option(cmd->get_option("--kv-channels"));
  ring->kv = cmd->add_option("--kv-channels", ring->kv_channels, "--op ring_attention: head dimension D")
                 ->capture_default_str();
  ring->cp = cmd->get_option("--context-parallel-size");
  for (const char* name : {"--m", "--k", "--n", "--group-query-attention", "--num-query-groups"})
    ring->unused.push_back(cmd->get_option(name));
  return [o, cmd, steps, unused, w8, ring] {
    for (const auto& [name, opt] : unused)
      if (opt->count() > 0)
        throw_invalid("coc check does not take {}{}", name,
                      name == "--train-iters" ? ": it takes --train-steps K for the loss comparison"
                                              : " (it trains only to compare losses, in memory)");
    if (steps->count() > 0 && o->train_steps < 1)
      throw_invalid("--train-steps must be >= 1 (got {})", o->train_steps);
    // Each tolerance named alone; --tp-rtol's NaN means "not given" (its default depends on --bf16), so a NaN typed
    // by hand is refused like any other non-number.
    const bool tp_rtol_given = cmd->get_option("--tp-rtol")->count() > 0;
    for (const auto& [flag, v, given] : {std::tuple{"--rtol", o->rtol, true},
                                         std::tuple{"--tp-rtol", o->tp_rtol, tp_rtol_given},
                                         std::tuple{"--bf16-rtol", o->bf16_rtol, true}})
      if (given && !(v >= 0)) throw_invalid("{} must be a number >= 0 (got {})", flag, v);
    const int modes = (!o->op.empty()) + (!o->layer.empty()) + (o->train_steps > 0);
    if (modes != 1)
      throw_invalid("coc check needs exactly one of --op OP, --layer column|row|moe, --train-steps K (see coc check "
                    "--help)");
    // The command line's flags only, as `unused` above: a coc train --config file's values are ignored where they
    // mean nothing.
    check_mode_flags(*cmd, *o, !w8->spec.empty());
    const std::string moe_flag = o->train.moe.given();  // the command line's, as above
    if (!o->train.config_path.empty()) {
      apply_yaml_config(cmd, o->train.config_path);
      // A train-iters from the file would still set the default LR warmup (train-iters / 10).
      o->train.cfg.train_iters = TrainConfig{}.train_iters;
    }
    // After the config file: --bf16 may come from it.
    if (o->train_steps > 0 && cmd->get_option("--bf16-rtol")->count() > 0 && !o->train.precision.bf16)
      throw_invalid("coc check --train-steps: --bf16-rtol bounds the --bf16 curve against fp32's; add --bf16, or "
                    "drop it");
    if (o->train_steps == 0 && o->train.precision.bf16 && has_bf16_path(*o, !w8->spec.empty()) &&
        cmd->get_option("--rtol")->count() > 0)
      throw_invalid("coc check {} --bf16: --rtol does not apply: each element is compared with its bf16 rounding "
                    "bound (err/bound <= 1 passes); drop --rtol",
                    mode_name(*o));
    log::set_level(o->train.verbose > 0 ? 1 + o->train.verbose : 0);
    set_blas_threads(1);
    if (w8->asymmetric && w8->spec.empty())
      throw_invalid("--w8a16-asymmetric needs --w8a16 per-tensor|per-channel|per-group:G (with --layer row)");
    if (!w8->spec.empty() && o->train.cfg.use_mc2)
      throw_invalid("--w8a16 and --use-mc2 do not combine: MC2 fuses the row layer's reduce-scatter, and w8a16 "
                    "exists for matmul_all_reduce; use --coc-fused-kernel for a fused w8a16 all-reduce");
    if (!w8->spec.empty() && (o->layer != "row" || !o->op.empty() || o->train_steps > 0))
      throw_invalid("--w8a16 applies to --layer row only (the frozen row-parallel layer; w8a16 exists for "
                    "matmul_all_reduce only)");
    if (o->op != "ring_attention" && ring->kv->count() > 0)
      throw_invalid("coc check: --kv-channels applies to --op ring_attention only");
    if (!o->op.empty() && o->op != "ring_attention")
      for (const char* name : {"--context-parallel-size", "--use-cp-send-recv-overlap", "--cp-window-size",
                               "--attention-mask-type"})
        if (cmd->get_option(name)->count() > 0)
          throw_invalid("coc check: {} applies to --op ring_attention and --train-steps only", name);
    CheckOptions& c = *o;
    if (c.op == "ring_attention") return check_ring(c, *ring);
    c.N = c.train.cfg.coc_parallel_num;
    c.sp = c.train.cfg.sequence_parallel;
    c.deterministic = c.train.cfg.deterministic;
    c.fused = c.train.cfg.coc_fused_kernel;
    c.mc2 = c.train.cfg.use_mc2;
    if (c.fused && c.mc2) ParallelContext::check_fused_flags(true, true, c.sp);
    if (!moe_flag.empty() && c.layer != "moe" && c.train_steps == 0)
      throw_invalid("{} applies to --layer moe and --train-steps only", moe_flag);
    if (c.train_steps > 0) return check_train(c);
    if (c.layer == "moe") return check_moe(c);
    const int world = world_size();
    refuse_oversized(c.m, c.k, c.n);
    Mesh g = make_mesh({.tp = c.train.tp == 0 ? world : c.train.tp}, c.train.comm_options());
    if ((c.fused || c.mc2) && g.tp_size() == 1 && g.world->rank() == 0)
      log::warn("tp=1: there is nothing to fuse, so this checks the unfused op; run on 2 or more ranks (or "
                "--tp 2+) to check the fused kernels");
    if (!w8->spec.empty()) return check_w8a16(c, *w8, g);
    return check_op_or_layer(c, g);
  };
}

}  // namespace coc::cli
