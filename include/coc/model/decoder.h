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
// Activation recomputation (set_recompute): backward walks the layers in chunks (recompute_chunks). A recomputed
// chunk keeps only its input (a checkpoint) from forward; in backward its pre-backward hooks run first (so a
// sharded strategy gathers each module's parameters once), then its forward runs again from the checkpoint without
// the forward hooks (no forward prefetch), then each layer's backward as usual.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "coc/model/model_config.h"
#include "coc/model/transformer_layer.h"
#include "coc/parallel/context.h"
#include "coc/parallel/linear.h"
#include "coc/parallel/module_hooks.h"
#include "coc/parallel/ring_attention.h"
#include "coc/parallel/vocab_parallel.h"

namespace coc {

class Decoder {
 public:
  /// The model `cfg` on `groups` (copied; every group, and `ctx`, must outlive the decoder), with the options of
  /// `ctx`, whose tp must be groups.tp. A MoE model's layers take their run settings from `moe` (TransformerLayer)
  /// and need groups.ep and groups.dp_cp. Validates cfg against tp and initialises parameters from `seed`. Throws
  /// uniform kInvalidArgument for a bad config, a missing group, or a MoE model with sequence parallelism over
  /// tp > 1 (a sequence shard's routing would need the tp ranks in the aux loss and the expert gradients summed
  /// over tp, which coc does not do).
  Decoder(const ModelConfig& cfg, const ModelGroups& groups, const ParallelContext* ctx, uint64_t seed,
          const MoeConfig& moe = {});
  ~Decoder();

  /// Forward over a micro-batch of `batch` sequences of length S = m / batch; returns the mean loss (nats),
  /// identical on every TP rank. Keeps the activations for backward.
  double forward(const int32_t* tokens, const int32_t* targets, int64_t batch);
  /// Backward of the last forward; gradients are accumulated (+=) scaled by `loss_scale` (1/micro-batches). A MoE
  /// model's aux losses are part of the objective: their gradient is added with the same scale, times the token
  /// group's size (the gradient synchronisation divides every summed gradient by dp × cp; docs/semantics.md §6).
  void backward(float loss_scale);
  /// Allocates every buffer forward() and backward() keep for micro-batches of `batch` sequences: the activations,
  /// the gradients passed between layers, and the linear layers' gathered inputs and dY. Buffers already of that
  /// size are kept. forward() and backward() size what they use anyway, so the call is optional. The trainer makes
  /// it before the first step. A fresh buffer's first write faults in every page, which the kernel zeroes: ~0.65 ms
  /// per MB on the 2-vCPU test VMs, ~230 ms for configs/cluster-e2e.yaml. That cost belongs to start-up, not to
  /// step 1 (docs/performance.md point 25). MoE layers size their own buffers in their first step. Not collective.
  void reserve_activations(int64_t batch);
  /// Full-vocabulary logits [V] of the last position of `tokens` (len >= 1), batch 1, for sampling. Runs without
  /// sequence parallelism and without keeping activations. Collective over TP.
  std::vector<float> next_token_logits(const int32_t* tokens, int64_t len);

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
  double moe_aux_loss() const;
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
  /// From the next forward on, recompute as `r` says (validated against the layer count: kInvalidArgument). May
  /// change between steps (`coc bench train --baseline` alternates it); buffers once allocated are kept, so a switch
  /// costs no page faults. The results do not change: bitwise under --deterministic.
  void set_recompute(const RecomputeConfig& r);
  const RecomputeConfig& recompute() const { return recompute_; }
  /// Bytes of the activations the current setting keeps from forward to backward for the last micro-batch size:
  /// the embedding and head buffers, every layer's own activations, the shared recomputation slots and the
  /// checkpoints (MoE layers' routing buffers are not counted). The memory line reports it.
  int64_t activation_bytes() const;

 private:
  void init_parameters(uint64_t seed);
  void run_hooks(HookPoint point, int module);
  /// Sizes forward()'s buffers for micro-batches of `batch` sequences, and backward()'s too if `backward`
  /// (reserve_activations; Tensor::resize keeps a buffer whose shape is unchanged).
  void size_buffers(int64_t batch, bool backward);
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
  // Recomputation (set_recompute): the chunks backward walks, the activation slots the recomputed layers share (slot
  // j serves the j-th layer of a chunk: a kept layer's own buffers where one lies above every recomputed chunk, else
  // the decoder's own slots), the input of each recomputed chunk (indexed like chunks_), and selective's shared
  // attention probabilities.
  RecomputeConfig recompute_;
  std::vector<LayerChunk> chunks_;
  std::vector<LayerActivations> recompute_slots_;
  size_t own_slots_in_use_ = 0;  ///< recompute_slots_[0, n) serve as slots now
  std::vector<Tensor> checkpoints_;
  Tensor shared_probs_;
  // Activations of the last forward.
  int64_t m_ = 0, batch_ = 0;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  Tensor x0_, xf_, lnf_, rstdf_, logits_, dlogits_, dlnf_;
  LayerGrads grads_;  ///< passed from layer to layer in backward
};

}  // namespace coc
