// Late arrivals: the worker-grid rule of offline attribution and the per-collective waits of
// the live report, on hand-computed cases (docs/ARCHITECTURE.md invariant 7).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/attribute/late_arrival.h"
#include "core/attribute/run_attributor.h"
#include "core/collective_waits.h"

namespace at = relax_straggler::core::attribute;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<at::LateArrival> late(at::GridShape shape, const std::vector<double>& ms, std::size_t stages,
                                  double budget_ms = 100.0) {
  std::vector<double> scratch;
  std::vector<at::LateArrival> out;
  at::find_late_arrivals(shape, ms, stages, budget_ms, at::AttributionConfig{}, scratch, out);
  return out;
}

}  // namespace

TEST(LateArrival, TheShortestReplicaIsTheOneTheOthersWaitedFor) {
  // ref = median(30, 30, 10) = 30; 30 - 10 = 20 >= max(5, 0.02 x 100); 10 x 1.2 <= 30.
  const auto found = late({3, 1}, {30.0, 30.0, 10.0}, 1);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].worker, 2);
  EXPECT_EQ(found[0].stage, 0);
  EXPECT_DOUBLE_EQ(found[0].ms, 10.0);
  EXPECT_DOUBLE_EQ(found[0].ref_ms, 30.0);
}

TEST(LateArrival, NoBlameWhenTheMedianDidNotWait) {
  // Two replicas share the shortest time: the median (10) waited for nobody.
  EXPECT_TRUE(late({3, 1}, {10.0, 10.0, 30.0}, 1).empty());
}

TEST(LateArrival, TheImpactRuleScalesTheFloorWithTheStep) {
  // 30 - 12 = 18 ms: enough in a 100 ms step (floor 5 ms), not in a 1 s one (floor 20 ms).
  EXPECT_EQ(late({3, 1}, {30.0, 30.0, 12.0}, 1, 100.0).size(), 1u);
  EXPECT_TRUE(late({3, 1}, {30.0, 30.0, 12.0}, 1, 1000.0).empty());
}

TEST(LateArrival, TheRelativeRuleNeedsAClearGap) {
  // 30 - 26 = 4 ms < 5 ms; and 26 x 1.2 = 31.2 > 30.
  EXPECT_TRUE(late({3, 1}, {30.0, 30.0, 26.0}, 1).empty());
}

TEST(LateArrival, UntimedReplicasAreLeftOutAndOneReplicaIsNoCollective) {
  // median(30, 10) = 20: 20 - 10 = 10 >= 5 and 12 <= 20.
  const auto found = late({3, 1}, {kNaN, 30.0, 10.0}, 1);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].worker, 2);
  EXPECT_TRUE(late({3, 1}, {kNaN, 30.0, kNaN}, 1).empty());
  EXPECT_TRUE(late({1, 3}, {30.0, 10.0, 30.0}, 1).empty());  // dp 1: nobody to wait for
}

TEST(LateArrival, EachPipelineStageAndCollectiveIsJudgedOnItsOwn) {
  // dp 2 x pp 2, workers w = pp x 2 + dp, two collective stages (worker-major).
  // pp 0: stage 0 {40, 10} -> median 25, worker 1 late; stage 1 {20, 20} -> none.
  // pp 1: stage 0 {10, 10} -> none; stage 1 {5, 50} -> median 27.5, worker 2 late.
  const std::vector<double> ms = {40.0, 20.0, 10.0, 20.0, 10.0, 5.0, 10.0, 50.0};
  const auto found = late({2, 2}, ms, 2);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].worker, 1);
  EXPECT_EQ(found[0].stage, 0);
  EXPECT_EQ(found[1].worker, 2);
  EXPECT_EQ(found[1].stage, 1);
  EXPECT_DOUBLE_EQ(found[1].ref_ms, 27.5);
}

TEST(LateArrival, TheRunAttributorCountsStepsPerWorkerAndStage) {
  at::RunAttributor run({2, 1}, {"forward"}, at::AttributionConfig{}, {"communication/allreduce"});
  for (int s = 0; s < 3; ++s) {
    at::WorkerStep step;
    step.step = s;
    step.compute_ms = {100.0, 100.0};
    step.collective_ms = s == 1 ? std::vector<double>{30.0, 30.0} : std::vector<double>{40.0, 10.0};
    const auto one = run.add_step(step);
    EXPECT_EQ(one.late.size(), s == 1 ? 0u : 1u);
  }
  EXPECT_EQ(run.finish().late_arrivals, (std::vector<std::int64_t>{0, 2}));
  at::WorkerStep missing;
  missing.compute_ms = {100.0, 100.0};
  EXPECT_THROW(run.add_step(missing), std::invalid_argument);
}

TEST(CollectiveWaits, TheShortestDurationIsTheLastArriver) {
  // 3 ranks x 2 collectives, rank-major. Collective 0: rank 2 shortest (4 ms); collective 1: rank 2 again.
  const std::vector<double> ms = {10.0, 20.0, 12.0, 18.0, 4.0, 5.0};
  const auto w = relax_straggler::core::collective_waits(ms.data(), 3, 2);
  EXPECT_EQ(w.late_counts, (std::vector<std::int64_t>{0, 0, 2}));
  EXPECT_EQ(w.blamed_rank, 2);
  EXPECT_DOUBLE_EQ(w.wait_ms[0], (10.0 - 4.0) + (20.0 - 5.0));
  EXPECT_DOUBLE_EQ(w.wait_ms[1], (12.0 - 4.0) + (18.0 - 5.0));
  EXPECT_DOUBLE_EQ(w.wait_ms[2], 0.0);
}

TEST(CollectiveWaits, TiesBlameTheLowestRankAndBadInputIsRefused) {
  const std::vector<double> tie = {3.0, 3.0};
  EXPECT_EQ(relax_straggler::core::collective_waits(tie.data(), 2, 1).blamed_rank, 0);
  const std::vector<double> bad = {3.0, kNaN};
  EXPECT_THROW(relax_straggler::core::collective_waits(bad.data(), 2, 1), std::invalid_argument);
  EXPECT_THROW(relax_straggler::core::collective_waits(tie.data(), 1, 2), std::invalid_argument);
}
