#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <iterator>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/comm/progress.h"
#include "coc/comm/shm_window.h"
#include "coc/core/bf16.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/linear.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {
/// The exchanges of the segmented dY gather, each split in its two halves (Communicator::exchange_recvs and
/// exchange_sends): step i carries every rank's segment i (`segment(r, i)`, rows of the gathered g [m, n]), its
/// sends paced behind step i-1's. Split so that a rank waits for the rows it receives and not for its own sends
/// to be taken: a send completes only when the peer's MPI progress takes it, and the peer is then computing
/// attention's backward, polling only between its blocks (the wait on the whole exchange was 88% exposed at issue
/// 35's shape, docs/performance.md point 42). `g16` (a bf16 wire, else null): bf16 twin of g whose rows the messages
/// carry as 2-byte elements (this rank's rows already rounded into it).
struct SegmentExchanges {
  std::vector<Work> recvs, sends;  ///< one of each per step, posted on every rank (empty lists included)
};

template <typename Segment>
SegmentExchanges post_segment_exchanges(Communicator& tp, int64_t exchanges, const Segment& segment, MatrixView g,
                                        BFloat16* g16, const std::string& name) {
  const int T = tp.size(), me = tp.rank();
  const int64_t n = g.cols;
  auto send_block = [&](int p, RowRange r) {
    return g16 ? P2pSend{p, g16 + r.begin * n, r.count * n, DType::kBF16} : P2pSend{p, g.row(r.begin), r.count * n};
  };
  auto recv_block = [&](int p, RowRange r) {
    return g16 ? P2pRecv{p, g16 + r.begin * n, r.count * n, DType::kBF16} : P2pRecv{p, g.row(r.begin), r.count * n};
  };
  SegmentExchanges x;
  x.recvs.reserve(static_cast<size_t>(exchanges));
  x.sends.reserve(static_cast<size_t>(exchanges));
  try {
    for (int64_t i = 0; i < exchanges; ++i) {
      std::vector<P2pSend> sends;
      std::vector<P2pRecv> recvs;
      const RowRange mine = segment(me, i);
      for (int p = 0; p < T; ++p) {
        if (p == me) continue;
        if (mine.count > 0) sends.push_back(send_block(p, mine));
        if (const RowRange theirs = segment(p, i); theirs.count > 0) recvs.push_back(recv_block(p, theirs));
      }
      const std::string tag = fmt::format("{} bwd dY segment {}/{}", name, i + 1, exchanges);
      x.recvs.push_back(tp.exchange_recvs(recvs, tag));
      // Each step's sends wait for the previous one's to leave (Communicator::exchange): sent at once, MPI would
      // interleave them and the first segment would arrive with the last.
      x.sends.push_back(tp.exchange_sends(sends, x.recvs.back(), tag, i > 0 ? x.sends.back() : Work()));
    }
  } catch (...) {
    // Those posted write into g (or g16) and read from it: they must end before the caller may free it.
    x.recvs.insert(x.recvs.end(), std::make_move_iterator(x.sends.begin()), std::make_move_iterator(x.sends.end()));
    detail::drain_after_error(x.recvs, std::current_exception());
    throw;
  }
  return x;
}
}  // namespace

RowParallelLinear::RowParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                                     const ParallelContext* ctx, Options options)
    : name_(std::move(name)),
      k_(in_features),
      n_(out_features),
      input_is_parallel_(options.input_is_parallel),
      ctx_(ctx) {
  if (k_ < 1 || n_ < 1) throw_invalid("{}: in/out features must be >= 1 (got {} → {})", name_, k_, n_);
  RowRange r = split_rows(k_, ctx_->tp_size(), ctx_->tp_rank());
  in_begin_ = r.begin;
  in_count_ = r.count;
  weight.name = name_ + ".weight";
  weight.read_as_compute_type = true;  // only GEMMs read it: the CoC ops, matmul, the segmented dY gather (param.h)
  weight.value.resize({n_, r.count});
  weight.grad.resize({n_, r.count});
  if (options.bias) {
    this->bias.name = name_ + ".bias";
    this->bias.value.resize({n_});
    this->bias.grad.resize({n_});
    this->bias.weight_decay = false;
    // Replicated on every TP rank; with SP its gradient is computed from the gathered dY, so it is complete
    // (no extra TP all-reduce needed, unlike norm weights).
    this->bias.placement = Placement::tp_replicated(/*sp_partial=*/false);
  }
}

RowParallelLinear::~RowParallelLinear() {
  // Unwinding (a peer may be gone and the job about to end): a short deadline, not another communicator timeout.
  const bool unwinding = std::uncaught_exceptions() > 0;
  for (Work& w : pending_sends_) {
    try {
      if (unwinding)
        w.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(2));
      else
        w.wait();
    } catch (const std::exception& e) {
      log::write(0, fmt::format("error: rank {}: {} backward's dY sends: {}", log::rank(), name_, e.what()));
      return;
    }
  }
}

void RowParallelLinear::finish_sends() {
  wait_all(pending_sends_);
  pending_sends_.clear();
}

void RowParallelLinear::set_context(const ParallelContext* ctx) {
  COC_ASSERT(ctx->tp == ctx_->tp, "{}: a context on another TP group", name_);
  ctx_ = ctx;
}

ParamList RowParallelLinear::params() {
  ParamList p{&weight};
  if (!bias.name.empty()) p.push_back(&bias);
  return p;
}

void RowParallelLinear::forward(ConstMatrixView x, int64_t m, MatrixView y, const RowProducer& produce) {
  forward_async(x, m, y, produce).wait();
}

CocPending RowParallelLinear::forward_async(ConstMatrixView x, int64_t m, MatrixView y, const RowProducer& produce) {
  x = forward_input(x, m, y, produce);
  const float* b = bias.name.empty() ? nullptr : bias.value.data();
  CocOptions o = ctx_->coc;
  o.tag = name_ + " fwd";
  o.fused = ctx_->fused_kernel || ctx_->mc2;
  if (input_is_parallel_) o.produce_rows = produce;
  if (ctx_->sequence_parallel)
    return matmul_reduce_scatter_async(*ctx_->tp, x, weight.value.mat(), WeightLayout::kNK, y, b, o);
  return matmul_all_reduce_async(*ctx_->tp, x, weight.value.mat(), WeightLayout::kNK, y, b, o);
}

ConstMatrixView RowParallelLinear::forward_input(ConstMatrixView x, int64_t m, MatrixView y,
                                                 const RowProducer& produce) {
  const bool sp = ctx_->sequence_parallel;
  const int64_t kin = input_is_parallel_ ? local_in() : k_;
  if (x.rows != m || x.cols != kin || y.cols != n_ || y.rows != (sp ? ctx_->shard_rows(m) : m))
    throw_invalid("{} forward (rank {}): input {}x{} / output {}x{} do not match m={}, k_in={}, n={}{}", name_,
                  ctx_->tp_rank(), x.rows, x.cols, y.rows, y.cols, m, kin, n_,
                  sp ? " (sequence parallel: output rows are this rank's shard)" : "");
  m_ = m;
  if (!input_is_parallel_) {
    if (produce) produce({0, m});  // the copy below reads every row
    // Megatron's scatter_to_tensor_model_parallel_region: keep this rank's columns. MindSpeed fixed this path in
    // one copy of its CoC code and not the other (docs/semantics.md §2).
    reserve(m);
    copy(x.slice_cols(in_begin_, local_in()), x_local_.mat());
    x = x_local_.mat();
  }
  saved_x_ = x;
  return x;
}

void RowParallelLinear::set_backward_input(ConstMatrixView x) {
  COC_ASSERT(input_is_parallel_, "{}: set_backward_input on a layer whose input is not parallel", name_);
  saved_x_ = x;
}

bool RowParallelLinear::dy16() const {
  return ctx_->sequence_parallel && input_is_parallel_ && gemm_compute_type() == DType::kBF16 &&
         ctx_->coc.comm_dtype == DType::kBF16 && bias.name.empty();
}

void RowParallelLinear::reserve(int64_t m_total) {
  finish_sends();  // they read dy_full_ or dy_full16_, which the caller is about to write or this may reallocate
  if (dy16())
    dy_full16_.resize(m_total, n_);
  else if (ctx_->sequence_parallel)
    dy_full_.resize({m_total, n_});
  if (!input_is_parallel_) {
    x_local_.resize({m_total, local_in()});
    dx_local_.resize({m_total, local_in()});
  }
}

void RowParallelLinear::backward(ConstMatrixView dy, MatrixView dx, WgradQueue* queue, const RowConsumer& consume,
                                 int64_t segment_rows, bool wgrad_as_rows_arrive) {
  const bool sp = ctx_->sequence_parallel;
  const int64_t m = m_;
  const int64_t kin = input_is_parallel_ ? local_in() : k_;
  if (dy.cols != n_ || dy.rows != (sp ? ctx_->shard_rows(m) : m) || dx.rows != m || dx.cols != kin)
    throw_invalid("{} backward (rank {}): dy {}x{} / dx {}x{} do not match forward m={}, k_in={}, n={}", name_,
                  ctx_->tp_rank(), dy.rows, dy.cols, dx.rows, dx.cols, m, kin, n_);
  if (consume && segment_rows < 1)
    throw_invalid("{} backward (rank {}): segment_rows must be >= 1 with a row consumer, got {}", name_,
                  ctx_->tp_rank(), segment_rows);
  MatrixView dxl = dx;
  if (!input_is_parallel_) {
    reserve(m);
    dxl = dx_local_.mat();
  }
  // dX = dY·W: W [n, k_r] read as [K=n, N=k_r]. Under dy16() the gathered dY stays bf16 (dy_full16_).
  ConstMatrixView dy_used = dy;
  const bool g16 = dy16();
  const bool segmented = consume && sp && input_is_parallel_ && ctx_->tp_size() > 1 && !ctx_->fused_kernel &&
                         !ctx_->mc2;
  // dW by rows only where dY crosses a network link: on one node the segments are in before the GEMMs could fill
  // a wait, and the smaller GEMMs cost time (issue 35's shape: 0.96×, docs/performance.md point 52).
  const bool dw_in_segments = segmented && wgrad_as_rows_arrive && weight.requires_grad &&
                              !ctx_->coc.deterministic &&
                              (!ctx_->tp->shm_window().node_local() || env::get_bool(env::Var::kTestAcrossNodes));
  if (segmented) {
    gather_in_segments(dy, dxl, queue, consume, segment_rows, dw_in_segments);
    dy_used = dy_full_.mat();
  } else if (sp) {
    CocOptions o = ctx_->coc;
    o.tag = name_ + " bwd dX";
    o.fused = ctx_->fused_kernel || ctx_->mc2;  // MC2: the gathered dY then feeds dW below
    if (queue && !queue->empty() && ctx_->wgrad_under_row_gather()) {
      // Queued weight-gradient work (--delay-column-wgrad) hides the whole gather: one non-blocking all-gather, so
      // auto has nothing to time.
      o.nonblocking_serial = true;
      o.parallel_num = 1;
      o.during_gather = [queue] { queue->run(); };
    }
    reserve(m);
    if (g16)
      all_gather_matmul_v2(*ctx_->tp, dy, weight.value.mat(), WeightLayout::kKN, dxl, dy_full16_.mat(), nullptr, o);
    else
      all_gather_matmul_v2(*ctx_->tp, dy, weight.value.mat(), WeightLayout::kKN, dxl, dy_full_.mat(), nullptr, o);
    dy_used = dy_full_.mat();
  } else {
    matmul(dy, weight.value.mat(), WeightLayout::kKN, dxl);
  }
  // dW = dYᵀ·X and db = colsum(dY): now, or queued for the next column layer's backward to run while its dX
  // reduction is in flight (--delay-wgrad-compute). dy_used and saved_x_ stay valid until then (linear.h).
  const bool dw = weight.requires_grad && !dw_in_segments, db = !bias.name.empty() && bias.requires_grad;
  auto wgrad = [this, dy_used, g16, x = saved_x_, dw, db] {
    if (dw && g16)
      gemm(ConstBf16View(dy_full16_.mat()), /*trans_a=*/true, x, false, weight.grad.mat(), 1.0f, 1.0f);
    else if (dw)
      gemm(dy_used, /*trans_a=*/true, x, false, weight.grad.mat(), 1.0f, 1.0f);
    if (db) accumulate_colsum(dy_used, bias.grad.data());
  };
  if (queue && ctx_->delay_wgrad_compute && (dw || db))
    queue->push(std::move(wgrad));
  else
    wgrad();
  if (!input_is_parallel_) {
    // Backward of the scatter is an all-gather along columns. Gather whole rows of the local slices and place each
    // rank's columns; small (only this rarely used path pays it).
    const int T = ctx_->tp_size();
    std::vector<int64_t> counts(static_cast<size_t>(T)), displs(static_cast<size_t>(T));
    for (int r = 0; r < T; ++r) {
      RowRange c = split_rows(k_, T, r);
      counts[static_cast<size_t>(r)] = c.count * m;
      displs[static_cast<size_t>(r)] = c.begin * m;
    }
    Tensor gathered({k_ * m});
    ctx_->tp->all_gather(dx_local_.data(), gathered.data(), counts, displs, name_ + " bwd gather dX").wait();
    for (int r = 0; r < T; ++r) {
      RowRange c = split_rows(k_, T, r);
      ConstMatrixView part{gathered.data() + c.begin * m, m, c.count, c.count};
      copy(part, dx.slice_cols(c.begin, c.count));
    }
  }
  if (consume && !segmented) consume({0, m});
}

void RowParallelLinear::gather_in_segments(ConstMatrixView dy, MatrixView dx, WgradQueue* queue,
                                           const RowConsumer& consume, int64_t segment_rows, bool dw_by_rows) {
  Communicator& tp = *ctx_->tp;
  const int T = tp.size(), me = tp.rank();
  const int64_t m = m_;
  reserve(m);
  const RowRange own = split_rows(m, T, me);
  // Under dy16() the segments travel into dy_full16_ and the GEMMs read them there; otherwise into g (fp32).
  BFloat16* g16 = dy16() ? dy_full16_.mat().data : nullptr;
  MatrixView g = g16 ? MatrixView{nullptr, m, n_, n_} : dy_full_.mat();
  if (g16) {
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", own.count * n_});
    for (int64_t i = 0; i < own.count; ++i) fp32_to_bf16(dy.row(i), g16 + (own.begin + i) * n_, n_);
  } else {
    copy(dy, g.slice_rows(own.begin, own.count));
  }
  // Rank r's segments: its shard cut on the multiples of segment_rows, numbered from its last rows down. Exchange
  // i carries every rank's segment i, so each peer's last rows arrive first. At tp = 2 that is the order the
  // consumer (attention's backward, last query block first) takes them in; with more ranks the lower ranks'
  // segments share the link with the last rank's, which the consumer needs first.
  auto segment = [&](int r, int64_t i) -> RowRange {
    const RowRange sh = split_rows(m, T, r);
    if (sh.count <= 0) return {sh.begin, 0};
    const int64_t top = (sh.end() - 1) / segment_rows;  // grid cell of the shard's last row
    const int64_t cell = top - i;
    const int64_t b = std::max(sh.begin, cell * segment_rows), e = std::min(sh.end(), (cell + 1) * segment_rows);
    return e > b ? RowRange{b, e - b} : RowRange{b, 0};
  };
  int64_t exchanges = 0;
  for (int r = 0; r < T; ++r) {
    const RowRange sh = split_rows(m, T, r);
    if (sh.count > 0) exchanges = std::max(exchanges, (sh.end() - 1) / segment_rows - sh.begin / segment_rows + 1);
  }
  // -v names the path, as the CoC ops do (no silent non-overlap: docs/edge-cases.md 11), once per layer.
  if (me == 0 && !logged_segments_) {
    logged_segments_ = true;
    log::verbose("coc segmented all_gather + matmul '{} bwd dX': m={} k={} n={} tp={} segments={} of <= {} rows per "
                 "rank, communicate-first: dY's segments arrive last rows first and dX's rows go to the layer's "
                 "consumer as they do (attention's backward under --attention-dense-backward-pipeline, SwiGLU's under "
                 "--swiglu-down-backward-pipeline); {}; dW {}",
                 name_, m, n_, local_in(), T, exchanges, segment_rows,
                 ctx_->coc.deterministic
                     ? fmt::format("deterministic (fixed {}-row GEMM tiles)", kDeterministicTileRows)
                     : std::string("non-deterministic"),
                 dw_by_rows ? "summed as the rows arrive (across nodes)" : "in one GEMM after the gather");
  }
  // bf16 wire with fp32 GEMMs or a bias: dY travels as bf16 through `wire` and is widened into g, all of g rounded
  // (own rows too) as all_gather_matmul_v2's bf16 wire rounds it: only GEMMs, which round it anyway, and the bias's
  // colsum read g, so the GEMMs' bits do not change.
  std::vector<BFloat16> wire;
  if (!g16 && ctx_->coc.comm_dtype == DType::kBF16) {
    wire.resize(static_cast<size_t>(m * n_));
    MatrixView mine = g.slice_rows(own.begin, own.count);
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", mine.rows * n_});
    for (int64_t i = 0; i < mine.rows; ++i) round_to_bf16(mine.row(i), n_);
    for (int64_t i = 0; i < mine.rows; ++i) fp32_to_bf16(mine.row(i), wire.data() + (own.begin + i) * n_, n_);
  }
  BFloat16* on_wire = g16 ? g16 : wire.empty() ? nullptr : wire.data();
  SegmentExchanges works;
  // Timed into the ops' counters (CocStats), so that the GEMM and exposed-communication figures keep counting this
  // layer's backward as they did when an op ran it.
  CocStats st;
  st.calls = 1;
  st.gflop = 2.0 * static_cast<double>(m) * static_cast<double>(n_) * static_cast<double>(local_in()) * 1e-9;
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    works = post_segment_exchanges(tp, exchanges, segment, g, on_wire, name_);
    // Queued weight-gradient work (--delay-column-wgrad's) hides the first segments on the ranks whose consumer
    // must wait for them. The rank holding the last rows has its consumer's first rows already (attention's
    // backward starts from the last block): it leaves the queue for the next column layer, whose dX reduction has
    // only its own dW GEMM beside it otherwise. Local work only, so the ranks may differ.
    const bool holds_last_rows = own.count > 0 && own.end() == m;
    if (queue && !queue->empty() && ctx_->wgrad_under_row_gather() && !holds_last_rows)
      progress_during(tp, [queue] { queue->run(); });
    // dX rows as their dY rows arrive. In deterministic mode the GEMMs run in the CoC ops' fixed 128-row tiles,
    // each once all its rows are in, so dX has the bits of the unsegmented all_gather_matmul_v2; otherwise one GEMM
    // per segment.
    const bool tiled = ctx_->coc.deterministic;
    std::vector<int64_t> missing;
    if (tiled) {
      missing.resize(static_cast<size_t>((m + kDeterministicTileRows - 1) / kDeterministicTileRows));
      for (size_t t = 0; t < missing.size(); ++t)
        missing[t] = std::min(kDeterministicTileRows, m - static_cast<int64_t>(t) * kDeterministicTileRows);
    }
    const ConstMatrixView w = weight.value.mat();
    auto multiply = [&](int64_t b, int64_t count) {
      const auto t0 = std::chrono::steady_clock::now();
      {
        // Its GEMM events belong to this op-like path, as the CoC ops' do (the profile checks them against
        // CocStats); the consumer's work after it does not.
        trace::Context op("segmented_all_gather_matmul");
        if (g16)
          matmul(ConstBf16View{g16 + b * n_, count, n_, n_}, w, WeightLayout::kKN, dx.slice_rows(b, count));
        else
          matmul(g.slice_rows(b, count), w, WeightLayout::kKN, dx.slice_rows(b, count));
      }
      st.gemm_s += seconds_since(t0);
      ++st.chunks;
      consume({b, count});
    };
    // dW = dYᵀ·X summed over the rows already here (backward: wgrad_as_rows_arrive).
    auto wgrad_rows = [&](int64_t b, int64_t count) {
      if (!dw_by_rows || count <= 0) return;
      const ConstMatrixView xr = saved_x_.slice_rows(b, count);
      // The later segments keep moving meanwhile, as under the consumer.
      progress_during(tp, [&] {
        if (g16)
          gemm(ConstBf16View{g16 + b * n_, count, n_, n_}, /*trans_a=*/true, xr, false, weight.grad.mat(), 1.0f, 1.0f);
        else
          gemm(ConstMatrixView(g.slice_rows(b, count)), /*trans_a=*/true, xr, false, weight.grad.mat(), 1.0f, 1.0f);
      });
    };
    auto arrived = [&](RowRange rows) {
      if (rows.count <= 0) return;
      if (!tiled) return multiply(rows.begin, rows.count);
      for (int64_t t = rows.begin / kDeterministicTileRows; t <= (rows.end() - 1) / kDeterministicTileRows; ++t) {
        const int64_t b = t * kDeterministicTileRows, e = std::min(m, b + kDeterministicTileRows);
        int64_t& left = missing[static_cast<size_t>(t)];
        left -= std::min(e, rows.end()) - std::max(b, rows.begin);
        if (left == 0) multiply(b, e - b);
      }
    };
    for (int64_t i = 0; i < exchanges; ++i) arrived(segment(me, i));  // this rank's rows are here already
    wgrad_rows(own.begin, own.count);
    for (int64_t i = 0; i < exchanges; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      works.recvs[static_cast<size_t>(i)].wait();
      st.comm_wait_s += seconds_since(t0);
      for (int p = T - 1; p >= 0; --p) {
        if (p == me) continue;
        const RowRange rows = segment(p, i);
        if (!wire.empty() && rows.count > 0) {
          COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "bf16_to_fp32", {"elements", rows.count * n_});
          bf16_to_fp32(wire.data() + rows.begin * n_, g.row(rows.begin), rows.count * n_);  // g is dense [m, n]
        }
        arrived(rows);
        wgrad_rows(rows.begin, rows.count);
      }
    }
    // The last step's sends may stay in flight (pending_sends_: they read dy_full_ or dy_full16_). The others go
    // first: a paced step is posted only when this rank tests it after its predecessor left, and a blocking MPI call
    // of this rank (a metadata collective) would then keep it from the peers waiting for it.
    const auto t0 = std::chrono::steady_clock::now();
    if (wire.empty() && !works.sends.empty()) {
      pending_sends_.push_back(std::move(works.sends.back()));
      works.sends.pop_back();
      wait_all(works.sends);
      if (pending_sends_.back().test()) pending_sends_.clear();  // posts it, if it was paced
    } else {
      wait_all(works.sends);  // they read `wire`, which goes with this call
    }
    st.comm_wait_s += seconds_since(t0);
  } catch (...) {
    // The exchanges write into dy_full_ (or dy_full16_) and read from it: they must end before anything may free it.
    works.recvs.insert(works.recvs.end(), std::make_move_iterator(works.sends.begin()),
                       std::make_move_iterator(works.sends.end()));
    detail::drain_after_error(works.recvs, std::current_exception());
    throw;
  }
  if (ctx_->coc.stats) *ctx_->coc.stats += st;
}

}  // namespace coc
