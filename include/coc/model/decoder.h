// The LLaMA-style decoder (Touvron et al. 2023), tensor-parallel Megatron-style, with explicit forward and backward
// in the manner of Karpathy's llm.c:
//   x0 = VocabParallelEmbedding(tokens)
//   x_{i+1} = TransformerLayer_i(x_i)                  (attention block + MLP or MoE block; model/transformer_layer.h)
//   logits = ColumnParallel_lm_head(RMSNorm(x_L)) → vocab-parallel cross-entropy
// Heads are split across TP ranks (each rank owns heads/T whole heads of q and G/T of k and v), the SwiGLU width F is
// split in F/T columns of both gate and up, and the vocabulary in split_rows(V, T, r) rows. With
// --sequence-parallel, the residual stream, norms and embedding output hold this rank's sequence shard [m_r, H]; the
// column layers all-gather it and the row layers reduce-scatter back (Korthikanti et al. 2022).
//
// Initialisation is identical for any tp: each weight element is drawn from a counter-based normal generator keyed
// by (seed, parameter name, element index of the full weight), so a shard draws exactly its elements of the full
// matrix. Output projections use std / sqrt(2·layers) (Megatron's scaled init).
//
// Shapes: tokens/targets are m = S·B ids, sequence-major (index t·B + b). Units: loss in nats (mean over tokens).
//
// Modules and hooks. The decoder is a list of modules in registration order: 0 = the embedding, 1..L = the layers,
// L+1 = the head (final norm, output layer and loss). forward() and backward() stay one explicit loop each; around
// every module they call the hooks registered for that point (pre_forward, post_forward in order 0..L+1;
// pre_backward, post_backward in order L+1..0). Sharded data parallelism registers its parameter gathers, frees
// and gradient reduce-scatters there (PyTorch FSDP2's module hooks); this is a hook list, not an autograd engine.
//
// Pipeline stages (ModelGroups::pp of size P > 1; model/pipeline_schedule.h runs them): stage s = pp rank s holds
// the contiguous layers pipeline_stage_layers gives it, the embedding only on stage 0 and the head only on stage
// P - 1. Parameter names and initialisation stay global (layers.<global index>...), so a stage holds exactly the
// weights those layers have at P = 1. Modules keep their numbering (0 = the embedding, 1..L_s = the stage's layers,
// L_s + 1 = the head); a stage without the embedding or the head has that module with no parameters. A stage runs
// forward_stage and backward_stage per micro-batch, each micro-batch's activations in its own slot
// (set_pipeline_slots), since 1F1B keeps up to P micro-batches in flight on stage 0. Under the interleaved schedule
// (PipelineSplit::virtual_stages = V > 1) the stage holds V model chunks, chunk c the contiguous layers of virtual
// stage c·P + s; its layers are modules 1..L_s in chunk order, and each pass runs one chunk's layers, with slots of
// its own.
//
// Activation recomputation (set_recompute): backward walks the layers in chunks (recompute_chunks). A recomputed
// chunk keeps only its input (a checkpoint) from forward; in backward its pre-backward hooks run first (so a
// sharded strategy gathers each module's parameters once), then its forward runs again from the checkpoint without
// the forward hooks (no forward prefetch), then each layer's backward as usual. On a pipeline stage each model chunk
// is walked on its own (Megatron-core builds one TransformerBlock per virtual stage, and its recompute_num_layers
// counts that block's layers), so no recomputed chunk straddles two model chunks.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "coc/model/model_config.h"
#include "coc/model/transformer_layer.h"
#include "coc/parallel/context.h"
#include "coc/parallel/linear.h"
#include "coc/parallel/module_hooks.h"
#include "coc/parallel/ring_attention.h"
#include "coc/parallel/vocab_parallel.h"

namespace coc {

/// Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: the layers of the first
/// and last stage (0: not given, the even split).
struct PipelineSplit {
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  /// Megatron's --num-virtual-stages-per-pipeline-rank V: model chunks per rank for the interleaved 1F1B schedule
  /// (model/pipeline_schedule.h); 1: one chunk per rank, plain 1F1B.
  int virtual_stages = 1;
};

/// The number of layers of each of `stages` pipeline stages (Megatron's get_num_layers_to_build): `split`'s counts
/// for the first and last stage where given, and the other layers evenly over the other stages. Throws uniform
/// kInvalidArgument, one line naming the flags and the fix, when the layers do not divide evenly, or a stage would
/// get no layer (or the given counts exceed the layers). stages >= 1.
std::vector<int> pipeline_stage_layers(int layers, int stages, const PipelineSplit& split = {});

/// The layers of each of the stages × V virtual pipeline stages, V = split.virtual_stages (Megatron-core's
/// interleaved layout, get_transformer_layer_offset: virtual stage v = c·P + s is model chunk c of rank s, and its
/// layers are contiguous). V = 1: pipeline_stage_layers. V > 1: layers / (P·V) each. Throws uniform
/// kInvalidArgument, one line naming the flags and the fix, for V < 1, V > 1 with stages == 1 or with
/// --decoder-first/last-pipeline-num-layers (not supported with virtual stages), and layers not divisible by P·V.
std::vector<int> pipeline_virtual_stage_layers(int layers, int stages, const PipelineSplit& split = {});

class Decoder {
 public:
  /// The model `cfg` on `groups` (copied; every group, and `ctx`, must outlive the decoder), with the options of
  /// `ctx`, whose tp must be groups.tp. A MoE model's layers take their run settings from `moe` (TransformerLayer)
  /// and need groups.ep and groups.dp_cp. Validates cfg against tp and initialises parameters from `seed`. Throws
  /// uniform kInvalidArgument for a bad config, a missing group, or a MoE model with sequence parallelism over
  /// tp > 1 (a sequence shard's routing would need the tp ranks in the aux loss and the expert gradients summed
  /// over tp, which coc does not do).
  /// With groups.pp of size P > 1 the decoder is stage s = groups.pp->rank() of the layout
  /// pipeline_virtual_stage_layers(cfg.num_layers, P, `split`) (its errors): with V = split.virtual_stages it holds
  /// V model chunks, chunk c the layers of virtual stage c·P + s. A stage refuses MoE layers (kInvalidArgument: not
  /// supported yet).
  Decoder(const ModelConfig& cfg, const ModelGroups& groups, const ParallelContext* ctx, uint64_t seed,
          const MoeConfig& moe = {}, const PipelineSplit& split = {});
  ~Decoder();

  /// Forward over a micro-batch of `batch` sequences of length S = m / batch; returns the mean loss (nats),
  /// identical on every TP rank. Keeps the activations for backward. One stage only (forward_stage otherwise).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t batch);
  /// Backward of the last forward; gradients are accumulated (+=) scaled by `loss_scale` (1/micro-batches). A MoE
  /// model's aux losses are part of the objective: their gradient is added with the same scale, times the token
  /// group's size (the gradient synchronisation divides every summed gradient by dp × cp; docs/semantics.md §6).
  void backward(float loss_scale);

  /// --overlap-forward-micro-batches (coc's own, beyond Megatron): the forwards of two micro-batches of `batch`
  /// sequences through the embedding and the layers, each layer's interleaved (TransformerLayer::forward_pair), the
  /// activations of a in slot 0 and of b in slot 1 of model chunk 0 (set_pipeline_slots(0, 2) first). Each
  /// micro-batch's last layer output is kept for its head: then, for slot 0 and then slot 1, forward_head(slot)
  /// and at once backward_stage(0, slot, {}, scale, {}). The pointers must stay valid until slot 1's backward.
  /// Gives forward()'s bits for each micro-batch. One stage, dense layers, local attention, no recomputation and no
  /// forward hooks (kInternal otherwise: the trainer refuses those combinations first, one line each).
  void forward_pair(const int32_t* tokens_a, const int32_t* targets_a, const int32_t* tokens_b,
                    const int32_t* targets_b, int64_t batch);
  /// The head (final norm, output layer, loss) over the last layer output forward_pair kept for `slot` (0 or 1);
  /// returns the mean loss (nats). That slot's backward_stage must follow before the other slot's head.
  double forward_head(int slot);
  // ---- Pipeline stages (model/pipeline_schedule.h) ----
  /// The stage (pp rank) and the number of stages; the global index of this stage's first layer (of chunk 0) and
  /// its layer count (all chunks); whether it holds the embedding (first) and the head (last). One stage: 0, 1, 0,
  /// L, true, true.
  int stage() const { return stage_; }
  int num_stages() const { return stages_; }
  int first_layer() const { return chunk_first_layer(0); }
  int num_local_layers() const { return static_cast<int>(layers_.size()); }
  bool is_first_stage() const { return embedding_ != nullptr; }
  bool is_last_stage() const { return lm_head_ != nullptr; }
  /// Model chunks V of this rank (virtual pipeline stages; 1 without interleaving). Chunk c holds the contiguous
  /// layers [chunk_first_layer(c), + chunk_num_layers(c)) (global indices); chunk 0 of stage 0 the embedding
  /// (holds_embedding), chunk V - 1 of stage P - 1 the head (holds_head). c must lie in [0, V).
  int num_chunks() const { return static_cast<int>(chunk_first_layer_.size()); }
  int chunk_first_layer(int chunk) const { return chunk_first_layer_[static_cast<size_t>(chunk)]; }
  int chunk_num_layers(int chunk) const {
    return chunk_begin_[static_cast<size_t>(chunk) + 1] - chunk_begin_[static_cast<size_t>(chunk)];
  }
  bool holds_embedding(int chunk) const { return chunk == 0 && embedding_ != nullptr; }
  bool holds_head(int chunk) const { return chunk == num_chunks() - 1 && lm_head_ != nullptr; }
  /// Keeps the activations of up to `n` >= 1 micro-batches of model chunk `chunk` alive at once, one slot each
  /// (slot 0: the chunk's layers' own buffers; slot k > 0 holds the chunk's layers only). Under recomputation each
  /// slot keeps its recomputed chunks' inputs and the recomputed layers of every model chunk share the recomputation
  /// slots (a micro-batch's recomputation and backward run back to back). Not collective; slots allocate on first
  /// use.
  void set_pipeline_slots(int chunk, int n);
  /// ml: the rows of the residual stream this rank holds for micro-batches of `batch` sequences (its sequence shard
  /// under SP, else S·B): A(i) and G(i) of the pipeline are [ml, H].
  int64_t activation_rows(int64_t batch) const { return local_dims(cfg_, *ctx_, layer_pass(batch)).ml; }
  /// One micro-batch's forward through model chunk `chunk`'s layers, its activations kept in the chunk's `slot`
  /// (< set_pipeline_slots' n) until its backward_stage. The chunk holding the embedding embeds `tokens` (m = S·B
  /// ids; `input` is ignored); another reads the previous virtual stage's output `input` [ml, H] fp32 (rows as the
  /// residual stream holds them: the sequence shard under SP). The chunk holding the head runs it on `targets` and
  /// returns the mean loss (nats); another writes its last layer's output to `output` [ml, H] and returns 0.
  /// `tokens` and `targets` must stay valid until the slot's backward. The embedding's hooks run with chunk 0 only
  /// and the head's with chunk V - 1, so every module's hooks run once per micro-batch. Collective over tp (and the
  /// groups of the layers' ops), not over pp.
  double forward_stage(int chunk, int slot, const int32_t* tokens, const int32_t* targets, ConstMatrixView input,
                       int64_t batch, MatrixView output);
  /// The backward of the micro-batch in `chunk`'s `slot`; gradients accumulate scaled by `loss_scale` as in
  /// backward(). The chunk holding the head starts from its loss (and must run it right after that micro-batch's
  /// forward: the head keeps one micro-batch; kInternal otherwise); another from `dy` = dL/d(output) [ml, H] fp32,
  /// sent back by the next virtual stage. A chunk without the embedding writes dL/d(input) [ml, H] to `dx`.
  void backward_stage(int chunk, int slot, ConstMatrixView dy, float loss_scale, MatrixView dx);

  /// Allocates every buffer forward() and backward() keep for micro-batches of `batch` sequences: the activations,
  /// the gradients passed between layers, and the linear layers' gathered inputs and dY. Buffers already of that
  /// size are kept. forward() and backward() size what they use anyway, so the call is optional. The trainer makes
  /// it before the first step. A fresh buffer's first write faults in every page, which the kernel zeroes: ~0.65 ms
  /// per MB on the 2-vCPU test VMs, ~230 ms for configs/cluster-e2e.yaml. That cost belongs to start-up, not to
  /// step 1 (docs/performance.md point 25). With two slots on one stage (set_pipeline_slots(0, 2), forward_pair's)
  /// the second micro-batch's too; a pipeline stage's other slots are sized in its first step. MoE layers size their
  /// own buffers in their first step. Not collective.
  void reserve_activations(int64_t batch);
  /// Full-vocabulary logits [V] of the last position of `tokens` (len >= 1), batch 1, for sampling. Runs without
  /// sequence parallelism and without keeping activations. Collective over TP. One stage only (kInternal
  /// otherwise: PipelineSchedule::next_token_logits runs sample_stage on each).
  std::vector<float> next_token_logits(const int32_t* tokens, int64_t len);
  /// Model chunk `chunk`'s part of next_token_logits under pipeline parallelism (model/pipeline_schedule.h): the
  /// chunk with the embedding embeds `tokens` (len ids), another reads the previous virtual stage's output `input`
  /// [len, H]; a chunk without the head writes its output to `output` [len, H] and returns {}, the one with it
  /// returns the logits [V]. Without SP, batch 1, in activation slot 0. Collective over TP. One stage:
  /// next_token_logits itself.
  std::vector<float> sample_stage(int chunk, const int32_t* tokens, int64_t len, ConstMatrixView input,
                                  MatrixView output);

  /// Every layer reads `ctx` from the next pass on (`coc bench train --baseline` switches between two contexts;
  /// next_token_logits runs under a copy without SP). `ctx` must outlive its use and name groups.tp (kInternal
  /// otherwise); sequence_parallel must match the one the decoder was built with, except for sampling.
  void set_parallel_context(const ParallelContext* ctx);
  const ParallelContext& parallel_context() const { return *ctx_; }

  /// Every parameter: the concatenation of module_params(0..num_modules()-1), in that order.
  ParamList params();
  /// L + 2: the embedding, the L layers, the head.
  int num_modules() const { return static_cast<int>(layers_.size()) + 2; }
  /// The parameters of module i (0 <= i < num_modules(); kInternal otherwise).
  ParamList module_params(int module);
  /// Adds `hook` at `point` of every module; hooks of one point run in the order they were added. A hook that
  /// throws aborts the pass (the error propagates out of forward/backward).
  void add_hook(HookPoint point, ModuleHook hook);
  const ModelConfig& config() const { return cfg_; }

  // ---- Mixture of experts ----
  /// The MoE layers' load-balancing losses of the last forward, summed (each already times its coefficient and
  /// global over the token group, so the same on every rank); 0 for a dense model. The training objective is the
  /// language-model loss plus this (Megatron adds it through MoEAuxLossAutoScaler; backward() adds its gradient).
  /// `chunk` >= 0: of model chunk `chunk`'s layers only (the last forward_stage of that chunk; interleaving).
  double moe_aux_loss(int chunk = -1) const;
  /// MoE layers in the model (0 for a dense one).
  int moe_layers() const;
  /// The expert-parallel dispatcher (and mc2's chunk count) of every MoE layer from now on (`coc bench train
  /// --baseline` switches it between iterations); the result does not depend on it beyond rounding (bitwise with
  /// --deterministic).
  void set_moe_dispatcher(MoeDispatcher d, int mc2_chunks);

  // ---- Context parallelism (parallel/ring_attention.h) ----
  /// From now on, attention runs through the ring over `ring` with `opts`: the micro-batches this decoder sees are
  /// the zig-zag chunks of cp rank ring.rank() (cfg.seq_length = S / CP local positions, two chunks of S / (2·CP)),
  /// and RoPE rotates by global positions. `ring` must be over groups.cp (kInternal otherwise) and outlive the
  /// decoder. Sampling (next_token_logits) keeps the
  /// full local attention: every cp rank holds the whole model.
  void set_context_parallel(const CpRing& ring, const RingAttentionOptions& opts);

  // ---- Activation recomputation (model/transformer_layer.h) ----
  /// From the next forward on, recompute as `r` says, within each model chunk: `r` is validated against each
  /// chunk's layer count (kInvalidArgument), so --recompute-num-layers counts the layers of one stage, or of one
  /// virtual stage under interleaving (Megatron-core's rule). May change between steps (`coc bench train
  /// --baseline` alternates it); buffers once allocated are kept, so a switch costs no page faults. The results do
  /// not change: bitwise under --deterministic. On a pipeline stage it works with any number of micro-batch slots
  /// and model chunks.
  void set_recompute(const RecomputeConfig& r);
  const RecomputeConfig& recompute() const { return recompute_; }
  /// Bytes of the activations the current setting keeps from forward to backward for the last micro-batch size:
  /// the embedding and head buffers, every layer's own activations, the shared recomputation slots and the
  /// checkpoints (MoE layers' routing buffers are not counted). The memory line reports it.
  int64_t activation_bytes() const;

 private:
  void init_parameters(uint64_t seed);
  /// Builds this stage's layers, chunk by chunk, from the layers of every virtual stage (`counts`, P·V entries).
  void build_layers(const MoeConfig& moe, uint64_t seed, const std::vector<int>& counts);
  /// Whether some model chunk keeps more than one micro-batch's activations (set_pipeline_slots).
  bool many_slots() const;
  void run_hooks(HookPoint point, int module);
  /// Sizes forward()'s buffers for micro-batches of `batch` sequences, and backward()'s too if `backward`
  /// (reserve_activations; Tensor::resize keeps a buffer whose shape is unchanged).
  void size_buffers(int64_t batch, bool backward);
  /// The gradient scratch every layer's backward shares (LayerGrads beyond x and ln).
  void size_layer_grads(const LayerPass& p);
  /// What every layer's pass shares for micro-batches of `batch` sequences.
  LayerPass layer_pass(int64_t batch) const;
  /// The final norm, output layer and loss over the last layer's output x [ml, H]; returns the loss.
  double head_forward(ConstMatrixView x);
  /// The head's backward: leaves dL/dx_L in grads_.x.
  void head_backward(float loss_scale);
  /// Runs the forward of the layers of recomputed chunk `c` again from its checkpoint (no hooks).
  void recompute_chunk(size_t c, const LayerPass& p);
  std::array<std::vector<ModuleHook>, 4> hooks_;
  ModelConfig cfg_;
  ModelGroups groups_;
  const ParallelContext* ctx_;
  /// The delayed weight-gradient work of the running backward (--delay-wgrad-compute): the layers queue and run it;
  /// run_hooks runs what is left before each module's post-backward hooks.
  WgradQueue wgrad_;
  std::optional<CpRing> cp_ring_;  ///< set_context_parallel; nullopt: attention_forward over the local sequence
  RingAttentionOptions cp_opts_;
  bool cp_off_ = false;            ///< next_token_logits: local attention even with a ring
  bool ring_attention_on() const;
  std::unique_ptr<VocabParallelEmbedding> embedding_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  Param final_norm_;
  std::unique_ptr<ColumnParallelLinear> lm_head_;
  std::unique_ptr<VocabParallelCrossEntropy> loss_;
  std::unique_ptr<GatheredVocabHead> gathered_head_;  ///< lm_head_'s VocabComm::kWeights path
  bool gathered_vocab_ = false;  ///< this micro-batch's vocabulary layers took the kWeights path
  // Recomputation (set_recompute): the chunks backward walks (each model chunk's own, in layer order), the activation
  // slots the recomputed layers share (slot j serves the j-th layer of a chunk: a kept layer's own buffers where one
  // lies above every recomputed chunk, else the decoder's own slots), and selective's shared attention
  // probabilities. Each micro-batch slot keeps its recomputed chunks' inputs (MicroBatchSlot::checkpoints).
  RecomputeConfig recompute_;
  std::vector<LayerChunk> chunks_;
  std::vector<LayerActivations> recompute_slots_;
  size_t own_slots_in_use_ = 0;  ///< recompute_slots_[0, n) serve as slots now
  Tensor shared_probs_;
  /// Per layer: its recomputation slot (set_recompute), null for a kept layer (its own buffers or a pipeline slot's).
  std::vector<LayerActivations*> recompute_acts_;
  int cur_chunk_ = 0, cur_slot_ = 0;  ///< use_slot's model chunk and slot: the micro-batch being run
  /// The input kept for recomputed chunk `c` (of chunks_, inside model chunk cur_chunk_) of the current micro-batch.
  Tensor& checkpoint(size_t c);
  /// Sizes the checkpoints of model chunk `chunk`'s slot `slot` for [ml, H] inputs (its recomputed chunks' only).
  void size_checkpoints(int chunk, int slot, int64_t ml);
  /// Whether recomputation chunk `c` lies in model chunk `chunk` (recompute chunks never straddle two).
  bool in_model_chunk(const LayerChunk& c, int chunk) const {
    return c.begin >= chunk_begin_[static_cast<size_t>(chunk)] && c.end <= chunk_begin_[static_cast<size_t>(chunk) + 1];
  }
  /// Points model chunk `chunk`'s layers at their recomputation slot, or else at its pipeline slot `slot`'s
  /// activations (their own for 0), with selective's shared attention probabilities.
  void point_layers(int chunk, int slot);
  // Pipeline stages: this stage, the stage count, each model chunk's first layer (global index) and where its layers
  // begin in layers_ (one more entry: the end), and each chunk's micro-batch slots (set_pipeline_slots): slot k > 0
  // holds one LayerActivations per layer of the chunk; slot 0 is the layers' own buffers.
  int stage_ = 0, stages_ = 1;
  std::vector<int> chunk_first_layer_{0}, chunk_begin_{0, 0};
  struct MicroBatchSlot {
    std::vector<LayerActivations> layers;
    /// Recomputation: the input of each recomputed chunk of this model chunk (indexed like chunks_; the others and
    /// the chunks of other model chunks stay empty).
    std::vector<Tensor> checkpoints;
    const int32_t* tokens = nullptr;
    const int32_t* targets = nullptr;
  };
  std::vector<std::vector<MicroBatchSlot>> slots_;  ///< [chunk][slot]: one slot per chunk at first
  std::pair<int, int> last_forward_{-1, -1};           ///< (chunk, slot) of the last forward_stage
  Tensor x0_pair_, xf_pair_;  ///< forward_pair: micro-batch b's embedding and last layer outputs [ml, H]
  /// Points the layers of `chunk` at its slot `slot`'s activations (nothing while every chunk has one slot:
  /// recomputation owns the pointers then).
  void use_slot(int chunk, int slot);
  /// The forward of the layers [lo, hi) of layers_ from x [ml, H] into xf_ (recomputed chunks keep their
  /// checkpoints), with their hooks.
  void layers_forward(const LayerPass& p, ConstMatrixView x, int lo, int hi);
  /// The backward of the layers [lo, hi) from grads_.x = dL/d(output of layer hi - 1), with their hooks.
  void layers_backward(const LayerPass& p, float loss_scale, int lo, int hi);
  // Activations of the last forward.
  int64_t m_ = 0, batch_ = 0;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  Tensor x0_, xf_, lnf_, rstdf_, logits_, dlogits_, dlnf_;
  LayerGrads grads_;  ///< passed from layer to layer in backward
};

}  // namespace coc
