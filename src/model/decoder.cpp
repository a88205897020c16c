#include "coc/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "coc/core/error.h"
#include "coc/core/splitmix.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/partition.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {
uint64_t name_key(const std::string& s) { return fnv1a(s.data(), s.size()); }

void fill_ones(Param& p) { p.value.fill(1.0f); }

/// Fills a column-parallel shard: local row i is row `rows[i]` of the full [n, k] weight.
void init_rows(Param& p, const std::vector<int64_t>& rows, int64_t k, uint64_t seed, const std::string& key, float std) {
  const uint64_t kk = name_key(key);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t j = 0; j < k; ++j)
      p.value[static_cast<int64_t>(i) * k + j] = init_normal(seed, kk, static_cast<uint64_t>(rows[i] * k + j), std);
}
/// Fills a row-parallel shard: local [n, k_r] are columns [begin, begin + k_r) of the full [n, k] weight.
void init_cols(Param& p, int64_t k, int64_t begin, uint64_t seed, const std::string& key, float std) {
  const uint64_t kk = name_key(key);
  const int64_t n = p.value.dim(0), kr = p.value.dim(1);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kr; ++j)
      p.value[i * kr + j] = init_normal(seed, kk, static_cast<uint64_t>(i * k + begin + j), std);
}

/// An RMSNorm weight: whole on every TP rank; under SP it sees only this rank's sequence shard, so its gradient is
/// a partial sum over TP.
Param make_norm(const std::string& name, int64_t h, bool sequence_parallel) {
  Param p;
  p.name = name;
  p.value.resize({h});
  p.grad.resize({h});
  p.placement = Placement::tp_replicated(sequence_parallel);
  p.weight_decay = false;
  fill_ones(p);
  return p;
}
}  // namespace

namespace {
// A micro-batch of `batch` sequences as this rank holds it: m rows in all and ml in its sequence-parallel shard,
// the hidden size H and head size D, and the query heads hl, key/value groups gl and FFN columns fl of its tp share;
// S is the sequence length.
struct LocalDims {
  int64_t m, ml, H, D, hl, gl, fl, S;
};
LocalDims local_dims(const ModelConfig& c, const ParallelContext& ctx, int64_t batch) {
  const int64_t m = c.seq_length * batch, T = ctx.tp_size();
  return {m, ctx.local_rows(m), c.hidden_size, c.head_dim(), c.num_attention_heads / T, c.kv_heads() / T,
          c.ffn_hidden_size / T, c.seq_length};
}

void add_rows(std::vector<int64_t>& rows, int64_t offset, int64_t block, int tp, int rank) {
  const RowRange rr = split_rows(block, tp, rank);
  for (int64_t i = 0; i < rr.count; ++i) rows.push_back(offset + rr.begin + i);
}
}  // namespace

std::vector<int64_t> qkv_row_map(const ModelConfig& c, int tp, int rank) {
  // Whole heads of q, k and v: rows [r·H/T, (r+1)·H/T) of the [H, H] q block of the full [H + 2·KV, H] weight and
  // rows [r·KV/T, (r+1)·KV/T) of each [KV, H] k and v block (KV = key/value heads × head dim; KV = H without GQA).
  const int64_t H = c.hidden_size, KV = c.kv_heads() * c.head_dim();
  std::vector<int64_t> rows;
  add_rows(rows, 0, H, tp, rank);
  add_rows(rows, H, KV, tp, rank);
  add_rows(rows, H + KV, KV, tp, rank);
  return rows;
}

std::vector<int64_t> gate_up_row_map(const ModelConfig& c, int tp, int rank) {
  std::vector<int64_t> rows;
  add_rows(rows, 0, c.ffn_hidden_size, tp, rank);
  add_rows(rows, c.ffn_hidden_size, c.ffn_hidden_size, tp, rank);
  return rows;
}

float init_normal(uint64_t seed, uint64_t key, uint64_t index, float std) {
  // Box–Muller on two independent 53-bit uniforms from a counter-based hash: any element can be drawn alone, so a
  // shard draws exactly its part of the full weight, whatever tp.
  uint64_t a = splitmix64(seed ^ splitmix64(key ^ splitmix64(index * 2)));
  uint64_t b = splitmix64(seed ^ splitmix64(key ^ splitmix64(index * 2 + 1)));
  double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

struct Decoder::Layer {
  Layer(const ModelConfig& c, int idx, ParallelContext* ctx, const DecoderMoe* moe, uint64_t seed)
      : prefix("layers." + std::to_string(idx)),
        ln1(make_norm(prefix + ".input_layernorm.weight", c.hidden_size, ctx->sequence_parallel)),
        ln2(make_norm(prefix + ".post_attention_layernorm.weight", c.hidden_size, ctx->sequence_parallel)),
        qkv(prefix + ".attention.qkv", c.hidden_size, c.hidden_size + 2 * c.kv_heads() * c.head_dim(), ctx,
            {.bias = false}),
        proj(prefix + ".attention.dense", c.hidden_size, c.hidden_size, ctx,
             {.bias = false, .input_is_parallel = true}) {
    qkv.set_row_map(qkv_row_map(c, ctx->tp_size(), ctx->tp_rank()));
    if (moe) {
      MoeConfig mc = moe->settings;
      mc.hidden = c.hidden_size;
      mc.ffn_hidden = c.moe_ffn();
      mc.num_experts = static_cast<int>(c.num_experts);
      mc.topk = static_cast<int>(c.moe_router_topk);
      // Every EP size draws the same full expert tensors (MoeLayer's init), keyed by the seed and the layer.
      this->moe = std::make_unique<MoeLayer>(mc, *moe->ep, *moe->token_group, prefix + ".mlp",
                                             splitmix64(seed ^ name_key(prefix + ".mlp")));
      return;
    }
    gate_up = std::make_unique<ColumnParallelLinear>(prefix + ".mlp.gate_up", c.hidden_size, 2 * c.ffn_hidden_size,
                                                     ctx, ColumnParallelLinear::Options{.bias = false});
    down = std::make_unique<RowParallelLinear>(prefix + ".mlp.down", c.ffn_hidden_size, c.hidden_size, ctx,
                                               RowParallelLinear::Options{.bias = false, .input_is_parallel = true});
    gate_up->set_row_map(gate_up_row_map(c, ctx->tp_size(), ctx->tp_rank()));
  }
  std::string prefix;
  Param ln1, ln2;
  ColumnParallelLinear qkv;
  RowParallelLinear proj;
  // The MLP: the dense SwiGLU (gate_up, down), or the MoE layer.
  std::unique_ptr<ColumnParallelLinear> gate_up;
  std::unique_ptr<RowParallelLinear> down;
  std::unique_ptr<MoeLayer> moe;
  // Activations: local rows ml (residual side) and full rows m (inside TP regions).
  Tensor x_in, ln1_out, rstd1, qkv_out, attn_out, probs, x_mid, ln2_out, rstd2, gu_out, act_out;
  // GQA only: k and v repeated to one head per query head, [m, heads_local · D] each.
  Tensor k_rep, v_rep;
  std::vector<float> lse;  ///< context parallelism: the ring's log-sum-exp [m, heads] (instead of probs)
};

namespace {
/// For the pipelines' producers (RowProducer): calls compute(b, e) once for each run [b, e) of items in [first, end)
/// not yet marked in `done`, and marks them, so that every item is computed once, in as few calls as possible.
template <class Compute>
void compute_missing(std::vector<char>& done, int64_t first, int64_t end, Compute&& compute) {
  for (int64_t b = first; b < end;) {
    if (done[static_cast<size_t>(b)]) {
      ++b;
      continue;
    }
    int64_t e = b;
    while (e < end && !done[static_cast<size_t>(e)]) done[static_cast<size_t>(e++)] = 1;
    compute(b, e);
    b = e;
  }
}

/// GQA: dst head j = src group j / (heads / groups) (Megatron repeats each key/value group over its query heads).
/// src [m, groups·D], dst [m, heads·D].
void repeat_kv(ConstMatrixView src, int64_t groups, int64_t heads, int64_t D, MatrixView dst) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "repeat_kv", {"m", src.rows}, {"heads", heads});
  const int64_t per = heads / groups;
  for (int64_t i = 0; i < src.rows; ++i)
    for (int64_t j = 0; j < heads; ++j) std::copy(src.row(i) + (j / per) * D, src.row(i) + (j / per + 1) * D, dst.row(i) + j * D);
}
/// The backward of repeat_kv: each group's gradient is the sum over its query heads, in head order.
void sum_kv(ConstMatrixView src, int64_t groups, int64_t heads, int64_t D, MatrixView dst) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "sum_kv", {"m", src.rows}, {"heads", heads});
  const int64_t per = heads / groups;
  for (int64_t i = 0; i < src.rows; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      float* d = dst.row(i) + g * D;
      std::copy(src.row(i) + g * per * D, src.row(i) + (g * per + 1) * D, d);
      for (int64_t j = 1; j < per; ++j)
        for (int64_t e = 0; e < D; ++e) d[e] += src.row(i)[(g * per + j) * D + e];
    }
}
}  // namespace

Decoder::Decoder(const ModelConfig& cfg, ParallelContext* ctx, uint64_t seed, const DecoderMoe* moe)
    : cfg_(cfg), ctx_(ctx) {
  cfg_.validate(ctx_->tp_size());
  if (cfg_.is_moe()) {
    if (!moe || !moe->ep || !moe->token_group)
      throw_invalid("a model with --num-experts {} needs the expert-parallel groups (DecoderMoe); coc train builds "
                    "them",
                    cfg_.num_experts);
    if (ctx_->sequence_parallel && ctx_->tp_size() > 1)
      throw_invalid("--num-experts {} with --sequence-parallel and --tensor-model-parallel-size {} is not supported: "
                    "the MoE layers run on the rows every TP rank holds; drop --sequence-parallel (or use tp 1)",
                    cfg_.num_experts, ctx_->tp_size());
    moe_ = *moe;
  }
  embedding_ = std::make_unique<VocabParallelEmbedding>("embedding", cfg_.vocab_size, cfg_.hidden_size, ctx_);
  for (int i = 0; i < cfg_.num_layers; ++i)
    layers_.push_back(std::make_unique<Layer>(cfg_, i, ctx_, cfg_.moe_layer(i) ? &*moe_ : nullptr, seed));
  final_norm_ = make_norm("final_layernorm.weight", cfg_.hidden_size, ctx_->sequence_parallel);
  lm_head_ = std::make_unique<ColumnParallelLinear>("output_layer", cfg_.hidden_size, cfg_.vocab_size, ctx_,
                                                    ColumnParallelLinear::Options{.bias = false});
  loss_ = std::make_unique<VocabParallelCrossEntropy>(cfg_.vocab_size, ctx_);
  gathered_head_ = std::make_unique<GatheredVocabHead>("output_layer", ctx_);
  init_parameters(seed);
}

Decoder::~Decoder() = default;

void Decoder::init_parameters(uint64_t seed) {
  const float std = cfg_.init_method_std;
  const float out_std = std / std::sqrt(2.0f * static_cast<float>(cfg_.num_layers));
  const int64_t H = cfg_.hidden_size;
  {
    RowRange r = split_rows(cfg_.vocab_size, ctx_->tp_size(), ctx_->tp_rank());
    std::vector<int64_t> rows(static_cast<size_t>(r.count));
    for (int64_t i = 0; i < r.count; ++i) rows[static_cast<size_t>(i)] = r.begin + i;
    init_rows(embedding_->weight, rows, H, seed, embedding_->weight.name, std);
  }
  for (auto& l : layers_) {
    init_rows(l->qkv.weight, l->qkv.row_map(), H, seed, l->qkv.weight.name, std);
    init_cols(l->proj.weight, H, l->proj.in_begin(), seed, l->proj.weight.name, out_std);
    if (l->moe) continue;  // MoeLayer initialises its router and experts itself
    init_rows(l->gate_up->weight, l->gate_up->row_map(), H, seed, l->gate_up->weight.name, std);
    init_cols(l->down->weight, cfg_.ffn_hidden_size, l->down->in_begin(), seed, l->down->weight.name, out_std);
  }
  init_rows(lm_head_->weight, lm_head_->row_map(), H, seed, lm_head_->weight.name, std);
}

ParamList Decoder::module_params(int module) {
  COC_ASSERT(module >= 0 && module < num_modules(), "module {} of {}", module, num_modules());
  if (module == 0) return embedding_->params();
  if (module == num_modules() - 1) {
    ParamList p{&final_norm_};
    for (Param* q : lm_head_->params()) p.push_back(q);
    return p;
  }
  Layer& l = *layers_[static_cast<size_t>(module - 1)];
  ParamList p{&l.ln1};
  for (Param* q : l.qkv.params()) p.push_back(q);
  for (Param* q : l.proj.params()) p.push_back(q);
  p.push_back(&l.ln2);
  if (l.moe) {
    for (Param* q : l.moe->params()) p.push_back(q);
    return p;
  }
  for (Param* q : l.gate_up->params()) p.push_back(q);
  for (Param* q : l.down->params()) p.push_back(q);
  return p;
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
  if (point == HookPoint::kPostBackward) ctx_->run_delayed_wgrad();
  for (const ModuleHook& h : hooks_[static_cast<size_t>(point)]) h(module);
}

void Decoder::reserve_activations(int64_t batch) { size_buffers(batch, true); }

void Decoder::size_buffers(int64_t batch, bool backward) {
  const auto [m, ml, H, D, hl, gl, fl, S] = local_dims(cfg_, *ctx_, batch);
  const bool ring = ring_attention_on(), gqa = gl != hl;
  x0_.resize({ml, H});
  xf_.resize({ml, H});
  for (auto& lp : layers_) {
    Layer& l = *lp;
    for (Tensor* t : {&l.x_in, &l.ln1_out, &l.x_mid, &l.ln2_out}) t->resize({ml, H});
    l.rstd1.resize({ml});
    l.rstd2.resize({ml});
    l.qkv.reserve(m);
    l.qkv_out.resize({m, (hl + 2 * gl) * D});
    l.attn_out.resize({m, hl * D});
    l.proj.reserve(m);
    if (ring) {
      l.lse.resize(static_cast<size_t>(m * hl));
    } else {
      l.probs.resize({batch * hl * S * S});
      if (gqa) {
        l.k_rep.resize({m, hl * D});
        l.v_rep.resize({m, hl * D});
      }
    }
    if (!l.moe) {
      l.gate_up->reserve(m);
      l.down->reserve(m);
      l.gu_out.resize({m, 2 * fl});
      l.act_out.resize({m, fl});
    }
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
  for (Tensor* t : {&grads_.lnf, &grads_.x, &grads_.ln}) t->resize({ml, H});
  if (std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return !l->moe; })) {
    grads_.act.resize({m, fl});
    grads_.gu.resize({m, 2 * fl});
  }
  grads_.attn.resize({m, hl * D});
  grads_.qkv.resize({m, (hl + 2 * gl) * D});
  if (gqa && !ring) {
    grads_.k_rep.resize({m, hl * D});
    grads_.v_rep.resize({m, hl * D});
  }
}

double Decoder::forward(const int32_t* tokens, const int32_t* targets, int64_t batch) {
  size_buffers(batch, false);
  const auto [m, ml, H, D, hl, gl, fl, S] = local_dims(cfg_, *ctx_, batch);
  m_ = m;
  batch_ = batch;
  tokens_ = tokens;
  targets_ = targets;

  const int head = num_modules() - 1;
  run_hooks(HookPoint::kPreForward, 0);
  embedding_->forward(tokens, m, x0_.mat());
  run_hooks(HookPoint::kPostForward, 0);
  const Tensor* x = &x0_;
  for (auto& lp : layers_) {
    const int module = static_cast<int>(&lp - layers_.data()) + 1;
    run_hooks(HookPoint::kPreForward, module);
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "layer_forward", {"layer", module - 1});
    Layer& l = *lp;
    {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "copy", {"m", x->rows()}, {"n", x->cols()});
      l.x_in = *x;
    }
    rmsnorm_forward(l.x_in.mat(), l.ln1.value.data(), cfg_.norm_epsilon, l.ln1_out.mat(), l.rstd1.data());
    l.qkv.forward(l.ln1_out.mat(), m, l.qkv_out.mat());
    MatrixView qkv = l.qkv_out.mat();
    MatrixView q = qkv.slice_cols(0, hl * D), k = qkv.slice_cols(hl * D, gl * D),
               v = qkv.slice_cols((hl + gl) * D, gl * D);
    RowProducer attention;        // empty: attn_out is complete before the projection
    std::vector<char> attn_done;  // --attention-dense-pipeline: which query blocks `attention` has computed
    if (ring_attention_on()) {
      cp_rope(q, batch, hl, false);
      cp_rope(k, batch, hl, false);
      ring_attention_forward(*cp_ring_, q, k, v, batch, hl, D, cp_opts_, l.attn_out.mat(), l.lse.data());
    } else {
      rope_apply(q, batch, hl, D, cfg_.rotary_base, false);
      rope_apply(k, batch, gl, D, cfg_.rotary_base, false);
      if (gl != hl) {  // grouped-query attention: each key/value head serves hl / gl query heads
        repeat_kv(k, gl, hl, D, l.k_rep.mat());
        repeat_kv(v, gl, hl, D, l.v_rep.mat());
        k = l.k_rep.mat();
        v = l.v_rep.mat();
      }
      if (ctx_->attention_dense_pipeline) {
        // --attention-dense-pipeline: the projection's CoC op asks for the rows of attn_out chunk by chunk, and
        // the query blocks holding them are computed then (rows t·B + b hold position t), each block once.
        // attn_done is the record of computed blocks, outside the closure (RowProducer says why).
        attn_done.assign(static_cast<size_t>((S + kAttentionBlockRows - 1) / kAttentionBlockRows), 0);
        attention = [this, &l, &done = attn_done, q, k, v, batch, hl, D](RowRange rows) {
          if (rows.count <= 0) return;
          const int64_t last = static_cast<int64_t>(done.size());
          const int64_t first = std::min(last, rows.begin / batch / kAttentionBlockRows);
          const int64_t end = std::min(last, ((rows.end() + batch - 1) / batch + kAttentionBlockRows - 1) /
                                                 kAttentionBlockRows);
          compute_missing(done, first, end, [&](int64_t b, int64_t e) {
            // Blocks run for milliseconds: the chunks already posted must keep moving meanwhile.
            ctx_->tp->engine()->poll_during(
                [&] { attention_forward_blocks(q, k, v, batch, hl, D, l.attn_out.mat(), l.probs.data(), b, e); });
          });
        };
      } else {
        attention_forward(q, k, v, batch, hl, D, l.attn_out.mat(), l.probs.data());
      }
    }
    l.proj.forward(l.attn_out.mat(), m, l.x_mid.mat(), attention);
    if (attention) attention({0, m});  // a no-op: the op has asked for every row (CocOptions::produce_rows)
    add_inplace(l.x_mid.mat(), l.x_in.mat());
    rmsnorm_forward(l.x_mid.mat(), l.ln2.value.data(), cfg_.norm_epsilon, l.ln2_out.mat(), l.rstd2.data());
    if (l.moe) {
      // The fixed debug router keys its pattern by a token's index in the global batch.
      l.moe->forward(l.ln2_out.mat(), xf_.mat(), static_cast<int64_t>(moe_->token_group->rank()) * ml);
      add_inplace(xf_.mat(), l.x_mid.mat());
      x = &xf_;
      run_hooks(HookPoint::kPostForward, module);
      continue;
    }
    l.gate_up->forward(l.ln2_out.mat(), m, l.gu_out.mat());
    MatrixView gu = l.gu_out.mat();
    RowProducer swiglu;         // empty: act_out is complete before the down projection
    std::vector<char> act_done;  // --swiglu-down-pipeline: which rows of act_out are computed (RowProducer says why)
    if (ctx_->swiglu_down_pipeline) {
      // The down projection's CoC op asks for its input rows chunk by chunk; SwiGLU is row by row, so computing
      // them then gives the same bits, and the transfer of the chunk before flies meanwhile.
      act_done.assign(static_cast<size_t>(m), 0);
      swiglu = [&l, &done = act_done, gu, fl](RowRange rows) {
        compute_missing(done, rows.begin, rows.end(), [&](int64_t b, int64_t e) {
          swiglu_forward(gu.slice_cols(0, fl).slice_rows(b, e - b), gu.slice_cols(fl, fl).slice_rows(b, e - b),
                         l.act_out.mat().slice_rows(b, e - b));
        });
      };
    } else {
      swiglu_forward(gu.slice_cols(0, fl), gu.slice_cols(fl, fl), l.act_out.mat());
    }
    // The layer output goes into xf_ (the next layer copies it as its x_in).
    l.down->forward(l.act_out.mat(), m, xf_.mat(), swiglu);
    if (swiglu) swiglu({0, m});  // a no-op: the op has asked for every row (CocOptions::produce_rows)
    add_inplace(xf_.mat(), l.x_mid.mat());
    x = &xf_;
    run_hooks(HookPoint::kPostForward, module);
  }
  run_hooks(HookPoint::kPreForward, head);
  rmsnorm_forward(x->mat(), final_norm_.value.data(), cfg_.norm_epsilon, lnf_.mat(), rstdf_.data());
  // The embedding decided the same (VocabParallelEmbedding::forward).
  gathered_vocab_ = ctx_->gathers_vocab_weights(cfg_.vocab_size, H, m);
  double loss = 0;
  if (gathered_vocab_) {  // this rank's rows against the whole vocabulary
    gathered_head_->forward(lm_head_->weight, lnf_.mat(), logits_.mat());
    const int64_t row0 = split_rows(m, ctx_->tp_size(), ctx_->tp_rank()).begin;
    loss = loss_->forward_local_rows(logits_.mat(), targets + row0, m);
  } else {
    lm_head_->forward(lnf_.mat(), m, logits_.mat());
    loss = loss_->forward(logits_.mat(), targets);
  }
  run_hooks(HookPoint::kPostForward, head);
  return loss;
}

void Decoder::backward(float loss_scale) {
  const int64_t batch = batch_;
  const auto [m, ml, H, D, hl, gl, fl, S] = local_dims(cfg_, *ctx_, batch);

  const int head = num_modules() - 1;
  run_hooks(HookPoint::kPreBackward, head);
  size_buffers(batch, true);
  Tensor &dlnf = grads_.lnf, &dx = grads_.x, &dln = grads_.ln, &dact = grads_.act, &dgu = grads_.gu,
         &dattn = grads_.attn, &dqkv = grads_.qkv, &dk_rep = grads_.k_rep, &dv_rep = grads_.v_rep;
  if (gathered_vocab_) {
    const int64_t row0 = split_rows(m, ctx_->tp_size(), ctx_->tp_rank()).begin;
    loss_->backward(logits_.mat(), targets_ + row0, loss_scale / static_cast<float>(m), dlogits_.mat());
    gathered_head_->backward(lm_head_->weight, dlogits_.mat(), lnf_.mat(), dlnf.mat());
  } else {
    loss_->backward(logits_.mat(), targets_, loss_scale / static_cast<float>(m), dlogits_.mat());
    lm_head_->backward(dlogits_.mat(), dlnf.mat());
  }
  // The last layer's output is xf_ (or x0_ with no layers; validate() forbids that).
  rmsnorm_backward(xf_.mat(), final_norm_.value.data(), rstdf_.data(), dlnf.mat(), dx.mat(), final_norm_.grad.data(),
                   false);
  run_hooks(HookPoint::kPostBackward, head);
  ctx_->defer_column_wgrad = ring_attention_on();  // the ring's last hop takes the layers' weight gradients
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    const int module = static_cast<int>(layers_.rend() - it);
    run_hooks(HookPoint::kPreBackward, module);
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "layer_backward", {"layer", module - 1});
    Layer& l = **it;
    // MLP block: dx is the gradient of x_out = x_mid + down(...) (or + moe(...)).
    if (l.moe) {
      // The aux loss is a term of this micro-batch's objective, scaled like the language-model loss; its
      // gradient is summed over the token group and then divided by dp × cp like every gradient (grad_sync.h), so
      // it is pre-multiplied by that count (docs/semantics.md §6).
      l.moe->set_aux_grad_scale(static_cast<double>(moe_->token_group->size()) * loss_scale);
      l.moe->backward(dx.mat(), dln.mat());
    } else {
      l.down->backward(dx.mat(), dact.mat());
      MatrixView gu = l.gu_out.mat(), dg = dgu.mat();
      swiglu_backward(gu.slice_cols(0, fl), gu.slice_cols(fl, fl), dact.mat(), dg.slice_cols(0, fl),
                      dg.slice_cols(fl, fl));
      {
        // down's queued dW may wait for proj's dY all-gather below, in this module (--delay-column-wgrad).
        struct Flag {
          bool& f;
          ~Flag() { f = false; }
        } reset{ctx_->column_wgrad_to_gather = true};
        l.gate_up->backward(dgu.mat(), dln.mat());
      }
    }
    rmsnorm_backward(l.x_mid.mat(), l.ln2.value.data(), l.rstd2.data(), dln.mat(), dx.mat(), l.ln2.grad.data(), true);
    // Attention block: dx is now the gradient of x_mid = x_in + proj(...).
    MatrixView qkv = l.qkv_out.mat(), dq = dqkv.mat();
    // Attention's backward over query blocks [first, last): writes dq's rows of them, adds to dk and dv.
    auto attention_blocks = [&, q = qkv.slice_cols(0, hl * D)](int64_t first, int64_t last) {
      const bool rep = gl != hl;  // grouped-query attention: dK, dV per query head, summed per group below
      attention_backward_blocks(q, rep ? l.k_rep.mat() : qkv.slice_cols(hl * D, hl * D),
                                rep ? l.v_rep.mat() : qkv.slice_cols(2 * hl * D, hl * D), l.probs.data(),
                                dattn.mat(), batch, hl, D, dq.slice_cols(0, hl * D),
                                rep ? dk_rep.mat() : dq.slice_cols(hl * D, hl * D),
                                rep ? dv_rep.mat() : dq.slice_cols(2 * hl * D, hl * D), first, last);
    };
    const int64_t blocks = (S + kAttentionBlockRows - 1) / kAttentionBlockRows;
    int64_t next_block = blocks;  // attention's backward has run blocks [next_block, blocks)
    if (ctx_->attention_dense_backward_pipeline && !ring_attention_on()) {
      // --attention-dense-backward-pipeline: the projection's backward hands out rows of dattn as its dY segments
      // arrive, and attention's backward runs each query block once all its rows are in (rows t·B + b hold
      // position t), from the last block down as it must (attention_backward_blocks), while later segments fly.
      const int64_t block_rows = kAttentionBlockRows * batch;
      std::vector<int64_t> missing(static_cast<size_t>(blocks));  // rows of each block not handed out yet
      for (int64_t q = 0; q < blocks; ++q)
        missing[static_cast<size_t>(q)] = std::min(m, (q + 1) * block_rows) - q * block_rows;
      l.proj.backward(
          dx.mat(), dattn.mat(),
          [&](RowRange rows) {
            for (int64_t q = rows.begin / block_rows; q <= (rows.end() - 1) / block_rows && rows.count > 0; ++q)
              missing[static_cast<size_t>(q)] -=
                  std::min(rows.end(), (q + 1) * block_rows) - std::max(rows.begin, q * block_rows);
            int64_t first = next_block;
            while (first > 0 && missing[static_cast<size_t>(first - 1)] == 0) --first;
            if (first == next_block) return;
            // Blocks run for milliseconds: the segments already posted must keep moving meanwhile.
            ctx_->tp->engine()->poll_during([&] { attention_blocks(first, next_block); });
            next_block = first;
          },
          block_rows);
    } else {
      l.proj.backward(dx.mat(), dattn.mat());
    }
    if (ring_attention_on()) {  // grouped-query attention with cp > 1 is refused (validate): gl == hl here
      // The ring's last dK, dV hop hides the weight gradients delayed so far (proj's; at tp = 1 gate_up's too):
      // they read dx, dgu and activations, none of which the ring writes.
      RingAttentionOptions o = cp_opts_;
      o.during_last_hop = [this] { ctx_->run_delayed_wgrad(); };
      ring_attention_backward(*cp_ring_, qkv.slice_cols(0, hl * D), qkv.slice_cols(hl * D, hl * D),
                              qkv.slice_cols(2 * hl * D, hl * D), l.attn_out.mat(), l.lse.data(), dattn.mat(), batch,
                              hl, D, o, dq.slice_cols(0, hl * D), dq.slice_cols(hl * D, hl * D),
                              dq.slice_cols(2 * hl * D, hl * D));
      cp_rope(dq.slice_cols(0, hl * D), batch, hl, true);
      cp_rope(dq.slice_cols(hl * D, hl * D), batch, hl, true);
    } else {
      if (next_block > 0) attention_blocks(0, next_block);  // all of it, unless the pipeline above ran it
      if (gl != hl) {
        sum_kv(dk_rep.mat(), gl, hl, D, dq.slice_cols(hl * D, gl * D));
        sum_kv(dv_rep.mat(), gl, hl, D, dq.slice_cols((hl + gl) * D, gl * D));
      }
      // RoPE is a rotation: its backward is the inverse rotation of the gradient.
      rope_apply(dq.slice_cols(0, hl * D), batch, hl, D, cfg_.rotary_base, true);
      rope_apply(dq.slice_cols(hl * D, gl * D), batch, gl, D, cfg_.rotary_base, true);
    }
    l.qkv.backward(dqkv.mat(), dln.mat());
    rmsnorm_backward(l.x_in.mat(), l.ln1.value.data(), l.rstd1.data(), dln.mat(), dx.mat(), l.ln1.grad.data(), true);
    run_hooks(HookPoint::kPostBackward, module);
  }
  ctx_->defer_column_wgrad = false;
  run_hooks(HookPoint::kPreBackward, 0);
  embedding_->backward(dx.mat());
  run_hooks(HookPoint::kPostBackward, 0);
}

std::vector<float> Decoder::next_token_logits(const int32_t* tokens, int64_t len) {
  // Same path as training with B = 1 and S = len, without SP (len need not split across ranks) and with a
  // throw-away target.
  ModelConfig saved = cfg_;
  const bool sp = ctx_->sequence_parallel;
  ctx_->sequence_parallel = false;
  cfg_.seq_length = len;
  std::vector<int32_t> dummy(static_cast<size_t>(len), 0);
  cp_off_ = true;
  forward(tokens, dummy.data(), 1);
  cp_off_ = false;
  ctx_->sequence_parallel = sp;
  cfg_ = saved;
  const int T = ctx_->tp_size();
  std::vector<int64_t> counts(static_cast<size_t>(T)), displs(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) {
    RowRange rr = split_rows(cfg_.vocab_size, T, r);
    counts[static_cast<size_t>(r)] = rr.count;
    displs[static_cast<size_t>(r)] = rr.begin;
  }
  std::vector<float> full(static_cast<size_t>(cfg_.vocab_size));
  ctx_->tp->all_gather(logits_.data() + (len - 1) * logits_.cols(), full.data(), counts, displs, "sample logits").wait();
  return full;
}

// ---- Mixture of experts -------------------------------------------------------------------------------------------

double Decoder::moe_aux_loss() const {
  double sum = 0;
  for (const auto& l : layers_)
    if (l->moe) sum += l->moe->aux_loss();
  return sum;
}

int Decoder::moe_layers() const {
  int n = 0;
  for (const auto& l : layers_) n += l->moe ? 1 : 0;
  return n;
}

void Decoder::set_moe_dispatcher(MoeDispatcher d, int mc2_chunks) {
  for (auto& l : layers_)
    if (l->moe) l->moe->set_dispatcher(d, mc2_chunks);
}

// ---- Context parallelism ----------------------------------------------------------------------------------------

void Decoder::set_context_parallel(const CpRing& ring, const RingAttentionOptions& opts) {
  cp_ring_ = ring;
  cp_opts_ = opts;
}

bool Decoder::ring_attention_on() const { return cp_ring_.has_value() && !cp_off_; }

void Decoder::cp_rope(MatrixView x, int64_t batch, int64_t heads, bool inverse) const {
  // The local rows are two zig-zag chunks of c positions; each rotates by its global positions.
  const int P = cp_ring_->size(), r = cp_ring_->rank();
  const int64_t c = x.rows / batch / 2, S = 2 * c * P;
  for (int a = 0; a < 2; ++a)
    rope_apply(x.slice_rows(a * c * batch, c * batch), batch, heads, cfg_.head_dim(), cfg_.rotary_base, inverse,
               zigzag_position(a * c, r, P, S));
}

}  // namespace coc
