// The MoE layer and its three expert-parallel dispatchers (parallel/moe.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "coc/comm/progress.h"
#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/parallel/moe.h"
#include "coc/runtime/tracer.h"

namespace coc {

const char* to_string(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::kEager: return "eager";
    case MoeDispatcher::kFused: return "fused";
    case MoeDispatcher::kMc2: return "mc2";
  }
  return "?";
}

MoeDispatcher parse_moe_dispatcher(const std::string& s) {
  if (s == "eager") return MoeDispatcher::kEager;
  if (s == "fused") return MoeDispatcher::kFused;
  if (s == "mc2") return MoeDispatcher::kMc2;
  throw_invalid("--ep-dispatcher {}: unknown dispatcher; use eager, fused or mc2", s);
}

void check_moe_config(const MoeConfig& c, int ep_size) {
  if (c.num_experts < 1) throw_invalid("--num-experts {}: a MoE layer needs at least 1 expert", c.num_experts);
  if (c.num_experts % ep_size != 0)
    throw_invalid("--num-experts {} is not divisible by --expert-model-parallel-size {}: every EP rank holds the same "
                  "number of experts; choose E a multiple of EP",
                  c.num_experts, ep_size);
  if (c.topk < 1 || c.topk > c.num_experts)
    throw_invalid("--moe-router-topk {} must be in [1, --num-experts {}]", c.topk, c.num_experts);
  if (c.mc2_chunks < 1) throw_invalid("--moe-mc2-chunks {} must be >= 1", c.mc2_chunks);
  if (c.hidden < 1 || c.ffn_hidden < 1)
    throw_invalid("MoE sizes must be >= 1: hidden {}, --moe-ffn-hidden-size {}", c.hidden, c.ffn_hidden);
}

namespace {
/// Rows [begin, end) of chunk c of n rows split into N (overlap/partition.h's even split, the first chunks
/// smaller by at most one row).
std::pair<int64_t, int64_t> chunk_rows(int64_t n, int N, int c) { return {n * c / N, n * (c + 1) / N}; }

/// Uniform ±bound initialisation of a full tensor [rows, cols] from `seed`, keeping rows [row0, row0 + out.rows).
void init_rows(Tensor& out, int64_t full_rows, int64_t row0, double bound, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(static_cast<float>(-bound), static_cast<float>(bound));
  const int64_t cols = out.cols();
  for (int64_t r = 0; r < full_rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = d(g);
      if (r >= row0 && r < row0 + out.rows()) out[(r - row0) * cols + c] = v;
    }
}
}  // namespace

/// The routing of the last forward and the activations backward needs.
struct MoeLayer::Plan {
  int64_t tokens = 0;
  Tensor x;          ///< [T, H] input (router gradient)
  Routing routing;
  int64_t global_tokens = 0;
  std::vector<int64_t> global_counts;  ///< [E] slots per expert over the token group (aux loss)
  // Send side, slot order: the kept slots sorted by expert, stable in (token, j) order.
  std::vector<int64_t> slot_pos;   ///< [T·K] row of the slot in the permuted buffer, −1 when dropped
  std::vector<int64_t> send_rows;  ///< [E] kept slots per expert
  std::vector<int64_t> send_off;   ///< [E] their first row
  int64_t sent = 0;                ///< Σ send_rows
  // Receive side, expert-major then source: block (le, s) holds recv_rows[le·P + s] rows at recv_off[le·P + s].
  std::vector<int64_t> recv_rows, recv_off;
  std::vector<int64_t> expert_rows;  ///< [Le] rows per local expert
  int64_t received = 0;
  Tensor x_recv;  ///< [R, H]
  Tensor h;       ///< [R, 2F] gate | up pre-activations
  Tensor act;     ///< [R, F]
  Tensor y_perm;  ///< [S, H] expert outputs in slot order (top-k weight gradient)
};

MoeLayer::MoeLayer(const MoeConfig& cfg, Communicator& ep, Communicator& token_group, const std::string& name,
                   uint64_t seed)
    : cfg_(cfg), ep_(ep), tokens_(token_group) {
  check_moe_config(cfg, ep.size());
  local_experts_ = cfg.num_experts / ep.size();
  const int64_t E = cfg.num_experts, Le = local_experts_, H = cfg.hidden, F = cfg.ffn_hidden;
  router = Param{name + ".router.weight", Tensor({E, H}), Tensor({E, H}), Placement::tp_replicated(false)};
  w_gate_up = Param{name + ".experts.gate_up.weight", Tensor({Le * 2 * F, H}), Tensor({Le * 2 * F, H}),
                    Placement::expert(false)};
  w_down = Param{name + ".experts.down.weight", Tensor({Le * H, F}), Tensor({Le * H, F}), Placement::expert(false)};
  // The experts' weights feed only the grouped GEMMs; the router's feed an fp32 GEMM (param.h).
  w_gate_up.read_as_compute_type = w_down.read_as_compute_type = true;
  const int64_t first = static_cast<int64_t>(ep.rank()) * Le;
  init_rows(router.value, E, 0, 1.0 / std::sqrt(static_cast<double>(H)), seed);
  init_rows(w_gate_up.value, E * 2 * F, first * 2 * F, 1.0 / std::sqrt(static_cast<double>(H)), seed + 1);
  init_rows(w_down.value, E * H, first * H, 1.0 / std::sqrt(static_cast<double>(F)), seed + 2);
}

void MoeLayer::set_dispatcher(MoeDispatcher d, int mc2_chunks) {
  MoeConfig c = cfg_;
  c.dispatcher = d;
  c.mc2_chunks = mc2_chunks;
  check_moe_config(c, ep_.size());
  cfg_ = c;
}

void MoeLayer::set_comm_dtype(DType t) {
  if (t != DType::kF32 && t != DType::kBF16)
    throw_invalid("MoE token exchange: comm_dtype {} is not supported; the tokens travel as fp32 or bf16",
                  to_string(t));
  cfg_.comm_dtype = t;
}

namespace {

/// dst[0, n) = src[0, n), each of its own type (fp32 or bf16): a copy, a rounding (fp32 → bf16, nearest even) or a
/// widening (bf16 → fp32, exact).
void move_elems(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (n <= 0) return;
  if (st == dt) return static_cast<void>(std::memcpy(dst, src, static_cast<size_t>(n * dtype_size(st))));
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, st == DType::kF32 ? "fp32_to_bf16" : "bf16_to_fp32", {"elements", n});
  if (st == DType::kF32)
    fp32_to_bf16(static_cast<const float*>(src), static_cast<BFloat16*>(dst), n);
  else
    bf16_to_fp32(static_cast<const BFloat16*>(src), static_cast<float*>(dst), n);
}

/// Element `i` of a buffer of `t` elements.
const void* at(const void* base, int64_t i, DType t) { return static_cast<const char*>(base) + i * dtype_size(t); }
void* at(void* base, int64_t i, DType t) { return static_cast<char*>(base) + i * dtype_size(t); }

/// The buffers of one transport: the caller's fp32 rows and, for each direction whose wire is bf16, staging of
/// the same row layout that the messages use. Dispatch (in): in_send [S, w_in] → in_recv [R, w_in]; combine (out):
/// out_recv [R, w_out] → out_send [S, w_out]. The wire_* pointers are what the messages read and write: the fp32
/// rows themselves on an fp32 wire, the staging on a bf16 one.
struct Io {
  const float* in_send;
  float* in_recv;
  float* out_recv;
  float* out_send;
  int64_t w_in, w_out;
  DType in_type, out_type;
  std::vector<BFloat16> s_in_send, s_in_recv, s_out_recv, s_out_send;
  const void* wire_in_send = nullptr;
  void* wire_in_recv = nullptr;
  void* wire_out_recv = nullptr;
  void* wire_out_send = nullptr;

  Io(const float* is, int64_t wi, float* ir, float* orv, int64_t wo, float* os, DType it, DType ot, int64_t S,
     int64_t R)
      : in_send(is), in_recv(ir), out_recv(orv), out_send(os), w_in(wi), w_out(wo), in_type(it), out_type(ot),
        wire_in_send(is), wire_in_recv(ir), wire_out_recv(orv), wire_out_send(os) {
    if (it == DType::kBF16) {
      // Every row to dispatch is known now: rounded once, whatever the dispatcher.
      s_in_send.resize(static_cast<size_t>(S * wi));
      s_in_recv.resize(static_cast<size_t>(R * wi));
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", S * wi});
      fp32_to_bf16(is, s_in_send.data(), S * wi);
      wire_in_send = s_in_send.data();
      wire_in_recv = s_in_recv.data();
    }
    if (ot == DType::kBF16) {
      s_out_recv.resize(static_cast<size_t>(R * wo));
      s_out_send.resize(static_cast<size_t>(S * wo));
      wire_out_recv = s_out_recv.data();
      wire_out_send = s_out_send.data();
    }
  }
};

/// all_to_all of `type` elements (fp32 or bf16).
Work all_to_all_typed(Communicator& ep, const void* send, std::span<const int64_t> sc, std::span<const int64_t> sd,
                      void* recv, std::span<const int64_t> rc, std::span<const int64_t> rd, DType type,
                      const std::string& tag) {
  if (type == DType::kBF16)
    return ep.all_to_all(static_cast<const BFloat16*>(send), sc, sd, static_cast<BFloat16*>(recv), rc, rd, tag);
  return ep.all_to_all(static_cast<const float*>(send), sc, sd, static_cast<float*>(recv), rc, rd, tag);
}

/// Moves rows between the slot order of every rank (send side) and the expert-major order of the experts'
/// ranks (receive side), running the experts in between: `in_send` [S, w_in] → `in_recv` [R, w_in];
/// compute(le, begin, rows) turns in_recv rows into out_recv [R, w_out] rows; `out_recv` → `out_send` [S, w_out].
/// The same routine serves forward (tokens in, expert outputs out) and backward (output gradients in, input
/// gradients out). Each direction travels as `in_type` / `out_type` (fp32 or bf16): a bf16 direction rounds its
/// rows into staging before they leave (the local rows too, so that every row the experts read, or the caller
/// gets back, went through the same rounding) and widens them on arrival.
struct Transport {
  Communicator& ep;
  const MoeConfig& cfg;
  int Le;
  const std::vector<int64_t>& send_rows;  // [E]
  const std::vector<int64_t>& send_off;   // [E]
  const std::vector<int64_t>& recv_rows;  // [Le·P]
  const std::vector<int64_t>& recv_off;   // [Le·P]
  const std::vector<int64_t>& expert_rows;  // [Le]
  const char* what;                          // "forward" | "backward"
  DType in_type = DType::kF32, out_type = DType::kF32;
  using Compute = std::function<void(int le, int64_t begin, int64_t rows)>;

  int P() const { return ep.size(); }
  int64_t expert_begin(int le) const { return recv_off[static_cast<size_t>(le * P())]; }

  void run(const float* in_send, int64_t w_in, float* in_recv, float* out_recv, int64_t w_out, float* out_send,
           const Compute& compute) const {
    const int64_t S = send_off.empty() ? 0 : send_off.back() + send_rows.back();
    const int64_t R = recv_off.empty() ? 0 : recv_off.back() + recv_rows.back();
    Io io(in_send, w_in, in_recv, out_recv, w_out, out_send, in_type, out_type, S, R);
    switch (cfg.dispatcher) {
      case MoeDispatcher::kEager: eager(io, R, compute); return;
      case MoeDispatcher::kFused: fused(io, compute); return;
      case MoeDispatcher::kMc2: mc2(io, compute); return;
    }
  }

  /// Rows [b, e) of block `blk` (b, e relative to the block) in chunk c of N: in deterministic mode whole tiles.
  std::pair<int64_t, int64_t> block_chunk(size_t blk, int N, int c) const {
    const int64_t n = recv_rows[blk];
    if (!cfg.deterministic) return chunk_rows(n, N, c);
    const int64_t tile = cfg.deterministic_tile_rows, tiles = (n + tile - 1) / tile;
    const auto [tb, te] = chunk_rows(tiles, N, c);
    return {std::min(n, tb * tile), std::min(n, te * tile)};
  }
  /// Runs the experts on rows [b, e) of block `blk` of local expert le: in deterministic mode tile by tile (tiles
  /// counted from the block's first row), otherwise in one call.
  void compute_block(const Compute& compute, int le, size_t blk, int64_t b, int64_t e) const {
    if (e <= b) return;
    if (!cfg.deterministic) return compute(le, recv_off[blk] + b, e - b);
    for (int64_t t = b; t < e; t += cfg.deterministic_tile_rows)
      compute(le, recv_off[blk] + t, std::min(e, t + cfg.deterministic_tile_rows) - t);
  }
  /// Every local expert at once: one GEMM per expert over all its received rows (deterministic: per block, in
  /// tiles).
  void compute_all(const Compute& compute) const {
    for (int le = 0; le < Le; ++le) {
      if (!cfg.deterministic) {
        if (expert_rows[static_cast<size_t>(le)] > 0)
          compute(le, expert_begin(le), expert_rows[static_cast<size_t>(le)]);
        continue;
      }
      for (int s = 0; s < P(); ++s) {
        const size_t blk = static_cast<size_t>(le * P() + s);
        compute_block(compute, le, blk, 0, recv_rows[blk]);
      }
    }
  }

  /// Megatron's alltoall dispatcher: all-to-all(v) in rank-major order, sort to expert-major, compute, sort back,
  /// all-to-all(v) back. The sorts also widen (in) and round (out) a bf16 wire's rows.
  void eager(Io& io, int64_t R, const Compute& compute) const {
    const int p = P();
    std::vector<int64_t> sc(p), sd(p), rc(p), rd(p);
    // rank-major receive layout: for s: for le: block (le, s)
    std::vector<int64_t> rm_off(static_cast<size_t>(Le * p));
    int64_t off = 0;
    for (int s = 0; s < p; ++s)
      for (int le = 0; le < Le; ++le) {
        rm_off[static_cast<size_t>(le * p + s)] = off;
        off += recv_rows[static_cast<size_t>(le * p + s)];
      }
    auto counts = [&](int64_t w) {
      for (int r = 0; r < p; ++r) {
        sc[r] = rc[r] = 0;
        for (int le = 0; le < Le; ++le) {
          sc[r] += send_rows[static_cast<size_t>(r * Le + le)] * w;
          rc[r] += recv_rows[static_cast<size_t>(le * p + r)] * w;
        }
        sd[r] = send_off[static_cast<size_t>(r * Le)] * w;
        rd[r] = rm_off[static_cast<size_t>(r)] * w;  // block (le 0, s r)
      }
    };
    const int64_t w_in = io.w_in, w_out = io.w_out;
    std::vector<float> rank_major(static_cast<size_t>(R * std::max(w_in, w_out)));  // bf16 rows use its first half
    counts(w_in);
    all_to_all_typed(ep, io.wire_in_send, sc, sd, rank_major.data(), rc, rd, io.in_type,
                     fmt::format("moe dispatch {}", what))
        .wait();
    {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "moe_sort_chunks", {"rows", R});
      for (size_t b = 0; b < rm_off.size(); ++b)
        move_elems(at(rank_major.data(), rm_off[b] * w_in, io.in_type), io.in_type, io.in_recv + recv_off[b] * w_in,
                   DType::kF32, recv_rows[b] * w_in);
    }
    compute_all(compute);
    {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "moe_sort_chunks", {"rows", R});
      for (size_t b = 0; b < rm_off.size(); ++b)
        move_elems(io.out_recv + recv_off[b] * w_out, DType::kF32,
                   at(rank_major.data(), rm_off[b] * w_out, io.out_type), io.out_type, recv_rows[b] * w_out);
    }
    counts(w_out);
    all_to_all_typed(ep, rank_major.data(), rc, rd, io.wire_out_send, sc, sd, io.out_type,
                     fmt::format("moe combine {}", what))
        .wait();
    if (io.wire_out_send != io.out_send) move_elems(io.wire_out_send, io.out_type, io.out_send, DType::kF32,
                                                     static_cast<int64_t>(io.s_out_send.size()));
  }

  /// Rows [b, e) of every block with peer at distance d (chunk c of N) as exchange blocks of the direction's wire
  /// buffers: on the way in this rank sends its slots for rank me+d's experts and receives rank me−d's slots for
  /// its own; on the way out the reverse. d = 0 is a local copy.
  void blocks(int d, int c, int N, bool in, const Io& io, std::vector<P2pSend>& sends,
              std::vector<P2pRecv>& recvs) const {
    const int p = P(), me = ep.rank();
    const int to = (me + d) % p, from = (me - d + p) % p;
    const DType t = in ? io.in_type : io.out_type;
    const int64_t w = in ? io.w_in : io.w_out;
    for (int le = 0; le < Le; ++le) {
      // slots of this rank for expert (to, le) ↔ block (le, from) here
      const size_t e = static_cast<size_t>(to * Le + le), blk = static_cast<size_t>(le * p + from);
      const auto [sb, se] = send_chunk(e, N, c);
      const auto [rb, re] = block_chunk(blk, N, c);
      if (in) {
        if (se > sb) sends.push_back({to, at(io.wire_in_send, (send_off[e] + sb) * w, t), (se - sb) * w, t});
        if (re > rb) recvs.push_back({from, at(io.wire_in_recv, (recv_off[blk] + rb) * w, t), (re - rb) * w, t});
      } else {
        // out: send block (le, from) rows back to `from`, receive my slots for expert (to, le) from `to`
        if (re > rb) sends.push_back({from, at(io.wire_out_recv, (recv_off[blk] + rb) * w, t), (re - rb) * w, t});
        if (se > sb) recvs.push_back({to, at(io.wire_out_send, (send_off[e] + sb) * w, t), (se - sb) * w, t});
      }
    }
  }

  /// Rows [b, e) of this rank's slots for expert `e` in chunk c of N: the same split as the receiving block's
  /// (block_chunk), which has the same row count.
  std::pair<int64_t, int64_t> send_chunk(size_t e, int N, int c) const {
    const int64_t n = send_rows[e];
    if (!cfg.deterministic) return chunk_rows(n, N, c);
    const int64_t tile = cfg.deterministic_tile_rows, tiles = (n + tile - 1) / tile;
    const auto [tb, te] = chunk_rows(tiles, N, c);
    return {std::min(n, tb * tile), std::min(n, te * tile)};
  }

  /// Chunk c of N of the blocks from rank `from` (block (le, from) for every le) between the fp32 rows and the
  /// wire staging of a bf16 direction: `in`, the received rows widened into in_recv; otherwise the computed
  /// out_recv rows rounded into the staging they leave from. Nothing on an fp32 wire.
  void stage_blocks(int from, int c, int N, bool in, const Io& io) const {
    const DType t = in ? io.in_type : io.out_type;
    if (t == DType::kF32) return;
    const int64_t w = in ? io.w_in : io.w_out;
    for (int le = 0; le < Le; ++le) {
      const size_t blk = static_cast<size_t>(le * P() + from);
      const auto [b, e] = block_chunk(blk, N, c);
      const int64_t first = (recv_off[blk] + b) * w, n = (e - b) * w;
      if (in)
        move_elems(at(io.wire_in_recv, first, t), t, io.in_recv + first, DType::kF32, n);
      else
        move_elems(io.out_recv + first, DType::kF32, at(io.wire_out_recv, first, t), t, n);
    }
  }
  /// A bf16 combine: the peers' results, which arrived in the staging, widened into out_send (its own slots were
  /// written by local_copy).
  void widen_combined(const Io& io) const {
    if (io.out_type == DType::kF32) return;
    const int me = ep.rank();
    for (size_t e = 0; e < send_rows.size(); ++e)
      if (static_cast<int>(e) / Le != me)
        move_elems(at(io.wire_out_send, send_off[e] * io.w_out, io.out_type), io.out_type,
                   io.out_send + send_off[e] * io.w_out, DType::kF32, send_rows[e] * io.w_out);
  }

  /// Local part (d = 0): this rank's slots for its own experts, from the direction's wire buffer (so that a bf16
  /// wire rounds the local rows as it does the others; out: after stage_blocks).
  void local_copy(int c, int N, bool in, const Io& io) const {
    const int me = ep.rank(), p = P();
    const DType t = in ? io.in_type : io.out_type;
    const int64_t w = in ? io.w_in : io.w_out;
    for (int le = 0; le < Le; ++le) {
      const size_t e = static_cast<size_t>(me * Le + le), blk = static_cast<size_t>(le * p + me);
      const auto [b, end] = send_chunk(e, N, c);
      if (end <= b) continue;
      if (in)
        move_elems(at(io.wire_in_send, (send_off[e] + b) * w, t), t, io.in_recv + (recv_off[blk] + b) * w,
                   DType::kF32, (end - b) * w);
      else
        move_elems(at(io.wire_out_recv, (recv_off[blk] + b) * w, t), t, io.out_send + (send_off[e] + b) * w,
                   DType::kF32, (end - b) * w);
    }
  }

  /// One exchange each way, landing in the expert-major order (no sort copies).
  void fused(Io& io, const Compute& compute) const {
    std::vector<P2pSend> sends;
    std::vector<P2pRecv> recvs;
    const int p = P(), me = ep.rank();
    for (int d = 1; d < p; ++d) blocks(d, 0, 1, true, io, sends, recvs);
    local_copy(0, 1, true, io);
    if (p > 1) ep.exchange(sends, recvs, fmt::format("moe dispatch {}", what)).wait();
    for (int d = 1; d < p; ++d) stage_blocks((me - d + p) % p, 0, 1, true, io);
    compute_all(compute);
    sends.clear();
    recvs.clear();
    for (int d = 0; d < p; ++d) stage_blocks((me - d + p) % p, 0, 1, false, io);
    for (int d = 1; d < p; ++d) blocks(d, 0, 1, false, io, sends, recvs);
    local_copy(0, 1, false, io);
    if (p > 1) ep.exchange(sends, recvs, fmt::format("moe combine {}", what)).wait();
    widen_combined(io);
  }

  /// The pipeline: steps (d, c) for distance d = 0 (own rank: no communication, computed first) .. P−1 and row
  /// chunk c < N. Every dispatch exchange is posted up front, each paced behind the previous one so that chunks
  /// arrive in order; each step's experts run once its chunk has arrived, and its results leave at once.
  void mc2(Io& io, const Compute& compute) const {
    const int p = P(), N = cfg.mc2_chunks;
    std::vector<Work> in(static_cast<size_t>(p * N)), out(static_cast<size_t>(p * N));
    std::vector<std::vector<P2pSend>> keep_s(static_cast<size_t>(2 * p * N));
    std::vector<std::vector<P2pRecv>> keep_r(static_cast<size_t>(2 * p * N));
    Work prev;
    for (int d = 1; d < p; ++d)
      for (int c = 0; c < N; ++c) {
        const size_t i = static_cast<size_t>(d * N + c);
        blocks(d, c, N, true, io, keep_s[i], keep_r[i]);
        in[i] = ep.exchange(keep_s[i], keep_r[i], fmt::format("moe dispatch {} chunk {}.{}", what, d, c), prev);
        prev = in[i];
      }
    const int me = ep.rank();
    for (int d = 0; d < p; ++d)
      for (int c = 0; c < N; ++c) {
        const size_t i = static_cast<size_t>(d * N + c);
        const int from = (me - d + p) % p;
        if (d == 0) {
          local_copy(c, N, true, io);
        } else {
          in[i].wait();
          stage_blocks(from, c, N, true, io);
        }
        for (int le = 0; le < Le; ++le) {
          const size_t blk = static_cast<size_t>(le * p + from);
          const auto [b, e] = block_chunk(blk, N, c);
          compute_block(compute, le, blk, b, e);
          progress(ep);  // inline engine: move the chunks in flight (and paced sends) along between GEMMs
        }
        stage_blocks(from, c, N, false, io);
        if (d == 0) {
          local_copy(c, N, false, io);
        } else {
          const size_t j = static_cast<size_t>(p * N) + i;
          blocks(d, c, N, false, io, keep_s[j], keep_r[j]);
          out[i] = ep.exchange(keep_s[j], keep_r[j], fmt::format("moe combine {} chunk {}.{}", what, d, c));
        }
      }
    for (int d = 1; d < p; ++d)
      for (int c = 0; c < N; ++c) out[static_cast<size_t>(d * N + c)].wait();
    widen_combined(io);
  }
};

}  // namespace

void MoeLayer::forward(ConstMatrixView x, MatrixView y, int64_t token_offset) {
  const int64_t T = x.rows, H = cfg_.hidden, F = cfg_.ffn_hidden;
  const int E = cfg_.num_experts, K = cfg_.topk, Le = local_experts_, P = ep_.size();
  COC_ASSERT(x.cols == H && y.rows == T && y.cols == H, "MoeLayer::forward: x [{}, {}], y [{}, {}], hidden {}",
             x.rows, x.cols, y.rows, y.cols, H);
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "moe_forward", {"tokens", T});
  auto pl = std::make_shared<Plan>();
  Plan& p = *pl;
  p.tokens = T;
  p.x = Tensor({T, H});
  copy(x, p.x.mat());
  // Route.
  Tensor logits({T, E});
  if (T > 0) {
    GemmComputeScope fp32(DType::kF32);  // the router in fp32 under --bf16 (Megatron's --moe-router-dtype fp32)
    gemm(x, false, router.value.mat(), true, logits.mat());
  }
  p.routing = route_topk(logits.mat(), K, cfg_.fixed_router, token_offset, cfg_.capacity_factor);
  const Routing& r = p.routing;
  // Aux loss over the global batch: counts, probability sums and tokens summed over the token group.
  {
    std::vector<double> sums(static_cast<size_t>(2 * E + 1));
    for (int e = 0; e < E; ++e) {
      sums[static_cast<size_t>(e)] = static_cast<double>(r.counts[static_cast<size_t>(e)]);
      sums[static_cast<size_t>(E + e)] = r.prob_sums[static_cast<size_t>(e)];
    }
    sums.back() = static_cast<double>(T);
    tokens_.all_reduce_values(sums, ReduceOp::kSum, "moe aux loss");
    p.global_counts.resize(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) p.global_counts[static_cast<size_t>(e)] = std::llround(sums[static_cast<size_t>(e)]);
    p.global_tokens = std::llround(sums.back());
    aux_loss_ = aux_loss_value(p.global_counts, std::span<const double>(sums.data() + E, static_cast<size_t>(E)),
                               p.global_tokens, K, cfg_.aux_loss_coeff);
  }
  // Permute: kept slots sorted by expert.
  p.send_rows.assign(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < T * K; ++s)
    if (r.kept[static_cast<size_t>(s)]) ++p.send_rows[static_cast<size_t>(r.expert[static_cast<size_t>(s)])];
  p.send_off.assign(static_cast<size_t>(E), 0);
  for (int e = 1; e < E; ++e)
    p.send_off[static_cast<size_t>(e)] = p.send_off[static_cast<size_t>(e - 1)] + p.send_rows[static_cast<size_t>(e - 1)];
  p.sent = p.send_off.back() + p.send_rows.back();
  p.slot_pos.assign(static_cast<size_t>(T * K), -1);
  Tensor x_perm({p.sent, H});
  {
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "moe_permute", {"rows", p.sent});
    std::vector<int64_t> fill = p.send_off;
    for (int64_t s = 0; s < T * K; ++s) {
      if (!r.kept[static_cast<size_t>(s)]) continue;
      const int64_t row = fill[static_cast<size_t>(r.expert[static_cast<size_t>(s)])]++;
      p.slot_pos[static_cast<size_t>(s)] = row;
      std::copy_n(x.row(s / K), H, x_perm.data() + row * H);
    }
  }
  // Counts: per local expert, one typed exchange of what each rank sends to each EP rank.
  p.recv_rows.assign(static_cast<size_t>(Le * P), 0);
  for (int le = 0; le < Le; ++le) {
    std::vector<int64_t> sc(static_cast<size_t>(P));
    for (int q = 0; q < P; ++q) sc[static_cast<size_t>(q)] = p.send_rows[static_cast<size_t>(q * Le + le)];
    const std::vector<int64_t> rc = ep_.all_to_all_counts(sc, "moe tokens per expert");
    for (int s = 0; s < P; ++s) p.recv_rows[static_cast<size_t>(le * P + s)] = rc[static_cast<size_t>(s)];
  }
  p.recv_off.assign(static_cast<size_t>(Le * P), 0);
  p.expert_rows.assign(static_cast<size_t>(Le), 0);
  int64_t off = 0;
  for (int le = 0; le < Le; ++le)
    for (int s = 0; s < P; ++s) {
      p.recv_off[static_cast<size_t>(le * P + s)] = off;
      off += p.recv_rows[static_cast<size_t>(le * P + s)];
      p.expert_rows[static_cast<size_t>(le)] += p.recv_rows[static_cast<size_t>(le * P + s)];
    }
  p.received = off;
  local_rows_ = p.expert_rows;
  p.x_recv = Tensor({p.received, H});
  p.h = Tensor({p.received, 2 * F});
  p.act = Tensor({p.received, F});
  Tensor out_recv({p.received, H});
  p.y_perm = Tensor({p.sent, H});
  // The experts on rows [begin, begin + n) of local expert le: gate|up GEMM, SwiGLU, down GEMM.
  auto expert_mlp = [&](int le, int64_t begin, int64_t n) {
    const std::array<int64_t, 1> rows{n};
    grouped_gemm_forward(p.x_recv.mat().slice_rows(begin, n), rows,
                         w_gate_up.value.mat().slice_rows(le * 2 * F, 2 * F), p.h.mat().slice_rows(begin, n));
    MatrixView h = p.h.mat().slice_rows(begin, n);
    swiglu_forward(h.slice_cols(0, F), h.slice_cols(F, F), p.act.mat().slice_rows(begin, n));
    grouped_gemm_forward(p.act.mat().slice_rows(begin, n), rows, w_down.value.mat().slice_rows(le * H, H),
                         out_recv.mat().slice_rows(begin, n));
  };
  Transport tr{ep_, cfg_, Le, p.send_rows, p.send_off, p.recv_rows, p.recv_off, p.expert_rows, "forward"};
  // --bf16: the tokens travel in 2 bytes; the experts' GEMMs round them to bf16 anyway, so nothing they compute
  // changes. The expert outputs are rounded to bf16 for the combine (every row, the local ones too): Megatron's
  // bf16 model holds its experts' outputs in bf16, and coc kept them in fp32 before, so the losses move by that
  // rounding (docs/mixed-precision.md).
  tr.in_type = tr.out_type = cfg_.comm_dtype;
  tr.run(x_perm.data(), H, p.x_recv.data(), out_recv.data(), H, p.y_perm.data(), expert_mlp);
  // Unpermute: y[t] = Σ_j w[t, j] · y_perm[slot], slots in j order.
  {
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "moe_unpermute", {"rows", T});
    for (int64_t t = 0; t < T; ++t) {
      float* yr = y.row(t);
      std::fill_n(yr, H, 0.0f);
      for (int j = 0; j < K; ++j) {
        const int64_t pos = p.slot_pos[static_cast<size_t>(t * K + j)];
        if (pos < 0) continue;
        const float w = r.weight[static_cast<size_t>(t * K + j)];
        const float* src = p.y_perm.data() + pos * H;
        for (int64_t i = 0; i < H; ++i) yr[i] += w * src[i];
      }
    }
  }
  plan_ = std::move(pl);
}

void MoeLayer::backward(ConstMatrixView dy, MatrixView dx) {
  COC_ASSERT(plan_, "MoeLayer::backward without a forward");
  Plan& p = *plan_;
  const int64_t T = p.tokens, H = cfg_.hidden, F = cfg_.ffn_hidden;
  const int E = cfg_.num_experts, K = cfg_.topk, Le = local_experts_;
  COC_ASSERT(dy.rows == T && dy.cols == H && dx.rows == T && dx.cols == H,
             "MoeLayer::backward: dy [{}, {}], dx [{}, {}], {} tokens of {}", dy.rows, dy.cols, dx.rows, dx.cols, T,
             H);
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "moe_backward", {"tokens", T});
  const Routing& r = p.routing;
  // Unpermute backward: dy_perm[slot] = w · dy[t]; dweight[t, j] = dy[t] · y_perm[slot].
  Tensor dy_perm({p.sent, H});
  std::vector<float> dweight(static_cast<size_t>(T * K), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int64_t pos = p.slot_pos[static_cast<size_t>(t * K + j)];
      if (pos < 0) continue;
      const float w = r.weight[static_cast<size_t>(t * K + j)];
      const float* g = dy.row(t);
      const float* yv = p.y_perm.data() + pos * H;
      float* d = dy_perm.data() + pos * H;
      float dot = 0;
      for (int64_t i = 0; i < H; ++i) {
        d[i] = w * g[i];
        dot += g[i] * yv[i];
      }
      dweight[static_cast<size_t>(t * K + j)] = dot;
    }
  // The experts backward, per received rows; weight gradients after the transport, one GEMM per expert.
  Tensor dout_recv({p.received, H}), dx_recv({p.received, H}), dh({p.received, 2 * F});
  auto expert_mlp_backward = [&](int le, int64_t begin, int64_t n) {
    const std::array<int64_t, 1> rows{n};
    MatrixView dh_rows = dh.mat().slice_rows(begin, n);
    // d(act) into the up half's place first, then SwiGLU backward writes both halves (it reads dout first).
    grouped_gemm_backward_data(dout_recv.mat().slice_rows(begin, n), rows,
                               w_down.value.mat().slice_rows(le * H, H), dh_rows.slice_cols(F, F));
    MatrixView h = p.h.mat().slice_rows(begin, n);
    swiglu_backward(h.slice_cols(0, F), h.slice_cols(F, F), dh_rows.slice_cols(F, F), dh_rows.slice_cols(0, F),
                    dh_rows.slice_cols(F, F));
    grouped_gemm_backward_data(dh_rows, rows, w_gate_up.value.mat().slice_rows(le * 2 * F, 2 * F),
                               dx_recv.mat().slice_rows(begin, n));
  };
  Tensor dx_perm({p.sent, H});
  Transport tr{ep_, cfg_, Le, p.send_rows, p.send_off, p.recv_rows, p.recv_off, p.expert_rows, "backward"};
  // --bf16: both directions travel in 2 bytes. The output gradients go out unchanged in value (only the experts'
  // GEMMs read them, and those round them to bf16 anyway). The input gradients come back rounded to bf16, as every
  // coc message under --bf16 is (the TP reduce-scatters round their partials alike) and as Megatron's bf16 model
  // holds them; the combine sums the K rounded rows of a token in fp32.
  tr.in_type = tr.out_type = cfg_.comm_dtype;
  tr.run(dy_perm.data(), H, dout_recv.data(), dx_recv.data(), H, dx_perm.data(), expert_mlp_backward);
  grouped_gemm_backward_weight(p.act.mat(), dout_recv.mat(), p.expert_rows, w_down.grad.mat());
  grouped_gemm_backward_weight(p.x_recv.mat(), dh.mat(), p.expert_rows, w_gate_up.grad.mat());
  // Permute backward: dx[t] = Σ_j dx_perm[slot], then the router's part.
  for (int64_t t = 0; t < T; ++t) {
    float* d = dx.row(t);
    std::fill_n(d, H, 0.0f);
    for (int j = 0; j < K; ++j) {
      const int64_t pos = p.slot_pos[static_cast<size_t>(t * K + j)];
      if (pos < 0) continue;
      const float* src = dx_perm.data() + pos * H;
      for (int64_t i = 0; i < H; ++i) d[i] += src[i];
    }
  }
  Tensor daux({T, E}), dlogits({T, E});
  aux_loss_backward(p.global_counts, p.global_tokens, K, cfg_.aux_loss_coeff, cfg_.aux_grad_scale, daux.mat());
  route_topk_backward(r, dweight, std::span<const float>(daux.data(), static_cast<size_t>(T * E)), dlogits.mat());
  if (T > 0) {
    GemmComputeScope fp32(DType::kF32);
    gemm(dlogits.mat(), true, p.x.mat(), false, router.grad.mat(), 1.0f, 1.0f);
    gemm(dlogits.mat(), false, router.value.mat(), false, dx, 1.0f, 1.0f);
  }
}

}  // namespace coc
