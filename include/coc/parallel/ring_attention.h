// Ring attention over the context-parallel group (MindSpeed's megatron_cp_algo; Liu et al. 2023, "Ring Attention
// with Blockwise Transformers"; zig-zag load balance as in Megatron-core/TransformerEngine's context parallelism).
// Semantics: docs/semantics.md §5.
//
// Layout (zig-zag). A sequence of S positions is cut into 2·CP chunks of c = S / (2·CP); cp rank r holds chunks r
// and 2·CP−1−r, so every rank has the same causal work. A rank's local tensors are [2c·B, heads·D] with local
// position t in [0, 2c) at row t·B + b (transformer_ops.h's layout): t < c is global position r·c + t, t >= c is
// (2·CP−1−r)·c + (t − c).
//
// Forward: CP steps. At step i the rank holds the K and V of cp rank (r − i) mod CP; it posts the exchange that
// passes that block to r + 1 and receives the next one from r − 1 (double buffer), then computes its queries
// against the block in hand (block_attention.h, up to four chunk pairs, fully masked pairs skipped), merging each
// partial into the output by its log-sum-exp in fp32, and only then waits. Backward: the K, V blocks circulate the
// same way, and dK, dV travel one step behind with their block: each step's block gradients go into a fresh
// buffer while the previous step's partial sum (sent by r − 1) is in flight, then the two add up and move on; after
// CP steps each block's dK, dV are back at their owner. A buffer being sent is never written, nor a buffer being
// received read, before its Work completes. Results are bitwise independent of timing and of the overlap switch
// (the same sums in the same order).
//
// Double ring (--cp-window-size w, MindSpeed's double_ring): the CP ranks form CP / w windows of w consecutive cp
// ranks. Blocks go around the window (inner ring, one place per step) for w steps; a round's first block also
// starts over the outer ring to the same place in the next window, and that transfer overlaps the round's w inner
// steps. dK, dV follow their block: inside the window to the next place, at the end of a round to the rank that
// received the block over the outer ring (the next window, one place on). w = 1 is the plain ring; w = CP has no
// outer ring. The blocks' order differs with w, so results agree to rounding, not bitwise.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "coc/comm/communicator.h"
#include "coc/core/tensor.h"
#include "coc/kernels/block_attention.h"

namespace coc {

/// The switches of one ring (MindSpeed's flags).
struct RingAttentionOptions {
  AttnMask mask = AttnMask::kCausal;  ///< --attention-mask-type causal|general
  int window_size = 1;                ///< --cp-window-size (double ring; 1: the plain ring); divides CP
  std::string tag = "ring_attention";
  /// Wait for each transfer as soon as it is posted: the non-overlapped baseline of `coc bench ring-attention`
  /// (the same sums in the same order, so bitwise the same results).
  bool serial = false;
  /// Called on this rank at each step (0 … CP−1) of the forward and the backward, after the step's transfer is
  /// posted and before its blocks are computed. Tests delay random ranks through it; null in production.
  std::function<void(int step)> step_hook;
  /// Backward with CP > 1: work the caller runs while the last dK, dV hop is in flight (that hop returns each
  /// block's gradient to its owner after the last block, so no block attention is left to hide it). The decoder
  /// passes its delayed weight gradients (WgradQueue::run, parallel/context.h). Runs once, on the calling thread,
  /// with the progress engine polling (progress_during, comm/progress.h); it must not touch the hop's buffers or the
  /// outputs. Null: nothing. (coc's own; MindSpeed's ring waits for that hop.)
  std::function<void()> during_last_hop;
  /// The element type the K and V blocks travel in: fp32, or bf16 (2-byte messages; issue 35) under --bf16, whose
  /// K and V are bf16 values already (the layer rounds them after RoPE), so the results are bitwise those of fp32
  /// blocks. Each rank widens the block it holds to fp32 for the block attention. The dK, dV partial sums that
  /// travel in the backward stay fp32 (they accumulate across steps, as Megatron's fp32 gradient accumulation
  /// does). Other types are refused (kInternal).
  DType kv_dtype = DType::kF32;
};

/// The communicators of one ring: `cp` (the mesh's cp group) and, for --use-cp-send-recv-overlap, a second one
/// (`overlap`, a duplicate of cp made by make_cp_ring) so that a rank's send and its receive go on different
/// communicators (full duplex, MindSpeed's cp_group_for_send_recv_overlap). A message from cp rank s travels on
/// `cp` when s is even and on `overlap` when s is odd: each rank sends on one and receives on the other (with odd
/// CP, rank 0 receives from the even rank CP−1 on the same one it sends on). Every rank calls both communicators in
/// the same order at every step (empty exchanges where it has nothing on one), which keeps their sequence numbers,
/// hence the MPI tags, in step.
struct CpRing {
  Communicator* cp = nullptr;
  Communicator* overlap = nullptr;  ///< null: send and receive on cp
  int size() const { return cp->size(); }
  int rank() const { return cp->rank(); }
};

/// A CpRing over `cp`; with `send_recv_overlap`, also a duplicate of cp (collective over cp), owned by `owned`.
CpRing make_cp_ring(Communicator& cp, bool send_recv_overlap, std::unique_ptr<Communicator>& owned);

/// Throws a uniform kInvalidArgument error when `seq` does not divide by 2·cp (naming the nearest valid lengths),
/// or when window_size < 1 or does not divide cp.
void check_ring_attention_sizes(int64_t seq, int cp, int window_size);

/// The global position of local position t (in [0, 2c)) of cp rank r (zig-zag, see above).
int64_t zigzag_position(int64_t t, int cp_rank, int cp_size, int64_t seq);

/// Copies this rank's zig-zag rows of `full` [S·B, C] (global row order) into `local` [2c·B, C], or back
/// (zigzag_scatter: local → its rows of full, the others untouched).
void zigzag_gather(ConstMatrixView full, int64_t batch, int cp_rank, int cp_size, MatrixView local);
void zigzag_scatter(ConstMatrixView local, int64_t batch, int cp_rank, int cp_size, MatrixView full);

/// Forward. q, k, v: this rank's [2c·B, heads·D] (may be strided views). out [2c·B, heads·D] (overwritten), lse
/// [2c·B, heads] fp32 (overwritten; the log-sum-exp of every query row over the whole sequence, kept for the
/// backward). Collective over the ring (every cp rank with the same shapes and options). Throws
/// check_ring_attention_sizes' errors (S = 2c·CP) and kTimeout/kComm from the exchanges.
void ring_attention_forward(const CpRing& ring, ConstMatrixView q, ConstMatrixView k, ConstMatrixView v,
                            int64_t batch, int64_t heads, int64_t head_dim, const RingAttentionOptions& opts,
                            MatrixView out, float* lse);

/// Backward: from dout and the forward's out and lse, dq, dk, dv [2c·B, heads·D] (overwritten) of this rank's
/// positions. Collective over the ring, as the forward.
void ring_attention_backward(const CpRing& ring, ConstMatrixView q, ConstMatrixView k, ConstMatrixView v,
                             ConstMatrixView out, const float* lse, ConstMatrixView dout, int64_t batch, int64_t heads,
                             int64_t head_dim, const RingAttentionOptions& opts, MatrixView dq, MatrixView dk,
                             MatrixView dv);

}  // namespace coc
