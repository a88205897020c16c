// The 1F1B pipeline schedules, plain and interleaved (include/coc/model/pipeline_schedule.h has their terms and
// steps).
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

std::vector<PipeStep> interleaved_order(int stages, int stage, int micro_batches, int chunks) {
  if (chunks == 1) return one_f_one_b_order(stages, stage, micro_batches);
  if (stages < 2 || chunks < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw_invalid("interleaved_order: stage {} of {} stages, {} chunks, {} micro-batches (need 2 or more stages, "
                  "0 <= stage < stages, at least one chunk and one micro-batch)",
                  stage, stages, chunks, micro_batches);
  if (micro_batches % stages != 0)
    throw_invalid("the interleaved schedule (--num-virtual-stages-per-pipeline-rank {}) needs the micro-batches per "
                  "iteration, {} = --global-batch-size / (--micro-batch-size × dp), to be a multiple of "
                  "--pipeline-model-parallel-size {} (Megatron's rule); change the global batch size or drop the "
                  "virtual stages",
                  chunks, micro_batches, stages);
  const int group = stages * chunks, total = micro_batches * chunks;
  auto step = [&](PipeStep::Kind kind, int k) {
    const int in_group = k % group, c = in_group / stages;
    return PipeStep{kind, k / group * stages + in_group % stages, kind == PipeStep::kForward ? c : chunks - 1 - c};
  };
  const int warmup = std::min(2 * (stages - stage - 1) + (chunks - 1) * stages, total);
  std::vector<PipeStep> steps;
  for (int k = 0; k < warmup; ++k) steps.push_back(step(PipeStep::kForward, k));
  for (int k = 0; k < total - warmup; ++k) {
    steps.push_back(step(PipeStep::kForward, warmup + k));
    steps.push_back(step(PipeStep::kBackward, k));
  }
  for (int k = total - warmup; k < total; ++k) steps.push_back(step(PipeStep::kBackward, k));
  return steps;
}

std::vector<PipeStep> forward_only_order(int micro_batches, int chunks) {
  if (micro_batches < 1 || chunks < 1)
    throw_invalid("forward_only_order: {} micro-batches, {} chunks (need at least one of each)", micro_batches,
                  chunks);
  std::vector<PipeStep> steps;
  for (int i = 0; i < micro_batches; ++i)
    for (int c = 0; c < chunks; ++c) steps.push_back({PipeStep::kForward, i, c});
  return steps;
}

std::vector<int> pipeline_slots(const std::vector<PipeStep>& steps, int chunks) {
  std::vector<int> in_flight(static_cast<size_t>(chunks), 0), most(static_cast<size_t>(chunks), 1);
  for (const PipeStep& p : steps) {
    int& n = in_flight[static_cast<size_t>(p.chunk)];
    n += p.kind == PipeStep::kForward ? 1 : -1;
    most[static_cast<size_t>(p.chunk)] = std::max(most[static_cast<size_t>(p.chunk)], n);
  }
  return most;
}

PipelineLinks make_pipeline_links(const Communicator& pp, bool wrap) {
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
  if (!wrap) return l;
  // Stage P - 1 is rank 0 of the wrap links (it sends A there), stage 0 rank 1; the middle stages form a group of
  // their own that nobody uses.
  const int color = s == 0 || s == P - 1 ? 0 : 1, key = s == P - 1 ? 0 : 1;
  std::unique_ptr<Communicator> wrap_a = pp.split(color, key, "pp-link-act", &opts);
  std::unique_ptr<Communicator> wrap_g = pp.split(color, key, "pp-link-grad", &opts);
  if (s == 0) {
    l.fwd_in = std::move(wrap_a);
    l.bwd_out = std::move(wrap_g);
  } else if (s == P - 1) {
    l.fwd_out = std::move(wrap_a);
    l.bwd_in = std::move(wrap_g);
  }
  return l;
}

/// One direction of one link: two buffers, each with the number of the message it holds (or -1) and the
/// message's Work. Messages are numbered from 0 in each phase (begin_phase), in the order both ends post them;
/// message n lands in (or leaves from) buffer n mod 2.
struct PipelineSchedule::Channel {
  Communicator* link = nullptr;
  int peer = 0;
  DType type = DType::kF32;
  std::string tag;
  int64_t count = 0;
  std::array<std::vector<float>, 2> buf;  ///< fp32 elements, or 2-byte ones in the first half
  std::array<Work, 2> work;
  std::array<int, 2> pending{-1, -1};
  int received = 0, sent = 0;  ///< messages consumed by recv_next and posted by send_next in this phase
  int to_receive = 0;          ///< messages this channel receives in this phase
  double* wait_s = nullptr;  ///< PipelineSchedule::wait_s_: seconds spent waiting for receives and sends

  void wait(size_t k) {
    const auto t0 = std::chrono::steady_clock::now();
    work[k].wait();
    *wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void begin(int64_t n, int receives) {
    count = n;
    for (auto& b : buf) b.resize(static_cast<size_t>(n));
    received = sent = 0;
    to_receive = receives;
  }
  /// Posts message n's receive unless it is posted. Receives must be posted in message order: the link's tags
  /// follow the order of its ops.
  void post_recv(int n) {
    const size_t k = static_cast<size_t>(n % 2);
    if (pending[k] == n) return;
    COC_ASSERT(pending[k] == -1, "{}: receive of message {} while {} is pending", tag, n, pending[k]);
    const P2pRecv r{peer, buf[k].data(), count, type};
    work[k] = link->exchange({}, std::span<const P2pRecv>(&r, 1), tag);
    pending[k] = n;
  }
  /// Waits for the next message (posting its receive first if it is not posted, and with `ahead` the one after it
  /// too, so that it lands while the caller computes) and writes it to `into`. `micro_batch` names it in the trace.
  void recv_next(MatrixView into, bool ahead, int micro_batch) {
    const int n = received++;
    const size_t k = static_cast<size_t>(n % 2);
    post_recv(n);
    if (ahead && n + 1 < to_receive) post_recv(n + 1);
    {
      COC_TRACE_SCOPE(trace::Cat::kComm, trace::Level::kLevel0, "pp_recv_wait", {"micro_batch", micro_batch});
      wait(k);
    }
    pending[k] = -1;
    if (type == DType::kF32)
      std::memcpy(into.data, buf[k].data(), static_cast<size_t>(count) * sizeof(float));
    else
      half_to_fp32(type, buf[k].data(), into.data, count);
  }
  /// Sends `from` as the next message, after the send that last used its buffer has left.
  void send_next(ConstMatrixView from) {
    const int n = sent++;
    const size_t k = static_cast<size_t>(n % 2);
    if (pending[k] != -1) wait(k);
    if (type == DType::kF32)
      std::memcpy(buf[k].data(), from.data, static_cast<size_t>(count) * sizeof(float));
    else
      fp32_to_half(type, from.data, buf[k].data(), count);
    const P2pSend s{peer, buf[k].data(), count, type};
    work[k] = link->exchange(std::span<const P2pSend>(&s, 1), {}, tag);
    pending[k] = n;
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
      links_(make_pipeline_links(pp, model.num_chunks() > 1)),
      activation_type_(activation_type),
      overlap_(overlap_p2p) {
  COC_ASSERT(model.num_stages() == pp.size() && model.stage() == pp.rank(),
             "the decoder is stage {} of {}, the pp group rank {} of {}", model.stage(), model.num_stages(),
             pp.rank(), pp.size());
  // Without interleaving stage 0 has no fwd_in, so its a_in_ is null; with it, stage 0's a_in_ is the wrap link
  // from stage P - 1, whose rank there is 0 (and stage P - 1's a_out_ goes to stage 0, rank 1 there).
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

void PipelineSchedule::set_switches(DType activation_type, bool overlap_p2p) {
  for (Channel* c : {a_in_.get(), a_out_.get(), g_in_.get(), g_out_.get()})
    if (c)
      COC_ASSERT(c->pending[0] == -1 && c->pending[1] == -1, "{}: the pipeline switched settings with message {} in "
                 "flight", c->tag, std::max(c->pending[0], c->pending[1]));
  activation_type_ = activation_type;
  overlap_ = overlap_p2p;
  for (Channel* c : {a_in_.get(), a_out_.get()})
    if (c) c->type = activation_type;
}

void PipelineSchedule::forward_step(const PipeStep& step, int64_t batch, int slot, const PipelineCallbacks& cb,
                                    double& loss) {
  const int c = step.chunk, i = step.micro_batch;
  std::vector<int32_t>& tokens = tokens_[static_cast<size_t>(c)][static_cast<size_t>(slot)];
  std::vector<int32_t>& targets = targets_[static_cast<size_t>(c)][static_cast<size_t>(slot)];
  if (model_.holds_embedding(c) || model_.holds_head(c)) {
    COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "data", {"micro_batch", i});
    cb.load(i, tokens, targets);
  }
  if (!model_.holds_embedding(c)) a_in_->recv_next(input_.mat(), overlap_, i);  // the next lands while F computes
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "forward", {"micro_batch", i}, {"chunk", c});
  loss += model_.forward_stage(c, slot, tokens.data(), targets.data(), input_.mat(), batch, out_.mat());
  if (cb.after_forward) cb.after_forward(i, c);
  if (!model_.holds_head(c)) a_out_->send_next(out_.mat());
}

void PipelineSchedule::backward_step(const PipeStep& step, int slot, float loss_scale, const PipelineCallbacks& cb) {
  const int c = step.chunk, i = step.micro_batch;
  if (!model_.holds_head(c)) g_in_->recv_next(dy_.mat(), overlap_, i);  // the next lands while B computes
  if (cb.before_backward) cb.before_backward(i);
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "backward", {"micro_batch", i}, {"chunk", c});
  model_.backward_stage(c, slot, dy_.mat(), loss_scale, dx_.mat());
  if (!model_.holds_embedding(c)) g_out_->send_next(dx_.mat());
}

void PipelineSchedule::begin_phase(const std::vector<PipeStep>& steps, int64_t rows) {
  int a = 0, g = 0;  // the messages a_in_ and g_in_ receive
  for (const PipeStep& p : steps) {
    if (p.kind == PipeStep::kForward && !model_.holds_embedding(p.chunk)) ++a;
    if (p.kind == PipeStep::kBackward && !model_.holds_head(p.chunk)) ++g;
  }
  const int64_t n = rows * model_.config().hidden_size;
  for (Tensor* t : {&input_, &dy_, &out_, &dx_}) t->resize({rows, model_.config().hidden_size});
  for (Channel* c : {a_in_.get(), a_out_.get(), g_in_.get(), g_out_.get()})
    if (c) c->begin(n, c == a_in_.get() ? a : c == g_in_.get() ? g : 0);
  const size_t V = static_cast<size_t>(model_.num_chunks());
  tokens_.resize(V);
  targets_.resize(V);
}

void PipelineSchedule::finish_sends() {
  for (Channel* c : {a_out_.get(), g_out_.get()})
    if (c) c->wait_all();
}

double PipelineSchedule::train_step(int micro_batches, int64_t batch, float loss_scale,
                                    const PipelineCallbacks& cb) {
  const int V = model_.num_chunks();
  const std::vector<PipeStep> steps = interleaved_order(model_.num_stages(), model_.stage(), micro_batches, V);
  const std::vector<int> slots = pipeline_slots(steps, V);
  begin_phase(steps, model_.activation_rows(batch));
  for (int c = 0; c < V; ++c) {
    model_.set_pipeline_slots(c, slots[static_cast<size_t>(c)]);
    tokens_[static_cast<size_t>(c)].resize(static_cast<size_t>(slots[static_cast<size_t>(c)]));
    targets_[static_cast<size_t>(c)].resize(static_cast<size_t>(slots[static_cast<size_t>(c)]));
  }
  double loss = 0;
  for (const PipeStep& step : steps) {
    const int slot = step.micro_batch % slots[static_cast<size_t>(step.chunk)];
    if (step.kind == PipeStep::kForward)
      forward_step(step, batch, slot, cb, loss);
    else
      backward_step(step, slot, loss_scale, cb);
  }
  finish_sends();
  return loss;
}

double PipelineSchedule::forward_only(int micro_batches, int64_t batch, const PipelineCallbacks& cb) {
  const std::vector<PipeStep> steps = forward_only_order(micro_batches, model_.num_chunks());
  begin_phase(steps, model_.activation_rows(batch));
  // Slot 0 of each chunk serves every forward: each micro-batch's activations are dropped by the next one.
  for (auto* t : {&tokens_, &targets_})
    for (auto& chunk : *t) chunk.resize(std::max<size_t>(chunk.size(), 1));
  double loss = 0;
  for (const PipeStep& step : steps) forward_step(step, batch, 0, cb, loss);
  finish_sends();
  return loss;
}

std::vector<float> PipelineSchedule::next_token_logits(const int32_t* tokens, int64_t len) {
  // The context passes through the virtual stages in order: F(c, 0) for c = 0 .. V - 1 on every stage.
  begin_phase(forward_only_order(1, model_.num_chunks()), len);
  std::vector<float> logits;
  for (int c = 0; c < model_.num_chunks(); ++c) {
    if (!model_.holds_embedding(c)) a_in_->recv_next(input_.mat(), false, 0);
    logits = model_.sample_stage(c, tokens, len, input_.mat(), out_.mat());
    if (!model_.holds_head(c)) a_out_->send_next(out_.mat());
  }
  finish_sends();
  logits.resize(static_cast<size_t>(model_.config().vocab_size));
  pp_.broadcast(logits.data(), static_cast<int64_t>(logits.size()), pp_.size() - 1, "sample logits (pipeline)").wait();
  return logits;
}

}  // namespace coc
