// The 1F1B order (one_f_one_b_order) against Megatron-core's forward_backward_pipelining_without_interleaving, the
// interleaved order (interleaved_order) against forward_backward_pipelining_with_interleaving, and the pipeline
// layer split (pipeline_stage_layers, pipeline_virtual_stage_layers) against Megatron's get_num_layers_to_build.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "coc/core/error.h"
#include "coc/model/decoder.h"
#include "coc/model/pipeline_schedule.h"

namespace coc {
namespace {

/// "F0 F1 B0 ..." for a schedule.
std::string order(int stages, int stage, int micro_batches) {
  std::string s;
  for (const PipeStep& p : one_f_one_b_order(stages, stage, micro_batches))
    s += (s.empty() ? "" : " ") + std::string(p.kind == PipeStep::kForward ? "F" : "B") +
         std::to_string(p.micro_batch);
  return s;
}

TEST(OneFOneB, MegatronOrderFourStagesSixMicroBatches) {
  // Megatron: num_warmup = min(P - rank - 1, M); then F, B pairs; then the remaining backwards.
  EXPECT_EQ(order(4, 0, 6), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(order(4, 1, 6), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(order(4, 2, 6), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(order(4, 3, 6), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(OneFOneB, FewerMicroBatchesThanStages) {
  // M < P: the warm-up is capped by M, so the first stage runs every forward, then every backward.
  EXPECT_EQ(order(4, 0, 2), "F0 F1 B0 B1");
  EXPECT_EQ(order(4, 2, 2), "F0 F1 B0 B1");  // warm-up 1, then F1 B0
  EXPECT_EQ(order(4, 3, 2), "F0 B0 F1 B1");
  EXPECT_EQ(order(2, 0, 1), "F0 B0");
  EXPECT_EQ(order(2, 0, 3), "F0 F1 B0 F2 B1 B2");  // M not a multiple of P
  EXPECT_EQ(order(1, 0, 3), "F0 B0 F1 B1 F2 B2");  // one stage: P = 1's order
}

TEST(OneFOneB, InvariantsOverManyShapes) {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 9; ++M)
      for (int s = 0; s < P; ++s) {
        const std::vector<PipeStep> steps = one_f_one_b_order(P, s, M);
        ASSERT_EQ(steps.size(), static_cast<size_t>(2 * M));
        int next_f = 0, next_b = 0, in_flight = 0, most = 0;
        for (const PipeStep& p : steps) {
          if (p.kind == PipeStep::kForward) {
            EXPECT_EQ(p.micro_batch, next_f++);  // forwards in micro-batch order
            most = std::max(most, ++in_flight);
          } else {
            EXPECT_EQ(p.micro_batch, next_b++);  // backwards too: gradients accumulate as at P = 1
            EXPECT_LT(p.micro_batch, next_f);    // after its forward
            --in_flight;
          }
        }
        EXPECT_EQ(most, std::min(P - s, M)) << "P " << P << " stage " << s << " M " << M;
      }
}

TEST(OneFOneB, BadArguments) {
  EXPECT_THROW(one_f_one_b_order(0, 0, 1), Error);
  EXPECT_THROW(one_f_one_b_order(2, 2, 1), Error);
  EXPECT_THROW(one_f_one_b_order(2, 0, 0), Error);
}

/// "F0.0 F0.1 B1.0 ..." (F or B, chunk, micro-batch) for an interleaved schedule.
std::string vorder(int stages, int stage, int micro_batches, int chunks) {
  std::string s;
  for (const PipeStep& p : interleaved_order(stages, stage, micro_batches, chunks))
    s += (s.empty() ? "" : " ") + std::string(p.kind == PipeStep::kForward ? "F" : "B") + std::to_string(p.chunk) +
         "." + std::to_string(p.micro_batch);
  return s;
}

TEST(Interleaved, MegatronOrderTwoStagesTwoChunksFourMicroBatches) {
  // Megatron: forward k is of chunk (k mod P·V) / P and micro-batch (k / P·V)·P + k mod P; backward k of chunk
  // V - 1 - (k mod P·V) / P; warm-up min(2·(P - s - 1) + (V - 1)·P, V·M) = 4 on stage 0, 2 on stage 1.
  EXPECT_EQ(vorder(2, 0, 4, 2),
            "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3");
  EXPECT_EQ(vorder(2, 1, 4, 2),
            "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3");
  EXPECT_EQ(interleaved_order(3, 1, 3, 1), one_f_one_b_order(3, 1, 3));  // one chunk: plain 1F1B
}

/// Runs every stage's interleaved order against the others as the schedule's channels do, with sends that complete
/// only once the receiver has posted the receive (MPI's rendezvous, the strictest case) and two buffers per
/// channel: a send waits for the receive of the message two before it. Returns whether every stage finishes.
bool runs_to_completion(int P, int V, int M) {
  struct Channel {
    int posted = 0, sent = 0;
  };
  std::vector<Channel> act(static_cast<size_t>(P)), grad(static_cast<size_t>(P));  // [sender stage]
  std::vector<std::vector<PipeStep>> steps;
  for (int s = 0; s < P; ++s) steps.push_back(interleaved_order(P, s, M, V));
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<int> phase(static_cast<size_t>(P), 0);  // 0: post the receive, 1: wait for it, 2: send
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < P; ++s) {
      if (next[s] == steps[s].size()) continue;
      const PipeStep& p = steps[s][next[s]];
      const bool fwd = p.kind == PipeStep::kForward;
      const bool first = s == 0 && p.chunk == 0, last = s == P - 1 && p.chunk == V - 1;
      Channel* in = fwd ? (first ? nullptr : &act[static_cast<size_t>((s + P - 1) % P)])
                        : (last ? nullptr : &grad[static_cast<size_t>((s + 1) % P)]);
      Channel* out = fwd ? (last ? nullptr : &act[static_cast<size_t>(s)]) : (first ? nullptr : &grad[s]);
      if (phase[s] == 0) {
        if (in) ++in->posted;
        phase[s] = 1, moved = true;
      } else if (phase[s] == 1) {
        if (!in || in->sent >= in->posted) phase[s] = 2, moved = true;
      } else if (!out || out->sent < 2 || out->posted > out->sent - 2) {
        if (out) ++out->sent;
        phase[s] = 0, ++next[s], moved = true;
      }
    }
  }
  for (int s = 0; s < P; ++s)
    if (next[s] != steps[s].size()) return false;
  return true;
}

TEST(Interleaved, InvariantsAndCompletionOverManyShapes) {
  for (int P = 2; P <= 5; ++P)
    for (int V = 1; V <= 4; ++V)
      for (int M = P; M <= 4 * P; M += P) {
        EXPECT_TRUE(runs_to_completion(P, V, M)) << "deadlock: P " << P << " V " << V << " M " << M;
        for (int s = 0; s < P; ++s) {
          const std::vector<PipeStep> steps = interleaved_order(P, s, M, V);
          ASSERT_EQ(steps.size(), static_cast<size_t>(2 * M * V));
          std::vector<int> next_f(static_cast<size_t>(V), 0), next_b(static_cast<size_t>(V), 0);
          for (size_t k = 0; k < steps.size(); ++k) {
            const PipeStep& p = steps[k];
            const size_t c = static_cast<size_t>(p.chunk);
            if (p.kind == PipeStep::kForward) {
              EXPECT_EQ(p.micro_batch, next_f[c]++);  // each chunk's forwards in micro-batch order, once each
            } else {
              EXPECT_EQ(p.micro_batch, next_b[c]++);  // backwards too: gradients accumulate as at P = 1
              EXPECT_LT(p.micro_batch, next_f[c]);    // after its forward
            }
            // The head keeps one micro-batch: on the last stage B(V - 1, i) follows F(V - 1, i) at once.
            if (s == P - 1 && p.chunk == V - 1 && p.kind == PipeStep::kBackward)
              EXPECT_EQ(steps[k - 1], (PipeStep{PipeStep::kForward, p.micro_batch, V - 1}));
          }
          for (int c = 0; c < V; ++c) EXPECT_EQ(next_b[static_cast<size_t>(c)], M);
        }
      }
}

TEST(Interleaved, SlotsAndForwardOnly) {
  // Stage 0 of P 2, V 2, M 4 runs F0.0 .. F0.3 before B0.0: four micro-batches of chunk 0 in flight, two of chunk 1;
  // stage 1 three of chunk 0 (F0.2 before B0.0) and one of chunk 1, which holds the head.
  EXPECT_EQ(pipeline_slots(interleaved_order(2, 0, 4, 2), 2), std::vector<int>({4, 2}));
  EXPECT_EQ(pipeline_slots(interleaved_order(2, 1, 4, 2), 2), std::vector<int>({3, 1}));
  EXPECT_EQ(pipeline_slots(one_f_one_b_order(4, 0, 6), 1), std::vector<int>({4}));
  const std::vector<PipeStep> f = forward_only_order(2, 2);
  EXPECT_EQ(f, (std::vector<PipeStep>{{PipeStep::kForward, 0, 0}, {PipeStep::kForward, 0, 1},
                                      {PipeStep::kForward, 1, 0}, {PipeStep::kForward, 1, 1}}));
}

TEST(Interleaved, OneLineErrors) {
  try {
    interleaved_order(2, 0, 3, 2);
    ADD_FAILURE() << "M % P != 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 = --global-batch-size / (--micro-batch-size × dp), to be a multiple of "
                                         "--pipeline-model-parallel-size 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(interleaved_order(4, 0, 2, 2), Error);  // M < P
  EXPECT_THROW(interleaved_order(1, 0, 2, 2), Error);  // no stages to interleave
  EXPECT_THROW(forward_only_order(0, 1), Error);
}

TEST(PipelineVirtualStageLayers, LayoutAndErrors) {
  EXPECT_EQ(pipeline_virtual_stage_layers(8, 2, {.virtual_stages = 2}), std::vector<int>({2, 2, 2, 2}));
  EXPECT_EQ(pipeline_virtual_stage_layers(8, 2, {}), std::vector<int>({4, 4}));
  auto message = [](int layers, int stages, PipelineSplit split) {
    try {
      pipeline_virtual_stage_layers(layers, stages, split);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(6, 2, {.virtual_stages = 2})
                .find("--num-layers 6 is not divisible by --pipeline-model-parallel-size 2 × "
                      "--num-virtual-stages-per-pipeline-rank 2 = 4"),
            std::string::npos);
  EXPECT_NE(message(4, 1, {.virtual_stages = 2}).find("needs --pipeline-model-parallel-size > 1"), std::string::npos);
  EXPECT_NE(message(8, 2, {.first_stage_layers = 2, .virtual_stages = 2}).find("is not supported yet"),
            std::string::npos);
  EXPECT_NE(message(8, 2, {.virtual_stages = 0}).find("must be >= 1"), std::string::npos);
}

TEST(PipelineStageLayers, EvenAndUnevenSplits) {
  EXPECT_EQ(pipeline_stage_layers(8, 1), std::vector<int>({8}));
  EXPECT_EQ(pipeline_stage_layers(8, 2), std::vector<int>({4, 4}));
  EXPECT_EQ(pipeline_stage_layers(8, 4), std::vector<int>({2, 2, 2, 2}));
  EXPECT_EQ(pipeline_stage_layers(7, 3, {.first_stage_layers = 1}), std::vector<int>({1, 3, 3}));
  EXPECT_EQ(pipeline_stage_layers(7, 3, {.last_stage_layers = 3}), std::vector<int>({2, 2, 3}));
  EXPECT_EQ(pipeline_stage_layers(6, 4, {.first_stage_layers = 1, .last_stage_layers = 1}),
            std::vector<int>({1, 2, 2, 1}));
  EXPECT_EQ(pipeline_stage_layers(3, 2, {.first_stage_layers = 1, .last_stage_layers = 2}),
            std::vector<int>({1, 2}));
}

TEST(PipelineStageLayers, OneLineErrors) {
  auto message = [](int layers, int stages, PipelineSplit split) {
    try {
      pipeline_stage_layers(layers, stages, split);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(3, 2, {}).find("--num-layers 3 is not divisible by --pipeline-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(message(8, 3, {.first_stage_layers = 3}).find("leaves 5 layers for the 2 other stages"),
            std::string::npos);
  EXPECT_NE(message(4, 2, {.first_stage_layers = 3, .last_stage_layers = 2}).find("exceed --num-layers 4"),
            std::string::npos);
  EXPECT_NE(message(3, 2, {.first_stage_layers = 1, .last_stage_layers = 1}).find("leaves 1 layers"),
            std::string::npos);
  EXPECT_NE(message(4, 1, {.first_stage_layers = 2}).find("need --pipeline-model-parallel-size > 1"),
            std::string::npos);
  EXPECT_EQ(message(4, 4, {}), "no error");
}

}  // namespace
}  // namespace coc
