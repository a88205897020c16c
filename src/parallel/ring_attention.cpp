// Ring attention, forward and backward (see coc/parallel/ring_attention.h for the layout and the schedule).
#include "coc/parallel/ring_attention.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "coc/comm/progress.h"
#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {

/// The geometry of one rank's part: chunk length c, batch, heads, head dim, and the ring with its windows.
struct Part {
  int64_t c = 0, batch = 1, heads = 1, dim = 1;
  int P = 1, r = 0;
  int w = 1, R = 1, win = 0, ip = 0;  ///< window size, windows, this rank's window and place in it
  int64_t chunk_rows() const { return c * batch; }
  int64_t cols() const { return heads * dim; }
  int64_t block() const { return 2 * chunk_rows() * cols(); }  ///< elements of one rank's K (or V)
  /// Global position of the first row of local chunk a (0 or 1) of cp rank `owner`.
  int64_t chunk_pos(int owner, int a) const { return (a == 0 ? owner : 2 * P - 1 - owner) * c; }
  /// The cp rank at place `i` of window `wi` (both taken modulo their counts).
  int at(int wi, int i) const { return ((wi % R + R) % R) * w + ((i % w + w) % w); }
  /// Whose K, V this rank holds at step s: round s / w brings the blocks of the window that many windows back,
  /// and within the round the block moves one place per step.
  int owner(int s) const { return at(win - s / w, ip - s % w); }
  /// Whether the hop after step s stays inside the window (inner ring) or starts a new round.
  bool inner_hop_after(int s) const { return (s + 1) % w != 0; }
};

Part make_part(const CpRing& ring, ConstMatrixView q, int64_t batch, int64_t heads, int64_t head_dim,
               const RingAttentionOptions& opts) {
  Part p;
  p.P = ring.size();
  p.r = ring.rank();
  p.batch = batch;
  p.heads = heads;
  p.dim = head_dim;
  COC_ASSERT(batch > 0 && heads > 0 && head_dim > 0 && q.cols == heads * head_dim && q.rows % (2 * batch) == 0 &&
                 q.rows > 0,
             "{}: q [{}, {}] for B {}, heads {}, D {} (rows must be 2c·B)", opts.tag, q.rows, q.cols, batch, heads,
             head_dim);
  p.c = q.rows / (2 * batch);
  check_ring_attention_sizes(2 * p.c * p.P, p.P, opts.window_size);
  p.w = opts.window_size;
  p.R = p.P / p.w;
  p.win = p.r / p.w;
  p.ip = p.r % p.w;
  return p;
}

/// One hop: `send` (count elements of `type`) to cp rank `to`, `recv` from cp rank `from`, every rank hopping the
/// same way. With an overlap communicator, a message goes on the one of its sender's parity (CpRing), and every
/// rank calls both, so that their sequence numbers stay in step.
std::vector<Work> hop(const CpRing& ring, int to, int from, const void* send, void* recv, int64_t count,
                      const std::string& tag, DType type = DType::kF32) {
  const P2pSend s{to, send, count, type};
  const P2pRecv v{from, recv, count, type};
  if (ring.overlap == nullptr) return {ring.cp->exchange({&s, 1}, {&v, 1}, tag)};
  Communicator* const on[2] = {ring.cp, ring.overlap};  // [parity of the sender]
  std::vector<Work> w;
  for (Communicator* c : on) {
    const bool sends = c == on[ring.rank() % 2], recvs = c == on[from % 2];
    w.push_back(c->exchange(std::span<const P2pSend>(&s, sends ? 1 : 0), std::span<const P2pRecv>(&v, recvs ? 1 : 0),
                            tag));
  }
  return w;
}

/// Lets the inline progress engine move a hop along between blocks (and the trace see its completion).
void poll_hop(std::vector<Work>& works) {
  for (Work& w : works) w.test();
}

void wait_hop(std::vector<Work>& works) {
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "ring_attention wait");
  wait_all(works);
  works.clear();
}

/// The K, V blocks in flight (forward and backward alike). Inner hops double-buffer `cur`/`nxt`. A round's outer
/// hop starts with the round and is waited for at its end, so its send buffer must outlive every inner step of the
/// round: with w > 1 it is a copy (`osend`), since `cur`'s slot is received into during the round (upstream, an
/// outer-ring send buffer was overwritten in flight); with w = 1 there is no inner step and `cur` itself goes.
/// The buffers hold elements of RingAttentionOptions::kv_dtype: fp32, or bf16 (2 bytes on the wire, issue 35),
/// in which case `wide_` holds the current block widened to fp32 (exact) for the block attention to read.
class KvRing {
 public:
  KvRing(const CpRing& ring, const Part& p, ConstMatrixView k, ConstMatrixView v, DType type, std::string tag)
      : ring_(ring), p_(p), n_(2 * p.block()), type_(type), es_(static_cast<size_t>(dtype_size(type))),
        cur_(static_cast<size_t>(n_) * es_), nxt_(cur_.size()), orecv_(cur_.size()), tag_(std::move(tag)) {
    COC_ASSERT(type == DType::kF32 || type == DType::kBF16, "{}: K/V blocks travel as fp32 or bf16, not {}", tag_,
               to_string(type));
    const int64_t L = 2 * p.chunk_rows(), C = p.cols();
    if (type_ == DType::kBF16) wide_.resize(static_cast<size_t>(n_));
    float* f = type_ == DType::kBF16 ? wide_.data() : reinterpret_cast<float*>(cur_.data());
    copy(k, MatrixView{f, L, C, C});
    copy(v, MatrixView{f + p.block(), L, C, C});
    // The caller's K and V hold bf16 values under --bf16, so this rounding changes nothing there; for other
    // inputs it makes this rank read its own block as its peers receive it.
    if (type_ == DType::kBF16) {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", n_});
      round_to_bf16(f, n_);
      fp32_to_bf16(f, reinterpret_cast<BFloat16*>(cur_.data()), n_);
    }
  }
  /// Posts the transfers that step s starts: the round's outer hop at its first step, the inner hop otherwise.
  void post(int s) {
    const int i = s % p_.w;
    if (i == 0 && s + p_.w < p_.P) {
      const std::byte* src = cur_.data();
      if (p_.w > 1) {
        osend_ = cur_;
        src = osend_.data();
      }
      outer_ = hop(ring_, p_.at(p_.win + 1, p_.ip), p_.at(p_.win - 1, p_.ip), src, orecv_.data(), n_,
                   fmt::format("{} outer {}", tag_, s / p_.w), type_);
    }
    if (p_.inner_hop_after(s) && s + 1 < p_.P)
      inner_ = hop(ring_, p_.at(p_.win, p_.ip + 1), p_.at(p_.win, p_.ip - 1), cur_.data(), nxt_.data(), n_,
                   fmt::format("{} inner {}", tag_, s), type_);
  }
  void poll() {
    poll_hop(inner_);
    poll_hop(outer_);
  }
  /// Waits for what post() started (RingAttentionOptions::serial).
  void wait_posted() {
    wait_hop(inner_);
    wait_hop(outer_);
  }
  /// Ends step s: the next block is in cur().
  void finish(int s) {
    wait_hop(inner_);
    if (s + 1 >= p_.P) return;
    if (p_.inner_hop_after(s)) {
      cur_.swap(nxt_);
    } else {
      wait_hop(outer_);
      cur_.swap(orecv_);
    }
    if (type_ == DType::kBF16) {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "bf16_to_fp32", {"elements", n_});
      bf16_to_fp32(reinterpret_cast<const BFloat16*>(cur_.data()), wide_.data(), n_);
    }
  }
  ConstMatrixView k() const { return {block(), 2 * p_.chunk_rows(), p_.cols(), p_.cols()}; }
  ConstMatrixView v() const { return {block() + p_.block(), 2 * p_.chunk_rows(), p_.cols(), p_.cols()}; }

 private:
  const float* block() const {
    return type_ == DType::kBF16 ? wide_.data() : reinterpret_cast<const float*>(cur_.data());
  }
  const CpRing& ring_;
  const Part& p_;
  int64_t n_;
  DType type_;
  size_t es_;  ///< bytes per element of the buffers below
  std::vector<std::byte> cur_, nxt_, osend_, orecv_;
  std::vector<float> wide_;  ///< bf16: cur_ widened
  std::vector<Work> inner_, outer_;
  std::string tag_;
};

}  // namespace

CpRing make_cp_ring(Communicator& cp, bool send_recv_overlap, std::unique_ptr<Communicator>& owned) {
  CpRing ring{&cp, nullptr};
  if (send_recv_overlap && cp.size() > 1) {
    owned = cp.split(0, cp.rank(), cp.name() + "-send-recv-overlap");
    ring.overlap = owned.get();
  }
  return ring;
}

void check_ring_attention_sizes(int64_t seq, int cp, int window_size) {
  if (cp < 1) throw_invalid("--context-parallel-size must be >= 1 (got {})", cp);
  if (seq < 1) throw_invalid("--seq-length must be >= 1 (got {})", seq);
  const int64_t unit = 2 * static_cast<int64_t>(cp);
  if (seq % unit != 0) {
    const int64_t lo = seq / unit * unit, hi = lo + unit;
    throw_invalid("ring attention: --seq-length {} does not divide into 2·CP = {} zig-zag chunks "
                  "(--context-parallel-size {}); use {}",
                  seq, unit, cp, lo > 0 ? fmt::format("{} or {}", lo, hi) : std::to_string(hi));
  }
  if (window_size < 1 || cp % window_size != 0)
    throw_invalid("--cp-window-size {} must be >= 1 and divide --context-parallel-size {}", window_size, cp);
}

int64_t zigzag_position(int64_t t, int cp_rank, int cp_size, int64_t seq) {
  const int64_t c = seq / (2 * cp_size);
  return t < c ? cp_rank * c + t : (2 * cp_size - 1 - cp_rank) * c + (t - c);
}

void zigzag_gather(ConstMatrixView full, int64_t batch, int cp_rank, int cp_size, MatrixView local) {
  const int64_t seq = full.rows / batch, c = seq / (2 * cp_size);
  COC_ASSERT(full.rows == seq * batch && local.rows == 2 * c * batch && local.cols == full.cols,
             "zigzag_gather: full [{}, {}], local [{}, {}], B {}, CP {}", full.rows, full.cols, local.rows, local.cols,
             batch, cp_size);
  for (int64_t t = 0; t < 2 * c; ++t) {
    const int64_t g = zigzag_position(t, cp_rank, cp_size, seq);
    copy(full.slice_rows(g * batch, batch), local.slice_rows(t * batch, batch));
  }
}

void zigzag_scatter(ConstMatrixView local, int64_t batch, int cp_rank, int cp_size, MatrixView full) {
  const int64_t seq = full.rows / batch, c = seq / (2 * cp_size);
  COC_ASSERT(full.rows == seq * batch && local.rows == 2 * c * batch && local.cols == full.cols,
             "zigzag_scatter: full [{}, {}], local [{}, {}], B {}, CP {}", full.rows, full.cols, local.rows,
             local.cols, batch, cp_size);
  for (int64_t t = 0; t < 2 * c; ++t) {
    const int64_t g = zigzag_position(t, cp_rank, cp_size, seq);
    copy(local.slice_rows(t * batch, batch), full.slice_rows(g * batch, batch));
  }
}

void ring_attention_forward(const CpRing& ring, ConstMatrixView q, ConstMatrixView k, ConstMatrixView v,
                            int64_t batch, int64_t heads, int64_t head_dim, const RingAttentionOptions& opts,
                            MatrixView out, float* lse) {
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "ring_attention_forward", {"cp", ring.size()},
                  {"rows", q.rows});
  const Part p = make_part(ring, q, batch, heads, head_dim, opts);
  COC_ASSERT(k.rows == q.rows && k.cols == q.cols && v.rows == q.rows && v.cols == q.cols && out.rows == q.rows &&
                 out.cols == q.cols,
             "{}: q [{}, {}], k [{}, {}], v [{}, {}], out [{}, {}] differ", opts.tag, q.rows, q.cols, k.rows, k.cols,
             v.rows, v.cols, out.rows, out.cols);
  const int64_t cr = p.chunk_rows(), C = p.cols(), L = 2 * cr;
  KvRing kv(ring, p, k, v, opts.kv_dtype, opts.tag + " kv");
  for (int64_t i = 0; i < out.rows; ++i) std::fill(out.row(i), out.row(i) + C, 0.0f);
  std::fill(lse, lse + L * heads, -std::numeric_limits<float>::infinity());
  Tensor part({cr, C});
  std::vector<float> part_lse(static_cast<size_t>(cr * heads));
  for (int s = 0; s < p.P; ++s) {
    // The next block's transfer goes first and runs under this block's attention.
    kv.post(s);
    if (opts.serial) kv.wait_posted();
    if (opts.step_hook) opts.step_hook(s);
    const int owner = p.owner(s);
    for (int a = 0; a < 2; ++a)
      for (int e = 0; e < 2; ++e) {
        const AttnBlock g{p.c, p.c, batch, heads, head_dim, p.chunk_pos(p.r, a), p.chunk_pos(owner, e), opts.mask};
        if (block_fully_masked(g)) continue;
        block_attention_forward(q.slice_rows(a * cr, cr), kv.k().slice_rows(e * cr, cr),
                                kv.v().slice_rows(e * cr, cr), g, part.mat(), part_lse.data(), [&] { kv.poll(); });
        attention_merge_partial(out.slice_rows(a * cr, cr), lse + a * cr * heads, part.mat(), part_lse.data(), heads,
                                head_dim);
        kv.poll();
      }
    kv.finish(s);
  }
}

void ring_attention_backward(const CpRing& ring, ConstMatrixView q, ConstMatrixView k, ConstMatrixView v,
                             ConstMatrixView out, const float* lse, ConstMatrixView dout, int64_t batch, int64_t heads,
                             int64_t head_dim, const RingAttentionOptions& opts, MatrixView dq, MatrixView dk,
                             MatrixView dv) {
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "ring_attention_backward", {"cp", ring.size()},
                  {"rows", q.rows});
  const Part p = make_part(ring, q, batch, heads, head_dim, opts);
  for (ConstMatrixView m : {k, v, out, dout, ConstMatrixView(dq), ConstMatrixView(dk), ConstMatrixView(dv)})
    COC_ASSERT(m.rows == q.rows && m.cols == q.cols, "{} backward: a [{}, {}] operand differs from q [{}, {}]",
               opts.tag, m.rows, m.cols, q.rows, q.cols);
  const int64_t cr = p.chunk_rows(), C = p.cols(), L = 2 * cr, n = 2 * p.block();
  KvRing kv(ring, p, k, v, opts.kv_dtype, opts.tag + " bwd kv");
  // acc: the held block's [dK; dV] partial sum, computed here and then sent on (two, so that one can be written
  // while the other is still in flight). inc: the partial sum of the steps before, arriving from the rank that held
  // the block then.
  std::vector<float> acc[2] = {std::vector<float>(static_cast<size_t>(n)), std::vector<float>(static_cast<size_t>(n))};
  std::vector<float> inc[2] = {std::vector<float>(static_cast<size_t>(n)), std::vector<float>(static_cast<size_t>(n))};
  for (int64_t i = 0; i < dq.rows; ++i) std::fill(dq.row(i), dq.row(i) + C, 0.0f);
  std::vector<Work> dkv_hop;  // the partial sums of the previous step, on their way
  for (int s = 0; s < p.P; ++s) {
    const int cur = s % 2, owner = p.owner(s);
    kv.post(s);
    if (opts.serial) kv.wait_posted();
    if (opts.step_hook) opts.step_hook(s);
    // acc[cur] was last sent two steps ago, and that hop was waited for in the previous step.
    float* a_buf = acc[cur].data();
    std::fill(a_buf, a_buf + n, 0.0f);
    const MatrixView dK{a_buf, L, C, C}, dV{a_buf + p.block(), L, C, C};
    for (int a = 0; a < 2; ++a)
      for (int e = 0; e < 2; ++e) {
        const AttnBlock g{p.c, p.c, batch, heads, head_dim, p.chunk_pos(p.r, a), p.chunk_pos(owner, e), opts.mask};
        if (block_fully_masked(g)) continue;
        block_attention_backward(q.slice_rows(a * cr, cr), kv.k().slice_rows(e * cr, cr),
                                 kv.v().slice_rows(e * cr, cr), out.slice_rows(a * cr, cr), lse + a * cr * heads,
                                 dout.slice_rows(a * cr, cr), g, dq.slice_rows(a * cr, cr), dK.slice_rows(e * cr, cr),
                                 dV.slice_rows(e * cr, cr), [&] {
                                   kv.poll();
                                   poll_hop(dkv_hop);
                                 });
      }
    if (s > 0) {
      // The sum of the steps before, for the same block: add it, in this fixed order.
      wait_hop(dkv_hop);
      const float* in = inc[1 - cur].data();
      for (int64_t x = 0; x < n; ++x) a_buf[x] += in[x];
    }
    if (p.P > 1) {
      // To whoever holds this block next: the next place in the window, or, at the end of a round, the next
      // window's rank that received the block over the outer ring (one place on: the diagonal). After the last
      // step that is the block's owner.
      const bool inner = p.inner_hop_after(s);
      const int to = inner ? p.at(p.win, p.ip + 1) : p.at(p.win + 1, p.ip + 1);
      const int from = inner ? p.at(p.win, p.ip - 1) : p.at(p.win - 1, p.ip - 1);
      dkv_hop = hop(ring, to, from, a_buf, inc[cur].data(), n, fmt::format("{} bwd dkv {}", opts.tag, s));
      if (opts.serial) wait_hop(dkv_hop);
    }
    kv.finish(s);
  }
  // After the last hop each block's gradient sum is at its owner; with CP = 1 it never left.
  const float* total = acc[0].data();
  if (p.P > 1) {
    if (opts.during_last_hop) progress_during(*ring.cp, opts.during_last_hop);
    wait_hop(dkv_hop);
    total = inc[(p.P - 1) % 2].data();
  }
  copy(ConstMatrixView{total, L, C, C}, dk);
  copy(ConstMatrixView{total + p.block(), L, C, C}, dv);
}

}  // namespace coc
