// One decoder layer of the LLaMA-style model (Megatron-core's TransformerLayer): an attention block and an MLP block,
//   h  = x + RowParallel_o(Attention(RoPE(ColumnParallel_qkv(RMSNorm(x)))))
//   x' = h + RowParallel_down(SwiGLU(ColumnParallel_gate_up(RMSNorm(h))))      (dense)
//      or h + MoE(RMSNorm(h))                                                   (a MoE layer, parallel/moe.h)
// with grouped-query attention (k and v have G heads, each repeated over heads/G query heads) and, under context
// parallelism, ring attention over the zig-zag chunks (parallel/ring_attention.h).
//
// The layer owns its parameters, the linear layers (and with them the CoC pipelines of docs/semantics.md §2), and
// a pointer to the activations its backward reads (LayerActivations). A layer that is recomputed
// (--recompute-granularity full) keeps its activations in a slot shared with the other recomputed layers, and
// forward() runs again inside the decoder's backward; with `selective` only the attention probabilities (Megatron's
// "core attention") are shared and recomputed. Which layers recompute is the decoder's choice (recompute_chunks).
//
// Shapes: a micro-batch of B sequences of S positions is m = S·B rows, sequence-major (row t·B + b). Outside TP
// regions a rank holds ml rows (its sequence shard under --sequence-parallel, else m); inside, m rows of its share
// of heads and FFN columns (LocalDims). Everything is fp32.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/model/model_config.h"
#include "coc/parallel/context.h"
#include "coc/parallel/linear.h"
#include "coc/parallel/moe.h"
#include "coc/parallel/ring_attention.h"

namespace coc {

struct AttentionBf16Heads;  // coc/kernels/transformer_ops.h

/// What one pass of every layer shares for a micro-batch, set by the decoder: what varies between passes (the
/// micro-batch size; sampling runs one sequence of its own length, without the ring).
struct LayerPass {
  int64_t batch = 1;                               ///< sequences in the micro-batch
  int64_t seq_length = 1;                          ///< S: positions per sequence on this rank (S / CP under cp)
  const CpRing* ring = nullptr;                    ///< ring attention over cp; null: local attention
  const RingAttentionOptions* ring_opts = nullptr; ///< with `ring`
  int64_t moe_token_offset = 0;  ///< the index of this rank's first token in the global batch (the fixed router)
};

/// A micro-batch as this rank holds it: m = S·B rows in all and ml in its sequence-parallel shard, the hidden size H
/// and head size D, the query heads hl, key/value groups gl and FFN columns fl of its tp share; S positions.
struct LocalDims {
  int64_t m, ml, H, D, hl, gl, fl, S;
};
LocalDims local_dims(const ModelConfig& c, const ParallelContext& ctx, const LayerPass& p);

/// The activations a layer's backward reads, written by its forward. Local rows ml: x_in (the layer's input),
/// ln1_out, x_mid (the residual after attention), ln2_out, rstd1/2 [ml]; full rows m: qkv_out [m, (hl + 2gl)·D],
/// attn_out [m, hl·D], gu_out [m, 2fl], act_out [m, fl]; probs [B·hl·S·S] (local attention) or lse [m·hl] (ring);
/// k_rep, v_rep [m, hl·D] (GQA only, not under --bf16, whose packed operands hold each group once). The column
/// layers' gathered inputs (SP) are kept in qkv_in and gate_up_in, or under --bf16 in qkv_in16 and gate_up_in16
/// (ColumnParallelLinear::keep_input_in). qkv_heads16: under --bf16 with local attention, q, k and v once more as
/// attention's packed bf16 operands (AttentionBf16Heads: q's hl heads, then k's and v's gl each, [(hl + 2gl)·m, D]
/// in all); empty until a bf16 pass, and under a ring. qkv_out stays empty until a pass that keeps it: under --bf16
/// with local attention qkv's output goes to scratch shared by the layers (TransformerLayer::qkv_out).
struct LayerActivations {
  Tensor x_in, ln1_out, rstd1, qkv_out, attn_out, x_mid, ln2_out, rstd2, gu_out, act_out, k_rep, v_rep;
  Tensor qkv_in, gate_up_in;
  Bf16Matrix qkv_in16, gate_up_in16, qkv_heads16;
  Tensor probs;
  std::vector<float> lse;
  /// A MoE layer's MoeLayer::plan() of this micro-batch (its routing and expert activations), set back before its
  /// backward; not counted in bytes() (MoeLayer allocates it).
  std::shared_ptr<void> moe_plan;
  /// Bytes of every buffer above (probs only if `with_probs`: under selective recomputation they live elsewhere).
  int64_t bytes(bool with_probs) const;
};

/// The gradients a layer's backward passes through, shared by every layer (each kernel overwrites its output;
/// rmsnorm_backward adds to dx after the kernel before it overwrote it): x [ml, H] holds dL/d(output) on entry and
/// dL/d(input) on exit; the others are scratch of the shapes of the matching activations.
struct LayerGrads {
  Tensor x, ln, act, gu, attn, qkv, k_rep, v_rep;
  /// Local attention's dK and dV between its backward's calls ([2m, hl·D]: attention_backward_blocks' dkv_heads);
  /// left empty, the calls read and write dK and dV themselves.
  Tensor dkv_heads;
};

class OnceWork;
class GemmOperandCopy;

/// What TransformerLayer::forward_pair leaves undone: micro-batch b's down projection and residual (`run`), and a
/// filler computing SwiGLU's rows it reads (`filler`, for the waits before it runs). Empty: nothing left.
struct PairTail {
  std::function<bool()> filler;
  std::function<void()> run;
};

class TransformerLayer {
 public:
  /// Layer `index` (0-based) of the model `c`, on `groups` (copied; the groups and `ctx`, whose tp is groups.tp,
  /// must outlive the layer). A MoE layer when `moe` is given: MoeConfig's run settings (capacity factor, aux loss
  /// coefficient, dispatcher, determinism, fixed router; its shape fields come from `c`), dispatching over
  /// groups.ep, the aux loss over groups.dp_cp; it runs on the rows a TP rank holds (without sequence parallelism
  /// every TP rank routes the same tokens and holds the same experts). Parameters are drawn from `seed` exactly as
  /// for any tp (init_normal; MoeLayer draws its own).
  TransformerLayer(const ModelConfig& c, int index, const ModelGroups& groups, const ParallelContext* ctx,
                   const MoeConfig* moe, uint64_t seed);
  TransformerLayer(const TransformerLayer&) = delete;
  TransformerLayer& operator=(const TransformerLayer&) = delete;

  /// input_layernorm, qkv, dense, post_attention_layernorm, then gate_up and down (or the MoE layer's).
  ParamList params();

  /// x [ml, H] → y [ml, H] (y may alias x: x is copied into x_in first). Keeps the activations for backward.
  void forward(const LayerPass& p, ConstMatrixView x, MatrixView y);
  /// The forwards of two micro-batches of the same pass, interleaved (--overlap-forward-micro-batches, coc's own,
  /// beyond Megatron): x_a → y_a with the activations kept in `a`, x_b → y_b in `b` (each [ml, H]; y may alias its
  /// x), so that each micro-batch's attention and SwiGLU fill the waits of the other's TP transfers
  /// (comm/wait_filler.h). The TP ops run in this order: qkv a, `prev`'s down b (the layer below's, whose output
  /// is x_b), qkv b, dense a and dense b (each returning with its reduction in flight), gate/up a, gate/up b,
  /// down a. This layer's down b is returned undone: the next layer's forward_pair runs it as `prev`, with a's
  /// attention filling its waits, or the caller runs it after the last layer; y_b is complete only then, and `b`
  /// and y_b must stay valid until it has run.
  /// Each micro-batch's results are forward()'s bits. Dense layers with local attention only (kInternal
  /// otherwise); recomputation is the caller's to refuse. The layer is left pointing at `a` (keep_activations_in).
  PairTail forward_pair(const LayerPass& p, LayerActivations& a, ConstMatrixView x_a, MatrixView y_a,
                        LayerActivations& b, ConstMatrixView x_b, MatrixView y_b, PairTail prev);
  /// Backward of the last forward (or recomputed forward) with the same pass; g.x: dL/dy in, dL/dx out. Weight
  /// gradients accumulate (+=); `loss_scale` scales the MoE aux loss's gradient like the language-model loss's.
  /// The linear layers queue and run delayed weight-gradient work on `wgrad` (--delay-wgrad-compute); some may be
  /// left on it when backward returns, for the caller to run before the layer's gradients are read.
  void backward(const LayerPass& p, float loss_scale, LayerGrads& g, WgradQueue& wgrad);
  /// Reads `ctx` (same TP group) from the next call on: Decoder::set_parallel_context.
  void set_context(const ParallelContext* ctx);
  /// Sizes the activations and the linear layers' buffers for passes like `p` (Tensor::resize keeps a buffer whose
  /// shape is unchanged); under a ring, attention keeps lse instead of probs. forward() calls it too.
  void reserve(const LayerPass& p);

  /// Where the activations live from now on: `shared` (a slot used by other recomputed layers too) or, for
  /// nullptr, the layer's own. `shared_probs`: the attention probabilities only (selective recomputation), or
  /// nullptr for the activations' own. Both must outlive the layer's use of them.
  void keep_activations_in(LayerActivations* shared, Tensor* shared_probs);
  /// Bytes of the activations this layer keeps in its own buffers now (0 for a layer using a shared slot).
  int64_t own_activation_bytes() const;
  /// The layer's own activation buffers, which a recomputed layer below may borrow as its slot: the decoder lends
  /// them only where this layer's backward ends before the borrower's recomputation begins.
  LayerActivations* own_activations() { return &own_; }

  bool is_moe() const { return moe_ != nullptr; }
  MoeLayer* moe() { return moe_.get(); }
  ColumnParallelLinear& qkv() { return qkv_; }
  RowParallelLinear& proj() { return proj_; }

 private:
  void init_parameters(const ModelConfig& c, uint64_t seed);
  void attention_block_forward(const LayerPass& p, const LocalDims& d);
  /// ln1, then qkv's forward (under SP its all-gather) with its row epilogue: bf16 storage, RoPE, bf16 packing.
  void qkv_forward(const LayerPass& p, const LocalDims& d);
  /// Local attention's query blocks over the current activations (after qkv_forward), each computed once, whoever
  /// asks first: proj_start's producer, a WaitFiller, or proj_start itself before the projection.
  std::shared_ptr<OnceWork> attention_work(const LayerPass& p, const LocalDims& d);
  /// The dense projection's forward (under SP its reduce-scatter), with local attention's blocks produced for its
  /// chunks under --attention-dense-pipeline (all of them first otherwise; null: attn_out is complete, the ring's),
  /// then the residual.
  void proj_forward(const LayerPass& p, const LocalDims& d, OnceWork* attention);
  /// proj_forward without the residual; `async`: returned with its reduction in flight (forward_async), x_mid is
  /// final after the result's wait().
  CocPending proj_start(const LayerPass& p, const LocalDims& d, OnceWork* attention, bool async);
  /// ln2, then gate/up's forward (under SP its all-gather), its output rows stored as a bf16 model stores them.
  void gate_up_forward(const LocalDims& d);
  /// SwiGLU's rows over the current activations, computed once each; rows computed while `act16` points at
  /// down's bf16 operand copy write their bf16 values there too.
  std::unique_ptr<OnceWork> swiglu_work(const LocalDims& d, GemmOperandCopy*& act16);
  /// The down projection's forward (under SP its reduce-scatter) into y, SwiGLU's rows produced for its chunks
  /// under --swiglu-down-pipeline (all of them first otherwise), then the residual; `act16` points at its bf16
  /// operand copy meanwhile.
  void down_forward(const LocalDims& d, OnceWork& swiglu, GemmOperandCopy*& act16, MatrixView y);
  /// out += residual, with out and the sum stored as a bf16 model stores them (under --bf16).
  void add_residual(MatrixView out, ConstMatrixView residual) const;
  void mlp_block_forward(const LayerPass& p, const LocalDims& d, MatrixView y);
  void mlp_block_backward(const LayerPass& p, float loss_scale, const LocalDims& d, LayerGrads& g, WgradQueue& q);
  void attention_block_backward(const LayerPass& p, const LocalDims& d, LayerGrads& g, WgradQueue& q);
  /// Attention's backward over query blocks [first, last) (local attention): writes dq's rows, adds to dk, dv.
  void attention_backward_range(const LocalDims& d, int64_t batch, LayerGrads& g, int64_t first, int64_t last);
  /// The dense projection's backward, handing dattn's rows to attention's backward block by block as they arrive
  /// (--attention-dense-backward-pipeline). Returns the blocks [0, n) attention's backward has not run yet: with
  /// `leave_tail`, those it would run after the last segment is in (--attention-qkv-backward-pipeline runs them).
  int64_t proj_backward_pipelined(const LocalDims& d, int64_t batch, LayerGrads& g, WgradQueue& q, bool leave_tail);
  /// The row-wise end of attention's backward for the rows of query blocks [first, last): GQA's sum of dK, dV over
  /// each group's query heads, then the inverse RoPE of dQ and dK, in place in g.qkv.
  void finish_dqkv_rows(const LocalDims& d, int64_t batch, LayerGrads& g, int64_t first, int64_t last);
  /// Whether qkv's output goes to scratch shared by the layers instead of acts_->qkv_out: under --bf16 with local
  /// attention, where nothing reads it after the forward's epilogue has packed q, k and v (qkv_heads16).
  static bool qkv_out_in_scratch(bool ring);
  /// qkv's output [m, (hl + 2gl)·D] for a pass with or without a ring: that scratch, or acts_->qkv_out.
  MatrixView qkv_out(const LocalDims& d, bool ring) const;
  /// acts_->qkv_heads16 as attention's operands, or nullptr outside --bf16 and where it is empty (a ring).
  const AttentionBf16Heads* packed_qkv(const LocalDims& d, int64_t batch, AttentionBf16Heads& out) const;
  /// Local attention's inputs after the forward's qkv (rotated, and under GQA repeated per query head), each
  /// [m, hl·D], and its packed bf16 operands (`packed`, null outside --bf16) which the kernels then read instead.
  struct AttentionInputs {
    ConstMatrixView q, k, v;
    const AttentionBf16Heads* packed;
  };
  AttentionInputs attention_inputs(const LocalDims& d, int64_t batch, AttentionBf16Heads& storage) const;
  /// RoPE of this cp rank's local rows x [2c·B, heads·D] by their global positions.
  void cp_rope(const CpRing& ring, MatrixView x, int64_t batch, int64_t heads, bool inverse) const;

  ModelConfig cfg_;
  std::string prefix_;
  ModelGroups groups_;
  const ParallelContext* ctx_;
  Param ln1_, ln2_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
  // The MLP: the dense SwiGLU (gate_up, down), or the MoE layer.
  std::unique_ptr<ColumnParallelLinear> gate_up_;
  std::unique_ptr<RowParallelLinear> down_;
  std::unique_ptr<MoeLayer> moe_;
  LayerActivations own_;
  LayerActivations* acts_ = &own_;  ///< own_, or a shared slot (full recomputation)
  Tensor* probs_ = &own_.probs;     ///< acts_->probs, or a shared buffer (selective recomputation)
};

/// The rows of the full fused [H + 2·KV, H] q/k/v weight (q block, then k, then v; KV = kv_heads × head_dim) that
/// TP rank `rank` of `tp` holds, in order: its whole query heads and its whole key/value groups.
std::vector<int64_t> qkv_row_map(const ModelConfig& c, int tp, int rank);
/// The rows of the full fused [2F, H] gate/up weight (gate block, then up) that TP rank `rank` holds.
std::vector<int64_t> gate_up_row_map(const ModelConfig& c, int tp, int rank);

/// Counter-based N(0, std²) sample for element `index` of the weight named by `key` under `seed`.
float init_normal(uint64_t seed, uint64_t key, uint64_t index, float std);

// ---- Activation recomputation (Megatron's --recompute-granularity, --recompute-method, --recompute-num-layers) --

/// --recompute-granularity: none; full = a recomputed layer keeps only its input and runs its forward again in
/// backward; selective = only the attention probabilities [B·heads·S·S] are dropped and recomputed (Megatron's
/// "core attention", the activation that grows with S²; with ring attention they are never stored, so selective
/// changes nothing there).
enum class RecomputeGranularity { kNone, kFull, kSelective };
/// --recompute-method (full only): uniform = the layers in chunks of N, each chunk checkpointed at its input and
/// recomputed as a whole; block = the first N layers each recomputed on its own, the others not.
enum class RecomputeMethod { kUniform, kBlock };

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  std::optional<RecomputeMethod> method;  ///< --recompute-method; full needs it, selective refuses it
  std::optional<int> num_layers;          ///< --recompute-num-layers N; full needs 1 <= N <= layers
  /// Megatron's checks (TransformerConfig, validate_args), one line each naming the flag and the fix
  /// (kInvalidArgument): full without a method or N, or with N outside [1, layers]; selective with a method or N.
  /// Without a granularity the method and N are not read.
  void validate(int layers) const;
};

/// "full", "selective" or "none"; throws kInvalidArgument naming --recompute-granularity otherwise.
RecomputeGranularity parse_recompute_granularity(const std::string& s);
/// "uniform" / "block"; throws kInvalidArgument naming --recompute-method otherwise.
RecomputeMethod parse_recompute_method(const std::string& s);
const char* to_string(RecomputeGranularity g);
const char* to_string(RecomputeMethod m);

/// A run of layers [begin, end) that backward treats as one: recomputed from the input of `begin`, or not.
struct LayerChunk {
  int begin = 0, end = 0;
  bool recompute = false;
};
/// The chunks of `layers` layers under `r` (validated first), in layer order, covering every layer once.
/// Full/uniform: chunks of N (the last may be shorter), all recomputed; full/block: the first N layers as chunks of
/// one, recomputed, the rest chunks of one, not; none or selective: chunks of one, not recomputed.
std::vector<LayerChunk> recompute_chunks(int layers, const RecomputeConfig& r);

}  // namespace coc
