// Pipeline parallelism: the 1F1B schedule over the stages of a Decoder (Megatron-core's
// forward_backward_pipelining_without_interleaving, megatron/core/pipeline_parallel/schedules.py; PipeDream-Flush,
// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), and its
// interleaved variant over V model chunks per rank (forward_backward_pipelining_with_interleaving; §2.2 of the same
// paper).
//
// Terms.
//   P, stage s    --pipeline-model-parallel-size, and this rank's place in it (its pp rank). Stage s holds the
//                 contiguous layers pipeline_stage_layers gives it (model/decoder.h); stage 0 the embedding, stage
//                 P - 1 the final norm, output layer and loss.
//   M, i          the micro-batches of one iteration per data-parallel rank (global batch / (micro-batch × dp)),
//                 and one of them.
//   F(i), B(i)    the forward and the backward of micro-batch i on this stage.
//   A(i)          stage s's output for micro-batch i, [ml, H] (ml: the sequence shard under --sequence-parallel),
//                 sent to stage s + 1. Under --bf16 (or --fp16) without --fp32-residual-connection the residual
//                 stream holds 16-bit values already, so A(i) travels as 2-byte elements and no bit changes.
//   G(i)          dL/d(input of stage s + 1) for micro-batch i, [ml, H] fp32, sent back to stage s.
//   link          a two-rank communicator between neighbouring stages that carries one kind of message (A or G)
//                 in micro-batch order. A communicator's point-to-point tags come from its op count, which both
//                 ends must agree on; on a link each end posts exactly the messages of that kind in the same order,
//                 so they do, whatever the order of the stage's other work (make_pipeline_links).
//   slot          one micro-batch's activations kept from F(i) to B(i) (Decoder::set_pipeline_slots), per model
//                 chunk. Under 1F1B stage s has at most min(P - s, M) micro-batches in flight; micro-batch i uses
//                 slot i mod that (pipeline_slots counts it for any order).
//
// Steps of one iteration on stage s (one_f_one_b_order):
//   1. warm-up:      W = min(P - s - 1, M) forwards F(0) .. F(W - 1);
//   2. steady state: for j = 0 .. M - W - 1: F(W + j), then B(j);
//   3. cool-down:    B(M - W) .. B(M - 1).
// Before F(i) a stage other than the first receives A(i); after it, a stage other than the last sends A(i).
// Before B(i) a stage other than the last receives G(i); after it, a stage other than the first sends G(i).
// With --overlap-p2p-communication the receive of micro-batch i + 1 is posted before F(i) (B(i)) computes, so the
// transfer lands while it runs; without, each receive is posted when it is needed. Sends are waited for only when
// their buffer comes round again (two buffers per direction) and at the end of the iteration.
// Backwards run in micro-batch order, as at P = 1, so every gradient accumulates in the same order: with
// --deterministic the losses are bitwise those of P = 1 at the same tp and dp.
//
// Interleaved 1F1B (V = --num-virtual-stages-per-pipeline-rank > 1; interleaved_order). Rank s holds model chunks
// c = 0 .. V - 1, chunk c being virtual stage v = c·P + s of P·V; F(c, i) and B(c, i) are chunk c's passes of
// micro-batch i. A(c, i) goes to the next virtual stage: rank s + 1's chunk c, or from rank P - 1 to rank 0's chunk
// c + 1 over the wrap link; G(c, i) goes the other way. Each rank runs V·M forwards and V·M backwards; the k-th
// forward is of chunk (k mod P·V) / P and micro-batch (k / P·V)·P + k mod P (micro-batches go in groups of P
// through every chunk), the k-th backward likewise with chunk V - 1 - (k mod P·V) / P. Warm-up
// W = min(2·(P - s - 1) + (V - 1)·P, V·M) forwards, then F(W + j), B(j) pairs, then the remaining backwards.
// Megatron requires M % P == 0 (checked here) and runs every forward first when M == P; coc keeps the formula then
// (a subset of the same order), so that on rank P - 1 every B(V - 1, i) follows F(V - 1, i) at once, as the head
// (which keeps one micro-batch) needs. Each chunk's backwards still run in micro-batch order, and every parameter
// lives in one chunk, so the gradients accumulate as at P = 1: bitwise under --deterministic. Messages on a link
// are numbered in the order both ends post them (the k order is the same function on every rank), and a channel's
// message n uses buffer n mod 2. Each chunk keeps its own activation slots: as many as it has micro-batches in
// flight (pipeline_slots). Ideal bubble: (P - 1)/(V·M + P - 1) of the iteration (Narayanan et al. 2021, §2.2.1:
// the bubble (P - 1)/M of 1F1B shrinks by V, in units of the V-times-shorter chunk passes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/core/dtype.h"
#include "coc/core/tensor.h"

namespace coc {

class Decoder;

/// One step of a stage's schedule: the forward or the backward of one micro-batch through one model chunk (0
/// without interleaving).
struct PipeStep {
  enum Kind { kForward, kBackward } kind;
  int micro_batch;
  int chunk = 0;
  bool operator==(const PipeStep&) const = default;
};

/// Stage `stage`'s steps under 1F1B with `stages` stages and `micro_batches` micro-batches (the steps above): M
/// forwards and M backwards, each micro-batch's forward before its backward. Throws kInvalidArgument for stages < 1,
/// a stage outside [0, stages) or micro_batches < 1.
std::vector<PipeStep> one_f_one_b_order(int stages, int stage, int micro_batches);

/// Stage `stage`'s steps under interleaved 1F1B with `stages` stages (P), `chunks` model chunks per stage (V) and
/// `micro_batches` (M): the order above (Megatron-core's forward_backward_pipelining_with_interleaving with
/// microbatch_group_size_per_vp_stage = P). chunks == 1 gives one_f_one_b_order. Throws uniform kInvalidArgument,
/// one line naming the flags and the fix, when M % P != 0 (M < P included); and for stages < 2 with chunks > 1,
/// chunks < 1, a stage outside [0, stages) or M < 1.
std::vector<PipeStep> interleaved_order(int stages, int stage, int micro_batches, int chunks);

/// Forwards only (evaluation, sampling): for each micro-batch i, F(0, i) .. F(V - 1, i). Any M >= 1 (kInvalidArgument
/// otherwise).
std::vector<PipeStep> forward_only_order(int micro_batches, int chunks);

/// The activation slots each chunk needs for `steps` (PipeStep::chunk < chunks): the most micro-batches in flight
/// (forward run, backward not yet) at once. Since each chunk's forwards and backwards run in micro-batch order,
/// micro-batch i can use slot i mod that count.
std::vector<int> pipeline_slots(const std::vector<PipeStep>& steps, int chunks);

/// The links of one stage with its neighbours (null where it has none): A(i) arrive on fwd_in and leave on
/// fwd_out, G(i) arrive on bwd_in and leave on bwd_out. On each link the lower stage is rank 0. With `wrap`, stage
/// P - 1 (rank 0 of the link) and stage 0 are neighbours too, over their own links: stage 0's fwd_in and bwd_out,
/// stage P - 1's fwd_out and bwd_in.
struct PipelineLinks {
  std::unique_ptr<Communicator> fwd_in, bwd_out;  ///< with stage s - 1 (stage P - 1 for stage 0 under wrap)
  std::unique_ptr<Communicator> fwd_out, bwd_in;  ///< with stage s + 1 (stage 0 for stage P - 1 under wrap)
};

/// Splits `pp` into the links of every boundary (four MPI_Comm_splits: A and G links of the even boundaries
/// (0,1), (2,3), ... and of the odd ones (1,2), (3,4), ...; two more for the wrap from P - 1 to 0 with `wrap`,
/// which the interleaved schedule needs). Collective over `pp`. The links carry no fingerprint check
/// (--debug-collectives): a fingerprint is a blocking all-gather, which would make every send wait for its receive
/// to be posted, and the link's order is fixed by construction (see "link" above).
PipelineLinks make_pipeline_links(const Communicator& pp, bool wrap = false);

/// What one iteration needs from the caller.
struct PipelineCallbacks {
  /// Fills micro-batch i's token ids and targets (m = S·B each, the rows this rank's layers read). Called on the
  /// first and last stages only, before F(i).
  std::function<void(int i, std::vector<int32_t>& tokens, std::vector<int32_t>& targets)> load;
  /// Called before B(i) (the data-parallel gradient sync learns whether this backward is the iteration's last).
  std::function<void(int i)> before_backward;
  /// Called after F(i) of model chunk c, in training and evaluation, if set (the trainer reads that chunk's MoE aux
  /// loss there).
  std::function<void(int i, int c)> after_forward;
};

class PipelineSchedule {
 public:
  /// `model` must be a stage of groups.pp = `pp` (Decoder::num_stages() == pp.size() > 1) and outlive the schedule;
  /// with model.num_chunks() > 1 the schedule is interleaved. `activation_type`: the element type A(i) travels in:
  /// kF32, or kBF16 / kF16 where the residual stream holds such values. `overlap_p2p`: --overlap-p2p-communication.
  /// Collective over `pp` (make_pipeline_links).
  PipelineSchedule(Decoder& model, Communicator& pp, DType activation_type, bool overlap_p2p);
  ~PipelineSchedule();

  /// One iteration's forwards and backwards of `micro_batches` micro-batches of `batch` sequences, gradients
  /// accumulated with `loss_scale` (Decoder::backward_stage). Returns, on the last stage, the sum of the
  /// micro-batches' losses (nats), added in micro-batch order; 0 elsewhere. Collective over the links (and the
  /// groups of the layers' ops). Errors: the collectives' kTimeout/kComm; interleaved_order's kInvalidArgument.
  double train_step(int micro_batches, int64_t batch, float loss_scale, const PipelineCallbacks& cb);
  /// Forwards only (evaluation): forward_only_order on every stage, activations in slot 0. Returns the sum of the
  /// losses on the last stage, 0 elsewhere. Collective like train_step.
  double forward_only(int micro_batches, int64_t batch, const PipelineCallbacks& cb);
  /// Sampling: Decoder::next_token_logits through the stages (each runs sample_stage; the context [len, H] travels
  /// as A does), the logits [V] broadcast from the last stage, so every rank returns the same bits. Collective over
  /// pp and the links.
  std::vector<float> next_token_logits(const int32_t* tokens, int64_t len);
  /// From the next iteration on, A(i) travels as `activation_type` and --overlap-p2p-communication is
  /// `overlap_p2p` (`coc bench train --baseline` switches them with --bf16 and --overlap-p2p-communication). Only
  /// between iterations, evaluations and samples: each of those ends with every message of every link delivered
  /// (receives are posted only for the phase's own messages, sends are waited for), so nothing in flight crosses
  /// the switch (kInternal otherwise). Every rank of pp must switch at the same boundary with the same values, or
  /// the ends of a link would disagree on the element type. Not collective.
  void set_switches(DType activation_type, bool overlap_p2p);
  /// Seconds this rank waited for stage transfers (receives, and sends whose buffer came round) since the last call:
  /// the pipeline's exposed communication, bubble included (a stage waiting for its neighbour waits here).
  double take_wait_seconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

 private:
  struct Channel;
  void forward_step(const PipeStep& step, int64_t batch, int slot, const PipelineCallbacks& cb, double& loss);
  void backward_step(const PipeStep& step, int slot, float loss_scale, const PipelineCallbacks& cb);
  /// Sizes the buffers for messages of `rows` × H and numbers this phase's messages of `steps` from 0 (each
  /// channel learns how many it receives, so that --overlap-p2p-communication posts no receive beyond them).
  void begin_phase(const std::vector<PipeStep>& steps, int64_t rows);
  void finish_sends();

  Decoder& model_;
  Communicator& pp_;
  PipelineLinks links_;
  DType activation_type_;
  bool overlap_;
  std::unique_ptr<Channel> a_in_, a_out_, g_in_, g_out_;  ///< null where the stage has no such neighbour
  std::vector<std::vector<std::vector<int32_t>>> tokens_, targets_;  ///< [chunk][slot]
  double wait_s_ = 0;
  Tensor input_, dy_, out_, dx_;                           ///< fp32 [ml, H]: A(i) and G(i) as the decoder reads them
};

}  // namespace coc
