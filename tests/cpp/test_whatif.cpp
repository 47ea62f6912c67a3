// What-if simulator on hand-built jobs whose replays are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/whatif/analysis.h"
#include "core/whatif/model.h"
#include "core/whatif/synthetic.h"

namespace wi = relax_straggler::core::whatif;

namespace {

enum T { kF, kB, kFs, kFr, kBs, kBr, kRs, kClip, kOpt };
std::vector<wi::OpRole> roles() {
  return {wi::OpRole::kForwardCompute, wi::OpRole::kBackwardCompute, wi::OpRole::kForwardSend,
          wi::OpRole::kForwardRecv,    wi::OpRole::kBackwardSend,    wi::OpRole::kBackwardRecv,
          wi::OpRole::kGradsReduceScatter, wi::OpRole::kClipMainGrad, wi::OpRole::kOptimizer};
}
wi::OpRecord op(std::int32_t dp, std::int32_t stage, std::int64_t step, T t, std::int32_t seq, double start, double dur) {
  return {dp, stage, step, t, start, dur, seq, seq, 0};
}

// dp 2, pp 1, two steps; forward 1 s, backward 2 s, reduce-scatter transfer 0.5 s, clip 0.1 s,
// optimizer 1 s. In step 2 dp 0's forward takes 3 s (an injected slow worker): dp 1 waits
// 2 s in the reduce-scatter. Step times: 4.6 s and 6.6 s.
std::vector<wi::OpRecord> dp_job() {
  std::vector<wi::OpRecord> r;
  for (std::int32_t d = 0; d < 2; ++d) {
    r.insert(r.end(), {op(d, 0, 1, kF, 0, 0, 1), op(d, 0, 1, kB, 0, 1, 2), op(d, 0, 1, kRs, 0, 3, 0.5),
                       op(d, 0, 1, kClip, 0, 3.5, 0.1), op(d, 0, 1, kOpt, 0, 3.6, 1)});
  }
  r.insert(r.end(), {op(0, 0, 2, kF, 0, 0, 3), op(0, 0, 2, kB, 0, 3, 2), op(0, 0, 2, kRs, 0, 5, 0.5),
                     op(1, 0, 2, kF, 0, 0, 1), op(1, 0, 2, kB, 0, 1, 2), op(1, 0, 2, kRs, 0, 3, 2.5)});
  for (std::int32_t d = 0; d < 2; ++d) r.insert(r.end(), {op(d, 0, 2, kClip, 0, 5.5, 0.1), op(d, 0, 2, kOpt, 0, 5.6, 1)});
  return r;
}

// The readers' columns, read in place, give the model the records give, in any order.
TEST(WhatIf, ColumnsBuildTheModelTheRecordsDo) {
  std::vector<wi::OpRecord> recs = dp_job();
  std::reverse(recs.begin(), recs.end());
  std::vector<std::int32_t> dp, stage, optype, seq, mb, chunk;
  std::vector<std::int64_t> step;
  std::vector<double> start, duration;
  for (const wi::OpRecord& r : recs) {
    dp.push_back(r.dp_rank), stage.push_back(r.stage), step.push_back(r.step), optype.push_back(r.optype);
    start.push_back(r.start), duration.push_back(r.duration), seq.push_back(r.seq_id), mb.push_back(r.microbatch);
    chunk.push_back(r.chunk);
  }
  const wi::OpColumns cols{recs.size(), dp.data(), stage.data(), step.data(), optype.data(), start.data(),
                           duration.data(), seq.data(), mb.data(), chunk.data()};
  const wi::WhatIfModel a = wi::build_model(dp_job(), roles()), b = wi::build_model(cols, roles());
  EXPECT_EQ(a.dp_ranks, b.dp_ranks);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.recorded, b.recorded);
  EXPECT_EQ(a.ideal, b.ideal);
  EXPECT_EQ(a.measured_step_s, b.measured_step_s);
  EXPECT_THROW(wi::build_model(wi::OpColumns{}, roles()), std::invalid_argument);
}

TEST(WhatIf, DpCollectiveWithInjectedSlowWorker) {
  const wi::WhatIfModel m = wi::build_model(dp_job(), roles());
  // Ideal: forward mean (1+1+3+1)/4 = 1.5 s, backward 2, reduce-scatter median transfer 0.5.
  EXPECT_DOUBLE_EQ(m.ideal[kF], 1.5);
  EXPECT_DOUBLE_EQ(m.ideal[kRs], 0.5);
  const wi::WhatIfResult r = wi::analyze(m, {});
  EXPECT_NEAR(r.replayed_step_s[0], 4.6, 1e-6);
  EXPECT_NEAR(r.replayed_step_s[1], 6.6, 1e-6);
  EXPECT_NEAR(r.ideal_step_s[0], 5.1, 1e-6);  // 1.5 + 2 + 0.5 + 0.1 + 1
  EXPECT_NEAR(r.simulation_error, 1.0, 1e-6);
  EXPECT_NEAR(r.slowdown, 5.6 / 5.1, 1e-6);
  // dp 0 kept: step 1 its 3 s of compute beats the ideal 3.5 s (5.1 s), step 2 it arrives at 5 s (6.6 s).
  EXPECT_NEAR(r.by_dp[0], (5.1 + 6.6) / 2 / 5.1, 1e-6);
  EXPECT_NEAR(r.by_dp[1], 1.0, 1e-6);  // dp 1 is never later than the ideal
  EXPECT_NEAR(r.by_worker[0], r.by_dp[0], 1e-6);
  EXPECT_NEAR(r.by_stage[0], r.slowdown, 1e-6);  // one stage: keeping it is the recorded job
  ASSERT_EQ(r.top_workers.size(), 1u);
  EXPECT_EQ(r.top_workers[0], 0);
  EXPECT_NEAR(r.m_w.rem, 1.0, 1e-6);  // fixing dp 0 returns the job to 5.1 s per step
  EXPECT_NEAR(r.m_w.add, 2 * (5.85 - 5.1) / 1.0, 1e-6);  // dp 0 alone: mean 5.85 s; lost time 0.5 s
}

// pp 2, dp 1, 1F1B with 2 microbatches, forward 1 s, backward 2 s, instant p2p, optimizer 1 s.
// Stage 0: F0 0-1, F1 1-2, B0 4-6 (waits for stage 1's B0 gradients at 4), B1 7-9 (waits for
// B1's at 7), optimizer 9-10. Stage 1: F0 1-2, B0 2-4, F1 4-5, B1 5-7, optimizer 7-8.
std::vector<wi::OpRecord> pipeline_job(double stage1_b0 = 2) {
  const double d = stage1_b0 - 2;  // a longer B0 at stage 1 delays everything after it
  return {op(0, 0, 0, kF, 0, 0, 1),      op(0, 0, 0, kFs, 0, 1, 0),      op(0, 0, 0, kF, 1, 1, 1),
          op(0, 0, 0, kFs, 1, 2, 0),     op(0, 0, 0, kBr, 0, 2, 2 + d),  op(0, 0, 0, kB, 0, 4 + d, 2),
          op(0, 0, 0, kBr, 1, 6 + d, 1), op(0, 0, 0, kB, 1, 7 + d, 2),   op(0, 0, 0, kOpt, 0, 9 + d, 1),
          op(0, 1, 0, kFr, 0, 0, 1),     op(0, 1, 0, kF, 0, 1, 1),       op(0, 1, 0, kB, 0, 2, stage1_b0),
          op(0, 1, 0, kBs, 0, 4 + d, 0), op(0, 1, 0, kFr, 1, 2, 0),      op(0, 1, 0, kF, 1, 4 + d, 1),
          op(0, 1, 0, kB, 1, 5 + d, 2),  op(0, 1, 0, kBs, 1, 7 + d, 0),  op(0, 1, 0, kOpt, 0, 7 + d, 1)};
}

TEST(WhatIf, OneFOneBPipelineReplaysItsRecord) {
  const wi::WhatIfResult r = wi::analyze(wi::build_model(pipeline_job(), roles()), {});
  EXPECT_NEAR(r.measured_step_s[0], 10.0, 1e-9);
  EXPECT_NEAR(r.replayed_step_s[0], 10.0, 1e-9);
  EXPECT_NEAR(r.slowdown, 1.0, 1e-9);  // every op already at its type's mean
}

TEST(WhatIf, SlowPipelineStageIsAttributed) {
  // Stage 1's B0 takes 4 s: the step takes 12 s. Ideal backward = (4 + 2 + 2 + 2) / 4 = 2.5 s:
  // stage 1 F0 1-2, B0 2-4.5, F1 4.5-5.5, B1 5.5-8; stage 0 B0 4.5-7, B1 8-10.5, optimizer 11.5.
  const wi::WhatIfResult r = wi::analyze(wi::build_model(pipeline_job(4), roles()), {});
  EXPECT_NEAR(r.replayed_step_s[0], 12.0, 1e-9);
  EXPECT_NEAR(r.ideal_step_s[0], 11.5, 1e-9);
  // Stage 1 kept (B0 4, B1 2), stage 0 ideal (2.5 each): stage 1 B1 ends 9 -> stage 0 B1 9-11.5,
  // optimizer 12.5; stage 0 kept (2 each) with stage 1 ideal: B1 8-10, optimizer 11.
  EXPECT_NEAR(r.by_stage[1], 12.5 / 11.5, 1e-9);
  EXPECT_NEAR(r.by_stage[0], 11.0 / 11.5, 1e-9);
}

TEST(WhatIf, MissingOpIsNamed) {
  auto recs = dp_job();
  recs.pop_back();  // dp 1's optimizer in step 2
  try {
    wi::build_model(recs, roles());
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("missing op: dp_rank 1, stage 0, step 2"), std::string::npos) << e.what();
  }
}

TEST(WhatIf, SyntheticSlowWorkerIsFoundByEveryView) {
  const wi::WhatIfModel m = wi::synthetic_model({8, 4, 8, 3, 7, 5, 2, 2.0});
  const wi::WhatIfResult r = wi::analyze(m, {});
  EXPECT_GT(r.slowdown, 1.3);
  EXPECT_EQ(r.top_workers[0], 5 * 4 + 2);
  EXPECT_GT(r.by_dp[5], r.slowdown - 0.05);
  EXPECT_GT(r.m_w.rem, 0.8);
  for (std::int32_t d = 0; d < 8; ++d) {
    if (d != 5) {
      EXPECT_LT(r.by_dp[d], 1.0 + (r.slowdown - 1) / 4);
    }
  }
}

}  // namespace
