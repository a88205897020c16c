// The 1F1B order (one_f_one_b_order) against Megatron-core's forward_backward_pipelining_without_interleaving, and
// the pipeline layer split (pipeline_stage_layers) against Megatron's get_num_layers_to_build.
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
