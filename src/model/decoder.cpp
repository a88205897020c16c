#include "coc/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/partition.h"
#include "coc/runtime/tracer.h"
#include "param_init.h"

namespace coc {

std::vector<int> pipeline_stage_layers(int layers, int stages, const PipelineSplit& split) {
  COC_ASSERT(stages >= 1, "pipeline_stage_layers: {} stages", stages);
  const int first = split.first_stage_layers, last = split.last_stage_layers;
  if (first < 0 || last < 0)
    throw_invalid("--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers must be >= 1 when given "
                  "(got {} and {})", first, last);
  if (stages == 1) {
    if (first > 0 || last > 0)
      throw_invalid("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1; drop them");
    return {layers};
  }
  if ((first > 0 || last > 0) && first + last > layers)
    throw_invalid("--decoder-first-pipeline-num-layers {} + --decoder-last-pipeline-num-layers {} exceed --num-layers "
                  "{}; give the first and last stages fewer layers",
                  first, last, layers);
  const int middle = stages - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  const int rest = layers - first - last;
  if (middle == 0 ? rest != 0 : rest % middle != 0 || rest / middle < 1) {
    if (first == 0 && last == 0)
      throw_invalid("--num-layers {} is not divisible by --pipeline-model-parallel-size {}: every stage holds the same "
                    "number of layers; pass a multiple of {}, or split unevenly with "
                    "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers",
                    layers, stages, stages);
    std::string given;
    if (first > 0) given += fmt::format(" with --decoder-first-pipeline-num-layers {}", first);
    if (last > 0) given += fmt::format("{} --decoder-last-pipeline-num-layers {}", first > 0 ? " and" : " with", last);
    throw_invalid("--num-layers {}{} leaves {} layers for the {} other stages of --pipeline-model-parallel-size {}: "
                  "they must split evenly, at least one each",
                  layers, given, rest, middle, stages);
  }
  std::vector<int> counts(static_cast<size_t>(stages), middle > 0 ? rest / middle : 0);
  if (first > 0) counts.front() = first;
  if (last > 0) counts.back() = last;
  return counts;
}

std::vector<int> pipeline_virtual_stage_layers(int layers, int stages, const PipelineSplit& split) {
  const int V = split.virtual_stages;
  if (V < 1) throw_invalid("--num-virtual-stages-per-pipeline-rank must be >= 1 (got {})", V);
  if (V == 1) return pipeline_stage_layers(layers, stages, split);
  if (stages < 2)
    throw_invalid("--num-virtual-stages-per-pipeline-rank {} (the interleaved schedule) needs "
                  "--pipeline-model-parallel-size > 1; drop it or add pipeline stages",
                  V);
  if (split.first_stage_layers > 0 || split.last_stage_layers > 0)
    throw_invalid("--decoder-first/last-pipeline-num-layers with --num-virtual-stages-per-pipeline-rank {} is not "
                  "supported yet: drop the uneven split or the virtual stages",
                  V);
  if (layers % (stages * V) != 0)
    throw_invalid("--num-layers {} is not divisible by --pipeline-model-parallel-size {} × "
                  "--num-virtual-stages-per-pipeline-rank {} = {}: every virtual stage holds the same number of "
                  "layers; pass a multiple of {} layers or fewer virtual stages",
                  layers, stages, V, stages * V, stages * V);
  return std::vector<int>(static_cast<size_t>(stages * V), layers / (stages * V));
}

Decoder::Decoder(const ModelConfig& cfg, const ModelGroups& groups, const ParallelContext* ctx, uint64_t seed,
                 const MoeConfig& moe, const PipelineSplit& split)
    : cfg_(cfg), groups_(groups), ctx_(ctx) {
  if (!groups_.tp || ctx_->tp != groups_.tp)
    throw_invalid("the decoder's ParallelContext must run on its tensor-parallel group (ModelGroups::tp); build both "
                  "from one mesh (ProcessGroups::model_groups, make_parallel_context(*mesh.tp, ...))");
  cfg_.validate(ctx_->tp_size());
  if (cfg_.is_moe()) {
    if (!groups_.ep || !groups_.dp_cp)
      throw_invalid("a model with --num-experts {} needs the expert-parallel and token groups (ModelGroups::ep, "
                    "dp_cp); coc train builds them",
                    cfg_.num_experts);
    if (ctx_->sequence_parallel && ctx_->tp_size() > 1)
      throw_invalid("--num-experts {} with --sequence-parallel and --tensor-model-parallel-size {} is not supported: "
                    "the MoE layers run on the rows every TP rank holds; drop --sequence-parallel (or use tp 1)",
                    cfg_.num_experts, ctx_->tp_size());
  }
  stages_ = groups_.pp ? groups_.pp->size() : 1;
  stage_ = groups_.pp ? groups_.pp->rank() : 0;
  if (stage_ == 0) {
    embedding_ = std::make_unique<VocabParallelEmbedding>("embedding", cfg_.vocab_size, cfg_.hidden_size, ctx_);
    embedding_->weight.read_as_compute_type = true;  // forward() stores the looked-up rows as the compute type
  }
  build_layers(moe, seed, pipeline_virtual_stage_layers(static_cast<int>(cfg_.num_layers), stages_, split));
  if (stage_ == stages_ - 1) {
    final_norm_ = model_init::make_norm("final_layernorm.weight", cfg_.hidden_size, ctx_->sequence_parallel);
    lm_head_ = std::make_unique<ColumnParallelLinear>("output_layer", cfg_.hidden_size, cfg_.vocab_size, ctx_,
                                                      ColumnParallelLinear::Options{.bias = false});
    loss_ = std::make_unique<VocabParallelCrossEntropy>(cfg_.vocab_size, ctx_);
    gathered_head_ = std::make_unique<GatheredVocabHead>("output_layer", ctx_);
  }
  init_parameters(seed);
  set_recompute({});
}

Decoder::~Decoder() = default;

void Decoder::build_layers(const MoeConfig& moe, uint64_t seed, const std::vector<int>& counts) {
  const int V = static_cast<int>(counts.size()) / stages_;
  chunk_first_layer_.assign(static_cast<size_t>(V), 0);
  chunk_begin_.assign(1, 0);
  for (int c = 0; c < V; ++c) {
    const int v = c * stages_ + stage_;  // this chunk's virtual stage
    int first = 0;
    for (int u = 0; u < v; ++u) first += counts[static_cast<size_t>(u)];
    chunk_first_layer_[static_cast<size_t>(c)] = first;
    // Global layer indices: the parameter names and their initialisation are those of one stage.
    for (int i = first; i < first + counts[static_cast<size_t>(v)]; ++i)
      layers_.push_back(
          std::make_unique<TransformerLayer>(cfg_, i, groups_, ctx_, cfg_.moe_layer(i) ? &moe : nullptr, seed));
    chunk_begin_.push_back(static_cast<int>(layers_.size()));
  }
  slots_.assign(static_cast<size_t>(V), std::vector<MicroBatchSlot>(1));
}

void Decoder::init_parameters(uint64_t seed) {
  // The layers drew theirs at construction.
  const float std = cfg_.init_method_std;
  const int64_t H = cfg_.hidden_size;
  RowRange r = split_rows(cfg_.vocab_size, ctx_->tp_size(), ctx_->tp_rank());
  std::vector<int64_t> rows(static_cast<size_t>(r.count));
  for (int64_t i = 0; i < r.count; ++i) rows[static_cast<size_t>(i)] = r.begin + i;
  if (embedding_) model_init::init_rows(embedding_->weight, rows, H, seed, embedding_->weight.name, std);
  if (lm_head_) model_init::init_rows(lm_head_->weight, lm_head_->row_map(), H, seed, lm_head_->weight.name, std);
}

ParamList Decoder::module_params(int module) {
  COC_ASSERT(module >= 0 && module < num_modules(), "module {} of {}", module, num_modules());
  if (module == 0) return embedding_ ? embedding_->params() : ParamList{};
  if (module == num_modules() - 1) {
    if (!lm_head_) return {};
    ParamList p{&final_norm_};
    for (Param* q : lm_head_->params()) p.push_back(q);
    return p;
  }
  return layers_[static_cast<size_t>(module - 1)]->params();
}

ParamList Decoder::params() {
  ParamList p;
  for (int i = 0; i < num_modules(); ++i)
    for (Param* q : module_params(i)) p.push_back(q);
  return p;
}

void Decoder::add_hook(HookPoint point, ModuleHook hook) {
  hooks_[static_cast<size_t>(point)].push_back(std::move(hook));
}

void Decoder::run_hooks(HookPoint point, int module) {
  // A module's backward ends with its gradients complete: the row layers' delayed wgrad work normally ran in the
  // column layer after them (--delay-wgrad-compute), and whatever is left runs here.
  if (point == HookPoint::kPostBackward) wgrad_.run();
  for (const ModuleHook& h : hooks_[static_cast<size_t>(point)]) h(module);
}

void Decoder::reserve_activations(int64_t batch) {
  size_buffers(batch, true);
  // size_buffers sized the current micro-batch's checkpoints; slot 0 of every model chunk serves micro-batch 0.
  for (int ch = 0; ch < num_chunks(); ++ch) size_checkpoints(ch, 0, activation_rows(batch));
  if (slots_[0].size() < 2 || stages_ != 1) return;  // a pipeline stage sets its slots in its first step
  // forward_pair's second micro-batch: its layers' activations and its embedding and output rows.
  const LayerPass p = layer_pass(batch);
  point_layers(0, 1);
  for (auto& l : layers_) l->reserve(p);
  point_layers(0, 0);
  x0_pair_.resize(x0_.shape());
  xf_pair_.resize(xf_.shape());
}

LayerPass Decoder::layer_pass(int64_t batch) const {
  LayerPass p{.batch = batch, .seq_length = cfg_.seq_length};
  if (ring_attention_on()) {
    p.ring = &*cp_ring_;
    p.ring_opts = &cp_opts_;
  }
  // The fixed debug router keys its pattern by a token's index in the global batch.
  if (cfg_.is_moe()) p.moe_token_offset = static_cast<int64_t>(groups_.dp_cp->rank()) * local_dims(cfg_, *ctx_, p).ml;
  return p;
}

void Decoder::size_buffers(int64_t batch, bool backward) {
  const LayerPass p = layer_pass(batch);
  const auto [m, ml, H, D, hl, gl, fl, S] = local_dims(cfg_, *ctx_, p);
  if (embedding_) x0_.resize({ml, H});
  xf_.resize({ml, H});
  for (auto& l : layers_) l->reserve(p);
  size_checkpoints(cur_chunk_, cur_slot_, ml);
  if (!lm_head_) {  // a pipeline stage without the head
    if (!backward) return;
    for (Tensor* t : {&grads_.x, &grads_.ln}) t->resize({ml, H});
    size_layer_grads(p);
    return;
  }
  lnf_.resize({ml, H});
  rstdf_.resize({ml});
  if (ctx_->gathers_vocab_weights(cfg_.vocab_size, H, m)) {
    logits_.resize({ml, cfg_.vocab_size});
  } else {
    lm_head_->reserve(m);
    logits_.resize({m, lm_head_->local_out()});
  }
  if (!backward) return;
  dlogits_.resize(logits_.shape());
  for (Tensor* t : {&dlnf_, &grads_.x, &grads_.ln}) t->resize({ml, H});
  size_layer_grads(p);
}

void Decoder::size_layer_grads(const LayerPass& p) {
  const auto [m, ml, H, D, hl, gl, fl, S] = local_dims(cfg_, *ctx_, p);
  if (std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return !l->is_moe(); })) {
    grads_.act.resize({m, fl});
    grads_.gu.resize({m, 2 * fl});
  }
  grads_.attn.resize({m, hl * D});
  grads_.qkv.resize({m, (hl + 2 * gl) * D});
  if (gl != hl && !p.ring) {
    grads_.k_rep.resize({m, hl * D});
    grads_.v_rep.resize({m, hl * D});
  }
  if (!p.ring) grads_.dkv_heads.resize({2 * m, hl * D});
}

double Decoder::forward(const int32_t* tokens, const int32_t* targets, int64_t batch) {
  COC_ASSERT(stages_ == 1, "Decoder::forward on pipeline stage {} of {}: use forward_stage", stage_, stages_);
  return forward_stage(0, 0, tokens, targets, {}, batch, {});
}

double Decoder::forward_stage(int chunk, int slot, const int32_t* tokens, const int32_t* targets,
                              ConstMatrixView input, int64_t batch, MatrixView output) {
  use_slot(chunk, slot);
  size_buffers(batch, false);
  const LayerPass p = layer_pass(batch);
  m_ = p.seq_length * batch;
  batch_ = batch;
  tokens_ = tokens;
  targets_ = targets;
  MicroBatchSlot& s = slots_[static_cast<size_t>(chunk)][static_cast<size_t>(slot)];
  s.tokens = tokens;
  s.targets = targets;
  last_forward_ = {chunk, slot};
  // The embedding's hooks run with chunk 0 and the head's with the last chunk: once per micro-batch each.
  const bool first = chunk == 0, last = chunk == num_chunks() - 1;
  if (first) run_hooks(HookPoint::kPreForward, 0);
  ConstMatrixView x = input;
  if (holds_embedding(chunk)) {
    embedding_->forward(tokens, m_, x0_.mat());
    store_as_compute_type(x0_.mat());  // a bf16 model's embedding output is bf16
    x = x0_.mat();
  }
  if (first) run_hooks(HookPoint::kPostForward, 0);
  layers_forward(p, x, chunk_begin_[static_cast<size_t>(chunk)], chunk_begin_[static_cast<size_t>(chunk) + 1]);
  if (holds_head(chunk)) return head_forward(xf_.mat());
  if (last) run_hooks(HookPoint::kPreForward, num_modules() - 1);
  copy(xf_.mat(), output);
  if (last) run_hooks(HookPoint::kPostForward, num_modules() - 1);
  return 0;
}

void Decoder::forward_pair(const int32_t* tokens_a, const int32_t* targets_a, const int32_t* tokens_b,
                           const int32_t* targets_b, int64_t batch) {
  COC_ASSERT(stages_ == 1 && slots_[0].size() >= 2 && !cfg_.is_moe() && !ring_attention_on() &&
                 recompute_.granularity == RecomputeGranularity::kNone &&
                 hooks_[static_cast<size_t>(HookPoint::kPreForward)].empty() &&
                 hooks_[static_cast<size_t>(HookPoint::kPostForward)].empty(),
             "Decoder::forward_pair needs one stage, two slots, dense layers, local attention, no recomputation and "
             "no forward hooks");
  use_slot(0, 0);
  size_buffers(batch, false);
  const LayerPass p = layer_pass(batch);
  m_ = p.seq_length * batch;
  batch_ = batch;
  x0_pair_.resize(x0_.shape());
  xf_pair_.resize(xf_.shape());
  const int32_t* tokens[2] = {tokens_a, tokens_b};
  Tensor* x0[2] = {&x0_, &x0_pair_};
  for (int k = 0; k < 2; ++k) {
    slots_[0][static_cast<size_t>(k)].tokens = tokens[k];
    slots_[0][static_cast<size_t>(k)].targets = k == 0 ? targets_a : targets_b;
    embedding_->forward(tokens[k], m_, x0[k]->mat());
    store_as_compute_type(x0[k]->mat());  // a bf16 model's embedding output is bf16
  }
  last_forward_ = {-1, -1};  // forward_head names the slot whose backward comes next
  ConstMatrixView xa = x0_.mat(), xb = x0_pair_.mat();
  PairTail tail;  // micro-batch b's down projection of the layer below, run inside the next layer's schedule
  for (int i = 0; i < num_local_layers(); ++i) {
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "layer_forward", {"layer", i}, {"micro_batches", 2});
    TransformerLayer& l = *layers_[static_cast<size_t>(i)];
    tail = l.forward_pair(p, *l.own_activations(), xa, xf_.mat(), slots_[0][1].layers[static_cast<size_t>(i)], xb,
                          xf_pair_.mat(), std::move(tail));
    xa = xf_.mat();
    xb = xf_pair_.mat();
  }
  tail.run();
  use_slot(0, 0);
}

double Decoder::forward_head(int slot) {
  COC_ASSERT(slot == 0 || slot == 1, "Decoder::forward_head: slot {} of forward_pair's two", slot);
  use_slot(0, slot);
  const MicroBatchSlot& s = slots_[0][static_cast<size_t>(slot)];
  tokens_ = s.tokens;
  targets_ = s.targets;
  last_forward_ = {0, slot};
  // head_forward and head_backward read the last layer's output in xf_.
  if (slot == 1) copy(xf_pair_.mat(), xf_.mat());
  return head_forward(xf_.mat());
}

void Decoder::layers_forward(const LayerPass& p, ConstMatrixView x, int lo, int hi) {
  // [lo, hi) is one model chunk's layers, and each recomputation chunk lies inside one model chunk (set_recompute).
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].end <= lo || chunks_[c].begin >= hi) continue;
    if (chunks_[c].recompute) copy(x, checkpoint(c).mat());  // all a recomputed chunk keeps
    for (int i = chunks_[c].begin; i < chunks_[c].end; ++i) {
      run_hooks(HookPoint::kPreForward, i + 1);
      COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "layer_forward", {"layer", i});
      layers_[static_cast<size_t>(i)]->forward(p, x, xf_.mat());  // each layer's output goes into xf_
      x = xf_.mat();
      run_hooks(HookPoint::kPostForward, i + 1);
    }
  }
}

double Decoder::head_forward(ConstMatrixView x) {
  const int head = num_modules() - 1;
  run_hooks(HookPoint::kPreForward, head);
  rmsnorm_forward(x, final_norm_.value.data(), cfg_.norm_epsilon, lnf_.mat(), rstdf_.data());
  // The embedding decided the same (VocabParallelEmbedding::forward).
  gathered_vocab_ = ctx_->gathers_vocab_weights(cfg_.vocab_size, cfg_.hidden_size, m_);
  double loss = 0;
  if (gathered_vocab_) {  // this rank's rows against the whole vocabulary
    gathered_head_->forward(lm_head_->weight, lnf_.mat(), logits_.mat());
    const int64_t row0 = split_rows(m_, ctx_->tp_size(), ctx_->tp_rank()).begin;
    store_as_compute_type(logits_.mat());  // bf16 logits; the loss is taken in fp32 from them (Megatron's)
    loss = loss_->forward_local_rows(logits_.mat(), targets_ + row0, m_);
  } else {
    lm_head_->forward(lnf_.mat(), m_, logits_.mat());
    store_as_compute_type(logits_.mat());
    loss = loss_->forward(logits_.mat(), targets_);
  }
  run_hooks(HookPoint::kPostForward, head);
  return loss;
}

void Decoder::backward(float loss_scale) {
  COC_ASSERT(stages_ == 1, "Decoder::backward on pipeline stage {} of {}: use backward_stage", stage_, stages_);
  backward_stage(0, 0, {}, loss_scale, {});
}

void Decoder::backward_stage(int chunk, int slot, ConstMatrixView dy, float loss_scale, MatrixView dx) {
  use_slot(chunk, slot);
  const MicroBatchSlot& s = slots_[static_cast<size_t>(chunk)][static_cast<size_t>(slot)];
  const LayerPass p = layer_pass(batch_);
  const bool first = chunk == 0, last = chunk == num_chunks() - 1;
  if (holds_head(chunk)) {
    // The head (its linear layer, the loss's softmax statistics) keeps the last forward's micro-batch only.
    COC_ASSERT(last_forward_ == std::make_pair(chunk, slot),
               "the last pipeline stage ran backward of chunk {} slot {} after forward of chunk {} slot {}", chunk,
               slot, last_forward_.first, last_forward_.second);
    head_backward(loss_scale);
  } else {
    const int head = num_modules() - 1;
    if (last) run_hooks(HookPoint::kPreBackward, head);
    size_buffers(batch_, true);
    copy(dy, grads_.x.mat());
    if (last) run_hooks(HookPoint::kPostBackward, head);
  }
  layers_backward(p, loss_scale, chunk_begin_[static_cast<size_t>(chunk)],
                  chunk_begin_[static_cast<size_t>(chunk) + 1]);
  if (first) run_hooks(HookPoint::kPreBackward, 0);
  if (holds_embedding(chunk)) {
    embedding_->set_backward_tokens(s.tokens);
    embedding_->backward(grads_.x.mat());
  } else {
    copy(grads_.x.mat(), dx);
  }
  if (first) run_hooks(HookPoint::kPostBackward, 0);
  use_slot(chunk, 0);  // between passes the layers point at their own buffers (activation_bytes counts them there)
}

void Decoder::layers_backward(const LayerPass& p, float loss_scale, int lo, int hi) {
  for (size_t c = chunks_.size(); c-- > 0;) {
    const LayerChunk& chunk = chunks_[c];
    if (chunk.end <= lo || chunk.begin >= hi) continue;  // another model chunk's
    if (chunk.recompute) {
      for (int i = chunk.end - 1; i >= chunk.begin; --i) run_hooks(HookPoint::kPreBackward, i + 1);
      recompute_chunk(c, p);
    }
    for (int i = chunk.end - 1; i >= chunk.begin; --i) {
      if (!chunk.recompute) run_hooks(HookPoint::kPreBackward, i + 1);
      COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "layer_backward", {"layer", i});
      layers_[static_cast<size_t>(i)]->backward(p, loss_scale, grads_, wgrad_);
      run_hooks(HookPoint::kPostBackward, i + 1);
    }
  }
}

void Decoder::head_backward(float loss_scale) {
  const int head = num_modules() - 1;
  run_hooks(HookPoint::kPreBackward, head);
  size_buffers(batch_, true);
  const float scale = loss_scale / static_cast<float>(m_);
  if (gathered_vocab_) {
    const int64_t row0 = split_rows(m_, ctx_->tp_size(), ctx_->tp_rank()).begin;
    loss_->backward(logits_.mat(), targets_ + row0, scale, dlogits_.mat());
    gathered_head_->backward(lm_head_->weight, dlogits_.mat(), lnf_.mat(), dlnf_.mat());
  } else {
    loss_->backward(logits_.mat(), targets_, scale, dlogits_.mat());
    lm_head_->backward(dlogits_.mat(), dlnf_.mat());
  }
  // The last layer's output is xf_ (validate() forbids a model without layers).
  rmsnorm_backward(xf_.mat(), final_norm_.value.data(), rstdf_.data(), dlnf_.mat(), grads_.x.mat(),
                   final_norm_.grad.data(), false);
  run_hooks(HookPoint::kPostBackward, head);
}

void Decoder::recompute_chunk(size_t c, const LayerPass& p) {
  // xf_ is free: the head's backward has read the last layer's output already.
  const LayerChunk& chunk = chunks_[c];
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "recompute_forward", {"layer", chunk.begin},
                  {"layers", chunk.end - chunk.begin});
  ConstMatrixView x = checkpoint(c).mat();
  for (int i = chunk.begin; i < chunk.end; ++i) {
    layers_[static_cast<size_t>(i)]->forward(p, x, xf_.mat());
    x = xf_.mat();
  }
}

// ---- Activation recomputation ------------------------------------------------------------------------------------

void Decoder::set_recompute(const RecomputeConfig& r) {
  // Each model chunk on its own (Megatron-core: one TransformerBlock per virtual stage, whose recompute_num_layers
  // counts its layers), so that a recomputed chunk's forward and backward run in one pass of its model chunk.
  std::vector<LayerChunk> chunks;
  for (int ch = 0; ch < num_chunks(); ++ch)
    for (LayerChunk c : recompute_chunks(chunk_num_layers(ch), r)) {
      c.begin += chunk_begin_[static_cast<size_t>(ch)];
      c.end += chunk_begin_[static_cast<size_t>(ch)];
      chunks.push_back(c);
    }
  chunks_ = std::move(chunks);
  recompute_ = r;
  size_t slots = 0;
  int top = 0;  // the recomputed chunks lie below layer `top`
  for (const LayerChunk& c : chunks_)
    if (c.recompute) {
      slots = std::max(slots, static_cast<size_t>(c.end - c.begin));
      top = std::max(top, c.end);
    }
  // A kept layer above every recomputed chunk has finished its backward (and its delayed weight gradients, run by its
  // post-backward hook) before the first recomputation, and its forward comes after theirs: its buffers can serve
  // as a slot (--recompute-method block then keeps L - N layers, as Megatron does). The decoder's own slots serve
  // the rest; growing them moves them, but every layer is re-pointed below anyway. A pipeline stage lends none: a
  // kept layer's own buffers hold micro-batch slot 0, whose backward may come after another slot's recomputation.
  std::vector<LayerActivations*> slot(slots);
  size_t lent = 0;
  for (int i = top; i < num_local_layers() && lent < slots && stages_ == 1; ++i)
    slot[lent++] = layers_[static_cast<size_t>(i)]->own_activations();
  own_slots_in_use_ = slots - lent;
  if (recompute_slots_.size() < own_slots_in_use_) recompute_slots_.resize(own_slots_in_use_);
  for (size_t j = lent; j < slots; ++j) slot[j] = &recompute_slots_[j - lent];
  for (auto& chunk : slots_)
    for (MicroBatchSlot& s : chunk) s.checkpoints.resize(chunks_.size());
  recompute_acts_.assign(layers_.size(), nullptr);
  for (const LayerChunk& c : chunks_)
    for (int i = c.begin; i < c.end; ++i)
      if (c.recompute) recompute_acts_[static_cast<size_t>(i)] = slot[static_cast<size_t>(i - c.begin)];
  for (int c = 0; c < num_chunks(); ++c) point_layers(c, 0);
}

void Decoder::point_layers(int chunk, int slot) {
  Tensor* probs = recompute_.granularity == RecomputeGranularity::kSelective ? &shared_probs_ : nullptr;
  std::vector<MicroBatchSlot>& slots = slots_[static_cast<size_t>(chunk)];
  const int lo = chunk_begin_[static_cast<size_t>(chunk)], hi = chunk_begin_[static_cast<size_t>(chunk) + 1];
  for (int i = lo; i < hi; ++i) {
    LayerActivations* a = recompute_acts_.empty() ? nullptr : recompute_acts_[static_cast<size_t>(i)];
    if (!a && slot > 0) a = &slots[static_cast<size_t>(slot)].layers[static_cast<size_t>(i - lo)];
    layers_[static_cast<size_t>(i)]->keep_activations_in(a, probs);
  }
}

int64_t Decoder::activation_bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&x0_, &xf_, &lnf_, &rstdf_, &logits_}) n += t->numel();
  for (const auto& chunk : slots_)
    for (const MicroBatchSlot& s : chunk)
      for (const Tensor& t : s.checkpoints) n += t.numel();  // sized for recomputed chunks only
  if (recompute_.granularity == RecomputeGranularity::kSelective) n += shared_probs_.numel();
  n *= static_cast<int64_t>(sizeof(float));
  for (const auto& l : layers_) n += l->own_activation_bytes();
  for (size_t j = 0; j < own_slots_in_use_; ++j) n += recompute_slots_[j].bytes(true);
  for (const auto& chunk : slots_)
    for (const MicroBatchSlot& s : chunk)
      for (const LayerActivations& a : s.layers) n += a.bytes(true);
  return n;
}

// ---- Pipeline stages ---------------------------------------------------------------------------------------------

void Decoder::set_pipeline_slots(int chunk, int n) {
  COC_ASSERT(n >= 1 && chunk >= 0 && chunk < num_chunks(), "set_pipeline_slots({}, {})", chunk, n);
  std::vector<MicroBatchSlot>& slots = slots_[static_cast<size_t>(chunk)];
  if (static_cast<size_t>(n) == slots.size()) return;
  // No layer of the chunk may point into a slot that goes away.
  point_layers(chunk, 0);
  const int lo = chunk_begin_[static_cast<size_t>(chunk)], hi = chunk_begin_[static_cast<size_t>(chunk) + 1];
  slots.resize(static_cast<size_t>(n));
  for (size_t k = 1; k < slots.size(); ++k) {
    slots[k].layers.resize(static_cast<size_t>(hi - lo));
    slots[k].checkpoints.resize(chunks_.size());  // recomputation: each slot keeps its recomputed chunks' inputs
  }
}

Tensor& Decoder::checkpoint(size_t c) {
  return slots_[static_cast<size_t>(cur_chunk_)][static_cast<size_t>(cur_slot_)].checkpoints[c];
}

void Decoder::size_checkpoints(int chunk, int slot, int64_t ml) {
  std::vector<Tensor>& kept = slots_[static_cast<size_t>(chunk)][static_cast<size_t>(slot)].checkpoints;
  for (size_t c = 0; c < chunks_.size(); ++c)
    if (chunks_[c].recompute && in_model_chunk(chunks_[c], chunk)) kept[c].resize({ml, cfg_.hidden_size});
}

bool Decoder::many_slots() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s.size() > 1; });
}

void Decoder::use_slot(int chunk, int slot) {
  COC_ASSERT(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  std::vector<MicroBatchSlot>& slots = slots_[static_cast<size_t>(chunk)];
  COC_ASSERT(slot >= 0 && static_cast<size_t>(slot) < slots.size(), "slot {} of {}", slot, slots.size());
  cur_chunk_ = chunk;
  cur_slot_ = slot;
  if (!many_slots()) return;  // the layers point at slot 0 already (set_recompute, set_pipeline_slots)
  point_layers(chunk, slot);
}

std::vector<float> Decoder::next_token_logits(const int32_t* tokens, int64_t len) {
  COC_ASSERT(stages_ == 1, "Decoder::next_token_logits on pipeline stage {} of {}: use sample_stage", stage_, stages_);
  return sample_stage(0, tokens, len, {}, {});
}

std::vector<float> Decoder::sample_stage(int chunk, const int32_t* tokens, int64_t len, ConstMatrixView input,
                                         MatrixView output) {
  // Same path as training with B = 1 and S = len, without SP (len need not split across ranks: the layers read a
  // copy of the context without it) and with a throw-away target.
  const ModelConfig saved = cfg_;
  const ParallelContext* const trained = ctx_;
  ParallelContext no_sp = *ctx_;
  no_sp.sequence_parallel = false;
  struct Restore {  // also when forward throws: the layers must not keep pointing at no_sp
    Decoder& d;
    const ModelConfig& cfg;
    const ParallelContext* ctx;
    ~Restore() {
      d.cp_off_ = false;
      d.cfg_ = cfg;
      d.set_parallel_context(ctx);
    }
  } restore{*this, saved, trained};
  set_parallel_context(&no_sp);
  cfg_.seq_length = len;
  std::vector<int32_t> dummy(static_cast<size_t>(len), 0);
  cp_off_ = true;
  forward_stage(chunk, 0, tokens, dummy.data(), input, 1, output);
  if (!holds_head(chunk)) return {};
  const int T = ctx_->tp_size();
  std::vector<int64_t> counts(static_cast<size_t>(T)), displs(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) {
    RowRange rr = split_rows(cfg_.vocab_size, T, r);
    counts[static_cast<size_t>(r)] = rr.count;
    displs[static_cast<size_t>(r)] = rr.begin;
  }
  std::vector<float> full(static_cast<size_t>(cfg_.vocab_size));
  ctx_->tp->all_gather(logits_.data() + (len - 1) * logits_.cols(), full.data(), counts, displs, "sample logits")
      .wait();
  return full;
}

void Decoder::set_parallel_context(const ParallelContext* ctx) {
  COC_ASSERT(ctx->tp == groups_.tp, "a ParallelContext on another group than the decoder's tp group");
  ctx_ = ctx;
  if (embedding_) embedding_->set_context(ctx);
  for (auto& l : layers_) l->set_context(ctx);
  if (!lm_head_) return;
  lm_head_->set_context(ctx);
  loss_->set_context(ctx);
  gathered_head_->set_context(ctx);
}

// ---- Mixture of experts -------------------------------------------------------------------------------------------

double Decoder::moe_aux_loss(int chunk) const {
  const size_t lo = chunk < 0 ? 0 : static_cast<size_t>(chunk_begin_[static_cast<size_t>(chunk)]);
  const size_t hi = chunk < 0 ? layers_.size() : static_cast<size_t>(chunk_begin_[static_cast<size_t>(chunk) + 1]);
  double sum = 0;
  for (size_t i = lo; i < hi; ++i)
    if (layers_[i]->is_moe()) sum += layers_[i]->moe()->aux_loss();
  return sum;
}

int Decoder::moe_layers() const {
  int n = 0;
  for (const auto& l : layers_) n += l->is_moe() ? 1 : 0;
  return n;
}

void Decoder::set_moe_dispatcher(MoeDispatcher d, int mc2_chunks) {
  for (auto& l : layers_)
    if (l->is_moe()) l->moe()->set_dispatcher(d, mc2_chunks);
}

// ---- Context parallelism ----------------------------------------------------------------------------------------

void Decoder::set_context_parallel(const CpRing& ring, const RingAttentionOptions& opts) {
  COC_ASSERT(ring.cp && ring.cp == groups_.cp, "a ring over another group than the decoder's cp group");
  cp_ring_ = ring;
  cp_opts_ = opts;
}

bool Decoder::ring_attention_on() const { return cp_ring_.has_value() && !cp_off_; }

}  // namespace coc
