// Attribution on hand-built worker grids: individual vs structural compute slowness,
// pipeline send/recv cross-validation, and the run-level union, jumps, baselines and the
// PP = 2 fallback. Times are ms; every expected value is worked out in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/attribute/run_attributor.h"

namespace at = relax_straggler::core::attribute;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// One compute stage; every worker 100 ms except the listed overrides.
at::WorkerStep uniform(const at::GridShape& g, double ms = 100.0) {
  at::WorkerStep s;
  s.compute_ms.assign(static_cast<std::size_t>(g.workers()), ms);
  s.step_ms = 1000.0;
  return s;
}

// p2p times of a healthy pipeline: 10 ms for every op a stage runs (the first stage
// neither receives activations nor sends gradients, the last the reverse).
std::vector<double> healthy_p2p(const at::GridShape& g) {
  std::vector<double> p2p(static_cast<std::size_t>(g.workers()) * at::kNumP2pOps, 10.0);
  for (std::int32_t d = 0; d < g.dp; ++d) {
    const auto first = static_cast<std::size_t>(g.index(d, 0)) * at::kNumP2pOps;
    const auto last = static_cast<std::size_t>(g.index(d, g.pp - 1)) * at::kNumP2pOps;
    p2p[first + static_cast<std::size_t>(at::P2pOp::kForwardRecv)] = kNaN;
    p2p[first + static_cast<std::size_t>(at::P2pOp::kBackwardSend)] = kNaN;
    p2p[last + static_cast<std::size_t>(at::P2pOp::kForwardSend)] = kNaN;
    p2p[last + static_cast<std::size_t>(at::P2pOp::kBackwardRecv)] = kNaN;
  }
  return p2p;
}

double& p2p_at(at::WorkerStep& s, const at::GridShape& g, std::int32_t d, std::int32_t p, at::P2pOp op) {
  return s.p2p_ms[static_cast<std::size_t>(g.index(d, p)) * at::kNumP2pOps + static_cast<std::size_t>(op)];
}

}  // namespace

TEST(AttributeClassify, IndividualWorkerAgainstItsReplicas) {
  const at::GridShape g{4, 2};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(2, 1))] = 150.0;  // median of {100,100,150,100} = 100
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  ASSERT_EQ(c.flags.size(), 1u);
  EXPECT_EQ(c.flags[0].kind, at::SlowKind::kIndividual);
  EXPECT_EQ(c.flags[0].worker, g.index(2, 1));
  EXPECT_DOUBLE_EQ(c.flags[0].ratio(), 1.5);
  EXPECT_DOUBLE_EQ(c.flags[0].excess_ms(), 50.0);
  EXPECT_EQ(c.worker_slow[static_cast<std::size_t>(g.index(2, 1))], 1);
  EXPECT_EQ(c.worker_slow[static_cast<std::size_t>(g.index(2, 0))], 0);
}

TEST(AttributeClassify, StructuralStageWhenEveryReplicaIsSlow) {
  const at::GridShape g{2, 4};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 3))] = 160.0;
  s.compute_ms[static_cast<std::size_t>(g.index(1, 3))] = 165.0;
  // stage refs {100, 100, 100, 162.5}: median 100; 162.5 >= 120, excess 62.5 >= max(5, 0.02 x 1000).
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  ASSERT_EQ(c.flags.size(), 1u);
  EXPECT_EQ(c.flags[0].kind, at::SlowKind::kStructural);
  EXPECT_EQ(c.flags[0].pp_rank, 3);
  EXPECT_DOUBLE_EQ(c.flags[0].ms, 162.5);
  EXPECT_DOUBLE_EQ(c.flags[0].ref_ms, 100.0);
  EXPECT_EQ(c.worker_slow[static_cast<std::size_t>(g.index(0, 3))], 1);
  EXPECT_EQ(c.worker_slow[static_cast<std::size_t>(g.index(1, 3))], 1);
}

TEST(AttributeClassify, OneSlowReplicaDoesNotMakeItsStageStructural) {
  const at::GridShape g{4, 4};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 0))] = 250.0;  // stage 0 median stays 100
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  ASSERT_EQ(c.flags.size(), 1u);
  EXPECT_EQ(c.flags[0].kind, at::SlowKind::kIndividual);
}

TEST(AttributeClassify, ImpactRuleIgnoresSlowButNegligibleStages) {
  const at::GridShape g{4, 1};
  at::WorkerStep s;
  s.step_ms = 40000.0;  // 2 % of it is 800 ms
  s.compute_ms = {20.0, 20.0, 20.0, 45.0};  // 2.25x slower but only 25 ms
  EXPECT_TRUE(at::classify_step(g, s, 1, at::AttributionConfig{}).flags.empty());
  at::AttributionConfig no_impact;
  no_impact.min_impact = 0.0;
  EXPECT_EQ(at::classify_step(g, s, 1, no_impact).flags.size(), 1u);
}

TEST(AttributeClassify, BudgetFallsBackToLargestComputeSum) {
  const at::GridShape g{2, 1};
  at::WorkerStep s;
  s.compute_ms = {100.0, 300.0, 100.0, kNaN};  // two stages: worker sums 400 and 100
  EXPECT_DOUBLE_EQ(at::classify_step(g, s, 2, at::AttributionConfig{}).budget_ms, 400.0);
}

TEST(AttributeClassify, RejectsWrongSize) {
  at::WorkerStep s;
  s.compute_ms = {1.0, 2.0, 3.0};
  EXPECT_THROW(at::classify_step(at::GridShape{2, 1}, s, 1, at::AttributionConfig{}), std::invalid_argument);
}

TEST(AttributePipeline, WaitsTraceBackToTheSlowDevice) {
  // dp 2, pp 4; worker (0, 0) is slow, so stages 1..3 of replica 0 wait in forward-recv
  // and backward-send while replica 1 keeps the healthy 10 ms minimum of each op.
  const at::GridShape g{2, 4};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 0))] = 300.0;  // vs median(300, 100) = 200: 1.5x
  s.p2p_ms = healthy_p2p(g);
  for (std::int32_t p = 1; p < 4; ++p) {
    p2p_at(s, g, 0, p, at::P2pOp::kForwardRecv) = 200.0;
    p2p_at(s, g, 0, p, at::P2pOp::kBackwardSend) = 150.0;
  }
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  ASSERT_EQ(c.flags.size(), 1u);
  EXPECT_EQ(c.flags[0].kind, at::SlowKind::kIndividual);
  const auto r = at::cross_validate_step(g, s, c, at::AttributionConfig{});
  ASSERT_EQ(r.findings.size(), 6u);
  for (const auto& f : r.findings) {
    EXPECT_EQ(f.cause, at::P2pCause::kExplained);
    EXPECT_EQ(f.blamed_worker, g.index(0, 0));
  }
  // dp = 2: the reference is the smallest forward-recv of the step (replica 1's 10 ms).
  EXPECT_DOUBLE_EQ(r.ref_ms[static_cast<std::size_t>(g.index(0, 1)) * at::kNumP2pOps +
                            static_cast<std::size_t>(at::P2pOp::kForwardRecv)],
                   10.0);
}

TEST(AttributePipeline, ReplicaMedianKeepsHealthyReplicasNormal) {
  // dp 4, pp 2. Replica 0's stage 0 is slow, so its stage 1 never makes stage 0 wait: its
  // forward-send is 5 ms while the healthy replicas' sends take 60 ms. Against the global
  // minimum (5 ms) every healthy replica would look abnormal; against the median of the
  // stage's replicas (60 ms) none does, and replica 0's recv wait is explained.
  const at::GridShape g{4, 2};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 0))] = 300.0;
  s.p2p_ms = healthy_p2p(g);
  for (std::int32_t d = 0; d < 4; ++d) p2p_at(s, g, d, 0, at::P2pOp::kForwardSend) = d == 0 ? 5.0 : 60.0;
  p2p_at(s, g, 0, 1, at::P2pOp::kForwardRecv) = 200.0;
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  const auto r = at::cross_validate_step(g, s, c, at::AttributionConfig{});
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_EQ(r.findings[0].worker, g.index(0, 1));
  EXPECT_EQ(r.findings[0].cause, at::P2pCause::kExplained);
  EXPECT_DOUBLE_EQ(r.findings[0].ref_ms, 10.0);
}

TEST(AttributePipeline, ASlowStageExplainsWaitsOnEitherSideAndItsOwn) {
  // dp 2, pp 3, both replicas of stage 2 slow (structural). 1F1B couples both directions:
  // stage 1's forward-recv (which waits on stage 0's side) and stage 2's own forward-recv
  // are both explained by the slow stage 2.
  const at::GridShape g{2, 3};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 2))] = 200.0;
  s.compute_ms[static_cast<std::size_t>(g.index(1, 2))] = 200.0;
  s.p2p_ms = healthy_p2p(g);
  p2p_at(s, g, 0, 1, at::P2pOp::kForwardRecv) = 80.0;
  p2p_at(s, g, 0, 2, at::P2pOp::kForwardRecv) = 90.0;
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  const auto r = at::cross_validate_step(g, s, c, at::AttributionConfig{});
  ASSERT_EQ(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].cause, at::P2pCause::kExplained);
  EXPECT_EQ(r.findings[0].blamed_worker, g.index(0, 2));  // the other side
  EXPECT_EQ(r.findings[1].cause, at::P2pCause::kExplained);
  EXPECT_EQ(r.findings[1].blamed_worker, g.index(0, 2));  // itself
}

TEST(AttributePipeline, AWaitEveryWorkerSharesIsNotAbnormal) {
  // dp 1: every downstream stage waits as long as the others, so the minimum of the op is
  // itself a wait and nothing stands out (the rule compares workers, not absolute times).
  const at::GridShape g{1, 4};
  auto s = uniform(g);
  s.compute_ms = {300.0, 100.0, 100.0, 100.0};
  s.p2p_ms = healthy_p2p(g);
  for (std::int32_t p = 1; p < 4; ++p) p2p_at(s, g, 0, p, at::P2pOp::kForwardRecv) = 200.0;
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  EXPECT_TRUE(at::cross_validate_step(g, s, c, at::AttributionConfig{}).findings.empty());
}

TEST(AttributePipeline, SlowLastStageExplainsUpstreamSendWaits) {
  const at::GridShape g{2, 4};
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 3))] = 170.0;
  s.compute_ms[static_cast<std::size_t>(g.index(1, 3))] = 170.0;
  s.p2p_ms = healthy_p2p(g);
  p2p_at(s, g, 0, 0, at::P2pOp::kBackwardRecv) = 120.0;  // min 10: 12x, excess 110 ms
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  const auto r = at::cross_validate_step(g, s, c, at::AttributionConfig{});
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_EQ(r.findings[0].cause, at::P2pCause::kExplained);
  EXPECT_EQ(r.findings[0].blamed_worker, g.index(0, 3));
}

TEST(AttributePipeline, NeighbourEvidenceSeparatesLinkFromSide) {
  const at::GridShape g{1, 3};
  auto s = uniform(g);
  s.p2p_ms = healthy_p2p(g);
  // Both ends of the stage 0 -> 1 forward transfer are slow: the link.
  p2p_at(s, g, 0, 0, at::P2pOp::kForwardSend) = 90.0;
  p2p_at(s, g, 0, 1, at::P2pOp::kForwardRecv) = 90.0;
  // Stage 2 receives gradients... it does not: it is the last stage. Stage 1's
  // backward-recv is slow while stage 2's backward-send is normal: stage 1's receive side.
  p2p_at(s, g, 0, 1, at::P2pOp::kBackwardRecv) = 80.0;
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  ASSERT_TRUE(c.flags.empty());
  const auto r = at::cross_validate_step(g, s, c, at::AttributionConfig{});
  ASSERT_EQ(r.findings.size(), 3u);
  EXPECT_EQ(r.findings[0].cause, at::P2pCause::kLink);
  EXPECT_EQ(r.findings[0].worker, 0);
  EXPECT_EQ(r.findings[0].blamed_worker, 1);
  EXPECT_EQ(r.findings[1].cause, at::P2pCause::kLink);
  EXPECT_EQ(r.findings[1].worker, 1);
  EXPECT_EQ(r.findings[1].blamed_worker, 0);
  EXPECT_EQ(r.findings[2].cause, at::P2pCause::kRecvSide);
  EXPECT_EQ(r.findings[2].op, at::P2pOp::kBackwardRecv);
}

TEST(AttributePipeline, EverySegmentSlowIsTheNodeNetwork) {
  const at::GridShape g{1, 3};
  auto s = uniform(g);
  s.p2p_ms = healthy_p2p(g);
  for (std::size_t o = 0; o < at::kNumP2pOps; ++o) p2p_at(s, g, 0, 1, static_cast<at::P2pOp>(o)) = 100.0;
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  const auto r = at::cross_validate_step(g, s, c, at::AttributionConfig{});
  // Stage 1's four ops: node network. Stage 0's forward-send and stage 2's backward-send
  // are normal (10 ms), so no link findings from the neighbours.
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_EQ(r.findings[0].cause, at::P2pCause::kNodeNetwork);
  EXPECT_EQ(r.findings[0].worker, 1);
}

TEST(AttributePipeline, RejectsWrongP2pSize) {
  const at::GridShape g{1, 2};
  auto s = uniform(g);
  s.p2p_ms = {1.0};
  const auto c = at::classify_step(g, s, 1, at::AttributionConfig{});
  EXPECT_THROW(at::cross_validate_step(g, s, c, at::AttributionConfig{}), std::invalid_argument);
}

TEST(AttributeRun, PersistentIndividualAndTransientBlip) {
  const at::GridShape g{5, 1};  // five replicas: the median stays 100 while two are slow
  at::RunAttributor run(g, {"forward"}, at::AttributionConfig{});
  for (std::int64_t i = 0; i < 10; ++i) {
    auto s = uniform(g);
    s.step = 100 + i;
    s.compute_ms[1] = 200.0;                 // every step
    if (i == 4) s.compute_ms[3] = 180.0;     // once
    run.add_step(s);
  }
  const auto r = run.finish();
  EXPECT_EQ(r.steps, 10);
  ASSERT_EQ(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].worker, 1);
  EXPECT_TRUE(r.findings[0].persistent);
  EXPECT_EQ(r.findings[0].steps_flagged, 10);
  EXPECT_EQ(r.findings[0].first_step, 100);
  EXPECT_EQ(r.findings[0].last_step, 109);
  EXPECT_DOUBLE_EQ(r.findings[0].mean_ratio, 2.0);
  EXPECT_DOUBLE_EQ(r.findings[0].mean_excess_ms, 100.0);
  EXPECT_EQ(r.findings[1].worker, 3);
  EXPECT_FALSE(r.findings[1].persistent);
  EXPECT_EQ(r.findings[1].steps_flagged, 1);
}

TEST(AttributeRun, ALinkSeenFromBothEndsCountsOncePerStep) {
  const at::GridShape g{1, 3};
  at::RunAttributor run(g, {"forward"}, at::AttributionConfig{});
  for (std::int64_t i = 0; i < 3; ++i) {
    auto s = uniform(g);
    s.step = i;
    s.p2p_ms = healthy_p2p(g);
    p2p_at(s, g, 0, 0, at::P2pOp::kForwardSend) = 90.0;
    p2p_at(s, g, 0, 1, at::P2pOp::kForwardRecv) = 90.0;
    run.add_step(s);
  }
  const auto r = run.finish();
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_EQ(r.findings[0].kind, at::FindingKind::kLink);
  EXPECT_EQ(r.findings[0].worker, 0);
  EXPECT_EQ(r.findings[0].peer_worker, 1);
  EXPECT_EQ(r.findings[0].steps_flagged, 3);
  EXPECT_TRUE(r.findings[0].persistent);
}

TEST(AttributeRun, CountsExplainedWaitsForTheSlowWorker) {
  const at::GridShape g{2, 2};
  at::RunAttributor run(g, {"forward"}, at::AttributionConfig{});
  auto s = uniform(g);
  s.compute_ms[static_cast<std::size_t>(g.index(0, 0))] = 300.0;
  s.p2p_ms = healthy_p2p(g);
  p2p_at(s, g, 0, 1, at::P2pOp::kForwardRecv) = 200.0;
  run.add_step(s);
  const auto r = run.finish();
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_EQ(r.findings[0].kind, at::FindingKind::kIndividual);
  EXPECT_EQ(r.findings[0].waits_explained, 1);
}

TEST(AttributeRun, JumpsAndBaselineOutliers) {
  const at::GridShape g{1, 4};
  at::RunAttributor run(g, {"forward"}, at::AttributionConfig{});
  for (std::int64_t i = 0; i < 4; ++i) {
    auto s = uniform(g);
    s.step = i;
    s.p2p_ms = healthy_p2p(g);
    // stage 2's forward-send: 10, 10, 60, 60 ms -> one jump at step 2; mean 35 > 2 x 10.
    if (i >= 2) p2p_at(s, g, 0, 2, at::P2pOp::kForwardSend) = 60.0;
    run.add_step(s);
  }
  const auto r = run.finish();
  ASSERT_EQ(r.jumps.size(), 1u);
  EXPECT_EQ(r.jumps[0].step, 2);
  EXPECT_EQ(r.jumps[0].worker, 2);
  EXPECT_DOUBLE_EQ(r.jumps[0].previous_ms, 10.0);
  ASSERT_EQ(r.baseline_outliers.size(), 1u);
  EXPECT_EQ(r.baseline_outliers[0].worker, 2);
  EXPECT_DOUBLE_EQ(r.baseline_outliers[0].mean_ms, 35.0);
  EXPECT_DOUBLE_EQ(r.baseline_outliers[0].baseline_ms, 10.0);
  EXPECT_EQ(r.baseline_outliers[0].steps_abnormal, 2);
}

TEST(AttributeRun, TwoStageFallbackComparesSlowAndFastSteps) {
  const at::GridShape g{1, 2};
  at::RunAttributor run(g, {"forward"}, at::AttributionConfig{});
  for (std::int64_t i = 0; i < 8; ++i) {
    auto s = uniform(g);
    s.step = i;
    s.p2p_ms = healthy_p2p(g);
    const bool slow = i >= 5;
    s.step_ms = slow ? 1500.0 : 1000.0;  // 1500 > 1.25 x 1000
    // worker 1's forward-recv: 10 ms in fast steps, 25 ms in slow ones (2.5x, +15 ms);
    // below the per-step impact floor (0.02 x 1500 = 30 ms), so only the fallback sees it.
    if (slow) p2p_at(s, g, 0, 1, at::P2pOp::kForwardRecv) = 25.0;
    run.add_step(s);
  }
  const auto r = run.finish();
  EXPECT_EQ(r.slow_steps, (std::vector<std::int64_t>{5, 6, 7}));
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_EQ(r.findings[0].kind, at::FindingKind::kP2pSlowSteps);
  EXPECT_EQ(r.findings[0].worker, 1);
  EXPECT_EQ(r.findings[0].op, static_cast<std::int32_t>(at::P2pOp::kForwardRecv));
  EXPECT_DOUBLE_EQ(r.findings[0].mean_ratio, 2.5);
}

TEST(AttributeRun, RejectsMixedP2pPresenceAndBadConfig) {
  const at::GridShape g{1, 2};
  at::RunAttributor run(g, {"forward"}, at::AttributionConfig{});
  auto s = uniform(g);
  s.p2p_ms = healthy_p2p(g);
  run.add_step(s);
  s.p2p_ms.clear();
  EXPECT_THROW(run.add_step(s), std::invalid_argument);
  at::AttributionConfig bad;
  bad.persistence = 0.0;
  EXPECT_THROW(at::RunAttributor(g, {"forward"}, bad), std::invalid_argument);
  EXPECT_THROW(at::RunAttributor(at::GridShape{0, 1}, {"forward"}, at::AttributionConfig{}), std::invalid_argument);
  EXPECT_THROW(at::RunAttributor(g, {}, at::AttributionConfig{}), std::invalid_argument);
}
