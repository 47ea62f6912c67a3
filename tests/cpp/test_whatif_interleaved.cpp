// What-if simulator on an interleaved (virtual pipeline) schedule worked out by hand: pp 2,
// 2 model chunks, 2 microbatches, dp 1, in the interleaved 1F1B order.
//
// Model chunk c of stage s is global chunk g = c * pp + s: forwards run g 0 (stage 0) ->
// 1 (stage 1) -> 2 (stage 0) -> 3 (stage 1), so stage 1 hands chunk 0's activations back
// to stage 0 (the wrap-around from the last stage to the first), and backwards run 3 -> 0.
// Per stage the computes f0..f3 are (chunk, microbatch) (0,0) (0,1) (1,0) (1,1) and b0..b3
// are (1,0) (1,1) (0,0) (0,1). Stage s warms up with (pp - s - 1) x 2 + (vpp - 1) x pp
// forwards: stage 0 runs all four forwards, then the backwards; stage 1 runs two, then one
// forward one backward: f0 f1 f2 b0 f3 b1 b2 b3.
// Every compute has its recv and send (fr_k feeds f_k, fs_k follows f_k, likewise br/bs);
// a p2p op whose peer chunk lies outside the model is a no-op: stage 0's fr0, fr1 (chunk 0
// has no predecessor) and bs2, bs3, stage 1's fs2, fs3 and br0, br1 (chunk 1 of the last
// stage). Pairs: stage 0 fs_k - stage 1 fr_k; stage 1 fs0, fs1 - stage 0 fr2, fr3 (the
// wrap-around); stage 1 bs_k - stage 0 br_k; stage 0 bs0, bs1 - stage 1 br2, br3.
// Transfers are instant, so a pair ends when its later member is ready.
//
// Durations (s): forward 1, backward 2 at stage 0; stage 1 is a worker twice as slow
// (forward 2, backward 4); optimizer 1. Ideal forward = (4 x 1 + 4 x 2) / 8 = 1.5 s, ideal
// backward = (4 x 2 + 4 x 4) / 8 = 3 s, p2p transfer 0.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/whatif/analysis.h"
#include "core/whatif/model.h"
#include "core/whatif/synthetic.h"

namespace wi = relax_straggler::core::whatif;

namespace {

enum T { kF, kB, kFs, kFr, kBs, kBr, kOpt };
std::vector<wi::OpRole> roles() {
  return {wi::OpRole::kForwardCompute, wi::OpRole::kBackwardCompute, wi::OpRole::kForwardSend,
          wi::OpRole::kForwardRecv,    wi::OpRole::kBackwardSend,    wi::OpRole::kBackwardRecv,
          wi::OpRole::kOptimizer};
}

// [start, end] of one op, s.
struct Span {
  double start, end;
};

// Chunk of the k-th forward (k = 0..3) and of the k-th backward.
constexpr std::int32_t kForwardChunk[4] = {0, 0, 1, 1};
constexpr std::int32_t kBackwardChunk[4] = {1, 1, 0, 0};

// The recorded step, replayed by hand (a p2p op starts when it is posted and ends when its
// pair completes):
//   stage 0: f0 0-1, f1 1-2, f2 3-4 (waits for stage 1's f0 through the wrap-around),
//            f3 5-6, b0 11-13 (waits for stage 1's b0), b1 17-19, b2 21-23, b3 25-27, optimizer 27-28;
//   stage 1: f0 1-3, f1 3-5, f2 5-7, b0 7-11, f3 11-13, b1 13-17, b2 17-21, b3 21-25, optimizer 25-26.
// The step takes 28 s.
std::vector<wi::OpRecord> interleaved_job() {
  const Span f[2][4] = {{{0, 1}, {1, 2}, {3, 4}, {5, 6}}, {{1, 3}, {3, 5}, {5, 7}, {11, 13}}};
  const Span b[2][4] = {{{11, 13}, {17, 19}, {21, 23}, {25, 27}}, {{7, 11}, {13, 17}, {17, 21}, {21, 25}}};
  const Span fr[2][4] = {{{0, 0}, {1, 1}, {2, 3}, {4, 5}}, {{0, 1}, {3, 3}, {5, 5}, {7, 7}}};
  const Span fs[2][4] = {{{1, 1}, {2, 3}, {4, 5}, {6, 7}}, {{3, 3}, {5, 5}, {7, 7}, {13, 13}}};
  const Span br[2][4] = {{{4, 11}, {13, 17}, {19, 21}, {23, 25}}, {{5, 5}, {11, 11}, {17, 17}, {21, 21}}};
  const Span bs[2][4] = {{{13, 17}, {19, 21}, {23, 23}, {27, 27}}, {{11, 11}, {17, 17}, {21, 21}, {25, 25}}};
  const Span opt[2] = {{27, 28}, {25, 26}};
  std::vector<wi::OpRecord> r;
  auto add = [&](std::int32_t stage, T t, std::int32_t seq, Span sp, std::int32_t chunk) {
    r.push_back({0, stage, 0, t, sp.start, sp.end - sp.start, seq, seq % 2, chunk});
  };
  for (std::int32_t s = 0; s < 2; ++s) {
    for (std::int32_t k = 0; k < 4; ++k) {
      add(s, kF, k, f[s][k], kForwardChunk[k]);
      add(s, kFr, k, fr[s][k], kForwardChunk[k]);
      add(s, kFs, k, fs[s][k], kForwardChunk[k]);
      add(s, kB, k, b[s][k], kBackwardChunk[k]);
      add(s, kBr, k, br[s][k], kBackwardChunk[k]);
      add(s, kBs, k, bs[s][k], kBackwardChunk[k]);
    }
    add(s, kOpt, 0, opt[s], -1);
  }
  return r;
}

TEST(WhatIfInterleaved, ModelSeesTwoChunksAndTheWrapAround) {
  const wi::WhatIfModel m = wi::build_model(interleaved_job(), roles());
  EXPECT_EQ(m.graph.vpp, 2);
  EXPECT_DOUBLE_EQ(m.ideal[kF], 1.5);
  EXPECT_DOUBLE_EQ(m.ideal[kB], 3.0);
  EXPECT_DOUBLE_EQ(m.ideal[kFr], 0.0);  // every recorded wait is a wait, not transfer
  // Stage 0's f2 depends, through its recv fr2, on stage 1's f0 (via the pair fr2 - stage 1 fs0).
  std::int32_t fr2 = -1, s1_fs0 = -1;
  for (std::int32_t i = 0; i < m.graph.slots(); ++i) {
    if (m.graph.slot_stage[i] == 0 && m.graph.slot_optype[i] == kFr && m.graph.slot_seq[i] == 2) fr2 = i;
    if (m.graph.slot_stage[i] == 1 && m.graph.slot_optype[i] == kFs && m.graph.slot_seq[i] == 0) s1_fs0 = i;
  }
  ASSERT_GE(fr2, 0);
  ASSERT_GE(s1_fs0, 0);
  EXPECT_EQ(m.graph.slot_group[fr2], m.graph.slot_group[s1_fs0]);
  EXPECT_EQ(m.graph.groups[m.graph.slot_group[fr2]].members.size(), 2u);
}

TEST(WhatIfInterleaved, ReplaysItsRecordAndAttributesTheSlowStage) {
  const wi::WhatIfResult r = wi::analyze(wi::build_model(interleaved_job(), roles()), {});
  EXPECT_NEAR(r.measured_step_s[0], 28.0, 1e-9);
  EXPECT_NEAR(r.replayed_step_s[0], 28.0, 1e-9);
  EXPECT_NEAR(r.simulation_error, 1.0, 1e-9);
  // Ideal (forward 1.5, backward 3 everywhere):
  //   stage 0: f0 0-1.5, f1 1.5-3, f2 3-4.5, f3 4.5-6, b0 9-12, b1 13.5-16.5, b2 16.5-19.5,
  //            b3 19.5-22.5, optimizer 22.5-23.5;
  //   stage 1: f0 1.5-3, f1 3-4.5, f2 4.5-6, b0 6-9, f3 9-10.5, b1 10.5-13.5, b2 13.5-16.5,
  //            b3 16.5-19.5, optimizer 19.5-20.5.
  EXPECT_NEAR(r.ideal_step_s[0], 23.5, 1e-9);
  EXPECT_NEAR(r.slowdown, 28.0 / 23.5, 1e-9);
  // Stage 0 kept (1 / 2), stage 1 ideal (1.5 / 3):
  //   stage 0: f2 2.5-3.5, f3 4-5, b0 8.5-10.5, b1 13-15, b2 16-18, b3 19-21, optimizer 21-22;
  //   stage 1: f0 1-2.5, f1 2.5-4, f2 4-5.5, b0 5.5-8.5, f3 8.5-10, b1 10-13, b2 13-16, b3 16-19.
  EXPECT_NEAR(r.by_stage[0], 22.0 / 23.5, 1e-9);
  // Stage 1 kept (2 / 4), stage 0 ideal (1.5 / 3):
  //   stage 1: f0 1.5-3.5, f1 3.5-5.5, f2 5.5-7.5, b0 7.5-11.5, f3 11.5-13.5, b1 13.5-17.5,
  //            b2 17.5-21.5, b3 21.5-25.5;
  //   stage 0: f2 3.5-5, f3 5.5-7, b0 11.5-14.5, b1 17.5-20.5, b2 21.5-24.5, b3 25.5-28.5,
  //            optimizer 28.5-29.5.
  EXPECT_NEAR(r.by_stage[1], 29.5 / 23.5, 1e-9);
  EXPECT_NEAR(r.by_dp[0], r.slowdown, 1e-9);  // one dp_rank: keeping it is the recorded job
  ASSERT_EQ(r.by_worker.size(), 2u);
  EXPECT_NEAR(r.by_worker[0], 22.0 / 23.5, 1e-9);
  EXPECT_NEAR(r.by_worker[1], 29.5 / 23.5, 1e-9);
  // Top worker: min(S_dp, S_stage) is 28 / 23.5 for stage 1 and 22 / 23.5 for stage 0.
  ASSERT_EQ(r.top_workers.size(), 1u);
  EXPECT_EQ(r.top_workers[0], 1);
  // Fixing stage 1 leaves the "stage 0 kept" job (22 s): rem = (28 - 22) / (28 - 23.5); stage 1
  // alone recorded is the "stage 1 kept" job: add = (29.5 - 23.5) / 4.5. Both exceed 1 because
  // the ideal forward and backward are means over the slow stage too.
  EXPECT_NEAR(r.m_w.t_rem, 22.0, 1e-9);
  EXPECT_NEAR(r.m_w.rem, 6.0 / 4.5, 1e-9);
  EXPECT_NEAR(r.m_w.add, 6.0 / 4.5, 1e-9);
  EXPECT_NEAR(r.m_s.rem, r.m_w.rem, 1e-9);  // the last stage is the slow worker
}

TEST(WhatIfInterleaved, RecvCountThatFitsNoComputeIsNamed) {
  auto recs = interleaved_job();
  // A stage-1 forward recv recorded twice with another seq_id: 5 recvs for 4 forwards.
  wi::OpRecord extra = recs[1 * 25 + 1];
  ASSERT_EQ(extra.optype, kFr);
  extra.seq_id = 4;
  extra.start = 0.5;
  extra.duration = 0;
  recs.push_back(extra);
  try {
    wi::build_model(recs, roles());
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1: 5 forward-recv ops for 4 forward-compute ops"), std::string::npos)
        << e.what();
  }
}

// Synthetic jobs, same work per step (forward 10 ms, backward 20 ms per microbatch and stage).
// Interleaving shrinks the pipeline bubble from (pp - 1) x (F + B) to (pp - 1) x (F + B) / vpp
// (Narayanan et al., SC'21, Sec. 2.2.2): pp 4, 8 microbatches, vpp 2 saves 3 x 30 / 2 = 45 ms a
// step, give or take the p2p hops (0.2 ms each) and the ideal durations being means of +-5 %
// noisy records (about +-1 ms over a step).
TEST(WhatIfInterleaved, SyntheticInterleavingShrinksTheBubble) {
  const wi::WhatIfResult one = wi::analyze(wi::synthetic_model({1, 4, 8, 2, 3, -1, -1, 1.0, 1}), {});
  const wi::WhatIfResult two = wi::analyze(wi::synthetic_model({1, 4, 8, 2, 3, -1, -1, 1.0, 2}), {});
  const double saved = wi::mean(one.ideal_step_s) - wi::mean(two.ideal_step_s);
  EXPECT_GT(saved, 0.040);
  EXPECT_LT(saved, 0.050);
  EXPECT_NEAR(two.simulation_error, 1.0, 1e-6);
  EXPECT_LT(two.slowdown, 1.05);  // noise only
}

TEST(WhatIfInterleaved, SyntheticSlowWorkerIsFoundByEveryView) {
  const wi::WhatIfModel m = wi::synthetic_model({4, 4, 8, 2, 11, 2, 1, 2.0, 2});
  EXPECT_EQ(m.graph.vpp, 2);
  const wi::WhatIfResult r = wi::analyze(m, {});
  EXPECT_GT(r.slowdown, 1.3);
  EXPECT_EQ(r.top_workers[0], 2 * 4 + 1);
  EXPECT_GT(r.by_dp[2], r.slowdown - 0.05);
  EXPECT_GT(r.by_stage[1], r.slowdown - 0.05);
  EXPECT_GT(r.m_w.rem, 0.8);
  for (std::int32_t d = 0; d < 4; ++d) {
    if (d != 2) {
      EXPECT_LT(r.by_dp[d], 1.0 + (r.slowdown - 1) / 4);
    }
  }
  for (std::int32_t s = 0; s < 4; ++s) {
    if (s != 1) {
      EXPECT_LT(r.by_stage[s], 1.0 + (r.slowdown - 1) / 4);
    }
  }
}

TEST(WhatIfInterleaved, SyntheticNeedsWholeMicrobatchGroups) {
  EXPECT_THROW(wi::synthetic_model({1, 4, 6, 1, 0, -1, -1, 1.0, 2}), std::invalid_argument);
}

}  // namespace
