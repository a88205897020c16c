#include "coc/model/transformer_layer.h"

#include <algorithm>
#include <cmath>

#include "coc/comm/progress.h"
#include "coc/comm/wait_filler.h"
#include "coc/core/error.h"
#include "coc/core/splitmix.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/partition.h"
#include "coc/runtime/tracer.h"
#include "once_work.h"
#include "param_init.h"

namespace coc {

using model_init::init_cols;
using model_init::init_rows;
using model_init::make_norm;
using model_init::name_key;

LocalDims local_dims(const ModelConfig& c, const ParallelContext& ctx, const LayerPass& p) {
  const int64_t m = p.seq_length * p.batch, T = ctx.tp_size();
  return {m, ctx.local_rows(m), c.hidden_size, c.head_dim(), c.num_attention_heads / T, c.kv_heads() / T,
          c.ffn_hidden_size / T, p.seq_length};
}

namespace {
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

int64_t LayerActivations::bytes(bool with_probs) const {
  int64_t n = static_cast<int64_t>(lse.size()) + (with_probs ? probs.numel() : 0);
  for (const Tensor* t : {&x_in, &ln1_out, &rstd1, &qkv_out, &attn_out, &x_mid, &ln2_out, &rstd2, &gu_out, &act_out,
                          &k_rep, &v_rep, &qkv_in, &gate_up_in})
    n += t->numel();
  return n * static_cast<int64_t>(sizeof(float)) + qkv_in16.bytes() + gate_up_in16.bytes() + qkv_heads16.bytes();
}

// ---- Construction ------------------------------------------------------------------------------------------------

TransformerLayer::TransformerLayer(const ModelConfig& c, int index, const ModelGroups& groups,
                                   const ParallelContext* ctx, const MoeConfig* moe, uint64_t seed)
    : cfg_(c),
      prefix_("layers." + std::to_string(index)),
      groups_(groups),
      ctx_(ctx),
      ln1_(make_norm(prefix_ + ".input_layernorm.weight", c.hidden_size, ctx->sequence_parallel)),
      ln2_(make_norm(prefix_ + ".post_attention_layernorm.weight", c.hidden_size, ctx->sequence_parallel)),
      qkv_(prefix_ + ".attention.qkv", c.hidden_size, c.hidden_size + 2 * c.kv_heads() * c.head_dim(), ctx,
           {.bias = false}),
      proj_(prefix_ + ".attention.dense", c.hidden_size, c.hidden_size, ctx,
            {.bias = false, .input_is_parallel = true}) {
  qkv_.set_row_map(qkv_row_map(c, ctx->tp_size(), ctx->tp_rank()));
  if (moe) {
    MoeConfig mc = *moe;
    mc.hidden = c.hidden_size;
    mc.ffn_hidden = c.moe_ffn();
    mc.num_experts = static_cast<int>(c.num_experts);
    mc.topk = static_cast<int>(c.moe_router_topk);
    // Every EP size draws the same full expert tensors (MoeLayer's init), keyed by the seed and the layer.
    moe_ = std::make_unique<MoeLayer>(mc, *groups_.ep, *groups_.dp_cp, prefix_ + ".mlp",
                                      splitmix64(seed ^ name_key(prefix_ + ".mlp")));
  } else {
    gate_up_ = std::make_unique<ColumnParallelLinear>(prefix_ + ".mlp.gate_up", c.hidden_size, 2 * c.ffn_hidden_size,
                                                      ctx, ColumnParallelLinear::Options{.bias = false});
    down_ = std::make_unique<RowParallelLinear>(prefix_ + ".mlp.down", c.ffn_hidden_size, c.hidden_size, ctx,
                                                RowParallelLinear::Options{.bias = false, .input_is_parallel = true});
    gate_up_->set_row_map(gate_up_row_map(c, ctx->tp_size(), ctx->tp_rank()));
  }
  keep_activations_in(nullptr, nullptr);
  init_parameters(c, seed);
}

void TransformerLayer::init_parameters(const ModelConfig& c, uint64_t seed) {
  // Output projections use std / sqrt(2·layers) (Megatron's scaled init).
  const float std = c.init_method_std, out_std = std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  const int64_t H = c.hidden_size;
  init_rows(qkv_.weight, qkv_.row_map(), H, seed, qkv_.weight.name, std);
  init_cols(proj_.weight, H, proj_.in_begin(), seed, proj_.weight.name, out_std);
  if (moe_) return;  // MoeLayer initialises its router and experts itself
  init_rows(gate_up_->weight, gate_up_->row_map(), H, seed, gate_up_->weight.name, std);
  init_cols(down_->weight, c.ffn_hidden_size, down_->in_begin(), seed, down_->weight.name, out_std);
}

void TransformerLayer::set_context(const ParallelContext* ctx) {
  ctx_ = ctx;
  qkv_.set_context(ctx);
  proj_.set_context(ctx);
  if (gate_up_) gate_up_->set_context(ctx);
  if (down_) down_->set_context(ctx);
}

ParamList TransformerLayer::params() {
  ParamList p{&ln1_};
  for (Param* q : qkv_.params()) p.push_back(q);
  for (Param* q : proj_.params()) p.push_back(q);
  p.push_back(&ln2_);
  for (Param* q : moe_ ? moe_->params() : gate_up_->params()) p.push_back(q);
  if (!moe_)
    for (Param* q : down_->params()) p.push_back(q);
  return p;
}

void TransformerLayer::keep_activations_in(LayerActivations* shared, Tensor* shared_probs) {
  acts_ = shared ? shared : &own_;
  probs_ = shared_probs ? shared_probs : &acts_->probs;
  // The column layers keep their gathered inputs (SP) with the other activations.
  qkv_.keep_input_in(&acts_->qkv_in, &acts_->qkv_in16);
  if (gate_up_) gate_up_->keep_input_in(&acts_->gate_up_in, &acts_->gate_up_in16);
}

int64_t TransformerLayer::own_activation_bytes() const {
  return acts_ == &own_ ? own_.bytes(probs_ == &own_.probs) : 0;
}

void TransformerLayer::reserve(const LayerPass& p) {
  const auto [m, ml, H, D, hl, gl, fl, S] = local_dims(cfg_, *ctx_, p);
  LayerActivations& a = *acts_;
  for (Tensor* t : {&a.x_in, &a.ln1_out, &a.x_mid, &a.ln2_out}) t->resize({ml, H});
  a.rstd1.resize({ml});
  a.rstd2.resize({ml});
  qkv_.reserve(m);
  if (!qkv_out_in_scratch(p.ring)) a.qkv_out.resize({m, (hl + 2 * gl) * D});  // kept through bf16 passes, as below
  a.attn_out.resize({m, hl * D});
  proj_.reserve(m);
  // Under --bf16 local attention reads packed operands. Kept through fp32 passes: `coc bench train --baseline`
  // alternates bf16 and fp32 iterations, and freeing it would make each bf16 one fault it in again.
  if (p.ring)
    a.qkv_heads16 = Bf16Matrix{};
  else if (gemm_compute_type() == DType::kBF16)
    a.qkv_heads16.resize((hl + 2 * gl) * m, D);
  if (p.ring) {
    a.lse.resize(static_cast<size_t>(m * hl));
  } else {
    // Under --bf16 the probabilities take half the floats (attention_prob_floats). A larger buffer is kept, as
    // qkv_heads16 is: an fp32 iteration of `coc bench train --baseline` sized it for fp32.
    const DType ct = gemm_compute_type();
    const int64_t n = attention_prob_floats(p.batch, hl, S, ct);
    if (ct != DType::kBF16 || probs_->numel() < n) probs_->resize({n});
    if (gl != hl && gemm_compute_type() != DType::kBF16) {  // bf16's packed operands hold each group once
      a.k_rep.resize({m, hl * D});
      a.v_rep.resize({m, hl * D});
    }
  }
  if (moe_) return;
  gate_up_->reserve(m);
  down_->reserve(m);
  a.gu_out.resize({m, 2 * fl});
  a.act_out.resize({m, fl});
}

// ---- Forward -----------------------------------------------------------------------------------------------------

namespace {
/// GQA: dst head j = src group j / (heads / groups) (Megatron repeats each key/value group over its query heads).
/// src [m, groups·D], dst [m, heads·D].
void repeat_kv(ConstMatrixView src, int64_t groups, int64_t heads, int64_t D, MatrixView dst) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "repeat_kv", {"m", src.rows}, {"heads", heads});
  const int64_t per = heads / groups;
  for (int64_t i = 0; i < src.rows; ++i)
    for (int64_t j = 0; j < heads; ++j)
      std::copy(src.row(i) + (j / per) * D, src.row(i) + (j / per + 1) * D, dst.row(i) + j * D);
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

void TransformerLayer::forward(const LayerPass& p, ConstMatrixView x, MatrixView y) {
  const LocalDims d = local_dims(cfg_, *ctx_, p);
  reserve(p);
  {
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "copy", {"m", x.rows}, {"n", x.cols});
    copy(x, acts_->x_in.mat());
  }
  attention_block_forward(p, d);
  mlp_block_forward(p, d, y);
}

namespace {
/// A filler for a wait that has nothing to fill it with.
bool nothing_to_fill() { return false; }
}  // namespace

PairTail TransformerLayer::forward_pair(const LayerPass& p, LayerActivations& a, ConstMatrixView xa, MatrixView ya,
                                        LayerActivations& b, ConstMatrixView xb, MatrixView yb, PairTail prev) {
  COC_ASSERT(!moe_ && !p.ring, "TransformerLayer::forward_pair: not for MoE layers or ring attention");
  const LocalDims d = local_dims(cfg_, *ctx_, p);
  const auto begin = [&](LayerActivations& acts, ConstMatrixView x) {
    keep_activations_in(&acts, nullptr);
    reserve(p);
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "copy", {"m", x.rows}, {"n", x.cols});
    copy(x, acts.x_in.mat());
  };
  const auto filled = [](const std::function<bool()>& filler, const auto& op) {
    const WaitFiller f(filler ? filler : nothing_to_fill);
    op();
  };
  // The schedule: the TP ops run one at a time, in one order on every rank (one communicator serves both
  // micro-batches); each waits with the other micro-batch's next compute (attention's query blocks, SwiGLU's rows)
  // as its filler (comm/wait_filler.h). An op's own producer takes the blocks the filler has not computed.
  begin(a, xa);
  filled(prev.filler, [&] { qkv_forward(p, d); });
  const std::shared_ptr<OnceWork> att_a = attention_work(p, d);
  const std::function<bool()> att_a_unit = [att_a] { return att_a->next_unit(); };
  if (prev.run) filled(att_a_unit, prev.run);  // b's previous down projection, whose output b's qkv reads
  begin(b, xb);
  filled(att_a_unit, [&] { qkv_forward(p, d); });
  const std::shared_ptr<OnceWork> att_b = attention_work(p, d);
  // The projections return with their reductions in flight: b's GEMMs and attention run under a's last chunks,
  // and gate/up a's gather follows b's reduction on the link.
  keep_activations_in(&a, nullptr);
  CocPending proj_a = proj_start(p, d, att_a.get(), /*async=*/true);
  keep_activations_in(&b, nullptr);
  CocPending proj_b = proj_start(p, d, att_b.get(), /*async=*/true);
  keep_activations_in(&a, nullptr);
  proj_a.wait();
  add_residual(a.x_mid.mat(), a.x_in.mat());
  gate_up_forward(d);
  GemmOperandCopy* act16_a = nullptr;
  std::unique_ptr<OnceWork> swiglu_a = swiglu_work(d, act16_a);
  keep_activations_in(&b, nullptr);
  filled([&] { return swiglu_a->next_unit(); }, [&] {
    proj_b.wait();
    add_residual(b.x_mid.mat(), b.x_in.mat());
    gate_up_forward(d);
  });
  // b's down projection is left to the caller: the next layer runs it with a's attention as its filler.
  auto act16_b = std::make_shared<GemmOperandCopy*>(nullptr);
  std::shared_ptr<OnceWork> swiglu_b = swiglu_work(d, *act16_b);
  keep_activations_in(&a, nullptr);
  filled([&] { return swiglu_b->next_unit(); }, [&] { down_forward(d, *swiglu_a, act16_a, ya); });
  return {.filler = [swiglu_b] { return swiglu_b->next_unit(); },
          .run = [this, &b, d, yb, swiglu_b, act16_b] {
            keep_activations_in(&b, nullptr);
            down_forward(d, *swiglu_b, *act16_b, yb);
          }};
}

// Under --bf16 a block's output is stored as a bf16 value, and the residual sum too unless
// --fp32-residual-connection (as in a bf16 Megatron model). The block inputs that only GEMMs read (the norms',
// attention's and SwiGLU's outputs) stay as computed: the GEMM rounds them (set_gemm_compute_type), to the same values.
void TransformerLayer::add_residual(MatrixView out, ConstMatrixView residual) const {
  store_as_compute_type(out);
  add_inplace(out, residual);
  if (!cfg_.fp32_residual_connection) store_as_compute_type(out);
}

namespace {
/// One buffer for qkv's output, shared by every layer where nothing reads it after the forward's epilogue
/// (TransformerLayer::qkv_out_in_scratch), as Megatron's global memory buffer serves such scratch. Sized for the
/// caller (Tensor::resize keeps a buffer whose shape is unchanged). The model's code runs on one thread.
Tensor& qkv_scratch(int64_t rows, int64_t cols) {
  static Tensor t;
  t.resize({rows, cols});
  return t;
}
}  // namespace

bool TransformerLayer::qkv_out_in_scratch(bool ring) { return gemm_compute_type() == DType::kBF16 && !ring; }

MatrixView TransformerLayer::qkv_out(const LocalDims& d, bool ring) const {
  if (qkv_out_in_scratch(ring)) return qkv_scratch(d.m, (d.hl + 2 * d.gl) * d.D).mat();
  return acts_->qkv_out.mat();
}

const AttentionBf16Heads* TransformerLayer::packed_qkv(const LocalDims& d, int64_t batch,
                                                       AttentionBf16Heads& out) const {
  const Bf16Matrix& h = acts_->qkv_heads16;
  if (h.numel() == 0 || gemm_compute_type() != DType::kBF16) return nullptr;
  const BFloat16* base = h.mat().data;
  const int64_t n = d.S * batch * d.D;  // one head's elements
  out = {.q = base, .k = base + d.hl * n, .v = base + (d.hl + d.gl) * n, .kv_heads = d.gl};
  return &out;
}

TransformerLayer::AttentionInputs TransformerLayer::attention_inputs(const LocalDims& d, int64_t batch,
                                                                     AttentionBf16Heads& storage) const {
  const int64_t hl = d.hl, D = d.D;
  const ConstMatrixView qkv = qkv_out(d, /*ring=*/false), q = qkv.slice_cols(0, hl * D);
  const AttentionBf16Heads* packed = packed_qkv(d, batch, storage);
  // Under GQA the kernels take one key/value head per query head: the repeated copies, or with packed operands
  // (which hold each group once) q, whose shape is all the kernels read of these views then.
  if (d.gl == hl) return {q, qkv.slice_cols(hl * D, hl * D), qkv.slice_cols(2 * hl * D, hl * D), packed};
  if (packed) return {q, q, q, packed};
  return {q, acts_->k_rep.mat(), acts_->v_rep.mat(), nullptr};
}

void TransformerLayer::attention_block_forward(const LayerPass& p, const LocalDims& d) {
  qkv_forward(p, d);
  if (!p.ring) {
    proj_forward(p, d, attention_work(p, d).get());
    return;
  }
  const int64_t hl = d.hl, D = d.D, gl = d.gl;
  const MatrixView qkv = qkv_out(d, true);
  MatrixView q = qkv.slice_cols(0, hl * D), k = qkv.slice_cols(hl * D, gl * D),
             v = qkv.slice_cols((hl + gl) * D, gl * D);
  cp_rope(*p.ring, q, p.batch, hl, false);
  cp_rope(*p.ring, k, p.batch, hl, false);
  store_as_compute_type(q);  // attention's inputs are bf16 values under --bf16 (transformer_ops.h)
  store_as_compute_type(k);
  RingAttentionOptions o = *p.ring_opts;
  o.kv_dtype = ctx_->coc.comm_dtype;  // bf16 under --bf16: K and V were just rounded, so they travel in 2 bytes
  ring_attention_forward(*p.ring, q, k, v, p.batch, hl, D, o, acts_->attn_out.mat(), acts_->lse.data());
  proj_forward(p, d, nullptr);
}

void TransformerLayer::qkv_forward(const LayerPass& p, const LocalDims& d) {
  const int64_t hl = d.hl, gl = d.gl, D = d.D, S = d.S;
  LayerActivations& a = *acts_;
  rmsnorm_forward(a.x_in.mat(), ln1_.value.data(), cfg_.norm_epsilon, a.ln1_out.mat(), a.rstd1.data());
  // qkv's output rows as each chunk's GEMM finishes them, under the next chunk's gather (CocOptions::finish_rows):
  // stored as a bf16 model stores them (under --bf16), then, for local attention, q and k rotated (RoPE) and stored
  // so again, as attention reads them, and under --bf16 packed as attention's operands. All row by row: the bits
  // of the passes over the whole output.
  AttentionBf16Heads packed_heads;
  const AttentionBf16Heads* packed = packed_qkv(d, p.batch, packed_heads);
  const MatrixView qkv = qkv_out(d, p.ring);
  qkv_.forward(a.ln1_out.mat(), d.m, qkv, [&](RowRange r) {
    const MatrixView rows = qkv.slice_rows(r.begin, r.count);
    store_as_compute_type(rows);
    if (p.ring) return;  // cp_rope rotates by the ring's global positions
    const MatrixView qr = rows.slice_cols(0, hl * D), kr = rows.slice_cols(hl * D, gl * D);
    rope_apply_rows(qr, r.begin, p.batch, hl, D, cfg_.rotary_base, false);
    rope_apply_rows(kr, r.begin, p.batch, gl, D, cfg_.rotary_base, false);
    store_as_compute_type(qr);
    store_as_compute_type(kr);
    if (packed) {  // attention's bf16 operands, converted here once rather than by each of its calls
      BFloat16* dst = a.qkv_heads16.mat().data;
      const int64_t n = S * p.batch * D;
      attention_pack_heads_bf16(qr, r.begin, S, p.batch, hl, D, dst);
      attention_pack_heads_bf16(kr, r.begin, S, p.batch, gl, D, dst + hl * n);
      attention_pack_heads_bf16(rows.slice_cols((hl + gl) * D, gl * D), r.begin, S, p.batch, gl, D,
                                dst + (hl + gl) * n);
    }
  });
}

std::shared_ptr<OnceWork> TransformerLayer::attention_work(const LayerPass& p, const LocalDims& d) {
  const int64_t hl = d.hl, gl = d.gl, D = d.D, batch = p.batch;
  LayerActivations& a = *acts_;
  auto packed_heads = std::make_shared<AttentionBf16Heads>();  // `in.packed` points here; the closure keeps it
  const AttentionBf16Heads* packed = packed_qkv(d, batch, *packed_heads);
  if (gl != hl && !packed) {  // grouped-query attention: each key/value head serves hl / gl query heads
    const ConstMatrixView qkv = qkv_out(d, false);
    repeat_kv(qkv.slice_cols(hl * D, gl * D), gl, hl, D, a.k_rep.mat());
    repeat_kv(qkv.slice_cols((hl + gl) * D, gl * D), gl, hl, D, a.v_rep.mat());
  }
  const AttentionInputs in = attention_inputs(d, batch, *packed_heads);
  const int64_t blocks = (d.S + kAttentionBlockRows - 1) / kAttentionBlockRows;
  float* probs = probs_->data();
  const MatrixView out = a.attn_out.mat();
  return std::make_shared<OnceWork>(blocks, 1, [in, packed_heads, batch, hl, D, out, probs](int64_t b, int64_t e) {
    attention_forward_blocks(in.q, in.k, in.v, batch, hl, D, out, probs, b, e, in.packed);
  });
}

void TransformerLayer::proj_forward(const LayerPass& p, const LocalDims& d, OnceWork* attention) {
  proj_start(p, d, attention, /*async=*/false);
  add_residual(acts_->x_mid.mat(), acts_->x_in.mat());
}

CocPending TransformerLayer::proj_start(const LayerPass& p, const LocalDims& d, OnceWork* attention, bool async) {
  LayerActivations& a = *acts_;
  RowProducer producer;  // empty: attn_out is complete before the projection (the ring's, or all blocks run)
  if (attention && ctx_->attention_dense_pipeline) {
    // --attention-dense-pipeline: the projection's CoC op asks for the rows of attn_out chunk by chunk, and the
    // query blocks holding them are computed then (rows t·B + b hold position t), each block once. Blocks run for
    // milliseconds: the chunks already posted must keep moving meanwhile.
    producer = [this, attention, batch = p.batch](RowRange rows) {
      if (rows.count <= 0) return;
      const int64_t last = attention->size();
      const int64_t first = std::min(last, rows.begin / batch / kAttentionBlockRows);
      const int64_t end =
          std::min(last, ((rows.end() + batch - 1) / batch + kAttentionBlockRows - 1) / kAttentionBlockRows);
      progress_during(*ctx_->tp, [&] { attention->range(first, end); });
    };
  } else if (attention) {
    attention->finish();
  }
  CocPending pending;
  if (async)
    pending = proj_.forward_async(a.attn_out.mat(), d.m, a.x_mid.mat(), producer);
  else
    proj_.forward(a.attn_out.mat(), d.m, a.x_mid.mat(), producer);
  if (producer) producer({0, d.m});  // a no-op: the op has asked for every row (CocOptions::produce_rows)
  return pending;
}

void TransformerLayer::mlp_block_forward(const LayerPass& p, const LocalDims& d, MatrixView y) {
  if (moe_) {
    LayerActivations& a = *acts_;
    rmsnorm_forward(a.x_mid.mat(), ln2_.value.data(), cfg_.norm_epsilon, a.ln2_out.mat(), a.rstd2.data());
    moe_->set_comm_dtype(ctx_->coc.comm_dtype);  // bf16 under --bf16 (read per call: --baseline may switch it)
    moe_->forward(a.ln2_out.mat(), y, p.moe_token_offset);
    a.moe_plan = moe_->plan();  // this micro-batch's: other forwards may run before its backward (pipeline slots)
    add_residual(y, a.x_mid.mat());
    return;
  }
  gate_up_forward(d);
  GemmOperandCopy* act16 = nullptr;
  down_forward(d, *swiglu_work(d, act16), act16, y);
}

void TransformerLayer::gate_up_forward(const LocalDims& d) {
  LayerActivations& a = *acts_;
  rmsnorm_forward(a.x_mid.mat(), ln2_.value.data(), cfg_.norm_epsilon, a.ln2_out.mat(), a.rstd2.data());
  gate_up_->forward(a.ln2_out.mat(), d.m, a.gu_out.mat(), [&a](RowRange r) {
    store_as_compute_type(a.gu_out.mat().slice_rows(r.begin, r.count));
  });
}

std::unique_ptr<OnceWork> TransformerLayer::swiglu_work(const LocalDims& d, GemmOperandCopy*& act16) {
  const int64_t fl = d.fl;
  const MatrixView gu = acts_->gu_out.mat(), act = acts_->act_out.mat();
  // down's GEMMs read act_out in bf16 under --bf16: SwiGLU writes those values as it computes each row, once down's
  // forward has made the copy (act16); rows computed before (a filler's) are rounded when down first reads them.
  constexpr int64_t kRowsPerUnit = 256;
  return std::make_unique<OnceWork>(d.m, kRowsPerUnit, [gu, act, fl, &act16](int64_t b, int64_t e) {
    swiglu_forward(gu.slice_cols(0, fl).slice_rows(b, e - b), gu.slice_cols(fl, fl).slice_rows(b, e - b),
                   act.slice_rows(b, e - b), act16 ? act16->fill_rows(b, e - b) : MatrixViewT<BFloat16>{});
  });
}

void TransformerLayer::down_forward(const LocalDims& d, OnceWork& swiglu, GemmOperandCopy*& act16, MatrixView y) {
  LayerActivations& a = *acts_;
  GemmOperandCopy copy16(a.act_out.mat());
  act16 = &copy16;
  RowProducer producer;  // empty: act_out is complete before the down projection
  if (ctx_->swiglu_down_pipeline) {
    // The down projection's CoC op asks for its input rows chunk by chunk; SwiGLU is row by row, so computing them
    // then gives the same bits, and the transfer of the chunk before flies meanwhile.
    producer = [&swiglu](RowRange rows) { swiglu.range(rows.begin, rows.end()); };
  } else {
    swiglu.finish();
  }
  down_->forward(a.act_out.mat(), d.m, y, producer);
  if (producer) producer({0, d.m});  // a no-op: the op has asked for every row (CocOptions::produce_rows)
  act16 = nullptr;
  add_residual(y, a.x_mid.mat());
}

// ---- Backward ----------------------------------------------------------------------------------------------------

void TransformerLayer::backward(const LayerPass& p, float loss_scale, LayerGrads& g, WgradQueue& wgrad) {
  const LocalDims d = local_dims(cfg_, *ctx_, p);
  // The linear layers remember the inputs of their last forward; under a pipeline schedule that may be a later
  // micro-batch's, so point them at this backward's activations (the same views otherwise).
  qkv_.set_backward_input(acts_->ln1_out.mat());
  proj_.set_backward_input(acts_->attn_out.mat());
  if (gate_up_) gate_up_->set_backward_input(acts_->ln2_out.mat());
  if (down_) down_->set_backward_input(acts_->act_out.mat());
  mlp_block_backward(p, loss_scale, d, g, wgrad);
  attention_block_backward(p, d, g, wgrad);
}

void TransformerLayer::mlp_block_backward(const LayerPass& p, float loss_scale, const LocalDims& d, LayerGrads& g,
                                          WgradQueue& q) {
  // g.x is the gradient of y = x_mid + down(...) (or + moe(...)).
  LayerActivations& a = *acts_;
  if (moe_) {
    // The aux loss is a term of this micro-batch's objective, scaled like the language-model loss; its gradient is
    // summed over the token group and then divided by dp × cp like every gradient (grad_sync.h), so it is
    // pre-multiplied by that count (docs/semantics.md §6).
    moe_->set_aux_grad_scale(static_cast<double>(groups_.dp_cp->size()) * loss_scale);
    moe_->set_plan(a.moe_plan);
    moe_->backward(g.x.mat(), g.ln.mat());
  } else {
    const int64_t fl = d.fl;
    MatrixView gu = a.gu_out.mat(), dg = g.gu.mat();
    // gate/up's backward GEMMs read dY in bf16 under --bf16: SwiGLU's backward writes those values as it computes
    // each row, under down's gather, instead of gate/up's backward rounding the whole of dY in a pass of its own.
    GemmOperandCopy dg16(dg);
    const auto swiglu_rows = [&, fl](RowRange r) {
      if (r.count <= 0) return;
      const auto rows = [&](MatrixView x) { return x.slice_rows(r.begin, r.count); };
      const MatrixViewT<BFloat16> r16 = dg16.fill_rows(r.begin, r.count);  // empty under fp32
      const bool to16 = r16.data != nullptr;
      swiglu_backward(rows(gu.slice_cols(0, fl)), rows(gu.slice_cols(fl, fl)), rows(g.act.mat()),
                      rows(dg.slice_cols(0, fl)), rows(dg.slice_cols(fl, fl)), to16 ? r16.slice_cols(0, fl) : r16,
                      to16 ? r16.slice_cols(fl, fl) : r16);
    };
    if (ctx_->swiglu_down_backward_pipeline) {
      // down's backward hands out dX's rows as its dY segments arrive (RowParallelLinear::backward), about eight per
      // rank, and SwiGLU's backward runs on them while the later segments fly.
      const int64_t segment = std::max<int64_t>(1, (split_rows(d.m, ctx_->tp_size(), 0).count + 7) / 8);
      // Its weight gradient as the rows arrive: SwiGLU's backward alone leaves most of the gather's wait idle at
      // 1 Gbit/s (docs/performance.md point 52).
      down_->backward(g.x.mat(), g.act.mat(), &q,
                      [&](RowRange r) { progress_during(*ctx_->tp, [&] { swiglu_rows(r); }); }, segment,
                      /*wgrad_as_rows_arrive=*/true);
    } else {
      down_->backward(g.x.mat(), g.act.mat(), &q);
      swiglu_rows({0, d.m});
    }
    // down's queued dW may wait for proj's dY all-gather below, in this layer (--delay-column-wgrad); the ring's
    // last hop takes the weight gradients at tp = 1 (ColumnWgrad::defer_own).
    gate_up_->backward(g.gu.mat(), g.ln.mat(),
                       {.queue = &q, .defer_own = p.ring != nullptr, .leave_for_row_gather = true});
  }
  rmsnorm_backward(a.x_mid.mat(), ln2_.value.data(), a.rstd2.data(), g.ln.mat(), g.x.mat(), ln2_.grad.data(), true);
}

void TransformerLayer::attention_backward_range(const LocalDims& d, int64_t batch, LayerGrads& g, int64_t first,
                                                int64_t last) {
  const int64_t hl = d.hl, D = d.D;
  const bool rep = d.gl != hl;  // grouped-query attention: dK, dV per query head, summed per group afterwards
  MatrixView dq = g.qkv.mat();
  AttentionBf16Heads storage;
  const AttentionInputs in = attention_inputs(d, batch, storage);
  attention_backward_blocks(in.q, in.k, in.v, probs_->data(), g.attn.mat(), batch, hl, D, dq.slice_cols(0, hl * D),
                            rep ? g.k_rep.mat() : dq.slice_cols(hl * D, hl * D),
                            rep ? g.v_rep.mat() : dq.slice_cols(2 * hl * D, hl * D), first, last, in.packed,
                            g.dkv_heads.numel() == 2 * d.m * hl * D ? g.dkv_heads.data() : nullptr);
}

int64_t TransformerLayer::proj_backward_pipelined(const LocalDims& d, int64_t batch, LayerGrads& g, WgradQueue& q,
                                                  bool leave_tail) {
  // The projection's backward hands out rows of dattn as its dY segments arrive, and attention's backward runs each
  // query block once all its rows are in (rows t·B + b hold position t), from the last block down as it must
  // (attention_backward_blocks), while later segments fly.
  const int64_t m = d.m, blocks = (d.S + kAttentionBlockRows - 1) / kAttentionBlockRows;
  const int64_t block_rows = kAttentionBlockRows * batch;
  int64_t next_block = blocks;                              // blocks [next_block, blocks) are done
  int64_t rows_left = m;                                    // rows not handed out yet
  std::vector<int64_t> missing(static_cast<size_t>(blocks));  // rows of each block not handed out yet
  for (int64_t q = 0; q < blocks; ++q)
    missing[static_cast<size_t>(q)] = std::min(m, (q + 1) * block_rows) - q * block_rows;
  proj_.backward(
      g.x.mat(), g.attn.mat(), &q,
      [&](RowRange rows) {
        for (int64_t q = rows.begin / block_rows; q <= (rows.end() - 1) / block_rows && rows.count > 0; ++q)
          missing[static_cast<size_t>(q)] -=
              std::min(rows.end(), (q + 1) * block_rows) - std::max(rows.begin, q * block_rows);
        rows_left -= std::max<int64_t>(rows.count, 0);
        // Once the last segment is in, nothing is in flight for the blocks left to hide: qkv's backward
        // (--attention-qkv-backward-pipeline) runs them while its own reduction flies.
        if (leave_tail && rows_left == 0) return;
        int64_t first = next_block;
        while (first > 0 && missing[static_cast<size_t>(first - 1)] == 0) --first;
        if (first == next_block) return;
        // Blocks run for milliseconds: the segments already posted must keep moving meanwhile.
        progress_during(*ctx_->tp, [&] { attention_backward_range(d, batch, g, first, next_block); });
        next_block = first;
      },
      block_rows);
  return next_block;
}

void TransformerLayer::finish_dqkv_rows(const LocalDims& d, int64_t batch, LayerGrads& g, int64_t first,
                                        int64_t last) {
  const int64_t hl = d.hl, gl = d.gl, D = d.D;
  const int64_t r0 = first * kAttentionBlockRows * batch, r1 = std::min(d.m, last * kAttentionBlockRows * batch);
  if (r1 <= r0) return;
  MatrixView dq = g.qkv.mat().slice_rows(r0, r1 - r0);
  if (gl != hl) {
    sum_kv(g.k_rep.mat().slice_rows(r0, r1 - r0), gl, hl, D, dq.slice_cols(hl * D, gl * D));
    sum_kv(g.v_rep.mat().slice_rows(r0, r1 - r0), gl, hl, D, dq.slice_cols((hl + gl) * D, gl * D));
  }
  // RoPE is a rotation: its backward is the inverse rotation of the gradient (rows r0 on hold position r0 / B on).
  rope_apply(dq.slice_cols(0, hl * D), batch, hl, D, cfg_.rotary_base, true, r0 / batch);
  rope_apply(dq.slice_cols(hl * D, gl * D), batch, gl, D, cfg_.rotary_base, true, r0 / batch);
}

void TransformerLayer::attention_block_backward(const LayerPass& p, const LocalDims& d, LayerGrads& g,
                                                WgradQueue& q) {
  // g.x is now the gradient of x_mid = x_in + proj(...).
  const auto [m, ml, H, D, hl, gl, fl, S] = d;
  LayerActivations& a = *acts_;
  MatrixView dq = g.qkv.mat();
  if (!p.ring && probs_ != &a.probs) {
    // Selective recomputation: the probabilities were dropped after forward; q, k, v (rotated, repeated) were not.
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "recompute_attention");
    AttentionBf16Heads storage;
    const AttentionInputs in = attention_inputs(d, p.batch, storage);
    attention_forward(in.q, in.k, in.v, p.batch, hl, D, a.attn_out.mat(), probs_->data(), in.packed);
  }
  const int64_t blocks = (S + kAttentionBlockRows - 1) / kAttentionBlockRows;
  int64_t pending_blocks = blocks;  // attention's backward still to run: blocks [0, pending_blocks)
  const bool qkv_pipeline = ctx_->attention_qkv_backward_pipeline && !p.ring && ctx_->tp_size() > 1;
  if (ctx_->attention_dense_backward_pipeline && !p.ring)
    pending_blocks = proj_backward_pipelined(d, p.batch, g, q, qkv_pipeline);
  else
    proj_.backward(g.x.mat(), g.attn.mat(), &q);
  RowProducer produce_dqkv;  // --attention-qkv-backward-pipeline: the rest of attention's backward, on demand
  if (p.ring) {  // grouped-query attention with cp > 1 is refused (validate): gl == hl here
    // The ring's last dK, dV hop hides the weight gradients delayed so far (proj's; at tp = 1 gate_up's too): they
    // read dx, dgu and activations, none of which the ring writes.
    RingAttentionOptions o = *p.ring_opts;
    o.during_last_hop = [&q] { q.run(); };
    o.kv_dtype = ctx_->coc.comm_dtype;  // as in the forward
    const MatrixView qkv = qkv_out(d, /*ring=*/true);
    ring_attention_backward(*p.ring, qkv.slice_cols(0, hl * D), qkv.slice_cols(hl * D, hl * D),
                            qkv.slice_cols(2 * hl * D, hl * D), a.attn_out.mat(), a.lse.data(), g.attn.mat(),
                            p.batch, hl, D, o, dq.slice_cols(0, hl * D), dq.slice_cols(hl * D, hl * D),
                            dq.slice_cols(2 * hl * D, hl * D));
    cp_rope(*p.ring, dq.slice_cols(0, hl * D), p.batch, hl, true);
    cp_rope(*p.ring, dq.slice_cols(hl * D, hl * D), p.batch, hl, true);
  } else if (qkv_pipeline && pending_blocks > 0) {
    // qkv's dX op asks for dQKV's rows last rows first; a query block's rows are final once attention's backward
    // has run it and every later block (which add to its dK, dV), so it runs the blocks down to the one asked for.
    // The record lives outside the closure (RowProducer says why).
    finish_dqkv_rows(d, p.batch, g, pending_blocks, blocks);  // the blocks the projection's pipeline ran
    const int64_t block_rows = kAttentionBlockRows * p.batch;
    produce_dqkv = [this, &d, &g, &next = pending_blocks, batch = p.batch, block_rows](RowRange rows) {
      const int64_t first = rows.begin / block_rows;
      if (rows.count <= 0 || first >= next) return;
      // Blocks run for milliseconds: the chunks already posted must keep moving meanwhile.
      progress_during(*ctx_->tp, [&] { attention_backward_range(d, batch, g, first, next); });
      finish_dqkv_rows(d, batch, g, first, next);
      next = first;
    };
  } else {
    if (pending_blocks > 0) attention_backward_range(d, p.batch, g, 0, pending_blocks);
    finish_dqkv_rows(d, p.batch, g, 0, blocks);
  }
  qkv_.backward(g.qkv.mat(), g.ln.mat(), {.queue = &q, .defer_own = p.ring != nullptr}, produce_dqkv,
                kAttentionBlockRows * p.batch);
  rmsnorm_backward(a.x_in.mat(), ln1_.value.data(), a.rstd1.data(), g.ln.mat(), g.x.mat(), ln1_.grad.data(), true);
}

void TransformerLayer::cp_rope(const CpRing& ring, MatrixView x, int64_t batch, int64_t heads, bool inverse) const {
  // The local rows are two zig-zag chunks of c positions; each rotates by its global positions.
  const int P = ring.size(), r = ring.rank();
  const int64_t c = x.rows / batch / 2, S = 2 * c * P;
  for (int a = 0; a < 2; ++a)
    rope_apply(x.slice_rows(a * c * batch, c * batch), batch, heads, cfg_.head_dim(), cfg_.rotary_base, inverse,
               zigzag_position(a * c, r, P, S));
}

// ---- Activation recomputation ------------------------------------------------------------------------------------

RecomputeGranularity parse_recompute_granularity(const std::string& s) {
  if (s == "full") return RecomputeGranularity::kFull;
  if (s == "selective") return RecomputeGranularity::kSelective;
  if (s == "none") return RecomputeGranularity::kNone;
  throw_invalid("--recompute-granularity '{}': choose full (recompute whole layers), selective (the attention "
                "probabilities only) or none",
                s);
}

RecomputeMethod parse_recompute_method(const std::string& s) {
  if (s == "uniform") return RecomputeMethod::kUniform;
  if (s == "block") return RecomputeMethod::kBlock;
  throw_invalid("--recompute-method '{}': choose uniform (chunks of --recompute-num-layers layers) or block (the "
                "first --recompute-num-layers layers)",
                s);
}

const char* to_string(RecomputeGranularity g) {
  switch (g) {
    case RecomputeGranularity::kFull: return "full";
    case RecomputeGranularity::kSelective: return "selective";
    case RecomputeGranularity::kNone: break;
  }
  return "none";
}

const char* to_string(RecomputeMethod m) { return m == RecomputeMethod::kBlock ? "block" : "uniform"; }

void RecomputeConfig::validate(int layers) const {
  switch (granularity) {
    case RecomputeGranularity::kNone:
      return;  // Megatron reads the method and the count only with a granularity
    case RecomputeGranularity::kSelective:
      if (method)
        throw_invalid("--recompute-method {} with --recompute-granularity selective: selective recomputes the "
                      "attention probabilities of every layer; drop --recompute-method (Megatron's rule)",
                      to_string(*method));
      if (num_layers)
        throw_invalid("--recompute-num-layers {} with --recompute-granularity selective: selective recomputes the "
                      "attention probabilities of every layer; drop --recompute-num-layers (Megatron's rule)",
                      *num_layers);
      return;
    case RecomputeGranularity::kFull:
      if (!method)
        throw_invalid("--recompute-granularity full needs --recompute-method uniform or block (and "
                      "--recompute-num-layers N)");
      if (!num_layers)
        throw_invalid("--recompute-granularity full needs --recompute-num-layers N, from 1 to --num-layers ({})",
                      layers);
      if (*num_layers < 1 || *num_layers > layers)
        throw_invalid("--recompute-num-layers {} with --recompute-granularity full: pass a number of layers from 1 "
                      "to --num-layers ({})",
                      *num_layers, layers);
      return;
  }
}

std::vector<LayerChunk> recompute_chunks(int layers, const RecomputeConfig& r) {
  r.validate(layers);
  std::vector<LayerChunk> chunks;
  const bool full = r.granularity == RecomputeGranularity::kFull;
  if (full && *r.method == RecomputeMethod::kUniform) {
    for (int b = 0; b < layers; b += *r.num_layers)
      chunks.push_back({b, std::min(layers, b + *r.num_layers), true});
    return chunks;
  }
  for (int i = 0; i < layers; ++i) chunks.push_back({i, i + 1, full && i < r.num_layers.value_or(0)});
  return chunks;
}

}  // namespace coc
