// The 1F1B pipeline schedule (include/coc/model/pipeline_schedule.h has its terms and steps).
#include "coc/model/pipeline_schedule.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/model/decoder.h"
#include "coc/runtime/tracer.h"

namespace coc {

std::vector<PipeStep> one_f_one_b_order(int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw_invalid("one_f_one_b_order: stage {} of {} stages with {} micro-batches (need 0 <= stage < stages and at "
                  "least one micro-batch)",
                  stage, stages, micro_batches);
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipeStep> steps;
  for (int i = 0; i < warmup; ++i) steps.push_back({PipeStep::kForward, i});
  for (int j = 0; j < micro_batches - warmup; ++j) {
    steps.push_back({PipeStep::kForward, warmup + j});
    steps.push_back({PipeStep::kBackward, j});
  }
  for (int i = micro_batches - warmup; i < micro_batches; ++i) steps.push_back({PipeStep::kBackward, i});
  return steps;
}

PipelineLinks make_pipeline_links(const Communicator& pp) {
  const int s = pp.rank(), P = pp.size();
  CommOptions opts = pp.options();
  opts.check_fingerprints = false;  // pipeline_schedule.h says why
  // Even boundaries pair (0,1), (2,3), ...; odd ones (1,2), (3,4), ... (stage 0, and stage P - 1 for even P, alone).
  const int even = s / 2, odd = (s + 1) / 2;
  std::unique_ptr<Communicator> even_a = pp.split(even, s, "pp-link-act", &opts);
  std::unique_ptr<Communicator> even_g = pp.split(even, s, "pp-link-grad", &opts);
  std::unique_ptr<Communicator> odd_a = pp.split(odd, s, "pp-link-act", &opts);
  std::unique_ptr<Communicator> odd_g = pp.split(odd, s, "pp-link-grad", &opts);
  PipelineLinks l;
  // The boundary with stage s + 1 is boundary s; with stage s - 1, boundary s - 1.
  if (s + 1 < P) {
    l.fwd_out = std::move(s % 2 == 0 ? even_a : odd_a);
    l.bwd_in = std::move(s % 2 == 0 ? even_g : odd_g);
  }
  if (s > 0) {
    l.fwd_in = std::move(s % 2 == 1 ? even_a : odd_a);
    l.bwd_out = std::move(s % 2 == 1 ? even_g : odd_g);
  }
  return l;
}

/// One direction of one link: two buffers, each with the micro-batch whose message it holds (or -1) and the
/// message's Work. A receive of micro-batch i lands in buffer i mod 2; a send of i leaves from it.
struct PipelineSchedule::Channel {
  Communicator* link = nullptr;
  int peer = 0;
  DType type = DType::kF32;
  std::string tag;
  int64_t count = 0;
  std::array<std::vector<float>, 2> buf;  ///< fp32 elements, or 2-byte ones in the first half
  std::array<Work, 2> work;
  std::array<int, 2> pending{-1, -1};
  double* wait_s = nullptr;  ///< PipelineSchedule::wait_s_: seconds spent waiting for receives and sends

  void wait(size_t k) {
    const auto t0 = std::chrono::steady_clock::now();
    work[k].wait();
    *wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void size(int64_t n) {
    count = n;
    for (auto& b : buf) b.resize(static_cast<size_t>(n));
  }
  /// Posts micro-batch i's receive unless it is posted. Receives must be posted in micro-batch order: the link's
  /// tags follow the order of its ops.
  void post_recv(int i) {
    const size_t k = static_cast<size_t>(i % 2);
    if (pending[k] == i) return;
    COC_ASSERT(pending[k] == -1, "{}: receive of micro-batch {} while {} is pending", tag, i, pending[k]);
    const P2pRecv r{peer, buf[k].data(), count, type};
    work[k] = link->exchange({}, std::span<const P2pRecv>(&r, 1), tag);
    pending[k] = i;
  }
  /// Waits for micro-batch i's message (posting its receive first if it is not posted) and writes it to `into`.
  void recv(int i, MatrixView into) {
    const size_t k = static_cast<size_t>(i % 2);
    post_recv(i);
    {
      COC_TRACE_SCOPE(trace::Cat::kComm, trace::Level::kLevel0, "pp_recv_wait", {"micro_batch", i});
      wait(k);
    }
    pending[k] = -1;
    if (type == DType::kF32)
      std::memcpy(into.data, buf[k].data(), static_cast<size_t>(count) * sizeof(float));
    else
      half_to_fp32(type, buf[k].data(), into.data, count);
  }
  /// Sends `from` as micro-batch i's message, after the send that last used its buffer has left.
  void send(int i, ConstMatrixView from) {
    const size_t k = static_cast<size_t>(i % 2);
    if (pending[k] != -1) wait(k);
    if (type == DType::kF32)
      std::memcpy(buf[k].data(), from.data, static_cast<size_t>(count) * sizeof(float));
    else
      fp32_to_half(type, from.data, buf[k].data(), count);
    const P2pSend s{peer, buf[k].data(), count, type};
    work[k] = link->exchange(std::span<const P2pSend>(&s, 1), {}, tag);
    pending[k] = i;
  }
  void wait_all() {
    for (size_t k = 0; k < 2; ++k)
      if (pending[k] != -1) {
        wait(k);
        pending[k] = -1;
      }
  }
};

PipelineSchedule::PipelineSchedule(Decoder& model, Communicator& pp, DType activation_type, bool overlap_p2p)
    : model_(model),
      pp_(pp),
      links_(make_pipeline_links(pp)),
      activation_type_(activation_type),
      overlap_(overlap_p2p) {
  COC_ASSERT(model.num_stages() == pp.size() && model.stage() == pp.rank(),
             "the decoder is stage {} of {}, the pp group rank {} of {}", model.stage(), model.num_stages(),
             pp.rank(), pp.size());
  auto channel = [this](Communicator* link, int peer, DType type, const char* tag) {
    if (!link) return std::unique_ptr<Channel>();
    auto c = std::make_unique<Channel>();
    c->link = link;
    c->peer = peer;
    c->type = type;
    c->tag = tag;
    c->wait_s = &wait_s_;
    return c;
  };
  a_in_ = channel(links_.fwd_in.get(), 0, activation_type, "pp recv activation");
  g_out_ = channel(links_.bwd_out.get(), 0, DType::kF32, "pp send gradient");
  a_out_ = channel(links_.fwd_out.get(), 1, activation_type, "pp send activation");
  g_in_ = channel(links_.bwd_in.get(), 1, DType::kF32, "pp recv gradient");
}

PipelineSchedule::~PipelineSchedule() = default;

void PipelineSchedule::forward_step(int i, int64_t batch, int slot, const PipelineCallbacks& cb, double& loss) {
  std::vector<int32_t>& tokens = tokens_[static_cast<size_t>(slot)];
  std::vector<int32_t>& targets = targets_[static_cast<size_t>(slot)];
  if (model_.is_first_stage() || model_.is_last_stage()) {
    COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "data", {"micro_batch", i});
    cb.load(i, tokens, targets);
  }
  if (a_in_) {
    a_in_->post_recv(i);
    if (overlap_ && i + 1 < micro_batches_) a_in_->post_recv(i + 1);  // lands while F(i) computes
    a_in_->recv(i, input_.mat());
  }
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "forward", {"micro_batch", i});
  loss += model_.forward_stage(slot, tokens.data(), targets.data(), input_.mat(), batch, out_.mat());
  if (a_out_) a_out_->send(i, out_.mat());
}

void PipelineSchedule::backward_step(int i, int slot, float loss_scale, const PipelineCallbacks& cb) {
  if (g_in_) {
    g_in_->post_recv(i);
    if (overlap_ && i + 1 < micro_batches_) g_in_->post_recv(i + 1);  // lands while B(i) computes
    g_in_->recv(i, dy_.mat());
  }
  if (cb.before_backward) cb.before_backward(i);
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "backward", {"micro_batch", i});
  model_.backward_stage(slot, dy_.mat(), loss_scale, dx_.mat());
  if (g_out_) g_out_->send(i, dx_.mat());
}

void PipelineSchedule::finish_sends() {
  for (Channel* c : {a_out_.get(), g_out_.get()})
    if (c) c->wait_all();
}

double PipelineSchedule::train_step(int micro_batches, int64_t batch, float loss_scale,
                                    const PipelineCallbacks& cb) {
  const int P = model_.num_stages(), s = model_.stage();
  micro_batches_ = micro_batches;
  const int slots = std::min(P - s, micro_batches);
  model_.set_pipeline_slots(slots);
  tokens_.resize(static_cast<size_t>(slots));
  targets_.resize(static_cast<size_t>(slots));
  const int64_t ml = model_.activation_rows(batch), H = model_.config().hidden_size;
  for (Tensor* t : {&input_, &dy_, &out_, &dx_}) t->resize({ml, H});
  for (Channel* c : {a_in_.get(), a_out_.get(), g_in_.get(), g_out_.get()})
    if (c) c->size(ml * H);
  double loss = 0;
  for (const PipeStep& step : one_f_one_b_order(P, s, micro_batches)) {
    const int slot = step.micro_batch % slots;
    if (step.kind == PipeStep::kForward)
      forward_step(step.micro_batch, batch, slot, cb, loss);
    else
      backward_step(step.micro_batch, slot, loss_scale, cb);
  }
  finish_sends();
  return loss;
}

double PipelineSchedule::forward_only(int micro_batches, int64_t batch, const PipelineCallbacks& cb) {
  micro_batches_ = micro_batches;
  // Slot 0 serves every forward: each micro-batch's activations are dropped by the next one.
  tokens_.resize(std::max<size_t>(tokens_.size(), 1));
  targets_.resize(std::max<size_t>(targets_.size(), 1));
  const int64_t ml = model_.activation_rows(batch), H = model_.config().hidden_size;
  for (Tensor* t : {&input_, &out_}) t->resize({ml, H});
  for (Channel* c : {a_in_.get(), a_out_.get()})
    if (c) c->size(ml * H);
  double loss = 0;
  for (int i = 0; i < micro_batches; ++i) forward_step(i, batch, 0, cb, loss);
  finish_sends();
  return loss;
}

std::vector<float> PipelineSchedule::next_token_logits(const int32_t* tokens, int64_t len) {
  const int64_t H = model_.config().hidden_size;
  for (Tensor* t : {&input_, &out_}) t->resize({len, H});
  for (Channel* c : {a_in_.get(), a_out_.get()})
    if (c) c->size(len * H);
  if (a_in_) a_in_->recv(0, input_.mat());
  std::vector<float> logits = model_.sample_stage(tokens, len, input_.mat(), out_.mat());
  if (a_out_) a_out_->send(0, out_.mat());
  finish_sends();
  logits.resize(static_cast<size_t>(model_.config().vocab_size));
  pp_.broadcast(logits.data(), static_cast<int64_t>(logits.size()), pp_.size() - 1, "sample logits (pipeline)").wait();
  return logits;
}

}  // namespace coc
